package dataplane_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway"
)

// The engine's checks on tables the gateway builds (gateway/): its kinds use the model in ways the
// node's do not.

// extGatewayState: web (eTP=Cluster, pods on both nodes) and loc (eTP=Local, a pod on node1), two
// nodes (gateway/gateway_test.go's gwState, in short).
func extGatewayState() *cluster.State {
	svc := func(name, vip string, local bool, nodePort, hc uint16) *cluster.Service {
		return &cluster.Service{Key: cluster.ServiceKey{Namespace: "gw", Name: name}, Type: cluster.TypeLoadBalancer,
			ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.7.1")},
			Ports:           []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: nodePort}},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(vip)}, ExternalPolicyLocal: local, HealthCheckNodePort: hc}
	}
	slice := func(svc *cluster.Service, eps ...cluster.Endpoint) []*cluster.EndpointSlice {
		return []*cluster.EndpointSlice{{Namespace: "gw", Name: svc.Key.Name + "-1", Service: svc.Key, Family: cluster.IPv4,
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}, Endpoints: eps}}
	}
	ep := func(addr, node string) cluster.Endpoint {
		return cluster.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ready: true, Serving: true, NodeName: node}
	}
	web, loc := svc("web", "203.0.113.50", false, 30080, 0), svc("loc", "203.0.113.51", true, 30081, 32001)
	return &cluster.State{
		Services: map[cluster.ServiceKey]*cluster.Service{web.Key: web, loc.Key: loc},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{
			web.Key: slice(web, ep("10.244.1.11", "node1"), ep("10.244.2.11", "node2")),
			loc.Key: slice(loc, ep("10.244.1.12", "node1")),
		},
		Nodes: map[string]*cluster.Node{
			"node1": {Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11")}},
			"node2": {Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}},
		},
	}
}

// The gateway's tables (every forwarding mode) pack unchanged too: their kinds use Index and
// DataAddr in ways the node's do not.
func TestPackRoundTripGateway(t *testing.T) {
	health := gateway.Health{{Addr: netip.MustParseAddr("192.0.2.11"), Port: 32001}: true}
	for _, fw := range []cluster.Forwarding{cluster.ForwardDirect, cluster.ForwardNodePort, cluster.ForwardRoute} {
		grs, err := gateway.BuildRuleset(gateway.Config{Forwarding: fw}, cluster.IPv4, extGatewayState(), health)
		if err != nil {
			t.Fatal(err)
		}
		f := grs.Ruleset.Flatten()
		if len(f.Elements) == 0 {
			t.Fatalf("%s: no elements", fw)
		}
		for set, els := range f.Elements {
			dataplane.PackRoundTrip(t, fmt.Sprintf("%s: %s", fw, set), els, nil)
		}
	}
}
