package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestL2Soak runs the three-node L2 lab of TestL2FailoverFast for a long time with every node's CPU
// saturated and vipgate under GC pressure, and counts false failovers: there must be none. It runs
// only with VIPGATE_SOAK=1 (it takes the duration plus about a minute; give go test a -timeout):
//
//	VIPGATE_SOAK=1 go test -count=1 -timeout 30m -run TestL2Soak -v ./test/e2e/
//
// Load, all of it bounded in count and time and ended by PID:
//   - CPU: VIPGATE_SOAK_BUSY (default 2) busy loops per node, started in each node's namespace
//     (`timeout -s KILL` so they cannot outlive the run): 6 runnable loops on top of everything else.
//     Namespaces do not partition CPUs, so every vipgate competes with all of them.
//   - GC: vipgate runs with GOGC=VIPGATE_SOAK_GOGC (default 5) and
//     GOMEMLIMIT=VIPGATE_SOAK_GOMEMLIMIT (default 16MiB: a cap, the live heap is ~4 MiB; "none"
//     for either leaves the Go default), and its /metrics is scraped every 50 ms (a scrape
//     allocates): the collector runs ~11 times a second instead of ~1. The test reports the GC
//     cycles per second and the longest recent pause, from go_gc_duration_seconds.
//
// What is watched, all along:
//   - ARP: every VIP asked for continuously from the LAN client; an IP answered by another node
//     than its owner, or by two, is a false failover; an IP no node answered within a 50 ms scan
//     is asked again with 500 ms to answer, and if still unanswered it counts as "no owner".
//   - Membership, from each node's /metrics every 50 ms: vipgate_speaker_ready 1,
//     vipgate_speaker_members_heard 3 and vipgate_speaker_members_candidates 3; any other sample is
//     a false failover (a member seen as silent or not ready, or this node not ready). The logs'
//     "member cannot announce" and "ready=false" lines during the soak count too (they catch what
//     falls between two samples).
//   - Heartbeats on the wire: a packet socket on each node's eth0 timestamps (kernel time) every
//     heartbeat that leaves or arrives; the gaps per peer and direction say how close the load came
//     to deadAfter, and whether a late heartbeat was late leaving its sender (the sender stalled)
//     or on the way.
//   - A TCP probe to a VIP every 100 ms from the LAN client.
//
// At the end, still under load, the owner of a VIP is killed (as in TestL2FailoverFast) and the
// failover is reported. VIPGATE_SOAK_DURATION (default 10m) and VIPGATE_SOAK_INTERVALS (default
// 50ms/200ms: heartbeatInterval/deadAfter) choose the run.
func TestL2Soak(t *testing.T) {
	if os.Getenv("VIPGATE_SOAK") != "1" {
		t.Skip("the L2 soak runs only with VIPGATE_SOAK=1 (10 minutes by default)")
	}
	dur, err := time.ParseDuration(cmpEnv("VIPGATE_SOAK_DURATION", "10m"))
	if err != nil || dur < 10*time.Second || dur > time.Hour {
		t.Fatalf("VIPGATE_SOAK_DURATION: want 10s-1h")
	}
	settings, err := parseFastSettings(cmpEnv("VIPGATE_SOAK_INTERVALS", "50ms/200ms"))
	if err != nil || len(settings) != 1 {
		t.Fatalf("VIPGATE_SOAK_INTERVALS: want one interval/deadAfter pair: %v", err)
	}
	setting := settings[0]
	busy, err := strconv.Atoi(cmpEnv("VIPGATE_SOAK_BUSY", "2"))
	if err != nil || busy < 0 || busy > 4 {
		t.Fatalf("VIPGATE_SOAK_BUSY: want 0-4 busy loops per node")
	}
	x := newFastLab(t)
	for _, e := range [][2]string{{"GOGC", cmpEnv("VIPGATE_SOAK_GOGC", "5")}, {"GOMEMLIMIT", cmpEnv("VIPGATE_SOAK_GOMEMLIMIT", "16MiB")}} {
		if e[1] != "none" { // "none": the Go default
			x.env = append(x.env, e[0]+"="+e[1])
		}
	}
	// VIPGATE_SOAK_NICE (e.g. -10) gives vipgate more CPU weight than the busy loops, as a CPU
	// request gives it in a pod (nice only matters within the session's scheduling group: the busy
	// loops, the three vipgates and this test share one; other sessions on the machine do not).
	// VIPGATE_SOAK_RT (e.g. 10) runs it at that SCHED_RR priority instead, as keepalived can run
	// its VRRP process (vipgate needs a few % of a CPU; the kernel's RT throttling bounds it).
	if v := os.Getenv("VIPGATE_SOAK_NICE"); v != "" {
		x.wrap = []string{"nice", "-n", v}
	}
	if v := os.Getenv("VIPGATE_SOAK_RT"); v != "" {
		x.wrap = []string{"chrt", "-r", v}
	}
	x.restartAll(setting)
	owners := func(ip netip.Addr) string { return hashOwner(ip, x.names...) }

	// Heartbeat capture first (it must see the steady state), then the load.
	caps := map[string]*hbCapture{}
	for _, n := range x.names {
		c, err := newHBCapture(x.l.NS(n), l2MemberPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		caps[n] = c
	}
	var loops []*lab.Proc
	stopLoops := func() {
		for _, p := range loops {
			_ = p.Kill()
		}
		loops = nil
	}
	t.Cleanup(stopLoops)
	loopSecs := strconv.Itoa(int((dur + 3*time.Minute).Seconds()))
	for _, n := range x.names {
		for range busy {
			p, err := x.l.Start(n, "", "timeout", "-s", "KILL", loopSecs, "sh", "-c", "while :; do :; done")
			if err != nil {
				t.Fatal(err)
			}
			loops = append(loops, p)
		}
	}
	logCount := func(line string) map[string]int {
		out := map[string]int{}
		for n, p := range x.procs {
			out[n] = strings.Count(p.Log(), line)
		}
		return out
	}
	cannotBefore, notReadyBefore := logCount("member cannot announce"), logCount("ready=false")

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	started := time.Now()

	// Probes: one TCP connection to vip every 100 ms for the whole soak.
	var probes lab.ProbeSummary
	var probeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		probes, probeErr = x.l.ProbeMany("lanclient", "tcp", x.vip.String()+":80", int(dur/(100*time.Millisecond)), 100*time.Millisecond)
	}()

	// Membership metrics of every node.
	samplers := map[string]*metricsSampler{}
	for _, n := range x.names {
		s := newMetricsSampler(x.l.NS(n), len(x.names))
		samplers[n] = s
		wg.Add(1)
		go func() { defer wg.Done(); s.run(ctx, 50*time.Millisecond) }()
	}
	gcBefore := map[string]map[string]float64{}
	for n, s := range samplers {
		gcBefore[n], _ = s.scrape()
	}

	// ARP, in this goroutine.
	var arp struct {
		scans, wrong, silent, silentAgain int
		example                           string
	}
	for ctx.Err() == nil {
		got := x.owners(x.ips, 50*time.Millisecond)
		arp.scans++
		var silent []netip.Addr
		for _, ip := range x.ips {
			switch {
			case len(got[ip]) == 0:
				silent = append(silent, ip)
			case len(got[ip]) != 1 || got[ip][0] != owners(ip):
				arp.wrong++
				if arp.example == "" {
					arp.example = fmt.Sprintf("%v after the start: %s answered by %v, want %s", time.Since(started).Round(time.Millisecond), ip, got[ip], owners(ip))
				}
			}
		}
		arp.silent += len(silent)
		if len(silent) > 0 {
			again := x.owners(silent, 500*time.Millisecond)
			for _, ip := range silent {
				if len(again[ip]) == 0 {
					arp.silentAgain++
					if arp.example == "" {
						arp.example = fmt.Sprintf("%v after the start: %s unanswered twice", time.Since(started).Round(time.Millisecond), ip)
					}
				}
			}
		}
	}
	wg.Wait()
	soaked := time.Since(started)

	t.Logf("soak %v, setting %s, %d busy loops per node, vipgate with %v, run by %q; %d VIPs", soaked.Round(time.Second), setting, busy, x.env, x.wrap, len(x.ips))
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load average at the end: %s", strings.TrimSpace(string(load)))
	falses := 0
	t.Logf("ARP: %d scans of %d IPs: %d answers by another node than the owner or by two, %d IPs unanswered within a scan, %d of them still unanswered when asked again",
		arp.scans, len(x.ips), arp.wrong, arp.silent, arp.silentAgain)
	if arp.wrong+arp.silentAgain > 0 {
		falses += arp.wrong + arp.silentAgain
		t.Errorf("ARP: owners changed or missing, e.g. %s", arp.example)
	}
	if probeErr != nil {
		t.Errorf("probes: %v", probeErr)
	} else {
		t.Logf("probes every 100 ms: %d of %d answered, longest gap %v, errors %v", probes.OK, probes.Sent, probes.MaxGap, probes.Errors)
	}
	cannot, notReady := logCount("member cannot announce"), logCount("ready=false")
	for _, n := range x.names {
		s := samplers[n]
		s.mu.Lock()
		t.Logf("%s membership: %d samples (%d failed scrapes, longest scrape %v): %d not ready, %d hearing fewer than %d, %d with fewer than %d candidates%s",
			n, s.samples, s.errors, s.slowest.Round(time.Millisecond), s.notReady, s.deaf, len(x.names), s.fewer, len(x.names), s.example)
		falses += s.notReady + s.deaf + s.fewer
		if s.notReady+s.deaf+s.fewer > 0 {
			t.Errorf("%s: the membership changed under load: %s", n, s.example)
		}
		s.mu.Unlock()
		if d1, d2 := cannot[n]-cannotBefore[n], notReady[n]-notReadyBefore[n]; d1+d2 > 0 {
			falses += d1 + d2
			t.Errorf("%s logged %d \"member cannot announce\" and %d \"ready=false\" during the soak", n, d1, d2)
		}
		after, err := samplers[n].scrape()
		if err == nil {
			before := gcBefore[n]
			gcs := after["go_gc_duration_seconds_count"] - before["go_gc_duration_seconds_count"]
			hbs := after["vipgate_speaker_heartbeats_received_total"] - before["vipgate_speaker_heartbeats_received_total"]
			t.Logf("%s vipgate: %.1f GC cycles/s, longest recent GC pause %.2f ms, heap %.1f MiB of %.1f MiB from the OS; %.1f heartbeats/s received (%v interval, %d peers: %.0f expected)",
				n, gcs/soaked.Seconds(), 1000*after[`go_gc_duration_seconds{quantile="1"}`], after["go_memstats_heap_alloc_bytes"]/(1<<20), after["go_memstats_sys_bytes"]/(1<<20),
				hbs/soaked.Seconds(), setting.hb, len(x.names)-1, float64(len(x.names)-1)*float64(time.Second)/float64(setting.hb))
		}
		for k, g := range caps[n].stats() {
			dir := "heard from"
			if k.out {
				dir = "sent to"
			}
			t.Logf("%s %s %s: %d heartbeats, longest gap %v, gaps ≥ 2×interval: %d, ≥ deadAfter: %d, p99.9 %v",
				n, dir, x.nodeAt(k.peer), g.count, g.max.Round(100*time.Microsecond), g.over(2*setting.hb), g.over(setting.dead), g.quantile(0.999).Round(100*time.Microsecond))
		}
	}
	t.Logf("false failovers: %d", falses)

	// The failover, still under load.
	r := x.failover()
	t.Logf("failover under load (%s): %v", setting, r)
	stopLoops()
}

