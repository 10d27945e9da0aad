package dataplane

import (
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
)

// Endpoint is one usable endpoint of one Service port: where to DNAT to, and what the traffic policies
// need to know about it.
type Endpoint struct {
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	Local       bool
	ZoneHints   []string
	NodeHints   []string
}

// AddrPort returns the endpoint as addr:port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// PortEndpoints collects the endpoints of one Service port from the Service's slices of one family,
// matching slice ports by name and protocol as kube-proxy does. Duplicates (the same addr:port in two
// slices) are kept once, preferring a ready copy. The result is sorted by address and port so that the
// endpoint index in the maps is stable.
func PortEndpoints(port cluster.ServicePort, slices_ []*cluster.EndpointSlice, family cluster.Family, nodeName string) []Endpoint {
	total := 0
	for _, es := range slices_ {
		total += len(es.Endpoints)
	}
	out := make([]Endpoint, 0, total)
	// Duplicates are found by a scan of out while it is small (most Services), by a map beyond.
	var seen map[netip.AddrPort]int
	if total > 32 {
		seen = make(map[netip.AddrPort]int, total)
	}
	index := func(ap netip.AddrPort) (int, bool) {
		if seen != nil {
			i, ok := seen[ap]
			return i, ok
		}
		for i := range out {
			if out[i].Addr == ap.Addr() && out[i].Port == ap.Port() {
				return i, true
			}
		}
		return 0, false
	}
	for _, es := range slices_ {
		if es.Family != family {
			continue
		}
		var epPort uint16
		found := false
		for _, sp := range es.Ports {
			if sp.Name == port.Name && sp.Protocol == port.Protocol {
				epPort, found = sp.Port, true
				break
			}
		}
		if !found || epPort == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			e := Endpoint{
				Addr:        ep.Addresses[0],
				Port:        epPort,
				Ready:       ep.Ready,
				Serving:     ep.Serving,
				Terminating: ep.Terminating,
				Local:       nodeName != "" && ep.NodeName == nodeName,
				ZoneHints:   ep.ZoneHints,
				NodeHints:   ep.NodeHints,
			}
			if i, ok := index(e.AddrPort()); ok {
				if !out[i].Ready && e.Ready {
					out[i] = e
				}
				continue
			}
			if seen != nil {
				seen[e.AddrPort()] = len(out)
			}
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	return out
}

// Categorized is the result of applying a Service's traffic policies and topology to its endpoints on
// one node, exactly as kube-proxy's CategorizeEndpoints does.
type Categorized struct {
	// Cluster is used for traffic policy Cluster (after topology filtering and terminating fallback).
	Cluster []Endpoint
	// Local is used for traffic policy Local (this node's endpoints, with terminating fallback).
	Local []Endpoint
	// HasAny is true if the Service has any usable endpoint anywhere.
	HasAny bool
}

// UsesClusterEndpoints and UsesLocalEndpoints follow kube-proxy's ServicePort methods.
func usesClusterEndpoints(svc *cluster.Service, external bool) bool {
	return !svc.InternalPolicyLocal || (external && !svc.ExternalPolicyLocal)
}

func usesLocalEndpoints(svc *cluster.Service, external bool) bool {
	return svc.InternalPolicyLocal || (external && svc.ExternalPolicyLocal)
}

// Categorize splits eps into the cluster and local endpoint sets.
func Categorize(eps []Endpoint, svc *cluster.Service, external bool, nodeName, zone string) Categorized {
	var c Categorized
	if len(eps) == 0 {
		return c
	}
	if usesClusterEndpoints(svc, external) {
		mode := topologyMode(eps, nodeName, zone)
		c.Cluster = filter(eps, func(e Endpoint) bool { return e.Ready && availableForTopology(e, mode, nodeName, zone) })
		if len(c.Cluster) == 0 {
			// Terminating fallback: when nothing is ready, use what is still serving while terminating,
			// so connections keep working through a rolling update.
			c.Cluster = filter(eps, func(e Endpoint) bool { return e.Serving && e.Terminating })
		}
		c.HasAny = len(c.Cluster) > 0
	}
	if !usesLocalEndpoints(svc, external) {
		return c
	}
	localReady, localTerm := false, false
	for _, e := range eps {
		if e.Ready {
			c.HasAny = true
			localReady = localReady || e.Local
		} else if e.Serving && e.Terminating {
			c.HasAny = true
			localTerm = localTerm || e.Local
		}
	}
	switch {
	case localReady:
		c.Local = filter(eps, func(e Endpoint) bool { return e.Local && e.Ready })
	case localTerm:
		c.Local = filter(eps, func(e Endpoint) bool { return e.Local && e.Serving && e.Terminating })
	}
	return c
}

const (
	topologyNone     = ""
	topologySameNode = "PreferSameNode"
	topologySameZone = "PreferSameZone"
)

// topologyMode decides whether hints apply: only when every ready endpoint carries hints and at least
// one is for this node (node hints) or zone (zone hints). Otherwise hints are ignored, as in kube-proxy.
func topologyMode(eps []Endpoint, nodeName, zone string) string {
	hasReady, nodeHit, allNode, zoneHit, allZone := false, false, true, false, true
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		hasReady = true
		if len(e.NodeHints) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints, nodeName) {
			nodeHit = true
		}
		if len(e.ZoneHints) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints, zone) {
			zoneHit = true
		}
	}
	switch {
	case !hasReady:
		return topologyNone
	case allNode && nodeHit:
		return topologySameNode
	case allZone && zoneHit && zone != "":
		return topologySameZone
	}
	return topologyNone
}

func availableForTopology(e Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.NodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(e.ZoneHints, zone)
	}
	return true
}

// filter returns the endpoints keep accepts: eps itself (not a copy) when it accepts all of them,
// the usual case, so callers must not modify the result.
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	for i, e := range eps {
		if !keep(e) {
			out := make([]Endpoint, i, len(eps))
			copy(out, eps[:i])
			for _, e := range eps[i+1:] {
				if keep(e) {
					out = append(out, e)
				}
			}
			return out
		}
	}
	return eps
}
