package speaker

import (
	"slices"
	"strings"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pref is a preferredNodeSelectors entry matching label k=v (k "" matches every node).
func pref(weight int32, k, v string) metallbv1beta1.PreferredNodeSelector {
	p := metallbv1beta1.PreferredNodeSelector{Weight: weight}
	if k != "" {
		p.Preference = metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	return p
}

// TestDecideL2PreferredNodes: L2Advertisement preferredNodeSelectors as MetalLB v0.16.2's speaker
// applies them (sortL2Candidates with preferredScoresFor and config.preferredNodeScores): the
// highest summed weight among the live eligible candidates wins, the sha256(node#IP) hash breaks
// ties and orders the rest; a preference counts only on nodes its own advertisement's
// nodeSelectors make eligible; with no preferred node alive, the hash alone — the same owner as
// without preferences. Every node computes the same owner (decide checks it).
func TestDecideL2PreferredNodes(t *testing.T) {
	const ip = "192.0.2.200"
	nodes := []string{"n1", "n2", "n3"}
	hash := hashOwner(ip, slices.Clone(nodes)...)
	// The preferred node is one the hash would not choose, so the preference shows.
	preferred := "n1"
	if hash == "n1" {
		preferred = "n2"
	}
	others := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == preferred })
	world := func(ads ...metallbv1beta1.L2AdvertisementSpec) *l2World {
		w := newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220")
		w.st.Nodes[preferred].Labels["zone"] = "pref"
		for i, a := range ads {
			a.IPAddressPools = []string{"lan"}
			w.ad("lan"+strings.Repeat("x", i), a)
		}
		return w
	}
	prefAd := metallbv1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{pref(10, "zone", "pref")}}
	rackB := []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "b"}}}
	rackA := []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "a"}}}
	for _, tc := range []struct {
		name  string
		world *l2World
		live  map[string]bool
		owner string
		note  string // part of VIPDecision.Preference
	}{{
		name:  "the preferred node wins over the hash",
		world: world(prefAd).svc("web", false, []string{ip}, "n1"),
		live:  all3, owner: preferred, note: "owner among the 1 of 3 candidates with the top weight 10",
	}, {
		name:  "the preferred node dead: the hash among the others, as without preferences",
		world: world(prefAd).svc("web", false, []string{ip}, "n1"),
		live:  without(all3, preferred), owner: hashOwner(ip, slices.Clone(others)...),
		note: "no preferred node is a live eligible candidate; owner by hash among 2",
	}, {
		name: "weights of matching preferences add up (10+20 on n3 beat 25 on the preferred node)",
		world: world(metallbv1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{
			pref(25, "zone", "pref"), pref(10, "rack", "b"), pref(20, "rack", "b")}}).svc("web", false, []string{ip}, "n1"),
		live: all3, owner: "n3", note: "top weight 30",
	}, {
		name:  "an empty preference matches every node: all tie, the hash decides",
		world: world(metallbv1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{pref(5, "", "")}}).svc("web", false, []string{ip}, "n1"),
		live:  all3, owner: hash, note: "3 of 3 candidates with the top weight 5",
	}, {
		name: "weights of two advertisements add up, each on the nodes its nodeSelectors allow",
		world: world(
			metallbv1beta1.L2AdvertisementSpec{NodeSelectors: rackB, PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{pref(30, "", "")}},
			metallbv1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{pref(20, "zone", "pref"), pref(15, "rack", "b")}},
		).svc("web", false, []string{ip}, "n1"),
		live: all3, owner: "n3", note: "top weight 45",
	}, {
		name: "a preference counts only where its advertisement's nodeSelectors allow the node",
		world: world(
			metallbv1beta1.L2AdvertisementSpec{NodeSelectors: rackA, PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{pref(50, "rack", "b")}},
			metallbv1beta1.L2AdvertisementSpec{NodeSelectors: rackB},
		).svc("web", false, []string{ip}, "n1"),
		live: all3, owner: hash, note: "no preferred node",
	}, {
		name:  "externalTrafficPolicy Local: a preferred node without a local endpoint is no candidate",
		world: world(prefAd).svc("web", true, []string{ip}, others...),
		live:  all3, owner: hashOwner(ip, slices.Clone(others)...), note: "no preferred node",
	}, {
		name:  "externalTrafficPolicy Local: the preferred node with an endpoint wins",
		world: world(prefAd).svc("web", true, []string{ip}, "n1", "n2", "n3"),
		live:  all3, owner: preferred, note: "top weight 10",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := decide(t, tc.world.st, tc.live)
			if o := ownerOf(got["web "+ip]); o != tc.owner {
				t.Errorf("owner %q, want %q (hash owner %s, preferred %s)", o, tc.owner, hash, preferred)
			}
			_, ds := DecideL2(L2Input{Self: tc.owner, Live: tc.live, Links: lan, State: tc.world.st})
			if len(ds) != 1 || !strings.Contains(ds[0].Preference, tc.note) || ds[0].Problem {
				t.Errorf("decision %+v, want Preference with %q", ds, tc.note)
			}
		})
	}
	// No preferredNodeSelectors at all: no note, and the owner cache is used as before.
	_, ds := DecideL2(L2Input{Self: hash, Live: all3, Links: lan, State: world(metallbv1beta1.L2AdvertisementSpec{}).svc("web", false, []string{ip}, "n1").st})
	if len(ds) != 1 || ds[0].Owner != hash || ds[0].Preference != "" {
		t.Errorf("without preferences: %+v, want owner %s and no Preference", ds, hash)
	}
}
