package proxy

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/tablenames"
)

// NodeInfo is what the per-Service rules depend on besides the Service itself.
type NodeInfo struct {
	Family   cluster.Family
	NodeName string
	Zone     string
	// NodeIPs are used for loadBalancerSourceRanges: a range that holds a node IP also admits the
	// LoadBalancer IPs as sources (traffic from the node to its own VIP arrives with the VIP as source).
	NodeIPs []netip.Addr
	// PodTrafficKnown says whether cluster CIDRs are configured (pod traffic can be recognised).
	PodTrafficKnown bool
	// Screen refuses external and LoadBalancer IPs the node's policy does not allow (nil: all
	// allowed).
	Screen *AddressScreen
	// shared, if set, holds one copy of each shared chain name the parts built with it use: the
	// proxier's parts keep the names (a full sync builds the same few for every Service).
	shared map[string]string
	// names, if set, shares equal name lists between the parts built with it (packed name tables,
	// Uses): a full sync builds the same few for most Services.
	names *dataplane.NameInterner
	// picks, if set, holds the names of the shared pickers (pickChain).
	picks map[pickKey]string
	// Limits bound what one Service may cost (budget.go); zero fields are the defaults.
	Limits cluster.ServiceLimits
}

// entry is one way into a Service port: an IP (ClusterIP, external IP, LoadBalancer IP) or the NodePort.
type entry struct {
	nodePort bool
	addr     netip.Addr
	port     uint16
}

// BuildService builds the part of one family's table that a Service owns: its map elements and the
// few chains only it needs (externalTrafficPolicy=Local, source ranges, session affinity). A headless
// or ExternalName Service, or one with no ClusterIP of this family, owns nothing.
func BuildService(n NodeInfo, svc *cluster.Service, eps []*cluster.EndpointSlice) *dataplane.Part {
	return buildService(n, svc, eps, false)
}

