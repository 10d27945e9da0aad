package gateway

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Entry is one VIP port the gateway forwards, and where to.
type Entry struct {
	Service cluster.ServiceKey
	VIP     netip.Addr
	Proto   uint8
	Port    uint16
	// Backends are pod addr:port (direct) or node addr:NodePort (nodePort), sorted.
	Backends []netip.AddrPort
	// SNAT says the gateway masquerades this entry's traffic.
	SNAT bool
	// Why explains an entry without backends.
	Why string
	// Algorithm is how the entry's slots are keyed: LBMaglev (the flow) or LBSourceHash (the client
	// address).
	Algorithm cluster.LBAlgorithm
	// Draining are backends that get no new flows but keep their established ones (a node marked
	// draining, a node whose local endpoints are all terminating, endpoints on a draining node), sorted.
	Draining []netip.AddrPort
	// SourceRanges are the Service's loadBalancerSourceRanges of the entry's family, which the
	// gateway enforces before DNAT (forwarding direct and nodePort: the node cannot, as the packet
	// reaches it for a pod or a NodePort; route: empty, the node enforces them on the VIP as it
	// arrives). Empty: open to every client, as a family without ranges of its own is (familyRanges).
	SourceRanges []netip.Prefix
}

// String formats the entry for logs.
func (e Entry) String() string {
	return fmt.Sprintf("%s %s:%d", dataplane.ProtoName(e.Proto), e.VIP, e.Port)
}

// gatewayNode is one node address of one family.
type gatewayNode struct {
	name string
	addr netip.Addr
	// draining: no new flows, established ones keep it; gone: drained past the deadline, not used
	// at all.
	draining, gone bool
}

// gatewayNodes lists the nodes' addresses of family f, by name: the State's nodes, or the configured
// ones if the State has none.
func gatewayNodes(cfg Config, st *cluster.State, f cluster.Family) []gatewayNode {
	var out []gatewayNode
	add := func(n *cluster.Node) {
		for _, a := range n.Addresses {
			if cluster.FamilyOf(a) == f {
				out = append(out, gatewayNode{name: n.Name, addr: a.Unmap()})
				return
			}
		}
	}
	if st != nil && len(st.Nodes) > 0 {
		for _, n := range st.Nodes {
			add(n)
		}
	} else {
		for i := range cfg.Nodes {
			add(&cfg.Nodes[i])
		}
	}
	slices.SortFunc(out, func(a, b gatewayNode) int { return cmp.Compare(a.name, b.name) })
	return out
}

