package speaker

import (
	"cmp"
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// Ordered drain (issue #32; metallb#2677, antrea#8355): a node that is about to go away hands its
// VIPs over before it stops announcing them, instead of leaving a gap until the others notice it
// is gone (L2: the membership's DeadAfter) or routers time its session out.
//
// A node drains while it is cordoned (spec.unschedulable), annotated or labelled vipgate.io/drain
// (a value other than "false"), to be deleted (cluster.Node.ToBeDeleted) — NodeDrain, read from
// every State — or once its agent got SIGTERM (Controller.Drain: a DaemonSet pod deleted, and the
// kubelet's graceful node shutdown, which terminates pods with SIGTERM). While it drains:
//
//   - L2: it is not willing (Membership.SetWilling(false)): its heartbeats, sent at once, say it is
//     not ready, so the other members pick new owners for its VIPs and announce them (gratuitous
//     ARP / unsolicited NA). It keeps answering the VIPs it owned for L2DrainOverlap after that, so
//     the hand-over overlaps instead of leaving a gap, then stops.
//   - BGP (cordon, annotation, deletion): its routes are sent again with the GRACEFUL_SHUTDOWN
//     community (RFC 8326) for BGPDrain (DefaultBGPDrainGrace if 0), so routers move traffic to
//     other paths while this node still forwards, then withdrawn; the sessions stay up. On SIGTERM
//     alone BGP is left to Stop as before: --bgp-shutdown-drain's GRACEFUL_SHUTDOWN then
//     withdrawal, or without it the routes are kept for graceful restart (an upgrade).
//
// It announces again once the drain ends (uncordoned, annotation removed); after SIGTERM it never
// does.

// DrainAnnotation, as a Node annotation or label with a value other than "false", drains the node
// (gateway.DrainLabel: the gateways' connection table drains the same nodes).
const DrainAnnotation = "vipgate.io/drain"

// DefaultL2DrainOverlap is how long a draining node keeps answering its L2 VIPs after telling the
// other members it is not ready: ten heartbeats (100 ms), so that a lost heartbeat or two still
// leaves the new owner time to announce.
const DefaultL2DrainOverlap = time.Second

// DefaultBGPDrainGrace is how long a drained node's routes carry GRACEFUL_SHUTDOWN before they are
// withdrawn when ControllerOptions.BGPDrain is 0.
const DefaultBGPDrainGrace = 5 * time.Second

// NodeDrain says why node n drains ("" if it does not): cordoned, vipgate.io/drain, or going away.
func NodeDrain(n *cluster.Node) string {
	switch {
	case n == nil:
		return ""
	case n.Unschedulable:
		return "cordoned (spec.unschedulable)"
	case n.ToBeDeleted:
		return "the Node is being deleted"
	}
	if v, ok := n.Annotations[DrainAnnotation]; ok && v != "false" {
		return "annotated " + DrainAnnotation
	}
	if v, ok := n.Labels[DrainAnnotation]; ok && v != "false" {
		return "labelled " + DrainAnnotation
	}
	return ""
}

// BGPDrainPhase is where a node's BGP routes are in a drain.
type BGPDrainPhase int

const (
	// BGPAnnounced: not draining, routes as decided.
	BGPAnnounced BGPDrainPhase = iota
	// BGPGracefulShutdown: routes announced with GRACEFUL_SHUTDOWN.
	BGPGracefulShutdown
	// BGPWithdrawn: no routes.
	BGPWithdrawn
)

// DrainBGP is what a node in phase p announces of DecideBGP's advertisements and decisions: as
// they are, with GRACEFUL_SHUTDOWN added, or nothing (this node's decisions then say why). It
// does not modify its arguments.
func DrainBGP(p BGPDrainPhase, self string, ads []bgp.Advertisement, decisions []VIPDecision) ([]bgp.Advertisement, []VIPDecision) {
	switch p {
	case BGPGracefulShutdown:
		out := make([]bgp.Advertisement, len(ads))
		for i, a := range ads {
			a.Communities = append(slices.Clone(a.Communities), bgp.GracefulShutdownCommunity)
			slices.Sort(a.Communities)
			a.Communities = slices.Compact(a.Communities)
			out[i] = a
		}
		ds := slices.Clone(decisions)
		for i := range ds {
			if ds[i].Owner == self {
				ds[i].Reason += "; draining: announced with GRACEFUL_SHUTDOWN before the withdrawal"
			}
		}
		return out, ds
	case BGPWithdrawn:
		ds := slices.Clone(decisions)
		for i := range ds {
			if ds[i].Owner == self {
				ds[i].Owner = ""
				ds[i].Reason = "not announced: this node is draining"
			}
		}
		return nil, ds
	}
	return ads, decisions
}

// HoldOwned is what a draining node answers in the overlap: the VIPs it owns now and those it
// owned when the drain began (held), on the interfaces of now where it has them.
func HoldOwned(now, held map[netip.Addr]L2Where) map[netip.Addr]L2Where {
	out := maps.Clone(held)
	if out == nil {
		out = map[netip.Addr]L2Where{}
	}
	maps.Copy(out, now)
	return out
}

// drainState is the Controller's drain, under its mu.
type drainState struct {
	// sigterm is set by Drain, node is NodeDrain of the last State.
	sigterm bool
	node    string
	active  bool
	// lastOwned is the last L2 set handed over while not draining; held is that set when the drain
	// began, answered until holdUntil.
	lastOwned map[netip.Addr]L2Where
	held      map[netip.Addr]L2Where
	holdUntil time.Time
	holdTimer *time.Timer
	bgp       BGPDrainPhase
	bgpTimer  *time.Timer
}

// reason says why the node drains.
func (d *drainState) reason() string {
	if d.sigterm {
		return "SIGTERM"
	}
	return d.node
}

// updateDrainLocked starts or ends the drain from sigterm and node as they are now, and moves BGP
// to the phase they ask for. It reports whether the node's willingness changed (the caller tells
// the membership, outside mu). Called with c.mu held.
func (c *Controller) updateDrainLocked(now time.Time) (willingChanged bool) {
	d := &c.drain
	active := d.sigterm || d.node != ""
	if active != d.active {
		d.active, willingChanged = active, true
		if d.holdTimer != nil {
			d.holdTimer.Stop()
			d.holdTimer = nil
		}
		d.held, d.holdUntil = nil, time.Time{}
		if active {
			overlap := cmp.Or(c.opts.L2DrainOverlap, DefaultL2DrainOverlap)
			c.log.Info("draining: the other members take this node's L2 VIPs over, then it stops answering them",
				"reason", d.reason(), "l2_vips", len(d.lastOwned), "overlap", overlap)
			if len(d.lastOwned) > 0 {
				d.held, d.holdUntil = d.lastOwned, now.Add(overlap)
				// Decide again once the overlap is over: the held VIPs are let go then.
				d.holdTimer = time.AfterFunc(overlap, c.Recompute)
			}
		} else {
			c.log.Info("drain over: this node is an L2 candidate again")
		}
	}
	// BGP drains for the Node's drain only: on SIGTERM alone Stop decides (graceful restart or
	// --bgp-shutdown-drain).
	switch {
	case d.node != "" && d.bgp == BGPAnnounced:
		if d.bgpTimer != nil {
			d.bgpTimer.Stop()
			d.bgpTimer = nil
		}
		if c.bgp == nil {
			d.bgp = BGPWithdrawn // nothing announced yet: nothing to move traffic off
			break
		}
		grace := cmp.Or(c.opts.BGPDrain, DefaultBGPDrainGrace)
		d.bgp = BGPGracefulShutdown
		c.log.Info("draining: BGP routes announced with GRACEFUL_SHUTDOWN, withdrawn after the grace", "reason", d.node, "grace", grace)
		d.bgpTimer = time.AfterFunc(grace, c.withdrawDrained)
	case d.node == "" && d.bgp != BGPAnnounced:
		if d.bgpTimer != nil {
			d.bgpTimer.Stop()
			d.bgpTimer = nil
		}
		d.bgp = BGPAnnounced
		c.log.Info("drain over: BGP routes announced again")
	}
	return willingChanged
}

// withdrawDrained ends the GRACEFUL_SHUTDOWN grace: the routes are withdrawn.
func (c *Controller) withdrawDrained() {
	c.mu.Lock()
	if c.drain.bgp != BGPGracefulShutdown || c.stopped {
		c.mu.Unlock()
		return
	}
	c.drain.bgp = BGPWithdrawn
	st := c.st
	c.mu.Unlock()
	c.log.Info("draining: BGP routes withdrawn")
	c.updateBGP(st)
}

// drainOwnedLocked is the L2 set to hand over: owned as decided, plus while the drain's overlap
// lasts the VIPs this node owned when it began. Called with c.mu held.
func (c *Controller) drainOwnedLocked(owned map[netip.Addr]L2Where, now time.Time) map[netip.Addr]L2Where {
	d := &c.drain
	if !d.active {
		d.lastOwned = owned
		return owned
	}
	if len(d.held) > 0 && now.Before(d.holdUntil) {
		return HoldOwned(owned, d.held)
	}
	d.held = nil
	return owned
}

// drainWarningsLocked is what Warnings says of a drain. Called with c.mu held.
func (c *Controller) drainWarningsLocked() []string {
	if !c.drain.active {
		return nil
	}
	return []string{"draining (" + c.drain.reason() + "): no L2 VIP owned here; BGP routes " +
		map[BGPDrainPhase]string{BGPAnnounced: "kept until the agent stops", BGPGracefulShutdown: "with GRACEFUL_SHUTDOWN", BGPWithdrawn: "withdrawn"}[c.drain.bgp]}
}

// Draining says whether this node drains now and why.
func (c *Controller) Draining() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drain.active, c.drain.reason()
}

// Drain drains the node for good (SIGTERM): the other members take its L2 VIPs over and it keeps
// answering them for the overlap, then stops. It returns when the overlap is over or ctx ends;
// call Stop after it. BGP is left to Stop (ControllerOptions.BGPDrain).
func (c *Controller) Drain(ctx context.Context) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.drain.sigterm = true
	changed := c.updateDrainLocked(time.Now())
	until := c.drain.holdUntil
	c.mu.Unlock()
	if changed && c.opts.Members != nil {
		c.opts.Members.SetWilling(false)
	}
	c.Recompute()
	if wait := time.Until(until); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	c.Recompute()
	c.log.Info("drained: L2 VIPs handed over")
}
