package speaker

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

func TestAdvertisedPeers(t *testing.T) {
	web := cluster.ServiceKey{Namespace: "demo", Name: "web"}
	db := cluster.ServiceKey{Namespace: "demo", Name: "db"}
	v6 := cluster.ServiceKey{Namespace: "demo", Name: "v6"}
	other := cluster.ServiceKey{Namespace: "demo", Name: "other"}
	peers := []bgp.PeerConfig{
		{Name: "metallb-system/tor1", PeerAddress: netip.MustParseAddr("198.51.100.1")},
		{Name: "metallb-system/tor2", PeerAddress: netip.MustParseAddr("198.51.100.2")},
		{Name: "metallb-system/tor6", PeerAddress: netip.MustParseAddr("2001:db8::1")},
	}
	ads := []bgp.Advertisement{
		{Prefix: netip.MustParsePrefix("203.0.113.10/32")},
		{Prefix: netip.MustParsePrefix("203.0.113.20/32"), Peers: []string{"metallb-system/tor2"}},
		{Prefix: netip.MustParsePrefix("2001:db8:1::10/128")},
	}
	decisions := []VIPDecision{
		{IP: netip.MustParseAddr("203.0.113.10"), Service: web, Owner: "n1"},
		{IP: netip.MustParseAddr("203.0.113.20"), Service: db, Owner: "n1"},
		{IP: netip.MustParseAddr("2001:db8:1::10"), Service: v6, Owner: "n1"},
		// Not advertised by this node (eTP=Local without a local endpoint): no status.
		{IP: netip.MustParseAddr("203.0.113.30"), Service: other, Reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
	}
	want := map[cluster.ServiceKey][]string{web: {"tor1", "tor2"}, db: {"tor2"}, v6: {"tor6"}}
	if d := cmp.Diff(want, AdvertisedPeers("n1", peers, ads, decisions)); d != "" {
		t.Errorf("AdvertisedPeers (-want +got):\n%s", d)
	}
}
