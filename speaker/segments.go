package speaker

import (
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipgate/vipgate/cluster"
)

// L2 segments: the membership of an L2 VIP is not the whole cluster but the speakers that could
// announce it — those an L2Advertisement covering the VIP's pool can select. VIPs are grouped by
// that node set (a "segment"); majority, takeover and the heard-set rule apply per segment, so a
// rack of three nodes keeps its majority whatever the other 4,997 nodes do, and a node never needs
// to hear nodes that could never take its VIPs over. README.md explains the design and its limits.

// WitnessLabel marks a speaker that votes in the majority of the segments whose L2Advertisements
// select it but never announces (a witness: the third member that lets a two-node segment survive
// the death of either node). Its value is not read.
const WitnessLabel = "vipgate.io/l2-witness"

// L2Segment is one L2 membership: the speakers that some L2Advertisement covering its pools can
// select (nodeSelectors; not labelled ExcludeFromLBLabel), witnesses included.
type L2Segment struct {
	// Key identifies the segment in Membership.SegmentViews: its Members (SegmentKey). The
	// membership puts its own digest of them on the wire; cmd/vipgate's adapter keys the views it
	// gives by this.
	Key string
	// Members are the segment's speakers, sorted.
	Members []string
	// Pools are the IPAddressPools ("namespace/name", sorted) whose VIPs the segment decides.
	Pools []string
}

// L2Segments groups the IPAddressPools that have an L2Advertisement by the speakers that can
// announce them. speakers are the nodes running a speaker (members with an address); a speaker
// without a Node object has only its hostname label. A pool whose advertisements select no speaker
// has no segment (its VIPs have no candidate). The result is sorted by Members and is the same on every
// node that sees the same State and speakers.
//
// Cost: O(pools × speakers × advertisements) label matches, the selectors parsed once per
// advertisement; run once per State, not per decision.
func L2Segments(st *cluster.State, speakers []string) []L2Segment {
	if st == nil || st.MetalLB == nil {
		return nil
	}
	sp := slices.Clone(speakers)
	slices.Sort(sp)
	sp = slices.Compact(sp)
	sels := newSelectorCache()
	byKey := map[string]*L2Segment{}
	for _, pool := range st.MetalLB.IPAddressPools {
		ads := l2AdsFor(st.MetalLB.L2Advertisements, pool)
		if len(ads) == 0 {
			continue
		}
		var members []string
		for _, n := range sp {
			if sels.eligible(ads, nodeLabels(st, n)) {
				members = append(members, n)
			}
		}
		if len(members) == 0 {
			continue
		}
		key := SegmentKey(members)
		g := byKey[key]
		if g == nil {
			g = &L2Segment{Key: key, Members: members}
			byKey[key] = g
		}
		g.Pools = append(g.Pools, pool.Namespace+"/"+pool.Name)
	}
	out := make([]L2Segment, 0, len(byKey))
	for _, g := range byKey {
		slices.Sort(g.Pools)
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b L2Segment) int { return slices.Compare(a.Members, b.Members) })
	return out
}

// SegmentKey is a segment's key (L2Segment.Key): its sorted members joined by newlines. A member
// name is a Node name, which holds no newline.
func SegmentKey(sorted []string) string { return strings.Join(sorted, "\n") }

// SegmentsOf lists the member lists of the segments that hold self (what Membership.SetSegments
// takes).
func SegmentsOf(segs []L2Segment, self string) [][]string {
	var out [][]string
	for _, g := range segs {
		if _, ok := slices.BinarySearch(g.Members, self); ok {
			out = append(out, g.Members)
		}
	}
	return out
}

// selectorCache parses each advertisement's nodeSelectors once.
type selectorCache map[*metallbv1beta1.L2Advertisement][]labels.Selector

func newSelectorCache() selectorCache { return selectorCache{} }

func (c selectorCache) of(ad *metallbv1beta1.L2Advertisement) []labels.Selector {
	if s, ok := c[ad]; ok {
		return s
	}
	var s []labels.Selector
	for i := range ad.Spec.NodeSelectors {
		// A selector that does not parse selects nothing (as in selects).
		if sel, err := metav1.LabelSelectorAsSelector(&ad.Spec.NodeSelectors[i]); err == nil {
			s = append(s, sel)
		} else {
			s = append(s, labels.Nothing())
		}
	}
	c[ad] = s
	return s
}

// eligible says whether a node with these labels may announce for ads: not labelled ExcludeFromLBLabel,
// and selected by some advertisement (one without nodeSelectors selects every node).
func (c selectorCache) eligible(ads []*metallbv1beta1.L2Advertisement, set map[string]string) bool {
	if _, excluded := set[ExcludeFromLBLabel]; excluded {
		return false
	}
	for _, ad := range ads {
		sels := c.of(ad)
		if len(sels) == 0 {
			return true
		}
		for _, s := range sels {
			if s.Matches(labels.Set(set)) {
				return true
			}
		}
	}
	return false
}
