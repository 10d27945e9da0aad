// Package speaker decides which LoadBalancer IPs this host announces, and how. It decides from the
// desired state (Services, EndpointSlices, Nodes, MetalLB pools and advertisements) and the live
// membership alone; l2/ and bgp/ do the I/O.
package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ipRange is one entry of an IPAddressPool's addresses: a CIDR or "first-last".
type ipRange struct{ first, last netip.Addr }

func (r ipRange) contains(a netip.Addr) bool {
	return a.BitLen() == r.first.BitLen() && r.first.Compare(a) <= 0 && a.Compare(r.last) <= 0
}

func parseRange(s string) (ipRange, error) {
	s = strings.TrimSpace(s)
	if first, last, ok := strings.Cut(s, "-"); ok {
		f, err1 := netip.ParseAddr(strings.TrimSpace(first))
		l, err2 := netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil || f.BitLen() != l.BitLen() || l.Less(f) {
			return ipRange{}, fmt.Errorf("bad address range %q", s)
		}
		return ipRange{f, l}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return ipRange{}, fmt.Errorf("bad CIDR %q: %w", s, err)
	}
	p = p.Masked()
	last := p.Addr().As16()
	first := p.Addr()
	b := last[:]
	if first.Is4() {
		v := first.As4()
		b = v[:]
	}
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	l, _ := netip.AddrFromSlice(b)
	return ipRange{first, l}, nil
}

// poolFor returns the IPAddressPool whose addresses contain ip (nil if none).
func poolFor(pools []*metallbv1beta1.IPAddressPool, ip netip.Addr) *metallbv1beta1.IPAddressPool {
	for _, p := range pools {
		for _, a := range p.Spec.Addresses {
			r, err := parseRange(a)
			if err == nil && r.contains(ip) {
				return p
			}
		}
	}
	return nil
}

// selects reports whether a label selector list matches set (an empty list matches everything).
func selects(sels []metav1.LabelSelector, set map[string]string) bool {
	if len(sels) == 0 {
		return true
	}
	for i := range sels {
		s, err := metav1.LabelSelectorAsSelector(&sels[i])
		if err == nil && s.Matches(labels.Set(set)) {
			return true
		}
	}
	return false
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

// l2AdsFor lists the L2Advertisements of the pool's namespace that announce IPs of pool.
// MetalLB v0.15's L2Advertisement has no serviceSelectors: Services are chosen per pool (the pool's
// serviceAllocation, which the allocator honours), so nothing is matched against the Service here.
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
