package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vipgate/vipgate/cluster"
)

// This file turns a trace (trace.go) into what `vipgate explain` reports, as values: the rule that
// decided each outcome, the candidates with their probability and masquerade reason, the reasons of
// drops, rejects and accepts, the balancing algorithm and a flow's Maglev slot. Nothing here reads
// the trace's prose (Step.Note, Candidate.Why, Result.Reason): the command prints these values in
// its own words.

// MasqReason says why the source of a DNATed packet is masqueraded.
type MasqReason uint8

// Masquerade reasons.
const (
	// MasqNone: the source is kept.
	MasqNone MasqReason = iota
	// MasqGatewaySNAT: the gateway masquerades the Service's traffic (snat: always, or auto with
	// nodePort forwarding to an externalTrafficPolicy=Cluster Service) so replies come back
	// through it.
	MasqGatewaySNAT
	// MasqClusterIPFromOutside: ClusterIP traffic from outside the pod network (source not in
	// clusterCIDRs, or masqueradeAll).
	MasqClusterIPFromOutside
	// MasqExternalCluster: externalTrafficPolicy=Cluster traffic to an external IP, LoadBalancer
	// IP or NodePort.
	MasqExternalCluster
	// MasqLocalFromHost: traffic from this host to an externalTrafficPolicy=Local Service.
	MasqLocalFromHost
	// MasqMarkedByChain: another chain marked the packet for masquerade (ExplainedCandidate.MarkRule).
	MasqMarkedByChain
	// MasqHairpin: the endpoint is the client itself.
	MasqHairpin
	// MasqOther: masqueraded by Candidate.MasqRule for none of the reasons above.
	MasqOther
)

var masqReasonNames = [...]string{"none", "gateway-snat", "clusterip-from-outside", "external-cluster",
	"local-from-host", "marked-by-chain", "hairpin", "other"}

func (m MasqReason) String() string {
	if int(m) < len(masqReasonNames) {
		return masqReasonNames[m]
	}
	return "MasqReason(" + strconv.Itoa(int(m)) + ")"
}

// ExplainRole is what one role (the node's proxy, the gateway) knows of the chains and sets of
// its tables, which Explain needs to say why: the engine names none of them. A zero field knows
// nothing. Explain asks the roles it is given in order, and takes the first answer.
type ExplainRole struct {
	// Masquerade says why candidate c of table f, which is masqueraded, is (MasqNone: the role
	// does not know) and which rule marked it for masquerade (zero if none did).
	Masquerade func(f *Flat, c Candidate) (MasqReason, RuleRef)
	// Verdict says why a rule of chain dropped or rejected (o) the packet (VerdictOther: the role
	// does not know), and for VerdictSourceRange the Service port ("ns/name port 80/tcp").
	Verdict func(chain string, o Outcome) (VerdictReason, string)
	// EntrySets are the sets whose elements' addresses are Service addresses: a packet to one of
	// them that no rule takes is AcceptUndefinedPort.
	EntrySets []string
}

// masqReasonOf says why candidate c of f, which was masqueraded, was: the first role's answer,
// else hairpin when the masquerading rule matches the hairpin set, else MasqOther.
func masqReasonOf(f *Flat, c Candidate, roles []ExplainRole) (MasqReason, RuleRef) {
	for _, r := range roles {
		if r.Masquerade == nil {
			continue
		}
		if why, mark := r.Masquerade(f, c); why != MasqNone {
			return why, mark
		}
	}
	if rule := ruleAt(f, c.MasqRule); rule != nil && slices.ContainsFunc(rule.Matches, func(m Match) bool { return m.Kind == MatchHairpin }) {
		return MasqHairpin, RuleRef{}
	}
	return MasqOther, RuleRef{}
}

// ruleAt is the rule ref names in f (nil if none).
func ruleAt(f *Flat, ref RuleRef) *Rule {
	if f == nil {
		return nil
	}
	ch := f.Chains[ref.Chain]
	if ch == nil || ref.Index < 0 || ref.Index >= len(ch.Rules) {
		return nil
	}
	return &ch.Rules[ref.Index]
}

// VerdictReason says why a packet is dropped or rejected.
type VerdictReason uint8