// buildService is BuildService; with pack set the part's elements and backends come packed
// (compact.go), as the proxier keeps them, without the slices of Elements and Backends the packed
// form replaces ever being allocated.
func buildService(n NodeInfo, svc *cluster.Service, eps []*cluster.EndpointSlice, pack bool) *dataplane.Part {
	p := &dataplane.Part{}
	if svc == nil || svc.Headless || svc.Type == cluster.TypeExternalName {
		return p
	}
	var clusterIP netip.Addr
	for _, ip := range svc.ClusterIPs {
		if cluster.FamilyOf(ip) == n.Family {
			clusterIP = ip.Unmap()
			break
		}
	}
	if !clusterIP.IsValid() {
		return p
	}
	// The builder is ~300 bytes of garbage per Service otherwise, and garbage allocated among the
	// parts a full sync keeps leaves holes in their memory after it is collected.
	b := builderPool.Get().(*serviceBuilder)
	*b = serviceBuilder{n: n, svc: svc, p: p}
	b.uses = b.usesBuf[:0]
	// A bad vipgate.io/lb-algorithm keeps the default and is reported with the Service's refusals
	// (log, Event, /status), as a refused address is.
	alg, err := cluster.ServiceLBAlgorithm(svc)
	if err != nil {
		p.Refused = append(p.Refused, dataplane.Refusal{Field: "metadata.annotations[" + cluster.LBAlgorithmAnnotation + "]", Reason: err.Error()})
	}
	b.alg = alg
	// The addresses besides the cluster IP, screened once for all ports: a refused one is no entry
	// of this Service at all, and the Part says why.
	b.externalIPs = n.Screen.screen(b.familyAddrs(svc.ExternalIPs), true, &p.Refused)
	if svc.Type == cluster.TypeLoadBalancer {
		b.lbIPs = n.Screen.screen(b.familyAddrs(svc.LoadBalancerIPs), false, &p.Refused)
	}
	// What the Service may cost (budget.go): its entries are known before anything is built.
	b.limits = n.Limits.WithDefaults()
	b.entries = serviceEntries(svc, len(b.externalIPs), len(b.lbIPs))
	b.over = dataplane.EntriesOverLimit(b.limits, b.entries, len(svc.Ports))
	// The elements are built in a reused scratch slice and kept in one of their exact size (or
	// packed): a full sync holds ~150,000 of them, and memory the process touches for the first
	// time is what a full sync pays most for (page faults) after the kernel's own work. Packed, the
	// backends are built in a scratch slice too.
	scratch := elementScratch.Get().(*[]dataplane.Element)
	p.Elements = append((*scratch)[:0], dataplane.Element{Set: SetClusterIPs, Addr: clusterIP})
	var bscratch *[]dataplane.Backend
	var epScratch *[]dataplane.Endpoint
	if pack {
		bscratch = backendScratch.Get().(*[]dataplane.Backend)
		p.Backends = (*bscratch)[:0]
		epScratch = endpointScratch.Get().(*[]dataplane.Endpoint)
		b.endpoints = (*epScratch)[:0]
	}
	if b.over == "" {
		targets := dataplane.ResolveTargetPorts(svc.Ports, eps)
		for j, sp := range svc.Ports {
			if !b.afford(0) {
				break
			}
			b.port(sp, clusterIP, eps, targets, j)
		}
		b.afford(0)
	}
	if b.over != "" {
		// Refused as a whole: only the cluster IP stays (its connections are rejected as on an
		// undefined port), with the reason.
		p.Elements = p.Elements[:1]
		p.Chains, p.Sets, p.Entries, p.LocalEndpoints = nil, nil, nil, 0
		if p.Backends != nil {
			p.Backends = p.Backends[:0]
		}
		b.uses = b.uses[:0]
		p.Refused = append(p.Refused, dataplane.Refusal{Field: dataplane.RefusalFieldService, Addr: clusterIP, Reason: b.over})
	}
	built, backends := p.Elements, p.Backends
	if !pack || !p.PackFrom(built, backends, n.names) {
		p.Elements = slices.Clone(built)
		if pack {
			p.Backends = slices.Clone(backends)
		}
	}
	clear(built) // no references kept from the pool
	*scratch = built[:0]
	elementScratch.Put(scratch)
	if pack {
		clear(backends)
		*bscratch = backends[:0]
		backendScratch.Put(bscratch)
		eps := b.endpoints[:cap(b.endpoints)]
		clear(eps) // the hints are the state's slices
		*epScratch = eps[:0]
		endpointScratch.Put(epScratch)
	}
	slices.Sort(b.uses)
	p.Uses = *n.names.Intern(b.uses)
	*b = serviceBuilder{}
	builderPool.Put(b)
	return p
}

var (
	elementScratch = sync.Pool{New: func() any { s := make([]dataplane.Element, 0, 64); return &s }}
	backendScratch = sync.Pool{New: func() any { s := make([]dataplane.Backend, 0, 64); return &s }}
	// endpointScratch holds serviceBuilder.endpoints.
	endpointScratch = sync.Pool{New: func() any { s := make([]dataplane.Endpoint, 0, 64); return &s }}
	builderPool     = sync.Pool{New: func() any { return new(serviceBuilder) }}
)

type serviceBuilder struct {
	n   NodeInfo
	svc *cluster.Service
	p   *dataplane.Part
	// uses lists the shared chains the part uses, once each (a Service uses one or two; a slice
	// costs less than a map in a full sync, which builds every Service).
	uses    []string
	usesBuf [4]string
	// externalIPs and lbIPs are the Service's external and LoadBalancer IPs of this family that
	// passed the node's screen.
	externalIPs, lbIPs []netip.Addr
	// alg is the Service's balancing algorithm (vipgate.io/lb-algorithm; LBDefault is random).
	alg cluster.LBAlgorithm
	// endpoints is scratch space for a port's endpoints (see portEndpoints): nil, or a slice of
	// endpointScratch.
	endpoints []dataplane.Endpoint
	// limits are the Service limits (defaults applied), entries the Service's entry count; over
	// says why the Service is over them ("" while it is not), rules counts the rules of its own
	// chains (budget.go).
	limits  cluster.ServiceLimits
	entries int
	over    string
	rules   int
	// chainIdx indexes the part's chains by name once it has more than a few (hasChain): a
	// Service's chains are per port, and they are looked up per entry.
	chainIdx map[string]bool
}

