package speaker

import (
	"maps"
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
)

// GatewayGroup is the gateways that share a cluster's LoadBalancer IPs (`vipgate gateway`).
type GatewayGroup struct {
	// Members are the gateways by name, with their addresses.
	Members map[string][]netip.Addr
	// Labels are the labels every gateway of the group carries (the member's name is added as
	// kubernetes.io/hostname).
	Labels map[string]string
}

// GatewayView turns the cluster's State into what DecideL2 and DecideBGP decide on when the host is
// a gateway in front of the cluster rather than a node of it:
//
//   - the gateways are the nodes, so the nodeSelectors of L2Advertisements, BGPAdvertisements and
//     BGPPeers select gateways by the group's labels;
//   - only the LoadBalancer IPs in forwarding are kept (the gateway has a backend for them): a gateway
//     never draws traffic it would drop;
//   - externalTrafficPolicy Local does not restrict the candidates: a gateway honours it itself, by
//     forwarding only to nodes with a local endpoint, so every gateway may own any VIP.
//
// Pools, advertisements, peers and EndpointSlices are shared with st, not copied.
func GatewayView(st *cluster.State, g GatewayGroup, forwarding map[netip.Addr]bool) *cluster.State {
	out := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{},
		EndpointSlices: st.EndpointSlices,
		Nodes:          map[string]*cluster.Node{},
		MetalLB:        st.MetalLB,
	}
	for name, addrs := range g.Members {
		labels := maps.Clone(g.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels["kubernetes.io/hostname"] = name
		out.Nodes[name] = &cluster.Node{Name: name, Labels: labels, Addresses: addrs}
	}
	for k, svc := range st.Services {
		if svc.Type != cluster.TypeLoadBalancer {
			continue
		}
		var ips []netip.Addr
		for _, ip := range svc.LoadBalancerIPs {
			if forwarding[ip] {
				ips = append(ips, ip)
			}
		}
		if len(ips) == 0 {
			continue
		}
		c := *svc
		c.LoadBalancerIPs = ips
		c.ExternalPolicyLocal = false
		out.Services[k] = &c
	}
	return out
}
