package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// Session affinity's kinds (kinds.go): the dynamic map of a Service port's clients and the three
// actions that record, refresh and recall a client's endpoint.

func init() {
	registerSetKinds(map[SetKind]*setKindDesc{
		KindAffinity: {
			dynamic: true,
			timeout: true,
			decl: func(fam nftFamily, s *Set) (string, []string) {
				a := fam.addrType
				lines := []string{"type " + a + " : " + a, "flags dynamic,timeout"}
				if s.Timeout > 0 {
					secs := int64(s.Timeout.Seconds())
					lines = append(lines, "timeout "+strconv.FormatInt(max(secs, 1), 10)+"s")
				}
				return "map", lines
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				a := e.addrType()
				ns.KeyType, ns.HasTimeout, ns.Timeout, ns.Dynamic = a, true, s.Timeout, true
				ns.IsMap, ns.DataType = true, a
			},
			// Only the purges write an element: its key.
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putAddr(key, el.Addr)
				w.element(key[:alen], nil, nil, false)
				return nil
			},
			decode: keyedElement(dataRead, func(el *Element, k, d *keyReader, alen int) {
				el.Addr, el.DataAddr = k.addr(alen), d.addr(alen)
			}),
			traceMiss: affinityTraceMiss,
		},
	})
	registerActionKinds(map[ActionKind]*actionKindDesc{
		ActAffinityDNAT: {encode: encodeAffinityUpdate, text: affinityUpdateText, hint: affinityUpdateHint(ActAffinityDNAT),
			trace: traceAffinityDNAT, algorithm: cluster.LBRandom},
		ActAffinityRefresh: {encode: encodeAffinityUpdate, text: affinityUpdateText, hint: affinityUpdateHint(ActAffinityRefresh),
			trace: traceAffinityRefresh},
		ActAffinityRecall: {encode: encodeAffinityRecall, text: affinityRecallText, hint: affinityRecallHint,
			trace: traceAffinityRecall},
	})
}

// Session affinity: ActAffinityDNAT and ActAffinityRefresh update the client's element of the
// affinity map (the endpoint address is the map's data and, for the DNAT, its address too);
// ActAffinityRecall DNATs a known client to the endpoint the map remembers.

func encodeAffinityUpdate(e *encoder, a Action) ([]expr.Any, error) {
	s, err := e.setRef(a.Set)
	if err != nil {
		return nil, err
	}
	xs := []expr.Any{
		e.loadSaddr(reg1),
		&expr.Immediate{Register: reg2, Data: addrBytes(a.Addr)},
		&expr.Dynset{SrcRegKey: reg1, SrcRegData: reg2, SetName: s.Name, SetID: s.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE)},
	}
	if a.Kind == ActAffinityDNAT {
		xs = append(xs,
			&expr.Immediate{Register: reg1, Data: []byte{byte(a.Port >> 8), byte(a.Port)}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: e.natFamily(), RegAddrMin: reg2, RegProtoMin: reg1})
	}
	return xs, nil
}

func encodeAffinityRecall(e *encoder, a Action) ([]expr.Any, error) {
	l, err := e.mapLookup(a.Set, reg1, reg1)
	if err != nil {
		return nil, err
	}
	return []expr.Any{
		e.loadSaddr(reg1), l,
		&expr.Immediate{Register: reg2, Data: []byte{byte(a.Port >> 8), byte(a.Port)}},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: e.natFamily(), RegAddrMin: reg1, RegProtoMin: reg2},
	}, nil
}

func affinityUpdateText(f *Flat, fam nftFamily, a Action) (string, error) {
	ip := fam.table
	addr, err := addrText(fam, a.Addr)
	if err != nil {
		return "", fmt.Errorf("affinity DNAT: %w", err)
	}
	update := fmt.Sprintf("update @%s { %s saddr : %s }", a.Set, ip, addr)
	if a.Kind == ActAffinityRefresh {
		return update, needSet(f, a.Set, KindAffinity)
	}
	if ip == "ip6" {
		addr = "[" + addr + "]"
	}
	// nft refuses a port mapping without a transport protocol in its context; the Service port's
	// protocol is always one of these, and the chain is only reached through vmaps keyed by it,
	// so the match never changes what the rule does.
	return fmt.Sprintf("%s meta l4proto { tcp, udp, sctp } dnat %s to %s:%d", update, ip, addr, a.Port),
		needSet(f, a.Set, KindAffinity)
}

func affinityRecallText(f *Flat, fam nftFamily, a Action) (string, error) {
	return fmt.Sprintf("meta l4proto { tcp, udp, sctp } dnat %[1]s to %[1]s saddr map @%[2]s : %[3]d", fam.table, a.Set, a.Port),
		needSet(f, a.Set, KindAffinity)
}

func affinityUpdateHint(k ActionKind) func(h hints) Action {
	return func(h hints) Action {
		a := Action{Kind: k, Set: h.dynset}
		if len(h.imm) >= 1 {
			a.Addr, _ = netip.AddrFromSlice(h.imm[0])
		}
		if k == ActAffinityDNAT && len(h.imm) == 2 && len(h.imm[1]) == 2 {
			a.Port = binary.BigEndian.Uint16(h.imm[1])
		}
		return a
	}
}

func affinityRecallHint(h hints) Action {
	a := Action{Kind: ActAffinityRecall, Set: h.set}
	if len(h.imm) == 1 && len(h.imm[0]) == 2 {
		a.Port = binary.BigEndian.Uint16(h.imm[0])
	}
	return a
}

// In a trace the affinity maps are empty: they are runtime state, filled by the packets themselves,
// and a trace starts from none. So a new client is recorded and DNATed (ActAffinityDNAT), and the
// known-client rules do not match: Refresh sits behind a match on the map, and Recall's lookup in it
// fails.

const affinityTraceMiss = "affinity maps are empty at trace time"

func traceAffinityDNAT(c actCall, st pstate, a Action) (pstate, bool) {
	if err := c.t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
		c.fail(err)
		return st, false
	}
	if err := needSet(c.t.f, a.Set, KindAffinity); err != nil {
		c.fail(err)
		return st, false
	}
	if !a.Addr.IsValid() {
		c.fail(errors.New("affinity DNAT without an address"))
		return st, false
	}
	st.dst, st.port, st.dnat, st.dnatBy = a.Addr.Unmap(), a.Port, true, c.by
	ep := netip.AddrPortFrom(st.dst, st.port)
	c.match(st, fmt.Sprintf("match: client recorded in @%s; DNAT to %s", a.Set, ep)).Endpoint = ep
	c.done(st, vAccept, c.by)
	return st, false
}

func traceAffinityRefresh(c actCall, st pstate, a Action) (pstate, bool) {
	if err := needSet(c.t.f, a.Set, KindAffinity); err != nil {
		c.fail(err)
		return st, false
	}
	return st, true
}

func traceAffinityRecall(c actCall, st pstate, a Action) (pstate, bool) {
	if err := needSet(c.t.f, a.Set, KindAffinity); err != nil {
		c.fail(err)
		return st, false
	}
	if err := c.t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
		c.fail(err)
		return st, false
	}
	c.noMatch(st, fmt.Sprintf("no match: %s not in @%s (%s)", st.src, a.Set, affinityTraceMiss))
	return st, true
}