func (b *serviceBuilder) familyAddrs(in []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range in {
		if cluster.FamilyOf(a) == b.n.Family {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// smallChains is how many chains a part may have before hasChain indexes them.
const smallChains = 8

// hasChain says whether the part has its chain called name: a scan while it has a few (most
// Services), an index beyond, since a Service's chains are per port and looked up per entry.
func (b *serviceBuilder) hasChain(name string) bool {
	if b.chainIdx != nil {
		return b.chainIdx[name]
	}
	return slices.ContainsFunc(b.p.Chains, func(c *dataplane.Chain) bool { return c.Name == name })
}

func (b *serviceBuilder) addChain(c *dataplane.Chain) {
	if b.hasChain(c.Name) {
		return
	}
	b.p.Chains = append(b.p.Chains, c)
	b.rules += len(c.Rules)
	if b.chainIdx == nil && len(b.p.Chains) > smallChains {
		b.chainIdx = make(map[string]bool, 2*len(b.p.Chains))
		for _, c := range b.p.Chains {
			b.chainIdx[c.Name] = true
		}
	} else if b.chainIdx != nil {
		b.chainIdx[c.Name] = true
	}
}

func (b *serviceBuilder) use(chain string) string {
	for _, u := range SharedUses(chain) {
		u = b.sharedName(u)
		if !slices.Contains(b.uses, u) {
			b.uses = append(b.uses, u)
		}
	}
	return b.sharedName(chain)
}

// sharedName returns the copy of shared chain name s that NodeInfo.shared holds, if it is set.
func (b *serviceBuilder) sharedName(s string) string {
	if b.n.shared == nil {
		return s
	}
	if c, ok := b.n.shared[s]; ok {
		return c
	}
	b.n.shared[s] = s
	return s
}

func (b *serviceBuilder) port(sp cluster.ServicePort, clusterIP netip.Addr, slices_ []*cluster.EndpointSlice, targets dataplane.TargetPorts, j int) {
	proto := dataplane.ProtoNumber(sp.Protocol)
	if proto == 0 || sp.Port == 0 {
		return
	}
	svc := b.svc
	// The port's name is only part of the chains of its own it may have (affinity, round-robin,
	// externalTrafficPolicy, source ranges); most ports have none, and a full sync would format a
	// name for each of them to throw away.
	var name string
	if svc.AffinityTimeout > 0 || b.alg == cluster.LBRoundRobin || len(b.externalIPs) > 0 || len(b.lbIPs) > 0 ||
		(sp.NodePort != 0 && (svc.Type == cluster.TypeNodePort || svc.Type == cluster.TypeLoadBalancer)) {
		name = tablenames.ServicePortName(svc.Key, proto, sp.Port)
	}
	externalIPs, lbIPs := b.externalIPs, b.lbIPs
	nodePort := sp.NodePort
	if svc.Type != cluster.TypeNodePort && svc.Type != cluster.TypeLoadBalancer {
		nodePort = 0
	}
	external := len(externalIPs) > 0 || len(lbIPs) > 0 || nodePort != 0
	all := dataplane.AppendPortEndpoints(b.endpoints, targets, j, slices_, b.n.Family, b.n.NodeName)
	b.endpoints = all[:0] // the next port's scratch
	cat := Categorize(all, svc, external, b.n.NodeName, b.n.Zone)
	externalLocal := svc.ExternalPolicyLocal && external

	internal := cat.Cluster
	hasInternal := cat.HasAny
	if svc.InternalPolicyLocal {
		internal = cat.Local
		hasInternal = len(cat.Local) > 0
	}
	externalSet := cat.Cluster
	hasExternal := cat.HasAny
	if externalLocal {
		externalSet = cat.Local
		hasExternal = len(cat.Local) > 0
	}
	// Verdict for traffic that found no endpoint: reject when the Service has none at all (the client
	// learns at once), drop when only the local policy has none (as kube-proxy does).
	noEndpoints := dataplane.VerdictDrop
	if !cat.HasAny {
		noEndpoints = dataplane.VerdictReject
	}

	// Backends: the endpoints this port DNATs to (cat.Local is a subset of all, like cat.Cluster;
	// all holds each addr:port once). Hairpin: a local endpoint reaching its own Service lands on
	// itself; masquerade so it answers.
	if b.p.Backends == nil {
		b.p.Backends = make([]dataplane.Backend, 0, len(all)*len(svc.Ports))
	}
	cc, lc := 0, 0 // cursors into cat.Cluster and cat.Local, walked along with all
	for _, e := range all {
		inCluster, inLocal := advanceTo(cat.Cluster, &cc, e), advanceTo(cat.Local, &lc, e)
		if !inCluster && !inLocal {
			continue
		}
		b.p.Backends = append(b.p.Backends, dataplane.Backend{Proto: proto, Endpoint: e.AddrPort()})
		if e.Local {
			b.p.Elements = append(b.p.Elements, dataplane.Element{Set: SetHairpin, Addr: e.Addr, Addr2: e.Addr, Proto: proto, Port: e.Port})
		}
	}
	// The healthCheckNodePort counts local READY endpoints only, as kube-proxy's
	// LocalReadyEndpoints does: a node whose local endpoints all terminate must fail the load
	// balancer's health check (so it stops sending new connections), even though traffic that still
	// arrives falls back to the serving-terminating ones (cat.Local).
	localReady := 0
	for _, e := range all {
		if e.Local && e.Ready {
			localReady++
		}
	}
	b.p.LocalEndpoints = max(b.p.LocalEndpoints, localReady)

	// ClusterIP.
	ci := entry{addr: clusterIP, port: sp.Port}
	b.p.Entries = append(b.p.Entries, dataplane.EntryRef{Proto: proto, Addr: clusterIP, Port: sp.Port, HasEndpoints: hasInternal})
	if hasInternal {
		target := b.pick(ci, proto, internal, false, name, policyName(svc.InternalPolicyLocal))
		b.vmap(ci, proto, target)
	} else {
		b.noEndpoint(ci, proto, noEndpoints)
	}

	// External entries.
	var entryBuf [4]entry // on the stack for the usual few
	entries := entryBuf[:0]
	for _, a := range externalIPs {
		entries = append(entries, entry{addr: a, port: sp.Port})
	}
	for _, a := range lbIPs {
		entries = append(entries, entry{addr: a, port: sp.Port})
	}
	if nodePort != 0 {
		entries = append(entries, entry{nodePort: true, port: nodePort})
	}
	for _, e := range entries {
		if !b.afford(0) {
			return
		}
		b.p.Entries = append(b.p.Entries, dataplane.EntryRef{Proto: proto, Addr: e.addr, Port: e.port, NodePort: e.nodePort, HasEndpoints: hasExternal})
		if cat.HasAny {
			b.vmap(e, proto, b.externalTarget(e, proto, name, externalLocal, cat, externalSet))
		}
		if !hasExternal {
			b.noEndpoint(e, proto, noEndpoints)
		}
	}

	// loadBalancerSourceRanges: checked before DNAT on the LoadBalancer IPs only (NodePorts are not
	// subject to it, as in kube-proxy). Ranges are per family, as kube-proxy filters them: a family
	// without ranges of its own is open (cluster.ServiceFromAPI drops a family's ranges when it has a
	// /0, which opens it).
	ranges := dataplane.FamilyRanges(svc.LoadBalancerSourceRanges, b.n.Family)
	if len(lbIPs) > 0 && len(ranges) > 0 {
		if !b.afford(cluster.RuleCost*(len(ranges)+len(lbIPs)+1) + len(lbIPs)) {
			return
		}
		fw := PerPortChain(ChainRoleFirewall, name, "")
		var rules []dataplane.Rule
		allowFromNode := false
		for _, r := range ranges {
			rules = append(rules, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInPrefix, Prefix: r.Masked()}}, Action: dataplane.Action{Kind: dataplane.ActReturn}})
			for _, nip := range b.n.NodeIPs {
				if r.Contains(nip) {
					allowFromNode = true
				}
			}
		}
		if allowFromNode {
			for _, a := range lbIPs {
				rules = append(rules, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInPrefix, Prefix: netip.PrefixFrom(a, a.BitLen())}}, Action: dataplane.Action{Kind: dataplane.ActReturn}})
			}
		}
		rules = append(rules, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActDrop}, Comment: tablenames.CommentNotInSourceRanges})
		b.addChain(&dataplane.Chain{Name: fw, Rules: rules})
		for _, a := range lbIPs {
			b.p.Elements = append(b.p.Elements, dataplane.Element{Set: tablenames.MapFirewallIPs, Addr: a, Proto: proto, Port: sp.Port, Verdict: dataplane.VerdictGoto, Chain: fw})
		}
	}
}

