package dataplane

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// Names of the fixed chains and sets. They follow kube-proxy's nftables mode where the job is the same,
// so an operator who knows `nft list table ip kube-proxy` can read `nft list table ip vipgate`.
const (
	ChainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	ChainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	ChainFilterInput             = "filter-input"
	ChainFilterForward           = "filter-forward"
	ChainFilterOutput            = "filter-output"
	ChainNATPrerouting           = "nat-prerouting"
	ChainNATOutput               = "nat-output"
	ChainNATPostrouting          = "nat-postrouting"

	ChainServices               = "services"
	ChainMasquerading           = "masquerading"
	ChainMarkForMasquerade      = "mark-for-masquerade"
	ChainServiceEndpointsCheck  = "service-endpoints-check"
	ChainNodePortEndpointsCheck = "nodeport-endpoints-check"
	ChainReject                 = "reject-chain"
	ChainClusterIPsCheck        = "cluster-ips-check"
	ChainFirewallCheck          = "firewall-check"

	SetClusterIPs          = "cluster-ips"
	SetNodePortIPs         = "nodeport-ips"
	SetClusterCIDRs        = "cluster-cidrs"
	SetServiceCIDRs        = "service-cidrs"
	MapServiceIPs          = "service-ips"
	MapServiceNodePorts    = "service-nodeports"
	MapNoEndpointServices  = "no-endpoint-services"
	MapNoEndpointNodePorts = "no-endpoint-nodeports"
	MapFirewallIPs         = "firewall-ips"
	SetHairpin             = "hairpin-connections"
	// The endpoint maps: (entry, endpoint index) -> endpoint. "endpoints" holds the endpoint set of the
	// entry's own traffic policy; "endpoints-cluster" the cluster-wide set that pod and host traffic to an
	// externalTrafficPolicy=Local entry short-circuits to.
	MapEndpoints                = "endpoints"
	MapEndpointsCluster         = "endpoints-cluster"
	MapNodePortEndpoints        = "nodeport-endpoints"
	MapNodePortEndpointsCluster = "nodeport-endpoints-cluster"
)

// baseChain describes one chain attached to a hook: fixed structure as data.
type baseChain struct {
	name     string
	typ      ChainType
	hook     Hook
	priority int
}

// baseChains lists vipgate's hooks. Filtering that must see the pre-DNAT destination (source ranges)
// runs just before DNAT; rejecting traffic to Services without endpoints runs after DNAT in
// input/forward/output, where reject is allowed and where a packet that was DNATed no longer matches.
var baseChains = []baseChain{
	{ChainFilterPreroutingPreDNAT, FilterType, HookPrerouting, PriorityDstNAT - 10},
	{ChainFilterOutputPreDNAT, FilterType, HookOutput, PriorityDstNAT - 10},
	{ChainFilterInput, FilterType, HookInput, PriorityFilter},
	{ChainFilterForward, FilterType, HookForward, PriorityFilter},
	{ChainFilterOutput, FilterType, HookOutput, PriorityFilter},
	{ChainNATPrerouting, NATType, HookPrerouting, PriorityDstNAT},
	{ChainNATOutput, NATType, HookOutput, PriorityDstNAT},
	{ChainNATPostrouting, NATType, HookPostrouting, PrioritySrcNAT},
}

// jumpRule is a rule in a base chain that jumps to a regular chain.
type jumpRule struct {
	from, to string
	newOnly  bool
}

var jumpRules = []jumpRule{
	{ChainFilterPreroutingPreDNAT, ChainFirewallCheck, true},
	{ChainFilterOutputPreDNAT, ChainFirewallCheck, true},
	{ChainFilterInput, ChainNodePortEndpointsCheck, true},
	{ChainFilterInput, ChainServiceEndpointsCheck, true},
	{ChainFilterForward, ChainServiceEndpointsCheck, true},
	{ChainFilterForward, ChainClusterIPsCheck, true},
	{ChainFilterOutput, ChainServiceEndpointsCheck, true},
	{ChainFilterOutput, ChainClusterIPsCheck, true},
	{ChainNATPrerouting, ChainServices, false},
	{ChainNATOutput, ChainServices, false},
	{ChainNATPostrouting, ChainMasquerading, false},
}

