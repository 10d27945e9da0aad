package proxy

import (
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Categorized is the result of applying a Service's traffic policies and topology to its endpoints on
// one node, exactly as kube-proxy's CategorizeEndpoints does.
type Categorized struct {
	// Cluster is used for traffic policy Cluster (after topology filtering and terminating fallback).
	Cluster []dataplane.Endpoint
	// Local is used for traffic policy Local (this node's endpoints, with terminating fallback).
	Local []dataplane.Endpoint
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
func Categorize(eps []dataplane.Endpoint, svc *cluster.Service, external bool, nodeName, zone string) Categorized {
	var c Categorized
	if len(eps) == 0 {
		return c
	}
	if usesClusterEndpoints(svc, external) {
		mode := topologyMode(eps, nodeName, zone)
		c.Cluster = dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Ready && availableForTopology(e, mode, nodeName, zone) })
		if len(c.Cluster) == 0 {
			// Terminating fallback: when nothing is ready, use what is still serving while terminating,
			// so connections keep working through a rolling update.
			c.Cluster = dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Serving && e.Terminating })
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
		c.Local = dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Local && e.Ready })
	case localTerm:
		c.Local = dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Local && e.Serving && e.Terminating })
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
func topologyMode(eps []dataplane.Endpoint, nodeName, zone string) string {
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

func availableForTopology(e dataplane.Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.NodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(e.ZoneHints, zone)
	}
	return true
}
