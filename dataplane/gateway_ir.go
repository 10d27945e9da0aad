package dataplane

import (
	"encoding/binary"
	"math/bits"
	"net/netip"

	"github.com/google/nftables/expr"
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

// GatewayHashSeed is the jhash seed of ActDNATJhashMap. It must be fixed and equal on every gateway:
// without an explicit seed the kernel draws a random one per rule, and two gateways would hash the same
// flow to different slots.
const GatewayHashSeed uint32 = 0x76697067 // "vipg"

// Payload offset of the transport source port.
func loadSport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
}

// GatewaySlot returns the slot the kernel's flow-hash rules (ActDNATJhashMap, ActDupJhashMap,
// ActDNATProtoPortJhashMap) compute for a flow from src to dst with a table of m slots: jhash over
// saddr . sport . daddr . dport (IPv4) or saddr . sport (IPv6) as they sit in nftables registers
// (ports in network order, each field padded to 4 bytes), seed GatewayHashSeed, scaled to m the way
// the kernel's nft_jhash does.
func GatewaySlot(src, dst netip.AddrPort, m uint32) uint32 {
	var buf [40]byte
	b := buf[:0]
	port := func(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }
	b = append(b, src.Addr().Unmap().AsSlice()...)
	b = append(b, port(src.Port())...)
	if src.Addr().Unmap().Is4() {
		b = append(b, dst.Addr().Unmap().AsSlice()...)
		b = append(b, port(dst.Port())...)
	}
	h := jhash(b, GatewayHashSeed)
	// reciprocal_scale(h, m) in include/linux/kernel.h.
	return uint32((uint64(h) * uint64(m)) >> 32)
}

// jhash is the kernel's jhash() (include/linux/jhash.h, Bob Jenkins' lookup3), reading 4-byte words
// in the CPU's byte order as the kernel does on the little-endian machines vipgate runs on.
func jhash(k []byte, initval uint32) uint32 {
	const initVal = 0xdeadbeef
	a := initVal + uint32(len(k)) + initval
	b, c := a, a
	rol := bits.RotateLeft32
	for len(k) > 12 {
		a += binary.LittleEndian.Uint32(k[0:])
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a -= c
		a ^= rol(c, 4)
		c += b
		b -= a
		b ^= rol(a, 6)
		a += c
		c -= b
		c ^= rol(b, 8)
		b += a
		a -= c
		a ^= rol(c, 16)
		c += b
		b -= a
		b ^= rol(a, 19)
		a += c
		c -= b
		c ^= rol(b, 4)
		b += a
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	var tail [12]byte
	copy(tail[:], k)
	a += binary.LittleEndian.Uint32(tail[0:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}
