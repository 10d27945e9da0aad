package dataplane

import (
	"net/netip"
	"slices"
	"testing"
)

// TestAddedElementsSkips: the duplicates a part lists are left out, the others kept in order.
func TestAddedElementsSkips(t *testing.T) {
	a := Element{Set: SetClusterIPs, Addr: netip.MustParseAddr("10.96.0.1")}
	b := Element{Set: SetClusterIPs, Addr: netip.MustParseAddr("10.96.0.2")}
	c := Element{Set: MapServiceIPs, Addr: netip.MustParseAddr("10.96.0.2"), Proto: ProtoTCP, Port: 80, Verdict: VerdictGoto, Chain: "svc-x"}
	p1 := &Part{Elements: []Element{a, c}}
	p2 := &Part{Elements: []Element{a, b, c}} // a is p1's: a duplicate
	p2.Pack()
	d := &diffState{tx: &Tx{Full: true}, refs: newElementRefs(0), sharedRefs: map[string]int{},
		sharedDelta: map[string]int{}, sets: map[string]*Set{}, lazyAdds: true, sharable: map[string]bool{SetClusterIPs: true}}
	d.diffPart(nil, p1)
	d.diffPart(nil, p2)
	got := slices.Collect(d.tx.AddedElements())
	if want := []Element{a, c, b, c}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if d.tx.NumAddElements() != 4 || d.tx.Empty() {
		t.Fatalf("NumAddElements %d, Empty %v", d.tx.NumAddElements(), d.tx.Empty())
	}
}
