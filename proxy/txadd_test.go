package proxy

import (
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestFullSyncAddedElements: a full sync's transaction lists the parts it adds (Tx.AddedParts) instead of
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
		if !tx.Full || len(tx.AddElements) != 0 || len(tx.AddedParts()) == 0 {
			t.Fatalf("IPv%d: want a full transaction of parts, got %s with %d elements, %d parts",
				tx.Family, tx, len(tx.AddElements), len(tx.AddedParts()))
		}
		got := slices.Collect(tx.AddedElements())
		if len(got) != tx.NumAddElements() {
			t.Errorf("IPv%d: AddedElements yields %d, NumAddElements says %d", tx.Family, len(got), tx.NumAddElements())
		}
		// The same parts diffed the way incremental syncs do (elements listed, counted in a map).
		eagerTx := &dataplane.Tx{}
		eager := dataplane.NewDiff(eagerTx, dataplane.DiffOptions{Sharable: sharableSets})
		for _, part := range tx.AddedParts() {
			eager.Part(nil, part)
		}
		if !slices.Equal(got, eagerTx.AddElements) {
			t.Fatalf("IPv%d: AddedElements (%d) differs from the listed elements (%d)", tx.Family, len(got), len(eagerTx.AddElements))
		}
		// And they are the table's elements, each once.
		want := map[dataplane.Element]bool{}
		for _, els := range p.Flatten(tx.Family).Elements {
			for _, e := range els {
				want[e] = true
			}
		}
		seen := map[dataplane.Element]bool{}
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

// TestNetlinkFullSyncChunks: a full sync whose batch spans several chunks of wire bytes (sent as one
// I/O vector) is one transaction that programs exactly the model.
func TestNetlinkFullSyncChunks(t *testing.T) {
	_, fd := testNetns(t)
	st := SyntheticState(1500, 10)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	capture := &txCapture{}
	p := NewProxier(hclog.NewNullLogger(), ipv4Config(), capture)
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	tx := capture.txs[0]
	_, chunks, err := dataplane.EncodedSize(tx)
	if err != nil {
		t.Fatal(err)
	}
	if chunks < 3 {
		t.Fatalf("the batch of 1,500 Services is %d chunks; the test wants several", chunks)
	}
	if err := prog.Apply(tx); err != nil {
		t.Fatal(err)
	}
	got, err := prog.ReadTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if ok, diff := dataplane.FlatEqual(p.Flatten(cluster.IPv4), got); !ok {
		t.Fatalf("decode(program(model)) != model: %s", diff)
	}
}
