package l2

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// lab is two network namespaces: a (the announcer host) and b (a client),
// joined by two veth pairs: va-vb on 192.0.2.0/24 and 2001:db8:1::/64,
// va2-vb2 on 198.51.100.0/24.
type lab struct {
	a, b     string // namespace names
	ha, hb   netns.NsHandle
	nlb      *netlink.Handle // netlink in b
	macA     net.HardwareAddr
	macA2    net.HardwareAddr
	vbIndex  int
	vb2Index int
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newLab builds the namespaces; t.Cleanup removes them, also on failure.
func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, tool := range []string{"ip", "arping"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	prefix := fmt.Sprintf("vgt%d", os.Getpid())
	l := &lab{a: prefix + "-a", b: prefix + "-b"}
	for _, ns := range []string{l.a, l.b} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		// No duplicate address detection: the link-local address must be
		// usable at once for the NDP socket to bind to it.
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw",
			"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	// Links are created inside the namespaces, never in the root one.
	run(t, "ip", "-n", l.a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", l.b)
	run(t, "ip", "-n", l.a, "link", "add", "va2", "type", "veth", "peer", "name", "vb2", "netns", l.b)
	for _, c := range [][]string{
		{l.a, "192.0.2.1/24", "va"}, {l.a, "2001:db8:1::1/64", "va"}, {l.a, "198.51.100.1/24", "va2"},
		{l.b, "192.0.2.2/24", "vb"}, {l.b, "2001:db8:1::2/64", "vb"}, {l.b, "198.51.100.2/24", "vb2"},
	} {
		run(t, "ip", "-n", c[0], "addr", "add", c[1], "dev", c[2])
	}
	for _, c := range [][]string{{l.a, "lo"}, {l.a, "va"}, {l.a, "va2"}, {l.b, "lo"}, {l.b, "vb"}, {l.b, "vb2"}} {
		run(t, "ip", "-n", c[0], "link", "set", c[1], "up")
	}

	var err error
	if l.ha, err = netns.GetFromName(l.a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.ha.Close() })
	if l.hb, err = netns.GetFromName(l.b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.hb.Close() })
	if l.nlb, err = netlink.NewHandleAt(l.hb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.nlb.Close)
	for name, idx := range map[string]*int{"vb": &l.vbIndex, "vb2": &l.vb2Index} {
		link, err := l.nlb.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		*idx = link.Attrs().Index
	}
	l.inA(t, func() {
		for name, mac := range map[string]*net.HardwareAddr{"va": &l.macA, "va2": &l.macA2} {
			ifi, err := net.InterfaceByName(name)
			if err != nil {
				t.Error(err)
				return
			}
			*mac = ifi.HardwareAddr
		}
	})
	return l
}

// inA runs f on an OS thread inside namespace a and waits for it. Sockets
// opened by f stay in a. The thread is never unlocked, so Go discards it
// instead of reusing it elsewhere in the wrong namespace.
func (l *lab) inA(t *testing.T, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(l.ha); err != nil {
			done <- fmt.Errorf("entering %s: %w", l.a, err)
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// poke sends one UDP datagram from b to ip, which makes b's kernel
// resolve ip (an ARP request or a neighbor solicitation). The datagram
// itself is dropped by a, which does not hold the VIP as an address.
func (l *lab) poke(t *testing.T, ip netip.Addr) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(l.hb); err != nil {
			done <- err
			return
		}
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 9)))
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = c.Write([]byte("vipgate"))
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("sending to %s from b: %v", ip, err)
	}
}

// resolved waits up to wait for b to resolve ip on link idx and returns
// the MAC, or nil if b has none by then.
func (l *lab) resolved(t *testing.T, idx int, ip netip.Addr, wait time.Duration) net.HardwareAddr {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if mac, _, ok := l.neighbour(t, idx, ip); ok && mac != nil {
			return mac
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

var arpingReply = regexp.MustCompile(`bytes from ([0-9a-f:]{17}) \(([0-9.]+)\): index=\d+ time=(\S+ \S+)`)

// arping asks for ip from b on iface with one request and returns the
// MAC that answered (nil for no answer) and arping's round-trip time.
func (l *lab) arping(t *testing.T, iface string, ip netip.Addr) (net.HardwareAddr, string) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "exec", l.b, "arping", "-c", "1", "-w", "1", "-i", iface, ip.String()).CombinedOutput()
	m := arpingReply.FindSubmatch(out)
	if m == nil {
		return nil, ""
	}
	mac, err := net.ParseMAC(string(m[1]))
	if err != nil {
		t.Fatalf("arping printed %q: %v", m[1], err)
	}
	return mac, string(m[3])
}

