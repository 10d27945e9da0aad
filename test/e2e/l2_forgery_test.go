package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestL2SpeakerForgery puts a rogue host on the nodes' LAN (the LAN client's namespace) that sends
// heartbeats with the members' source addresses: forged ones (the old text format, and the new
// format signed with a wrong key) and replays of genuine datagrams captured on a node. It tries the
// three attacks of issue 14 — a forged "not ready" of a live owner, a fake majority for a
// partitioned node, keeping a dead node alive — and checks on the wire that no VIP moves, that
// there is never a second owner, that the partitioned node stays silent and the dead node's VIPs
// are taken over; the rejection metric counts the datagrams. Then the key is rotated on the running
// nodes (a second key added, made the signing key, the old one removed) while the owners are
// watched: no VIP moves.
func TestL2SpeakerForgery(t *testing.T) {
	names := []string{"node1", "node2", "node3"}
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"w1"}}, {Name: "node2", Pods: []string{"w2"}}, {Name: "node3", Pods: []string{"w3"}},
	}})
	x := newL2Lab(t, l)
	x.scanARP()
	// One key file for the whole test, rewritten in place for the rotation.
	keyFile := filepath.Join(x.dir, "memberkey")
	keyA, keyB := "rotation-key-A-0123456789abcdef0123456789", "rotation-key-B-fedcba9876543210fedcba9876"
	writeKeys := func(keys ...string) {
		if err := os.WriteFile(keyFile+".tmp", []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// Renamed into place, as the kubelet swaps a Secret's files.
		if err := os.Rename(keyFile+".tmp", keyFile); err != nil {
			t.Fatal(err)
		}
	}
	writeKeys(keyA)

	x.w.write("nodes.yaml", nodesYAML(l)...)
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec:
  addresses: [192.0.2.150-192.0.2.179]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
`)
	w1, w2, w3 := l.Pod("w1"), l.Pod("w2"), l.Pod("w3")
	http := []ndPort{{"http", "TCP", 80, 0, "http"}}
	eps := []string{ndEp(w1, "node1"), ndEp(w2, "node2"), ndEp(w3, "node3")}
	ips := addrRange("192.0.2.150", 30)
	var docs []string
	for i, ip := range ips {
		name := fmt.Sprintf("f%02d", i)
		docs = append(docs, ndService(name, "LoadBalancer", fmt.Sprintf("10.96.6.%d", i+1), "Cluster", http, ndStatus(ip.String())),
			ndSlice(name, "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, eps...))
	}
	x.w.write("vips.yaml", docs...)

	// Capture genuine heartbeats on every node before the speakers start (a port mirror).
	caps := map[string]*udpCapture{}
	for _, n := range names {
		c, err := newUDPCapture(l.NS(n), l2MemberPort)
		if err != nil {
			t.Fatal(err)
		}
		caps[n] = c
		t.Cleanup(c.close)
	}
	for _, n := range names {
		x.startWith(n, "--member-key-file", keyFile)
	}
	all := func(ip netip.Addr) string { return hashOwner(ip, names...) }
	x.waitOwners(ips, all, 10*time.Second)
	time.Sleep(time.Second) // a second of genuine traffic captured
	for _, c := range caps {
		c.stop()
	}

	rogue, err := newRawSender(l.NS("lanclient"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rogue.close)
	addr := func(n string) netip.Addr { return l.Node(n).IPv4 }
	// forged heartbeats from `from` to `to`: the pre-authentication text format, and the new format
	// signed with a key the members do not have.
	forged := func(from, to string, ready bool, hears ...string) []spoofed {
		r := "0"
		if ready {
			r = "1"
		}
		h := "-"
		if len(hears) > 0 {
			h = strings.Join(hears, ",")
		}
		return []spoofed{
			{addr(from), addr(to), []byte("vipgate-hb2 " + from + " " + r + " " + h)},
			{addr(from), addr(to), forgedV3(from, to, ready, uint64(time.Now().UnixNano())*2)},
		}
	}
	replays := func(from, to string) []spoofed {
		var out []spoofed
		for _, p := range caps[to].from(addr(from)) {
			out = append(out, spoofed{addr(from), addr(to), p})
		}
		if len(out) == 0 {
			t.Fatalf("no heartbeat of %s to %s captured", from, to)
		}
		return out
	}

	t.Run("forged not-ready of a live owner", func(t *testing.T) {
		var pkts []spoofed
		for _, to := range []string{"node2", "node3"} {
			pkts = append(pkts, forged("node1", to, false, "node2", "node3")...)
			pkts = append(pkts, replays("node1", to)...)
		}
		stop := rogue.flood(pkts, 5*time.Millisecond)
		x.holdOwners(t, ips, all, 3*time.Second)
		stop()
	})

	t.Run("fake majority for a partitioned node", func(t *testing.T) {
		// node3 no longer hears node1 and node2 (dropped by their MAC, so the rogue's datagrams with
		// their addresses still arrive) and is not heard.
		rules := fmt.Sprintf(`table inet vgtest_partition {
  chain in { type filter hook input priority -300; ether saddr { %s, %s } udp dport %d drop; }
  chain out { type filter hook output priority -300; udp dport %d drop; }
}
`, x.macs["node1"], x.macs["node2"], l2MemberPort, l2MemberPort)
		if out, err := l.Exec("node3", "sh", "-c", "printf '%s' '"+rules+"' | nft -f -"); err != nil {
			t.Fatalf("cutting node3 off: %v: %s", err, out)
		}
		var pkts []spoofed
		for _, from := range []string{"node1", "node2"} {
			pkts = append(pkts, forged(from, "node3", true, "node1", "node2", "node3")...)
			pkts = append(pkts, replays(from, "node3")...)
		}
		stop := rogue.flood(pkts, 5*time.Millisecond)
		majority := func(ip netip.Addr) string { return hashOwner(ip, "node1", "node2") }
		x.waitOwners(ips, majority, 10*time.Second)
		// The minority stays silent as long as the attack lasts.
		x.holdOwners(t, ips, majority, 3*time.Second)
		stop()
		if out, err := l.Exec("node3", "nft", "delete", "table", "inet", "vgtest_partition"); err != nil {
			t.Fatalf("healing: %v: %s", err, out)
		}
		x.waitOwners(ips, all, 10*time.Second)
	})

	t.Run("rejections counted", func(t *testing.T) {
		for _, n := range []string{"node2", "node3"} {
			got := rejectedCounts(t, l, n)
			if got["bad-mac"] == 0 || got["malformed"] == 0 || got["replay"]+got["not-fresh"] == 0 {
				t.Errorf("%s: rejected heartbeats %v, want bad-mac, malformed and replay counted", n, got)
			} else {
				t.Logf("%s: rejected heartbeats %v", n, got)
			}
		}
		if p := x.procs["node2"]; !strings.Contains(p.Log(), "membership heartbeat rejected") {
			t.Errorf("node2 logged no rejected heartbeat")
		}
	})

	t.Run("a forged counter locks nobody out", func(t *testing.T) {
		// A member holding the key (issue 27) sends, from node1's address, a heartbeat with counter
		// 2^64-1 to node2, echoing node2's latest counter (it hears node2 itself: here, a capture of
		// what node2 sends to node1). Before, node2 dropped every later heartbeat of node1 as a
		// replay until node2 restarted: node2 heard 2 members of 3.
		c, err := newUDPCapture(l.NS("node1"), l2MemberPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		var last []byte
		for deadline := time.Now().Add(5 * time.Second); last == nil; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no heartbeat of node2 captured at node1")
			}
			for _, d := range c.from(addr("node2")) {
				if len(d) > 6 && string(d[:4]) == "VGH3" {
					last = d
				}
			}
		}
		hb := forgedCounter(last, "node1", "node2", keyA)
		if err := rogue.send(spoofed{addr("node1"), addr("node2"), hb}); err != nil {
			t.Fatal(err)
		}
		// Past the takeover time (0.55 s), node2 must hear all three.
		time.Sleep(2 * time.Second)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			heard := speakerGauge(t, l, "node2", "vipgate_speaker_members_heard")
			if heard == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node2 hears %d members, not 3, after a forged counter of 2^64-1 from node1's address", heard)
			}
		}
		x.holdOwners(t, ips, all, time.Second)
	})

	t.Run("key rotation without a VIP move", func(t *testing.T) {
		before := map[string]int{}
		for _, n := range names {
			before[n] = rejectedCounts(t, l, n)["bad-mac"]
		}
		done := make(chan [3]int)
		stopWatch := make(chan struct{})
		go func() {
			var n [3]int // scans, wrong or double answers, unanswered
			for {
				select {
				case <-stopWatch:
					done <- n
					return
				default:
				}
				b, s, _ := x.wrongOwners(ips, all)
				n[0], n[1], n[2] = n[0]+1, n[1]+b, n[2]+s
			}
		}()
		reloads := 0
		for _, step := range [][]string{{keyA, keyB}, {keyB, keyA}, {keyB}} {
			writeKeys(step...)
			reloads++
			x.waitLog(names, "membership keys reloaded", reloads, 30*time.Second)
		}
		close(stopWatch)
		n := <-done
		if n[1] > 0 {
			t.Errorf("during the rotation, %d IP-scans saw an IP answered by another node than its owner, or by two", n[1])
		}
		t.Logf("rotation A -> A,B -> B,A -> B on the running nodes: %d scans, %d wrong or double answers, %d unanswered", n[0], n[1], n[2])
		for _, n := range names {
			if after := rejectedCounts(t, l, n)["bad-mac"]; after != before[n] {
				t.Errorf("%s rejected %d heartbeats with a bad MAC during the rotation", n, after-before[n])
			}
		}
		// A node restarted with only the new key is heard again at once.
		x.procs["node3"].Stop()
		x.startWith("node3", "--member-key-file", keyFile)
		x.waitLog([]string{"node3"}, "membership: ready=true", 1, 10*time.Second)
		x.waitOwners(ips, all, 10*time.Second)
		// Both others hear it again (its datagrams echo the counters they sent after its restart).
		x.waitLog([]string{"node1", "node2"}, "member can announce: node=node3", 2, 10*time.Second)
	})

	t.Run("a dead node is not kept alive", func(t *testing.T) {
		// Replays of node3's heartbeats (captured under key A) and forgeries, to node1 and node2.
		var pkts []spoofed
		for _, to := range []string{"node1", "node2"} {
			pkts = append(pkts, forged("node3", to, true, "node1", "node2")...)
			pkts = append(pkts, replays("node3", to)...)
		}
		x.procs["node3"].Kill()
		if out, err := l.Exec("node3", "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		stop := rogue.flood(pkts, 5*time.Millisecond)
		defer stop()
		survivors := func(ip netip.Addr) string { return hashOwner(ip, "node1", "node2") }
		x.waitOwners(ips, survivors, 10*time.Second)
		x.holdOwners(t, ips, survivors, 2*time.Second)
	})
}

// startWith starts vipgate on node with extra flags instead of the default key file.
func (x *l2Lab) startWith(node string, flags ...string) {
	x.t.Helper()
	n := x.l.Node(node)
	cfg := filepath.Join(x.dir, n.Name+".yaml")
	if err := os.WriteFile(cfg, []byte(ndNodeConfig(n, "zone-a")+x.extraConfig), 0o644); err != nil {
		x.t.Fatal(err)
	}
	args := append([]string{x.bin, "node", "--config", cfg, "--manifests", filepath.Join(x.dir, "manifests")}, flags...)
	p, err := x.l.Start(n.Name, filepath.Join(x.dir, fmt.Sprintf("%s-%d.log", n.Name, time.Now().UnixNano())), args...)
	if err != nil {
		x.t.Fatal(err)
	}
	x.procs[node] = p
}

// holdOwners scans for d and fails the test for every scan in which an IP is answered by another
// node than want's, or by more than one: a VIP moved, or has a second owner. An IP that no node
// answered within a scan's 50 ms is only counted (a lost request on a loaded machine looks the same).
func (x *l2Lab) holdOwners(t *testing.T, ips []netip.Addr, want func(netip.Addr) string, d time.Duration) {
	t.Helper()
	scans, bad, silent := 0, 0, 0
	var example string
	for end := time.Now().Add(d); time.Now().Before(end); scans++ {
		b, s, e := x.wrongOwners(ips, want)
		bad, silent = bad+b, silent+s
		if example == "" {
			example = e
		}
	}
	if bad > 0 {
		t.Errorf("%d wrong answers in %d scans, e.g. %s", bad, scans, example)
	}
	t.Logf("%d scans of %d IPs: %d answered by another node or by two, %d unanswered within a scan", scans, len(ips), bad, silent)
}

// wrongOwners scans ips once: how many are answered by another node than want's or by two, how
// many by none, and an example of the first kind.
func (x *l2Lab) wrongOwners(ips []netip.Addr, want func(netip.Addr) string) (bad, silent int, example string) {
	got := x.owners(ips, 50*time.Millisecond)
	for _, ip := range ips {
		switch {
		case len(got[ip]) == 0:
			silent++
		case len(got[ip]) != 1 || got[ip][0] != want(ip):
			if bad == 0 {
				example = fmt.Sprintf("%s answered by %v, want %s", ip, got[ip], want(ip))
			}
			bad++
		}
	}
	return bad, silent, example
}

// waitLog waits until every node's log holds line at least n times.
func (x *l2Lab) waitLog(nodes []string, line string, n int, timeout time.Duration) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, node := range nodes {
		for strings.Count(x.procs[node].Log(), line) < n {
			if time.Now().After(deadline) {
				x.t.Fatalf("%s: %q not logged %d times", node, line, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

var rejectedRE = regexp.MustCompile(`(?m)^vipgate_speaker_heartbeats_rejected_total\{reason="([a-z-]+)"\} ([0-9.e+]+)$`)

// rejectedCounts reads vipgate_speaker_heartbeats_rejected_total from a node's /metrics.
func rejectedCounts(t *testing.T, l *lab.Lab, node string) map[string]int {
	t.Helper()
	code, body := ndHTTP(t, l, node, "http://127.0.0.1:10249/metrics")
	if code != 200 {
		t.Fatalf("%s /metrics: HTTP %d", node, code)
	}
	out := map[string]int{}
	for _, m := range rejectedRE.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] = int(v)
	}
	return out
}

// forgedV3 is a heartbeat in the authenticated format, signed with a key the members do not have.
func forgedV3(from, to string, ready bool, counter uint64) []byte {
	var flags byte
	if ready {
		flags = 1
	}
	b := append([]byte("VGH3"), flags, byte(len(from)))
	b = append(b, from...)
	b = binary.BigEndian.AppendUint64(b, counter)
	b = binary.BigEndian.AppendUint64(b, counter) // echo: anything
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = append(b, 0xff)
	h := hmac.New(sha256.New, []byte("the attacker's guess at the key"))
	h.Write([]byte(to))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(b)
}

// forgedCounter is what a member holding key sends as from to to: a heartbeat with counter 2^64-1
// that echoes to's counter and segment digest from ref, a genuine heartbeat of to (captured).
func forgedCounter(ref []byte, from, to, key string) []byte {
	nl := int(ref[5])
	p := ref[6+nl:]
	// to's own counter (what the forgery echoes), its segment digest and heard bitmap.
	counter, digest := p[:8], p[16:24]
	heard := p[26 : len(p)-sha256.Size]
	b := append([]byte("VGH3"), 1, byte(len(from)))
	b = append(b, from...)
	b = binary.BigEndian.AppendUint64(b, ^uint64(0))
	b = append(b, counter...)
	b = append(b, digest...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(heard)))
	b = append(b, heard...)
	h := hmac.New(sha256.New, []byte(key))
	h.Write([]byte(to))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(b)
}

// speakerGauge reads an unlabelled gauge from a node's /metrics (-1: absent).
func speakerGauge(t *testing.T, l *lab.Lab, node, name string) int {
	t.Helper()
	code, body := ndHTTP(t, l, node, "http://127.0.0.1:10249/metrics")
	if code != 200 {
		t.Fatalf("%s /metrics: HTTP %d", node, code)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int(f)
		}
	}
	return -1
}

// spoofed is a UDP datagram with a chosen source address.
type spoofed struct {
	src, dst netip.Addr
	payload  []byte
}

// rawSender sends IPv4/UDP datagrams with any source address from a lab namespace (IP_HDRINCL).
type rawSender struct{ fd int }

func newRawSender(ns string) (*rawSender, error) {
	s := &rawSender{fd: -1}
	err := apiserver.InNetns(ns, func() error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		s.fd = fd
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raw socket in %s: %w", ns, err)
	}
	return s, nil
}

func (s *rawSender) close() { syscall.Close(s.fd) }

func (s *rawSender) send(p spoofed) error {
	udpLen := 8 + len(p.payload)
	b := make([]byte, 20+udpLen)
	b[0], b[8], b[9] = 0x45, 64, syscall.IPPROTO_UDP
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	src, dst := p.src.As4(), p.dst.As4()
	copy(b[12:], src[:])
	copy(b[16:], dst[:])
	binary.BigEndian.PutUint16(b[20:], 40000)
	binary.BigEndian.PutUint16(b[22:], l2MemberPort)
	binary.BigEndian.PutUint16(b[24:], uint16(udpLen))
	// UDP checksum 0: none (allowed over IPv4); the kernel fills in the IP header checksum.
	copy(b[28:], p.payload)
	return syscall.Sendto(s.fd, b, 0, &syscall.SockaddrInet4{Addr: dst})
}

// flood sends pkts over and over, one every gap, until the returned function is called.
func (s *rawSender) flood(pkts []spoofed, gap time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(gap):
			}
			_ = s.send(pkts[i%len(pkts)])
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// udpCapture copies the UDP datagrams to a port that arrive in a namespace (a raw socket sees every
// incoming UDP datagram): the genuine heartbeats a replay attack would use.
type udpCapture struct {
	fd   int
	port uint16
	mu   sync.Mutex
	got  map[netip.Addr][][]byte
	done chan struct{}
}

func newUDPCapture(ns string, port uint16) (*udpCapture, error) {
	c := &udpCapture{fd: -1, port: port, got: map[netip.Addr][][]byte{}, done: make(chan struct{})}
	err := apiserver.InNetns(ns, func() error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_UDP)
		c.fd = fd
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("capture socket in %s: %w", ns, err)
	}
	_ = syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Usec: 100000})
	go c.run()
	return c, nil
}

func (c *udpCapture) run() {
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.done:
			return
		default:
		}
		n, _, err := syscall.Recvfrom(c.fd, buf, 0)
		if err != nil || n < 28 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+8 || binary.BigEndian.Uint16(buf[ihl+2:]) != c.port {
			continue
		}
		src := netip.AddrFrom4([4]byte(buf[12:16]))
		c.mu.Lock()
		if len(c.got[src]) < 50 {
			c.got[src] = append(c.got[src], append([]byte(nil), buf[ihl+8:n]...))
		}
		c.mu.Unlock()
	}
}

func (c *udpCapture) stop() {
	select {
	case <-c.done:
	default:
		close(c.done)
	}
}

func (c *udpCapture) close() { c.stop(); syscall.Close(c.fd) }

// from returns the datagrams captured from src.
func (c *udpCapture) from(src netip.Addr) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got[src]
}

// TestL2SpeakerNoKey: without a membership key the node runs (its dataplane works) but refuses L2:
// the VIP is not answered and /status says why; with --member-insecure it is answered and /status
// warns.
func TestL2SpeakerNoKey(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{{Name: "node1", Pods: []string{"w1"}}}})
	x := newL2Lab(t, l)
	x.scanARP()
	x.w.write("nodes.yaml", nodesYAML(l)...)
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec:
  addresses: [192.0.2.150/32]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
`)
	vip := netip.MustParseAddr("192.0.2.150")
	http := []ndPort{{"http", "TCP", 80, 0, "http"}}
	x.w.write("web.yaml", ndService("web", "LoadBalancer", "10.96.6.1", "Cluster", http, ndStatus(vip.String())),
		ndSlice("web", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(l.Pod("w1"), "node1")))
	status := func() string {
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body := ndHTTP(t, l, "node1", "http://127.0.0.1:10249/status")
			if code == 200 && strings.Contains(body, `"`+vip.String()+`"`) {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/status: HTTP %d %s", code, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	x.startWith("node1")
	// The dataplane runs: the Service answers through its ClusterIP from the node.
	ndWait(t, l, "node1", "tcp", "10.96.6.1:80", func(r lab.ProbeResult) bool { return r.OK() })
	if body := status(); !strings.Contains(body, "L2 mode refused") || !strings.Contains(body, `"warnings"`) {
		t.Errorf("/status without a key lacks the refusal:\n%s", body)
	}
	if got := x.owners([]netip.Addr{vip}, 300*time.Millisecond); len(got[vip]) > 0 {
		t.Errorf("%s answered by %v without a membership key", vip, got[vip])
	}
	if log := x.procs["node1"].Log(); !strings.Contains(log, "L2 announcements disabled: no membership key") {
		t.Errorf("no error logged at start:\n%s", x.procs["node1"].Tail(20))
	}

	x.procs["node1"].Stop()
	x.startWith("node1", "--member-insecure")
	x.waitOwners([]netip.Addr{vip}, func(netip.Addr) string { return "node1" }, 10*time.Second)
	if body := status(); !strings.Contains(body, "not authenticated") {
		t.Errorf("/status with --member-insecure lacks the warning:\n%s", body)
	}
}
