// Package speaker decides which LoadBalancer IPs this host announces, and how. It decides from the
// desired state (Services, EndpointSlices, Nodes, MetalLB pools and advertisements) and the live
// membership alone; l2/ and bgp/ do the I/O, and membership/ runs the protocol whose views it reads
// (through Membership, an interface of its own).
package speaker

import (
	"fmt"
	"net/netip"
	"slices"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// poolFor returns the IPAddressPool whose addresses contain ip (nil if none), read as the
// controller's allocator reads the pools (cluster.PoolIndex): every IP it hands out is found in the
// pool it was handed out from (select_test.go). A decision over many IPs builds the index once
// (cluster.NewPoolIndex) and asks it instead.
func poolFor(pools []*metallbv1beta1.IPAddressPool, ip netip.Addr) *metallbv1beta1.IPAddressPool {
	return cluster.NewPoolIndex(pools).PoolOf(ip)
}

// selects reports whether a label selector list matches set (an empty list matches everything; see
// cluster.MatchesAny).
func selects(sels []metav1.LabelSelector, set map[string]string) bool {
	return cluster.MatchesAny(sels, set)
}

// adSelectsPool reports whether an advertisement (L2 or BGP) with these ipAddressPools and
// ipAddressPoolSelectors covers pool: it names the pool, selects it by label, or names and selects
// nothing (then it covers every pool).
func adSelectsPool(names []string, sels []metav1.LabelSelector, pool *metallbv1beta1.IPAddressPool) bool {
	if len(names) == 0 && len(sels) == 0 {
		return true
	}
	if slices.Contains(names, pool.Name) {
		return true
	}
	return len(sels) > 0 && selects(sels, pool.Labels)
}

// l2AdsFor lists the L2Advertisements of the pool's namespace that announce IPs of pool, whatever
// their serviceSelectors: the pool-level set, which the L2 segments are computed from (a node that
// some advertisement of the pool may use is a member of the pool's segment; serviceSelectors only
// narrow which Services an advertisement covers, never who votes). l2AdsForServices narrows it to
// the advertisements of one IP's Services.
func l2AdsFor(ads []*metallbv1beta1.L2Advertisement, pool *metallbv1beta1.IPAddressPool) []*metallbv1beta1.L2Advertisement {
	var out []*metallbv1beta1.L2Advertisement
	for _, ad := range ads {
		if ad.Namespace == pool.Namespace && adSelectsPool(ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, pool) {
			out = append(out, ad)
		}
	}
	return out
}

// bgpAdvertised reports whether some BGPAdvertisement of the pool's namespace covers pool.
func bgpAdvertised(ads []*metallbv1beta1.BGPAdvertisement, pool *metallbv1beta1.IPAddressPool) bool {
	for _, ad := range ads {
		if ad.Namespace == pool.Namespace && adSelectsPool(ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, pool) {
			return true
		}
	}
	return false
}

// serviceSelected reports whether an advertisement's serviceSelectors (MetalLB v0.16, L2 and BGP)
// select a Service with these labels. An empty list selects every Service (MetalLB v0.15 objects
// keep their meaning); several selectors are ORed, as in MetalLB. A selector that does not parse
// selects nothing (the advertisement is reported, see adServiceSelectorProblem).
func serviceSelected(sels []metav1.LabelSelector, svcLabels map[string]string) bool {
	return selects(sels, svcLabels)
}

// l2AdsForServices narrows a pool's L2Advertisements (l2AdsFor) to those whose serviceSelectors
// select at least one of the Services using the IP (an IP shared by several Services, allow-shared-ip,
// is announced by the union of their advertisements, as MetalLB unions advertisements per IP).
// narrowed says whether some advertisement was left out, i.e. whether candidates and interfaces
// computed from poolAds must be recomputed from the result.
func l2AdsForServices(poolAds []*metallbv1beta1.L2Advertisement, svcLabels []map[string]string) (ads []*metallbv1beta1.L2Advertisement, narrowed bool) {
	for _, ad := range poolAds {
		if slices.ContainsFunc(svcLabels, func(l map[string]string) bool { return serviceSelected(ad.Spec.ServiceSelectors, l) }) {
			ads = append(ads, ad)
		}
	}
	return ads, len(ads) != len(poolAds)
}

// adServiceSelectorProblem returns why an advertisement's serviceSelectors cannot be used as
// written ("" when they can): a selector that does not parse (it then selects nothing).
func adServiceSelectorProblem(sels []metav1.LabelSelector) string {
	for i := range sels {
		if _, err := metav1.LabelSelectorAsSelector(&sels[i]); err != nil {
			return fmt.Sprintf("serviceSelectors[%d]: %v; it selects no Service", i, err)
		}
	}
	return ""
}

// l2CandidatesFor narrows a pool's candidates (computed from all of the pool's advertisements) to
// the nodes that one of ads — the pool's advertisements narrowed by l2AdsForServices — selects, so
// that an advertisement that does not cover the Service never makes a node its owner. cands is not
// modified.
func l2CandidatesFor(sels selectorCache, st *cluster.State, cands map[string]bool, ads []*metallbv1beta1.L2Advertisement) map[string]bool {
	out := make(map[string]bool, len(cands))
	for n, ok := range cands {
		if ok && sels.eligible(ads, nodeLabels(st, n)) {
			out[n] = true
		}
	}
	return out
}