// gatewayVIPs returns the Service's LoadBalancer IPs of family f: what the gateway owns.
func gatewayVIPs(svc *cluster.Service, f cluster.Family) []netip.Addr {
	if svc.Type != cluster.TypeLoadBalancer {
		return nil
	}
	var out []netip.Addr
	for _, ip := range svc.LoadBalancerIPs {
		if cluster.FamilyOf(ip) == f && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// HealthTargets lists the healthCheckNodePorts the gateway must probe: with nodePort
// forwarding, every node address of each family an eTP=Local LoadBalancer Service has VIPs in, on the
// Service's healthCheckNodePort. Sorted, without duplicates.
func HealthTargets(cfg Config, st *cluster.State) []HealthTarget {
	cfg = cfg.withDefaults()
	if !cfg.toNodes() || st == nil {
		return nil
	}
	seen := map[HealthTarget]bool{}
	var out []HealthTarget
	for _, f := range cfg.Families {
		nodes := gatewayNodes(cfg, st, f)
		for _, svc := range st.Services {
			if !svc.ExternalPolicyLocal || svc.HealthCheckNodePort == 0 || len(gatewayVIPs(svc, f)) == 0 {
				continue
			}
			for _, n := range nodes {
				t := HealthTarget{n.addr, svc.HealthCheckNodePort}
				if !seen[t] {
					seen[t] = true
					out = append(out, t)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b HealthTarget) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// ExpectedHealth is the health the probes would find if every node's healthCheckNodePort told the
// truth about the EndpointSlices: a node is healthy for a Service when a ready endpoint of the Service
// runs on it. `vipgate render` uses it, having no probes.
func ExpectedHealth(cfg Config, st *cluster.State) Health {
	cfg = cfg.withDefaults()
	h := Health{}
	if st == nil {
		return h
	}
	for _, f := range cfg.Families {
		byName := map[string]netip.Addr{}
		for _, n := range gatewayNodes(cfg, st, f) {
			byName[n.name] = n.addr
		}
		for key, svc := range st.Services {
			if !svc.ExternalPolicyLocal || svc.HealthCheckNodePort == 0 {
				continue
			}
			for _, es := range st.EndpointSlices[key] {
				for _, ep := range es.Endpoints {
					if a, ok := byName[ep.NodeName]; ok && ep.Ready {
						h[HealthTarget{a, svc.HealthCheckNodePort}] = true
					}
				}
			}
		}
	}
	return h
}

// gatewaySNAT decides whether the gateway masquerades a Service's traffic. auto masquerades only
// nodePort forwarding to eTP=Cluster Services: the node masquerades those itself, so the client
// address is lost anyway, and SNAT at the gateway makes replies come back through it whatever the
// nodes' routes. Everything else keeps the client address, which needs the replies routed back
// through the gateway (docs/gateway.md).
func gatewaySNAT(cfg Config, svc *cluster.Service) bool {
	switch cfg.SNAT {
	case cluster.SNATAlways:
		return true
	case cluster.SNATNever:
		return false
	}
	return cfg.Forwarding == cluster.ForwardNodePort && !svc.ExternalPolicyLocal
}

// ServiceEntries decides where each VIP port of svc goes in family f: the pure heart of the
// gateway. Entries without backends are returned too (with Why), so they can be reported.
func ServiceEntries(cfg Config, f cluster.Family, svc *cluster.Service, slices_ []*cluster.EndpointSlice, nodes []gatewayNode, health Health) []Entry {
	vips := gatewayVIPs(svc, f)
	if len(vips) == 0 {
		return nil
	}
	snat := gatewaySNAT(cfg, svc)
	alg, _ := gatewayAlgorithm(cfg, svc)
	var ranges []netip.Prefix
	if cfg.Forwarding != cluster.ForwardRoute {
		for _, r := range dataplane.FamilyRanges(svc.LoadBalancerSourceRanges, f) {
			ranges = append(ranges, r.Masked())
		}
	}
	var out []Entry
	targets := dataplane.ResolveTargetPorts(svc.Ports, slices_)
	for j, sp := range svc.Ports {
		proto := dataplane.ProtoNumber(sp.Protocol)
		if proto == 0 {
			continue
		}
		var backends, draining []netip.AddrPort
		why := ""
		switch cfg.Forwarding {
		case cluster.ForwardDirect:
			eps := dataplane.PortEndpoints(targets, j, slices_, f, "")
			ready := dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Ready })
			if len(ready) == 0 {
				// As the node does: while nothing is ready, what is still serving while terminating
				// keeps existing and new connections working through a rolling update.
				ready = dataplane.FilterEndpoints(eps, func(e dataplane.Endpoint) bool { return e.Serving && e.Terminating })
			}
			onDraining := endpointsOnNodes(slices_, nodes)
			for _, e := range ready {
				switch onDraining[e.Addr] {
				case nodeDraining:
					draining = append(draining, e.AddrPort())
				case nodeGone:
				default:
					backends = append(backends, e.AddrPort())
				}
			}
			if len(backends) == 0 && len(draining) > 0 {
				// Every endpoint is on a draining node: they keep serving new flows rather than none.
				backends, draining = draining, nil
			}
			if len(backends) == 0 {
				why = "no ready endpoints"
			}
		default:
			// nodePort: to the node's NodePort; route: the packet as it is, to the VIP port, through
			// the node.
			port := sp.NodePort
			if cfg.Forwarding == cluster.ForwardRoute {
				port = sp.Port
			} else if sp.NodePort == 0 {
				why = "the Service port has no NodePort (allocateLoadBalancerNodePorts: false?): nodePort forwarding cannot reach it"
				break
			}
			for _, n := range nodes {
				b := netip.AddrPortFrom(n.addr, port)
				if n.gone {
					continue
				}
				if svc.ExternalPolicyLocal && svc.HealthCheckNodePort != 0 && !health[HealthTarget{n.addr, svc.HealthCheckNodePort}] {
					// The node answers 503 while its local endpoints terminate: it drains (its
					// established flows go on), else it is out.
					if terminatingOn(slices_, n.name) {
						draining = append(draining, b)
					}
					continue
				}
				if n.draining {
					draining = append(draining, b)
					continue
				}
				backends = append(backends, b)
			}
			if len(backends) == 0 && len(draining) > 0 {
				// Every usable node drains: they keep taking new flows rather than none — the nodes
				// marked draining if any, else the nodes whose local endpoints all terminate (still
				// serving: without them the VIP port would have no node and its established flows
				// would be cut at once).
				for _, b := range draining {
					if i := slices.IndexFunc(nodes, func(n gatewayNode) bool { return n.addr == b.Addr() }); i >= 0 && nodes[i].draining {
						backends = append(backends, b)
					}
				}
				if len(backends) == 0 {
					backends = slices.Clone(draining)
				}
				draining = slices.DeleteFunc(draining, func(b netip.AddrPort) bool { return slices.Contains(backends, b) })
			}
			if len(backends) == 0 {
				if svc.ExternalPolicyLocal {
					why = "no node's healthCheckNodePort answers 200"
				} else {
					why = "no nodes known"
				}
			}
		}
		slices.SortFunc(backends, netip.AddrPort.Compare)
		backends = slices.Compact(backends)
		slices.SortFunc(draining, netip.AddrPort.Compare)
		draining = slices.Compact(draining)
		for _, vip := range vips {
			out = append(out, Entry{Service: svc.Key, VIP: vip, Proto: proto, Port: sp.Port, Backends: backends, SNAT: snat, Why: why, Algorithm: alg, Draining: draining, SourceRanges: ranges})
		}
	}
	return out
}

// gatewayAlgorithm is the Service's balancing algorithm on a gateway, and why it is not the one the
// annotation asks for ("" when it is). A gateway keys its Maglev table by the flow (maglev, the
// default) or by the client address (source-hash); both are stateless and the same on every gateway,
// which the gateways behind one ECMP router need. random and round-robin are per gateway (and in
// forwarding: route, where the gateway keeps no conntrack state, per packet), so they keep Maglev.
//
// sessionAffinity: ClientIP takes source-hash whatever the annotation says: every connection of a
// client must reach the same backend (a node, which then applies the affinity itself, or a pod),
// through any gateway; Maglev over the flow's ports would spread a client's connections over nodes
// whose affinity tables know nothing of each other (the upstream affinity tests fail that way).
func gatewayAlgorithm(cfg Config, svc *cluster.Service) (cluster.LBAlgorithm, string) {
	alg, err := cluster.ServiceLBAlgorithm(svc)
	if svc != nil && svc.AffinityTimeout > 0 {
		if err == nil && (alg == cluster.LBDefault || alg == cluster.LBSourceHash) {
			return cluster.LBSourceHash, ""
		}
		return cluster.LBSourceHash, fmt.Sprintf("metadata.annotations[%s] is not followed: sessionAffinity ClientIP keeps a client on one backend by source-hash", cluster.LBAlgorithmAnnotation)
	}
	switch {
	case err != nil:
		return cluster.LBMaglev, err.Error() + " (on a gateway the default is maglev)"
	case alg == cluster.LBRandom || alg == cluster.LBRoundRobin:
		return cluster.LBMaglev, fmt.Sprintf("metadata.annotations[%s]: %s is not done by gateways (two gateways behind ECMP would pick different backends for one flow); maglev is used", cluster.LBAlgorithmAnnotation, alg)
	case alg == cluster.LBSourceHash:
		return alg, ""
	}
	return cluster.LBMaglev, ""
}

func gatewayEntryEqual(a, b Entry) bool {
	return a.Service == b.Service && a.VIP == b.VIP && a.Proto == b.Proto && a.Port == b.Port && a.SNAT == b.SNAT &&
		a.Why == b.Why && a.Algorithm == b.Algorithm && slices.Equal(a.Backends, b.Backends) && slices.Equal(a.Draining, b.Draining) &&
		slices.Equal(a.SourceRanges, b.SourceRanges)
}