// nodeAt names the node with IPv4 address a.
func (x *fastLab) nodeAt(a netip.Addr) string {
	for _, n := range x.l.Nodes() {
		if n.IPv4 == a {
			return n.Name
		}
	}
	return a.String()
}

// metricsSampler scrapes a node's /metrics over one kept-alive connection (dialled in the node's
// namespace) and counts the samples where the membership is not whole.
type metricsSampler struct {
	c       *http.Client
	members int

	mu                                     sync.Mutex
	samples, errors, notReady, deaf, fewer int
	slowest                                time.Duration
	example                                string
	started                                time.Time
}

func newMetricsSampler(ns string, members int) *metricsSampler {
	dial := apiserver.DialerInNetns(ns)
	return &metricsSampler{members: members, started: time.Now(), c: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     func(ctx context.Context, network, addr string) (net.Conn, error) { return dial(ctx, network, addr) },
		MaxIdleConns:    1,
		IdleConnTimeout: time.Minute,
	}}}
}

// scrape reads every sample of /metrics ("name{labels}" -> value).
func (s *metricsSampler) scrape() (map[string]float64, error) {
	resp, err := s.c.Get("http://127.0.0.1:10249/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func (s *metricsSampler) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		m, err := s.scrape()
		took := time.Since(start)
		s.mu.Lock()
		s.slowest = max(s.slowest, took)
		if err != nil {
			if ctx.Err() == nil {
				s.errors++
			}
			s.mu.Unlock()
			continue
		}
		s.samples++
		bad := ""
		if m["vipgate_speaker_ready"] != 1 {
			s.notReady++
			bad += " not ready"
		}
		if m["vipgate_speaker_members_heard"] != float64(s.members) {
			s.deaf++
			bad += fmt.Sprintf(" heard %v", m["vipgate_speaker_members_heard"])
		}
		if m["vipgate_speaker_members_candidates"] != float64(s.members) {
			s.fewer++
			bad += fmt.Sprintf(" candidates %v", m["vipgate_speaker_members_candidates"])
		}
		if bad != "" && s.example == "" {
			s.example = fmt.Sprintf(", first at %v:%s", time.Since(s.started).Round(time.Millisecond), bad)
		}
		s.mu.Unlock()
	}
}

