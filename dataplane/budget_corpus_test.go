package dataplane

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// The hostile corpus of issue #27: Services a namespace tenant can write whose cost to the node
// (nftables elements and rules, and the time to build them) is not O(the object's size), built
// here by shape (ports x addresses x endpoints x algorithm) so the tests and the benchmark share
// them.

// hostileShape is one Service of the corpus.
type hostileShape struct {
	name        string
	ports       int
	externalIPs int
	lbIPs       int
	ranges      int // loadBalancerSourceRanges
	endpoints   int
	alg         string // vipgate.io/lb-algorithm ("" default)
	local       bool   // externalTrafficPolicy: Local
	affinity    bool
}

// hostileService builds the Service and its one EndpointSlice (IPv4; endpoints on node1 and
// node2 alternately) of shape h.
func hostileService(h hostileShape) (*cluster.Service, []*cluster.EndpointSlice) {
	svc := &cluster.Service{
		Key:        cluster.ServiceKey{Namespace: "tenant", Name: h.name},
		Type:       cluster.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.77.1")},
		Created:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		UID:        "uid-" + h.name,
	}
	if h.lbIPs > 0 {
		svc.Type = cluster.TypeLoadBalancer
	}
	if h.alg != "" {
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: h.alg}
	}
	svc.ExternalPolicyLocal = h.local
	if h.local && h.lbIPs > 0 {
		svc.HealthCheckNodePort = 32500
	}
	if h.affinity {
		svc.AffinityTimeout = 3 * time.Hour
	}
	es := &cluster.EndpointSlice{Namespace: "tenant", Name: h.name + "-1", Service: svc.Key, Family: cluster.IPv4}
	for i := range h.ports {
		name := fmt.Sprintf("p%d", i)
		sp := cluster.ServicePort{Name: name, Protocol: cluster.TCP, Port: uint16(1000 + i)}
		if svc.Type == cluster.TypeLoadBalancer {
			sp.NodePort = uint16(30000 + i)
		}
		svc.Ports = append(svc.Ports, sp)
		es.Ports = append(es.Ports, cluster.EndpointPort{Name: name, Protocol: cluster.TCP, Port: uint16(8000 + i)})
	}
	for i := range h.externalIPs {
		svc.ExternalIPs = append(svc.ExternalIPs, netip.AddrFrom4([4]byte{198, 51, 100 + byte(i/250), byte(1 + i%250)}))
	}
	for i := range h.lbIPs {
		svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + i%250)}))
	}
	for i := range h.ranges {
		svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	for i := range h.endpoints {
		node := "node1"
		if i%2 == 1 {
			node = "node2"
		}
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(1 + i/250), byte(1 + i%250)})},
			Ready: true, Serving: true, NodeName: node})
	}
	return svc, []*cluster.EndpointSlice{es}
}

// hostileNodeInfo is the node the corpus is built for.
func hostileNodeInfo() NodeInfo {
	return NodeInfo{Family: cluster.IPv4, NodeName: "node1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, PodTrafficKnown: true}
}

// partCost is what a Service's part costs the kernel, in set elements and rules.
func partCost(p *Part) (elements, rules int) {
	for _, c := range p.Chains {
		rules += len(c.Rules)
	}
	return p.numElements(), rules
}
