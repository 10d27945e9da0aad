package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// This file adds the per-Service balancing algorithms (annotation vipgate.io/lb-algorithm, see
// docs/lb-algorithms.md) to the model's vocabulary, with their meaning in each consumer: the netlink
// encoding (encodeJhashMap, encodeRoundRobin), the nft text (jhashMapText, roundRobinText) and the
// tracer (traceJhashMapDNAT, traceSrcHashMap, traceRoundRobin). Their descriptors, which give
// them to the consumers, are kinds_lbalgo.go's.
//
//	random       the shared picker `numgen random mod N` (ActDNATTupleMap), the default on nodes
//	round-robin  a chain per Service port: `numgen inc mod (N-i) == 0 ... dnat to endpoint i`
//	             (ActDNATRoundRobin), each rule with its own counter, so the cascade hands out the
//	             endpoints strictly in turn; no set at all
//	source-hash  the shared picker `jhash ip saddr mod N` (ActDNATSrcHashMap and its NodePort twin)
//	maglev       the shared picker `jhash <flow> mod M` over a Maglev table of M slots per entry
//	             (ActDNATJhashMap, ActDNATProtoPortJhashMap), the gateway's shape
//
// The flow hash is `ip saddr . th sport . ip daddr . th dport` for IPv4 and `ip6 saddr . th sport`
// for IPv6: nft 1.0.6 runs out of registers for the IPv6 four-tuple next to the map key (its own
// compiler aborts with "BUG: register reg_low 12 invalid", although the kernel's sixteen 4-byte
// registers would hold it). The destination address and port are the map key already, so the
// IPv6 hash only leaves out what is constant within one entry's table.

// Action kinds of the balancing algorithms, after the gateway's 128 and 129.
const (
	// ActDNATProtoPortJhashMap: `dnat ip addr . port to meta l4proto . th dport . jhash <flow> mod
	// Value seed GatewayHashSeed map @Map` (maglev on a NodePort).
	ActDNATProtoPortJhashMap ActionKind = 130
	// ActDNATSrcHashMap: `dnat ip addr . port to ip daddr . meta l4proto . th dport . jhash ip saddr
	// mod Value seed GatewayHashSeed map @Map` (source-hash on an IP entry, and on a gateway).
	ActDNATSrcHashMap ActionKind = 131
	// ActDNATProtoPortSrcHashMap: the same keyed by (proto, dport), for NodePorts.
	ActDNATProtoPortSrcHashMap ActionKind = 132
	// ActDupSrcHashMap: ActDupJhashMap with the source-address hash (source-hash, forwarding: route).
	ActDupSrcHashMap ActionKind = 133
	// ActDNATRoundRobin: `numgen inc mod Value == 0 dnat ip to Addr:Port` (Value 0: unconditional).
	// One step of a round-robin cascade.
	ActDNATRoundRobin ActionKind = 134
)

// hashShape says which key and which hash input a jhash-map rule uses.
type hashShape struct {
	tuple bool // key daddr . l4proto . dport . slot (else l4proto . dport . slot)
	flow  bool // hash the flow (else the source address only)
}

// jhashLookup loads the key (entry . slot), with the slot a jhash of the shape's input modulo
// a.Value, and looks it up in a.Map, leaving the data in reg1. The layouts are the ones nft 1.0.6
// generates for these statements (checked with `nft --debug=netlink`), so `nft list` prints them as
// render does: the key from reg32, the hash result right after it, the hash input in the registers
// nft picks for it.
func (e *encoder) jhashLookup(a Action, sh hashShape) ([]expr.Any, error) {
	if a.Value == 0 {
		return nil, fmt.Errorf("jhash modulus 0")
	}
	l, err := e.mapLookup(a.Map, reg32, reg1)
	if err != nil {
		return nil, err
	}
	var xs []expr.Any
	var result, in uint32
	if sh.tuple {
		key, next := e.tupleKey()
		xs, result = key, next
		in = reg32 + 8
		if e.f == cluster.IPv6 {
			in = reg32 + 11
		}
	} else {
		xs, result, in = []expr.Any{loadL4Proto(reg32), loadDport(reg32 + 1)}, reg32+2, reg32+7
	}
	n := e.addrRegs()
	xs = append(xs, e.loadSaddr(in))
	length := 4 * n
	if sh.flow {
		xs = append(xs, loadSport(in+n))
		length += 4
		if e.f != cluster.IPv6 {
			xs = append(xs, e.loadDaddr(in+n+1), loadDport(in+n+2))
			length += 8
		}
	}
	xs = append(xs, &expr.Hash{SourceRegister: in, DestRegister: result, Length: length, Modulus: a.Value, Seed: GatewayHashSeed, Type: expr.HashTypeJenkins})
	return append(xs, l), nil
}

