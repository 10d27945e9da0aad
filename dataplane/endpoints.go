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

// TargetPorts says on which port the endpoints of each EndpointSlice of a Service listen for each
// Service port. The EndpointSlice controller writes into every slice the number its own endpoints use
// for each Service port name: a named targetPort ("http") may resolve to different numbers on
// different pods, and the controller then groups the endpoints into one slice per mapping. So the
// number is a property of the slice, never of the Service.
type TargetPorts struct {
	nPorts int
	// ports holds, row by row, slice i's number for Service port j at i*nPorts+j; 0 when the slice
	// has no port of that name and protocol (its endpoints do not serve that Service port).
	ports []uint16
}

// At returns slice i's target port for Service port j, 0 if none.
func (t TargetPorts) At(slice, port int) uint16 { return t.ports[slice*t.nPorts+port] }

// ResolveTargetPorts matches every slice's ports to the Service's ports by name and protocol, as
// kube-proxy does, in time linear in the number of ports: a slice port is first tried against the
// Service port at the same position (the EndpointSlice controller keeps the Service's order), and
// only a slice that differs pays for an index of the Service ports.
func ResolveTargetPorts(svcPorts []cluster.ServicePort, slices_ []*cluster.EndpointSlice) TargetPorts {
	type portID struct {
		name  string
		proto cluster.Protocol
	}
	n := len(svcPorts)
	t := TargetPorts{nPorts: n, ports: make([]uint16, len(slices_)*n)}
	var index map[portID]int
	for i, es := range slices_ {
		row := t.ports[i*n : (i+1)*n]
		for k, sp := range es.Ports {
			j := k
			if j >= n || svcPorts[j].Name != sp.Name || svcPorts[j].Protocol != sp.Protocol {
				if index == nil {
					index = make(map[portID]int, n)
					for j, p := range svcPorts {
						index[portID{p.Name, p.Protocol}] = j
					}
				}
				var ok bool
				if j, ok = index[portID{sp.Name, sp.Protocol}]; !ok {
					continue
				}
			}
			if row[j] == 0 {
				row[j] = sp.Port
			}
		}
	}
	return t
}

// PortEndpoints collects the endpoints of Service port j (an index into the ports targets was
// resolved for) from the Service's slices of one family, each endpoint with the target port of its
// own slice. Duplicates (the same addr:port in two slices) are kept once, preferring a ready copy. The
// result is sorted by address and port so that the endpoint index in the maps is stable.
func PortEndpoints(targets TargetPorts, j int, slices_ []*cluster.EndpointSlice, family cluster.Family, nodeName string) []Endpoint {
	return AppendPortEndpoints(nil, targets, j, slices_, family, nodeName)
}

// AppendPortEndpoints is PortEndpoints building the result in buf (grown as needed): the proxier's full
// sync collects the endpoints of every Service port, and needs each list only while it builds that
// port.
func AppendPortEndpoints(buf []Endpoint, targets TargetPorts, j int, slices_ []*cluster.EndpointSlice, family cluster.Family, nodeName string) []Endpoint {
	total := 0
	for _, es := range slices_ {
		total += len(es.Endpoints)
	}
	out := slices.Grow(buf[:0], total)
	if out == nil {
		out = []Endpoint{} // empty, not nil, as ever
	}
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
	for i, es := range slices_ {
		if es.Family != family {
			continue
		}
		epPort := targets.At(i, j)
		if epPort == 0 {
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
				ZoneHints:   ep.ZoneHints(),
				NodeHints:   ep.NodeHints(),
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

// FilterEndpoints returns the endpoints keep accepts: eps itself (not a copy) when it accepts all of
// them, the usual case, so callers must not modify the result. The node's endpoint categories and
// the gateway's ready backends both choose with it.
func FilterEndpoints(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
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
