package l2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// ndpLab is a LAN of three hosts on one bridge, each in its namespace: a
// runs the Announcer, r is a router (a real Linux kernel doing address
// resolution and neighbor unreachability detection), x is an attacker
// that crafts frames. The bridge lives in a fourth namespace, s, where the
// test watches a's port: every frame to or from a.
//
//	a (va 2001:db8:1::1/64) ─┐
//	r (vr 2001:db8:1::2/64, 2001:db8:ff::fe/64; lo 2001:db8:ee::1) ─ br0 in s
//	x (vx 2001:db8:1::66/64) ─┘
//
// 2001:db8:ff::/64 is a VIP prefix the router has on-link but no address
// of a is in, as when VIPs come from a range of their own.
type ndpLab struct {
	names            map[string]string // a, r, x, s -> namespace
	handles          map[string]netns.NsHandle
	nlr              *netlink.Handle // netlink in r
	vrIndex          int
	macA, macR, macX net.HardwareAddr
	llA, llR         netip.Addr
}

func newNDPLab(t *testing.T) *ndpLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs ip: %v", err)
	}
	l := &ndpLab{names: map[string]string{}, handles: map[string]netns.NsHandle{}}
	for _, h := range []string{"s", "a", "r", "x"} {
		ns := fmt.Sprintf("vgt%d-n%s", os.Getpid(), h)
		l.names[h] = ns
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	// The switch stays silent: no IPv6 on the bridge or its ports.
	run(t, "ip", "netns", "exec", l.names["s"], "sysctl", "-qw",
		"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	// Without snooping the bridge floods multicast to every port, as a
	// switch with no MLD querier does.
	run(t, "ip", "-n", l.names["s"], "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	for _, h := range []string{"a", "r", "x"} {
		// No duplicate address detection: the link-local address must
		// be usable at once for the NDP socket to bind to it.
		run(t, "ip", "netns", "exec", l.names[h], "sysctl", "-qw",
			"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
		run(t, "ip", "-n", l.names["s"], "link", "add", "s"+h, "type", "veth", "peer", "name", "v"+h, "netns", l.names[h])
		run(t, "ip", "-n", l.names["s"], "link", "set", "s"+h, "master", "br0", "up")
	}
	run(t, "ip", "-n", l.names["s"], "link", "set", "br0", "up")
	for _, c := range [][]string{
		{"a", "2001:db8:1::1/64", "va"},
		{"r", "2001:db8:1::2/64", "vr"}, {"r", "2001:db8:ff::fe/64", "vr"}, {"r", "2001:db8:ee::1/128", "lo"},
		{"x", "2001:db8:1::66/64", "vx"},
	} {
		run(t, "ip", "-n", l.names[c[0]], "addr", "add", c[1], "dev", c[2])
	}
	for _, h := range []string{"a", "r", "x"} {
		run(t, "ip", "-n", l.names[h], "link", "set", "lo", "up")
		run(t, "ip", "-n", l.names[h], "link", "set", "v"+h, "up")
	}
	// r probes a stale entry one second after using it (the minimum).
	run(t, "ip", "netns", "exec", l.names["r"], "sysctl", "-qw", "net.ipv6.neigh.vr.delay_first_probe_time=1")

	for h, ns := range l.names {
		handle, err := netns.GetFromName(ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { handle.Close() })
		l.handles[h] = handle
	}
	var err error
	if l.nlr, err = netlink.NewHandleAt(l.handles["r"]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.nlr.Close)
	for h, dst := range map[string]*net.HardwareAddr{"a": &l.macA, "r": &l.macR, "x": &l.macX} {
		ll := map[string]*netip.Addr{"a": &l.llA, "r": &l.llR}[h]
		l.in(t, h, func() error {
			ifi, err := net.InterfaceByName("v" + h)
			if err != nil {
				return err
			}
			*dst = ifi.HardwareAddr
			if h == "r" {
				l.vrIndex = ifi.Index
			}
			if ll == nil {
				return nil
			}
			addrs, err := ifi.Addrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().IsLinkLocalUnicast() {
					*ll = p.Addr()
				}
			}
			if !ll.IsValid() {
				return fmt.Errorf("no link-local address on v%s", h)
			}
			return nil
		})
	}
	return l
}

// in runs f on an OS thread inside namespace h and waits for it. Sockets
// opened by f stay there. The thread is never unlocked, so Go discards it
// instead of reusing it elsewhere in the wrong namespace.
func (l *ndpLab) in(t *testing.T, h string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(l.handles[h]); err != nil {
			done <- fmt.Errorf("entering %s: %w", l.names[h], err)
			return
		}
		done <- f()
	}()
	if err := <-done; err != nil {
		t.Fatalf("in %s: %v", l.names[h], err)
	}
}

