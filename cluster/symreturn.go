package cluster

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
)

// Defaults of SymmetricReturn (docs/configuration.md, "Symmetric return").
const (
	// DefaultSymmetricReturnMarkMask is bits 12-13: below kube-proxy's masquerade and drop bits
	// (0x4000, 0x8000), outside Calico's and Flannel's 0xffff0000 and Cilium's 0x0f00, and
	// disjoint from Istio's 0x539. Three interfaces fit (values 0x1000, 0x2000, 0x3000).
	DefaultSymmetricReturnMarkMask uint32 = 0x3000
	// DefaultSymmetricReturnTable is the routing table of the first interface (the i-th uses
	// DefaultSymmetricReturnTable+i) and DefaultSymmetricReturnPriority the priority of the ip
	// rules that select them: after the local table's rule (0), before main's (32766).
	DefaultSymmetricReturnTable    = 1700
	DefaultSymmetricReturnPriority = 1700
)

// SymmetricReturn sends the replies of connections that arrived on an interface back out of that
// interface (issue #32, MetalLB#1983): a VIP announced on a second NIC whose replies would
// otherwise follow the main table's default route out of another one, where rp_filter, a stateful
// firewall or a router that does not know the client drops them. New connections arriving on
// one of Interfaces get that interface's value in their conntrack mark (within MarkMask); their
// replies, forwarded from a pod or sent by the host itself, get it back as their packet mark,
// and an ip rule (fwmark value/MarkMask) routes them by the interface's own table. It is node
// configuration: only who writes the NodeConfig can turn it on; no Service can.
type SymmetricReturn struct {
	// Interfaces are the opted-in interfaces, in order: the i-th (0-based) has the mark value
	// (i+1) shifted to MarkMask's lowest bit and routing table RouteTable+i.
	Interfaces []ReturnInterface
	// MarkMask is the contiguous run of packet and conntrack mark bits vipgate owns for this
	// (default DefaultSymmetricReturnMarkMask); it must not overlap masqueradeBit's mark.
	MarkMask uint32
	// RouteTable is the routing table of the first interface (default
	// DefaultSymmetricReturnTable); vipgate owns RouteTable .. RouteTable+len(Interfaces)-1.
	RouteTable int
	// RulePriority is the priority of the ip rules (default DefaultSymmetricReturnPriority).
	RulePriority int
}

// ReturnInterface is one opted-in interface.
type ReturnInterface struct {
	// Name is the interface's name (eth1, bond0.20).
	Name string
	// Gateways are the next hops (at most one per family) of the default routes of the
	// interface's table. Without one of a family, the table holds a copy of the main table's
	// routes through the interface (its connected prefixes, and its default route when it has
	// one, as a second DHCP lease gives).
	Gateways []netip.Addr
}

// Enabled says whether any interface is opted in.
func (s SymmetricReturn) Enabled() bool { return len(s.Interfaces) > 0 }

// Mark is the mark value of the i-th interface.
func (s SymmetricReturn) Mark(i int) uint32 {
	return uint32(i+1) << bits.TrailingZeros32(s.MarkMask)
}

// symmetricReturnFile is the NodeConfig's symmetricReturn: {interfaces: [{name: eth1, gateways:
// [203.0.113.1]}], markMask: "0x3000", routeTable: 1700, rulePriority: 1700}.
type symmetricReturnFile struct {
	Interfaces []struct {
		Name     string   `json:"name"`
		Gateways []string `json:"gateways"`
	} `json:"interfaces"`
	MarkMask     string `json:"markMask"`
	RouteTable   *int   `json:"routeTable"`
	RulePriority *int   `json:"rulePriority"`
}

func parseSymmetricReturn(f *symmetricReturnFile) (SymmetricReturn, error) {
	if f == nil {
		// Off: the zero value.
		return SymmetricReturn{}, nil
	}
	out := SymmetricReturn{
		MarkMask:     DefaultSymmetricReturnMarkMask,
		RouteTable:   DefaultSymmetricReturnTable,
		RulePriority: DefaultSymmetricReturnPriority,
	}
	for i, fi := range f.Interfaces {
		gws, err := parseAddrList(fmt.Sprintf("symmetricReturn.interfaces[%d].gateways", i), fi.Gateways)
		if err != nil {
			return SymmetricReturn{}, err
		}
		out.Interfaces = append(out.Interfaces, ReturnInterface{Name: fi.Name, Gateways: gws})
	}
	if f.MarkMask != "" {
		m, err := strconv.ParseUint(f.MarkMask, 0, 32)
		if err != nil {
			return SymmetricReturn{}, fmt.Errorf("symmetricReturn.markMask: %q: %w", f.MarkMask, err)
		}
		out.MarkMask = uint32(m)
	}
	if f.RouteTable != nil {
		out.RouteTable = *f.RouteTable
	}
	if f.RulePriority != nil {
		out.RulePriority = *f.RulePriority
	}
	return out, nil
}

// validate checks s against itself and the node's masquerade mark.
func (s SymmetricReturn) validate(masqMark uint32) error {
	m := s.MarkMask
	if m == 0 {
		return errors.New("symmetricReturn.markMask: 0 leaves no bits")
	}
	low := bits.TrailingZeros32(m)
	if run := m >> low; run&(run+1) != 0 {
		return fmt.Errorf("symmetricReturn.markMask: %#x is not one contiguous run of bits", m)
	}
	if m&masqMark != 0 {
		return fmt.Errorf("symmetricReturn.markMask: %#x overlaps masqueradeBit's mark %#x", m, masqMark)
	}
	if n, max := len(s.Interfaces), int(m>>low); n > max {
		return fmt.Errorf("symmetricReturn.interfaces: %d interfaces, markMask %#x has values for %d", n, m, max)
	}
	// Table 0 is unspec; 253-255 are default, main and local.
	if last := s.RouteTable + len(s.Interfaces) - 1; s.RouteTable < 1 || last > 0xfffffffe || s.RouteTable <= 255 && last >= 253 {
		return fmt.Errorf("symmetricReturn.routeTable: %d: the tables %d-%d must lie in 1-252 or above 255", s.RouteTable, s.RouteTable, last)
	}
	// 0 is the local table's rule; 32766 and 32767 are main's and default's.
	if s.RulePriority < 1 || s.RulePriority >= 32766 {
		return fmt.Errorf("symmetricReturn.rulePriority: %d is out of range 1-32765", s.RulePriority)
	}
	var names []string
	for i, ifc := range s.Interfaces {
		if err := ValidInterfaceName(ifc.Name); err != nil {
			return fmt.Errorf("symmetricReturn.interfaces[%d].name: %q: %w", i, ifc.Name, err)
		}
		if slices.Contains(names, ifc.Name) {
			return fmt.Errorf("symmetricReturn.interfaces[%d].name: %q is listed twice", i, ifc.Name)
		}
		names = append(names, ifc.Name)
		var fams []Family
		for _, gw := range ifc.Gateways {
			if f := FamilyOf(gw); slices.Contains(fams, f) {
				return fmt.Errorf("symmetricReturn.interfaces[%d].gateways: two of IPv%d", i, f)
			} else {
				fams = append(fams, f)
			}
			if gw.IsUnspecified() || gw.IsMulticast() || gw.IsLoopback() {
				return fmt.Errorf("symmetricReturn.interfaces[%d].gateways: %s cannot be a next hop", i, gw)
			}
		}
	}
	return nil
}
