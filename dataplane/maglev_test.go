package dataplane

import (
	"net/netip"
	"slices"
	"testing"
)

// GatewaySlot must be a pure function of the flow (the same on every gateway) and spread flows over
// the slots.
func TestGatewaySlotSpread(t *testing.T) {
	dst := netip.MustParseAddrPort("203.0.113.50:80")
	counts := make([]int, 251)
	for sport := 1024; sport < 1024+25100; sport++ {
		s := GatewaySlot(netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), uint16(sport)), dst, 251)
		if s >= 251 {
			t.Fatalf("slot %d out of range", s)
		}
		counts[s]++
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	t.Logf("25,100 source ports over 251 slots: %d..%d per slot (ideal 100)", lo, hi)
	if lo < 50 || hi > 150 {
		t.Errorf("slot counts %d..%d: the hash does not spread flows", lo, hi)
	}
	a := GatewaySlot(netip.MustParseAddrPort("198.51.100.10:40000"), dst, 1021)
	b := GatewaySlot(netip.MustParseAddrPort("198.51.100.10:40000"), dst, 1021)
	if a != b {
		t.Errorf("GatewaySlot is not deterministic: %d, %d", a, b)
	}
}
