package dataplane

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

func sortServiceKeys(keys []cluster.ServiceKey) {
	slices.SortFunc(keys, func(a, b cluster.ServiceKey) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

func sortStrings(s []string) { slices.Sort(s) }

func familyOfPrefix(p netip.Prefix) cluster.Family { return cluster.FamilyOf(p.Addr()) }