// hbCapture timestamps (in the kernel, SO_TIMESTAMPNS) every UDP datagram to port that leaves or
// arrives on a namespace's eth0 (a packet socket sees both directions), per peer address: the gaps
// between heartbeats as the sender's device saw them go out (the sender's own scheduling) and as
// the receiver's saw them come in (plus the softirq path in between), whatever this test's own
// scheduling.
type hbCapture struct {
	fd      int
	port    uint16
	ipProto uint16 // ETH_P_IP as the socket address carries it
	done    chan struct{}
	wg      sync.WaitGroup

	mu   sync.Mutex
	last map[hbKey]time.Time
	gaps map[hbKey][]time.Duration
}

// hbKey is one direction of one pair: the peer's address, and whether we sent (out) or received.
type hbKey struct {
	peer netip.Addr
	out  bool
}

func newHBCapture(ns string, port uint16) (*hbCapture, error) {
	c := &hbCapture{fd: -1, port: port, done: make(chan struct{}), last: map[hbKey]time.Time{}, gaps: map[hbKey][]time.Duration{}}
	var be [2]byte
	// ETH_P_ALL in network order: outgoing packets reach only the taps of every protocol.
	binary.BigEndian.PutUint16(be[:], syscall.ETH_P_ALL)
	proto := int(binary.NativeEndian.Uint16(be[:]))
	binary.BigEndian.PutUint16(be[:], syscall.ETH_P_IP)
	ipProto := binary.NativeEndian.Uint16(be[:])
	err := apiserver.InNetns(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		c.fd = fd
		return syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index})
	})
	if err == nil {
		for _, o := range []struct{ opt, v int }{{syscall.SO_TIMESTAMPNS, 1}, {syscall.SO_RCVBUF, 4 << 20}} {
			if err = syscall.SetsockoptInt(c.fd, syscall.SOL_SOCKET, o.opt, o.v); err != nil {
				break
			}
		}
	}
	if err != nil {
		if c.fd >= 0 {
			syscall.Close(c.fd)
		}
		return nil, fmt.Errorf("heartbeat capture in %s: %w", ns, err)
	}
	_ = syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Usec: 100000})
	c.ipProto = ipProto
	c.wg.Add(1)
	go c.run()
	return c, nil
}

