package symreturn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// Kernel applies plans to the network namespace it runs in: the nftables table in one batch, the
// ip rules and routes by difference. It is the package's only effector.
type Kernel struct{}

// ApplyTable replaces the plan's nftables table in one batch (an empty plan deletes it).
func (Kernel) ApplyTable(p Plan) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	t := &nftables.Table{Name: p.Table, Family: nftables.TableFamilyINet}
	// Add then delete: the delete cannot fail on an absent table, and the batch is atomic, so the
	// table is never seen half built.
	c.AddTable(t)
	c.DelTable(t)
	if p.Enabled() {
		c.AddTable(t)
		accept := nftables.ChainPolicyAccept
		chains := map[string]*nftables.Chain{
			chainPrerouting: c.AddChain(&nftables.Chain{Name: chainPrerouting, Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept}),
			chainOutput: c.AddChain(&nftables.Chain{Name: chainOutput, Table: t, Type: nftables.ChainTypeRoute,
				Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityMangle, Policy: &accept}),
		}
		for _, r := range p.nftRules() {
			c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs(), UserData: comment(r.comment)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("replacing table inet %s: %w", p.Table, err)
	}
	return nil
}

// exprs encodes the rule as render.go's text says.
func (r nftRule) exprs() []expr.Any {
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	zero := u32(0)
	if r.iifname != "" {
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, r.iifname)
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(expr.CtStateBitNEW), Xor: zero},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero},
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^r.mask), Xor: u32(r.mark)},
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
		}
	}
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{ctDirReply}},
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(r.mask), Xor: zero},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: u32(r.mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(^r.mask), Xor: u32(r.mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
	}
}

// comment is nft's userdata record of a rule comment (NFTNL_UDATA_RULE_COMMENT, NUL-terminated).
func comment(s string) []byte {
	return append(append([]byte{0, byte(len(s) + 1)}, s...), 0)
}

// Links maps the names of the namespace's interfaces to their indexes.
func (Kernel) Links() (map[string]int, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := map[string]int{}
	for _, l := range ls {
		out[l.Attrs().Name] = l.Attrs().Index
	}
	return out, nil
}

// MainRoutes lists the main table's unicast routes of both families (not multipath ones).
func (Kernel) MainRoutes() ([]Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing the main table: %w", err)
	}
	var out []Route
	for _, r := range rs {
		if r.Type != unix.RTN_UNICAST || len(r.MultiPath) > 0 {
			continue
		}
		if rr, ok := fromNetlink(r); ok {
			out = append(out, rr)
		}
	}
	return out, nil
}

// OwnRoutes lists the routes of any table that carry RouteProtocol.
func (Kernel) OwnRoutes() ([]Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: RouteProtocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("listing vipgate's routes: %w", err)
	}
	var out []Route
	for _, r := range rs {
		if rr, ok := fromNetlink(r); ok {
			out = append(out, rr)
		}
	}
	return out, nil
}

func fromNetlink(r netlink.Route) (Route, bool) {
	out := Route{Table: r.Table, LinkIndex: r.LinkIndex, Scope: uint8(r.Scope), OnLink: r.Flags&unix.RTNH_F_ONLINK != 0}
	fam := r.Family
	if r.Dst != nil {
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			return Route{}, false
		}
		ones, _ := r.Dst.Mask.Size()
		out.Dst = netip.PrefixFrom(a.Unmap(), ones)
	} else if fam == unix.AF_INET {
		out.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	} else if fam == unix.AF_INET6 {
		out.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	} else {
		return Route{}, false
	}
	if a, ok := netip.AddrFromSlice(r.Gw); ok {
		out.Gw = a.Unmap()
	}
	if a, ok := netip.AddrFromSlice(r.Src); ok {
		out.Src = a.Unmap()
	}
	return out, true
}

func toNetlink(r Route) *netlink.Route {
	nr := &netlink.Route{
		Table:     r.Table,
		LinkIndex: r.LinkIndex,
		Scope:     netlink.Scope(r.Scope),
		Protocol:  RouteProtocol,
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Family:    unix.AF_INET,
	}
	if r.Dst.Addr().Is6() {
		nr.Family = unix.AF_INET6
	}
	if r.Gw.IsValid() {
		nr.Gw = r.Gw.AsSlice()
	}
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	if r.OnLink {
		nr.Flags = unix.RTNH_F_ONLINK
	}
	return nr
}

// AddRoute and DelRoute change one route of vipgate's.
func (Kernel) AddRoute(r Route) error { return netlink.RouteReplace(toNetlink(r)) }

// DelRoute deletes one of vipgate's routes.
func (Kernel) DelRoute(r Route) error { return netlink.RouteDel(toNetlink(r)) }

// OwnRules lists the ip rules of both families that carry RouteProtocol.
func (Kernel) OwnRules() ([]Rule, error) {
	var out []Rule
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, err := netlink.RuleList(family(f))
		if err != nil {
			return nil, fmt.Errorf("listing ip rules: %w", err)
		}
		for _, r := range rs {
			if r.Protocol != RouteProtocol {
				continue
			}
			var mask uint32
			if r.Mask != nil {
				mask = *r.Mask
			}
			out = append(out, Rule{Family: f, Priority: r.Priority, Mark: r.Mark, Mask: mask, Table: r.Table})
		}
	}
	return out, nil
}

func family(f cluster.Family) int {
	if f == cluster.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func ruleToNetlink(r Rule) *netlink.Rule {
	nr := netlink.NewRule()
	nr.Family = family(r.Family)
	nr.Priority = r.Priority
	nr.Mark = r.Mark
	mask := r.Mask
	nr.Mask = &mask
	nr.Table = r.Table
	nr.Protocol = RouteProtocol
	return nr
}

// AddRule adds one ip rule of vipgate's.
func (Kernel) AddRule(r Rule) error {
	if err := netlink.RuleAdd(ruleToNetlink(r)); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// DelRule deletes one ip rule of vipgate's.
func (Kernel) DelRule(r Rule) error { return netlink.RuleDel(ruleToNetlink(r)) }