// fixedSets lists the sets every table has.
var fixedSets = []Set{
	{Name: SetClusterIPs, Kind: KindAddr, Comment: "active ClusterIPs"},
	{Name: SetNodePortIPs, Kind: KindAddr, Comment: "addresses that accept NodePort traffic"},
	{Name: SetClusterCIDRs, Kind: KindPrefix, Comment: "pod CIDRs: traffic from here is pod traffic"},
	{Name: SetServiceCIDRs, Kind: KindPrefix, Comment: "service CIDRs"},
	{Name: MapServiceIPs, Kind: KindTupleVmap, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
	{Name: MapServiceNodePorts, Kind: KindProtoPortVmap, Comment: "NodePort traffic"},
	{Name: MapNoEndpointServices, Kind: KindTupleVmap, Comment: "drop or reject traffic to Services with no endpoints"},
	{Name: MapNoEndpointNodePorts, Kind: KindProtoPortVmap, Comment: "drop or reject traffic to NodePorts with no endpoints"},
	{Name: MapFirewallIPs, Kind: KindTupleVmap, Comment: "LoadBalancer IPs subject to loadBalancerSourceRanges"},
	{Name: SetHairpin, Kind: KindHairpin, Comment: "pod to itself through a Service"},
	{Name: MapEndpoints, Kind: KindTupleEndpoints, Comment: "entry . endpoint index -> endpoint"},
	{Name: MapEndpointsCluster, Kind: KindTupleEndpoints, Comment: "eTP=Local entry . index -> cluster-wide endpoint"},
	{Name: MapNodePortEndpoints, Kind: KindProtoPortEndpoints, Comment: "NodePort . endpoint index -> endpoint"},
	{Name: MapNodePortEndpointsCluster, Kind: KindProtoPortEndpoints, Comment: "eTP=Local NodePort . index -> cluster-wide endpoint"},
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
func BuildBase(c BaseConfig) *Part {
	p := &Part{}
	chains := map[string]*Chain{}
	for _, bc := range baseChains {
		ch := &Chain{Name: bc.name, Type: bc.typ, Hook: bc.hook, Priority: bc.priority}
		chains[bc.name] = ch
		p.Chains = append(p.Chains, ch)
	}
	regular := func(name, comment string, rules ...Rule) {
		ch := &Chain{Name: name, Rules: rules, Comment: comment}
		chains[name] = ch
		p.Chains = append(p.Chains, ch)
	}
	mark := c.MasqMark()
	var servicesRules []Rule
	if c.MasqueradeAll {
		servicesRules = append(servicesRules, Rule{
			Matches: []Match{{Kind: MatchDaddrInSet, Set: SetClusterIPs}},
			Action:  Action{Kind: ActJump, Chain: ChainMarkForMasquerade},
			Comment: "masquerade all ClusterIP traffic",
		})
	} else if len(c.ClusterCIDRs) > 0 {
		servicesRules = append(servicesRules, Rule{
			Matches: []Match{{Kind: MatchDaddrInSet, Set: SetClusterIPs}, {Kind: MatchSaddrNotInSet, Set: SetClusterCIDRs}},
			Action:  Action{Kind: ActJump, Chain: ChainMarkForMasquerade},
			Comment: "masquerade ClusterIP traffic from outside the cluster",
		})
	}
	servicesRules = append(servicesRules,
		Rule{Action: Action{Kind: ActVmapTuple, Map: MapServiceIPs}},
		Rule{Matches: []Match{{Kind: MatchDaddrInSet, Set: SetNodePortIPs}}, Action: Action{Kind: ActVmapProtoPort, Map: MapServiceNodePorts}},
	)
	regular(ChainServices, "Service dispatch", servicesRules...)
	regular(ChainMasquerading, "source NAT where a Service needs it",
		Rule{Matches: []Match{{Kind: MatchMarkAny, Value: mark}}, Action: Action{Kind: ActMasqClearMark, Value: mark}},
		Rule{Matches: []Match{{Kind: MatchCtStatusDNAT}, {Kind: MatchHairpin, Set: SetHairpin}}, Action: Action{Kind: ActMasquerade}, Comment: "hairpin"},
	)
	regular(ChainMarkForMasquerade, "", Rule{Action: Action{Kind: ActMarkSet, Value: mark}})
	regular(ChainServiceEndpointsCheck, "", Rule{Action: Action{Kind: ActVmapTuple, Map: MapNoEndpointServices}})
	regular(ChainNodePortEndpointsCheck, "", Rule{
		Matches: []Match{{Kind: MatchDaddrInSet, Set: SetNodePortIPs}},
		Action:  Action{Kind: ActVmapProtoPort, Map: MapNoEndpointNodePorts},
	})
	regular(ChainReject, "helper for the no-endpoint maps", Rule{Action: Action{Kind: ActReject}})
	cipRules := []Rule{{
		Matches: []Match{{Kind: MatchDaddrInSet, Set: SetClusterIPs}},
		Action:  Action{Kind: ActReject},
		Comment: "reject traffic to undefined ports of ClusterIPs",
	}}
	if len(c.ServiceCIDRs) > 0 {
		cipRules = append(cipRules, Rule{
			Matches: []Match{{Kind: MatchDaddrInSet, Set: SetServiceCIDRs}},
			Action:  Action{Kind: ActDrop},
			Comment: "drop traffic to unallocated ClusterIPs",
		})
	}
	regular(ChainClusterIPsCheck, "", cipRules...)
	regular(ChainFirewallCheck, "", Rule{Action: Action{Kind: ActVmapTuple, Map: MapFirewallIPs}})

	for _, j := range jumpRules {
		r := Rule{Action: Action{Kind: ActJump, Chain: j.to}}
		if j.newOnly {
			r.Matches = []Match{{Kind: MatchCtStateNew}}
		}
		chains[j.from].Rules = append(chains[j.from].Rules, r)
	}
	for i := range fixedSets {
		s := fixedSets[i]
		p.Sets = append(p.Sets, &s)
	}
	for _, pfx := range c.ClusterCIDRs {
		if familyOfPrefix(pfx) == c.Family {
			p.Elements = append(p.Elements, Element{Set: SetClusterCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, pfx := range c.ServiceCIDRs {
		if familyOfPrefix(pfx) == c.Family {
			p.Elements = append(p.Elements, Element{Set: SetServiceCIDRs, Prefix: pfx.Masked()})
		}
	}
	for _, ip := range c.NodePortIPs {
		if cluster.FamilyOf(ip) == c.Family && !ip.IsLoopback() {
			p.Elements = append(p.Elements, Element{Set: SetNodePortIPs, Addr: ip.Unmap()})
		}
	}
	return p
}

func familyOfPrefix(p netip.Prefix) cluster.Family { return cluster.FamilyOf(p.Addr()) }

// Shared endpoint-picking chains. One chain per (endpoint map, endpoint count) holds the only rule that
// binds the endpoint map: `dnat to <entry> . numgen random mod N map @map`. Services with the same
// endpoint count share it, so the number of rules bound to a big map stays at the number of distinct
// endpoint counts instead of the number of Services (see dataplane/README.md for the kernel figures).

// PickChain returns the name of the shared chain that picks one of n endpoints from map m.
func PickChain(m string, n int) string { return "pick-" + m + "-" + strconv.Itoa(n) }

// MasqPickChain returns the shared chain that marks for masquerade and then picks.
func MasqPickChain(m string, n int) string { return "masq-pick-" + m + "-" + strconv.Itoa(n) }

// pickChainFor returns the shared picker of map m for a balancing algorithm: PickChain for random;
// "pick-sh-<map>-<n>" for source-hash (jhash of the client address mod n); "pick-mg-<map>-<M>" for
// maglev, n being the Maglev table size M.
func pickChainFor(alg cluster.LBAlgorithm, m string, n int) string {
	switch alg {
	case cluster.LBSourceHash:
		return "pick-sh-" + m + "-" + strconv.Itoa(n)
	case cluster.LBMaglev:
		return "pick-mg-" + m + "-" + strconv.Itoa(n)
	}
	return PickChain(m, n)
}

// SharedChain builds the shared chain called name, or returns nil if name is not a shared chain.
func SharedChain(name string) *Chain {
	masq := false
	rest, ok := strings.CutPrefix(name, "masq-pick-")
	if ok {
		masq = true
	} else if rest, ok = strings.CutPrefix(name, "pick-"); !ok {
		return nil
	}
	if masq {
		if SharedChain("pick-"+rest) == nil {
			return nil
		}
		return &Chain{Name: name, Rules: []Rule{
			{Action: Action{Kind: ActJump, Chain: ChainMarkForMasquerade}},
			{Action: Action{Kind: ActGoto, Chain: "pick-" + rest}},
		}}
	}
	alg := cluster.LBRandom
	if r, ok := strings.CutPrefix(rest, "sh-"); ok {
		alg, rest = cluster.LBSourceHash, r
	} else if r, ok := strings.CutPrefix(rest, "mg-"); ok {
		alg, rest = cluster.LBMaglev, r
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return nil
	}
	m, nStr := rest[:i], rest[i+1:]
	n, err := strconv.Atoi(nStr)
	if err != nil || n <= 0 || (alg == cluster.LBMaglev && !isPrime(n)) {
		return nil
	}
	var tuple bool
	switch m {
	case MapEndpoints, MapEndpointsCluster:
		tuple = true
	case MapNodePortEndpoints, MapNodePortEndpointsCluster:
	default:
		return nil
	}
	// The random, source-hash and maglev pickers, for IP entries (tuple) and NodePorts.
	kinds := map[cluster.LBAlgorithm][2]ActionKind{
		cluster.LBRandom:     {ActDNATProtoPortMap, ActDNATTupleMap},
		cluster.LBSourceHash: {ActDNATProtoPortSrcHashMap, ActDNATSrcHashMap},
		cluster.LBMaglev:     {ActDNATProtoPortJhashMap, ActDNATJhashMap},
	}
	kind := kinds[alg][boolInt(tuple)]
	return &Chain{Name: name, Rules: []Rule{{Action: Action{Kind: kind, Map: m, Value: uint32(n)}}}}
}

// sharedUses lists the shared chains that using chain name implies (a masq-pick chain uses its pick).
func sharedUses(name string) []string {
	if rest, ok := strings.CutPrefix(name, "masq-pick-"); ok {
		return []string{name, "pick-" + rest}
	}
	return []string{name}
}

// chainSafe makes s usable inside an nft identifier (letters, digits, / - _ .).
func chainSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '/', r == '-', r == '_', r == '.':
			return r
		}
		return '.'
	}, s)
}

// servicePortName is the readable base of a Service port's own chains: ns/name/proto/port.
func servicePortName(key cluster.ServiceKey, proto uint8, port uint16) string {
	return fmt.Sprintf("%s/%s/%s/%d", chainSafe(key.Namespace), chainSafe(key.Name), ProtoName(proto), port)
}
