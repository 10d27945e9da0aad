package gateway

import (
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// boolInt is 1 for true, 0 for false: an index into a pair of names.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// filter returns the endpoints of eps that keep accepts (eps itself when it accepts all).
func filter(eps []dataplane.Endpoint, keep func(dataplane.Endpoint) bool) []dataplane.Endpoint {
	for i, e := range eps {
		if !keep(e) {
			out := make([]dataplane.Endpoint, i, len(eps))
			copy(out, eps[:i])
			for _, e := range eps[i+1:] {
				if keep(e) {
					out = append(out, e)
				}
			}
			return out
		}
	}
	return eps
}

// sortServiceKeys sorts keys by namespace, then name.
func sortServiceKeys(keys []cluster.ServiceKey) {
	slices.SortFunc(keys, func(a, b cluster.ServiceKey) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}
