package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables/expr"
)

// This file is the gateway's routed forwarding (forwarding: route), a stateless "direct server
// return" mode: the gateway does not NAT. Each packet to a VIP port is steered, unchanged, to the node
// the Maglev slot of its flow names:
//
//	dup to ip daddr . meta l4proto . th dport . jhash ip saddr . th sport . ip daddr . th dport mod M
//	    seed GatewayHashSeed map @gateway-routes drop
//
// `dup to ADDR` sends a copy of the packet out with ADDR as its next hop (the kernel's nf_dup_ipv4:
// a route lookup for ADDR, the packet's own destination untouched, TTL decremented, the copy
// untracked); `drop` ends the original. It runs in a filter chain at raw priority, before conntrack:
// the gateway keeps no state at all. The node's own Service rules (vipgate node or kube-proxy) DNAT
// the packet to a pod and the node answers the client directly with the VIP as source. So the gateway
// that carries a flow does not matter: when one dies and the router moves its flows to another, that
// one picks the same node (same hash, same Maglev table) and the node's connection goes on.
//
// The nodes must be on a subnet the gateway reaches directly (next hop = node address) and must accept
// traffic to the VIPs (their rules for LoadBalancer IPs); the network must let the nodes' replies,
// sourced from the VIP, reach the clients (no strict uRPF for VIP sources at the router).

// PriorityRaw is netfilter's raw priority: before conntrack (-200).
const PriorityRaw = -300

// ActDupJhashMap steers a packet to the next hop its Maglev slot names and drops the original:
//
//	dup to <ActDNATJhashMap's key and hash> map @Map drop
//
// Map is a KindTupleAddr map (VIP . proto . port . slot -> node address), Value the table size.
const ActDupJhashMap ActionKind = 129

// KindTupleAddr: Addr . inet_proto . inet_service . mark (slot) : Addr. Like ActionKind's gateway
// values, the number is far from model.go's iota range.
const KindTupleAddr SetKind = 64

// gatewayJhashLookup loads the key VIP . proto . port . jhash-slot and looks it up in a.Map, leaving
// the data in reg1 (lbalgo.go's jhashLookup with the flow hash).
func (e *encoder) gatewayJhashLookup(a Action) ([]expr.Any, error) {
	return e.jhashLookup(a, hashShape{tuple: true, flow: true})
}

// gatewayRouteAct traces ActDupJhashMap: one branch per node the VIP port's slots lead to (the
// source port is unknown; GatewaySlot finds a given flow's slot).
func (t *tracer) gatewayRouteAct(st pstate, ch *Chain, idx int, r Rule, text, by string, done func(pstate, verdict, string)) (pstate, bool) {
	a := r.Action
	t.jhashBranches(st, ch, idx, text, a, KindTupleAddr, by, done, func(b pstate, ep netip.AddrPort, slots int) {
		t.stepOf(b, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: sent unchanged to next hop %s (%d of %d slots); the original is dropped", ep.Addr(), slots, a.Value))
		t.sendTo(b, netip.AddrPortFrom(ep.Addr(), st.port), "routed by "+by)
	})
	return st, false
}

// jhashBranches follows a jhash-slot map rule (ActDNATJhashMap, ActDupJhashMap, ActDNATProtoPortJhashMap): it looks up every
// slot of the packet's VIP port in a.Map (of kind), groups the slots by the address and port they
// lead to, and forks one branch per group (a Packet has no source port, so every slot is possible).
// Slots not in the map make the rule not match: that branch goes on with the next rule. hit handles
// a branch whose slots lead to ep (port 0 for KindTupleAddr). A modulus of 0 (no slots) never
// reaches it: the tracer spells each rule before it runs it, and the actions' text refuses one.
func (t *tracer) jhashBranches(st pstate, ch *Chain, idx int, text string, a Action, kind SetKind, by string,
	done func(pstate, verdict, string), hit func(b pstate, ep netip.AddrPort, slots int)) {
	type target struct {
		found bool
		ep    netip.AddrPort
	}
	slots := map[target]int{}
	key, keyText := t.entryKey(st, kind != KindProtoPortEndpoints)
	for i := uint32(0); i < a.Value; i++ {
		key.Index = i
		e, found, err := t.lookup(a.Map, key, kind)
		if err != nil {
			t.fail("%s: %v", by, err)
			return
		}
		tg := target{found: found}
		if found {
			tg.ep = netip.AddrPortFrom(e.DataAddr.Unmap(), e.DataPort)
		}
		slots[tg]++
	}
	targets := make([]target, 0, len(slots))
	for tg := range slots {
		targets = append(targets, tg)
	}
	slices.SortFunc(targets, func(x, y target) int {
		if x.found != y.found {
			return cmp.Compare(boolInt(x.found), boolInt(y.found))
		}
		return x.ep.Compare(y.ep)
	})
	for _, tg := range targets {
		b := st
		if len(targets) > 1 {
			b = st.fork(fmt.Sprintf("jhash slots %d of %d", slots[tg], a.Value), float64(slots[tg])/float64(a.Value))
		}
		if !tg.found {
			// The kernel's map lookup fails for these slots: the rule does not match.
			t.stepOf(b, StepNoMatch, ch.Name, idx, text, fmt.Sprintf("no match: %s . <slot> not in @%s for %d slots", keyText, a.Map, slots[tg]))
			t.exec(b, done)
			continue
		}
		hit(b, tg.ep, slots[tg])
	}
}

// tupleAddrKeyLen is the key length of a KindTupleAddr element: address, proto, port, slot.
func tupleAddrKeyLen(alen int) int { return alen + 12 }
