package ctsync

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// SNATTable is the nftables table (families ip and ip6) that SNATs to this gateway's SNAT
// address. Its chain hooks postrouting at SNATPriority, just before vipgate's own table's
// masquerade (srcnat, 100): the kernel applies the first source NAT a nat chain sets, so the
// packets vipgate's table marked for masquerade are SNATed here to the SNAT address instead of the
// outgoing interface's address. Families without a SNAT address get no chain, and vipgate's
// masquerade applies.
const (
	SNATTable    = "vipgate-snat"
	SNATPriority = 99
)

// OwnedSNAT decides which SNAT addresses this gateway (self) answers ARP/NDP for: its own always,
// and those of a gateway not among the membership's live members (alive), when self is the
// rendezvous choice among the live members and itself (so one survivor takes each dead gateway's
// addresses over). takeover is false until the membership has had the time to hear the peers
// (a gateway that starts takes nothing over on no evidence).
//
// Unlike a VIP, a SNAT address needs no quorum: with conntrack sync every gateway holds every
// flow's NAT state, so a reply that reaches either gateway is translated back correctly. The
// membership's two-member rule (the lower name wins a tie alone) would leave a dead gw1's address
// unanswered by gw2, and its flows dead. The result is sorted.
func OwnedSNAT(self string, byGateway map[string][]netip.Addr, alive map[string]bool, takeover bool) []netip.Addr {
	var out []netip.Addr
	out = append(out, byGateway[self]...)
	var cands []string
	for n, ok := range alive {
		if ok {
			cands = append(cands, n)
		}
	}
	if !slices.Contains(cands, self) {
		cands = append(cands, self)
	}
	slices.Sort(cands)
	for g, addrs := range byGateway {
		if g == self || alive[g] || !takeover {
			continue
		}
		for _, a := range addrs {
			if rendezvous(cands, a) == self {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// rendezvous picks the candidate with the highest hash of (name, address).
func rendezvous(cands []string, a netip.Addr) string {
	best, bestH := "", uint64(0)
	for _, c := range cands {
		h := fnv.New64a()
		h.Write([]byte(c))
		h.Write([]byte{0})
		h.Write(a.AsSlice())
		if v := h.Sum64(); best == "" || v > bestH {
			best, bestH = c, v
		}
	}
	return best
}

// snatFamily is what SNATTable holds in one family: the address this gateway SNATs to (none: no
// postrouting chain) and the SNAT addresses the guard covers (none: no prerouting chain). Neither:
// no table. ProgramSNAT programs it and RenderSNAT prints it, so what `vipgate render` shows is
// what the gateway programs.
type snatFamily struct {
	family nftables.TableFamily
	// name is the family as nft writes it: ip or ip6.
	name  string
	snat  netip.Addr
	guard []netip.Addr
}

// empty says the family has no table.
func (f snatFamily) empty() bool { return !f.snat.IsValid() && len(f.guard) == 0 }

// snatPlan splits own and all by family, IPv4 first: per family the first of own is the SNAT
// address, and every address of all is guarded.
func snatPlan(own, all []netip.Addr) []snatFamily {
	plan := []snatFamily{{family: nftables.TableFamilyIPv4, name: "ip"}, {family: nftables.TableFamilyIPv6, name: "ip6"}}
	for i := range plan {
		is4 := plan[i].family == nftables.TableFamilyIPv4
		for _, a := range own {
			if a.Unmap().Is4() == is4 {
				plan[i].snat = a.Unmap()
				break
			}
		}
		for _, a := range all {
			if a.Unmap().Is4() == is4 {
				plan[i].guard = append(plan[i].guard, a.Unmap())
			}
		}
	}
	return plan
}

// ProgramSNAT replaces SNATTable in the current network namespace. Per family with an address in
// own, packets carrying mark (vipgate's masquerade bit) are SNATed to that address (fully random
// ports) and the bit is cleared, as vipgate's masquerade does. And for every SNAT address of the
// group (all), a packet to it that belongs to no known flow (ct state new or invalid) is dropped in
// prerouting, after conntrack (SNATGuardPriority) but before its entry is confirmed: such a packet
// is a reply whose flow's state this gateway lacks (yet), e.g. right after it restarted with an
// empty table. Without the drop, conntrack would record it as a new flow from the node, conntrackd
// would replicate that bogus entry, and the peer would replace the real entry of the flow with it.
// Dropped, the reply is retransmitted and finds the entry once the peer's table has arrived. With
// no addresses at all the table is removed. One atomic batch per family. RenderSNAT prints the same
// tables in nft syntax.
func ProgramSNAT(own, all []netip.Addr, mark uint32) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("SNAT table: %w", err)
	}
	for _, f := range snatPlan(own, all) {
		t := &nftables.Table{Name: SNATTable, Family: f.family}
		// Add then delete: deleting a table that does not exist would fail the batch.
		c.AddTable(t)
		c.DelTable(t)
		if !f.empty() {
			c.AddTable(t)
		}
		if f.snat.IsValid() {
			ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(SNATPriority)})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: snatExprs(f.snat, mark)})
		}
		if len(f.guard) > 0 {
			ch := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(SNATGuardPriority)})
			for _, a := range f.guard {
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: guardExprs(a)})
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("SNAT table %s %s: %w", f.name, SNATTable, err)
		}
	}
	return nil
}

