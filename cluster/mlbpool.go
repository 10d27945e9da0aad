package cluster

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The one reading of MetalLB's IPAddressPools and label selectors, shared by the allocator
// (lbipam.go, the controller) and the speaker (speaker/select.go). Both must read a pool the same
// way: an IP the controller hands out that the speaker finds in no pool, or in another pool, is
// announced by the wrong advertisements or not at all (speaker/select_test.go checks the pair).

// AddressRange is one entry of an IPAddressPool's spec.addresses: a CIDR or "first-last", as the
// inclusive range of addresses it holds.
type AddressRange struct{ first, last netip.Addr }

// First returns the range's first address.
func (r AddressRange) First() netip.Addr { return r.first }

// Last returns the range's last address.
func (r AddressRange) Last() netip.Addr { return r.last }

// Contains reports whether a is in the range (an IPv4 address is never in an IPv6 range).
func (r AddressRange) Contains(a netip.Addr) bool {
	return a.BitLen() == r.first.BitLen() && r.first.Compare(a) <= 0 && a.Compare(r.last) <= 0
}

// overlaps reports whether r and o share an address.
func (r AddressRange) overlaps(o AddressRange) bool {
	return r.first.BitLen() == o.first.BitLen() && r.first.Compare(o.last) <= 0 && o.first.Compare(r.last) <= 0
}

// mappedV4 holds the IPv4-mapped IPv6 addresses (::ffff:a.b.c.d).
var mappedV4 = AddressRange{netip.MustParseAddr("::ffff:0.0.0.0"), netip.MustParseAddr("::ffff:255.255.255.255")}

// ParseAddressRange parses one entry of an IPAddressPool's spec.addresses with MetalLB's rules: a
// CIDR (host bits are ignored, "192.0.2.7/24" is 192.0.2.0/24) or a range "first-last" of one
// family, first ≤ last; spaces around either are ignored.
//
// Two forms MetalLB's net.ParseIP-based parser refuses are refused here too, with a reason: IPv6
// zones ("fe80::1%eth0") and IPv4-mapped IPv6 addresses (::ffff:0:0/96). A Service's status cannot
// carry a zone, and a mapped address in its status reads back as the IPv4 address it maps
// (ServiceFromAPI), which an IPv6 range never contains: such an IP would be allocated and never
// announced.
func ParseAddressRange(s string) (AddressRange, error) {
	s = strings.TrimSpace(s)
	var r AddressRange
	if a, b, ok := strings.Cut(s, "-"); ok {
		f, err1 := netip.ParseAddr(strings.TrimSpace(a))
		l, err2 := netip.ParseAddr(strings.TrimSpace(b))
		switch {
		case err1 != nil || err2 != nil:
			return AddressRange{}, fmt.Errorf("%q is not a valid address range", s)
		case f.Zone() != "" || l.Zone() != "":
			return AddressRange{}, fmt.Errorf("range %q: IPv6 zones are not allowed", s)
		case f.BitLen() != l.BitLen():
			return AddressRange{}, fmt.Errorf("range %q mixes IPv4 and IPv6", s)
		case l.Less(f):
			return AddressRange{}, fmt.Errorf("range %q starts after it ends", s)
		}
		r = AddressRange{f, l}
	} else {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return AddressRange{}, fmt.Errorf("%q is neither a CIDR nor a range: %v", s, err)
		}
		p = p.Masked()
		b := p.Addr().AsSlice()
		for i := p.Bits(); i < len(b)*8; i++ {
			b[i/8] |= 1 << (7 - uint(i%8))
		}
		last, _ := netip.AddrFromSlice(b)
		r = AddressRange{p.Addr(), last}
	}
	if r.overlaps(mappedV4) {
		return AddressRange{}, fmt.Errorf("%q holds IPv4-mapped IPv6 addresses (::ffff:0:0/96): write IPv4 addresses as IPv4", s)
	}
	return r, nil
}