// encodeJhashMap encodes a jhash-map action of shape sh: a DNAT to the endpoint the slot's map
// element holds, or (dup) a copy sent to the next hop it holds and the original dropped. The IPv6
// flow hash covers the source address and port only: with the destination address and port as
// well, key and hash input need more registers than nft 1.0.6 can allocate ("BUG: register reg_low
// 12 invalid"), and an operator could not load or check what render prints.
func encodeJhashMap(sh hashShape, dup bool) func(e *encoder, a Action) ([]expr.Any, error) {
	return func(e *encoder, a Action) ([]expr.Any, error) {
		xs, err := e.jhashLookup(a, sh)
		if err != nil {
			return nil, err
		}
		if dup {
			return append(xs, &expr.Dup{RegAddr: reg1}, &expr.Verdict{Kind: expr.VerdictDrop}), nil
		}
		return append(xs, e.dnatFromMap()), nil
	}
}

// encodeRoundRobin encodes ActDNATRoundRobin.
func encodeRoundRobin(e *encoder, a Action) (xs []expr.Any, err error) {
	if !a.Addr.IsValid() || cluster.FamilyOf(a.Addr) != e.f {
		return nil, fmt.Errorf("round-robin DNAT to %v in an IPv%d table", a.Addr, e.f)
	}
	if a.Value == 1 {
		return nil, fmt.Errorf("round-robin step mod 1 (use 0 for the last endpoint)")
	}
	if a.Value > 1 {
		xs = append(xs,
			&expr.Numgen{Register: reg1, Modulus: a.Value, Type: unix.NFT_NG_INCREMENTAL},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)})
	}
	return append(xs,
		&expr.Immediate{Register: reg1, Data: addrBytes(a.Addr.Unmap())},
		&expr.Immediate{Register: reg2, Data: []byte{byte(a.Port >> 8), byte(a.Port)}},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: e.natFamily(), RegAddrMin: reg1, RegProtoMin: reg2}), nil
}

// flowHashText is the nft spelling of the flow hash input of family ip ("ip" or "ip6").
func flowHashText(ip string) string {
	if ip == "ip6" {
		return "ip6 saddr . th sport"
	}
	return "ip saddr . th sport . ip daddr . th dport"
}

// jhashText is `jhash <input> mod M seed S` for shape sh.
func jhashText(ip string, sh hashShape, m uint32) string {
	in := ip + " saddr"
	if sh.flow {
		in = flowHashText(ip)
	}
	return fmt.Sprintf("jhash %s mod %d seed %#x", in, m, GatewayHashSeed)
}

// jhashMapText spells a jhash-map action of shape sh (dup: a copy to the next hop, see
// encodeJhashMap).
func jhashMapText(sh hashShape, dup bool) func(f *Flat, fam nftFamily, a Action) (string, error) {
	return func(f *Flat, fam nftFamily, a Action) (string, error) {
		ip := fam.table
		if a.Value == 0 {
			return "", fmt.Errorf("jhash modulus 0")
		}
		key, kind := "meta l4proto . th dport", KindProtoPortEndpoints
		if sh.tuple {
			key, kind = ip+" daddr . meta l4proto . th dport", KindTupleEndpoints
		}
		if dup {
			return fmt.Sprintf("dup to %s . %s map @%s drop", key, jhashText(ip, sh, a.Value), a.Map), needSet(f, a.Map, KindTupleAddr)
		}
		return fmt.Sprintf("dnat %s addr . port to %s . %s map @%s", ip, key, jhashText(ip, sh, a.Value), a.Map), needSet(f, a.Map, kind)
	}
}

// roundRobinText spells ActDNATRoundRobin.
func roundRobinText(f *Flat, fam nftFamily, a Action) (string, error) {
	ip := fam.table
	addr, err := addrText(fam, a.Addr)
	if err != nil {
		return "", fmt.Errorf("round-robin DNAT: %w", err)
	}
	if ip == "ip6" {
		addr = "[" + addr + "]"
	}
	turn := ""
	switch {
	case a.Value == 1:
		return "", fmt.Errorf("round-robin step mod 1")
	case a.Value > 1:
		turn = fmt.Sprintf("numgen inc mod %d == 0 ", a.Value)
	}
	// The protocol match is nft's requirement for a port mapping (see ActAffinityDNAT).
	return fmt.Sprintf("%smeta l4proto { tcp, udp, sctp } dnat %s to %s:%d", turn, ip, addr, a.Port), nil
}

// roundRobinHint proposes a round-robin step's turn and endpoint.
func roundRobinHint(h hints) Action {
	a := Action{Value: h.modulus}
	if len(h.imm) == 2 && len(h.imm[1]) == 2 {
		a.Addr, _ = netip.AddrFromSlice(h.imm[0])
		a.Port = binary.BigEndian.Uint16(h.imm[1])
	}
	return a
}

