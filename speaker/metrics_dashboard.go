package speaker

import (
	"fmt"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
)

// VIP ownership changes of this node, for the dashboard's failover panels: vipgate_l2_owned_ips (l2)
// says how many VIPs a node answers for now; vipgate_l2_owner_changes_total says how often that set
// changed and why. Summed over the nodes, change="taken",reason="moved" is the cluster's L2 failover
// rate: each move is taken by exactly one node.

// Values of the "change" label.
const (
	OwnerTaken    = "taken"
	OwnerReleased = "released"
)

// Values of the "reason" label: why this node took or released a VIP. A fixed set, so the metric's
// cardinality never depends on the number of VIPs or Services.
const (
	// OwnerReasonNew: taken, and no node announced the VIP in this node's previous decision (a new
	// Service, the first decision after start, an endpoint that came back).
	OwnerReasonNew = "new"
	// OwnerReasonMoved: the VIP moved between this node and another one (a failover, a node back
	// from maintenance, an eTP=Local endpoint that moved).
	OwnerReasonMoved = "moved"
	// OwnerReasonNoOwner: released because no node may announce it now (no endpoint can serve, no
	// live eligible node, this node lost its majority).
	OwnerReasonNoOwner = "no_owner"
	// OwnerReasonNoInterface: released although this node is still the owner: none of the
	// interfaces asked for can announce it (see VIPDecision.Reason).
	OwnerReasonNoInterface = "no_interface"
	// OwnerReasonRemoved: released because the VIP is no longer any Service's LoadBalancer IP. (A
	// VIP whose L2 segment no longer holds this node is no_owner: this node then sees no owner.)
	OwnerReasonRemoved = "removed"
)

// ownerChanges is vipgate_l2_owner_changes_total. It is one per process (one L2 speaker per
// process) and registered on the caller's registry by RegisterOwnerMetrics, never on the global one.
var ownerChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "vipgate_l2_owner_changes_total",
	Help: "LoadBalancer IPs this node took or released for L2 announcement (change: taken, released), by reason (new, moved, no_owner, no_interface, removed).",
}, []string{"change", "reason"})

// RegisterOwnerMetrics registers vipgate_l2_owner_changes_total on reg (the node's registry; never the
// global one). Every change/reason pair is exported from the start at 0, so rate() and increase()
// see the first change.
func RegisterOwnerMetrics(reg prometheus.Registerer) error {
	for _, r := range []string{OwnerReasonNew, OwnerReasonMoved} {
		ownerChanges.WithLabelValues(OwnerTaken, r)
	}
	for _, r := range []string{OwnerReasonMoved, OwnerReasonNoOwner, OwnerReasonNoInterface, OwnerReasonRemoved} {
		ownerChanges.WithLabelValues(OwnerReleased, r)
	}
	if err := reg.Register(ownerChanges); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok && are.ExistingCollector == ownerChanges {
			return nil // the one counter, registered by an earlier speaker of this process
		}
		return fmt.Errorf("registering vipgate_l2_owner_changes_total: %w", err)
	}
	return nil
}

// OwnerChange is one VIP this node took or released between two decisions.
type OwnerChange struct {
	IP     netip.Addr
	Change string // OwnerTaken or OwnerReleased
	Reason string // OwnerReason*
	// Other is the node it moved from or to (reason moved).
	Other string
}

// ownerView is what one decision said about one VIP: its owner and whether this node announces it.
type ownerView struct {
	owner     string
	announced bool
}

func ownerViews(self string, decisions []VIPDecision) map[netip.Addr]ownerView {
	out := make(map[netip.Addr]ownerView, len(decisions))
	for _, d := range decisions {
		// A shared IP has one decision per Service, all with the same owner.
		v := out[d.IP]
		v.owner = d.Owner
		v.announced = v.announced || (d.Owner == self && len(d.Interfaces) > 0)
		out[d.IP] = v
	}
	return out
}

// OwnerChanges compares two successive L2 decisions of node self and returns the VIPs it took and
// released, with why. Pure: the caller keeps prev.
func OwnerChanges(self string, prev, next []VIPDecision) []OwnerChange {
	before, after := ownerViews(self, prev), ownerViews(self, next)
	var out []OwnerChange
	for ip, a := range after {
		b, known := before[ip]
		switch {
		case a.announced && !(known && b.announced):
			c := OwnerChange{IP: ip, Change: OwnerTaken, Reason: OwnerReasonNew}
			if known && b.owner != "" && b.owner != self {
				c.Reason, c.Other = OwnerReasonMoved, b.owner
			}
			out = append(out, c)
		case !a.announced && known && b.announced:
			c := OwnerChange{IP: ip, Change: OwnerReleased}
			switch a.owner {
			case "":
				c.Reason = OwnerReasonNoOwner
			case self:
				c.Reason = OwnerReasonNoInterface
			default:
				c.Reason, c.Other = OwnerReasonMoved, a.owner
			}
			out = append(out, c)
		}
	}
	for ip, b := range before {
		if _, still := after[ip]; !still && b.announced {
			out = append(out, OwnerChange{IP: ip, Change: OwnerReleased, Reason: OwnerReasonRemoved})
		}
	}
	return out
}

// observeOwners counts the owner changes between the previous DecideL2 call with c and this one
// (vipgate_l2_owner_changes_total); the cache keeps the previous decisions, as it is the caller's
// state across calls. A nil cache (a one-off decision, e.g. for explain) has no previous call and
// counts nothing.
func (c *OwnerCache) observeOwners(self string, decisions []VIPDecision) {
	if c == nil {
		return
	}
	prev := c.last
	c.last = decisions
	for _, ch := range OwnerChanges(self, prev, decisions) {
		ownerChanges.WithLabelValues(ch.Change, ch.Reason).Inc()
	}
}
