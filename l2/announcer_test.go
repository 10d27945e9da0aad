package l2

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeHost plays the kernel for an Announcer: interfaces by name, and the
// fake sockets the Announcer opened on them.
type fakeHost struct {
	mu     sync.Mutex
	ifaces map[string]*net.Interface
	arp    map[string][]*fakePacketConn // every socket opened, by interface
	ndp    map[string][]*fakeNDPConn
	ndpIn  map[string][]*fakePacketConn
}

func newFakeHost(ifaces ...*net.Interface) *fakeHost {
	h := &fakeHost{ifaces: map[string]*net.Interface{}, arp: map[string][]*fakePacketConn{}, ndp: map[string][]*fakeNDPConn{}, ndpIn: map[string][]*fakePacketConn{}}
	for _, ifi := range ifaces {
		h.ifaces[ifi.Name] = ifi
	}
	return h
}

func (h *fakeHost) seams() seams {
	return seams{
		lookup: func(name string) (*net.Interface, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			ifi, ok := h.ifaces[name]
			if !ok {
				return nil, fmt.Errorf("route ip+net: no such network interface")
			}
			c := *ifi
			return &c, nil
		},
		openARP: func(ifi *net.Interface) (net.PacketConn, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			c := newFakePacketConn()
			h.arp[ifi.Name] = append(h.arp[ifi.Name], c)
			return c, nil
		},
		openNDP: func(ifi *net.Interface) (ndpSockets, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			in, out := newFakePacketConn(), newFakeNDPConn()
			h.ndp[ifi.Name] = append(h.ndp[ifi.Name], out)
			h.ndpIn[ifi.Name] = append(h.ndpIn[ifi.Name], in)
			return ndpSockets{frames: in, icmp: out, linkLocal: netip.MustParseAddr("fe80::1")}, nil
		},
	}
}

// lastARP is the newest ARP socket on iface.
func (h *fakeHost) lastARP(t *testing.T, iface string) *fakePacketConn {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.arp[iface]
	if len(c) == 0 {
		t.Fatalf("no ARP socket was opened on %s", iface)
	}
	return c[len(c)-1]
}

// lastNDPIn is the receiving side of the newest NDP responder on iface.
func (h *fakeHost) lastNDPIn(t *testing.T, iface string) *fakePacketConn {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.ndpIn[iface]
	if len(c) == 0 {
		t.Fatalf("no NDP socket was opened on %s", iface)
	}
	return c[len(c)-1]
}

// lastNDP is the sending side of the newest NDP responder on iface.
func (h *fakeHost) lastNDP(t *testing.T, iface string) *fakeNDPConn {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.ndp[iface]
	if len(c) == 0 {
		t.Fatalf("no NDP socket was opened on %s", iface)
	}
	return c[len(c)-1]
}

var (
	eth1      = &net.Interface{Index: 8, Name: "eth1", MTU: 1500, HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 1, 1}}
	noRepeats = Options{Repeats: []time.Duration{}}
)

func newTestAnnouncer(t *testing.T, opts Options, h *fakeHost) (*Announcer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	a, err := newAnnouncer(hclog.NewNullLogger(), reg, opts, h.seams())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, reg
}

var addrComparer = cmp.Comparer(func(x, y netip.Addr) bool { return x == y })