// Verdict reasons.
const (
	// VerdictOther: a rule vipgate does not explain further (Verdict.Rule says which).
	VerdictOther VerdictReason = iota
	// VerdictNoEndpoints: the Service has no endpoints at all (rejected).
	VerdictNoEndpoints
	// VerdictNoLocalEndpoints: the Service has endpoints, but none this node may use for this
	// traffic (externalTrafficPolicy=Local or internalTrafficPolicy=Local): dropped.
	VerdictNoLocalEndpoints
	// VerdictClusterIPNoPort: the destination is a ClusterIP whose Service has no such port.
	VerdictClusterIPNoPort
	// VerdictClusterIPUnallocated: the destination is in a service CIDR but no Service has it.
	VerdictClusterIPUnallocated
	// VerdictSourceRange: the source is not in the Service's loadBalancerSourceRanges
	// (Verdict.ServicePort names the Service port).
	VerdictSourceRange
)

var verdictReasonNames = [...]string{"other", "no-endpoints", "no-local-endpoints", "clusterip-no-port",
	"clusterip-unallocated", "source-range"}

func (v VerdictReason) String() string {
	if int(v) < len(verdictReasonNames) {
		return verdictReasonNames[v]
	}
	return "VerdictReason(" + strconv.Itoa(int(v)) + ")"
}

// Verdict is a drop or reject decision and its reason.
type Verdict struct {
	Outcome Outcome // OutcomeDrop or OutcomeReject
	Reason  VerdictReason
	Rule    RuleRef
	// ServicePort names the Service port of a VerdictSourceRange: "ns/name port 80/tcp".
	ServicePort string
}

// AcceptReason says why a branch of the trace leaves the packet alone.
type AcceptReason uint8

// Accept reasons.
const (
	// AcceptNone: no branch is accepted.
	AcceptNone AcceptReason = iota
	// AcceptNotServiceTraffic: no vipgate rule matched: the destination is not a Service's.
	AcceptNotServiceTraffic
	// AcceptUndefinedPort: the destination is a Service address, but no Service port is defined
	// on it for this port and protocol.
	AcceptUndefinedPort
)

// Explanation is a trace explained: Explain's report.
type Explanation struct {
	// Result is the trace itself (steps, summary, Reason in words).
	Result Result
	// Candidates are Result.Candidates with what the table says about their slots.
	Candidates []ExplainedCandidate
	// Verdicts are the drop and reject decisions, in Result.Decisions' order.
	Verdicts []Verdict
	// Accept says why some branch leaves the packet alone (AcceptNone if none does).
	Accept AcceptReason
	// Algorithm is how the candidate is chosen: cluster.LBMaglev for a flow hash over slots (a
	// gateway, or a Service with lb-algorithm maglev), LBSourceHash, LBRoundRobin, LBRandom; ""
	// when nothing is chosen (no candidate, or one reached without a choice).
	Algorithm cluster.LBAlgorithm
	// Maglev is the slot a flow with a source port (Packet.SrcPort) hashes to in a gateway's
	// slot map; nil without a source port or such a rule.
	Maglev *MaglevChoice
}

// ExplainedCandidate is a candidate and, for one picked by a flow hash over a slot map, how many of
// the map's slots lead to it.
type ExplainedCandidate struct {
	Candidate
	// MasqReason says why the source is masqueraded (MasqNone when it is not), MarkRule the rule
	// that marked it for masquerade (zero if none did), as the roles tell (ExplainRole).
	MasqReason MasqReason
	MarkRule   RuleRef
	// Slots of SlotsOf slots lead to the candidate (0 of 0: not picked by slots).
	Slots, SlotsOf uint32
}

// MaglevChoice is the slot a gateway's jhash puts a flow in, and the backend that slot names.
type MaglevChoice struct {
	Slot, Slots uint32
	// Map is the slot map.
	Map string
	// Backend is the pod or node address and port (DNAT), or the node (Routed, port 0).
	Backend netip.AddrPort
	Routed  bool
}

