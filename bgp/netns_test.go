package bgp

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/vipgate/vipgate/test/routers"
)

// ASNs of the lab: the router is AS 64512; the speaker talks iBGP over IPv4 (64512) and eBGP over
// IPv6 (64513), which also proves per-peer local AS.
const (
	routerASN = 64512
	ibgpASN   = 64512
	ebgpASN   = 64513
)

// cmpNet lets cmp compare netip values (they have unexported fields).
var cmpNet = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

var (
	vip4 = netip.MustParsePrefix("203.0.113.10/32")
	vip6 = netip.MustParsePrefix("2001:db8:ff::10/128")
)

func gatherText(reg *prometheus.Registry) (string, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&sb, mf); err != nil {
			return "", err
		}
	}
	return sb.String(), nil
}

// birdLab starts a namespace pair with BIRD on the router side (sessions spk4 over IPv4 iBGP,
// spk6 over IPv6 eBGP) and a Speaker on the other side.
func birdLab(t *testing.T) (*routers.Pair, *routers.BIRD, *remoteSpeaker) {
	t.Helper()
	routers.RequireRoot(t, "bird", "birdc")
	pair := routers.NewPair(t)
	peers := []routers.BIRDPeer{
		{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN},
		{Name: "spk6", Local: pair.RouterV6, LocalASN: routerASN, Neighbor: pair.SpeakerV6, PeerASN: ebgpASN},
	}
	bird := routers.StartBIRD(t, pair.Router, routers.BIRDConfig(pair.RouterV4, peers...))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	return pair, bird, sp
}

func labPeers(pair *routers.Pair) (v4, v6 PeerConfig) {
	v4 = PeerConfig{Name: "bird4", MyASN: ibgpASN, PeerASN: routerASN, PeerAddress: pair.RouterV4,
		HoldTime: 9 * time.Second, ConnectTime: time.Second}
	v6 = PeerConfig{Name: "bird6", MyASN: ebgpASN, PeerASN: routerASN, PeerAddress: pair.RouterV6,
		HoldTime: 9 * time.Second, ConnectTime: time.Second}
	return v4, v6
}

func TestBIRDAdvertiseAndWithdraw(t *testing.T) {
	pair, bird, sp := birdLab(t)
	p4, p6 := labPeers(pair)
	if err := sp.SetPeers(p4, p6); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	for _, a := range []netip.Addr{pair.SpeakerV4, pair.SpeakerV6} {
		if err := routers.WaitEstablished(bird, a, 30*time.Second); err != nil {
			t.Fatalf("session with %s: %v", a, err)
		}
	}
	ads := []Advertisement{
		{Prefix: vip4, LocalPref: 150, Communities: []string{"65000:100", "no-export"}, LargeCommunities: []string{"65000:1:2"}},
		{Prefix: vip6, LocalPref: 150, Communities: []string{"65000:600"}, LargeCommunities: []string{"65000:6:6"}},
	}
	if err := sp.SetAdvertisements(ads...); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	want := []routers.Route{
		// iBGP: LOCAL_PREF arrives, AS path is empty, next hop is the speaker's link address.
		{Prefix: vip4, NextHop: pair.SpeakerV4, LocalPref: 150, Communities: []string{"65000:100", "65535:65281"}, LargeCommunities: []string{"65000:1:2"}},
		// eBGP: LOCAL_PREF is not sent (BIRD assigns its default 100), the AS path is our AS.
		{Prefix: vip6, NextHop: pair.SpeakerV6, LocalPref: 100, ASPath: "64513", Communities: []string{"65000:600"}, LargeCommunities: []string{"65000:6:6"}},
	}
	for _, w := range want {
		got, err := routers.WaitRoute(bird, w.Prefix, 10*time.Second)
		if err != nil {
			t.Fatalf("route %s: %v", w.Prefix, err)
		}
		if diff := cmp.Diff(w, got, cmpNet); diff != "" {
			t.Errorf("route %s in BIRD (-want +got):\n%s", w.Prefix, diff)
		}
	}

	st := sp.Status()
	for _, s := range st {
		if s.State != StateEstablished || s.Advertised != 1 {
			t.Errorf("status %+v: want established with 1 route", s)
		}
	}
	metrics := sp.Metrics()
	for _, m := range []string{`vipgate_bgp_session_up{peer="bird4"} 1`, `vipgate_bgp_routes_advertised{peer="bird6"} 1`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %q:\n%s", m, metrics)
		}
	}

	// Same input again: nothing changes, no UPDATE goes out.
	before := updatesSent(sp.Status())
	if err := sp.SetAdvertisements(ads...); err != nil {
		t.Fatalf("SetAdvertisements again: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if after := updatesSent(sp.Status()); !cmp.Equal(before, after) {
		t.Errorf("repeating SetAdvertisements sent UPDATEs: before %v after %v", before, after)
	}

	// Withdraw the IPv4 VIP only.
	if err := sp.SetAdvertisements(ads[1]); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	if err := routers.WaitNoRoute(bird, vip4, 10*time.Second); err != nil {
		t.Fatalf("withdrawn %s still in BIRD: %v", vip4, err)
	}
	if routes, err := bird.Routes(); err != nil || len(routes) != 1 || routes[0].Prefix != vip6 {
		t.Errorf("after withdrawing %s BIRD has %v (err %v), want only %s", vip4, routes, err, vip6)
	}
}

