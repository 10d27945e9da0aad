package proxy

import (
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
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
	{tablenames.ChainFilterPreroutingPreDNAT, dataplane.FilterType, dataplane.HookPrerouting, dataplane.PriorityDstNAT - 10},
	{tablenames.ChainFilterOutputPreDNAT, dataplane.FilterType, dataplane.HookOutput, dataplane.PriorityDstNAT - 10},
	{tablenames.ChainFilterInput, dataplane.FilterType, dataplane.HookInput, dataplane.PriorityFilter},
	{tablenames.ChainFilterForward, dataplane.FilterType, dataplane.HookForward, dataplane.PriorityFilter},
	{tablenames.ChainFilterOutput, dataplane.FilterType, dataplane.HookOutput, dataplane.PriorityFilter},
	{tablenames.ChainNATPrerouting, dataplane.NATType, dataplane.HookPrerouting, dataplane.PriorityDstNAT},
	{tablenames.ChainNATOutput, dataplane.NATType, dataplane.HookOutput, dataplane.PriorityDstNAT},
	{tablenames.ChainNATPostrouting, dataplane.NATType, dataplane.HookPostrouting, dataplane.PrioritySrcNAT},
}

// jumpRule is a rule in a base chain that jumps to a regular chain.
type jumpRule struct {
	from, to string
	newOnly  bool
}

var jumpRules = []jumpRule{
	{tablenames.ChainFilterPreroutingPreDNAT, tablenames.ChainFirewallCheck, true},
	{tablenames.ChainFilterOutputPreDNAT, tablenames.ChainFirewallCheck, true},
	{tablenames.ChainFilterInput, ChainNodePortEndpointsCheck, true},
	{tablenames.ChainFilterInput, ChainServiceEndpointsCheck, true},
	{tablenames.ChainFilterForward, ChainServiceEndpointsCheck, true},
	{tablenames.ChainFilterForward, ChainClusterIPsCheck, true},
	{tablenames.ChainFilterOutput, ChainServiceEndpointsCheck, true},
	{tablenames.ChainFilterOutput, ChainClusterIPsCheck, true},
	{tablenames.ChainNATPrerouting, tablenames.ChainServices, false},
	{tablenames.ChainNATOutput, tablenames.ChainServices, false},
	{tablenames.ChainNATPostrouting, tablenames.ChainMasquerading, false},
}

// sharableSets are the sets in which two Services may legitimately hold the same element (a pod IP
// and port in the hairpin set, a ClusterIP in two Services' ClusterIP set): the diff counts their
// elements' holders (dataplane.DiffOptions.Sharable); every other element has exactly one owner.
var (
	sharableSets = []string{SetHairpin, SetClusterIPs}
	sharableSet  = dataplane.SharableSets(sharableSets)
)

