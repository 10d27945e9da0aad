package dataplane

import (
	"fmt"
	"testing"

	"github.com/vipgate/vipgate/cluster"
)

// TestNetlinkVerdictMapChunks: a verdict map with thousands of elements whose chains have long names
// is sent in element lists that each stay under the 64 KiB attribute limit. When the chain names
// were left out of the size estimate, a list of ~1,000 such elements wrapped the 16-bit attribute
// length and the whole batch failed with ENOENT (first seen as a full sync of 14,300 Services).
func TestNetlinkVerdictMapChunks(t *testing.T) {
	_, fd := testNetns(t)
	tx := &Tx{Family: cluster.IPv4, Table: "vipgate", Full: true, Sets: map[string]*Set{}}
	vmap := &Set{Name: MapServiceNodePorts, Kind: KindProtoPortVmap}
	tx.AddSets = append(tx.AddSets, vmap)
	tx.Sets[vmap.Name] = vmap
	const chains, elements = 50, 2700
	for i := 0; i < chains; i++ {
		tx.AddChains = append(tx.AddChains, &Chain{Name: fmt.Sprintf("external-%02d-a-rather-long-namespace/and-a-long-service-name-tcp", i)})
	}
	for i := 0; i < elements; i++ {
		tx.AddElements = append(tx.AddElements, Element{Set: vmap.Name, Proto: ProtoTCP, Port: uint16(30000 + i),
			Verdict: VerdictGoto, Chain: tx.AddChains[i%chains].Name})
	}
	prog := &NetlinkProgrammer{NetNSFd: fd}
	if err := prog.Apply(tx); err != nil {
		t.Fatalf("%d verdict elements to chains with %d-byte names: %v", elements, len(tx.AddChains[0].Name), err)
	}
	// A wrapped list length can also drop elements silently: count them in the kernel.
	kt, err := prog.ReadKernelTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(kt.Elements[vmap.Name]); got != elements {
		t.Errorf("the kernel holds %d of the %d elements", got, elements)
	}
}
