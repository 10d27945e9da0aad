package speaker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// segWorld: rack a = n1, n2, n3 and the witness w1; rack b = n4; n5 in rack a but excluded from
// load balancers; n6 is a Node without a speaker (not passed as one).
func segWorld() *l2World {
	w := newL2World()
	w.st.Nodes = map[string]*cluster.Node{}
	for n, l := range map[string]map[string]string{
		"n1": {"rack": "a"}, "n2": {"rack": "a"}, "n3": {"rack": "a"}, "n4": {"rack": "b"},
		"n5": {"rack": "a", ExcludeFromLBLabel: ""}, "n6": {"rack": "a"}, "w1": {"rack": "a", WitnessLabel: "true"},
	} {
		w.st.Nodes[n] = &cluster.Node{Name: n, Labels: l}
	}
	rack := func(r string) []metav1.LabelSelector {
		return []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": r}}}
	}
	return w.pool("a", nil, "192.0.2.0/26").pool("a2", nil, "192.0.2.64/26").pool("b", nil, "198.51.100.0/24").
		pool("ab", nil, "203.0.113.0/25").pool("nobody", nil, "203.0.113.128/25").pool("bgp-only", nil, "2001:db8::/64").
		ad("rack-a", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"a", "a2"}, NodeSelectors: rack("a")}).
		ad("rack-b", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"b"}, NodeSelectors: rack("b")}).
		ad("everywhere", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"ab"}}).
		ad("rack-z", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"nobody"}, NodeSelectors: rack("z")})
}

var segSpeakers = []string{"n1", "n2", "n3", "n4", "n5", "w1"}

func TestL2Segments(t *testing.T) {
	got := L2Segments(segWorld().st, segSpeakers)
	type seg struct{ Members, Pools string }
	var gotS []seg
	for _, g := range got {
		if g.Key != SegmentKey(g.Members) {
			t.Errorf("segment %v: key %q is not its members'", g.Members, g.Key)
		}
		gotS = append(gotS, seg{strings.Join(g.Members, ","), strings.Join(g.Pools, ",")})
	}
	slices.SortFunc(gotS, func(a, b seg) int { return strings.Compare(a.Members, b.Members) })
	want := []seg{
		// n5 is excluded, n6 runs no speaker, the witness votes; the two rack-a pools share one.
		{"n1,n2,n3,n4,w1", mlbNS + "/ab"},
		{"n1,n2,n3,w1", mlbNS + "/a," + mlbNS + "/a2"},
		{"n4", mlbNS + "/b"},
	}
	if d := cmp.Diff(want, gotS); d != "" {
		t.Errorf("segments (-want +got):\n%s", d)
	}
	if d := cmp.Diff([][]string{{"n4"}}, SegmentsOf(got, "n4")[1:]); d != "" && len(SegmentsOf(got, "n4")) != 2 {
		t.Errorf("n4's segments: %v", SegmentsOf(got, "n4"))
	}
	if s := SegmentsOf(got, "n6"); s != nil {
		t.Errorf("a node without a speaker is in segments %v", s)
	}
	// The same on every node, whatever order the speakers come in.
	rev := slices.Clone(segSpeakers)
	slices.Reverse(rev)
	if d := cmp.Diff(got, L2Segments(segWorld().st, rev)); d != "" {
		t.Errorf("order of speakers changes the segments:\n%s", d)
	}
}

