package dataplane

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// This file is the ruleset model: a pure value that says which tables, chains, rules, sets and set
// elements the kernel should hold. Three consumers read it and must agree on its meaning:
// render.go (nft syntax), netlink.go (the kernel) and trace.go (the packet tracer). So a rule is not free
// text but a small closed vocabulary of match and action kinds; each kind has exactly one meaning in each
// consumer, and a consumer that meets an unknown kind fails loudly. Every kind's meanings are one
// descriptor (kinds.go, with the descriptors in kinds_*.go by family of kinds): the consumers have no
// switch over kinds, only a lookup, and kinds.go says how to add a kind.

// Proto numbers used in set keys (IANA protocol numbers, as `meta l4proto` yields them).
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ProtoNumber maps a Kubernetes protocol to its IP protocol number (0 if unknown).
func ProtoNumber(p cluster.Protocol) uint8 {
	switch p {
	case cluster.TCP:
		return ProtoTCP
	case cluster.UDP:
		return ProtoUDP
	case cluster.SCTP:
		return ProtoSCTP
	}
	return 0
}

// ProtoName is the nft spelling of an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// MatchKind is one of the conditions a rule may test. All matches of a rule must hold.
type MatchKind uint8

// The match vocabulary.
const (
	// MatchCtStateNew: `ct state new`.
	MatchCtStateNew MatchKind = iota + 1
	// MatchCtStatusDNAT: `ct status dnat`.
	MatchCtStatusDNAT
	// MatchDaddrInSet: `ip daddr @Set`.
	MatchDaddrInSet
	// MatchSaddrInSet: `ip saddr @Set`.
	MatchSaddrInSet
	// MatchSaddrNotInSet: `ip saddr != @Set`.
	MatchSaddrNotInSet
	// MatchSaddrInPrefix: `ip saddr Prefix`.
	MatchSaddrInPrefix
	// MatchFibSaddrLocal: `fib saddr type local` (the packet comes from this host).
	MatchFibSaddrLocal
	// MatchMarkAny: `meta mark & Value != 0`.
	MatchMarkAny
	// MatchHairpin: `ip saddr . ip daddr . meta l4proto . th dport @Set` (after DNAT: a pod reaching
	// itself through a Service).
	MatchHairpin
	// MatchNumgenZero: `numgen random mod Value == 0` (used to pick uniformly among a few chains).
	MatchNumgenZero
)

// Match is one condition of a rule.
type Match struct {
	Kind   MatchKind
	Set    string
	Prefix netip.Prefix
	Value  uint32
}

// ActionKind is what a rule does when all its matches hold.
type ActionKind uint8

// The action vocabulary.
const (
	// ActJump / ActGoto: `jump Chain` / `goto Chain`.
	ActJump ActionKind = iota + 1
	ActGoto
	// ActReturn, ActDrop, ActReject: verdicts. Reject sends ICMP port unreachable (TCP reset for TCP
	// would be `reject with tcp reset`; kube-proxy uses plain reject, and so do we).
	ActReturn
	ActDrop
	ActReject
	// ActMarkSet: `meta mark set meta mark | Value`.
	ActMarkSet
	// ActMasqClearMark: `meta mark set meta mark ^ Value masquerade fully-random` (the mark is cleared
	// so it cannot leak to the next hop's decisions inside the host). With Port set, the source port
	// is taken from Port..PortMax: `... masquerade to :Port-PortMax fully-random` (a gateway whose
	// NAT fast path owns the other ports, kernelMasqPorts; third_party/nftables sends its flags).
	ActMasqClearMark
	// ActMasquerade: `masquerade fully-random`.
	ActMasquerade
	// ActVmapTuple: `ip daddr . meta l4proto . th dport vmap @Map`.
	ActVmapTuple
	// ActVmapProtoPort: `meta l4proto . th dport vmap @Map`.
	ActVmapProtoPort
	// ActDNATTupleMap: `dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen random mod
	// Value map @Map`: pick endpoint number (random mod Value) of the Service reached at this
	// (daddr, proto, dport).
	ActDNATTupleMap
	// ActDNATProtoPortMap: the same keyed by (proto, dport), for NodePorts.
	ActDNATProtoPortMap
	// ActAffinityDNAT: `update @Set { ip saddr : Addr } dnat ip to Addr:Port`: a new client of a
	// Service with session affinity goes to endpoint Addr:Port, and the affinity map remembers it.
	ActAffinityDNAT
	// ActAffinityRefresh: `update @Set { ip saddr : Addr }` with no verdict, behind a match of the
	// client in the map: restarts the client's timeout. (An update of an element that exists keeps
	// its data; Addr, one of the map's endpoints, is written only if it expired in between.)
	ActAffinityRefresh
	// ActAffinityRecall: `dnat ip to ip saddr map @Set : Port`: a known client goes back to the
	// endpoint the map remembers (no match for a client it does not know).
	ActAffinityRecall
)

