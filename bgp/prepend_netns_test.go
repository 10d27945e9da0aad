package bgp

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/routers"
)

// TestBIRDASPathPrepend: Advertisement.ASPathPrepend (MetalLB v0.16.2's BGPAdvertisement
// asPathPrepend) as a real BIRD peer sees it in `birdc show route all`: over the eBGP session the
// AS path carries the speaker's AS 1+N times (as frr-k8s, whose `set as-path prepend` comes on top
// of the AS that eBGP adds), only on the prefixes that ask for it; changing N for a route that
// stays announced reaches the peer (soft reset out); back to 0, the plain one-AS path. Over the
// iBGP session the path stays empty (prepend.go says why).
func TestBIRDASPathPrepend(t *testing.T) {
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
	plain6 := netip.MustParsePrefix("2001:db8:ff::11/128")
	asPath := func(n int) string { return strings.TrimSpace(strings.Repeat("64513 ", n)) }
	waitPath := func(pfx netip.Prefix, want string) {
		t.Helper()
		var got routers.Route
		err := routers.WaitFor(10*time.Second, func() (bool, error) {
			routes, err := bird.Routes()
			if err != nil {
				return false, err
			}
			var ok bool
			got, ok = routers.Find(routes, pfx)
			return ok && got.ASPath == want, nil
		})
		if err != nil {
			out, _ := bird.Birdc("show", "route", "all")
			t.Fatalf("route %s in BIRD: AS path %q, want %q (%v)\n%s", pfx, got.ASPath, want, err, out)
		}
	}

	if err := sp.SetAdvertisements(
		Advertisement{Prefix: vip6, ASPathPrepend: 3},
		Advertisement{Prefix: plain6},
		Advertisement{Prefix: vip4, ASPathPrepend: 3},
	); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	waitPath(vip6, asPath(4))
	waitPath(plain6, asPath(1))
	waitPath(vip4, "") // iBGP
	out, _ := bird.Birdc("show", "route", "for", vip6.String(), "all")
	t.Logf("birdc show route for %s all:\n%s", vip6, out)

	// N changes for a route that stays: the peer gets the new path.
	if err := sp.SetAdvertisements(Advertisement{Prefix: vip6, ASPathPrepend: 1}, Advertisement{Prefix: plain6}, Advertisement{Prefix: vip4, ASPathPrepend: 3}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	waitPath(vip6, asPath(2))
	waitPath(plain6, asPath(1))
	// No prepend any more: the policy goes, the path is the plain one.
	if err := sp.SetAdvertisements(Advertisement{Prefix: vip6}, Advertisement{Prefix: plain6}, Advertisement{Prefix: vip4}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	waitPath(vip6, asPath(1))

	// Out of range: that advertisement alone is refused, the others stay.
	err := sp.SetAdvertisements(Advertisement{Prefix: vip6, ASPathPrepend: MaxASPathPrepend + 1}, Advertisement{Prefix: plain6}, Advertisement{Prefix: vip4})
	if err == nil || !strings.Contains(err.Error(), "AS path prepend 11: at most 10") {
		t.Errorf("SetAdvertisements with prepend 11: %v, want the advertisement refused", err)
	}
	if err := routers.WaitNoRoute(bird, vip6, 10*time.Second); err != nil {
		t.Errorf("refused %s still in BIRD: %v", vip6, err)
	}
	waitPath(plain6, asPath(1))
}