func updatesSent(st []PeerStatus) map[string]uint64 {
	m := map[string]uint64{}
	for _, s := range st {
		m[s.Name] = s.UpdatesSent
	}
	return m
}

// TestBIRDPerPeerAdvertisement proves Advertisement.Peers: a route restricted to one of two IPv4
// peers reaches only that one, and moving it to the other peer moves it without touching the first.
func TestBIRDPerPeerAdvertisement(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	// BIRD tells sessions apart by neighbor address, so the second session runs between a second
	// pair of addresses; the speaker picks its side with SourceAddress.
	rtr2, spk2 := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")
	pair := routers.NewPair(t)
	routers.MustRun(t, "ip", "-n", pair.Router, "addr", "add", rtr2.String()+"/24", "dev", pair.RouterIf)
	routers.MustRun(t, "ip", "-n", pair.Speaker, "addr", "add", spk2.String()+"/24", "dev", pair.SpeakerIf)
	bird := routers.StartBIRD(t, pair.Router, routers.BIRDConfig(pair.RouterV4,
		routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN},
		routers.BIRDPeer{Name: "spk4b", Local: rtr2, LocalASN: routerASN, Neighbor: spk2, PeerASN: ibgpASN}))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, _ := labPeers(pair)
	p4.SourceAddress = pair.SpeakerV4
	p4b := p4
	p4b.Name, p4b.PeerAddress, p4b.SourceAddress = "bird4b", rtr2, spk2
	if err := sp.SetPeers(p4, p4b); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if _, err := sp.waitStatus(30*time.Second, func(st []PeerStatus) bool {
		return len(st) == 2 && st[0].State == StateEstablished && st[1].State == StateEstablished
	}); err != nil {
		t.Fatalf("sessions: %v", err)
	}
	all := netip.MustParsePrefix("203.0.113.1/32")
	only := netip.MustParsePrefix("203.0.113.2/32")
	check := func(step string, want map[string][]netip.Prefix) {
		t.Helper()
		for proto, prefixes := range want {
			var got []netip.Prefix
			err := routers.WaitFor(10*time.Second, func() (bool, error) {
				routes, err := bird.RoutesFrom(proto)
				got = got[:0]
				for _, r := range routes {
					got = append(got, r.Prefix)
				}
				return err == nil && slices.Equal(got, prefixes), err
			})
			if err != nil {
				t.Errorf("%s: BIRD protocol %s has %v, want %v (%v)", step, proto, got, prefixes, err)
			}
		}
	}
	if err := sp.SetAdvertisements(Advertisement{Prefix: all}, Advertisement{Prefix: only, Peers: []string{"bird4"}}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check("restricted to bird4", map[string][]netip.Prefix{"spk4": {all, only}, "spk4b": {all}})
	if err := sp.SetAdvertisements(Advertisement{Prefix: all}, Advertisement{Prefix: only, Peers: []string{"bird4b"}}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check("moved to bird4b", map[string][]netip.Prefix{"spk4": {all}, "spk4b": {all, only}})
	if err := sp.SetAdvertisements(Advertisement{Prefix: all}, Advertisement{Prefix: only}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	check("unrestricted", map[string][]netip.Prefix{"spk4": {all, only}, "spk4b": {all, only}})
}

func TestBIRDGracefulShutdown(t *testing.T) {
	pair, bird, sp := birdLab(t)
	p4, _ := labPeers(pair)
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := sp.SetAdvertisements(Advertisement{Prefix: vip4, LocalPref: 200, Communities: []string{"65000:100"}}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	if r, err := routers.WaitRoute(bird, vip4, 30*time.Second); err != nil || r.LocalPref != 200 {
		t.Fatalf("route before shutdown: %+v, %v", r, err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- sp.Shutdown(3 * time.Second) }()
	// During the drain the route stays, marked GRACEFUL_SHUTDOWN with LOCAL_PREF 0.
	var drained routers.Route
	err := routers.WaitFor(3*time.Second, func() (bool, error) {
		routes, err := bird.Routes()
		r, ok := routers.Find(routes, vip4)
		drained = r
		return ok && r.LocalPref == 0 && slices.Contains(r.Communities, GracefulShutdownCommunity), err
	})
	if err != nil {
		t.Errorf("during drain BIRD has %+v, want LOCAL_PREF 0 and 65535:0: %v", drained, err)
	}
	if !slices.Contains(drained.Communities, "65000:100") {
		t.Errorf("drained route lost its own communities: %+v", drained)
	}
	if err := routers.WaitNoRoute(bird, vip4, 10*time.Second); err != nil {
		t.Errorf("route still present after shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	t.Logf("graceful shutdown: route gone %s after Shutdown(drain=3s) started", time.Since(start).Round(10*time.Millisecond))
}

func TestBIRDMD5(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	pair := routers.NewPair(t)
	bird := routers.StartBIRD(t, pair.Router, routers.BIRDConfig(pair.RouterV4, routers.BIRDPeer{
		Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN, Password: "right-secret"}))
	// Listening on 179 here (the other tests connect out only): the key must also be set on the
	// listening socket, since BIRD connects to us as well.
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, 179)
	p4, _ := labPeers(pair)
	p4.Password = "wrong-secret"
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	// With connect retries every second, 5s is several attempts; none may succeed.
	if err := routers.WaitEstablished(bird, pair.SpeakerV4, 5*time.Second); err == nil {
		t.Fatal("session established with a wrong MD5 password")
	}
	if st := sp.Status(); len(st) != 1 || st[0].State == StateEstablished {
		t.Fatalf("speaker status with wrong password: %+v", st)
	}
	p4.Password = "right-secret"
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := routers.WaitEstablished(bird, pair.SpeakerV4, 30*time.Second); err != nil {
		t.Fatalf("session with the right MD5 password: %v", err)
	}
}

// TestBIRDScale announces 1,000 /32s in one call and reports how long BIRD takes to have them all.
func TestBIRDScale(t *testing.T) {
	pair, bird, sp := birdLab(t)
	p4, _ := labPeers(pair)
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := routers.WaitEstablished(bird, pair.SpeakerV4, 30*time.Second); err != nil {
		t.Fatalf("session: %v", err)
	}
	const n = 1000
	ads := make([]Advertisement, n)
	base := netip.MustParseAddr("10.96.0.0") // the cluster IP range: routes only, no traffic
	for i := range ads {
		ads[i] = Advertisement{Prefix: netip.PrefixFrom(base, 32), Communities: []string{"65000:100"}}
		base = base.Next()
	}
	start := time.Now()
	if err := sp.SetAdvertisements(ads...); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	called := time.Since(start)
	var count int
	err := routers.WaitFor(60*time.Second, func() (bool, error) {
		var err error
		count, err = bird.Count()
		return count == n, err
	})
	if err != nil {
		t.Fatalf("BIRD has %d of %d routes: %v", count, n, err)
	}
	t.Logf("%d /32 routes: SetAdvertisements returned after %s, all in BIRD after %s",
		n, called.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := sp.SetAdvertisements(ads[:n/2]...); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	err = routers.WaitFor(60*time.Second, func() (bool, error) {
		var err error
		count, err = bird.Count()
		return count == n/2, err
	})
	if err != nil {
		t.Fatalf("BIRD has %d routes after withdrawing half: %v", count, err)
	}
	t.Logf("withdrawing %d routes took %s until BIRD had %d", n/2, time.Since(start).Round(time.Millisecond), n/2)
}

// frrLab starts FRR (zebra, bgpd, bfdd) on the router side, with BFD profile "fast" (300ms x3) on
// the IPv4 iBGP session when bfd is true, and a Speaker on the other side.
func frrLab(t *testing.T, bfd bool) (*routers.Pair, *routers.FRR, *remoteSpeaker) {
	t.Helper()
	routers.RequireRoot(t, "vtysh", "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "/usr/lib/frr/zebra")
	pair := routers.NewPair(t)
	prof := ""
	cfg := routers.FRRConfig{}
	if bfd {
		prof = "fast"
		cfg.BFDD = routers.FRRBFDConfig(prof, 300*time.Millisecond, 300*time.Millisecond, 3)
	}
	cfg.BGPD = routers.FRRBGPConfig(pair.RouterV4, routerASN,
		routers.FRRPeer{Neighbor: pair.SpeakerV4, PeerASN: ibgpASN, BFDProfile: prof},
		routers.FRRPeer{Neighbor: pair.SpeakerV6, PeerASN: ebgpASN})
	frr := routers.StartFRR(t, pair.Router, cfg)
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	return pair, frr, sp
}

func TestFRRAdvertise(t *testing.T) {
	pair, frr, sp := frrLab(t, false)
	p4, p6 := labPeers(pair)
	p4.Name, p6.Name = "frr4", "frr6"
	if err := sp.SetPeers(p4, p6); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	for _, a := range []netip.Addr{pair.SpeakerV4, pair.SpeakerV6} {
		if err := routers.WaitEstablished(frr, a, 30*time.Second); err != nil {
			t.Fatalf("session with %s: %v", a, err)
		}
	}
	if err := sp.SetAdvertisements(
		Advertisement{Prefix: vip4, LocalPref: 150, Communities: []string{"65000:100"}, LargeCommunities: []string{"65000:1:2"}},
		Advertisement{Prefix: vip6, Communities: []string{"65000:600"}, LargeCommunities: []string{"65000:6:6"}},
	); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	want := []routers.Route{
		{Prefix: vip4, NextHop: pair.SpeakerV4, LocalPref: 150, Communities: []string{"65000:100"}, LargeCommunities: []string{"65000:1:2"}},
		{Prefix: vip6, NextHop: pair.SpeakerV6, ASPath: "64513", Communities: []string{"65000:600"}, LargeCommunities: []string{"65000:6:6"}},
	}
	for _, w := range want {
		got, err := routers.WaitRoute(frr, w.Prefix, 10*time.Second)
		if err != nil {
			t.Fatalf("route %s: %v", w.Prefix, err)
		}
		if diff := cmp.Diff(w, got, cmpNet, cmpIgnoreEBGPLocalPref(w)); diff != "" {
			t.Errorf("route %s in FRR (-want +got):\n%s", w.Prefix, diff)
		}
	}
	if err := sp.SetAdvertisements(); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	for _, w := range want {
		if err := routers.WaitNoRoute(frr, w.Prefix, 10*time.Second); err != nil {
			t.Errorf("withdrawn %s still in FRR: %v", w.Prefix, err)
		}
	}
}

// cmpIgnoreEBGPLocalPref ignores LocalPref for eBGP routes (FRR may print its default or none).
func cmpIgnoreEBGPLocalPref(w routers.Route) cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		return w.ASPath != "" && p.Last().String() == ".LocalPref"
	}, cmp.Ignore())
}

// TestFRRBFD freezes the speaker (SIGSTOP: sockets stay open, nothing is sent, like a hung node)
// and reports how long FRR takes to drop the route with BFD 300ms x3, then the same without BFD
// (hold timer, 9s) for comparison.
func TestFRRBFD(t *testing.T) {
	for _, bfd := range []bool{true, false} {
		t.Run(fmt.Sprintf("bfd=%v", bfd), func(t *testing.T) {
			pair, frr, sp := frrLab(t, bfd)
			p4, _ := labPeers(pair)
			p4.Name = "frr4"
			if bfd {
				p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
			}
			if err := sp.SetPeers(p4); err != nil {
				t.Fatalf("SetPeers: %v", err)
			}
			if err := sp.SetAdvertisements(Advertisement{Prefix: vip4}); err != nil {
				t.Fatalf("SetAdvertisements: %v", err)
			}
			if _, err := routers.WaitRoute(frr, vip4, 30*time.Second); err != nil {
				t.Fatalf("route: %v", err)
			}
			if bfd {
				if err := routers.WaitFor(15*time.Second, func() (bool, error) { return frr.BFDUp(pair.SpeakerV4) }); err != nil {
					t.Fatalf("FRR BFD session: %v", err)
				}
				if _, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool {
					return len(st) == 1 && st[0].BFD == BFDUp
				}); err != nil {
					t.Fatalf("speaker BFD state: %v (%+v)", err, sp.Status())
				}
			}
			start := time.Now()
			sp.Freeze()
			if err := routers.WaitNoRoute(frr, vip4, 30*time.Second); err != nil {
				t.Fatalf("route still in FRR after freezing the speaker: %v", err)
			}
			t.Logf("BFD=%v: route left FRR's table %s after the speaker froze", bfd, time.Since(start).Round(10*time.Millisecond))
		})
	}
}

// TestBIRDGracefulRestart stops the speaker the way a restart does (Stop: no withdraw, no
// NOTIFICATION), kills it, starts a new one, and watches BIRD's table every 20ms throughout: with
// graceful restart the VIP never leaves it.
func TestBIRDGracefulRestart(t *testing.T) {
	for _, withBFD := range []bool{false, true} {
		t.Run(fmt.Sprintf("bfd=%v", withBFD), func(t *testing.T) { testBIRDGracefulRestart(t, withBFD) })
	}
}

// testBIRDGracefulRestart is TestBIRDGracefulRestart, with or without BFD (Stop sends AdminDown,
// so BIRD does not take the restart for a failure).
func testBIRDGracefulRestart(t *testing.T, withBFD bool) {
	pair, bird, sp := birdLab(t)
	p4, _ := labPeers(pair)
	p4.GracefulRestart = true
	if withBFD {
		routers.RequireRoot(t, "bird")
		bird.Stop()
		// BIRD takes a BFD AdminDown for a failure (and so the end of a restarting speaker's
		// BFD): "bfd graceful" makes it a graceful restart instead of a session error.
		cfg := birdBFDConfig(pair.RouterV4, "",
			routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN})
		bird = routers.StartBIRD(t, pair.Router, strings.ReplaceAll(cfg, "bfd on;", "bfd graceful;"))
		p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	}
	ad := Advertisement{Prefix: vip4, Communities: []string{"65000:100"}}
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := sp.SetAdvertisements(ad); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	if _, err := routers.WaitRoute(bird, vip4, 30*time.Second); err != nil {
		t.Fatalf("route: %v", err)
	}
	if withBFD {
		if _, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool { return len(st) == 1 && st[0].BFD == BFDUp }); err != nil {
			t.Fatalf("BFD: %v", err)
		}
	}

	// Watch the route from now on.
	stopWatch := watchRoute(bird, vip4)

	start := time.Now()
	if err := sp.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	sp.Kill()
	time.Sleep(2 * time.Second) // vipgate is "restarting"
	sp2 := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	// The documented restart order: routes first, then peers.
	if err := sp2.SetAdvertisements(ad); err != nil {
		t.Fatalf("SetAdvertisements after restart: %v", err)
	}
	if err := sp2.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers after restart: %v", err)
	}
	if err := routers.WaitEstablished(bird, pair.SpeakerV4, 30*time.Second); err != nil {
		out, _ := bird.Birdc("show", "protocols", "all", "spk4")
		t.Fatalf("session after restart: %v\n%s", err, out)
	}
	time.Sleep(2 * time.Second) // let End-of-RIB and any stale-route flush happen
	gaps := stopWatch()
	if len(gaps) > 0 {
		t.Errorf("route left BIRD's table during the restart (gaps %v)", gaps)
	}
	routes, err := bird.Routes()
	if r, ok := routers.Find(routes, vip4); err != nil || !ok || !slices.Contains(r.Communities, "65000:100") {
		t.Errorf("after restart BIRD has %+v (err %v)", routes, err)
	}
	t.Logf("restart with graceful restart: %s from Stop to re-established, gaps %v", time.Since(start).Round(10*time.Millisecond), gaps)
}