// Action is what a rule does.
type Action struct {
	Kind  ActionKind
	Chain string
	Map   string
	Set   string
	Value uint32
	Addr  netip.Addr
	Port  uint16
	// PortMax ends the port range Port..PortMax of a ranged masquerade (ActMasqClearMark).
	PortMax uint16
	// Device, in a netdev table, is the interface a route action's packet leaves by (`fwd ... device
	// Device`, gateway_netdev.go); empty elsewhere.
	Device string
	// Conns is the node map of a connection table action (ActFlowRecall, ActFlowPick,
	// ActFlowDaisy: (VIP port, node id) -> node), whose flow map is Set and slot map Map
	// (gateway_conntable.go); the role names them all.
	Conns string
}

// Rule is a conjunction of matches and one action.
type Rule struct {
	Matches []Match
	Action  Action
	Comment string
}

// ChainType, Hook and Priority describe a base chain.
type ChainType string

// Chain types.
const (
	FilterType ChainType = "filter"
	NATType    ChainType = "nat"
)

// Hook is a netfilter hook.
type Hook string

// Hooks.
const (
	HookPrerouting  Hook = "prerouting"
	HookInput       Hook = "input"
	HookForward     Hook = "forward"
	HookOutput      Hook = "output"
	HookPostrouting Hook = "postrouting"
)

// Well-known priorities (nft's names).
const (
	PriorityDstNAT = -100
	PriorityFilter = 0
	PrioritySrcNAT = 100
)

// Chain is a chain with its rules. Base chains have a Type and a Hook.
type Chain struct {
	Name     string
	Type     ChainType
	Hook     Hook
	Priority int
	Rules    []Rule
	Comment  string
	// Devices are the interfaces of a netdev ingress base chain (gateway_netdev.go).
	Devices []string
}

// IsBase says whether the chain is attached to a hook.
func (c *Chain) IsBase() bool { return c.Hook != "" }

// SetKind names the fixed key/data shape of a set.
type SetKind uint8

// The set shapes vipgate uses. "Addr" is ipv4_addr or ipv6_addr depending on the table's family.
const (
	// KindAddr: Addr (a plain set of addresses).
	KindAddr SetKind = iota + 1
	// KindPrefix: Addr with interval flag (CIDRs).
	KindPrefix
	// KindTupleVmap: Addr . inet_proto . inet_service : verdict.
	KindTupleVmap
	// KindProtoPortVmap: inet_proto . inet_service : verdict.
	KindProtoPortVmap
	// KindTupleEndpoints: Addr . inet_proto . inet_service . mark (endpoint index) : Addr . inet_service.
	KindTupleEndpoints
	// KindProtoPortEndpoints: inet_proto . inet_service . mark : Addr . inet_service.
	KindProtoPortEndpoints
	// KindHairpin: Addr . Addr . inet_proto . inet_service.
	KindHairpin
	// KindAffinity: client Addr -> endpoint DataAddr, dynamic, with a timeout: the session-affinity
	// clients of one Service port (policy and endpoint port). Its elements are runtime state: the
	// packet path writes them; vipgate only deletes those of endpoints that left (Tx.Purges).
	KindAffinity
)

// Set is a named set or map.
type Set struct {
	Name    string
	Kind    SetKind
	Timeout time.Duration // KindAffinity only
	Comment string
}

// VerdictKind is the verdict stored in a verdict map element.
type VerdictKind uint8

// Verdicts stored in verdict maps.
const (
	VerdictNone VerdictKind = iota
	VerdictGoto
	VerdictDrop
	VerdictReject // stored as `goto reject-chain` (ChainReject): a vmap cannot hold reject itself
)

// ChainReject is the chain a VerdictReject element goes to (an element's Chain "" means it): the
// engine's spelling of a reject in a verdict map, which the kernel cannot hold. A role whose maps
// hold VerdictReject builds it, with a reject rule (the node's proxy.BuildBase).
const ChainReject = "reject-chain"

// Element is one set or map element. Which fields are used depends on the set's Kind. Element is
// comparable, so it can be a map key: the diff between two rulesets is a set difference of Elements.
type Element struct {
	Set string
	// Key fields.
	Addr   netip.Addr   // KindAddr, KindTuple*, KindHairpin (first address)
	Addr2  netip.Addr   // KindHairpin (second address)
	Prefix netip.Prefix // KindPrefix
	Proto  uint8
	Port   uint16
	Index  uint32 // endpoint index in *Endpoints maps
	// Data: a verdict (vmaps) or an endpoint (endpoint maps).
	Verdict  VerdictKind
	Chain    string
	DataAddr netip.Addr
	DataPort uint16
}

// Key returns the element with its data fields cleared: two elements with the same Key may not both be
// in a set.
func (e Element) Key() Element {
	e.Verdict, e.Chain, e.DataAddr, e.DataPort = VerdictNone, "", netip.Addr{}, 0
	return e
}

