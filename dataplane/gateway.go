package dataplane

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/dataplane/natpath"
)

// This file is the gateway's dataplane: a host in front of the cluster that owns the LoadBalancer IPs
// (VIPs) and forwards their traffic into the cluster, either straight to the pods (forwarding:
// direct) or to the nodes' NodePorts (forwarding: nodePort). It uses the same model, netlink edge,
// renderer and tracer as the node; only the table's shape differs:
//
//	nat-prerouting / nat-output   jump services
//	services                      ip daddr . meta l4proto . th dport vmap @service-ips
//	                                -> goto gateway-pick | gateway-masq-pick  (per VIP port)
//	gateway-pick                  dnat to ... jhash(5-tuple) mod M map @gateway-backends
//	gateway-masq-pick             mark for masquerade, goto gateway-pick
//	nat-postrouting               masquerade marked packets
//	filter-forward/input/output   ip daddr @gateway-vips reject  (a VIP port nobody serves)
//	filter-prerouting-pre-dnat    ct state new jump firewall-check: vmap @firewall-ips
//	                                -> goto fw-<port>: saddr in a range return, else drop
//	                                (only when a VIP port has loadBalancerSourceRanges: gatewayFirewall)
//
// gateway-backends holds a Maglev table per VIP port: (vip, proto, port, slot) -> backend, M slots
// each. Every gateway with the same backends holds the same elements, and the slot is a fixed hash
// of the flow, so gateways behind one ECMP router agree on the backend of every flow. Only one rule
// binds the big map, whatever the number of VIPs (see dataplane/README.md for why that matters).

// Names of the gateway table's own chains and sets (the rest are the node's names from schema.go).
const (
	ChainGatewayPick     = "gateway-pick"
	ChainGatewayMasqPick = "gateway-masq-pick"
	// ChainGatewayPickSH and ChainGatewayMasqPickSH are the source-hash twins (lb-algorithm:
	// source-hash): the same Maglev table, keyed by a hash of the client address only.
	ChainGatewayPickSH     = "gateway-pick-sh"
	ChainGatewayMasqPickSH = "gateway-masq-pick-sh"
	SetGatewayVIPs         = "gateway-vips"
	MapGatewayBackends     = "gateway-backends"
	// MapGatewayBackendsSH holds the Maglev tables of the source-hash VIP ports: a map of its own, so
	// each map is bound by one rule and a slot is only ever read with the hash it was dealt for.
	MapGatewayBackendsSH = "gateway-backends-sh"
)

// GatewayConfig is what the gateway dataplane needs to know.
type GatewayConfig struct {
	Table      string
	Forwarding cluster.Forwarding
	SNAT       cluster.SNATMode
	// Nodes are used for nodePort forwarding when the State knows no nodes.
	Nodes []cluster.Node
	// MaglevSize is the number of slots per VIP port (a prime). 0: derived from the number of
	// backends, maglev.SizeFor of the largest backend count of the family's VIP ports.
	MaglevSize    int
	MasqueradeBit int
	// Families lists the families to program (default: IPv4 and IPv6).
	Families []cluster.Family
	// DrainTimeout is how long a draining node keeps its established flows (default
	// DefaultDrainTimeout); after it the node leaves the connection table.
	DrainTimeout time.Duration
	// FlowTimeout is how long an idle flow keeps its entry in the connection table (forwarding:
	// route; default DefaultGatewayFlowTimeout), and how long after a Maglev table change the
	// previous table's moved slots are daisy chained.
	FlowTimeout time.Duration
	// FastPath, with forwarding: route, also programs each family's route forwarding in a netdev
	// table whose ingress chains fwd the packets to the nodes (gateway_netdev.go); nil: only the
	// family's table, which dups them.
	FastPath *GatewayFastPath
	// NATPath, with forwarding direct or nodePort, also gives each VIP port's Maglev table to the
	// NAT fast path (gateway_natpath.go, dataplane/natpath: a tc BPF program that forwards the
	// flows it takes without the IP stack and conntrack); nil: only the family's table.
	NATPath *GatewayNATPath
	// Limits bound what one Service may cost (budget.go; zero fields: the defaults).
	Limits cluster.ServiceLimits
}

func (c GatewayConfig) withDefaults() GatewayConfig {
	c.Table = cmp.Or(c.Table, cluster.DefaultTableName)
	c.Forwarding = cmp.Or(c.Forwarding, cluster.ForwardNodePort)
	c.SNAT = cmp.Or(c.SNAT, cluster.SNATAuto)
	c.MasqueradeBit = cmp.Or(c.MasqueradeBit, cluster.DefaultMasqueradeBit)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.FlowTimeout = cmp.Or(c.FlowTimeout, DefaultGatewayFlowTimeout)
	if len(c.Families) == 0 {
		c.Families = []cluster.Family{cluster.IPv4, cluster.IPv6}
	}
	return c
}

// HealthTarget is one node's healthCheckNodePort, which the gateway probes for Services with
// externalTrafficPolicy Local and nodePort forwarding.
type HealthTarget struct {
	Addr netip.Addr
	Port uint16
}

// String formats the target as addr:port.
func (h HealthTarget) String() string { return netip.AddrPortFrom(h.Addr, h.Port).String() }

// Health says which health targets answered 200 at their last probe. A target that is missing has
// not answered yet and is not used.
type Health map[HealthTarget]bool

