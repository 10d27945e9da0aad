package routers

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// birdOutput is `birdc show route all` from BIRD 2.0.12, with a second path for one prefix.
const birdOutput = `BIRD 2.0.12 ready.
Table master4:
203.0.113.10/32      unicast [spk4 09:06:44.403] * (100) [i]
	via 192.0.2.2 on vb
	Type: BGP univ
	BGP.origin: IGP
	BGP.as_path: 
	BGP.next_hop: 192.0.2.2
	BGP.local_pref: 150
	BGP.community: (65000,100) (65535,0)
	BGP.large_community: (65000, 1, 2)
                     unicast [spk4b 09:06:45.000] (100) [i]
	via 192.0.2.4 on vb
	Type: BGP univ
	BGP.next_hop: 192.0.2.4
	BGP.local_pref: 50

Table master6:
2001:db8:ff::10/128  unicast [spk6 09:06:41.280] * (100) [AS64513i]
	via 2001:db8:1::2 on vb
	Type: BGP univ
	BGP.origin: IGP
	BGP.as_path: 64513
	BGP.next_hop: 2001:db8:1::2 fe80::1
	BGP.local_pref: 100
`

func TestParseBIRDRoutes(t *testing.T) {
	got, err := parseBIRDRoutes(birdOutput)
	if err != nil {
		t.Fatal(err)
	}
	want := []Route{
		{Prefix: netip.MustParsePrefix("203.0.113.10/32"), NextHop: netip.MustParseAddr("192.0.2.2"), LocalPref: 150,
			Communities: []string{"65000:100", "65535:0"}, LargeCommunities: []string{"65000:1:2"}},
		{Prefix: netip.MustParsePrefix("2001:db8:ff::10/128"), NextHop: netip.MustParseAddr("2001:db8:1::2"), LocalPref: 100,
			ASPath: "64513", Communities: []string{}, LargeCommunities: []string{}},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
}

func TestNormCommunities(t *testing.T) {
	got := normCommunities([]string{"graceful-shutdown", "65000:1", "no-export", "65000:1", ""})
	if diff := cmp.Diff([]string{"65000:1", "65535:0", "65535:65281"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