func TestAnnouncerSetOwned(t *testing.T) {
	h := newFakeHost(eth0, eth1)
	a, reg := newTestAnnouncer(t, noRepeats, h)

	err := a.SetOwned(map[netip.Addr][]string{
		vip4:     {"eth0"},
		vip6:     {"eth0"},
		vip4Eth1: {"eth1", "missing0"},
	})
	// The missing interface fails only its own pair.
	var ipErr *IPError
	if !errors.As(err, &ipErr) || ipErr.IP != vip4Eth1 || ipErr.Interface != "missing0" {
		t.Fatalf("SetOwned error = %v, want an IPError for %s on missing0", err, vip4Eth1)
	}
	if strings.Count(err.Error(), "VIP ") != 1 {
		t.Errorf("SetOwned error %q reports more than the one failed pair", err)
	}
	if diff := cmp.Diff([]netip.Addr{vip4, vip4Eth1, vip6}, a.Owned(), addrComparer); diff != "" {
		t.Errorf("Owned() (-want +got):\n%s", diff)
	}

	// The takeover was announced before SetOwned returned.
	if n := len(h.lastARP(t, "eth0").frames()); n != 2 {
		t.Errorf("eth0: %d ARP frames, want 2 (gratuitous request and reply)", n)
	}
	if n := len(h.lastARP(t, "eth1").frames()); n != 2 {
		t.Errorf("eth1: %d ARP frames, want 2", n)
	}
	ndp0 := h.lastNDP(t, "eth0")
	if n := len(ndp0.messages()); n != 1 {
		t.Errorf("eth0: %d neighbor advertisements, want 1", n)
	}
	if !ndp0.groups()[netip.MustParseAddr("ff02::1:ff00:50")] {
		t.Errorf("eth0 did not join the solicited-node group of %s: %v", vip6, ndp0.groups())
	}
	if len(h.ndp["eth1"]) != 0 {
		t.Errorf("an NDP socket was opened on eth1, which has no IPv6 VIP")
	}

	// Ownership as the responders see it.
	for _, c := range []struct {
		ip    netip.Addr
		iface string
		want  DropReason
	}{
		{vip4, "eth0", DropNone},
		{vip6, "eth0", DropNone},
		{vip4Eth1, "eth1", DropNone},
		{vip4, "eth1", DropWrongInterface},
		{vip4Eth1, "missing0", DropWrongInterface},
		{notOurs4, "eth0", DropNotOurs},
		{notOurs6, "eth0", DropNotOurs},
		{netip.AddrFrom16(vip4.As16()), "eth0", DropNone}, // 4-in-6 form of an owned VIP
	} {
		if got := a.owns(c.ip, c.iface); got != c.want {
			t.Errorf("owns(%s, %s) = %v, want %v", c.ip, c.iface, got, c.want)
		}
	}

	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"interface": "eth0", "family": "ipv4"}, 1},
		{map[string]string{"interface": "eth0", "family": "ipv6"}, 1},
		{map[string]string{"interface": "eth1", "family": "ipv4"}, 1},
	} {
		if got := metricValue(t, reg, "vipgate_l2_owned_ips", c.labels); got != c.want {
			t.Errorf("owned_ips%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := metricValue(t, reg, "vipgate_l2_gratuitous_sent_total", map[string]string{"interface": "eth0"}); got != 3 {
		t.Errorf("gratuitous_sent_total{eth0} = %v, want 3", got)
	}

	// The same set again is a no-op: nothing is re-announced.
	_ = a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}, vip6: {"eth0"}, vip4Eth1: {"eth1", "missing0"}})
	if n := len(h.lastARP(t, "eth0").frames()); n != 2 {
		t.Errorf("eth0: %d ARP frames after an unchanged SetOwned, want still 2", n)
	}

	// Giving up: answered no more, sockets closed, group left.
	arp1 := h.lastARP(t, "eth1")
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}}); err != nil {
		t.Fatalf("SetOwned: %v", err)
	}
	if got := a.owns(vip6, "eth0"); got != DropNotOurs {
		t.Errorf("owns(%s) after giving it up = %v, want not_ours", vip6, got)
	}
	if !ndp0.isClosed() || !arp1.isClosed() {
		t.Errorf("sockets without VIPs left open: ndp eth0 closed=%v, arp eth1 closed=%v", ndp0.isClosed(), arp1.isClosed())
	}
	if g := ndp0.groups(); len(g) != 0 {
		t.Errorf("still joined %v after giving up every IPv6 VIP", g)
	}
	if got := metricValue(t, reg, "vipgate_l2_owned_ips", nil); got != 1 {
		t.Errorf("owned_ips total = %v, want 1", got)
	}
}

