package gateway

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/gateway/natpath"
	"github.com/vipgate/vipgate/tablenames"
)

// This file is the gateway's table and its proxier: a host in front of the cluster that owns the LoadBalancer IPs
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

// gatewayPart turns a Service's entries into its part: a service-ips element and a Maglev table of
// size slots in gateway-backends per entry with backends.
// daisyEnd is when the part's daisy chaining elements expire (zero: it has none); nat are the
// entries' VIP ports for the NAT fast path (Config.NATPath), with the same tables.
func gatewayPart(cfg Config, entries []Entry, size int, ids map[netip.Addr]uint32, hist gatewayHistory, now time.Time, settle time.Duration) (p *dataplane.Part, daisyEnd time.Time, nat []natpath.VIPPort, err error) {
	p = &dataplane.Part{}
	for _, e := range entries {
		if len(e.SourceRanges) > 0 {
			// Before DNAT (gatewayFirewall): a client outside the ranges is dropped, whether the
			// port has backends or not, as the node drops it before it rejects.
			fw := tablenames.FirewallChain(e.Service, e.Proto, e.Port)
			if !slices.ContainsFunc(p.Chains, func(c *dataplane.Chain) bool { return c.Name == fw }) {
				p.Chains = append(p.Chains, &dataplane.Chain{Name: fw, Rules: gatewayFirewallRules(e.SourceRanges)})
			}
			p.Elements = append(p.Elements, dataplane.Element{Set: tablenames.MapFirewallIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: dataplane.VerdictGoto, Chain: fw})
		}
		for _, b := range e.Draining {
			// Draining backends are kept: their established flows are not stale.
			p.Backends = append(p.Backends, dataplane.Backend{Proto: e.Proto, Endpoint: b})
		}
		p.Entries = append(p.Entries, dataplane.EntryRef{Proto: e.Proto, Addr: e.VIP, Port: e.Port, HasEndpoints: len(e.Backends) > 0})
		if len(e.Backends) == 0 {
			// Nothing of this gateway's flows survives: its tables before are no one's previous
			// table (e.g. its own link was down, every node unreachable).
			hist.forget(e)
			continue
		}
		names := make([]string, len(e.Backends))
		for i, b := range e.Backends {
			names[i] = b.String()
			p.Backends = append(p.Backends, dataplane.Backend{Proto: e.Proto, Endpoint: b})
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
			p.Elements = append(p.Elements, dataplane.Element{Set: tablenames.MapServiceIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: dataplane.VerdictGoto, Chain: route})
			for slot, bi := range table {
				p.Elements = append(p.Elements, dataplane.Element{Set: [2]string{MapGatewayRoutes, MapGatewayRoutesSH}[boolInt(sh)], Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: e.Backends[bi].Addr()})
			}
			if !sh {
				p.Elements = append(p.Elements, gatewayConnElements(e, table, ids)...)
				prev, changed := hist.advance(e, table, size, now, settle)
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
		p.Elements = append(p.Elements, dataplane.Element{Set: tablenames.MapServiceIPs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Verdict: dataplane.VerdictGoto, Chain: pick})
		for slot, bi := range table {
			b := e.Backends[bi]
			p.Elements = append(p.Elements, dataplane.Element{Set: [2]string{MapGatewayBackends, MapGatewayBackendsSH}[boolInt(sh)], Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: b.Addr(), DataPort: b.Port()})
		}
	}
	return p, daisyEnd, nat, nil
}

// gatewayFirewallRules are the rules of a VIP port's fw- chain: the node's (build.go), without its
// rules for traffic from the node itself (the gateway checks only what it receives, in prerouting).
func gatewayFirewallRules(ranges []netip.Prefix) []dataplane.Rule {
	rules := make([]dataplane.Rule, 0, len(ranges)+1)
	for _, r := range ranges {
		rules = append(rules, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInPrefix, Prefix: r.Masked()}}, Action: dataplane.Action{Kind: dataplane.ActReturn}})
	}
	return append(rules, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActDrop}, Comment: tablenames.CommentNotInSourceRanges})
}

// BuildBase builds the fixed part of a gateway table, with the set of every VIP it owns (with
// cfg.MaglevSize slots per VIP port, maglev.DefaultSize if 0, and no source-hash chains).
func BuildBase(cfg Config, f cluster.Family, vips []netip.Addr) *dataplane.Part {
	return buildGatewayBase(cfg.withDefaults(), f, vips, cmp.Or(cfg.MaglevSize, maglev.DefaultSize), false, false)
}

