package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
)

// The engine's API for the gateway (gateway/): what its ruleset building, proxier and flow copies
// use of the engine besides the model types. The gateway builds Parts, Chains, Rules, Sets and
// Elements of its own kinds (kinds_gateway.go, gateway_*.go here) and programs them through a
// Programmer; the diff and the netlink encoding stay here.

// TableString names family f's table for errors and logs ("IPv4 table vipgate", "netdev table
// vipgate-fwd4").
func TableString(f cluster.Family, table string) string {
	return txTableName(&Tx{Family: f, Table: table})
}

// DiffRulesets adds to tx what turns table old (nil: an empty table) into nw: the base first, then
// each Service's part in key order. sets holds the table's sets by name as the kernel has them
// (old's; the diff updates it to nw's) and becomes tx.Sets. changed, if not nil, is called for each
// Service whose part changed (not for those nw reuses from old), old or new nil when it came or went.
func DiffRulesets(old, nw *Ruleset, sets map[string]*Set, tx *Tx, changed func(k cluster.ServiceKey, old, new *Part)) {
	d := &diffState{tx: tx, elemRefs: map[Element]int{}, sharedRefs: map[string]int{}, sharedDelta: map[string]int{}, sets: sets}
	var oldBase *Part
	oldSvcs := map[cluster.ServiceKey]*Part{}
	if old != nil {
		oldBase, oldSvcs = old.Base, old.Services
	}
	d.diffPart(oldBase, nw.Base)
	keys := make([]cluster.ServiceKey, 0, len(oldSvcs)+len(nw.Services))
	for k := range oldSvcs {
		keys = append(keys, k)
	}
	for k := range nw.Services {
		if oldSvcs[k] == nil {
			keys = append(keys, k)
		}
	}
	sortServiceKeys(keys)
	for _, k := range keys {
		o, n := oldSvcs[k], nw.Services[k]
		if o == n {
			continue // reused: nothing changed
		}
		d.diffPart(o, n)
		if changed != nil {
			changed(k, o, n)
		}
	}
	d.finish()
	tx.Sets = sets
}

// IsNetdev says whether f is a netdev family (NetdevFamily), IPFamily the IP family it is of (f
// itself for an IP family).
func IsNetdev(f cluster.Family) bool { return isNetdev(f) }

// IPFamily is the IP family of f, a family or NetdevFamily of one.
func IPFamily(f cluster.Family) cluster.Family { return ipFamily(f) }

// FlowCopyBatch is the number of gateway-flows entries a GatewayFlowWriter should be given per Add
// (one kernel transaction; see flowCopyMsg).
const FlowCopyBatch = flowCopyBatch

// FlowKeyLen is the length of a gateway-flows key of family f in the kernel.
func FlowKeyLen(f cluster.Family) int { return flowKeyLen(f) }

// ClashedFlows says, of an error of GatewayFlowWriter.Add, which of the flows the kernel refused
// because the map holds them with another node (by index in the Add; the first of each netlink
// message that held one), and whether err is such a refusal at all.
func ClashedFlows(err error) ([]int, bool) {
	if clash := (*flowClashError)(nil); errors.As(err, &clash) {
		return clash.at, true
	}
	return nil, false
}

// InterfaceIndexIn returns the interface index lookup of network namespace nsFd (0: the current
// one), the one the encoder uses for fwd devices (NetlinkProgrammer.NetNSFd).
func InterfaceIndexIn(nsFd int) func(string) (int, error) { return ifindexIn(nsFd) }

// FamilyRanges returns the prefixes of family f in ranges.
func FamilyRanges(ranges []netip.Prefix, f cluster.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range ranges {
		if familyOfPrefix(r) == f {
			out = append(out, r)
		}
	}
	return out
}

// EntriesOverLimit says why a Service of entries entries (its ports x its addresses; ports ports) is
// over limits.MaxEntries, "" if it is not. Nodes and gateways refuse such a Service as a whole.
func EntriesOverLimit(limits cluster.ServiceLimits, entries, ports int) string {
	if entries <= limits.MaxEntries {
		return ""
	}
	return fmt.Sprintf("the Service is not programmed: its %d ports make %d entries (ports x addresses), more than serviceLimits.maxEntries %d",
		ports, entries, limits.MaxEntries)
}