// TestAnnouncerNeverAnswersForOthers feeds requests for addresses the host
// does not own (and owned ones on the wrong interface) through the real
// read loops and checks that nothing at all is sent.
func TestAnnouncerNeverAnswersForOthers(t *testing.T) {
	h := newFakeHost(eth0, eth1)
	a, reg := newTestAnnouncer(t, noRepeats, h)
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth1"}, vip6: {"eth1"}, notOurs4: {"eth0"}, notOurs6: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth1"}, vip6: {"eth1"}, vip4Eth1: {"eth0"}, vip6Eth1: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	arp0, ndp0, ndpIn0 := h.lastARP(t, "eth0"), h.lastNDP(t, "eth0"), h.lastNDPIn(t, "eth0")
	sentARP, sentNDP := len(arp0.frames()), len(ndp0.messages())

	for _, ip := range []netip.Addr{notOurs4, vip4, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.50")} {
		arp0.in <- buildARPFrame(t, request(ip))
	}
	for _, ip := range []netip.Addr{notOurs6, vip6, netip.MustParseAddr("2001:db8:1::1")} {
		ndpIn0.in <- buildNSFrame(t, nsFrame{target: ip, sourceLL: clientMAC})
	}
	eventually(t, "7 handled requests", func() bool {
		return metricValue(t, reg, "vipgate_l2_requests_received_total", map[string]string{"interface": "eth0"}) == 7
	})
	if n := len(arp0.frames()) - sentARP; n != 0 {
		t.Errorf("sent %d ARP frames for addresses not owned on eth0", n)
	}
	if n := len(ndp0.messages()) - sentNDP; n != 0 {
		t.Errorf("sent %d neighbor advertisements for addresses not owned on eth0", n)
	}
	for reason, want := range map[string]float64{"not_ours": 5, "wrong_interface": 2} {
		if got := metricValue(t, reg, "vipgate_l2_requests_dropped_total", map[string]string{"interface": "eth0", "reason": reason}); got != want {
			t.Errorf("dropped{reason=%s} = %v, want %v", reason, got, want)
		}
	}
}

func TestAnnouncerRepeats(t *testing.T) {
	h := newFakeHost(eth0)
	a, _ := newTestAnnouncer(t, Options{Repeats: []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}}, h)
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}, vip6: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	arp0, ndp0 := h.lastARP(t, "eth0"), h.lastNDP(t, "eth0")
	// Once at once, then three repeats: 4 x (request + reply), 4 NAs.
	eventually(t, "all repeats", func() bool { return len(arp0.frames()) == 8 && len(ndp0.messages()) == 4 })
	for _, b := range arp0.frames() {
		if v := parseARPFrame(t, b); v.SPA != vip4.String() || v.TPA != vip4.String() || v.EthDst != bcast {
			t.Errorf("repeated frame is not a gratuitous ARP for %s: %+v", vip4, v)
		}
	}
}

