package dataplane

import (
	"net/netip"

	"github.com/google/nftables/expr"

	"github.com/vipgate/vipgate/dataplane/maglev"
)

// This file adds the gateway's consistent-hash DNAT to the model's vocabulary. Its meaning in each
// consumer is the balancing algorithms' jhash-map code (lbalgo.go: encodeJhashMap, jhashMapText and
// traceJhashMapDNAT with the flow hash and the VIP tuple key), which its descriptor in
// kinds_gateway.go gives to the consumers; what is the gateway's own is here: the kind, the seed and
// the slot a flow hashes to (GatewaySlot).

// ActDNATJhashMap is the gateway's consistent-hash DNAT:
//
//	dnat ip addr . port to ip daddr . meta l4proto . th dport .
//	    jhash ip saddr . th sport . ip daddr . th dport mod Value seed GatewayHashSeed map @Map
//	dnat ip6 addr . port to ip6 daddr . meta l4proto . th dport .
//	    jhash ip6 saddr . th sport mod Value seed GatewayHashSeed map @Map
//
// The slot is a Jenkins hash of the flow's addresses and ports, modulo Value (the Maglev table size):
// deterministic, the same on every gateway and in every packet of the flow, so a flow that moves to
// another gateway (ECMP rehash, failover) maps to the same slot there, and through the same Maglev
// table to the same backend. The number 128 is far from model.go's iota range, so kinds added there
// cannot collide with it, and is not 99 or 200, which the render and trace tests use as unknown kinds.
const ActDNATJhashMap ActionKind = 128

// GatewayHashSeed is the jhash seed of ActDNATJhashMap (and of the other jhash rules, lbalgo.go).
// It must be fixed and equal on every gateway: without an explicit seed the kernel draws a random
// one per rule, and two gateways would hash the same flow to different slots. It must be secret
// too, or anyone can pick their flows' slots (and a masqueraded flow's port): a gateway derives it
// from a key the gateways share (maglev.DeriveHashSeed) and sets it with SetGatewayHashSeed before
// its first sync; without a key it stays maglev.DefaultHashSeed. The NAT fast path's program is
// given the same (natpath.Config.HashSeed).
var GatewayHashSeed = maglev.DefaultHashSeed

// SetGatewayHashSeed sets GatewayHashSeed (0: maglev.DefaultHashSeed). Call it once, before the
// first ruleset is built: it is read without a lock.
func SetGatewayHashSeed(seed uint32) {
	if seed == 0 {
		seed = maglev.DefaultHashSeed
	}
	GatewayHashSeed = seed
}

// Payload offset of the transport source port.
func loadSport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
}

// GatewaySlot returns the slot the kernel's flow-hash rules (ActDNATJhashMap, ActDupJhashMap,
// ActDNATProtoPortJhashMap) compute for a flow from src to dst with a table of m slots
// (maglev.FlowSlot: the NAT fast path's BPF program computes the same).
func GatewaySlot(src, dst netip.AddrPort, m uint32) uint32 {
	return maglev.FlowSlot(src, dst, m, GatewayHashSeed)
}
