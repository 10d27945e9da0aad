package dataplane

// The bridge from the desired state to conntrack cleanup. The cleanup itself (which entries are stale,
// and deleting them) is the leaf package dataplane/conntrack; what it needs from a cluster.State is
// built here because it resolves target ports as the rules do (ResolveTargetPorts).

import (
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

// ConntrackView extracts from state the UDP and SCTP Service ports that have a VIP or a NodePort, with
// their endpoints. An endpoint counts while it is ready or serving (a terminating endpoint may still
// get traffic through kube-proxy's fallback); which subset the rules actually use (topology, traffic
// policies) does not matter here, because cleaning only acts on endpoints that disappear.
func ConntrackView(state *cluster.State) map[conntrack.PortKey]conntrack.ServicePort {
	view := map[conntrack.PortKey]conntrack.ServicePort{}
	if state == nil {
		return view
	}
	for key, svc := range state.Services {
		if svc == nil || svc.Type == cluster.TypeExternalName || svc.Headless {
			continue // no VIP, no DNAT, so no entries of ours
		}
		vips := slices.Concat(svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs)
		svcSlices := state.EndpointSlices[key]
		targets := ResolveTargetPorts(svc.Ports, svcSlices)
		for j, sp := range svc.Ports {
			proto := ctProtoNumber(sp.Protocol)
			if proto == 0 {
				continue
			}
			ports := conntrack.ServicePort{VIPs: vips, Port: sp.Port, NodePort: sp.NodePort}
			for i, slice := range svcSlices {
				ports.Endpoints = append(ports.Endpoints, ctSliceEndpoints(slice, targets.At(i, j))...)
			}
			slices.SortFunc(ports.Endpoints, netip.AddrPort.Compare)
			ports.Endpoints = slices.Compact(ports.Endpoints)
			view[conntrack.PortKey{Service: key, Port: sp.Name, Proto: proto}] = ports
		}
	}
	return view
}

// ctProtoNumber returns the IP protocol number of a protocol whose entries are cleaned, or 0.
func ctProtoNumber(p cluster.Protocol) uint8 {
	switch p {
	case cluster.UDP:
		return ProtoUDP
	case cluster.SCTP:
		return ProtoSCTP
	}
	return 0
}

// ctSliceEndpoints returns the serving endpoints of slice with the slice's target port for the
// Service port (see ResolveTargetPorts; 0: the slice does not serve it).
func ctSliceEndpoints(slice *cluster.EndpointSlice, target uint16) []netip.AddrPort {
	if target == 0 {
		return nil
	}
	var out []netip.AddrPort
	for _, ep := range slice.Endpoints {
		if len(ep.Addresses) == 0 || !(ep.Ready || ep.Serving) {
			continue
		}
		// kube-proxy uses the first address only.
		out = append(out, netip.AddrPortFrom(ep.Addresses[0], target))
	}
	return out
}
