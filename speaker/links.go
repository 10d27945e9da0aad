package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/cluster"
)

// Link-aware ownership (issue #32; cilium#35507, metallb#2026): a node whose announcing interface
// lost its carrier kept its L2 VIPs while its heartbeats still flowed on another NIC, and the
// LAN's traffic for them went nowhere. Now a node withdraws from an L2 segment while an interface
// it would announce one of the segment's VIPs on is down, and comes back only after the link has
// been up for a hold-down (LinkHold): it stays a voter in the segment's majority, but is no
// candidate there — its own view at once, the other members' as soon as its next heartbeat (sent
// at once) says it is not ready (Membership.SetWithdrawn). Pure: the Controller reads the links
// (l2.LinkStates, on every netlink link update and every resync) and hands the result over.

// DefaultLinkHoldDown is how long a link must stay up after it was down before this node takes
// the VIPs announced on it back (ControllerOptions.LinkHoldDown's default).
const DefaultLinkHoldDown = 3 * time.Second

// LinkState is one interface of this host and whether it can carry the LAN's traffic
// (l2.LinkStates): Up is administratively up with carrier (IFF_UP and IFF_RUNNING, operstate up
// or unknown).
type LinkState struct {
	Name     string
	Up       bool
	Prefixes []netip.Prefix
}

// LinkHold applies the hold-down to the links as read (Observe): a link is usable while it is up
// and, if it was seen down before, has been up for HoldDown since. A link seen for the first time
// up is usable at once (a starting node does not wait), and a link that went away is forgotten
// (pods' veths come and go). It remembers a link's last prefixes while it is down (the kernel drops
// IPv6 addresses of a link set down), so the VIPs of its subnet are still known to need it. Not
// safe for concurrent use: the Controller owns it.
type LinkHold struct {
	HoldDown time.Duration
	links    map[string]*heldLink
}

type heldLink struct {
	up bool
	// usableAt is when the link, up since its last down, is usable.
	usableAt time.Time
	prefixes []netip.Prefix
}

// Down records that name was seen down at now (a netlink update), so that a down and up too quick
// for a read of the links in between still restarts the hold-down.
func (h *LinkHold) Down(name string) {
	if l := h.links[name]; l != nil {
		l.up = false
	}
}

// Observe takes the links as read at now. It returns them with Up meaning "usable" (up, hold-down
// over) and their remembered prefixes, why each unusable one is not usable, and when the next
// hold-down ends (zero if none runs).
func (h *LinkHold) Observe(states []LinkState, now time.Time) (links []LinkState, why map[string]string, next time.Time) {
	if h.links == nil {
		h.links = map[string]*heldLink{}
	}
	seen := make(map[string]bool, len(states))
	for _, s := range states {
		seen[s.Name] = true
		l := h.links[s.Name]
		switch {
		case l == nil:
			l = &heldLink{up: s.Up, usableAt: now}
			h.links[s.Name] = l
		case s.Up && !l.up:
			l.up, l.usableAt = true, now.Add(h.HoldDown)
		case !s.Up:
			l.up = false
		}
		if len(s.Prefixes) > 0 {
			l.prefixes = slices.Clone(s.Prefixes)
		}
	}
	for n := range h.links {
		if !seen[n] {
			delete(h.links, n)
		}
	}
	why = map[string]string{}
	for _, s := range states {
		l := h.links[s.Name]
		usable := l.up && !now.Before(l.usableAt)
		switch {
		case !l.up:
			why[s.Name] = "interface " + s.Name + " is down"
		case !usable:
			why[s.Name] = fmt.Sprintf("interface %s came up again: held down for %v", s.Name, h.HoldDown)
			if next.IsZero() || l.usableAt.Before(next) {
				next = l.usableAt
			}
		}
		links = append(links, LinkState{Name: s.Name, Up: usable, Prefixes: l.prefixes})
	}
	return links, why, next
}

// Withdrawal is one L2 segment this node withdraws from, and why.
type Withdrawal struct {
	Segment L2Segment
	Reason  string
}

// WithdrawnSegments decides from which of its L2 segments self withdraws: those with a VIP that
// self would announce on a link that is not usable (links from LinkHold.Observe; why says why
// each unusable one is not). The links a VIP is announced on are interfacesFor's: the interfaces
// the pool's L2Advertisements that select self name, and for an advertisement naming none the
// interfaces whose subnet holds the VIP. An interface that does not exist here is not "down"
// (DecideL2 reports it), and a VIP on no attached subnet of an advertisement naming none ties to
// no link. The whole segment is withdrawn, not the pool alone: the segment's ready flag is what
// the membership carries, and every member honours it, older versions too. The result is sorted
// as segs.
func WithdrawnSegments(st *cluster.State, self string, segs []L2Segment, links []LinkState, why map[string]string) []Withdrawal {
	if st == nil || st.MetalLB == nil || len(why) == 0 {
		return nil
	}
	var down []LinkState
	for _, l := range links {
		if !l.Up {
			down = append(down, l)
		}
	}
	if len(down) == 0 {
		return nil
	}
	pools := map[string]bool{}
	for _, g := range segs {
		if _, ok := slices.BinarySearch(g.Members, self); ok {
			for _, p := range g.Pools {
				pools[p] = true
			}
		}
	}
	if len(pools) == 0 {
		return nil
	}
	selfLabels := nodeLabels(st, self)
	// The reason of each pool that needs a link that is down (first found, in a stable order).
	need := map[string]string{}
	poolIdx := cluster.NewPoolIndex(st.MetalLB.IPAddressPools)
	var ips []netip.Addr
	for _, svc := range st.Services {
		if svc.Type == cluster.TypeLoadBalancer {
			ips = append(ips, svc.LoadBalancerIPs...)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	ips = slices.Compact(ips)
	for _, pool := range st.MetalLB.IPAddressPools {
		key := pool.Namespace + "/" + pool.Name
		if !pools[key] {
			continue
		}
		for _, ad := range l2AdsFor(st.MetalLB.L2Advertisements, pool) {
			if !selects(ad.Spec.NodeSelectors, selfLabels) {
				continue
			}
			for _, name := range ad.Spec.Interfaces {
				if r := why[name]; r != "" && need[key] == "" {
					need[key] = r
				}
			}
		}
	}
	for _, ip := range ips {
		pool := poolIdx.PoolOf(ip)
		if pool == nil {
			continue
		}
		key := pool.Namespace + "/" + pool.Name
		if !pools[key] || need[key] != "" {
			continue
		}
		unnamed := slices.ContainsFunc(l2AdsFor(st.MetalLB.L2Advertisements, pool), func(ad *metallbv1beta1.L2Advertisement) bool {
			return len(ad.Spec.Interfaces) == 0 && selects(ad.Spec.NodeSelectors, selfLabels)
		})
		if !unnamed {
			continue
		}
		for _, l := range down {
			if slices.ContainsFunc(l.Prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
				need[key] = fmt.Sprintf("%s (the subnet of %s)", why[l.Name], ip)
				break
			}
		}
	}
	var out []Withdrawal
	for _, g := range segs {
		if _, ok := slices.BinarySearch(g.Members, self); !ok {
			continue
		}
		var reasons []string
		for _, p := range g.Pools {
			if r := need[p]; r != "" {
				reasons = append(reasons, "pool "+p+": "+r)
			}
		}
		if len(reasons) > 0 {
			out = append(out, Withdrawal{Segment: g, Reason: strings.Join(reasons, "; ")})
		}
	}
	return out
}