// RenderSNAT prints, in the syntax `nft -f` reads (Debian's nft 1.0.6 included), the tables
// ProgramSNAT(own, all, mark) programs: IPv4 then IPv6, a family without addresses not at all (the
// gateway deletes its table). `vipgate render` prints it after vipgate's own tables. The rules are
// written as nft lists them back (TestRenderSNATLoadsAsProgrammed compares both in the kernel).
func RenderSNAT(own, all []netip.Addr, mark uint32) string {
	var b strings.Builder
	for _, f := range snatPlan(own, all) {
		if f.empty() {
			continue
		}
		fmt.Fprintf(&b, "table %s %s {\n", f.name, SNATTable)
		if f.snat.IsValid() {
			fmt.Fprintf(&b, "\tchain postrouting {\n\t\ttype nat hook postrouting priority %d; policy accept;\n", SNATPriority)
			fmt.Fprintf(&b, "\t\tmeta mark & 0x%08x != 0x00000000 meta mark set meta mark & 0x%08x snat to %s fully-random\n\t}\n",
				mark, ^mark, f.snat)
		}
		if len(f.guard) > 0 {
			fmt.Fprintf(&b, "\tchain prerouting {\n\t\ttype filter hook prerouting priority %d; policy accept;\n", SNATGuardPriority)
			for _, a := range f.guard {
				fmt.Fprintf(&b, "\t\t%s daddr %s ct state invalid,new drop\n", f.name, a)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// SNATGuardPriority is the prerouting priority of the guard: after conntrack (-200), before
// vipgate's DNAT (-100).
const SNATGuardPriority = -150

// guardExprs is `ip daddr addr ct state new,invalid drop` (ip6 daddr for IPv6).
func guardExprs(addr netip.Addr) []expr.Any {
	off, n := uint32(16), uint32(4)
	if addr.Is6() {
		off, n = 24, 16
	}
	zero := make([]byte, 4)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.AsSlice()},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW | expr.CtStateBitINVALID), Xor: zero},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// snatExprs is `meta mark & mark != 0 meta mark set meta mark & ~mark snat to addr fully-random`.
func snatExprs(addr netip.Addr, mark uint32) []expr.Any {
	zero := make([]byte, 4)
	nfproto := uint32(unix.NFPROTO_IPV4)
	if addr.Is6() {
		nfproto = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(mark), Xor: zero},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(^mark), Xor: zero},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Immediate{Register: 1, Data: addr.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: nfproto, RegAddrMin: 1, RegAddrMax: 1, FullyRandom: true},
	}
}