func policyName(local bool) string {
	if local {
		return PolicyLocal
	}
	return PolicyCluster
}

func (b *serviceBuilder) vmap(e entry, proto uint8, chain string) {
	if e.nodePort {
		b.p.Elements = append(b.p.Elements, dataplane.Element{Set: MapServiceNodePorts, Proto: proto, Port: e.port, Verdict: dataplane.VerdictGoto, Chain: chain})
		return
	}
	b.p.Elements = append(b.p.Elements, dataplane.Element{Set: tablenames.MapServiceIPs, Addr: e.addr, Proto: proto, Port: e.port, Verdict: dataplane.VerdictGoto, Chain: chain})
}

func (b *serviceBuilder) noEndpoint(e entry, proto uint8, v dataplane.VerdictKind) {
	el := dataplane.Element{Set: MapNoEndpointServices, Addr: e.addr, Proto: proto, Port: e.port, Verdict: v}
	if e.nodePort {
		el = dataplane.Element{Set: MapNoEndpointNodePorts, Proto: proto, Port: e.port, Verdict: v}
	}
	if v == dataplane.VerdictReject {
		el.Verdict, el.Chain = dataplane.VerdictReject, dataplane.ChainReject
	}
	b.p.Elements = append(b.p.Elements, el)
}

// pick returns the chain that DNATs entry e to one of eps, and adds the elements that chain needs.
// With session affinity it is the Service port's own affinity chain (affinity decides before any
// algorithm), with round-robin the port's own round-robin chain; otherwise the shared picker of the
// Service's algorithm (random, source-hash, maglev) for len(eps) endpoints, keyed by the entry in the
// endpoint map (the "-cluster" map when clusterMap).
func (b *serviceBuilder) pick(e entry, proto uint8, eps []dataplane.Endpoint, clusterMap bool, name, policy string) string {
	if b.svc.AffinityTimeout > 0 {
		return b.affinityChain(eps, name, policy)
	}
	if b.alg == cluster.LBRoundRobin {
		return b.roundRobinChain(eps, name, policy)
	}
	m := endpointMap(e.nodePort, clusterMap)
	el := dataplane.Element{Set: m, Proto: proto, Port: e.port}
	if !e.nodePort {
		el.Addr = e.addr
	}
	if b.alg == cluster.LBMaglev {
		// Maglev: M slots per entry, slot -> endpoint, the same table on every node; M sized to
		// the endpoints (maglev.NodeSizeFor), and within the Service's limit.
		size := maglev.NodeSizeFor(len(eps))
		if !b.afford(size) {
			return b.use(PickChainFor(cluster.LBMaglev, m, size)) // the part is refused
		}
		names := make([]string, len(eps))
		for i, ep := range eps {
			names[i] = ep.AddrPort().String()
		}
		if table, err := maglev.Table(names, size); err == nil {
			for slot, i := range table {
				el.Index, el.DataAddr, el.DataPort = uint32(slot), eps[i].Addr, eps[i].Port
				b.p.Elements = append(b.p.Elements, el)
			}
			return b.use(PickChainFor(cluster.LBMaglev, m, size))
		}
		// Unreachable (maglev.SizeFor leaves room for every endpoint); random below.
	}
	b.afford(len(eps))
	for i, ep := range eps {
		el.Index, el.DataAddr, el.DataPort = uint32(i), ep.Addr, ep.Port
		b.p.Elements = append(b.p.Elements, el)
	}
	alg := b.alg
	if alg != cluster.LBSourceHash {
		alg = cluster.LBRandom
	}
	return b.use(b.pickChain(alg, m, len(eps)))
}