// traceJhashMapDNAT traces a DNAT by a flow hash over the slots of an endpoint map of kind
// (ActDNATProtoPortJhashMap's KindProtoPortEndpoints, ActDNATJhashMap's KindTupleEndpoints): a
// Packet has no source port, so every endpoint the entry's slots lead to is a branch (GatewaySlot
// finds the one a given flow takes).
func traceJhashMapDNAT(kind SetKind) func(c actCall, st pstate, a Action) (pstate, bool) {
	return func(c actCall, st pstate, a Action) (pstate, bool) {
		t, ch, idx, text, by, done := c.t, c.ch, c.idx, c.text, c.by, c.done
		if err := t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
			t.fail("%s: %v", by, err)
			return st, false
		}
		t.jhashBranches(st, ch, idx, text, a, kind, by, done, func(b pstate, ep netip.AddrPort, slots int) {
			b.dst, b.port, b.dnat, b.dnatBy = ep.Addr(), ep.Port(), true, by
			t.stepOf(b, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: DNAT to %s (%d of %d slots)", ep, slots, a.Value)).Endpoint = ep
			done(b, vAccept, by)
		})
		return st, false
	}
}

// traceSrcHashMap traces ActDNATSrcHashMap, ActDNATProtoPortSrcHashMap and (route) ActDupSrcHashMap:
// the client address is known, so the slot is computed.
func traceSrcHashMap(tuple, route bool) func(c actCall, st pstate, a Action) (pstate, bool) {
	return func(c actCall, st pstate, a Action) (pstate, bool) {
		t, ch, idx, text, by, done := c.t, c.ch, c.idx, c.text, c.by, c.done
		if !route {
			if err := t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
				t.fail("%s: %v", by, err)
				return st, false
			}
		}
		if a.Value == 0 {
			t.fail("%s: jhash modulus 0", by)
			return st, false
		}
		// The client address is known, so the hash is computed: one branch, as in the kernel.
		slot := SourceHashSlot(st.src, a.Value)
		kind := KindProtoPortEndpoints
		switch {
		case route:
			kind = KindTupleAddr
		case tuple:
			kind = KindTupleEndpoints
		}
		key, keyText := t.entryKey(st, tuple)
		key.Index = slot
		e, found, err := t.lookup(a.Map, key, kind)
		if err != nil {
			t.fail("%s: %v", by, err)
			return st, false
		}
		if !found {
			t.stepOf(st, StepNoMatch, ch.Name, idx, text, fmt.Sprintf("no match: %s . %d (jhash of %s) not in @%s", keyText, slot, st.src, a.Map))
			return st, true
		}
		ep := netip.AddrPortFrom(e.DataAddr.Unmap(), e.DataPort)
		if route {
			t.stepOf(st, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: client %s hashes to slot %d of %d: sent unchanged to next hop %s; the original is dropped", st.src, slot, a.Value, ep.Addr()))
			t.sendTo(st, netip.AddrPortFrom(ep.Addr(), st.port), "routed by "+by)
			return st, false
		}
		st.dst, st.port, st.dnat, st.dnatBy = ep.Addr(), ep.Port(), true, by
		t.stepOf(st, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: client %s hashes to %d of %d: DNAT to %s", st.src, slot, a.Value, ep)).Endpoint = ep
		done(st, vAccept, by)
		return st, false
	}
}

// traceRoundRobin traces ActDNATRoundRobin: the counter is kernel state, so a step both takes its
// turn and does not.
func traceRoundRobin(c actCall, st pstate, a Action) (pstate, bool) {
	t, ch, idx, text, by, done := c.t, c.ch, c.idx, c.text, c.by, c.done
	if err := t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
		t.fail("%s: %v", by, err)
		return st, false
	}
	if !a.Addr.IsValid() || a.Value == 1 {
		t.fail("%s: bad round-robin step %+v", by, a)
		return st, false
	}
	dnat := func(b pstate, note string) {
		b.dst, b.port, b.dnat, b.dnatBy = a.Addr.Unmap(), a.Port, true, by
		t.stepOf(b, StepMatch, ch.Name, idx, text, fmt.Sprintf("%s: DNAT to %s", note, netip.AddrPortFrom(b.dst, b.port))).Endpoint = netip.AddrPortFrom(b.dst, b.port)
		done(b, vAccept, by)
	}
	if a.Value == 0 {
		dnat(st, "match (last in turn)")
		return st, false
	}
	// The counter is kernel state: its turn both comes and does not.
	label := fmt.Sprintf("%s#%d", ch.Name, idx)
	dnat(st.fork(label+" its turn", 1/float64(a.Value)), fmt.Sprintf("match: every %d-th new connection reaching this rule", a.Value))
	notTaken := st.fork(label+" not its turn", float64(a.Value-1)/float64(a.Value))
	t.stepOf(notTaken, StepNoMatch, ch.Name, idx, text, "no match: not this endpoint's turn")
	return notTaken, true
}

// SourceHashSlot returns the slot the kernel's `jhash ip saddr mod m seed GatewayHashSeed` computes
// for a client address (the source-hash algorithm).
func SourceHashSlot(src netip.Addr, m uint32) uint32 {
	return maglev.Scale(maglev.Jhash(src.Unmap().AsSlice(), GatewayHashSeed), m)
}
