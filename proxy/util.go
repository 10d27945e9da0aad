package proxy

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// sortServiceKeys sorts keys by namespace, then name.
func sortServiceKeys(keys []cluster.ServiceKey) {
	slices.SortFunc(keys, func(a, b cluster.ServiceKey) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

func familyOfPrefix(p netip.Prefix) cluster.Family { return cluster.FamilyOf(p.Addr()) }
