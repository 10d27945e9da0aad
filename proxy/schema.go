package proxy

import (
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// baseChain describes one chain attached to a hook: fixed structure as data.
type baseChain struct {
	name     string
	typ      dataplane.ChainType
	hook     dataplane.Hook
	priority int
}

// baseChains lists vipgate's hooks. Filtering that must see the pre-DNAT destination (source ranges)
// runs just before DNAT; rejecting traffic to Services without endpoints runs after DNAT in
// input/forward/output, where reject is allowed and where a packet that was DNATed no longer matches.
var baseChains = []baseChain{
	{dataplane.ChainFilterPreroutingPreDNAT, dataplane.FilterType, dataplane.HookPrerouting, dataplane.PriorityDstNAT - 10},
	{dataplane.ChainFilterOutputPreDNAT, dataplane.FilterType, dataplane.HookOutput, dataplane.PriorityDstNAT - 10},
	{dataplane.ChainFilterInput, dataplane.FilterType, dataplane.HookInput, dataplane.PriorityFilter},
	{dataplane.ChainFilterForward, dataplane.FilterType, dataplane.HookForward, dataplane.PriorityFilter},
	{dataplane.ChainFilterOutput, dataplane.FilterType, dataplane.HookOutput, dataplane.PriorityFilter},
	{dataplane.ChainNATPrerouting, dataplane.NATType, dataplane.HookPrerouting, dataplane.PriorityDstNAT},
	{dataplane.ChainNATOutput, dataplane.NATType, dataplane.HookOutput, dataplane.PriorityDstNAT},
	{dataplane.ChainNATPostrouting, dataplane.NATType, dataplane.HookPostrouting, dataplane.PrioritySrcNAT},
}

// jumpRule is a rule in a base chain that jumps to a regular chain.
type jumpRule struct {
	from, to string
	newOnly  bool
}

var jumpRules = []jumpRule{
	{dataplane.ChainFilterPreroutingPreDNAT, dataplane.ChainFirewallCheck, true},
	{dataplane.ChainFilterOutputPreDNAT, dataplane.ChainFirewallCheck, true},
	{dataplane.ChainFilterInput, dataplane.ChainNodePortEndpointsCheck, true},
	{dataplane.ChainFilterInput, dataplane.ChainServiceEndpointsCheck, true},
	{dataplane.ChainFilterForward, dataplane.ChainServiceEndpointsCheck, true},
	{dataplane.ChainFilterForward, dataplane.ChainClusterIPsCheck, true},
	{dataplane.ChainFilterOutput, dataplane.ChainServiceEndpointsCheck, true},
	{dataplane.ChainFilterOutput, dataplane.ChainClusterIPsCheck, true},
	{dataplane.ChainNATPrerouting, dataplane.ChainServices, false},
	{dataplane.ChainNATOutput, dataplane.ChainServices, false},
	{dataplane.ChainNATPostrouting, dataplane.ChainMasquerading, false},
}

// fixedSets lists the sets every table has.
var fixedSets = []dataplane.Set{
	{Name: dataplane.SetClusterIPs, Kind: dataplane.KindAddr, Comment: "active ClusterIPs"},
	{Name: dataplane.SetNodePortIPs, Kind: dataplane.KindAddr, Comment: "addresses that accept NodePort traffic"},
	{Name: dataplane.SetClusterCIDRs, Kind: dataplane.KindPrefix, Comment: "pod CIDRs: traffic from here is pod traffic"},
	{Name: dataplane.SetServiceCIDRs, Kind: dataplane.KindPrefix, Comment: "service CIDRs"},
	{Name: dataplane.MapServiceIPs, Kind: dataplane.KindTupleVmap, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
	{Name: dataplane.MapServiceNodePorts, Kind: dataplane.KindProtoPortVmap, Comment: "NodePort traffic"},
	{Name: dataplane.MapNoEndpointServices, Kind: dataplane.KindTupleVmap, Comment: "drop or reject traffic to Services with no endpoints"},
	{Name: dataplane.MapNoEndpointNodePorts, Kind: dataplane.KindProtoPortVmap, Comment: "drop or reject traffic to NodePorts with no endpoints"},
	{Name: dataplane.MapFirewallIPs, Kind: dataplane.KindTupleVmap, Comment: "LoadBalancer IPs subject to loadBalancerSourceRanges"},
	{Name: dataplane.SetHairpin, Kind: dataplane.KindHairpin, Comment: "pod to itself through a Service"},
	{Name: dataplane.MapEndpoints, Kind: dataplane.KindTupleEndpoints, Comment: "entry . endpoint index -> endpoint"},
	{Name: dataplane.MapEndpointsCluster, Kind: dataplane.KindTupleEndpoints, Comment: "eTP=Local entry . index -> cluster-wide endpoint"},
	{Name: dataplane.MapNodePortEndpoints, Kind: dataplane.KindProtoPortEndpoints, Comment: "NodePort . endpoint index -> endpoint"},
	{Name: dataplane.MapNodePortEndpointsCluster, Kind: dataplane.KindProtoPortEndpoints, Comment: "eTP=Local NodePort . index -> cluster-wide endpoint"},
}

// BaseConfig is what the fixed part of a table depends on.
type BaseConfig struct {
	Family        cluster.Family
	MasqueradeAll bool
	MasqueradeBit int
	ClusterCIDRs  []netip.Prefix
	ServiceCIDRs  []netip.Prefix
	// NodePortIPs are the addresses NodePorts answer on (loopback is never included).
	NodePortIPs []netip.Addr
}

// MasqMark is the packet mark bit that asks for masquerading.
func (c BaseConfig) MasqMark() uint32 { return 1 << uint(c.MasqueradeBit) }

// BuildBase builds the fixed part of the table: base chains, dispatch, checks, masquerading.
func BuildBase(c BaseConfig) *dataplane.Part {
	p := &dataplane.Part{}
	chains := map[string]*dataplane.Chain{}
	for _, bc := range baseChains {
		ch := &dataplane.Chain{Name: bc.name, Type: bc.typ, Hook: bc.hook, Priority: bc.priority}
		chains[bc.name] = ch
		p.Chains = append(p.Chains, ch)
	}
	regular := func(name, comment string, rules ...dataplane.Rule) {
		ch := &dataplane.Chain{Name: name, Rules: rules, Comment: comment}
		chains[name] = ch
		p.Chains = append(p.Chains, ch)
	}
	mark := c.MasqMark()
	var servicesRules []dataplane.Rule
	if c.MasqueradeAll {
		servicesRules = append(servicesRules, dataplane.Rule{
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetClusterIPs}},
			Action:  dataplane.Action{Kind: dataplane.ActJump, Chain: dataplane.ChainMarkForMasquerade},
			Comment: "masquerade all ClusterIP traffic",
		})
	} else if len(c.ClusterCIDRs) > 0 {
		servicesRules = append(servicesRules, dataplane.Rule{
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetClusterIPs}, {Kind: dataplane.MatchSaddrNotInSet, Set: dataplane.SetClusterCIDRs}},
			Action:  dataplane.Action{Kind: dataplane.ActJump, Chain: dataplane.ChainMarkForMasquerade},
			Comment: "masquerade ClusterIP traffic from outside the cluster",
		})
	}
	servicesRules = append(servicesRules,
		dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: dataplane.MapServiceIPs}},
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetNodePortIPs}}, Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: dataplane.MapServiceNodePorts}},
	)
	regular(dataplane.ChainServices, "Service dispatch", servicesRules...)
	regular(dataplane.ChainMasquerading, "source NAT where a Service needs it",
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchMarkAny, Value: mark}}, Action: dataplane.Action{Kind: dataplane.ActMasqClearMark, Value: mark}},
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchCtStatusDNAT}, {Kind: dataplane.MatchHairpin, Set: dataplane.SetHairpin}}, Action: dataplane.Action{Kind: dataplane.ActMasquerade}, Comment: "hairpin"},
	)
	regular(dataplane.ChainMarkForMasquerade, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActMarkSet, Value: mark}})
	regular(dataplane.ChainServiceEndpointsCheck, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: dataplane.MapNoEndpointServices}})
	regular(dataplane.ChainNodePortEndpointsCheck, "", dataplane.Rule{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetNodePortIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: dataplane.MapNoEndpointNodePorts},
	})
	regular(dataplane.ChainReject, "helper for the no-endpoint maps", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActReject}})
	cipRules := []dataplane.Rule{{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetClusterIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActReject},
		Comment: "reject traffic to undefined ports of ClusterIPs",
	}}
	if len(c.ServiceCIDRs) > 0 {
		cipRules = append(cipRules, dataplane.Rule{
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: dataplane.SetServiceCIDRs}},
			Action:  dataplane.Action{Kind: dataplane.ActDrop},
			Comment: "drop traffic to unallocated ClusterIPs",
		})
	}
	regular(dataplane.ChainClusterIPsCheck, "", cipRules...)
	regular(dataplane.ChainFirewallCheck, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: dataplane.MapFirewallIPs}})

	for _, j := range jumpRules {
		r := dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: j.to}}
		if j.newOnly {
			r.Matches = []dataplane.Match{{Kind: dataplane.MatchCtStateNew}}
		}
		chains[j.from].Rules = append(chains[j.from].Rules, r)
	}
	for i := range fixedSets {
		s := fixedSets[i]
		p.Sets = append(p.Sets, &s)
	}
	for _, pfx := range c.ClusterCIDRs {
		if familyOfPrefix(pfx) == c.Family {
			p.Elements = append(p.Elements, dataplane.Element{Set: dataplane.SetClusterCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, pfx := range c.ServiceCIDRs {
		if familyOfPrefix(pfx) == c.Family {
			p.Elements = append(p.Elements, dataplane.Element{Set: dataplane.SetServiceCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, ip := range c.NodePortIPs {
		if cluster.FamilyOf(ip) == c.Family && !ip.IsLoopback() {
			p.Elements = append(p.Elements, dataplane.Element{Set: dataplane.SetNodePortIPs, Addr: ip.Unmap()})
		}
	}
	return p
}

// SharedChain builds the shared chain called name, or returns nil if name is not a shared chain.
func SharedChain(name string) *dataplane.Chain {
	c, ok := dataplane.ParseChainName(name)
	if !ok {
		return nil
	}
	switch c.Role {
	case dataplane.ChainRoleMasqPick:
		return &dataplane.Chain{Name: name, Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: dataplane.ChainMarkForMasquerade}},
			{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: dataplane.PickOfTwin(name)}},
		}}
	case dataplane.ChainRolePick:
	default:
		return nil
	}
	tuple := c.Map == dataplane.MapEndpoints || c.Map == dataplane.MapEndpointsCluster
	// The random, source-hash and maglev pickers, for IP entries (tuple) and NodePorts.
	kinds := map[cluster.LBAlgorithm][2]dataplane.ActionKind{
		cluster.LBRandom:     {dataplane.ActDNATProtoPortMap, dataplane.ActDNATTupleMap},
		cluster.LBSourceHash: {dataplane.ActDNATProtoPortSrcHashMap, dataplane.ActDNATSrcHashMap},
		cluster.LBMaglev:     {dataplane.ActDNATProtoPortJhashMap, dataplane.ActDNATJhashMap},
	}
	kind := kinds[c.Algorithm][0]
	if tuple {
		kind = kinds[c.Algorithm][1]
	}
	return &dataplane.Chain{Name: name, Rules: []dataplane.Rule{{Action: dataplane.Action{Kind: kind, Map: c.Map, Value: uint32(c.Size)}}}}
}

// SharedUses lists the shared chains that using chain name implies (a masq-pick chain uses its pick).
func SharedUses(name string) []string {
	if dataplane.IsMasqPickChain(name) {
		return []string{name, dataplane.PickOfTwin(name)}
	}
	return []string{name}
}
