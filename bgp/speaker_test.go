package bgp

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// loopbackPeer is a peer on the loopback range with a closed port: GoBGP's connection attempts
// get a RST and never leave the host. Needs no root and no namespace.
func loopbackPeer(name, addr string) PeerConfig {
	return PeerConfig{Name: name, MyASN: 64512, PeerASN: 64513, PeerAddress: netip.MustParseAddr(addr), PeerPort: 9, ConnectTime: time.Hour}
}

func newTestSpeaker(t *testing.T, reg prometheus.Registerer) *Speaker {
	t.Helper()
	sp, err := New(hclog.NewNullLogger(), reg, netip.MustParseAddr("127.0.0.1"), -1)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = sp.Shutdown(context.Background(), 0) })
	return sp
}

func statusNames(st []PeerStatus) []string {
	var names []string
	for _, s := range st {
		names = append(names, s.Name+"="+s.Address.String())
	}
	return names
}

func TestSpeakerPeersDiff(t *testing.T) {
	reg := prometheus.NewRegistry()
	sp := newTestSpeaker(t, reg)

	a, b := loopbackPeer("a", "127.0.0.2"), loopbackPeer("b", "127.0.0.3")
	bad := loopbackPeer("bad", "127.0.0.4")
	bad.MyASN = 0
	err := sp.SetPeers([]PeerConfig{a, b, bad})
	if err == nil || !strings.Contains(err.Error(), "peer bad: myASN") {
		t.Errorf("SetPeers error %v, want one naming peer bad", err)
	}
	if got := strings.Join(statusNames(sp.Status()), " "); got != "a=127.0.0.2 b=127.0.0.3" {
		t.Errorf("peers %q, want a and b", got)
	}

	// Change b's address, drop a, keep bad out: the result is exactly b at its new address.
	b.PeerAddress = netip.MustParseAddr("127.0.0.5")
	if err := sp.SetPeers([]PeerConfig{b}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	st := sp.Status()
	if got := strings.Join(statusNames(st), " "); got != "b=127.0.0.5" {
		t.Errorf("peers %q, want b=127.0.0.5", got)
	}
	if len(st) == 1 && (st[0].State == StateEstablished || st[0].BFD != BFDDisabled) {
		t.Errorf("status %+v: a peer on a closed port cannot be established, and has no BFD", st[0])
	}

	// An address moving from one name to another in one call works (remove before add).
	c := loopbackPeer("c", "127.0.0.5")
	if err := sp.SetPeers([]PeerConfig{c}); err != nil {
		t.Fatalf("SetPeers moving an address: %v", err)
	}
	if got := strings.Join(statusNames(sp.Status()), " "); got != "c=127.0.0.5" {
		t.Errorf("peers %q, want c=127.0.0.5", got)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"vipgate_bgp_session_up", "vipgate_bgp_session_state", "vipgate_bgp_routes_advertised", "vipgate_bgp_updates_sent_total"} {
		if !names[n] {
			t.Errorf("metric %s missing (have %v)", n, names)
		}
	}
}

func TestSpeakerAdvertisements(t *testing.T) {
	sp := newTestSpeaker(t, nil)
	if err := sp.SetPeers([]PeerConfig{loopbackPeer("a", "127.0.0.2"), loopbackPeer("b", "127.0.0.3")}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	p := netip.MustParsePrefix
	ads := []Advertisement{
		{Prefix: p("203.0.113.1/32")},
		{Prefix: p("203.0.113.2/32"), Peers: []string{"a"}},
		{Prefix: p("2001:db8:ff::1/128"), Peers: []string{"b"}},
		{Prefix: p("203.0.113.3/32"), Communities: []string{"bogus"}},
	}
	err := sp.SetAdvertisements(ads)
	if err == nil || !strings.Contains(err.Error(), "203.0.113.3/32") {
		t.Errorf("SetAdvertisements error %v, want one naming 203.0.113.3/32", err)
	}
	check := func(wantRoutes int, wantFilters map[string][]string) {
		t.Helper()
		sp.mu.Lock()
		defer sp.mu.Unlock()
		if len(sp.routes) != wantRoutes {
			t.Errorf("%d routes announced, want %d", len(sp.routes), wantRoutes)
		}
		got := map[string][]string{}
		for name, f := range sp.filters {
			for pfx := range f.denied {
				got[name] = append(got[name], pfx.String())
			}
		}
		if len(got) != len(wantFilters) {
			t.Errorf("filters %v, want %v", got, wantFilters)
		}
		for name, want := range wantFilters {
			if strings.Join(got[name], ",") != strings.Join(want, ",") {
				t.Errorf("filter of %s denies %v, want %v", name, got[name], want)
			}
		}
	}
	// b (IPv4) must not get 203.0.113.2; the IPv6 route concerns no IPv4 filter.
	check(3, map[string][]string{"b": {"203.0.113.2/32"}})

	// Moving the restricted route to b swaps the filters; dropping restrictions removes them.
	ads[1].Peers = []string{"b"}
	if err := sp.SetAdvertisements(ads[:3]); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check(3, map[string][]string{"a": {"203.0.113.2/32"}})
	if err := sp.SetAdvertisements(ads[:1]); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check(1, map[string][]string{})

	// Removing a peer removes its filter too.
	if err := sp.SetAdvertisements(ads[:2]); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check(2, map[string][]string{"a": {"203.0.113.2/32"}})
	if err := sp.SetPeers([]PeerConfig{loopbackPeer("b", "127.0.0.3")}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	check(2, map[string][]string{})

	if err := sp.Shutdown(context.Background(), 0); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := sp.SetAdvertisements(ads); err == nil {
		t.Error("SetAdvertisements after Shutdown succeeded")
	}
	if st := sp.Status(); st != nil {
		t.Errorf("Status after Shutdown: %v", st)
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	if _, err := New(nil, nil, netip.MustParseAddr("2001:db8::1"), -1); err == nil {
		t.Error("New accepted an IPv6 router ID")
	}
	if _, err := New(nil, nil, netip.MustParseAddr("192.0.2.1"), 70000); err == nil {
		t.Error("New accepted port 70000")
	}
}
