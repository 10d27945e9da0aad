package bgp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vipgate/vipgate/test/routers"
)

// TestAPIPeerLocalASN: MetalLB v0.16's per-peer localASN replaces MyASN as the neighbor's local AS
// in GoBGP (the AS of our OPEN and of our routes' AS_PATH); without it MyASN is used, as before.
func TestAPIPeerLocalASN(t *testing.T) {
	base := PeerConfig{Name: "tor", MyASN: 64512, PeerASN: 65000, PeerAddress: netip.MustParseAddr("192.0.2.1")}
	withLocal := base
	withLocal.LocalASN = 65010
	for _, c := range []struct {
		name string
		p    PeerConfig
		want uint32
	}{
		{"no localASN", base, 64512},
		{"localASN", withLocal, 65010},
	} {
		if got := apiPeer(c.p, false).Conf.LocalAsn; got != c.want {
			t.Errorf("%s: GoBGP neighbor local AS %d, want %d", c.name, got, c.want)
		}
	}
	if sameBGPPeer(base, withLocal) {
		t.Error("a localASN change must re-create the GoBGP neighbor (it changes the OPEN)")
	}
}

// TestBIRDLocalASN: a peer with localASN 65010 (MetalLB v0.16) next to MyASN 64512 — BIRD, which
// expects AS 65010 from the speaker, establishes the session, and the route's AS path is 65010
// alone (FRR's "local-as 65010 no-prepend replace-as", which MetalLB configures). Without
// localASN BIRD refuses the session (bad peer AS), so the session proves the OPEN's AS.
func TestBIRDLocalASN(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	pair := routers.NewPair(t)
	const localASN = 65010
	bird := routers.StartBIRD(t, pair.Router, routers.BIRDConfig(pair.RouterV4,
		routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: localASN}))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p := PeerConfig{Name: "bird4", MyASN: ibgpASN, LocalASN: localASN, PeerASN: routerASN, PeerAddress: pair.RouterV4,
		HoldTime: 9 * time.Second, ConnectTime: time.Second}
	if err := sp.SetPeers(p); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := routers.WaitEstablished(bird, pair.SpeakerV4, 30*time.Second); err != nil {
		t.Fatalf("session with localASN %d: %v", localASN, err)
	}
	if err := sp.SetAdvertisements(Advertisement{Prefix: vip4}); err != nil {
		t.Fatalf("SetAdvertisements: %v", err)
	}
	got, err := routers.WaitRoute(bird, vip4, 10*time.Second)
	if err != nil {
		t.Fatalf("route %s: %v", vip4, err)
	}
	// eBGP from BIRD's point of view (65010 is not its 64512): no LOCAL_PREF sent, BIRD's default.
	want := routers.Route{Prefix: vip4, NextHop: pair.SpeakerV4, LocalPref: 100, ASPath: "65010"}
	if diff := cmp.Diff(want, got, cmpNet, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("route %s in BIRD (-want +got):\n%s", vip4, diff)
	}
}