// TestAnnouncerGiveUpCancelsRepeats gives a VIP up right after taking it
// over: no announcement may follow SetOwned's return.
func TestAnnouncerGiveUpCancelsRepeats(t *testing.T) {
	h := newFakeHost(eth0)
	repeats := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond}
	a, _ := newTestAnnouncer(t, Options{Repeats: repeats}, h)
	// Keep another VIP so the socket stays open and would carry any
	// late announcement.
	keep := netip.MustParseAddr("192.0.2.70")
	if err := a.SetOwned(map[netip.Addr][]string{keep: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetOwned(map[netip.Addr][]string{keep: {"eth0"}, vip4: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetOwned(map[netip.Addr][]string{keep: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	// Wait until keep's own repeats are done; vip4's would have been due
	// at the same times.
	arp0 := h.lastARP(t, "eth0")
	eventually(t, "repeats of the kept VIP", func() bool {
		n := 0
		for _, b := range arp0.frames() {
			if parseARPFrame(t, b).SPA == keep.String() {
				n++
			}
		}
		return n == 2*(1+len(repeats))
	})
	time.Sleep(2 * repeats[len(repeats)-1])
	n := 0
	for _, b := range arp0.frames() {
		if parseARPFrame(t, b).SPA == vip4.String() {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d ARP frames for the given-up VIP, want only the 2 of the takeover", n)
	}
}

// TestAnnouncerInterfaceRecreated: a new ifindex under the same name means
// a new socket and a new announcement.
func TestAnnouncerInterfaceRecreated(t *testing.T) {
	h := newFakeHost(eth0)
	a, _ := newTestAnnouncer(t, noRepeats, h)
	owned := map[netip.Addr][]string{vip4: {"eth0"}}
	if err := a.SetOwned(owned); err != nil {
		t.Fatal(err)
	}
	old := h.lastARP(t, "eth0")
	h.mu.Lock()
	h.ifaces["eth0"] = &net.Interface{Index: 17, Name: "eth0", MTU: 1500, HardwareAddr: ourMAC}
	h.mu.Unlock()
	if err := a.SetOwned(owned); err != nil {
		t.Fatal(err)
	}
	if !old.isClosed() {
		t.Error("socket on the old interface was not closed")
	}
	if n := len(h.lastARP(t, "eth0").frames()); n != 2 {
		t.Errorf("%d frames on the recreated interface, want 2 (a new announcement)", n)
	}

	// The interface disappears: its VIP fails, and is logged, once.
	h.mu.Lock()
	delete(h.ifaces, "eth0")
	h.mu.Unlock()
	var logs bytes.Buffer
	a.log = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	for range 3 {
		if err := a.SetOwned(owned); err == nil {
			t.Fatal("SetOwned on a vanished interface succeeded")
		}
	}
	if n := strings.Count(logs.String(), "cannot answer for VIP"); n != 1 {
		t.Errorf("failure logged %d times over 3 resyncs, want once:\n%s", n, logs.String())
	}
	if len(a.Owned()) != 0 {
		t.Errorf("Owned() = %v with the only interface gone", a.Owned())
	}
}

func TestAnnouncerRejectsInvalidVIPs(t *testing.T) {
	h := newFakeHost(eth0)
	a, _ := newTestAnnouncer(t, noRepeats, h)
	for _, s := range []string{"0.0.0.0", "127.0.0.1", "224.0.0.1", "255.255.255.255", "::", "::1", "ff02::1", "fe80::1", "169.254.1.1"} {
		ip := netip.MustParseAddr(s)
		err := a.SetOwned(map[netip.Addr][]string{ip: {"eth0"}})
		if !errors.Is(err, ErrInvalidVIP) {
			t.Errorf("SetOwned(%s) = %v, want ErrInvalidVIP", s, err)
		}
	}
	if len(a.Owned()) != 0 {
		t.Errorf("Owned() = %v, want nothing", a.Owned())
	}
}

func TestAnnouncerClose(t *testing.T) {
	h := newFakeHost(eth0)
	a, reg := newTestAnnouncer(t, Options{Repeats: []time.Duration{time.Hour}}, h)
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}, vip6: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // also waits for the pending repeats
		t.Fatal(err)
	}
	if !h.lastARP(t, "eth0").isClosed() || !h.lastNDP(t, "eth0").isClosed() {
		t.Error("Close left sockets open")
	}
	if got := a.owns(vip4, "eth0"); got != DropNotOurs {
		t.Errorf("owns after Close = %v", got)
	}
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}}); err == nil {
		t.Error("SetOwned after Close succeeded")
	}
	if got := metricValue(t, reg, "vipgate_l2_owned_ips", nil); got != 0 {
		t.Errorf("owned_ips after Close = %v", got)
	}
}

func TestNewRegistersMetricsOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(nil, reg, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, reg, Options{}); err == nil {
		t.Error("a second Announcer on the same registry registered its metrics")
	}
	if _, err := New(nil, nil, Options{}); err != nil {
		t.Errorf("New without a registry: %v", err)
	}
}

// TestAnnouncerReannounce: an owner cut off from its peer kept its VIPs while the peer took them
// over; when it hears the peer again, Reannounce sends the takeover announcements again (the
// LAN's caches point at the peer), and nothing for VIPs it does not own.
func TestAnnouncerReannounce(t *testing.T) {
	h := newFakeHost(eth0)
	a, _ := newTestAnnouncer(t, noRepeats, h)
	if err := a.SetOwned(map[netip.Addr][]string{vip4: {"eth0"}}); err != nil {
		t.Fatal(err)
	}
	arp0 := h.lastARP(t, "eth0")
	before := len(arp0.frames())
	if n := a.Reannounce(); n != 1 {
		t.Errorf("Reannounce announced %d pairs, want 1", n)
	}
	frames := arp0.frames()[before:]
	if len(frames) != 2 {
		t.Fatalf("%d ARP frames after Reannounce, want 2 (gratuitous request and reply)", len(frames))
	}
	for _, b := range frames {
		if v := parseARPFrame(t, b); v.SPA != vip4.String() || v.TPA != vip4.String() || v.EthDst != bcast {
			t.Errorf("frame is not a gratuitous ARP for %s: %+v", vip4, v)
		}
	}
	if err := a.SetOwned(nil); err != nil {
		t.Fatal(err)
	}
	if n := a.Reannounce(); n != 0 {
		t.Errorf("Reannounce announced %d pairs owning nothing", n)
	}
}