// Explain traces p through f and explains the result, with what roles know of f's chains and
// sets (the proxy's and the gateway's ExplainRole).
func Explain(f *Flat, h HostInfo, p Packet, roles ...ExplainRole) Explanation {
	res := Trace(f, h, p)
	ex := Explanation{Result: res}
	dst := p.Dst.Unmap()
	if p.SrcPort != 0 && f != nil {
		ex.Maglev = maglevChoice(f, netip.AddrPortFrom(p.Src.Unmap(), p.SrcPort), netip.AddrPortFrom(dst, p.Port), p.Proto)
	}
	if res.Outcome == OutcomeError {
		return ex
	}
	for _, c := range res.Candidates {
		ec := ExplainedCandidate{Candidate: c}
		if c.Masquerade {
			ec.MasqReason, ec.MarkRule = masqReasonOf(f, c, roles)
		}
		if d := actionKindDescs[c.Rule.Action]; d != nil && d.slots != nil { // kinds.go
			ec.Slots, ec.SlotsOf = slotsTo(f, c.Rule, *d.slots, dst, p.Proto, p.Port, c.Endpoint)
			if ec.Probability == 0 && ec.SlotsOf > 0 {
				// The slot choice is the only random choice on a flow-hash path.
				ec.Probability = float64(ec.Slots) / float64(ec.SlotsOf)
			}
		}
		ex.Candidates = append(ex.Candidates, ec)
		if alg := algorithmOf(c.Rule.Action); alg != "" && (ex.Algorithm == "" || alg == cluster.LBMaglev) {
			ex.Algorithm = alg
		}
	}
	for _, d := range res.Decisions {
		switch d.Outcome {
		case OutcomeDrop, OutcomeReject:
			ex.Verdicts = append(ex.Verdicts, verdictOf(d, roles))
		case OutcomeAccept:
			ex.Accept = AcceptNotServiceTraffic
			if entryAddrKnown(f, dst, roles) {
				ex.Accept = AcceptUndefinedPort
			}
		}
	}
	return ex
}

// algorithmOf is the balancing algorithm an action kind picks an endpoint by ("" for none): its
// descriptor's (kinds.go).
func algorithmOf(k ActionKind) cluster.LBAlgorithm {
	if d := actionKindDescs[k]; d != nil {
		return d.algorithm
	}
	return ""
}

// verdictOf explains a drop or reject decision by the chain of its rule: the first role's answer.
func verdictOf(d Decision, roles []ExplainRole) Verdict {
	v := Verdict{Outcome: d.Outcome, Rule: d.Rule}
	for _, r := range roles {
		if r.Verdict == nil {
			continue
		}
		if v.Reason, v.ServicePort = r.Verdict(d.Rule.Chain, d.Outcome); v.Reason != VerdictOther {
			break
		}
	}
	return v
}

// entryAddrKnown says whether addr is the address of some Service entry in the table: an element
// of a role's EntrySets.
func entryAddrKnown(f *Flat, addr netip.Addr, roles []ExplainRole) bool {
	seen := map[string]bool{}
	for _, r := range roles {
		for _, set := range r.EntrySets {
			if seen[set] {
				continue
			}
			seen[set] = true
			for _, e := range f.Elements[set] {
				if e.Addr == addr {
					return true
				}
			}
		}
	}
	return false
}

// slotsTo counts the slots of rule's map, for the packet's VIP port, that lead to ep, and the
// rule's slot count.
func slotsTo(f *Flat, rule RuleRef, sm slotMap, dst netip.Addr, proto uint8, port uint16, ep netip.AddrPort) (n, of uint32) {
	ch := f.Chains[rule.Chain]
	if ch == nil || rule.Index < 0 || rule.Index >= len(ch.Rules) {
		return 0, 0
	}
	a := ch.Rules[rule.Index].Action
	kind, m := sm.kind, a.Map
	for _, e := range f.Elements[m] {
		if (kind != KindProtoPortEndpoints && e.Addr.Unmap() != dst) || e.Proto != proto || e.Port != port || e.Index >= a.Value {
			continue
		}
		got := netip.AddrPortFrom(e.DataAddr.Unmap(), e.DataPort)
		if kind == KindTupleAddr || kind == KindTupleMark {
			// A next hop: the node's address, the packet keeps its port.
			got = netip.AddrPortFrom(e.DataAddr.Unmap(), ep.Port())
		}
		if got == ep {
			n++
		}
	}
	return n, a.Value
}