func (c *hbCapture) run() {
	defer c.wg.Done()
	buf := make([]byte, 65536)
	oob := make([]byte, 256)
	for {
		select {
		case <-c.done:
			return
		default:
		}
		n, oobn, _, from, err := syscall.Recvmsg(c.fd, buf, oob, 0)
		if err != nil || n < 28 || buf[0]>>4 != 4 || buf[9] != syscall.IPPROTO_UDP {
			continue
		}
		ll, ok := from.(*syscall.SockaddrLinklayer)
		if !ok || ll.Protocol != c.ipProto {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+8 || binary.BigEndian.Uint16(buf[ihl+2:]) != c.port {
			continue
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			continue
		}
		var at time.Time
		for _, m := range msgs {
			if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SO_TIMESTAMPNS && len(m.Data) >= 16 {
				at = time.Unix(int64(binary.NativeEndian.Uint64(m.Data)), int64(binary.NativeEndian.Uint64(m.Data[8:])))
			}
		}
		if at.IsZero() {
			continue
		}
		const packetOutgoing = 4
		k := hbKey{peer: netip.AddrFrom4([4]byte(buf[12:16])), out: ll.Pkttype == packetOutgoing}
		if k.out {
			k.peer = netip.AddrFrom4([4]byte(buf[16:20]))
		}
		c.mu.Lock()
		if last, ok := c.last[k]; ok && at.After(last) {
			c.gaps[k] = append(c.gaps[k], at.Sub(last))
		}
		c.last[k] = at
		c.mu.Unlock()
	}
}

func (c *hbCapture) close() {
	select {
	case <-c.done:
		return
	default:
		close(c.done)
	}
	c.wg.Wait()
	syscall.Close(c.fd)
}

// hbGaps are the inter-arrival times of one sender's heartbeats, sorted.
type hbGaps struct {
	count int
	max   time.Duration
	gaps  []time.Duration
}

func (g hbGaps) over(d time.Duration) int {
	i, _ := slices.BinarySearch(g.gaps, d)
	return len(g.gaps) - i
}

func (g hbGaps) quantile(q float64) time.Duration {
	if len(g.gaps) == 0 {
		return 0
	}
	return g.gaps[min(len(g.gaps)-1, int(q*float64(len(g.gaps))))]
}

// stats returns the gaps seen so far per source.
func (c *hbCapture) stats() map[hbKey]hbGaps {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[hbKey]hbGaps{}
	for src, gs := range c.gaps {
		s := slices.Sorted(slices.Values(gs))
		out[src] = hbGaps{count: len(s) + 1, max: s[len(s)-1], gaps: s}
	}
	return out
}