// buildGatewayBase is BuildBase for tables of size slots per VIP port, with the source-hash
// chains when sh, and the source ranges check (gatewayFirewall) when fw.
func buildGatewayBase(cfg Config, f cluster.Family, vips []netip.Addr, size int, sh, fw bool) *dataplane.Part {
	if cfg.Forwarding == cluster.ForwardRoute {
		return buildGatewayRouteBase(cfg, f, vips, size, sh)
	}
	mark := uint32(1) << uint(cfg.MasqueradeBit)
	p := &dataplane.Part{}
	chain := func(c *dataplane.Chain) { p.Chains = append(p.Chains, c) }
	jump := func(to string) dataplane.Rule {
		return dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: to}}
	}
	rejectVIP := dataplane.Rule{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetGatewayVIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActReject},
		Comment: "a VIP port without backends",
	}
	// A packet that was DNATed no longer has a VIP as its destination, so only traffic to a VIP port
	// with no backend (or no Service) meets the reject rules; without them it would be routed back
	// out towards the router that sent it.
	chain(&dataplane.Chain{Name: tablenames.ChainFilterForward, Type: dataplane.FilterType, Hook: dataplane.HookForward, Priority: dataplane.PriorityFilter, Rules: []dataplane.Rule{rejectVIP}})
	chain(&dataplane.Chain{Name: tablenames.ChainFilterInput, Type: dataplane.FilterType, Hook: dataplane.HookInput, Priority: dataplane.PriorityFilter, Rules: []dataplane.Rule{rejectVIP}})
	chain(&dataplane.Chain{Name: tablenames.ChainFilterOutput, Type: dataplane.FilterType, Hook: dataplane.HookOutput, Priority: dataplane.PriorityFilter, Rules: []dataplane.Rule{rejectVIP}})
	chain(&dataplane.Chain{Name: tablenames.ChainNATPrerouting, Type: dataplane.NATType, Hook: dataplane.HookPrerouting, Priority: dataplane.PriorityDstNAT, Rules: []dataplane.Rule{jump(tablenames.ChainServices)}})
	chain(&dataplane.Chain{Name: tablenames.ChainNATOutput, Type: dataplane.NATType, Hook: dataplane.HookOutput, Priority: dataplane.PriorityDstNAT, Rules: []dataplane.Rule{jump(tablenames.ChainServices)}})
	chain(&dataplane.Chain{Name: tablenames.ChainNATPostrouting, Type: dataplane.NATType, Hook: dataplane.HookPostrouting, Priority: dataplane.PrioritySrcNAT, Rules: []dataplane.Rule{jump(tablenames.ChainMasquerading)}})
	chain(&dataplane.Chain{Name: tablenames.ChainServices, Comment: "VIP dispatch", Rules: []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapServiceIPs}}}})
	chain(&dataplane.Chain{Name: ChainGatewayPick, Comment: "Maglev: a fixed hash of the flow picks the slot", Rules: []dataplane.Rule{
		{Action: dataplane.Action{Kind: dataplane.ActDNATJhashMap, Map: MapGatewayBackends, Value: uint32(size)}},
	}})
	chain(&dataplane.Chain{Name: ChainGatewayMasqPick, Rules: []dataplane.Rule{
		{Action: dataplane.Action{Kind: dataplane.ActMarkSet, Value: mark}},
		{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: ChainGatewayPick}},
	}})
	if sh {
		chain(&dataplane.Chain{Name: ChainGatewayPickSH, Comment: "source-hash: a fixed hash of the client address picks the slot", Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActDNATSrcHashMap, Map: MapGatewayBackendsSH, Value: uint32(size)}},
		}})
		chain(&dataplane.Chain{Name: ChainGatewayMasqPickSH, Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActMarkSet, Value: mark}},
			{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: ChainGatewayPickSH}},
		}})
	}
	// Not to a port the NAT fast path masquerades to (kernelMasqPorts).
	masq := dataplane.Action{Kind: dataplane.ActMasqClearMark, Value: mark}
	masq.Port, masq.PortMax = kernelMasqPorts(cfg.NATPath)
	chain(&dataplane.Chain{Name: tablenames.ChainMasquerading, Comment: "source NAT where the gateway must see the replies", Rules: []dataplane.Rule{
		{Matches: []dataplane.Match{{Kind: dataplane.MatchMarkAny, Value: mark}}, Action: masq},
	}})
	p.Sets = []*dataplane.Set{
		{Name: SetGatewayVIPs, Kind: dataplane.KindAddr, Comment: "LoadBalancer IPs this gateway forwards"},
		{Name: tablenames.MapServiceIPs, Kind: dataplane.KindTupleVmap, Comment: "VIP ports with backends"},
		{Name: MapGatewayBackends, Kind: dataplane.KindTupleEndpoints, Comment: "VIP . proto . port . Maglev slot -> backend"},
	}
	if sh {
		p.Sets = append(p.Sets, &dataplane.Set{Name: MapGatewayBackendsSH, Kind: dataplane.KindTupleEndpoints, Comment: "source-hash VIP . proto . port . Maglev slot -> backend"})
	}
	if fw {
		gatewayFirewall(p)
	}
	p.Elements = gatewayVIPElements(f, vips)
	return p
}

