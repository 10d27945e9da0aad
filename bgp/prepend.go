package bgp

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	api "github.com/osrg/gobgp/v4/api"
)

// AS path prepending (Advertisement.ASPathPrepend, MetalLB v0.16.2's BGPAdvertisement
// asPathPrepend).
//
// frr-k8s, the only MetalLB backend that implements it, puts `set as-path prepend` with the
// router's AS repeated N times in the neighbor's outbound route-map; FRR then adds its own AS once
// more when it sends to an eBGP peer, so the peer sees the AS N+1 times. GoBGP's local paths carry
// no AS_PATH and GoBGP adds the session's local AS on eBGP export before the export policy runs,
// so the same result is one global export policy per (N, address family): a statement matching
// the prefixes that ask for N, whose action prepends the leftmost AS ("last-as", which on an
// eBGP session is the session's local AS, localASN included) N times and leaves the route's fate
// to the following policies (the peer filters of filter.go) and the default ACCEPT. An iBGP
// peer's copy has an empty AS_PATH, where "last-as" has nothing to repeat: vipgate prepends
// nothing towards iBGP peers (frr-k8s would send the AS N times there; AS path length matters
// between ASes, and iBGP routers compare routes of one origin AS).
//
// A policy exists only while its prefix set is non-empty (GoBGP reads an empty set as "match
// everything"), and, as for the peer filters, a change of N for a route that stays announced is
// sent with a soft reset out of every peer, since the path itself does not change.

// prependKey names one prepend policy.
type prependKey struct {
	n  uint8
	v6 bool
}

func (k prependKey) name() string {
	fam := "v4"
	if k.v6 {
		fam = "v6"
	}
	return fmt.Sprintf("vipgate-prepend-%d-%s", k.n, fam)
}

// MaxASPathPrepend is the largest Advertisement.ASPathPrepend (MetalLB's CRD bound).
const MaxASPathPrepend = 10

// prependsFor groups the routes that ask for a prepend by policy.
func prependsFor(routes map[netip.Prefix]route) map[prependKey]map[netip.Prefix]bool {
	out := map[prependKey]map[netip.Prefix]bool{}
	for pfx, r := range routes {
		if r.prepend == 0 {
			continue
		}
		k := prependKey{n: r.prepend, v6: pfx.Addr().Is6()}
		if out[k] == nil {
			out[k] = map[netip.Prefix]bool{}
		}
		out[k][pfx] = true
	}
	return out
}

// syncPrepends makes the installed prepend policies those of want, and returns the prefixes
// whose prepend changed.
func (s *Speaker) syncPrepends(want map[netip.Prefix]route) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	next := prependsFor(want)
	var changed []netip.Prefix
	var firstErr error
	keys := slices.Collect(maps.Keys(next))
	for k := range s.prepends {
		if _, ok := next[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b prependKey) int {
		if a.n != b.n {
			return int(a.n) - int(b.n)
		}
		if a.v6 == b.v6 {
			return 0
		}
		if a.v6 {
			return 1
		}
		return -1
	})
	for _, k := range keys {
		cur, nw := s.prepends[k], next[k]
		if maps.Equal(cur, nw) {
			continue
		}
		for p := range cur {
			if !nw[p] {
				changed = append(changed, p)
			}
		}
		for p := range nw {
			if !cur[p] {
				changed = append(changed, p)
			}
		}
		if len(nw) == 0 {
			s.removePrepend(ctx, k)
			continue
		}
		if err := s.installPrepend(ctx, k, nw, cur != nil); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return changed, firstErr
}

// installPrepend creates (or, with exists, updates the prefix set of) the policy of k.
func (s *Speaker) installPrepend(ctx context.Context, k prependKey, pfxs map[netip.Prefix]bool, exists bool) error {
	name := k.name()
	if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: prefixSet(name, slices.Collect(maps.Keys(pfxs))), Replace: true}); err != nil {
		return fmt.Errorf("installing prefix set %s: %w", name, err)
	}
	if exists {
		s.prepends[k] = maps.Clone(pfxs)
		return nil
	}
	s.prepends[k] = map[netip.Prefix]bool{} // recorded first, so a half-built one is torn down later
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
		Name: name,
		Statements: []*api.Statement{{
			Name:       name,
			Conditions: &api.Conditions{PrefixSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: name}},
			Actions: &api.Actions{
				RouteAction: api.RouteAction_ROUTE_ACTION_UNSPECIFIED, // go on with the next policy
				AsPrepend:   &api.AsPrependAction{UseLeftMost: true, Repeat: uint32(k.n)},
			},
		}},
	}}); err != nil {
		s.removePrepend(ctx, k)
		return fmt.Errorf("installing policy %s: %w", name, err)
	}
	if err := s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:          "global",
		Direction:     api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies:      []*api.Policy{{Name: name}},
		DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		s.removePrepend(ctx, k)
		return fmt.Errorf("assigning policy %s: %w", name, err)
	}
	s.prepends[k] = maps.Clone(pfxs)
	return nil
}

// removePrepend deletes the policy of k and its set, carrying on past errors (objects never
// created).
func (s *Speaker) removePrepend(ctx context.Context, k prependKey) {
	name := k.name()
	err := s.removeExportPolicy(ctx, name, api.DefinedType_DEFINED_TYPE_PREFIX)
	delete(s.prepends, k)
	if err != nil {
		s.log.Debug("removing AS path prepend policy", "policy", name, "err", err)
	}
}