// TestDecideL2Segments: an IP's candidates are its segment's; an IP of a segment this node is not
// in has no owner here; a witness never owns.
func TestDecideL2Segments(t *testing.T) {
	w := segWorld().svc("in-a", false, []string{"192.0.2.10"}, "n1", "n2").svc("in-b", false, []string{"198.51.100.10"}, "n4").
		svc("in-ab", false, []string{"203.0.113.10"}, "n1").svc("local-a", true, []string{"192.0.2.70"}, "n3", "n6")
	segs := L2Segments(w.st, segSpeakers)
	keyOf := func(members string) string { return SegmentKey(strings.Split(members, ",")) }
	views := map[string]View{
		// n3 is silent in rack a; in the big segment everyone but the witness is a candidate (it is
		// ready and heard, but never announces).
		keyOf("n1,n2,n3,w1"):       {Candidates: map[string]bool{"n1": true, "n2": true, "w1": true}},
		keyOf("n1,n2,n3,n4,w1"):    {Candidates: map[string]bool{"n1": true, "n2": true, "n3": true, "n4": true, "w1": true}},
		keyOf("not,a,segment,any"): {Candidates: map[string]bool{"n9": true}},
	}
	_, decisions := DecideL2(L2Input{Self: "n1", State: w.st, Segments: segs, SegmentViews: views,
		Links:  []Link{{Name: "eth0", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.11/24"), netip.MustParsePrefix("203.0.113.11/24")}}},
		Owners: NewOwnerCache()})
	got := map[string]string{}
	for _, d := range decisions {
		got[d.Service.Name] = d.Owner + " | " + d.Reason
	}
	want := map[string]string{
		"in-a":    hashOwner("192.0.2.10", "n1", "n2") + " | ",
		"in-b":    " | this node is not in the IP's L2 segment (1 speakers); they decide its owner",
		"in-ab":   hashOwner("203.0.113.10", "n1", "n2", "n3", "n4") + " | ",
		"local-a": " | no live eligible node with a local endpoint (externalTrafficPolicy Local)",
	}
	for k, v := range want {
		if strings.HasPrefix(v, "n1 |") {
			// Self owns: it also gets interfaces; only compare the owner and reason.
			want[k] = "n1 | "
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("decisions (-want +got):\n%s", d)
	}
}

// TestOwnerCacheProperty: on random sequences of candidates joining and leaving (one, a few, most
// of them at once) and VIPs coming and going, the cached owner of every VIP is the full
// computation's.
func TestOwnerCacheProperty(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var universe []string
		for i := range 60 {
			universe = append(universe, fmt.Sprintf("node-%02d", i))
		}
		vips := map[netip.Addr]bool{}
		for i := range 300 {
			vips[netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)})] = true
		}
		c := NewOwnerCache()
		cands := map[string]bool{}
		for step := range 150 {
			next := map[string]bool{}
			for n := range cands {
				next[n] = true
			}
			switch r := rng.IntN(10); {
			case r < 4: // one joins
				next[universe[rng.IntN(len(universe))]] = true
			case r < 8: // one leaves
				for n := range next {
					delete(next, n)
					break
				}
			case r < 9: // many change at once
				for _, n := range universe {
					if rng.IntN(3) == 0 {
						next[n] = !next[n]
						if !next[n] {
							delete(next, n)
						}
					}
				}
			default: // VIPs come and go
				for i := range 20 {
					vips[netip.AddrFrom4([4]byte{10, 1, byte(step), byte(i)})] = rng.IntN(2) == 0
				}
			}
			cands = next
			c.begin()
			s := c.set("pool", cloneSet(cands))
			for ip, on := range vips {
				if !on {
					continue
				}
				if got, want := s.owner(ip, c.gen), rendezvousOwner(cands, ip); got != want {
					t.Fatalf("seed %d step %d: owner of %s = %q, want %q (%d candidates)", seed, step, ip, got, want, len(cands))
				}
			}
			c.end()
		}
	}
}

func cloneSet(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// BenchmarkDecideL2MembershipChange: 1,000 VIPs over N candidates; each iteration one candidate
// leaves or comes back (a membership change) and DecideL2 runs again, without (full) and with the
// OwnerCache (cached).
func BenchmarkDecideL2MembershipChange(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		w := newL2World().pool("lan", nil, "10.0.0.0/16").ad("lan", metallbv1beta1.L2AdvertisementSpec{})
		w.st.Nodes = map[string]*cluster.Node{}
		live := map[string]bool{}
		for i := range n {
			name := fmt.Sprintf("node-%04d", i)
			w.st.Nodes[name] = &cluster.Node{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}
			live[name] = true
		}
		for i := range 1000 {
			w.svc(fmt.Sprintf("s%04d", i), false, []string{netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)}).String()}, "node-0000")
		}
		without := cloneSet(live)
		delete(without, "node-0001")
		for _, mode := range []string{"full", "cached"} {
			b.Run(fmt.Sprintf("candidates=%d/vips=1000/%s", n, mode), func(b *testing.B) {
				var owners *OwnerCache
				if mode == "cached" {
					owners = NewOwnerCache()
				}
				DecideL2(L2Input{Self: "node-0000", Live: live, State: w.st, Owners: owners})
				for i := 0; b.Loop(); i++ {
					l := live
					if i%2 == 0 {
						l = without
					}
					DecideL2(L2Input{Self: "node-0000", Live: l, State: w.st, Owners: owners})
				}
			})
		}
	}
}
