package proxy

import (
	"maps"
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
		c, ok := ParseChainName(n)
		if !ok || c.Role != ChainRolePick || c.Algorithm == cluster.LBMaglev {
			continue
		}
		for _, size := range []int{c.Size - 1, c.Size + 1} {
			name := PickChainFor(c.Algorithm, c.Map, size)
			if _, exists := shared[name]; !exists && size > 0 && !slices.Contains(add, name) {
				add = append(add, name)
			}
		}
	}
	slices.Sort(add)
	return add
}

// WithoutUnusedPickers returns f without the shared picker chains no element or rule leads to (a
// masquerading picker that is not used keeps its picker unused too): what an incrementally synced
// table and a fresh build of the same State may differ by, by design. A picker that falls out of use
// stays in the table (taking it out and adding it back would make the kernel bind its maps again),
// and a full sync adds the neighbouring pickers (neighbourPickers), unused. Unused, they change no
// packet's path. Tests compare tables through it.
func WithoutUnusedPickers(f *dataplane.Flat) *dataplane.Flat {
	out := *f
	out.Chains = maps.Clone(f.Chains)
	for {
		used := map[string]bool{}
		for _, els := range out.Elements {
			for _, e := range els {
				used[e.Chain] = true
			}
		}
		for _, c := range out.Chains {
			for _, r := range c.Rules {
				used[r.Action.Chain] = true
			}
		}
		removed := false
		for n := range out.Chains {
			if c, ok := ParseChainName(n); ok && (c.Role == ChainRolePick || c.Role == ChainRoleMasqPick) && !used[n] {
				delete(out.Chains, n)
				removed = true
			}
		}
		if !removed {
			break
		}
	}
	out.ChainOrder = slices.DeleteFunc(slices.Clone(f.ChainOrder), func(n string) bool { return out.Chains[n] == nil })
	return &out
}