// pickChain is pickChainFor, the names kept in NodeInfo.shared's picks when it is set: a full sync
// names the same few shared pickers for every Service port.
func (b *serviceBuilder) pickChain(alg cluster.LBAlgorithm, m string, n int) string {
	if b.n.picks == nil {
		return PickChainFor(alg, m, n)
	}
	k := pickKey{alg, m, n}
	if c, ok := b.n.picks[k]; ok {
		return c
	}
	c := b.sharedName(PickChainFor(alg, m, n))
	b.n.picks[k] = c
	return c
}

type pickKey struct {
	alg cluster.LBAlgorithm
	m   string
	n   int
}

// roundRobinChain builds (once) the round-robin chain of a Service port for one endpoint set: rule i
// DNATs to endpoint i when its own `numgen inc mod (n-i)` counter is 0, so it takes every (n-i)-th
// new connection that reaches it and the cascade hands the endpoints out strictly in turn. The
// counters are the rules' own (per node, shared by all CPUs) and start again when the chain is
// replaced (an endpoint change). No set: chains and plain rules are what the kernel charges least for.
func (b *serviceBuilder) roundRobinChain(eps []dataplane.Endpoint, name, policy string) string {
	chain := PerPortChain(ChainRoleRoundRobin, name, policy)
	if b.hasChain(chain) {
		return chain
	}
	rules := make([]dataplane.Rule, 0, len(eps))
	for i, ep := range eps {
		a := dataplane.Action{Kind: dataplane.ActDNATRoundRobin, Addr: ep.Addr, Port: ep.Port}
		if left := len(eps) - i; left > 1 {
			a.Value = uint32(left)
		}
		rules = append(rules, dataplane.Rule{Action: a})
	}
	b.addChain(&dataplane.Chain{Name: chain, Comment: "round-robin " + name + " " + policy, Rules: rules})
	return chain
}