// GatewayEntry is one VIP port the gateway forwards, and where to.
type GatewayEntry struct {
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
func (e GatewayEntry) String() string {
	return fmt.Sprintf("%s %s:%d", ProtoName(e.Proto), e.VIP, e.Port)
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
func gatewayNodes(cfg GatewayConfig, st *cluster.State, f cluster.Family) []gatewayNode {
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

// GatewayHealthTargets lists the healthCheckNodePorts the gateway must probe: with nodePort
// forwarding, every node address of each family an eTP=Local LoadBalancer Service has VIPs in, on the
// Service's healthCheckNodePort. Sorted, without duplicates.
func GatewayHealthTargets(cfg GatewayConfig, st *cluster.State) []HealthTarget {
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
func ExpectedHealth(cfg GatewayConfig, st *cluster.State) Health {
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
func gatewaySNAT(cfg GatewayConfig, svc *cluster.Service) bool {
	switch cfg.SNAT {
	case cluster.SNATAlways:
		return true
	case cluster.SNATNever:
		return false
	}
	return cfg.Forwarding == cluster.ForwardNodePort && !svc.ExternalPolicyLocal
}

// toNodes says the gateway sends VIP traffic to nodes (nodePort or route forwarding), not to pods.
func (cfg GatewayConfig) toNodes() bool {
	return cfg.Forwarding == cluster.ForwardNodePort || cfg.Forwarding == cluster.ForwardRoute
}

// GatewayServiceEntries decides where each VIP port of svc goes in family f: the pure heart of the
// gateway. Entries without backends are returned too (with Why), so they can be reported.
func GatewayServiceEntries(cfg GatewayConfig, f cluster.Family, svc *cluster.Service, slices_ []*cluster.EndpointSlice, nodes []gatewayNode, health Health) []GatewayEntry {
	vips := gatewayVIPs(svc, f)
	if len(vips) == 0 {
		return nil
	}
	snat := gatewaySNAT(cfg, svc)
	alg, _ := gatewayAlgorithm(cfg, svc)
	var ranges []netip.Prefix
	if cfg.Forwarding != cluster.ForwardRoute {
		for _, r := range familyRanges(svc.LoadBalancerSourceRanges, f) {
			ranges = append(ranges, r.Masked())
		}
	}
	var out []GatewayEntry
	targets := ResolveTargetPorts(svc.Ports, slices_)
	for j, sp := range svc.Ports {
		proto := ProtoNumber(sp.Protocol)
		if proto == 0 {
			continue
		}
		var backends, draining []netip.AddrPort
		why := ""
		switch cfg.Forwarding {
		case cluster.ForwardDirect:
			eps := PortEndpoints(targets, j, slices_, f, "")
			ready := filter(eps, func(e Endpoint) bool { return e.Ready })
			if len(ready) == 0 {
				// As the node does: while nothing is ready, what is still serving while terminating
				// keeps existing and new connections working through a rolling update.
				ready = filter(eps, func(e Endpoint) bool { return e.Serving && e.Terminating })
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
			out = append(out, GatewayEntry{Service: svc.Key, VIP: vip, Proto: proto, Port: sp.Port, Backends: backends, SNAT: snat, Why: why, Algorithm: alg, Draining: draining, SourceRanges: ranges})
		}
	}
	return out
}

// gatewayAlgorithm is the Service's balancing algorithm on a gateway, and why it is not the one the
// annotation asks for ("" when it is). A gateway keys its Maglev table by the flow (maglev, the
// default) or by the client address (source-hash); both are stateless and the same on every gateway,
// which the gateways behind one ECMP router need. random and round-robin are per gateway (and in
// forwarding: route, where the gateway keeps no conntrack state, per packet), so they keep Maglev.
func gatewayAlgorithm(cfg GatewayConfig, svc *cluster.Service) (cluster.LBAlgorithm, string) {
	alg, err := cluster.ServiceLBAlgorithm(svc)
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

// gatewayPart turns a Service's entries into its part: a service-ips element and a Maglev table of
// size slots in gateway-backends per entry with backends.
// daisyEnd is when the part's daisy chaining elements expire (zero: it has none); nat are the
// entries' VIP ports for the NAT fast path (GatewayConfig.NATPath), with the same tables.
func gatewayPart(cfg GatewayConfig, entries []GatewayEntry, size int, ids map[netip.Addr]uint32, hist gatewayHistory, now time.Time) (p *Part, daisyEnd time.Time, nat []natpath.VIPPort, err error) {
	p = &Part{}
	for _, e := range entries {
		if len(e.SourceRanges) > 0 {
			// Before DNAT (gatewayFirewall): a client outside the ranges is dropped, whether the
			// port has backends or not, as the node drops it before it rejects.
			fw := perPortChain(ChainRoleFirewall, servicePortName(e.Service, e.Proto, e.Port), "")
			if !slices.ContainsFunc(p.Chains, func(c *Chain) bool { return c.Name == fw }) {
				p.Chains = append(p.Chains, &Chain{Name: fw, Rules: gatewayFirewallRules(e.SourceRanges)})
			}
			p.Elements = append(p.Elements, Element{Set: MapFirewallIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: VerdictGoto, Chain: fw})
		}
		for _, b := range e.Draining {
			// Draining backends are kept: their established flows are not stale.
			p.Backends = append(p.Backends, Backend{Proto: e.Proto, Endpoint: b})
		}
		p.Entries = append(p.Entries, EntryRef{Proto: e.Proto, Addr: e.VIP, Port: e.Port, HasEndpoints: len(e.Backends) > 0})
		if len(e.Backends) == 0 {
			continue
		}
		names := make([]string, len(e.Backends))
		for i, b := range e.Backends {
			names[i] = b.String()
			p.Backends = append(p.Backends, Backend{Proto: e.Proto, Endpoint: b})
		}
		table, err := maglev.Table(names, size)
		if err != nil {
			return nil, time.Time{}, nil, fmt.Errorf("%s: %w", e, err)
		}
		sh := e.Algorithm == cluster.LBSourceHash
		if cfg.Forwarding == cluster.ForwardRoute {
			route := ChainGatewayRoute
			if sh {
				route = ChainGatewayRouteSH
			}
			p.Elements = append(p.Elements, Element{Set: MapServiceIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: VerdictGoto, Chain: route})
			for slot, bi := range table {
				p.Elements = append(p.Elements, Element{Set: [2]string{MapGatewayRoutes, MapGatewayRoutesSH}[boolInt(sh)], Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: e.Backends[bi].Addr()})
			}
			if !sh {
				p.Elements = append(p.Elements, gatewayConnElements(e, table, ids)...)
				prev, changed := hist.advance(e, table, size, now)
				prev, end := daisyWindow(prev, changed, now, cfg.FlowTimeout)
				if daisy := gatewayDaisyElements(e, table, prev, ids); len(daisy) > 0 {
					p.Elements = append(p.Elements, daisy...)
					if daisyEnd.IsZero() || end.Before(daisyEnd) {
						daisyEnd = end
					}
				}
			}
			continue
		}
		if v, ok := natPort(cfg, e, table); ok {
			nat = append(nat, v)
		}
		pick := [2][2]string{{ChainGatewayPick, ChainGatewayMasqPick}, {ChainGatewayPickSH, ChainGatewayMasqPickSH}}[boolInt(sh)][boolInt(e.SNAT)]
		p.Elements = append(p.Elements, Element{Set: MapServiceIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: VerdictGoto, Chain: pick})
		for slot, bi := range table {
			b := e.Backends[bi]
			p.Elements = append(p.Elements, Element{Set: [2]string{MapGatewayBackends, MapGatewayBackendsSH}[boolInt(sh)], Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: b.Addr(), DataPort: b.Port()})
		}
	}
	return p, daisyEnd, nat, nil
}

// gatewayFirewallRules are the rules of a VIP port's fw- chain: the node's (build.go), without its
// rules for traffic from the node itself (the gateway checks only what it receives, in prerouting).
func gatewayFirewallRules(ranges []netip.Prefix) []Rule {
	rules := make([]Rule, 0, len(ranges)+1)
	for _, r := range ranges {
		rules = append(rules, Rule{Matches: []Match{{Kind: MatchSaddrInPrefix, Prefix: r.Masked()}}, Action: Action{Kind: ActReturn}})
	}
	return append(rules, Rule{Action: Action{Kind: ActDrop}, Comment: commentNotInSourceRanges})
}

// BuildGatewayBase builds the fixed part of a gateway table, with the set of every VIP it owns (with
// cfg.MaglevSize slots per VIP port, maglev.DefaultSize if 0, and no source-hash chains).
func BuildGatewayBase(cfg GatewayConfig, f cluster.Family, vips []netip.Addr) *Part {
	return buildGatewayBase(cfg.withDefaults(), f, vips, cmp.Or(cfg.MaglevSize, maglev.DefaultSize), false, false)
}

// buildGatewayBase is BuildGatewayBase for tables of size slots per VIP port, with the source-hash
// chains when sh, and the source ranges check (gatewayFirewall) when fw.
func buildGatewayBase(cfg GatewayConfig, f cluster.Family, vips []netip.Addr, size int, sh, fw bool) *Part {
	if cfg.Forwarding == cluster.ForwardRoute {
		return buildGatewayRouteBase(cfg, f, vips, size, sh)
	}
	mark := uint32(1) << uint(cfg.MasqueradeBit)
	p := &Part{}
	chain := func(c *Chain) { p.Chains = append(p.Chains, c) }
	jump := func(to string) Rule { return Rule{Action: Action{Kind: ActJump, Chain: to}} }
	rejectVIP := Rule{
		Matches: []Match{{Kind: MatchDaddrInSet, Set: SetGatewayVIPs}},
		Action:  Action{Kind: ActReject},
		Comment: "a VIP port without backends",
	}
	// A packet that was DNATed no longer has a VIP as its destination, so only traffic to a VIP port
	// with no backend (or no Service) meets the reject rules; without them it would be routed back
	// out towards the router that sent it.
	chain(&Chain{Name: ChainFilterForward, Type: FilterType, Hook: HookForward, Priority: PriorityFilter, Rules: []Rule{rejectVIP}})
	chain(&Chain{Name: ChainFilterInput, Type: FilterType, Hook: HookInput, Priority: PriorityFilter, Rules: []Rule{rejectVIP}})
	chain(&Chain{Name: ChainFilterOutput, Type: FilterType, Hook: HookOutput, Priority: PriorityFilter, Rules: []Rule{rejectVIP}})
	chain(&Chain{Name: ChainNATPrerouting, Type: NATType, Hook: HookPrerouting, Priority: PriorityDstNAT, Rules: []Rule{jump(ChainServices)}})
	chain(&Chain{Name: ChainNATOutput, Type: NATType, Hook: HookOutput, Priority: PriorityDstNAT, Rules: []Rule{jump(ChainServices)}})
	chain(&Chain{Name: ChainNATPostrouting, Type: NATType, Hook: HookPostrouting, Priority: PrioritySrcNAT, Rules: []Rule{jump(ChainMasquerading)}})
	chain(&Chain{Name: ChainServices, Comment: "VIP dispatch", Rules: []Rule{{Action: Action{Kind: ActVmapTuple, Map: MapServiceIPs}}}})
	chain(&Chain{Name: ChainGatewayPick, Comment: "Maglev: a fixed hash of the flow picks the slot", Rules: []Rule{
		{Action: Action{Kind: ActDNATJhashMap, Map: MapGatewayBackends, Value: uint32(size)}},
	}})
	chain(&Chain{Name: ChainGatewayMasqPick, Rules: []Rule{
		{Action: Action{Kind: ActMarkSet, Value: mark}},
		{Action: Action{Kind: ActGoto, Chain: ChainGatewayPick}},
	}})
	if sh {
		chain(&Chain{Name: ChainGatewayPickSH, Comment: "source-hash: a fixed hash of the client address picks the slot", Rules: []Rule{
			{Action: Action{Kind: ActDNATSrcHashMap, Map: MapGatewayBackendsSH, Value: uint32(size)}},
		}})
		chain(&Chain{Name: ChainGatewayMasqPickSH, Rules: []Rule{
			{Action: Action{Kind: ActMarkSet, Value: mark}},
			{Action: Action{Kind: ActGoto, Chain: ChainGatewayPickSH}},
		}})
	}
	// Not to a port the NAT fast path masquerades to (kernelMasqPorts).
	masq := Action{Kind: ActMasqClearMark, Value: mark}
	masq.Port, masq.PortMax = kernelMasqPorts(cfg.NATPath)
	chain(&Chain{Name: ChainMasquerading, Comment: "source NAT where the gateway must see the replies", Rules: []Rule{
		{Matches: []Match{{Kind: MatchMarkAny, Value: mark}}, Action: masq},
	}})
	p.Sets = []*Set{
		{Name: SetGatewayVIPs, Kind: KindAddr, Comment: "LoadBalancer IPs this gateway forwards"},
		{Name: MapServiceIPs, Kind: KindTupleVmap, Comment: "VIP ports with backends"},
		{Name: MapGatewayBackends, Kind: KindTupleEndpoints, Comment: "VIP . proto . port . Maglev slot -> backend"},
	}
	if sh {
		p.Sets = append(p.Sets, &Set{Name: MapGatewayBackendsSH, Kind: KindTupleEndpoints, Comment: "source-hash VIP . proto . port . Maglev slot -> backend"})
	}
	if fw {
		gatewayFirewall(p)
	}
	p.Elements = gatewayVIPElements(f, vips)
	return p
}

// gatewayFirewall adds the loadBalancerSourceRanges check to a gateway base p (forwarding direct
// and nodePort, when a VIP port of the family has ranges; a table without them stays as it was):
// the node's (schema.go), a filter chain in prerouting just before DNAT whose new connections look
// up firewall-ips, which sends a VIP port with ranges to its fw- chain (gatewayPart): return if the
// client is in a range, else drop. Those VIP ports are not given to the NAT fast path (natPort),
// which would forward them before this hook. The gateway's own traffic (output) is not checked.
func gatewayFirewall(p *Part) {
	p.Chains = append(p.Chains,
		&Chain{Name: ChainFilterPreroutingPreDNAT, Type: FilterType, Hook: HookPrerouting, Priority: PriorityDstNAT - 10, Rules: []Rule{
			{Matches: []Match{{Kind: MatchCtStateNew}}, Action: Action{Kind: ActJump, Chain: ChainFirewallCheck}},
		}},
		&Chain{Name: ChainFirewallCheck, Rules: []Rule{{Action: Action{Kind: ActVmapTuple, Map: MapFirewallIPs}}}},
	)
	p.Sets = append(p.Sets, &Set{Name: MapFirewallIPs, Kind: KindTupleVmap, Comment: "VIP ports subject to loadBalancerSourceRanges"})
}

// gatewayVIPElements are the gateway-vips elements of family f.
func gatewayVIPElements(f cluster.Family, vips []netip.Addr) []Element {
	var out []Element
	for _, v := range vips {
		if cluster.FamilyOf(v) == f {
			out = append(out, Element{Set: SetGatewayVIPs, Addr: v.Unmap()})
		}
	}
	return out
}

// GatewayRuleset is one family's gateway table and the decisions behind it.
type GatewayRuleset struct {
	Ruleset   *Ruleset
	Entries   []GatewayEntry
	Conflicts []cluster.Rejection
	// MaglevSize is the number of slots per VIP port of this table.
	MaglevSize int
	// inputs and kept remember what each Service's part was built from, so the next build reuses the
	// parts of unchanged Services (a Maglev table is M elements to build and to diff).
	inputs map[cluster.ServiceKey]gwInput
	kept   map[cluster.ServiceKey][]GatewayEntry
	// daisyEnd is when each part's daisy chaining elements expire: the part is rebuilt then.
	daisyEnd map[cluster.ServiceKey]time.Time
	// nat are each Service's VIP ports for the NAT fast path (natPorts), built and reused with its
	// part.
	nat map[cluster.ServiceKey][]natpath.VIPPort
	// NextDaisyEnd is the first of them (zero: none), when the caller must sync again.
	NextDaisyEnd time.Time
}

// gwInput is everything a Service's gateway part depends on besides the configuration.
type gwInput struct {
	svc    *cluster.Service
	slices []*cluster.EndpointSlice
	// nodes and health are the node addresses and, for eTP=Local with nodePort forwarding, which of
	// them answer the Service's health check, as strings.
	nodes, health string
}

func (a gwInput) equal(b gwInput) bool {
	return a.svc == b.svc && slices.Equal(a.slices, b.slices) && a.nodes == b.nodes && a.health == b.health
}

// BuildGatewayRuleset builds one family's complete gateway table for st and health.
func BuildGatewayRuleset(cfg GatewayConfig, f cluster.Family, st *cluster.State, health Health) (*GatewayRuleset, error) {
	var d GatewayDrainState
	now := time.Now()
	keep, expired, _ := d.update(drainingNodes(cfg, st), now, cfg.withDefaults().DrainTimeout)
	return buildGatewayRuleset(cfg, f, st, health, nil, gatewayDrain{keep, expired, nil, now})
}

// buildGatewayRuleset is BuildGatewayRuleset reusing the parts of prev (may be nil) whose inputs did
// not change.
func buildGatewayRuleset(cfg GatewayConfig, f cluster.Family, st *cluster.State, health Health, prev *GatewayRuleset, drain gatewayDrain) (*GatewayRuleset, error) {
	cfg = cfg.withDefaults()
	out := &GatewayRuleset{Ruleset: &Ruleset{Family: f, Table: cfg.Table, Services: map[cluster.ServiceKey]*Part{}, Shared: map[string]*Chain{}},
		inputs: map[cluster.ServiceKey]gwInput{}, kept: map[cluster.ServiceKey][]GatewayEntry{}, daisyEnd: map[cluster.ServiceKey]time.Time{},
		nat: map[cluster.ServiceKey][]natpath.VIPPort{}}
	nodes := gatewayNodes(cfg, st, f)
	var nodesKey strings.Builder
	addrs := make([]netip.Addr, 0, len(nodes))
	for i, n := range nodes {
		nodes[i].draining, nodes[i].gone = drain.keep[n.name], drain.expired[n.name]
		nodesKey.WriteString(n.addr.String() + [3]string{",", "~,", "-,"}[boolInt(nodes[i].draining)+2*boolInt(nodes[i].gone)])
		addrs = append(addrs, n.addr)
	}
	ids := GatewayConnIDs(addrs)
	keys := make([]cluster.ServiceKey, 0, len(st.Services))
	for k := range st.Services {
		keys = append(keys, k)
	}
	// Oldest first: of the Services that claim one VIP port, the oldest keeps it
	// (cluster.ClaimOrder), never the one whose name sorts first.
	slices.SortFunc(keys, func(a, b cluster.ServiceKey) int { return cluster.ClaimOrder(st.Services[a], st.Services[b]) })
	type entryID struct {
		vip   netip.Addr
		proto uint8
		port  uint16
	}
	owner := map[entryID]cluster.ServiceKey{}
	limits := cfg.Limits.WithDefaults()
	var vips []netip.Addr
	for _, k := range keys {
		svc := st.Services[k]
		in := gwInput{svc: svc, slices: st.EndpointSlices[k], nodes: nodesKey.String()}
		if cfg.toNodes() && svc.ExternalPolicyLocal {
			// Which nodes drain because their local endpoints terminate is in the slices (compared
			// by pointer above); the health bits say the rest.
			hk := make([]byte, len(nodes))
			for i, n := range nodes {
				hk[i] = '0'
				if health[HealthTarget{n.addr, svc.HealthCheckNodePort}] {
					hk[i] = '1'
				}
			}
			in.health = string(hk)
		}
		out.inputs[k] = in
		// The annotation is the Service's, not a family's: reported with the first family's table.
		if _, why := gatewayAlgorithm(cfg, svc); why != "" && f == cfg.Families[0] {
			out.Conflicts = append(out.Conflicts, cluster.Rejection{Kind: "Service", Object: k.String(), Reason: why})
		}
		// What the Service may cost (budget.go): over a limit, it is refused as a whole.
		if why := gatewayEntriesOverLimits(limits, svc, f); why != "" {
			out.Conflicts = append(out.Conflicts, cluster.Rejection{Kind: "Service", Object: k.String(), Reason: why})
			continue
		}
		entries := GatewayServiceEntries(cfg, f, svc, st.EndpointSlices[k], nodes, health)
		if why := gatewayElementsOverLimits(cfg, limits, entries); why != "" {
			out.Conflicts = append(out.Conflicts, cluster.Rejection{Kind: "Service", Object: k.String(), Reason: why})
			continue
		}
		kept := entries[:0]
		for _, e := range entries {
			id := entryID{e.VIP, e.Proto, e.Port}
			if o, ok := owner[id]; ok && o != k {
				out.Conflicts = append(out.Conflicts, cluster.Rejection{Kind: "Service", Object: k.String(), Addr: e.VIP,
					Reason: fmt.Sprintf("%s is already used by Service %s; not forwarded for this Service", e, o)})
				continue
			}
			owner[id] = k
			kept = append(kept, e)
			if !slices.Contains(vips, e.VIP) {
				vips = append(vips, e.VIP)
			}
		}
		if len(kept) == 0 {
			continue
		}
		out.kept[k] = kept
		out.Entries = append(out.Entries, kept...)
	}
	// One table size for the family: configured, or derived from the largest backend count, so it
	// depends only on what every gateway sees (the same backends give the same size and tables).
	// One size keeps one picker rule binding the big map; with nodePort and route forwarding every
	// VIP port has the same backends (the nodes) anyway.
	size, sh, fw := cfg.MaglevSize, false, false
	if size == 0 {
		most := 0
		for _, e := range out.Entries {
			most = max(most, len(e.Backends))
		}
		size = maglev.SizeFor(most)
	}
	out.MaglevSize = size
	for _, k := range keys {
		kept := out.kept[k]
		if len(kept) == 0 {
			continue
		}
		sh = sh || slices.ContainsFunc(kept, func(e GatewayEntry) bool { return e.Algorithm == cluster.LBSourceHash && len(e.Backends) > 0 })
		fw = fw || slices.ContainsFunc(kept, func(e GatewayEntry) bool { return len(e.SourceRanges) > 0 })
		if prev != nil && prev.MaglevSize == size {
			end, daisy := prev.daisyEnd[k]
			if old, ok := prev.inputs[k]; ok && old.equal(out.inputs[k]) && slices.EqualFunc(prev.kept[k], kept, gatewayEntryEqual) && (!daisy || drain.now.Before(end)) {
				if part := prev.Ruleset.Services[k]; part != nil {
					out.Ruleset.Services[k] = part
					if nat := prev.nat[k]; nat != nil {
						out.nat[k] = nat
					}
					if daisy {
						out.daisyEnd[k] = end
					}
					continue
				}
			}
		}
		part, end, nat, err := gatewayPart(cfg, kept, size, ids, drain.hist, drain.now)
		if err != nil {
			return nil, fmt.Errorf("Service %s: %w", k, err)
		}
		out.Ruleset.Services[k] = part
		if nat != nil {
			out.nat[k] = nat
		}
		if !end.IsZero() {
			out.daisyEnd[k] = end
		}
	}
	for _, end := range out.daisyEnd {
		if out.NextDaisyEnd.IsZero() || end.Before(out.NextDaisyEnd) {
			out.NextDaisyEnd = end
		}
	}
	slices.SortFunc(vips, netip.Addr.Compare)
	out.Ruleset.Base = buildGatewayBase(cfg, f, vips, size, sh, fw)
	return out, nil
}

func gatewayEntryEqual(a, b GatewayEntry) bool {
	return a.Service == b.Service && a.VIP == b.VIP && a.Proto == b.Proto && a.Port == b.Port && a.SNAT == b.SNAT &&
		a.Why == b.Why && a.Algorithm == b.Algorithm && slices.Equal(a.Backends, b.Backends) && slices.Equal(a.Draining, b.Draining) &&
		slices.Equal(a.SourceRanges, b.SourceRanges)
}

// GatewaySyncReport tells the caller what a gateway sync did.
type GatewaySyncReport struct {
	Duration time.Duration
	Full     bool
	Txs      []*Tx
	// Entries are every VIP port of every family, with their backends.
	Entries []GatewayEntry
	// VIPs are the LoadBalancer IPs the gateway forwards (for the speaker that announces them).
	VIPs      []netip.Addr
	Conflicts []cluster.Rejection
	// StaleFlows are the gateway's conntrack entries of UDP/SCTP flows to backends that went away,
	// and of every flow to a node drained past its deadline (nodePort forwarding).
	StaleFlows []conntrack.StaleFlow
	// Draining names the nodes draining within their deadline; NextDrainDeadline is the first of
	// their deadlines (zero: none), when the caller must sync again to end that node's flows.
	Draining          []string
	NextDrainDeadline time.Time
	// NextDaisyEnd is when the first daisy chaining window (forwarding: route, FlowTimeout after a
	// VIP port's Maglev table changed) ends (zero: none): the caller must sync again to end it.
	NextDaisyEnd time.Time
	// NoFastPath says, per family, why the route forwarding fast path (GatewayConfig.FastPath) is
	// not programmed ("IPv4: <why>"); a family without nodes is not listed (nothing to forward).
	NoFastPath []string
	// FastPathWarnings are, per family, what is wrong with a fast path that is on ("IPv4: <what>"):
	// listed ingress devices that do not exist, ingress MTUs larger than the nodes' device's.
	FastPathWarnings []string
	// RetryAt is when the caller must sync again to retry a fast path whose netdev transaction
	// failed, or to delete a netdev table a failed one left (zero: nothing to retry). Sync itself
	// returns no error for those (the family's table forwards), so nothing else would retry them.
	RetryAt time.Time
	// FlowCopies are the copies of a connection table into another that the fast path's coming
	// and going made (gateway_flowcopy.go), those that read something or failed.
	FlowCopies []FlowCopy
	// The NAT fast path (GatewayConfig.NATPath): the VIP ports it was given and the devices it is
	// attached to, what went wrong (it forwards what it holds; the families' tables the rest),
	// and how many of its flows the sync ended (StaleFlows).
	NATPathPorts, NATPathDevices int
	NATPathWarnings              []string
	NATFlowsEnded                int
}

// GatewayProxier owns the gateway's dataplane state, as Proxier does the node's: one goroutine calls
// Sync; every sync rebuilds the whole desired table (a gateway holds at most a few hundred VIPs and its
// input also changes with node health, not only with objects) and sends only the difference.
type GatewayProxier struct {
	log  hclog.Logger
	cfg  GatewayConfig
	prog Programmer

	mu       sync.Mutex
	fams     map[cluster.Family]*GatewayRuleset
	sets     map[cluster.Family]map[string]*Set
	needFull bool
	drain    GatewayDrainState
	// hist keeps each VIP port's Maglev table and the one before it, for daisy chaining.
	hist gatewayHistory
	// now is the clock of the drain deadlines (time.Now; tests set it).
	now func() time.Time
	// ndev and ndevSets are each family's netdev table (FastPath), ndevWhy why a family has no fast
	// path ("" when it has one), for logging a change once.
	ndev     map[cluster.Family]*Ruleset
	ndevSets map[cluster.Family]map[string]*Set
	ndevWhy  map[cluster.Family]string
	// ndevPlan is the plan each netdev table was written for: its device indexes (fwd holds the
	// nodes' device by index, a base chain its device by registration), and the plan a failed
	// lookup keeps (netdevPlan.transient).
	ndevPlan map[cluster.Family]netdevPlan
	// ndevStale: a failed netdev transaction left a table that could not be deleted either; the
	// next sync deletes or rewrites it.
	ndevStale map[cluster.Family]bool
	// ndevFail is each family's last netdev failure, for the backoff of its retries.
	ndevFail map[cluster.Family]*netdevFailure
	// natWarn is the NAT fast path's last warnings, logged when they change.
	natWarn string
}

// netdevFailure is a family's failed netdev transactions in a row. The netdev table is sent again
// only at retryAt, delay (1 s, doubling up to netdevRetryMax) after the last failure, rather than at
// every sync: a table the kernel refuses is sent whole (megabytes with 10k Services), and a busy
// cluster syncs every few tens of milliseconds. A new plan (a device created, a node's device
// changed) is tried at once: it is what may fix it.
type netdevFailure struct {
	retryAt time.Time
	delay   time.Duration
	// why is the failure, reported until the retry; plan the plan that failed.
	why  string
	plan netdevPlan
}

// netdevRetryMin and netdevRetryMax bound the delay of a fast path retry (netdevFailure).
const (
	netdevRetryMin = time.Second
	netdevRetryMax = time.Minute
)

// samePlan says whether a and b program the same netdev table layout.
func samePlan(a, b netdevPlan) bool {
	return a.why == b.why && a.nodeDev == b.nodeDev && a.nodeIndex == b.nodeIndex &&
		slices.Equal(a.ingress, b.ingress) && slices.Equal(a.ingressIndex, b.ingressIndex)
}

// NewGatewayProxier returns a GatewayProxier that programs through prog. The first Sync replaces the
// table.
func NewGatewayProxier(log hclog.Logger, cfg GatewayConfig, prog Programmer) *GatewayProxier {
	return &GatewayProxier{log: log, cfg: cfg.withDefaults(), prog: prog, needFull: true, now: time.Now}
}

// Sync brings the kernel to the gateway table for st and health. On error the kernel keeps its
// previous ruleset and the next Sync replaces the table wholesale.
func (p *GatewayProxier) Sync(st *cluster.State, health Health) (*GatewaySyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	rep := &GatewaySyncReport{Full: p.needFull}
	// The drain clock runs across failed syncs: a deadline counts from when a node was first seen
	// draining.
	now := p.now()
	keep, expired, next := p.drain.update(drainingNodes(p.cfg, st), now, p.cfg.DrainTimeout)
	rep.NextDrainDeadline, rep.Draining = next, slices.Sorted(maps.Keys(keep))
	if p.hist == nil {
		p.hist = gatewayHistory{}
	}
	drain := gatewayDrain{keep, expired, p.hist, now}
	newFams := map[cluster.Family]*GatewayRuleset{}
	newSets := map[cluster.Family]map[string]*Set{}
	newNdev := map[cluster.Family]*Ruleset{}
	newNdevSets := map[cluster.Family]map[string]*Set{}
	ndevWhy := map[cluster.Family]string{}
	ndevPlans := map[cluster.Family]netdevPlan{}
	newFail := map[cluster.Family]*netdevFailure{}
	planOf := map[cluster.Family]netdevPlan{}
	stale := map[cluster.Family]bool{}
	for _, f := range p.cfg.Families {
		var prev *GatewayRuleset
		if !p.needFull {
			prev = p.fams[f]
		}
		grs, err := buildGatewayRuleset(p.cfg, f, st, health, prev, drain)
		if err != nil {
			return rep, err
		}
		var old *GatewayRuleset
		sets := map[string]*Set{}
		if !p.needFull && p.fams[f] != nil {
			old = p.fams[f]
			sets = p.sets[f]
		}
		tx := &Tx{Family: f, Table: p.cfg.Table, Full: old == nil}
		d := &diffState{tx: tx, elemRefs: map[Element]int{}, sharedRefs: map[string]int{}, sharedDelta: map[string]int{}, sets: sets}
		var oldBase *Part
		oldSvcs := map[cluster.ServiceKey]*Part{}
		if old != nil {
			oldBase, oldSvcs = old.Ruleset.Base, old.Ruleset.Services
		}
		d.diffPart(oldBase, grs.Ruleset.Base)
		keys := make([]cluster.ServiceKey, 0, len(oldSvcs)+len(grs.Ruleset.Services))
		for k := range oldSvcs {
			keys = append(keys, k)
		}
		for k := range grs.Ruleset.Services {
			if oldSvcs[k] == nil {
				keys = append(keys, k)
			}
		}
		sortServiceKeys(keys)
		for _, k := range keys {
			o, n := oldSvcs[k], grs.Ruleset.Services[k]
			if o == n {
				continue // reused: nothing changed
			}
			d.diffPart(o, n)
			rep.StaleFlows = append(rep.StaleFlows, gatewayStaleFlows(o, n, expiredAddrs(p.cfg, st, f, expired))...)
		}
		d.finish()
		tx.Sets = sets
		if len(tx.DelSets) > 0 && old != nil {
			// A set the base drops (firewall-ips, when the family's last source ranges go): its
			// elements are deleted first (they hold its goto chains), which needs its kind.
			tx.Sets = maps.Clone(sets)
			for _, s := range old.Ruleset.Base.Sets {
				if _, ok := tx.Sets[s.Name]; !ok && slices.Contains(tx.DelSets, s.Name) {
					tx.Sets[s.Name] = s
				}
			}
		}
		if !tx.Empty() {
			rep.Txs = append(rep.Txs, tx)
		}
		newFams[f], newSets[f] = grs, sets
		// The fast path's netdev table after the family's table: the IP stack's path is complete
		// before the netdev chains take packets away from it.
		plan := netdevPlan{why: "off"}
		if p.cfg.Forwarding == cluster.ForwardRoute && p.cfg.FastPath != nil {
			plan = planNetdev(p.cfg.FastPath, gatewayNodeAddrs(p.cfg, st, f, expired))
			if prev, ok := p.ndevPlan[f]; ok && plan.transient && p.ndev[f] != nil {
				// A lookup that failed (a link flap) is no reason to drop the fast path: that
				// would delete the netdev table and the flows in its gateway-flows.
				p.log.Warn("route forwarding fast path: keeping the previous plan", "family", f, "why", plan.why)
				plan = prev
			}
			ndevWhy[f] = plan.why
			if plan.bigMTU != "" && plan.bigMTU != p.ndevPlan[f].bigMTU {
				p.log.Warn("route forwarding fast path: packets larger than the nodes' MTU are lost", "family", f, "why", plan.bigMTU)
			}
			if plan.missing != "" && plan.missing != p.ndevPlan[f].missing {
				p.log.Warn("route forwarding fast path: ingress devices left out", "family", f, "why", plan.missing)
			}
		}
		planOf[f] = plan
		fail := p.ndevFail[f]
		switch {
		case fail != nil && now.Before(fail.retryAt) && (plan.why == "" && samePlan(plan, fail.plan) || plan.why != "" && p.ndevStale[f]):
			// Within the backoff of a failure, and nothing changed that could fix it: no netdev
			// transaction (whether it would write or delete the table). A table the failure left
			// (stale) stays so until the retry.
			if plan.why == "" {
				ndevWhy[f] = fail.why
			}
			newFail[f] = fail
			if p.ndevStale[f] {
				stale[f] = true
			}
		case plan.why == "":
			nrs := gatewayNetdevRuleset(p.cfg, f, grs, plan)
			var old *Ruleset
			nsets := map[string]*Set{}
			// A new index of a device (re-created under its name) rewrites the table: the diff
			// compares names.
			if prev := p.ndevPlan[f]; !p.needFull && p.ndev[f] != nil && prev.nodeIndex == plan.nodeIndex && slices.Equal(prev.ingressIndex, plan.ingressIndex) {
				old, nsets = p.ndev[f], p.ndevSets[f]
			}
			ntx := &Tx{Family: nrs.Family, Table: nrs.Table, Full: old == nil}
			diffGatewayTables(old, nrs, nsets, ntx)
			if !ntx.Empty() {
				rep.Txs = append(rep.Txs, ntx)
			}
			newNdev[f], newNdevSets[f], ndevPlans[f] = nrs, nsets, plan
		case p.needFull || p.ndev[f] != nil || p.ndevStale[f]:
			// No fast path (now): a full sync, or the end of one, deletes the netdev table, which
			// an earlier configuration or run may have left (an empty Full netdev Tx deletes).
			rep.Txs = append(rep.Txs, &Tx{Family: NetdevFamily(f), Table: NetdevTableName(p.cfg.Table, f), Full: true})
		}
		if !grs.NextDaisyEnd.IsZero() && (rep.NextDaisyEnd.IsZero() || grs.NextDaisyEnd.Before(rep.NextDaisyEnd)) {
			rep.NextDaisyEnd = grs.NextDaisyEnd
		}
		rep.Entries = append(rep.Entries, grs.Entries...)
		rep.Conflicts = append(rep.Conflicts, grs.Conflicts...)
		for _, e := range grs.Entries {
			if !slices.Contains(rep.VIPs, e.VIP) {
				rep.VIPs = append(rep.VIPs, e.VIP)
			}
		}
	}
	slices.SortFunc(rep.VIPs, netip.Addr.Compare)
	// A Service's algorithm refusal is found once per family: report it once.
	slices.SortFunc(rep.Conflicts, func(a, b cluster.Rejection) int {
		return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Reason, b.Reason))
	})
	rep.Conflicts = slices.Compact(rep.Conflicts)
	applied := make([]*Tx, 0, len(rep.Txs))
	// copies: the connection table copies of this sync (gateway_flowcopy.go), with their budget.
	copies := &syncCopies{done: map[cluster.Family]bool{}}
	for _, tx := range rep.Txs {
		var err error
		if isNetdev(tx.Family) {
			err = p.applyNetdev(tx, newFams[ipFamily(tx.Family)].Entries, rep, copies)
		} else {
			err = p.prog.Apply(tx)
		}
		if err == nil {
			applied = append(applied, tx)
			continue
		}
		if isNetdev(tx.Family) {
			// The netdev table is a failure domain of its own: the family's table forwards every
			// packet without it (dup). So the sync goes on without the fast path, and a later one
			// writes the netdev table from scratch; forcing the family's table to be re-created
			// would empty its gateway-flows (every flow's node) and keep failing with it.
			f := ipFamily(tx.Family)
			why := fmt.Sprintf("programming %s: %v", txTableName(tx), err)
			if deletion := tx.Full && len(tx.AddChains) == 0 && len(tx.AddSets) == 0; !deletion {
				// What the failed batch left (it is atomic: the previous netdev table) may be wrong
				// now, e.g. a chain of a device that is gone: delete it, its flows copied first.
				p.saveNetdevFlows(tx, newFams[f].Entries, rep, copies)
				if derr := p.prog.Apply(&Tx{Family: tx.Family, Table: tx.Table, Full: true}); derr != nil {
					why += fmt.Sprintf("; deleting the table: %v", derr)
					stale[f] = true
				}
			} else {
				stale[f] = true // the failed transaction was the deletion
			}
			fail := &netdevFailure{delay: netdevRetryMin, why: why, plan: planOf[f]}
			if prev := p.ndevFail[f]; prev != nil {
				fail.delay = min(2*prev.delay, netdevRetryMax)
			}
			fail.retryAt = now.Add(fail.delay)
			newFail[f] = fail
			delete(newNdev, f)
			delete(newNdevSets, f)
			delete(ndevPlans, f)
			ndevWhy[f] = why
			continue
		}
		p.needFull, p.fams, p.sets = true, nil, nil
		p.log.Error("gateway sync failed; the kernel keeps the previous ruleset, next sync replaces the table",
			"tx", tx.String(), "err", err)
		return rep, fmt.Errorf("programming %s: %w", txTableName(tx), err)
	}
	rep.Txs = applied
	if p.cfg.NATPath != nil {
		p.syncNATPath(newFams, rep.StaleFlows, rep)
	}
	for _, f := range p.cfg.Families {
		why, ok := ndevWhy[f]
		if !ok {
			continue
		}
		if why != "" && why != whyNoNodes {
			rep.NoFastPath = append(rep.NoFastPath, fmt.Sprintf("IPv%d: %s", f, why))
		}
		if plan, on := ndevPlans[f]; on {
			for _, w := range []string{plan.missing, plan.bigMTU} {
				if w != "" {
					rep.FastPathWarnings = append(rep.FastPathWarnings, fmt.Sprintf("IPv%d: %s", f, w))
				}
			}
		}
		if fail := newFail[f]; fail != nil && (rep.RetryAt.IsZero() || fail.retryAt.Before(rep.RetryAt)) {
			rep.RetryAt = fail.retryAt
		}
		// Logged when it changes: a failure that persists (a name the kernel refuses) is tried
		// again after each backoff (netdevFailure), and would fill the log otherwise.
		if old, ok := p.ndevWhy[f]; !ok || old != why {
			if why != "" {
				p.log.Warn("no route forwarding fast path; the family's table forwards alone (dup)", "family", f, "why", why)
			} else {
				p.log.Info("route forwarding fast path on", "family", f, "table", newNdev[f].Table)
			}
		}
	}
	p.fams, p.sets, p.needFull = newFams, newSets, false
	p.ndev, p.ndevSets, p.ndevWhy, p.ndevPlan, p.ndevStale, p.ndevFail = newNdev, newNdevSets, ndevWhy, ndevPlans, stale, newFail
	p.hist.prune(rep.Entries)
	rep.Duration = time.Since(start)
	return rep, nil
}

// Flatten returns the current gateway table of family f, or with NetdevFamily(f) its fast path's netdev
// table (nil before the first successful sync).
func (p *GatewayProxier) Flatten(f cluster.Family) *Flat {
	p.mu.Lock()
	defer p.mu.Unlock()
	if isNetdev(f) {
		if rs := p.ndev[ipFamily(f)]; rs != nil {
			return rs.Flatten()
		}
		return nil
	}
	if g := p.fams[f]; g != nil {
		return g.Ruleset.Flatten()
	}
	return nil
}

// gatewayStaleFlows lists the conntrack entries of datagram flows whose backend left the entry: the
// gateway's conntrack would keep sending a client's UDP "connection" to it forever otherwise. TCP
// connections to a vanished backend fail on their own, and flows whose backend stays keep it (conntrack
// pins a flow to its backend; Maglev only changes the choice for new flows).
func gatewayStaleFlows(old, nw *Part, expired map[netip.Addr]bool) []conntrack.StaleFlow {
	if old == nil {
		return nil
	}
	keep := map[Backend]bool{}
	if nw != nil {
		for _, b := range nw.Backends {
			keep[b] = true
		}
	}
	var out []conntrack.StaleFlow
	seen := map[Backend]bool{}
	for _, b := range old.Backends {
		datagram := b.Proto == ProtoUDP || b.Proto == ProtoSCTP
		if (!datagram && !expired[b.Endpoint.Addr()]) || keep[b] || seen[b] {
			continue
		}
		seen[b] = true
		out = append(out, conntrack.StaleFlow{Proto: b.Proto, ReplySrc: b.Endpoint.Addr(), ReplySrcPort: b.Endpoint.Port()})
	}
	return out
}