// gatewayFirewall adds the loadBalancerSourceRanges check to a gateway base p (forwarding direct
// and nodePort, when a VIP port of the family has ranges; a table without them stays as it was):
// the node's (proxy/schema.go), a filter chain in prerouting just before DNAT whose new connections look
// up firewall-ips, which sends a VIP port with ranges to its fw- chain (gatewayPart): return if the
// client is in a range, else drop. Those VIP ports are not given to the NAT fast path (natPort),
// which would forward them before this hook. The gateway's own traffic (output) is not checked.
func gatewayFirewall(p *dataplane.Part) {
	p.Chains = append(p.Chains,
		&dataplane.Chain{Name: tablenames.ChainFilterPreroutingPreDNAT, Type: dataplane.FilterType, Hook: dataplane.HookPrerouting, Priority: dataplane.PriorityDstNAT - 10, Rules: []dataplane.Rule{
			{Matches: []dataplane.Match{{Kind: dataplane.MatchCtStateNew}}, Action: dataplane.Action{Kind: dataplane.ActJump, Chain: tablenames.ChainFirewallCheck}},
		}},
		&dataplane.Chain{Name: tablenames.ChainFirewallCheck, Rules: []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapFirewallIPs}}}},
	)
	p.Sets = append(p.Sets, &dataplane.Set{Name: tablenames.MapFirewallIPs, Kind: dataplane.KindTupleVmap, Comment: "VIP ports subject to loadBalancerSourceRanges"})
}

// gatewayVIPElements are the gateway-vips elements of family f.
func gatewayVIPElements(f cluster.Family, vips []netip.Addr) []dataplane.Element {
	var out []dataplane.Element
	for _, v := range vips {
		if cluster.FamilyOf(v) == f {
			out = append(out, dataplane.Element{Set: SetGatewayVIPs, Addr: v.Unmap()})
		}
	}
	return out
}

// Ruleset is one family's gateway table and the decisions behind it.
type Ruleset struct {
	Ruleset   *dataplane.Ruleset
	Entries   []Entry
	Conflicts []cluster.Rejection
	// MaglevSize is the number of slots per VIP port of this table.
	MaglevSize int
	// inputs and kept remember what each Service's part was built from, so the next build reuses the
	// parts of unchanged Services (a Maglev table is M elements to build and to diff).
	inputs map[cluster.ServiceKey]gwInput
	kept   map[cluster.ServiceKey][]Entry
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

// BuildRuleset builds one family's complete gateway table for st and health.
func BuildRuleset(cfg Config, f cluster.Family, st *cluster.State, health Health) (*Ruleset, error) {
	var d DrainState
	now := time.Now()
	keep, expired, _ := d.update(drainingNodes(cfg, st), now, cfg.withDefaults().DrainTimeout)
	return buildGatewayRuleset(cfg, f, st, health, nil, gatewayDrain{keep, expired, nil, now, 0})
}

// buildGatewayRuleset is BuildRuleset reusing the parts of prev (may be nil) whose inputs did
// not change.
func buildGatewayRuleset(cfg Config, f cluster.Family, st *cluster.State, health Health, prev *Ruleset, drain gatewayDrain) (*Ruleset, error) {
	cfg = cfg.withDefaults()
	out := &Ruleset{Ruleset: &dataplane.Ruleset{Family: f, Table: cfg.Table, Services: map[cluster.ServiceKey]*dataplane.Part{}, Shared: map[string]*dataplane.Chain{}},
		inputs: map[cluster.ServiceKey]gwInput{}, kept: map[cluster.ServiceKey][]Entry{}, daisyEnd: map[cluster.ServiceKey]time.Time{},
		nat: map[cluster.ServiceKey][]natpath.VIPPort{}}
	nodes := gatewayNodes(cfg, st, f)
	var nodesKey strings.Builder
	addrs := make([]netip.Addr, 0, len(nodes))
	for i, n := range nodes {
		nodes[i].draining, nodes[i].gone = drain.keep[n.name], drain.expired[n.name]
		nodesKey.WriteString(n.addr.String() + [3]string{",", "~,", "-,"}[boolInt(nodes[i].draining)+2*boolInt(nodes[i].gone)])
		addrs = append(addrs, n.addr)
	}
	ids := ConnIDs(addrs)
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
		entries := ServiceEntries(cfg, f, svc, st.EndpointSlices[k], nodes, health)
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
		sh = sh || slices.ContainsFunc(kept, func(e Entry) bool { return e.Algorithm == cluster.LBSourceHash && len(e.Backends) > 0 })
		fw = fw || slices.ContainsFunc(kept, func(e Entry) bool { return len(e.SourceRanges) > 0 })
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
		part, end, nat, err := gatewayPart(cfg, kept, size, ids, drain.hist, drain.now, drain.settle)
		if err != nil {
			//lint:ignore ST1005 Service is the Kubernetes kind's name, as in every message that names one
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