// sendUDP sends one datagram from r, from address src, to dst: r's kernel
// resolves or probes dst's neighbour entry before or while sending it.
// a drops the datagram (the VIP is not one of its addresses).
func (l *ndpLab) sendUDP(t *testing.T, src, dst netip.Addr) {
	t.Helper()
	l.in(t, "r", func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("vipgate"))
		return err
	})
}

// craft sends frames from x's interface as they are.
func (l *ndpLab) craft(t *testing.T, frames ...[]byte) { l.craftFrom(t, "x", frames...) }

// craftFrom sends frames from host h's interface as they are.
func (l *ndpLab) craftFrom(t *testing.T, h string, frames ...[]byte) {
	t.Helper()
	l.in(t, h, func() error {
		ifi, err := net.InterfaceByName("v" + h)
		if err != nil {
			return err
		}
		c, err := packet.Listen(ifi, packet.Raw, 0x86dd, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for _, f := range frames {
			if _, err := c.WriteTo(f, &packet.Addr{HardwareAddr: net.HardwareAddr(f[0:6])}); err != nil {
				return err
			}
		}
		return nil
	})
}

// ndFrame is a neighbor solicitation or advertisement seen on a's port.
type ndFrame struct {
	ethSrc, ethDst net.HardwareAddr
	src, dst       netip.Addr
	hopLimit       uint8
	typ            uint8 // 135 NS, 136 NA
	target         netip.Addr
	router         bool
	solicited      bool
	override       bool
	linkLayer      net.HardwareAddr // source (NS) or target (NA) link-layer address option
	goodSum        bool
}

func (f ndFrame) String() string {
	kind := "NS"
	if f.typ == icmpv6TypeNA {
		kind = fmt.Sprintf("NA R=%v S=%v O=%v", f.router, f.solicited, f.override)
	}
	return fmt.Sprintf("%s > %s, %s > %s hlim %d %s tgt %s lladdr %v sum-ok %v",
		f.ethSrc, f.ethDst, f.src, f.dst, f.hopLimit, kind, f.target, f.linkLayer, f.goodSum)
}

// wire records the neighbor discovery frames on a's port of the bridge.
type wire struct {
	conn   *packet.Conn
	mu     sync.Mutex
	frames []ndFrame
	done   chan struct{}
}

func (l *ndpLab) watch(t *testing.T) *wire {
	t.Helper()
	w := &wire{done: make(chan struct{})}
	l.in(t, "s", func() error {
		ifi, err := net.InterfaceByName("sa")
		if err != nil {
			return err
		}
		w.conn, err = packet.Listen(ifi, packet.Raw, 0x0003 /* ETH_P_ALL */, nil)
		return err
	})
	go func() {
		defer close(w.done)
		buf := make([]byte, 2048)
		for {
			n, _, err := w.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if f, ok := decodeND(buf[:n]); ok {
				w.mu.Lock()
				w.frames = append(w.frames, f)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		w.conn.Close()
		<-w.done
	})
	return w
}

// decodeND decodes an ICMPv6 NS or NA frame on its own, without the
// responder's parser.
func decodeND(b []byte) (ndFrame, bool) {
	if len(b) < 14+40+24 || b[12] != 0x86 || b[13] != 0xdd || b[14+6] != 58 {
		return ndFrame{}, false
	}
	ip := b[14:]
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if plen < 24 || 40+plen > len(ip) {
		return ndFrame{}, false
	}
	icmp := ip[40 : 40+plen]
	if icmp[0] != 135 && icmp[0] != 136 {
		return ndFrame{}, false
	}
	f := ndFrame{
		ethDst: net.HardwareAddr(bytes.Clone(b[0:6])), ethSrc: net.HardwareAddr(bytes.Clone(b[6:12])),
		src: netip.AddrFrom16([16]byte(ip[8:24])), dst: netip.AddrFrom16([16]byte(ip[24:40])), hopLimit: ip[7],
		typ: icmp[0], target: netip.AddrFrom16([16]byte(icmp[8:24])),
		router: icmp[4]&0x80 != 0, solicited: icmp[4]&0x40 != 0, override: icmp[4]&0x20 != 0,
	}
	f.goodSum = icmpv6Checksum(f.src, f.dst, icmp) == 0
	for o := icmp[24:]; len(o) >= 8 && o[1] > 0 && int(o[1])*8 <= len(o); o = o[int(o[1])*8:] {
		if (o[0] == 1 || o[0] == 2) && o[1] == 1 {
			f.linkLayer = net.HardwareAddr(bytes.Clone(o[2:8]))
		}
	}
	return f, true
}

// mark is the number of frames seen so far.
func (w *wire) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.frames)
}