// routeTable is a router whose table the tests read (BIRD, FRR).
type routeTable interface {
	Routes() ([]routers.Route, error)
}

// watchRoute polls r's table every 20 ms for prefix until the returned function is called, which
// returns how long each absence lasted.
func watchRoute(r routeTable, prefix netip.Prefix) (stop func() []string) {
	stopWatch := make(chan struct{})
	watchDone := make(chan []string)
	go func() {
		var gaps []string
		var lostAt time.Time
		for {
			select {
			case <-stopWatch:
				if !lostAt.IsZero() {
					gaps = append(gaps, "still missing after "+time.Since(lostAt).Round(time.Millisecond).String())
				}
				watchDone <- gaps
				return
			case <-time.After(20 * time.Millisecond):
			}
			routes, err := r.Routes()
			if err != nil {
				continue
			}
			_, ok := routers.Find(routes, prefix)
			switch {
			case !ok && lostAt.IsZero():
				lostAt = time.Now()
			case ok && !lostAt.IsZero():
				gaps = append(gaps, time.Since(lostAt).Round(time.Millisecond).String())
				lostAt = time.Time{}
			}
		}
	}()
	return func() []string {
		close(stopWatch)
		return <-watchDone
	}
}

// TestFRRGracefulRestartBFD: a restart (Stop, new process) of a speaker with graceful restart and
// BFD. Stop closes the BGP session first (bgpd becomes a graceful restart helper and keeps the
// routes) and sends BFD AdminDown after it: FRR 8.4 reports an AdminDown to bgpd as Down, which
// would reset a session still Established and flush the routes. The new speaker holds BFD until
// BGP is back, and the VIP never leaves FRR's table.
func TestFRRGracefulRestartBFD(t *testing.T) {
	routers.RequireRoot(t, "vtysh", "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "/usr/lib/frr/zebra")
	pair := routers.NewPair(t)
	cfg := routers.FRRConfig{
		BFDD: routers.FRRBFDConfig("fast", 300*time.Millisecond, 300*time.Millisecond, 3),
		BGPD: routers.FRRBGPConfig(pair.RouterV4, routerASN, routers.FRRPeer{Neighbor: pair.SpeakerV4, PeerASN: ebgpASN, BFDProfile: "fast"}),
	}
	frr := routers.StartFRR(t, pair.Router, cfg)
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, _ := labPeers(pair)
	p4.MyASN, p4.GracefulRestart = ebgpASN, true
	p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	ad := Advertisement{Prefix: vip4}
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := sp.SetAdvertisements(ad); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	if _, err := routers.WaitRoute(frr, vip4, 30*time.Second); err != nil {
		t.Fatalf("route: %v", err)
	}
	if err := routers.WaitFor(15*time.Second, func() (bool, error) { return frr.BFDUp(pair.SpeakerV4) }); err != nil {
		t.Fatalf("FRR BFD session: %v", err)
	}
	stop := watchRoute(frr, vip4)
	start := time.Now()
	if err := sp.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	sp.Kill()
	time.Sleep(2 * time.Second)
	sp2 := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	if err := sp2.SetAdvertisements(ad); err != nil {
		t.Fatalf("SetAdvertisements after restart: %v", err)
	}
	if err := sp2.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers after restart: %v", err)
	}
	if err := routers.WaitEstablished(frr, pair.SpeakerV4, 30*time.Second); err != nil {
		t.Fatalf("session after restart: %v", err)
	}
	if err := routers.WaitFor(15*time.Second, func() (bool, error) { return frr.BFDUp(pair.SpeakerV4) }); err != nil {
		t.Fatalf("FRR BFD session after restart: %v", err)
	}
	time.Sleep(2 * time.Second)
	gaps := stop()
	nb, _ := frr.Neighbors()
	t.Logf("restart with graceful restart and BFD: %s from Stop to BFD up again, gaps %v; FRR last reset %q",
		time.Since(start).Round(10*time.Millisecond), gaps, nb[pair.SpeakerV4].LastResetDueTo)
	if len(gaps) > 0 {
		t.Errorf("route left FRR's table during the restart (gaps %v)", gaps)
	}
}
