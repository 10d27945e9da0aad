package gateway

import (
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// boolInt is 1 for true, 0 for false: an index into a pair of names.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
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