// Part is a piece of a ruleset owned by one thing (the fixed base, or one Service): the chains and sets
// it creates and the elements it adds to shared sets. Parts never share chains or sets, except the
// shared endpoint-picking chains (see SharedChains), which are reference counted.
type Part struct {
	Chains   []*Chain
	Sets     []*Set
	Elements []Element
	// Uses lists the shared chains (by name) this part's rules and elements jump to. Read only: parts
	// built in one sync share equal lists (compact.go, nameInterner), so a write through one part
	// would change the others'; its capacity equals its length, so an append copies.
	Uses []string
	// Backends and Entries describe the Service for conntrack cleanup and health checks; they are not
	// programmed.
	Backends []Backend
	Entries  []EntryRef
	// LocalEndpoints counts this node's ready endpoints (the largest count over the Service's ports),
	// for the healthCheckNodePort server. Terminating endpoints do not count, even while
	// externalTrafficPolicy=Local traffic falls back to them: kube-proxy's LocalReadyEndpoints.
	LocalEndpoints int
	// Refused lists the Service's external and LoadBalancer IPs of this family that the node's
	// policy kept out (AddressScreen), for the report.
	Refused []Refusal
	// packed, when set, holds Elements and Backends (then nil) in the proxier's packed form
	// (compact.go): only the parts a Proxier keeps between syncs are packed.
	packed *packedPart
}

// Backend is an endpoint a Service port DNATs to.
type Backend struct {
	Proto    uint8
	Endpoint netip.AddrPort
}

// EntryRef is one way into a Service port and whether it leads anywhere.
type EntryRef struct {
	Proto        uint8
	Addr         netip.Addr // invalid for a NodePort
	Port         uint16
	NodePort     bool
	HasEndpoints bool
}

// Ruleset is the complete desired state of one family's table, as parts.
type Ruleset struct {
	Family   cluster.Family
	Table    string
	Base     *Part
	Services map[cluster.ServiceKey]*Part
	// Shared holds the shared chains in use (endpoint pickers), by name.
	Shared map[string]*Chain
}

// Flat is a whole table in one piece: what render and the tracer read.
type Flat struct {
	Family   cluster.Family
	Table    string
	Chains   map[string]*Chain
	Sets     map[string]*Set
	Elements map[string][]Element
	// ChainOrder lists chain names in a stable order (base chains first).
	ChainOrder []string
	SetOrder   []string
}

// Flatten merges the base, every Service part and the shared chains.
func (r *Ruleset) Flatten() *Flat {
	f := &Flat{Family: r.Family, Table: r.Table, Chains: map[string]*Chain{}, Sets: map[string]*Set{}, Elements: map[string][]Element{}}
	add := func(p *Part) {
		if p == nil {
			return
		}
		for _, c := range p.Chains {
			if _, ok := f.Chains[c.Name]; !ok {
				f.ChainOrder = append(f.ChainOrder, c.Name)
			}
			f.Chains[c.Name] = c
		}
		for _, s := range p.Sets {
			if _, ok := f.Sets[s.Name]; !ok {
				f.SetOrder = append(f.SetOrder, s.Name)
			}
			f.Sets[s.Name] = s
		}
		for e := range p.AllElements() {
			f.Elements[e.Set] = append(f.Elements[e.Set], e)
		}
	}
	add(r.Base)
	keys := make([]cluster.ServiceKey, 0, len(r.Services))
	for k := range r.Services {
		keys = append(keys, k)
	}
	sortServiceKeys(keys)
	for _, k := range keys {
		add(r.Services[k])
	}
	shared := make([]string, 0, len(r.Shared))
	for n := range r.Shared {
		shared = append(shared, n)
	}
	sortStrings(shared)
	for _, n := range shared {
		add(&Part{Chains: []*Chain{r.Shared[n]}})
	}
	// Elements shared by several parts (hairpin, cluster-ips) appear once.
	for s, els := range f.Elements {
		seen := make(map[Element]bool, len(els))
		out := els[:0]
		for _, e := range els {
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
		f.Elements[s] = out
	}
	return f
}

// Refusal is one address of a Service that is not programmed, and why; or, with Field "spec", the
// whole Service (over its limits, budget.go: Addr is its cluster IP, which then rejects
// connections, so that vipgate explain of it says why).
type Refusal struct {
	Field  string // "spec.externalIPs", "status.loadBalancer.ingress" or "spec"
	Addr   netip.Addr
	Reason string
}

// String formats the refusal for a Rejection.
func (r Refusal) String() string {
	if !r.Addr.IsValid() || r.Field == RefusalFieldService {
		// A refusal of a field, not of an address (e.g. a bad vipgate.io/lb-algorithm annotation).
		return fmt.Sprintf("%s: %s", r.Field, r.Reason)
	}
	return fmt.Sprintf("%s %s is not programmed: %s", r.Field, r.Addr, r.Reason)
}

// RefusalFieldService is the Refusal field of a Service refused as a whole.
const RefusalFieldService = "spec"
