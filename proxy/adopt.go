package proxy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Adopting a table a previous vipgate left behind.
//
// A restart must not disturb traffic. Replacing the table in one batch is already atomic, but it throws
// away the session-affinity maps (clients would be re-balanced) and rewrites every element. So the
// first sync after a start reads the live table back (decode.go), and when it is a vipgate table whose
// base structure matches, sends only the difference between the live table and the desired one. When
// the table is missing or cannot be decoded, the first sync falls back to the atomic replacement.
//
// Chains an older vipgate named differently (the eTP=Local chains were ext-ip-… and ext-np-…, see
// names.go) need no special case: they are not in the desired table, so adopting creates the chains
// under their new names, replaces the map elements that jump to the old ones (an element's verdict
// is part of it) and then deletes the old chains, all in one transaction (the order of Tx keeps every
// reference valid). The affinity maps, whose chains kept their names, keep their clients.

// TableReader reads a family's table back from the kernel (NetlinkProgrammer implements it).
type TableReader interface {
	ReadTable(f cluster.Family, name string) (*dataplane.Flat, error)
}

// errNoAdopt says the live table cannot be reconciled in place; the caller replaces it instead.
var errNoAdopt = errors.New("live table not adoptable")

// adoptTx computes the transaction that turns the live table into desired. Dynamic sets (session
// affinity) keep their elements: they are state, not configuration.
func adoptTx(live, desired *dataplane.Flat, sets map[string]*dataplane.Set) (*dataplane.Tx, error) {
	tx := &dataplane.Tx{Family: desired.Family, Table: desired.Table, Sets: sets}
	for _, name := range desired.SetOrder {
		ds := desired.Sets[name]
		ls, ok := live.Sets[name]
		switch {
		case !ok:
			tx.AddSets = append(tx.AddSets, ds)
		case ls.Kind != ds.Kind:
			return nil, fmt.Errorf("%w: set %s has another type", errNoAdopt, name)
		case ls.Timeout != ds.Timeout:
			tx.DelSets = append(tx.DelSets, name)
			tx.AddSets = append(tx.AddSets, ds)
		}
	}
	for name := range live.Sets {
		if _, ok := desired.Sets[name]; !ok {
			tx.DelSets = append(tx.DelSets, name)
		}
	}
	for _, name := range desired.ChainOrder {
		dc := desired.Chains[name]
		lc, ok := live.Chains[name]
		switch {
		case !ok:
			tx.AddChains = append(tx.AddChains, dc)
		case lc.Type != dc.Type || lc.Hook != dc.Hook || lc.Priority != dc.Priority:
			return nil, fmt.Errorf("%w: chain %s is hooked differently", errNoAdopt, name)
		case !rulesEqualIgnoringComments(lc.Rules, dc.Rules):
			tx.FlushChains = append(tx.FlushChains, dc)
			// Endpoints that left while vipgate was down: their clients leave the affinity maps.
			tx.Purges = append(tx.Purges, dataplane.AffinityPurges(lc, dc)...)
		}
	}
	for name := range live.Chains {
		if _, ok := desired.Chains[name]; !ok {
			tx.DelChains = append(tx.DelChains, name)
		}
	}
	slices.Sort(tx.DelChains)
	slices.Sort(tx.DelSets)
	for name, ds := range desired.Sets {
		if dataplane.SetKindDynamic(ds.Kind) {
			// State, not configuration (kinds.go): the live elements stay.
			continue
		}
		if ls, ok := live.Sets[name]; ok && ls.Timeout != ds.Timeout {
			// Re-created above: all desired elements go in.
			tx.AddElements = append(tx.AddElements, desired.Elements[name]...)
			continue
		}
		have := make(map[dataplane.Element]struct{}, len(live.Elements[name]))
		for _, e := range live.Elements[name] {
			have[e] = struct{}{}
		}
		for _, e := range desired.Elements[name] {
			if _, ok := have[e]; ok {
				delete(have, e)
				continue
			}
			tx.AddElements = append(tx.AddElements, e)
		}
		for e := range have {
			tx.DelElements = append(tx.DelElements, e)
		}
	}
	return tx, nil
}

func rulesEqualIgnoringComments(a, b []dataplane.Rule) bool {
	return slices.EqualFunc(a, b, func(x, y dataplane.Rule) bool { return x.Action == y.Action && slices.Equal(x.Matches, y.Matches) })
}
