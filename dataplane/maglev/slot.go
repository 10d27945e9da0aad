package maglev

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// DefaultHashSeed is the seed of the flow hash that picks a flow's slot (FlowSlot) when the
// gateways share no key to derive one from (DeriveHashSeed). The seed must be fixed and equal on
// every gateway: without an explicit seed the kernel draws a random one per nftables rule, and two
// gateways would hash the same flow to different slots. This one is public: anyone can compute
// which slot, backend and masquerade port a flow of theirs gets, and pick their source ports to
// land on someone else's (docs/gateway.md, "Several gateways").
const DefaultHashSeed uint32 = 0x76697067 // "vipg"

// hashSeedLabel is the HKDF info of DeriveHashSeed: a seed derived from a key never equals
// anything else derived from the same key (the membership's MACs).
const hashSeedLabel = "vipgate flow hash seed v1"

// DeriveHashSeed derives the flow hash's seed from a key the gateways share (HKDF-SHA256 with a
// label of its own): secret as long as the key is, equal on every gateway that holds it. Never 0,
// which nftables reads as "draw one at random".
func DeriveHashSeed(key []byte) uint32 {
	out, err := hkdf.Key(sha256.New, key, nil, hashSeedLabel, 4)
	if err != nil {
		panic(err) // only for lengths beyond 255 hashes
	}
	return max(binary.LittleEndian.Uint32(out), 1)
}

// FlowSlot returns the slot of a table of m slots that a flow from src to dst takes with seed,
// as the kernel's nftables rules compute it (`jhash ip saddr . th sport . ip daddr . th dport mod
// m seed <seed>`; IPv6: `jhash ip6 saddr . th sport`) and the gateway's NAT fast path (its BPF
// program) too: Jhash over the fields as they sit in nftables registers (ports in network order,
// each field padded to 4 bytes), scaled to m the way nft_jhash does.
func FlowSlot(src, dst netip.AddrPort, m, seed uint32) uint32 {
	var buf [40]byte
	b := buf[:0]
	port := func(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }
	b = append(b, src.Addr().Unmap().AsSlice()...)
	b = append(b, port(src.Port())...)
	if src.Addr().Unmap().Is4() {
		b = append(b, dst.Addr().Unmap().AsSlice()...)
		b = append(b, port(dst.Port())...)
	}
	return Scale(Jhash(b, seed), m)
}

// Scale is the kernel's reciprocal_scale(h, m) (include/linux/math.h): h scaled into [0, m).
func Scale(h, m uint32) uint32 {
	return uint32((uint64(h) * uint64(m)) >> 32)
}

// Jhash is the kernel's jhash() (include/linux/jhash.h, Bob Jenkins' lookup3), reading 4-byte words
// in the CPU's byte order as the kernel does on the little-endian machines vipgate runs on.
func Jhash(k []byte, initval uint32) uint32 {
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