// maglevChoice finds a gateway's jhash rule in f and returns the slot the flow src -> dst hashes to
// (as the kernel computes it, GatewaySlot) and what the slot map holds for it; nil when f has no
// gateway rule or no element for the flow.
func maglevChoice(f *Flat, src, dst netip.AddrPort, proto uint8) *MaglevChoice {
	for _, name := range orderedNames(f.ChainOrder, f.Chains) {
		for _, r := range f.Chains[name].Rules {
			a := r.Action
			d := actionKindDescs[a.Kind] // kinds.go
			if d == nil || d.slots == nil || !d.slots.flow || a.Value == 0 {
				continue
			}
			routed := d.slots.routed
			slot := GatewaySlot(src, dst, a.Value)
			for _, e := range f.Elements[a.Map] {
				if e.Addr.Unmap() == dst.Addr() && e.Proto == proto && e.Port == dst.Port() && e.Index == slot {
					m := &MaglevChoice{Slot: slot, Slots: a.Value, Map: a.Map, Routed: routed,
						Backend: netip.AddrPortFrom(e.DataAddr.Unmap(), e.DataPort)}
					if m.Routed {
						m.Backend = netip.AddrPortFrom(e.DataAddr.Unmap(), 0)
					}
					return m
				}
			}
		}
	}
	return nil
}

// FastPathExplanation is a packet's trace through a gateway's fast path netdev table
// (gateway_netdev.go) as it arrives on one ingress device: whether the fast path forwards it, or
// passes it on to the IP stack, where the family's table decides (another trace).
type FastPathExplanation struct {
	Explanation
	// Device is the ingress device traced ("" when none has an ingress chain); Devices are the
	// devices with an ingress chain (the same rules on each).
	Device  string
	Devices []string
	// Taken says the fast path forwards the packet (fwd): the family's table does not see it.
	// NodeDevice is the device fwd sends it by.
	Taken      bool
	NodeDevice string
}

// ExplainFastPath traces p, arriving on device dev ("": the first device with an ingress chain;
// every ingress chain holds the same rules), through the netdev table nd. A device without an
// ingress chain, or a packet from this host, is not the fast path's: the explanation's Result
// accepts it, and the family's table decides.
func ExplainFastPath(nd *Flat, dev string, h HostInfo, p Packet, roles ...ExplainRole) FastPathExplanation {
	var out FastPathExplanation
	if nd == nil {
		out.Result = Result{Outcome: OutcomeError, Reason: "no netdev table to trace"}
		return out
	}
	byDev := map[string]string{}
	for _, n := range orderedNames(nd.ChainOrder, nd.Chains) {
		if c := nd.Chains[n]; c.Hook == HookIngress {
			for _, d := range c.Devices {
				if _, ok := byDev[d]; !ok {
					byDev[d] = n
					out.Devices = append(out.Devices, d)
				}
			}
		}
	}
	slices.Sort(out.Devices)
	if dev == "" && len(out.Devices) > 0 {
		dev = out.Devices[0]
	}
	chain, ok := byDev[dev]
	if !ok {
		reason := fmt.Sprintf("no ingress chain of table netdev %s on device %s: the IP stack takes the packet", nd.Table, dev)
		if dev == "" {
			reason = fmt.Sprintf("table netdev %s has no ingress chain: the IP stack takes the packet", nd.Table)
		}
		out.Result = Result{Outcome: OutcomeAccept, Reason: reason}
		return out
	}
	out.Device = dev
	// Only dev's ingress chain sees the packet: the table without the other devices' chains.
	one := *nd
	one.Chains = make(map[string]*Chain, len(nd.Chains))
	for n, c := range nd.Chains {
		if c.Hook != HookIngress || n == chain {
			one.Chains[n] = c
		}
	}
	out.Explanation = Explain(&one, h, p, roles...)
	out.Taken = out.Result.Outcome == OutcomeRoute
	for _, c := range out.Result.Candidates {
		if ch := nd.Chains[c.Rule.Chain]; ch != nil && c.Rule.Index >= 0 && c.Rule.Index < len(ch.Rules) && ch.Rules[c.Rule.Index].Action.Device != "" {
			out.NodeDevice = ch.Rules[c.Rule.Index].Action.Device
			break
		}
	}
	return out
}
