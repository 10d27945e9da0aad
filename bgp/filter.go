package bgp

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	api "github.com/osrg/gobgp/v4/api"
)

// Per-peer route selection (Advertisement.Peers).
//
// GoBGP holds one local path per prefix and has per-neighbor export policies only for route-server
// clients, so "send this route to peers A and B only" is expressed in the global export policy: for
// each peer that must not receive some routes there is one policy whose single statement rejects
// (neighbor-set = that peer's address) AND (prefix-set = the denied prefixes). The global default
// action stays ACCEPT, so with no restricted routes there is no policy at all.
//
// A policy exists only while its prefix set is non-empty, because GoBGP treats an empty set in a
// condition as "match everything", which would silence the peer.
//
// GoBGP applies export policy when a path is propagated, not when the policy changes, and re-adding
// an identical path propagates nothing. So when the filter of a peer changes for a route that stays
// announced, SetAdvertisements asks GoBGP for a soft reset out of that peer, which re-evaluates its
// Adj-RIB-Out (sending the newly allowed routes and withdrawing the newly denied ones). A new route
// needs no reset: its filter is in place before the route enters the RIB.

// peerFilter is the export filter installed for one peer.
type peerFilter struct {
	addr   netip.Addr
	denied map[netip.Prefix]bool
}

func filterName(peer string) string { return "vipgate-deny-" + peer }

// deniedFor lists the routes of p's address family that must not be sent to p.
func (s *Speaker) deniedFor(p PeerConfig, routes map[netip.Prefix]route) map[netip.Prefix]bool {
	denied := map[netip.Prefix]bool{}
	for pfx, r := range routes {
		if pfx.Addr().Is4() == p.PeerAddress.Is4() && !r.sendsTo(p.Name) {
			denied[pfx] = true
		}
	}
	return denied
}

// syncFilter makes the export filter of peer p deny exactly the prefixes in want, and returns the
// prefixes whose treatment changed.
func (s *Speaker) syncFilter(p PeerConfig, want map[netip.Prefix]bool) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	cur := s.filters[p.Name]
	var changed []netip.Prefix
	if cur != nil && (len(want) == 0 || cur.addr != p.PeerAddress) {
		changed = slices.Collect(maps.Keys(cur.denied))
		s.removeFilter(ctx, p.Name)
		cur = nil
	}
	if len(want) == 0 {
		return changed, nil
	}
	if cur == nil {
		return append(changed, slices.Collect(maps.Keys(want))...), s.installFilter(ctx, p, want)
	}
	var add, del []netip.Prefix
	for pfx := range want {
		if !cur.denied[pfx] {
			add = append(add, pfx)
		}
	}
	for pfx := range cur.denied {
		if !want[pfx] {
			del = append(del, pfx)
		}
	}
	name := filterName(p.Name)
	if len(add) > 0 {
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: prefixSet(name, add)}); err != nil {
			return nil, fmt.Errorf("adding %d prefixes to %s: %w", len(add), name, err)
		}
		for _, pfx := range add {
			cur.denied[pfx] = true
		}
	}
	// Removal comes after addition so the set never becomes empty on the way (want is non-empty).
	if len(del) > 0 {
		if err := s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: prefixSet(name, del)}); err != nil {
			return add, fmt.Errorf("removing %d prefixes from %s: %w", len(del), name, err)
		}
		for _, pfx := range del {
			delete(cur.denied, pfx)
		}
	}
	return append(add, del...), nil
}

func (s *Speaker) installFilter(ctx context.Context, p PeerConfig, want map[netip.Prefix]bool) error {
	name := filterName(p.Name)
	nbr := &api.DefinedSet{
		DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR,
		Name:        name,
		List:        []string{netip.PrefixFrom(p.PeerAddress, p.PeerAddress.BitLen()).String()},
	}
	pfxs := slices.Collect(maps.Keys(want))
	steps := []struct {
		what string
		do   func() error
	}{
		{"neighbor set", func() error {
			return s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: nbr, Replace: true})
		}},
		{"prefix set", func() error {
			return s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: prefixSet(name, pfxs), Replace: true})
		}},
		{"policy", func() error {
			return s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
				Name: name,
				Statements: []*api.Statement{{
					Name: name,
					Conditions: &api.Conditions{
						NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: name},
						PrefixSet:   &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: name},
					},
					Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
				}},
			}})
		}},
		{"policy assignment", func() error {
			return s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
				Name:          "global",
				Direction:     api.PolicyDirection_POLICY_DIRECTION_EXPORT,
				Policies:      []*api.Policy{{Name: name}},
				DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
			}})
		}},
	}
	// Record the filter before the first step so a half-built one is torn down next time.
	s.filters[p.Name] = &peerFilter{addr: p.PeerAddress, denied: map[netip.Prefix]bool{}}
	for _, st := range steps {
		if err := st.do(); err != nil {
			s.removeFilter(ctx, p.Name)
			return fmt.Errorf("installing %s %s: %w", st.what, name, err)
		}
	}
	s.filters[p.Name].denied = maps.Clone(want)
	return nil
}

// removeFilter deletes a peer's policy and sets. It carries on past errors, so it also cleans up
// after a partial install (where some objects were never created).
func (s *Speaker) removeFilter(ctx context.Context, peer string) {
	err := s.removeExportPolicy(ctx, filterName(peer), api.DefinedType_DEFINED_TYPE_PREFIX, api.DefinedType_DEFINED_TYPE_NEIGHBOR)
	delete(s.filters, peer)
	if err != nil {
		// Usually an object that was never created; nothing to undo.
		s.log.Debug("removing export filter", "peer", peer, "err", err)
	}
}

// removeExportPolicy deletes the global export policy name, its assignment and its defined sets
// of the given types (all named name), carrying on past errors; it returns the first.
func (s *Speaker) removeExportPolicy(ctx context.Context, name string, sets ...api.DefinedType) error {
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	note(s.srv.DeletePolicyAssignment(ctx, &api.DeletePolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:      "global",
		Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies:  []*api.Policy{{Name: name}},
	}}))
	note(s.srv.DeletePolicy(ctx, &api.DeletePolicyRequest{Policy: &api.Policy{Name: name}, All: true}))
	for _, t := range sets {
		note(s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{
			DefinedSet: &api.DefinedSet{DefinedType: t, Name: name}, All: true}))
	}
	return firstErr
}

func prefixSet(name string, pfxs []netip.Prefix) *api.DefinedSet {
	set := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: name}
	for _, pfx := range pfxs {
		set.Prefixes = append(set.Prefixes, &api.Prefix{
			IpPrefix:      pfx.String(),
			MaskLengthMin: uint32(pfx.Bits()),
			MaskLengthMax: uint32(pfx.Bits()),
		})
	}
	return set
}