// since returns the frames seen after mark m that match.
func (w *wire) since(m int, match func(ndFrame) bool) []ndFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []ndFrame
	for _, f := range w.frames[m:] {
		if match(f) {
			out = append(out, f)
		}
	}
	return out
}

// await waits (boundedly) for a frame after mark m that matches.
func (w *wire) await(t *testing.T, m int, what string, match func(ndFrame) bool) ndFrame {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := w.since(m, match); len(got) > 0 {
			return got[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s on the wire", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tcpdump runs tcpdump -vv on a's port of the bridge for the test log, if
// it is installed; the lines are logged at the end of the test.
func (l *ndpLab) tcpdump(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Logf("no tcpdump: %v", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.names["s"],
		"tcpdump", "-i", "sa", "-nn", "-e", "-vv", "-l", "-c", "200", "icmp6 and (ip6[40] == 135 or ip6[40] == 136)")
	var out bytes.Buffer
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Logf("starting tcpdump: %v", err)
		return
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		closed := false
		for sc.Scan() {
			if !closed && strings.Contains(sc.Text(), "listening on") {
				close(ready)
				closed = true
			}
		}
		if !closed {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Logf("tcpdump did not start listening")
	}
	t.Cleanup(func() {
		// Let the last frames reach tcpdump's output, then stop it.
		time.Sleep(100 * time.Millisecond)
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cancel()
			<-done
		}
		cancel()
		t.Logf("tcpdump -vv on a's port:\n%s", out.String())
	})
}

// neighbour returns r's entry for ip on vr.
func (l *ndpLab) neighbour(t *testing.T, ip netip.Addr) (net.HardwareAddr, int) {
	t.Helper()
	neighs, err := l.nlr.NeighList(l.vrIndex, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a == ip {
			return n.HardwareAddr, n.State
		}
	}
	return nil, 0
}

// awaitReachable waits (boundedly) until r's entry for ip is REACHABLE
// with mac.
func (l *ndpLab) awaitReachable(t *testing.T, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, state := l.neighbour(t, ip)
		if state&netlink.NUD_REACHABLE != 0 && bytes.Equal(got, mac) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("r's entry for %s is %v %s, want %v reachable", ip, got, neighState(state), mac)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestNetnsNDPRouter checks the responder against a real kernel on the
// other side: r resolves the VIPs, lets the entries go stale, probes them
// with unicast solicitations (neighbor unreachability detection) from
// the sources its kernel picks, and the entries must come back to
// REACHABLE; the advertisements on the wire must be what RFC 4861 section
// 7.2.4 says. Then crafted probes: a DAD probe, invalid solicitations, and
// an attacker's.
func TestNetnsNDPRouter(t *testing.T) {
	l := newNDPLab(t)
	w := l.watch(t)
	l.tcpdump(t)

	reg := prometheus.NewRegistry()
	logger := hclog.New(&hclog.LoggerOptions{Name: "l2", Output: testWriter{t}, Level: hclog.Debug})
	// No repeated takeover announcements: every advertisement on the
	// wire after SetOwned is an answer.
	a, err := New(logger, reg, Options{Repeats: []time.Duration{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	var (
		vipOn    = netip.MustParseAddr("2001:db8:1::50")  // in a's subnet
		vipOff   = netip.MustParseAddr("2001:db8:ff::10") // in a prefix a has no address or route in
		notOwned = netip.MustParseAddr("2001:db8:1::51")
		rGlobal  = netip.MustParseAddr("2001:db8:1::2")
		rOffA    = netip.MustParseAddr("2001:db8:ff::fe")
		rLo      = netip.MustParseAddr("2001:db8:ee::1")
		xGlobal  = netip.MustParseAddr("2001:db8:1::66")
	)
	l.in(t, "a", func() error { return a.SetOwned(map[netip.Addr][]string{vipOn: {"va"}, vipOff: {"va"}}) })

	// fromA matches a's advertisements for the VIPs.
	fromA := func(f ndFrame) bool {
		return f.typ == icmpv6TypeNA && bytes.Equal(f.ethSrc, l.macA) && (f.target == vipOn || f.target == vipOff || f.target == notOwned)
	}
	// checkSolicited checks a's answer to solicitation ns.
	checkSolicited := func(t *testing.T, ns, na ndFrame) {
		t.Helper()
		want := ndFrame{
			ethSrc: l.macA, ethDst: ns.ethSrc, src: l.llA, dst: ns.src, hopLimit: 255, typ: icmpv6TypeNA,
			target: ns.target, solicited: true, override: true, linkLayer: l.macA, goodSum: true,
		}
		if na.String() != want.String() {
			t.Errorf("advertisement\n got %v\nwant %v", na, want)
		}
	}

	// answerTo matches a's answer to solicitation ns.
	answerTo := func(ns ndFrame) func(ndFrame) bool {
		return func(f ndFrame) bool { return fromA(f) && f.target == ns.target && f.dst == ns.src }
	}
	stale := func(t *testing.T, vip netip.Addr) {
		run(t, "ip", "-n", l.names["r"], "-6", "neigh", "change", vip.String(), "lladdr", l.macA.String(), "dev", "vr", "nud", "stale")
		if _, state := l.neighbour(t, vip); state&netlink.NUD_STALE == 0 {
			t.Fatalf("r's entry for %s is %s, want stale", vip, neighState(state))
		}
	}

	// nud has r's kernel resolve vip for a datagram from src, which it
	// solicits from wantSource, then makes the entry stale and uses it
	// again: the kernel probes it with a unicast solicitation. Both must
	// be answered as RFC 4861 section 7.2.4 says, and the entry must be
	// REACHABLE after each.
	nud := func(t *testing.T, vip, src, wantSource netip.Addr) {
		// Start from no entry: resolution first, then the probe.
		exec.Command("ip", "-n", l.names["r"], "-6", "neigh", "del", vip.String(), "dev", "vr").Run()
		m := w.mark()
		l.sendUDP(t, src, vip)
		l.awaitReachable(t, vip, l.macA)
		ns := w.await(t, m, "solicitation from r", func(f ndFrame) bool {
			return f.typ == icmpv6TypeNS && bytes.Equal(f.ethSrc, l.macR) && f.target == vip
		})
		t.Logf("resolution: %v", ns)
		if ns.src != wantSource || ns.dst != solicitedNodeGroup(vip) {
			t.Errorf("r's resolution came from %s to %s, want from %s to the solicited-node group", ns.src, ns.dst, wantSource)
		}
		checkSolicited(t, ns, w.await(t, m, "answer to the resolution", answerTo(ns)))

		// Linux probes from its link-local address: in DELAY and PROBE
		// the datagram was sent already, no queued packet lends its
		// source (ndisc_solicit).
		stale(t, vip)
		m = w.mark()
		l.sendUDP(t, src, vip)
		l.awaitReachable(t, vip, l.macA)
		ns = w.await(t, m, "unicast probe from r", func(f ndFrame) bool {
			return f.typ == icmpv6TypeNS && bytes.Equal(f.ethSrc, l.macR) && f.target == vip
		})
		t.Logf("probe: %v", ns)
		if ns.dst != vip || !bytes.Equal(ns.ethDst, l.macA) || ns.src != l.llR {
			t.Errorf("r's probe went from %s to %s at %v, want from %s unicast to %s at %v", ns.src, ns.dst, ns.ethDst, l.llR, vip, l.macA)
		}
		na := w.await(t, m, "answer to the probe", answerTo(ns))
		t.Logf("answer: %v", na)
		checkSolicited(t, ns, na)
	}

	// globalProbe sends, from r's interface, the unicast probe a router
	// that probes from a global address sends (Junos does): to the VIP,
	// from src, with r's MAC. r's kernel takes the solicited answer as
	// confirmation: its stale entry becomes REACHABLE.
	globalProbe := func(t *testing.T, vip, src netip.Addr) {
		stale(t, vip)
		m := w.mark()
		l.craftFrom(t, "r", buildNSFrame(t, nsFrame{target: vip, src: src, dst: vip, sourceLL: l.macR, ethSrc: l.macR, ethDst: l.macA}))
		ns := w.await(t, m, "crafted probe", func(f ndFrame) bool {
			return f.typ == icmpv6TypeNS && f.src == src && f.target == vip
		})
		na := w.await(t, m, "answer to the probe", answerTo(ns))
		t.Logf("answer: %v", na)
		checkSolicited(t, ns, na)
		l.awaitReachable(t, vip, l.macA)
	}

	t.Run("resolution and probe for a datagram from a global source", func(t *testing.T) {
		// The datagram's source is on vr: Linux resolves from it.
		nud(t, vipOn, rGlobal, rGlobal)
	})
	t.Run("resolution and probe for a datagram from a source on lo", func(t *testing.T) {
		// The datagram's source is on r's lo, not on vr: Linux resolves
		// from vr's link-local address.
		nud(t, vipOn, rLo, l.llR)
	})
	t.Run("resolution and probe from a global source a has no route to", func(t *testing.T) {
		// a's kernel could not send this answer: it has no route to
		// 2001:db8:ff::fe. The responder sends it to r's MAC.
		nud(t, vipOff, rOffA, rOffA)
	})
	t.Run("probe from a global source", func(t *testing.T) { globalProbe(t, vipOn, rGlobal) })
	t.Run("probe from a global source a has no route to", func(t *testing.T) { globalProbe(t, vipOff, rOffA) })

	t.Run("crafted DAD probe", func(t *testing.T) {
		m := w.mark()
		l.craft(t, buildNSFrame(t, nsFrame{target: vipOn, src: netip.IPv6Unspecified(), ethSrc: l.macX}))
		na := w.await(t, m, "answer to the DAD probe", fromA)
		want := ndFrame{
			ethSrc: l.macA, ethDst: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, src: l.llA, dst: netip.IPv6LinkLocalAllNodes(),
			hopLimit: 255, typ: icmpv6TypeNA, target: vipOn, override: true, linkLayer: l.macA, goodSum: true,
		}
		if na.String() != want.String() {
			t.Errorf("advertisement\n got %v\nwant %v", na, want)
		}
	})

	t.Run("a real kernel's DAD for the VIP fails", func(t *testing.T) {
		// x tries to configure the VIP: its kernel probes it (from ::,
		// with a nonce option) and must see it is taken.
		run(t, "ip", "netns", "exec", l.names["x"], "sysctl", "-qw", "net.ipv6.conf.vx.accept_dad=1")
		m := w.mark()
		run(t, "ip", "-n", l.names["x"], "addr", "add", vipOn.String()+"/64", "dev", "vx")
		t.Cleanup(func() { exec.Command("ip", "-n", l.names["x"], "addr", "del", vipOn.String()+"/64", "dev", "vx").Run() })
		probe := w.await(t, m, "x's DAD probe", func(f ndFrame) bool {
			return f.typ == icmpv6TypeNS && bytes.Equal(f.ethSrc, l.macX) && f.src.IsUnspecified() && f.target == vipOn
		})
		t.Logf("probe: %v", probe)
		na := w.await(t, m, "answer to the DAD probe", fromA)
		if na.dst != netip.IPv6LinkLocalAllNodes() || na.solicited || !na.override {
			t.Errorf("answer %v, want to ff02::1, S=0, O=1", na)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			out := run(t, "ip", "-n", l.names["x"], "-6", "addr", "show", "dev", "vx", "to", vipOn.String())
			if strings.Contains(out, "dadfailed") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("x configured the VIP:\n%s", out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	// sentinel sends invalid or hostile frames, then a valid solicitation
	// from a source of its own, and returns a's advertisements up to the
	// sentinel's answer: the responder reads frames in order, so when the
	// sentinel is answered every frame before it has been handled.
	var sentinels int
	sentinel := func(t *testing.T, frames ...[]byte) []ndFrame {
		t.Helper()
		sentinels++
		src := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 14: 0x77, 15: byte(sentinels)})
		m := w.mark()
		l.craft(t, append(frames, buildNSFrame(t, nsFrame{target: vipOn, src: src, sourceLL: l.macX, ethSrc: l.macX}))...)
		w.await(t, m, "answer to the sentinel", func(f ndFrame) bool { return fromA(f) && f.dst == src })
		var got []ndFrame
		for _, f := range w.since(m, fromA) {
			if f.dst == src {
				break
			}
			got = append(got, f)
		}
		return got
	}
	dropped := func(reason string) float64 {
		return metricValue(t, reg, "vipgate_l2_requests_dropped_total", map[string]string{"interface": "va", "family": "ipv6", "reason": reason})
	}

	t.Run("invalid solicitations unanswered", func(t *testing.T) {
		ns := func(f nsFrame) []byte {
			if f.target == (netip.Addr{}) {
				f.target = vipOn
			}
			if f.src == (netip.Addr{}) {
				f.src = xGlobal
			}
			f.ethSrc = l.macX
			if f.ethDst == nil && !f.dst.IsMulticast() && f.dst.IsValid() {
				f.ethDst = l.macA
			}
			return buildNSFrame(t, f)
		}
		cases := []struct {
			reason string
			frame  []byte
		}{
			{"hop_limit", ns(nsFrame{sourceLL: l.macX, hopLimit: 64})},
			{"hop_limit", ns(nsFrame{dst: vipOn, hopLimit: 254})},
			{"bad_code", ns(nsFrame{sourceLL: l.macX, code: 1})},
			{"malformed", ns(nsFrame{truncate: 1})},
			{"malformed", ns(nsFrame{sourceLL: l.macX, badSum: true})},
			{"multicast_target", ns(nsFrame{target: netip.MustParseAddr("ff02::1:ff00:50")})},
			{"bad_option", ns(nsFrame{sourceLL: l.macX, rawOpts: []byte{14, 0, 0, 0, 0, 0, 0, 0}})},
			{"bad_dad", ns(nsFrame{src: netip.IPv6Unspecified(), sourceLL: l.macX})},
			{"bad_dad", ns(nsFrame{src: netip.IPv6Unspecified(), dst: vipOn})},
			{"bad_source", ns(nsFrame{src: netip.IPv6LinkLocalAllNodes(), sourceLL: l.macX})},
			{"bad_source", ns(nsFrame{sourceLL: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}})},
			{"other_destination", ns(nsFrame{sourceLL: l.macX, dst: netip.IPv6LinkLocalAllNodes()})},
			{"other_destination", ns(nsFrame{sourceLL: l.macX, dst: netip.MustParseAddr("2001:db8:1::1")})},
		}
		want := map[string]float64{}
		before := map[string]float64{}
		var frames [][]byte
		for _, c := range cases {
			want[c.reason]++
			before[c.reason] = dropped(c.reason)
			frames = append(frames, c.frame)
		}
		if got := sentinel(t, frames...); len(got) != 0 {
			t.Errorf("a answered invalid solicitations: %v", got)
		}
		for reason, n := range want {
			if got := dropped(reason) - before[reason]; got != n {
				t.Errorf("requests_dropped_total{reason=%q} grew by %v, want %v", reason, got, n)
			}
		}
	})

	t.Run("attacker on the LAN", func(t *testing.T) {
		// a has a default route via r now: an answer routed by a's
		// kernel to an off-link address would go to r.
		run(t, "ip", "-n", l.names["a"], "-6", "route", "add", "default", "via", rGlobal.String(), "dev", "va")
		offLink := netip.MustParseAddr("2001:db8:99::1")
		beforeNotOurs := dropped("not_ours")
		got := sentinel(t,
			// Not ours: no answer.
			buildNSFrame(t, nsFrame{target: notOwned, src: xGlobal, sourceLL: l.macX, ethSrc: l.macX}),
			// An off-link source: the answer goes back to x's MAC, not
			// to the default router.
			buildNSFrame(t, nsFrame{target: vipOn, src: offLink, dst: vipOn, sourceLL: l.macX, ethSrc: l.macX, ethDst: l.macA}),
			// r's address as source, r's MAC in the option: the answer
			// still goes to x, where the frame came from.
			buildNSFrame(t, nsFrame{target: vipOn, src: rGlobal, sourceLL: l.macR, ethSrc: l.macX}),
		)
		if len(got) != 2 {
			t.Fatalf("a sent %d advertisements, want 2: %v", len(got), got)
		}
		for i, dst := range []netip.Addr{offLink, rGlobal} {
			if !bytes.Equal(got[i].ethDst, l.macX) || got[i].dst != dst || got[i].target != vipOn || got[i].src != l.llA {
				t.Errorf("answer %d: %v, want to %s at x's MAC %v from %s", i, got[i], dst, l.macX, l.llA)
			}
		}
		// x's kernel may solicit a's link-local address meanwhile: at
		// least our one.
		if d := dropped("not_ours") - beforeNotOurs; d < 1 {
			t.Errorf("not_ours drops grew by %v, want at least 1", d)
		}
		// And nothing at all went to r from a but what r asked for.
		for _, f := range w.since(0, func(f ndFrame) bool { return bytes.Equal(f.ethSrc, l.macA) && bytes.Equal(f.ethDst, l.macR) }) {
			if f.dst != rGlobal && f.dst != rOffA && f.dst != l.llR {
				t.Errorf("a sent r %v", f)
			}
		}
	})
}