// avoidedIP reports whether avoidBuggyIPs keeps the allocator from handing out a: an IPv4 address
// ending in .0 or .255 (old clients take it for a network or broadcast address). A requested IP
// (annotation, spec.loadBalancerIP) is handed out all the same, as in MetalLB.
func avoidedIP(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	last := a.As4()[3]
	return last == 0 || last == 255
}

// parsedPool is one IPAddressPool as parsePools read it.
type parsedPool struct {
	obj *metallbv1beta1.IPAddressPool
	// ranges are the entries of spec.addresses that parse, in order (all of them when the pool is
	// accepted).
	ranges []AddressRange
	// errs say why the pool is rejected (none: accepted).
	errs []string
}

// parsePools reads IPAddressPools in order. A pool is rejected, alone, when spec.addresses is empty,
// an entry does not parse (ParseAddressRange), or an entry overlaps another entry of the pool or of
// an earlier accepted pool; so accepted pools never overlap, and a rejected pool does not make a
// later one rejected.
func parsePools(objs []*metallbv1beta1.IPAddressPool) []parsedPool {
	out := make([]parsedPool, len(objs))
	var accepted []*parsedPool
	for i, o := range objs {
		p := &out[i]
		p.obj = o
		if len(o.Spec.Addresses) == 0 {
			p.errs = append(p.errs, "spec.addresses is empty")
		}
		for j, s := range o.Spec.Addresses {
			r, err := ParseAddressRange(s)
			if err != nil {
				p.errs = append(p.errs, fmt.Sprintf("spec.addresses[%d]: %v", j, err))
				continue
			}
			for _, q := range append(slices.Clip(accepted), p) {
				for _, qr := range q.ranges {
					if qr.overlaps(r) {
						p.errs = append(p.errs, fmt.Sprintf("spec.addresses[%d] %s overlaps pool %s/%s", j, s, q.obj.Namespace, q.obj.Name))
					}
				}
			}
			p.ranges = append(p.ranges, r)
		}
		if len(p.errs) == 0 {
			accepted = append(accepted, p)
		}
	}
	return out
}

// PoolIndex finds the IPAddressPool that holds an IP the way the allocator assigns it: of the pools
// ParseLBPools accepts (they never overlap), the one that contains the IP. An IP no accepted pool
// holds is looked up, in order, in the parsable entries of the rejected pools: a pool that an edit
// made invalid keeps the IPs its Services were given before (the controller leaves them in their
// status), and the speaker keeps announcing them by that pool's advertisements.
type PoolIndex struct {
	pools []parsedPool
	// order is the look-up order: the accepted pools, then the rejected ones.
	order []*parsedPool
}

// NewPoolIndex indexes pools (in the order the allocator sees them: MetalLBConfig's, by
// namespace/name). It reads the addresses once; a decision over many IPs builds one and asks it.
func NewPoolIndex(pools []*metallbv1beta1.IPAddressPool) *PoolIndex {
	x := &PoolIndex{pools: parsePools(pools)}
	for i := range x.pools {
		if len(x.pools[i].errs) == 0 {
			x.order = append(x.order, &x.pools[i])
		}
	}
	for i := range x.pools {
		if len(x.pools[i].errs) != 0 {
			x.order = append(x.order, &x.pools[i]) // the fallback, after every accepted pool
		}
	}
	return x
}

// PoolOf returns the pool that holds ip (nil if none); see PoolIndex.
func (x *PoolIndex) PoolOf(ip netip.Addr) *metallbv1beta1.IPAddressPool {
	for _, p := range x.order {
		for _, r := range p.ranges {
			if r.Contains(ip) {
				return p.obj
			}
		}
	}
	return nil
}

// MatchesAny reports whether one of a list of label selectors (ORed, as everywhere in MetalLB)
// matches set; an empty list matches everything, and a selector that does not parse matches
// nothing. IPAddressPool serviceAllocation and the advertisements' selectors all read this way.
func MatchesAny(sels []metav1.LabelSelector, set map[string]string) bool {
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