func endpointMap(nodePort, clusterMap bool) string {
	switch {
	case nodePort && clusterMap:
		return MapNodePortEndpointsCluster
	case nodePort:
		return MapNodePortEndpoints
	case clusterMap:
		return MapEndpointsCluster
	}
	return MapEndpoints
}

// externalTarget returns where traffic arriving at an external entry goes.
func (b *serviceBuilder) externalTarget(e entry, proto uint8, name string, local bool, cat Categorized, externalSet []dataplane.Endpoint) string {
	if !local {
		// externalTrafficPolicy Cluster: any endpoint, source NATed so replies come back through us.
		target := b.pick(e, proto, externalSet, false, name, PolicyCluster)
		if IsPickChain(target) {
			return b.use(MasqTwin(target)) // the shared picker's masquerading twin
		}
		// The Service port's own chain (affinity, round-robin): masquerade, then pick.
		ext := PerPortChain(ChainRoleExternal, name, "")
		b.addChain(&dataplane.Chain{Name: ext, Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: ChainMarkForMasquerade}, Comment: CommentMasquerade},
			{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: target}},
		}})
		return ext
	}
	// externalTrafficPolicy Local: the client source is kept and only this node's endpoints serve.
	// Pods and the host itself are not "external": they short-circuit to the cluster-wide endpoints,
	// as if they had gone out to a load balancer and come back.
	// One chain serves all IP entries of the port (the endpoint maps are keyed by the packet's own
	// destination), and one the NodePort.
	role := ChainRoleExternalLocalIP
	if e.nodePort {
		role = ChainRoleExternalLocalNodePort
	}
	chain := PerPortChain(role, name, "")
	var rules []dataplane.Rule
	if len(cat.Cluster) > 0 {
		clusterTarget := b.pick(e, proto, cat.Cluster, true, name, PolicyCluster)
		if b.n.PodTrafficKnown {
			rules = append(rules, dataplane.Rule{
				Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInSet, Set: SetClusterCIDRs}},
				Action:  dataplane.Action{Kind: dataplane.ActGoto, Chain: clusterTarget},
				Comment: CommentShortCircuitPods,
			})
		}
		rules = append(rules,
			dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchFibSaddrLocal}}, Action: dataplane.Action{Kind: dataplane.ActJump, Chain: ChainMarkForMasquerade}, Comment: CommentMasqueradeLocal},
			dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchFibSaddrLocal}}, Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: clusterTarget}, Comment: CommentShortCircuitLocal},
		)
	}
	if len(externalSet) > 0 {
		rules = append(rules, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: b.pick(e, proto, externalSet, false, name, PolicyLocal)}})
	}
	b.addChain(&dataplane.Chain{Name: chain, Rules: rules})
	return chain
}

