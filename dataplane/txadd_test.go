package dataplane

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// TestFullSyncAddedElements: a full sync's transaction lists the parts it adds (addParts) instead of
// their elements, and AddedElements yields exactly what the elements used to be: every part's
// elements in the order of the diff, each element of a sharable set once (at its first part).
func TestFullSyncAddedElements(t *testing.T) {
	st := dualStackState(60, 4)
	capture := &txCapture{}
	p := NewProxier(hclog.NewNullLogger(), testConfig(), capture)
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	if len(capture.txs) != 2 {
		t.Fatalf("want 2 transactions, got %d", len(capture.txs))
	}
	for _, tx := range capture.txs {
		if !tx.Full || len(tx.AddElements) != 0 || len(tx.addParts) == 0 {
			t.Fatalf("IPv%d: want a full transaction of parts, got %s with %d elements, %d parts",
				tx.Family, tx, len(tx.AddElements), len(tx.addParts))
		}
		got := slices.Collect(tx.AddedElements())
		if len(got) != tx.NumAddElements() {
			t.Errorf("IPv%d: AddedElements yields %d, NumAddElements says %d", tx.Family, len(got), tx.NumAddElements())
		}
		// The same parts diffed the way incremental syncs do (elements listed, counted in a map).
		eager := &diffState{tx: &Tx{}, elemRefs: map[Element]int{}, sharedRefs: map[string]int{},
			sharedDelta: map[string]int{}, sets: map[string]*Set{}}
		for _, ap := range tx.addParts {
			eager.diffPart(nil, ap.p)
		}
		if !slices.Equal(got, eager.tx.AddElements) {
			t.Fatalf("IPv%d: AddedElements (%d) differs from the listed elements (%d)", tx.Family, len(got), len(eager.tx.AddElements))
		}
		// And they are the table's elements, each once.
		want := map[Element]bool{}
		for _, els := range p.Flatten(tx.Family).Elements {
			for _, e := range els {
				want[e] = true
			}
		}
		seen := map[Element]bool{}
		for _, e := range got {
			if seen[e] {
				t.Errorf("IPv%d: %+v added twice", tx.Family, e)
			}
			seen[e] = true
			if !want[e] {
				t.Errorf("IPv%d: %+v added but not in the table", tx.Family, e)
			}
		}
		if len(seen) != len(want) {
			t.Errorf("IPv%d: %d elements added, the table has %d", tx.Family, len(seen), len(want))
		}
		// Stopping early stops.
		n := 0
		for range tx.AddedElements() {
			if n++; n == 3 {
				break
			}
		}
	}
}

// TestAddedElementsSkips: the duplicates a part lists are left out, the others kept in order.
func TestAddedElementsSkips(t *testing.T) {
	a := Element{Set: SetClusterIPs, Addr: netip.MustParseAddr("10.96.0.1")}
	b := Element{Set: SetClusterIPs, Addr: netip.MustParseAddr("10.96.0.2")}
	c := Element{Set: MapServiceIPs, Addr: netip.MustParseAddr("10.96.0.2"), Proto: ProtoTCP, Port: 80, Verdict: VerdictGoto, Chain: "svc-x"}
	p1 := &Part{Elements: []Element{a, c}}
	p2 := &Part{Elements: []Element{a, b, c}} // a is p1's: a duplicate
	p2.pack()
	d := &diffState{tx: &Tx{Full: true}, refs: newElementRefs(0), sharedRefs: map[string]int{},
		sharedDelta: map[string]int{}, sets: map[string]*Set{}, lazyAdds: true}
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

// TestNetlinkFullSyncChunks: a full sync whose batch spans several chunks of wire bytes (sent as one
// I/O vector) is one transaction that programs exactly the model.
func TestNetlinkFullSyncChunks(t *testing.T) {
	_, fd := testNetns(t)
	st := SyntheticState(1500, 10)
	prog := &NetlinkProgrammer{NetNSFd: fd}
	capture := &txCapture{}
	p := NewProxier(hclog.NewNullLogger(), ipv4Config(), capture)
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	tx := capture.txs[0]
	b, err := newBatch(tx.Family, tx.Table)
	if err != nil {
		t.Fatal(err)
	}
	if err := newEncoder(tx, b).encode(tx); err != nil {
		t.Fatal(err)
	}
	if len(b.chunks) < 3 {
		t.Fatalf("the batch of 1,500 Services is %d chunks; the test wants several", len(b.chunks))
	}
	if err := prog.Apply(tx); err != nil {
		t.Fatal(err)
	}
	got, err := prog.ReadTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if ok, diff := FlatEqual(p.Flatten(cluster.IPv4), got); !ok {
		t.Fatalf("decode(program(model)) != model: %s", diff)
	}
}
