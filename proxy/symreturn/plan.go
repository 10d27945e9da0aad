// Package symreturn routes the replies of connections that arrived on an opted-in interface back
// out of that interface (cluster.SymmetricReturn, issue #32 item 5, MetalLB#1983): a VIP
// announced on a second NIC, whose replies would otherwise follow the main table's default route
// out of another NIC and be dropped by rp_filter, a stateful firewall or a router that does not
// know the client.
//
// How, per opted-in interface i (mark value v_i inside the configured mask M, routing table T_i):
//
//   - nftables, table "inet <table>-return", prerouting at mangle priority: a new connection
//     arriving on the interface gets v_i in its conntrack mark (ct mark & ~M | v_i); a reply
//     packet of a connection whose ct mark holds v_i gets it as its packet mark, before the
//     routing decision, so a pod's reply (DNAT'd traffic, forwarded) or a remote pod's (through
//     masquerade) is routed with it.
//   - the same restore in a "route" chain at output, for what the host answers itself: the mark
//     changed, so the kernel routes the packet again.
//   - ip rule "fwmark v_i/M lookup T_i" (IPv4 and IPv6), and table T_i with the main table's
//     routes through the interface and, when configured, default routes via its gateways. A
//     reply the table has no route for falls through to the main table, as before.
//
// Only replies carry the packet mark: the original direction keeps routing by the main table, so
// DNAT'd packets still reach their pods. Other mark bits are kept.
//
// The pure part (this file, render.go) decides the table, the rules and the routes from the
// config and the kernel's listing; kernel.go applies them. Everything this package adds carries
// RouteProtocol (rules, routes) or its table name, so a restart or a config change finds and
// replaces it, and "vipgate node --cleanup" removes it.
package symreturn

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
)

// RouteProtocol is the rtnetlink protocol of vipgate's ip rules and routes (0x76, 'v'; iproute2
// prints it as a number): what carries it is vipgate's to replace or remove.
const RouteProtocol = 0x76

// TableName is the nftables table (family inet) of a node whose own tables are called table.
func TableName(table string) string { return table + "-return" }

// Interface is one opted-in interface with its mark value and routing table.
type Interface struct {
	Name     string
	Mark     uint32
	Table    int
	Gateways []netip.Addr
}

// Plan is what the kernel must hold for a SymmetricReturn config.
type Plan struct {
	// Table is the nftables table (family inet).
	Table      string
	Interfaces []Interface
	Mask       uint32
	Priority   int
}

// NewPlan is the plan of cfg for a node whose tables are called table.
func NewPlan(cfg cluster.SymmetricReturn, table string) Plan {
	p := Plan{Table: TableName(table), Mask: cfg.MarkMask, Priority: cfg.RulePriority}
	for i, ifc := range cfg.Interfaces {
		p.Interfaces = append(p.Interfaces, Interface{Name: ifc.Name, Mark: cfg.Mark(i), Table: cfg.RouteTable + i, Gateways: ifc.Gateways})
	}
	return p
}

// Enabled says whether the plan opts any interface in; an empty plan means remove.
func (p Plan) Enabled() bool { return len(p.Interfaces) > 0 }

// Rule is one ip rule: fwmark Mark/Mask lookup Table at Priority, of Family.
type Rule struct {
	Family   cluster.Family
	Priority int
	Mark     uint32
	Mask     uint32
	Table    int
}

func (r Rule) String() string {
	return fmt.Sprintf("ipv%d rule %d: fwmark %#x/%#x lookup %d", r.Family, r.Priority, r.Mark, r.Mask, r.Table)
}

// Rules are the ip rules of the plan, IPv4 then IPv6.
func (p Plan) Rules() []Rule {
	var out []Rule
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		for _, ifc := range p.Interfaces {
			out = append(out, Rule{Family: f, Priority: p.Priority, Mark: ifc.Mark, Mask: p.Mask, Table: ifc.Table})
		}
	}
	return out
}

// Route is one route, in the fields this package reads and writes (comparable: a route's
// identity is all of them).
type Route struct {
	Table int
	// Dst is the destination (0.0.0.0/0 or ::/0 for a default route).
	Dst netip.Prefix
	// Gw is the next hop (invalid for a connected route).
	Gw netip.Addr
	// Src is the preferred source address (may be invalid).
	Src netip.Addr
	// LinkIndex is the output interface.
	LinkIndex int
	// Scope is the rtnetlink scope (253 link for a connected route, 0 universe).
	Scope uint8
	// OnLink is RTNH_F_ONLINK: the gateway is on the link whatever the prefixes say.
	OnLink bool
}

func (r Route) String() string {
	s := fmt.Sprintf("table %d %s", r.Table, r.Dst)
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += fmt.Sprintf(" dev#%d", r.LinkIndex)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	return s
}

// Routes are the routes of the interfaces' tables: for each interface that exists (links maps
// names to indexes), the main table's routes through it (main: the main table's unicast routes),
// with a configured gateway's default route instead of a copied default of its family.
func (p Plan) Routes(links map[string]int, main []Route) []Route {
	var out []Route
	for _, ifc := range p.Interfaces {
		idx, ok := links[ifc.Name]
		if !ok {
			continue
		}
		configured := map[cluster.Family]bool{}
		for _, gw := range ifc.Gateways {
			gw = gw.Unmap()
			configured[cluster.FamilyOf(gw)] = true
			out = append(out, Route{Table: ifc.Table, Dst: netip.PrefixFrom(unspecified(gw), 0), Gw: gw, LinkIndex: idx})
		}
		for _, r := range main {
			if r.LinkIndex != idx || r.Dst.Bits() == 0 && configured[cluster.FamilyOf(r.Dst.Addr())] {
				continue
			}
			r.Table = ifc.Table
			out = append(out, r)
		}
	}
	sortRoutes(out)
	return slices.Compact(out)
}

func unspecified(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

func sortRoutes(rs []Route) {
	slices.SortFunc(rs, func(a, b Route) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), a.Dst.Addr().Compare(b.Dst.Addr()), cmp.Compare(a.Dst.Bits(), b.Dst.Bits()),
			a.Gw.Compare(b.Gw), a.Src.Compare(b.Src), cmp.Compare(a.LinkIndex, b.LinkIndex), cmp.Compare(a.Scope, b.Scope))
	})
}

// Diff returns what to delete from have and add to it to make it want.
func Diff[T comparable](want, have []T) (add, del []T) {
	for _, h := range have {
		if !slices.Contains(want, h) {
			del = append(del, h)
		}
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			add = append(add, w)
		}
	}
	return add, del
}