// neighbour returns b's neighbour table entry for ip on link index idx.
func (l *lab) neighbour(t *testing.T, idx int, ip netip.Addr) (net.HardwareAddr, int, bool) {
	t.Helper()
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, err := l.nlb.NeighList(idx, family)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.HardwareAddr, n.State, true
		}
	}
	return nil, 0, false
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestNetnsAnnouncer runs an Announcer in namespace a and checks from b,
// with the kernel's own tools, that it answers exactly for what it owns.
func TestNetnsAnnouncer(t *testing.T) {
	l := newLab(t)
	reg := prometheus.NewRegistry()
	logger := hclog.New(&hclog.LoggerOptions{Name: "l2", Output: testWriter{t}, Level: hclog.Debug})
	a, err := New(logger, reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	setOwned := func(owned map[netip.Addr][]string) {
		t.Helper()
		var err error
		l.inA(t, func() { err = a.SetOwned(owned) })
		if err != nil {
			t.Fatalf("SetOwned: %v", err)
		}
	}

	var (
		vip    = netip.MustParseAddr("192.0.2.50")
		other  = netip.MustParseAddr("192.0.2.51")
		vip6   = netip.MustParseAddr("2001:db8:1::50")
		other6 = netip.MustParseAddr("2001:db8:1::51")
		vip2   = netip.MustParseAddr("198.51.100.50")
	)

	l.inA(t, func() {
		name, err := DefaultInterface(netip.MustParseAddr("192.0.2.1"))
		if err != nil || name != "va" {
			t.Errorf("DefaultInterface(192.0.2.1) in a = %q, %v; want va", name, err)
		}
	})

	setOwned(map[netip.Addr][]string{vip: {"va"}, vip6: {"va"}, vip2: {"va2"}})

	t.Run("ARP", func(t *testing.T) {
		mac, rtt := l.arping(t, "vb", vip)
		if !bytes.Equal(mac, l.macA) {
			t.Fatalf("arping %s: answered by %v, want a's %v", vip, mac, l.macA)
		}
		t.Logf("ARP reply for %s from %v in %s (arping round trip)", vip, mac, rtt)
		if mac, _ := l.arping(t, "vb", other); mac != nil {
			t.Errorf("arping %s (not owned): answered by %v, want no answer", other, mac)
		}
		// vip is owned on va only: asking on the other link gets nothing.
		if mac, _ := l.arping(t, "vb2", vip); mac != nil {
			t.Errorf("arping %s on vb2 (owned on va only): answered by %v", vip, mac)
		}
		if mac, _ := l.arping(t, "vb2", vip2); !bytes.Equal(mac, l.macA2) {
			t.Errorf("arping %s on vb2: answered by %v, want a's %v", vip2, mac, l.macA2)
		}
		// The kernel's own resolution in b learns a's MAC too.
		l.poke(t, vip)
		if mac := l.resolved(t, l.vbIndex, vip, 3*time.Second); !bytes.Equal(mac, l.macA) {
			t.Errorf("b's neighbour entry for %s: %v, want a's %v", vip, mac, l.macA)
		}
		if got := metricValue(t, reg, "vipgate_l2_requests_dropped_total",
			map[string]string{"interface": "va2", "reason": "wrong_interface"}); got < 1 {
			t.Errorf("no wrong_interface drop counted on va2")
		}
	})

	t.Run("NDP", func(t *testing.T) {
		// A datagram makes b's kernel send a neighbor solicitation for
		// the VIP; the neighbour entry is what counts.
		start := time.Now()
		l.poke(t, vip6)
		mac := l.resolved(t, l.vbIndex, vip6, 3*time.Second)
		if !bytes.Equal(mac, l.macA) {
			t.Fatalf("b's neighbour entry for %s: %v, want a's %v", vip6, mac, l.macA)
		}
		t.Logf("b resolved %s to %v in %v (solicitation and advertisement)", vip6, mac, time.Since(start))
		l.poke(t, other6)
		if mac := l.resolved(t, l.vbIndex, other6, 1500*time.Millisecond); mac != nil {
			t.Errorf("b resolved %s (not owned) to %v, want no answer", other6, mac)
		}
		if got := metricValue(t, reg, "vipgate_l2_replies_sent_total", map[string]string{"interface": "va", "family": "ipv6"}); got < 1 {
			t.Errorf("replies_sent_total{va,ipv6} = %v, want at least 1", got)
		}
	})

	t.Run("NDP unreachability detection", func(t *testing.T) {
		// Once b's entry is stale and used, b confirms it with unicast
		// solicitations sent to the VIP itself, which a's kernel does not
		// deliver to ICMPv6 sockets (the VIP is not local). Unanswered, the
		// entry would fail after three probes.
		run(t, "ip", "netns", "exec", l.b, "sysctl", "-qw", "net.ipv6.neigh.vb.delay_first_probe_time=1")
		run(t, "ip", "-n", l.b, "-6", "neigh", "change", vip6.String(), "lladdr", l.macA.String(), "dev", "vb", "nud", "stale")
		before := metricValue(t, reg, "vipgate_l2_replies_sent_total", map[string]string{"interface": "va", "family": "ipv6"})
		start := time.Now()
		l.poke(t, vip6)
		var state int
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			_, state, _ = l.neighbour(t, l.vbIndex, vip6)
			if state&netlink.NUD_REACHABLE != 0 || state&netlink.NUD_FAILED != 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if state&netlink.NUD_REACHABLE == 0 {
			t.Fatalf("b's entry for %s is %s, want reachable after a unicast probe", vip6, neighState(state))
		}
		t.Logf("b confirmed %s by unicast probe %v after use (delay_first_probe_time 1s)", vip6, time.Since(start))
		// The responder counts a reply after sending it: under load the entry can be reachable
		// before the count moves, so wait for it.
		labels := map[string]string{"interface": "va", "family": "ipv6"}
		counted := false
		for deadline := time.Now().Add(5 * time.Second); !counted && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			counted = metricValue(t, reg, "vipgate_l2_replies_sent_total", labels) > before
		}
		if !counted {
			t.Errorf("no neighbor advertisement counted for the probe")
		}
	})

	t.Run("takeover", func(t *testing.T) {
		stale := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
		take4, take6 := netip.MustParseAddr("192.0.2.60"), netip.MustParseAddr("2001:db8:1::60")
		// b still has the previous owner's MAC for the VIPs.
		run(t, "ip", "-n", l.b, "neigh", "replace", take4.String(), "lladdr", stale.String(), "dev", "vb", "nud", "stale")
		run(t, "ip", "-n", l.b, "-6", "neigh", "replace", take6.String(), "lladdr", stale.String(), "dev", "vb", "nud", "stale")

		start := time.Now()
		setOwned(map[netip.Addr][]string{vip: {"va"}, vip6: {"va"}, vip2: {"va2"}, take4: {"va"}, take6: {"va"}})
		setOwnedTook := time.Since(start)
		took := map[netip.Addr]time.Duration{}
		deadline := time.Now().Add(5 * time.Second)
		for len(took) < 2 && time.Now().Before(deadline) {
			for _, ip := range []netip.Addr{take4, take6} {
				if _, done := took[ip]; done {
					continue
				}
				if mac, _, _ := l.neighbour(t, l.vbIndex, ip); bytes.Equal(mac, l.macA) {
					took[ip] = time.Since(start)
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
		for _, ip := range []netip.Addr{take4, take6} {
			d, ok := took[ip]
			if !ok {
				mac, state, _ := l.neighbour(t, l.vbIndex, ip)
				t.Errorf("b's neighbour entry for %s still %v (%s) after the announcements, want a's %v", ip, mac, neighState(state), l.macA)
				continue
			}
			t.Logf("b's neighbour entry for %s moved to a's MAC %v after SetOwned started (SetOwned took %v)", ip, d, setOwnedTook)
		}
	})

	t.Run("give up", func(t *testing.T) {
		setOwned(map[netip.Addr][]string{vip6: {"va"}})
		if mac, _ := l.arping(t, "vb", vip); mac != nil {
			t.Errorf("arping %s after giving it up: answered by %v", vip, mac)
		}
		// b forgets the entry; a fresh solicitation must go unanswered.
		run(t, "ip", "-n", l.b, "-6", "neigh", "flush", "dev", "vb")
		setOwned(map[netip.Addr][]string{})
		l.poke(t, vip6)
		if mac := l.resolved(t, l.vbIndex, vip6, 1500*time.Millisecond); mac != nil {
			t.Errorf("b resolved %s to %v after a gave it up", vip6, mac)
		}
		if got := a.Owned(); len(got) != 0 {
			t.Errorf("Owned() = %v", got)
		}
	})
}

func neighState(s int) string {
	for bit, name := range map[int]string{
		netlink.NUD_INCOMPLETE: "incomplete", netlink.NUD_REACHABLE: "reachable", netlink.NUD_STALE: "stale",
		netlink.NUD_DELAY: "delay", netlink.NUD_PROBE: "probe", netlink.NUD_FAILED: "failed",
		netlink.NUD_NOARP: "noarp", netlink.NUD_PERMANENT: "permanent",
	} {
		if s&bit != 0 {
			return name
		}
	}
	return fmt.Sprintf("state %#x", s)
}