// affinityChain builds (once) the session-affinity chain of a Service port for one endpoint set: a
// client seen recently goes back to the endpoint it used before, and its timeout restarts; a new
// client picks uniformly, and the port's affinity map records the endpoint it got. One map per
// Service port (and policy, and endpoint port: the map holds addresses): kube-proxy's shape, a set
// and a chain per endpoint, made the number of sets in the table the largest cost of a full sync
// (the kernel finds a set by name with a walk of a list; see dataplane/README.md).
func (b *serviceBuilder) affinityChain(eps []dataplane.Endpoint, name, policy string) string {
	chain := PerPortChain(ChainRoleAffinity, name, policy)
	if b.hasChain(chain) {
		return chain
	}
	mapOf := map[uint16]string{} // endpoint port -> map
	var ports []uint16
	for _, ep := range eps {
		if _, ok := mapOf[ep.Port]; !ok {
			ports = append(ports, ep.Port)
			mapOf[ep.Port] = affinitySetName(chain+"/"+itoa(int(ep.Port)), b.svc.AffinityTimeout)
		}
	}
	slices.Sort(ports)
	rules := make([]dataplane.Rule, 0, 2*len(ports)+len(eps))
	for _, port := range ports {
		m := mapOf[port]
		first := eps[slices.IndexFunc(eps, func(e dataplane.Endpoint) bool { return e.Port == port })]
		b.p.Sets = append(b.p.Sets, &dataplane.Set{Name: m, Kind: dataplane.KindAffinity, Timeout: b.svc.AffinityTimeout,
			Comment: "affinity " + name + " " + policy + " port " + itoa(int(port))})
		rules = append(rules,
			dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInSet, Set: m}}, Action: dataplane.Action{Kind: dataplane.ActAffinityRefresh, Set: m, Addr: first.Addr}},
			dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActAffinityRecall, Set: m, Port: port}})
	}
	// Uniform choice without a set: rule i takes 1/(n-i) of what reaches it.
	for i, ep := range eps {
		left := len(eps) - i
		r := dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActAffinityDNAT, Set: mapOf[ep.Port], Addr: ep.Addr, Port: ep.Port}}
		if left > 1 {
			r.Matches = []dataplane.Match{{Kind: dataplane.MatchNumgenZero, Value: uint32(left)}}
		}
		rules = append(rules, r)
	}
	b.addChain(&dataplane.Chain{Name: chain, Rules: rules})
	return chain
}

// affinitySetName names an affinity map (its comment says whose). The kernel's walk of the list of
// sets compares names with strlen, so the name is short: a 64-bit hash of id.
//
// A timeout other than Kubernetes' default is part of the name. The kernel cannot change a map's
// timeout in one transaction with the rules that use it (the re-created map's delete finds it still
// referenced: EBUSY, the whole sync refused; found by dataplane/memtable's property test and checked
// on the kernel), so a timeout change is a new map: its chain's rules are replaced, then the old map
// is deleted, the order every transaction keeps. Default-timeout maps keep their names across
// upgrades (their clients are not forgotten).
func affinitySetName(id string, timeout time.Duration) string {
	if timeout != cluster.DefaultAffinityTimeout {
		id += "/t" + strconv.FormatInt(int64(timeout/time.Second), 10)
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	return fmt.Sprintf("aff-%016x", h.Sum64())
}

// advanceTo moves *i along set (a sorted subset of a port's endpoints, as PortEndpoints sorts them)
// up to e and says whether set holds e's addr:port.
func advanceTo(set []dataplane.Endpoint, i *int, e dataplane.Endpoint) bool {
	ap := e.AddrPort()
	for *i < len(set) && set[*i].AddrPort().Compare(ap) < 0 {
		*i++
	}
	return *i < len(set) && set[*i].AddrPort() == ap
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var buf [20]byte
	n := len(buf)
	for i > 0 {
		n--
		buf[n] = byte('0' + i%10)
		i /= 10
	}
	return string(buf[n:])
}
