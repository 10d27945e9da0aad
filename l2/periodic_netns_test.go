package l2

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
)

// announcement is one gratuitous ARP or unsolicited NA seen on the wire.
type announcement struct {
	ip  netip.Addr
	mac net.HardwareAddr
}

// capture listens on one interface of namespace b and collects the announcements a sends: ARP
// frames whose sender and target address are the same (gratuitous ARP, request or reply), and
// ICMPv6 neighbor advertisements to ff02::1 (unsolicited NA).
type capture struct {
	conn *packet.Conn
	mu   sync.Mutex
	seen []announcement
	done chan struct{}
	stop atomic.Bool
}

func (l *lab) capture(t *testing.T, iface string) *capture {
	t.Helper()
	c := &capture{done: make(chan struct{})}
	opened := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in b
		if err := netns.Set(l.hb); err != nil {
			opened <- err
			return
		}
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			opened <- err
			return
		}
		c.conn, err = packet.Listen(ifi, packet.Raw, 0x0003 /* ETH_P_ALL */, nil)
		opened <- err
	}()
	if err := <-opened; err != nil {
		t.Fatalf("capturing on %s in %s: %v", iface, l.b, err)
	}
	go c.run()
	t.Cleanup(c.close)
	return c
}

func (c *capture) run() {
	defer close(c.done)
	buf := make([]byte, 2048)
	for {
		n, _, err := c.conn.ReadFrom(buf)
		if err != nil {
			if c.stop.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil {
			continue
		}
		switch f.EtherType {
		case ethernet.EtherTypeARP:
			var p arp.Packet
			if p.UnmarshalBinary(f.Payload) == nil && p.SenderIP == p.TargetIP {
				c.add(announcement{p.SenderIP, p.SenderHardwareAddr})
			}
		case ethernet.EtherTypeIPv6:
			// IPv6 header (40 bytes), next header ICMPv6 (58), type 136 (NA), to ff02::1; the target
			// is at bytes 8-24 of the ICMPv6 message.
			b := f.Payload
			if len(b) < 40+24 || b[6] != 58 || b[40] != 136 {
				continue
			}
			if dst := netip.AddrFrom16([16]byte(b[24:40])); dst != netip.MustParseAddr("ff02::1") {
				continue
			}
			c.add(announcement{netip.AddrFrom16([16]byte(b[48:64])), f.Source})
		}
	}
}

func (c *capture) add(a announcement) {
	c.mu.Lock()
	c.seen = append(c.seen, a)
	c.mu.Unlock()
}

// count returns how many announcements of ip from mac were seen so far.
func (c *capture) count(ip netip.Addr, mac net.HardwareAddr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.seen {
		if a.ip == ip && bytes.Equal(a.mac, mac) {
			n++
		}
	}
	return n
}

func (c *capture) close() {
	c.stop.Store(true)
	c.conn.Close()
	<-c.done
}

// TestNetnsPeriodicAnnouncements: with Options.Periodic (MetalLB v0.16.2's
// --gratuitous-arp-interval), an owned VIP is announced again on its interface at the interval
// for as long as it is owned — gratuitous ARP for IPv4, unsolicited NA for IPv6, seen by a
// capture on the peer's end of the veth — and not on an interface it is only answered on; once
// given up, nothing more. No timing is asserted beyond "at least N rounds in a generous window".
func TestNetnsPeriodicAnnouncements(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	l := newLab(t)
	reg := prometheus.NewRegistry()
	logger := hclog.New(&hclog.LoggerOptions{Name: "l2", Output: testWriter{t}, Level: hclog.Info})
	const interval = 500 * time.Millisecond
	// No takeover repeats: every announcement after the first is a periodic one.
	a, err := New(logger, reg, Options{Repeats: []time.Duration{}, Periodic: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	capB, capB2 := l.capture(t, "vb"), l.capture(t, "vb2")

	vip := netip.MustParseAddr("192.0.2.60")
	vip6 := netip.MustParseAddr("2001:db8:1::60")
	quiet := netip.MustParseAddr("198.51.100.60") // answered on va2, announced nowhere
	l.inA(t, func() {
		err = a.SetOwnedWhere(map[netip.Addr]Where{
			vip:   {Answer: []string{"va"}},
			vip6:  {Answer: []string{"va"}},
			quiet: {Answer: []string{"va2"}, Announce: []string{}},
		})
	})
	if err != nil {
		t.Fatalf("SetOwnedWhere: %v", err)
	}

	// At least 4 periodic rounds (8 gratuitous ARP frames: request and reply each round, plus the
	// takeover's 2) within a window of 20 intervals.
	const rounds = 4
	deadline := time.Now().Add(20 * interval)
	for time.Now().Before(deadline) && (capB.count(vip, l.macA) < 2+2*rounds || capB.count(vip6, l.macA) < 1+rounds) {
		time.Sleep(interval / 5)
	}
	arp4, na6 := capB.count(vip, l.macA), capB.count(vip6, l.macA)
	t.Logf("seen on vb: %d gratuitous ARP frames for %s, %d unsolicited NAs for %s (interval %v)", arp4, vip, na6, vip6, interval)
	if arp4 < 2+2*rounds {
		t.Errorf("gratuitous ARP frames for %s on vb: %d, want at least %d (takeover + %d periodic rounds) in %v", vip, arp4, 2+2*rounds, rounds, 20*interval)
	}
	if na6 < 1+rounds {
		t.Errorf("unsolicited NAs for %s on vb: %d, want at least %d in %v", vip6, na6, 1+rounds, 20*interval)
	}
	if n := capB2.count(quiet, l.macA2); n != 0 {
		t.Errorf("%s (answered on va2, announced nowhere): %d announcements on vb2, want none", quiet, n)
	}
	if got := metricValue(t, reg, "vipgate_l2_periodic_announcements_total", nil); got < 2*rounds {
		t.Errorf("vipgate_l2_periodic_announcements_total = %v, want at least %d", got, 2*rounds)
	}

	// Given up: SetOwned returns after the last announcement it could race with (a round holds the
	// lock SetOwned takes), so nothing more may come.
	l.inA(t, func() { err = a.SetOwned(nil) })
	if err != nil {
		t.Fatalf("SetOwned(nil): %v", err)
	}
	before4, before6 := capB.count(vip, l.macA), capB.count(vip6, l.macA)
	time.Sleep(6 * interval)
	if n := capB.count(vip, l.macA) - before4; n != 0 {
		t.Errorf("%d gratuitous ARP frames for %s after it was given up", n, vip)
	}
	if n := capB.count(vip6, l.macA) - before6; n != 0 {
		t.Errorf("%d unsolicited NAs for %s after it was given up", n, vip6)
	}
}

// TestPeriodicRoundSkipsQuiet: one periodic round announces the owned pairs whose takeover is
// announced, not those only answered on (Where.Announce).
func TestPeriodicRoundSkipsQuiet(t *testing.T) {
	h := newFakeHost(eth0)
	a, reg := newTestAnnouncer(t, noRepeats, h)
	vip, quiet := netip.MustParseAddr("192.0.2.70"), netip.MustParseAddr("192.0.2.71")
	if err := a.SetOwnedWhere(map[netip.Addr]Where{vip: {Answer: []string{"eth0"}}, quiet: {Answer: []string{"eth0"}, Announce: []string{}}}); err != nil {
		t.Fatal(err)
	}
	if n := a.announcePeriodic(); n != 1 {
		t.Errorf("one periodic round announced %d pairs, want 1 (the quiet VIP is answered, not announced)", n)
	}
	if got := metricValue(t, reg, "vipgate_l2_periodic_announcements_total", nil); got != 1 {
		t.Errorf("vipgate_l2_periodic_announcements_total = %v, want 1", got)
	}
}
