package proxy

import (
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// neighbourPickers names, for a full sync, the pickers of one endpoint fewer and one more than those
// in use (shared: the shared chains' reference counts; random and source-hash pickers: a Maglev
// picker's size is its table's, not a count), to be added unused (dataplane.DiffOptions.Neighbours):
// at reference count 0, as a picker that fell out of use. A picker added later binds its endpoint
// map in a transaction of its own, and binding a map makes the kernel walk all of its elements
// (nf_tables_bind_set: ~15 ms for the ~146,000 of 10,000 Services, measured 2026-11-25), paid by
// the change that needed the new count — with every Service at 10 endpoints after a full sync,
// the first endpoint removed. In a transaction the chains come before the elements (dataplane.Tx),
// so the maps are bound while empty. A rolling update moves a Service's count one at a time. Each
// picker is one more binding of its map, which the kernel charges per element added (a few here,
// not per Service).
func neighbourPickers(shared map[string]int) []string {
	var add []string
	for n := range shared {
		c, ok := dataplane.ParseChainName(n)
		if !ok || c.Role != dataplane.ChainRolePick || c.Algorithm == cluster.LBMaglev {
			continue
		}
		for _, size := range []int{c.Size - 1, c.Size + 1} {
			name := dataplane.PickChainFor(c.Algorithm, c.Map, size)
			if _, exists := shared[name]; !exists && size > 0 && !slices.Contains(add, name) {
				add = append(add, name)
			}
		}
	}
	slices.Sort(add)
	return add
}