// fixedSets lists the sets every table has.
var fixedSets = []dataplane.Set{
	{Name: SetClusterIPs, Kind: dataplane.KindAddr, Comment: "active ClusterIPs"},
	{Name: SetNodePortIPs, Kind: dataplane.KindAddr, Comment: "addresses that accept NodePort traffic"},
	{Name: SetClusterCIDRs, Kind: dataplane.KindPrefix, Comment: "pod CIDRs: traffic from here is pod traffic"},
	{Name: SetServiceCIDRs, Kind: dataplane.KindPrefix, Comment: "service CIDRs"},
	{Name: tablenames.MapServiceIPs, Kind: dataplane.KindTupleVmap, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
	{Name: MapServiceNodePorts, Kind: dataplane.KindProtoPortVmap, Comment: "NodePort traffic"},
	{Name: MapNoEndpointServices, Kind: dataplane.KindTupleVmap, Comment: "drop or reject traffic to Services with no endpoints"},
	{Name: MapNoEndpointNodePorts, Kind: dataplane.KindProtoPortVmap, Comment: "drop or reject traffic to NodePorts with no endpoints"},
	{Name: tablenames.MapFirewallIPs, Kind: dataplane.KindTupleVmap, Comment: "LoadBalancer IPs subject to loadBalancerSourceRanges"},
	{Name: SetHairpin, Kind: dataplane.KindHairpin, Comment: "pod to itself through a Service"},
	{Name: MapEndpoints, Kind: dataplane.KindTupleEndpoints, Comment: "entry . endpoint index -> endpoint"},
	{Name: MapEndpointsCluster, Kind: dataplane.KindTupleEndpoints, Comment: "eTP=Local entry . index -> cluster-wide endpoint"},
	{Name: MapNodePortEndpoints, Kind: dataplane.KindProtoPortEndpoints, Comment: "NodePort . endpoint index -> endpoint"},
	{Name: MapNodePortEndpointsCluster, Kind: dataplane.KindProtoPortEndpoints, Comment: "eTP=Local NodePort . index -> cluster-wide endpoint"},
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
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetClusterIPs}},
			Action:  dataplane.Action{Kind: dataplane.ActJump, Chain: ChainMarkForMasquerade},
			Comment: "masquerade all ClusterIP traffic",
		})
	} else if len(c.ClusterCIDRs) > 0 {
		servicesRules = append(servicesRules, dataplane.Rule{
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetClusterIPs}, {Kind: dataplane.MatchSaddrNotInSet, Set: SetClusterCIDRs}},
			Action:  dataplane.Action{Kind: dataplane.ActJump, Chain: ChainMarkForMasquerade},
			Comment: "masquerade ClusterIP traffic from outside the cluster",
		})
	}
	servicesRules = append(servicesRules,
		dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapServiceIPs}},
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetNodePortIPs}}, Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: MapServiceNodePorts}},
	)
	regular(tablenames.ChainServices, "Service dispatch", servicesRules...)
	regular(tablenames.ChainMasquerading, "source NAT where a Service needs it",
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchMarkAny, Value: mark}}, Action: dataplane.Action{Kind: dataplane.ActMasqClearMark, Value: mark}},
		dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchCtStatusDNAT}, {Kind: dataplane.MatchHairpin, Set: SetHairpin}}, Action: dataplane.Action{Kind: dataplane.ActMasquerade}, Comment: "hairpin"},
	)
	regular(ChainMarkForMasquerade, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActMarkSet, Value: mark}})
	regular(ChainServiceEndpointsCheck, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: MapNoEndpointServices}})
	regular(ChainNodePortEndpointsCheck, "", dataplane.Rule{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetNodePortIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: MapNoEndpointNodePorts},
	})
	regular(dataplane.ChainReject, "helper for the no-endpoint maps", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActReject}})
	cipRules := []dataplane.Rule{{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetClusterIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActReject},
		Comment: "reject traffic to undefined ports of ClusterIPs",
	}}
	if len(c.ServiceCIDRs) > 0 {
		cipRules = append(cipRules, dataplane.Rule{
			Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetServiceCIDRs}},
			Action:  dataplane.Action{Kind: dataplane.ActDrop},
			Comment: "drop traffic to unallocated ClusterIPs",
		})
	}
	regular(ChainClusterIPsCheck, "", cipRules...)
	regular(tablenames.ChainFirewallCheck, "", dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapFirewallIPs}})

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
			p.Elements = append(p.Elements, dataplane.Element{Set: SetClusterCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, pfx := range c.ServiceCIDRs {
		if familyOfPrefix(pfx) == c.Family {
			p.Elements = append(p.Elements, dataplane.Element{Set: SetServiceCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, ip := range c.NodePortIPs {
		if cluster.FamilyOf(ip) == c.Family && !ip.IsLoopback() {
			p.Elements = append(p.Elements, dataplane.Element{Set: SetNodePortIPs, Addr: ip.Unmap()})
		}
	}
	return p
}

// SharedChain builds the shared chain called name, or returns nil if name is not a shared chain.
func SharedChain(name string) *dataplane.Chain {
	c, ok := ParseChainName(name)
	if !ok {
		return nil
	}
	switch c.Role {
	case ChainRoleMasqPick:
		return &dataplane.Chain{Name: name, Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: ChainMarkForMasquerade}},
			{Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: PickOfTwin(name)}},
		}}
	case ChainRolePick:
	default:
		return nil
	}
	tuple := c.Map == MapEndpoints || c.Map == MapEndpointsCluster
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
	if IsMasqPickChain(name) {
		return []string{name, PickOfTwin(name)}
	}
	return []string{name}
}
