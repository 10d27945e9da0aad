package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// This file is the packet tracer: it walks one packet through a Flat table the way netfilter would,
// hook by hook and rule by rule, and says where the packet ends up. The tests use it as the
// specification of what the rules do (kube-proxy's tracer in pkg/proxy/nftables/helpers_test.go is the
// model); `vipgate explain` prints its step log. Every step and candidate says what it is as values
// too (Step.Kind, Candidate.Rule, MasqRule, Jumps, Probability, Result.Decisions) besides the words, and
// explain.go builds its report from those, with what the roles know of their chains (ExplainRole):
// nothing downstream reads the prose.
//
// It evaluates the model, not nft text, and knows every match and action kind of model.go through
// its descriptor's trace (kinds.go). Anything it does not know — an unknown kind, a lookup in a set
// the table does not hold, a NAT statement in a chain the kernel would refuse it in — ends the trace
// with Outcome ERROR, so the tracer can never drift silently from the rules.
//
// Random choices are explored, not drawn: a picker's `numgen random mod N` yields every index, and a
// `numgen random mod N == 0` match both holds and fails; the result is the union of every branch.

// Packet is the first packet of a new connection.
type Packet struct {
	Src, Dst netip.Addr
	// Proto is the IP protocol number (ProtoTCP, ProtoUDP, ProtoSCTP).
	Proto uint8
	Port  uint16
	// FromHost says the packet was originated by this host (output hook path) instead of arriving
	// from an interface (prerouting path).
	FromHost bool
	// SrcPort is the packet's source port, 0 if unknown. Trace does not hash it (every slot of a
	// flow-hash rule is a branch); Explain uses it to name the Maglev slot the flow takes.
	SrcPort uint16
}

// HostInfo is what the tracer needs to know about the host.
type HostInfo struct {
	// IsLocal reports the host's own addresses (`fib ... type local`): routing delivers packets to
	// them locally. nil means no address is local.
	IsLocal func(netip.Addr) bool
}

// Candidate is one endpoint the packet may be DNATed to (or, for OutcomeRoute, the next hop it is
// sent to unchanged).
type Candidate struct {
	Endpoint   netip.AddrPort
	Masquerade bool
	// Why tells the random choices that lead here and why the source is (not) masqueraded, for
	// people. Programs read the typed fields below.
	Why string
	// Branch names the random choices that lead here ("" for none): Step.Branch of its steps.
	Branch string
	// Probability is the share of new connections that take this candidate (the sum over the
	// branches that reach it), 0 when unknown: a random choice on its path did not say its weight
	// (see pstate.fork).
	Probability float64
	// Rule is the rule that DNATed the packet (or sent it to its next hop): the DNAT target's rule.
	Rule RuleRef
	// MasqRule is the rule that masqueraded the source (zero when it is not); Explain says why,
	// with the roles' knowledge of their chains (ExplainRole).
	MasqRule RuleRef
	// Jumps are the jumps and gotos the branch took (verdict maps' verdicts among them), in order.
	Jumps []Jump
}

// Jump is a jump or goto a branch took: the rule that took it and the chain it went to.
type Jump struct {
	Rule RuleRef
	To   string
}

// RuleRef names one rule of a table: its chain, its index there, its nft text and comment, and the
// kind of its action.
type RuleRef struct {
	Chain   string
	Index   int
	Text    string
	Comment string
	Action  ActionKind
}

// String is "chain#index (comment or text)", the spelling of Result.Reason.
func (r RuleRef) String() string {
	return fmt.Sprintf("%s#%d (%s)", r.Chain, r.Index, cmp.Or(r.Comment, r.Text))
}

// Decision is what decided one branch's outcome, as Result.Reason lists it in words.
type Decision struct {
	Outcome Outcome
	// Rule is the deciding rule: the DNAT or route rule, the rule that dropped or rejected. For
	// an accept (no rule DNATed, dropped or rejected the packet) it has no Chain and Index -1.
	Rule RuleRef
	// By is the decision in words (one element of Result.Reason).
	By string
}

// Outcome is what happens to the packet.
type Outcome string

// Outcomes.
const (
	// OutcomeDNAT: the packet is DNATed to one of Result.Candidates and leaves (or is delivered).
	OutcomeDNAT Outcome = "DNAT"
	// OutcomeDrop and OutcomeReject: a rule drops or rejects the packet.
	OutcomeDrop   Outcome = "DROP"
	OutcomeReject Outcome = "REJECT"
	// OutcomeRoute: the packet is sent, unchanged, to one of Result.Candidates as its next hop (a
	// gateway with forwarding: route); the original is dropped.
	OutcomeRoute Outcome = "ROUTE"
	// OutcomeAccept: the packet passes untouched (it is not Service traffic).
	OutcomeAccept Outcome = "ACCEPT"
	// OutcomeMixed: different random choices lead to different outcomes (Candidates and Others).
	OutcomeMixed Outcome = "MIXED"
	// OutcomeError: the tracer met something it cannot evaluate; Reason says what.
	OutcomeError Outcome = "ERROR"
)

// StepKind says what a trace step is.
type StepKind uint8

// Step kinds.
const (
	// StepRule: a rule step logged by a hook that did not say whether the rule matched (the
	// gateway's and the balancing algorithms' action kinds).
	StepRule StepKind = iota
	// StepNoMatch and StepMatch: a rule did not match / matched and acted (Action, Target).
	StepNoMatch
	StepMatch
	// StepRandomTaken and StepRandomNotTaken: a `numgen random mod N == 0` match, both ways.
	StepRandomTaken
	StepRandomNotTaken
	// StepBaseChain: the packet enters a base chain; StepSkipped: a nat base chain is skipped on
	// the loopback path.
	StepBaseChain
	StepSkipped
	// StepChainEnd: the end of a regular chain (back to its caller); StepPolicy: the end of a
	// base chain (policy accept).
	StepChainEnd
	StepPolicy
	// StepRouting: a routing decision (Hook "routing").
	StepRouting
	// StepDone: the branch made it through every hook (Hook "done"); Endpoint is where it goes.
	StepDone
)

// Step is one line of the trace log. Hook, Chain, Rule, Text, Note and Branch are what it prints;
// Kind, Action, Target and Endpoint say the same as values (they are not part of its JSON).
type Step struct {
	// Hook is the netfilter hook (or "routing" for a routing decision).
	Hook  string
	Chain string
	// Rule is the rule's index in Chain, -1 for steps that are not a rule.
	Rule int
	// Text is the rule in nft syntax.
	Text string
	Note string
	// Branch names the random choices taken so far ("" before the first).
	Branch string

	Kind StepKind `json:"-"`
	// Action is the action kind of the rule (rule steps).
	Action ActionKind `json:"-"`
	// Target is the chain a StepMatch jumps or goes to (jump, goto, or a verdict map's verdict),
	// or the chain a StepChainEnd returns to.
	Target string `json:"-"`
	// Endpoint is the address and port a StepMatch DNATs to, or a StepDone delivers to.
	Endpoint netip.AddrPort `json:"-"`
}

// String formats the step as one log line.
func (s Step) String() string {
	var b strings.Builder
	if s.Branch != "" {
		fmt.Fprintf(&b, "[%s] ", s.Branch)
	}
	b.WriteString(s.Hook)
	if s.Chain != "" {
		b.WriteString(" " + s.Chain)
		if s.Rule >= 0 {
			fmt.Fprintf(&b, "#%d", s.Rule)
		}
	}
	if s.Text != "" {
		b.WriteString(": " + s.Text)
	}
	if s.Note != "" {
		b.WriteString(" -- " + s.Note)
	}
	return b.String()
}

// Result is the outcome of a trace.
type Result struct {
	Outcome Outcome
	// Candidates are the endpoints of the DNAT branches, sorted.
	Candidates []Candidate
	// Others lists the outcomes of the branches that were not DNATed (Outcome MIXED only).
	Others []Outcome
	Steps  []Step
	Reason string
	// Decisions are the distinct decisions that Reason lists, in its order.
	Decisions []Decision
}

// String summarises the result in the style of kube-proxy's flow tests:
// "10.244.1.10:8080, 10.244.2.10:8080 masq", "DROP", "REJECT", "ACCEPT"; a gateway's routed flow
// "ROUTE via 192.0.2.11:80, 192.0.2.12:80" (next hop and the packet's unchanged port).
func (r Result) String() string {
	if r.Outcome == OutcomeError {
		return "ERROR: " + r.Reason
	}
	var parts []string
	uniform := true
	for _, c := range r.Candidates {
		uniform = uniform && c.Masquerade == r.Candidates[0].Masquerade
	}
	for _, c := range r.Candidates {
		s := c.Endpoint.String()
		if !uniform && c.Masquerade {
			s += " masq"
		}
		parts = append(parts, s)
	}
	if uniform && len(r.Candidates) > 0 && r.Candidates[0].Masquerade {
		parts[len(parts)-1] += " masq"
	}
	if len(r.Candidates) == 0 && len(r.Others) == 0 {
		return string(r.Outcome)
	}
	for _, o := range r.Others {
		parts = append(parts, string(o))
	}
	if r.Outcome == OutcomeRoute {
		return "ROUTE via " + strings.Join(parts, ", ")
	}
	return strings.Join(parts, ", ")
}

// Explain formats the whole step log, one step a line, followed by the result.
func (r Result) Explain() string {
	var b strings.Builder
	for _, s := range r.Steps {
		b.WriteString(s.String() + "\n")
	}
	fmt.Fprintf(&b, "result: %s\n", r.String())
	if r.Reason != "" && r.Outcome != OutcomeError {
		fmt.Fprintf(&b, "because: %s\n", r.Reason)
	}
	return b.String()
}

// Limits that keep a broken ruleset from tracing forever. The kernel allows 16 nested jumps.
const (
	maxJumpDepth = 16
	maxRuleEvals = 200000
)

type verdict int

const (
	vAccept verdict = iota
	vDrop
	vReject
)

type frame struct {
	chain string
	next  int
}

// pstate is the state of one branch: the packet as the current hook sees it, and where it is.
type pstate struct {
	src, dst netip.Addr
	port     uint16
	mark     uint32
	dnat     bool
	masq     bool
	masqWhy  string
	dnatBy   string
	// rule is the rule being acted on (set by act before the action runs); dnatRule the rule
	// that DNATed the packet, masqRule the one that masqueraded it; jumps the jumps and gotos
	// taken (copied on write, as stack).
	rule, dnatRule, masqRule RuleRef
	jumps                    []Jump
	// prob is the product of the weights of the random choices taken; probUnknown: a choice on
	// the path did not say its weight.
	prob        float64
	probUnknown bool
	// loopback: the packet re-enters on lo after the output path; its connection already has its
	// NAT bindings, so nat chains are not consulted again.
	loopback bool
	hook     Hook
	base     *Chain
	stack    []frame
	branch   string
}

// fork returns a copy of st on a new branch. The stack is copied on write (see exec), so sharing it
// here is safe. weight, if given, is the share of the packets reaching the choice that take this
// branch (1/N for one of N endpoints); without it the branch's Candidate.Probability is unknown.
func (st pstate) fork(label string, weight ...float64) pstate {
	if st.branch == "" {
		st.branch = label
	} else {
		st.branch += " / " + label
	}
	if len(weight) > 0 {
		st.prob *= weight[0]
	} else {
		st.probUnknown = true
	}
	return st
}

// probability is the branch's Candidate.Probability.
func (st pstate) probability() float64 {
	if st.probUnknown {
		return 0
	}
	return st.prob
}

type final struct {
	outcome Outcome
	cand    Candidate
	by      string
	// rule decided the outcome (no Chain: none did).
	rule RuleRef
}

type tracer struct {
	f      *Flat
	fam    nftFamily
	isLoc  func(netip.Addr) bool
	proto  uint8
	index  map[string]map[Element]Element
	steps  []Step
	finals []final
	err    error
	evals  int
}

// Trace walks packet p through table f and returns every outcome its random choices can lead to.
func Trace(f *Flat, h HostInfo, p Packet) Result {
	t := &tracer{f: f, isLoc: h.IsLocal, proto: p.Proto, index: map[string]map[Element]Element{}}
	if t.isLoc == nil {
		t.isLoc = func(netip.Addr) bool { return false }
	}
	if f == nil {
		return Result{Outcome: OutcomeError, Reason: "no ruleset to trace"}
	}
	fam, err := familyOf(f.Family)
	if err != nil {
		return Result{Outcome: OutcomeError, Reason: err.Error()}
	}
	t.fam = fam
	if !p.Src.IsValid() || !p.Dst.IsValid() {
		return Result{Outcome: OutcomeError, Reason: "packet needs a source and a destination address"}
	}
	src, dst := p.Src.Unmap(), p.Dst.Unmap()
	if cluster.FamilyOf(src) != cluster.FamilyOf(dst) {
		return Result{Outcome: OutcomeError, Reason: fmt.Sprintf("source %s and destination %s are of different families", src, dst)}
	}
	if cluster.FamilyOf(dst) != ipFamily(f.Family) {
		return Result{Outcome: OutcomeAccept, Reason: fmt.Sprintf("table %s %s does not see IPv%d packets", fam.tableFamily(), f.Table, cluster.FamilyOf(dst))}
	}
	st := pstate{src: src, dst: dst, port: p.Port, prob: 1}
	switch {
	case fam.netdev:
		// A netdev table (gateway_netdev.go) sees arriving packets at ingress, before the IP stack;
		// what it accepts goes on to the family's table, which is another trace.
		if p.FromHost {
			return Result{Outcome: OutcomeAccept, Reason: fmt.Sprintf("table netdev %s does not see packets from this host", f.Table)}
		}
		t.runHook(st, HookIngress, func(st pstate) {
			t.info(st, StepDone, "done", "accepted: on to the IP stack and the family's table")
			t.finals = append(t.finals, final{outcome: OutcomeAccept, by: "no rule forwarded or dropped it", rule: RuleRef{Index: -1}})
		})
	case p.FromHost:
		t.runHook(st, HookOutput, t.afterOutput)
	default:
		t.runHook(st, HookPrerouting, t.route)
	}
	return t.result()
}

// route is the routing decision for an arriving packet, on its (possibly DNATed) destination.
func (t *tracer) route(st pstate) {
	if t.isLoc(st.dst) {
		t.info(st, StepRouting, "routing", fmt.Sprintf("%s is a local address: input", st.dst))
		t.runHook(st, HookInput, t.deliver)
		return
	}
	t.info(st, StepRouting, "routing", fmt.Sprintf("%s is not a local address: forward", st.dst))
	t.runHook(st, HookForward, func(st pstate) { t.runHook(st, HookPostrouting, t.deliver) })
}

// afterOutput routes a locally originated packet: every such packet passes postrouting; one for a
// local address then comes back in on lo through prerouting and input.
func (t *tracer) afterOutput(st pstate) {
	local := t.isLoc(st.dst)
	if local {
		t.info(st, StepRouting, "routing", fmt.Sprintf("%s is a local address: postrouting, then back in on lo", st.dst))
	} else {
		t.info(st, StepRouting, "routing", fmt.Sprintf("%s is not a local address: postrouting", st.dst))
	}
	t.runHook(st, HookPostrouting, func(st pstate) {
		if !local {
			t.deliver(st)
			return
		}
		st.loopback = true
		t.runHook(st, HookPrerouting, func(st pstate) { t.runHook(st, HookInput, t.deliver) })
	})
}

// deliver records a branch that made it through every hook.
func (t *tracer) deliver(st pstate) {
	if !st.dnat {
		note := "accepted, not DNATed"
		if st.masq {
			note += " (masqueraded: " + st.masqWhy + ")"
		}
		t.info(st, StepDone, "done", note)
		t.finals = append(t.finals, final{outcome: OutcomeAccept, by: "no rule DNATed, dropped or rejected it", rule: RuleRef{Index: -1}})
		return
	}
	ep := netip.AddrPortFrom(st.dst, st.port)
	why := st.branch
	if st.masq {
		why = strings.TrimPrefix(why+"; masquerade: "+st.masqWhy, "; ")
	}
	t.info(st, StepDone, "done", fmt.Sprintf("DNAT to %s, masquerade %v", ep, st.masq))
	t.steps[len(t.steps)-1].Endpoint = ep
	c := Candidate{Endpoint: ep, Masquerade: st.masq, Why: why, Branch: st.branch, Probability: st.probability(), Rule: st.dnatRule, Jumps: st.jumps}
	if st.masq {
		c.MasqRule = st.masqRule
	}
	t.finals = append(t.finals, final{outcome: OutcomeDNAT, cand: c, by: "DNAT by " + st.dnatBy, rule: st.dnatRule})
}

// sendTo records a branch that a rule (st.rule) sends unchanged to next hop ep (OutcomeRoute; ep
// carries the packet's port). The gateway's route hooks should record their routes through it, so
// that the Candidate says its rule and probability.
func (t *tracer) sendTo(st pstate, ep netip.AddrPort, by string) {
	t.finals = append(t.finals, final{outcome: OutcomeRoute,
		cand: Candidate{Endpoint: ep, Why: st.branch, Branch: st.branch, Probability: st.probability(), Rule: st.rule},
		by:   by, rule: st.rule})
}

// baseChains returns the base chains of hook in netfilter order: by priority, then table order.
func (t *tracer) baseChains(hook Hook) []*Chain {
	var out []*Chain
	for _, n := range orderedNames(t.f.ChainOrder, t.f.Chains) {
		if c := t.f.Chains[n]; c.Hook == hook {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b *Chain) int { return cmp.Compare(a.Priority, b.Priority) })
	return out
}

// runHook runs st through the base chains of hook; next continues every branch that is accepted.
func (t *tracer) runHook(st pstate, hook Hook, next func(pstate)) {
	chains := t.baseChains(hook)
	var run func(st pstate, i int)
	run = func(st pstate, i int) {
		if t.err != nil {
			return
		}
		if i == len(chains) {
			next(st)
			return
		}
		c := chains[i]
		st.hook, st.base = hook, c
		if c.Type == NATType && st.loopback {
			t.stepOf(st, StepSkipped, c.Name, -1, "", "skipped: the connection's NAT was decided on the output path")
			run(st, i+1)
			return
		}
		t.stepOf(st, StepBaseChain, c.Name, -1, "", fmt.Sprintf("base chain: type %s hook %s priority %d", c.Type, c.Hook, c.Priority))
		st.stack = []frame{{chain: c.Name}}
		t.exec(st, func(st pstate, v verdict, by string) {
			switch v {
			case vAccept:
				if st.dnat && st.dnatRule.Chain == "" {
					// The first accept after a DNAT is the DNAT rule's own.
					st.dnatRule = st.rule
				}
				run(st, i+1)
			case vDrop:
				t.finals = append(t.finals, final{outcome: OutcomeDrop, by: by, rule: st.rule})
			case vReject:
				t.finals = append(t.finals, final{outcome: OutcomeReject, by: by, rule: st.rule})
			}
		})
	}
	run(st, 0)
}

func (t *tracer) fail(format string, args ...any) {
	if t.err == nil {
		t.err = fmt.Errorf(format, args...)
	}
}

// step logs a rule step whose kind the caller does not say (StepRule): the hooks of the gateway's
// and the balancing algorithms' action kinds use it. The rule's action kind is st.rule's.
func (t *tracer) step(st pstate, chain string, rule int, text, note string) {
	s := Step{Hook: string(st.hook), Chain: chain, Rule: rule, Text: text, Note: note, Branch: st.branch, Kind: StepRule}
	if rule >= 0 && st.rule.Chain == chain && st.rule.Index == rule {
		s.Action = st.rule.Action
	}
	t.steps = append(t.steps, s)
}

// stepOf logs a step of kind k.
func (t *tracer) stepOf(st pstate, k StepKind, chain string, rule int, text, note string) *Step {
	t.step(st, chain, rule, text, note)
	s := &t.steps[len(t.steps)-1]
	s.Kind = k
	return s
}

func (t *tracer) info(st pstate, k StepKind, hook, note string) {
	t.steps = append(t.steps, Step{Hook: hook, Rule: -1, Note: note, Branch: st.branch, Kind: k})
}

// exec runs the rules of st's base chain (and the chains it jumps to) and calls done once for every
// branch that ends the base chain: with the verdict, and what decided it.
func (t *tracer) exec(st pstate, done func(pstate, verdict, string)) {
	for t.err == nil {
		t.evals++
		if t.evals > maxRuleEvals {
			t.fail("trace exceeded %d rule evaluations (a loop in the ruleset?)", maxRuleEvals)
			return
		}
		top := len(st.stack) - 1
		fr := st.stack[top]
		ch, ok := t.f.Chains[fr.chain]
		if !ok {
			t.fail("chain %q does not exist", fr.chain)
			return
		}
		if fr.next >= len(ch.Rules) {
			if top == 0 {
				t.stepOf(st, StepPolicy, ch.Name, -1, "", "end of base chain: policy accept")
				done(st, vAccept, "policy accept of "+ch.Name)
				return
			}
			st.stack = st.stack[:top:top]
			t.stepOf(st, StepChainEnd, ch.Name, -1, "", "end of chain: back to "+st.stack[top-1].chain).Target = st.stack[top-1].chain
			continue
		}
		// Copy on write: forks share the stack's backing array.
		st.stack = append(st.stack[:top:top], frame{fr.chain, fr.next + 1})
		idx, r := fr.next, ch.Rules[fr.next]
		text, err := ruleText(t.f, t.fam, r)
		if err != nil {
			t.fail("chain %q rule %d: %v", ch.Name, idx, err)
			return
		}
		st.rule = RuleRef{Chain: ch.Name, Index: idx, Text: text, Comment: r.Comment, Action: r.Action.Kind}
		ok, why, numgen, err := t.matches(st, r)
		if err != nil {
			t.fail("chain %q rule %d (%s): %v", ch.Name, idx, text, err)
			return
		}
		if !ok {
			t.stepOf(st, StepNoMatch, ch.Name, idx, text, "no match: "+why)
			continue
		}
		if len(numgen) > 0 {
			// A random match both holds and fails: follow both. It holds for 1 in N packets (for
			// each of its numgen matches).
			w := 1.0
			for _, n := range numgen {
				w /= float64(n)
			}
			label := fmt.Sprintf("%s#%d", ch.Name, idx)
			taken := st.fork(label+" taken", w)
			t.stepOf(taken, StepRandomTaken, ch.Name, idx, text, "random choice taken")
			if next, cont := t.act(taken, ch, idx, r, text, done); cont {
				t.exec(next, done)
			}
			notTaken := st.fork(label+" not taken", 1-w)
			t.stepOf(notTaken, StepRandomNotTaken, ch.Name, idx, text, "random choice not taken")
			st = notTaken
			continue
		}
		next, cont := t.act(st, ch, idx, r, text, done)
		if !cont {
			return
		}
		st = next
	}
}

// matches evaluates the matches of r. The numgen matches are returned rather than decided.
func (t *tracer) matches(st pstate, r Rule) (ok bool, why string, numgen []uint32, err error) {
	for _, m := range r.Matches {
		d := matchKindDescs[m.Kind] // kinds.go
		if d == nil {
			return false, "", nil, fmt.Errorf("unknown match kind %d", m.Kind)
		}
		hold, why, random, err := d.trace(t, st, m)
		if err != nil {
			return false, "", nil, err
		}
		if random != 0 {
			numgen = append(numgen, random)
		}
		if !hold {
			return false, why, nil, nil
		}
	}
	return true, "", numgen, nil
}

// keyOf projects e onto the key fields of a set of kind k: what the kernel compares (the kind's
// traceKey, kinds.go).
func keyOf(k SetKind, e Element) (Element, error) {
	d := setKindDescs[k]
	if d == nil || d.traceKey == nil {
		return Element{}, fmt.Errorf("unknown set kind %d", k)
	}
	return d.traceKey(e), nil
}

// lookup finds key in set name, which must be of one of kinds.
func (t *tracer) lookup(name string, key Element, kinds ...SetKind) (Element, bool, error) {
	if err := needSet(t.f, name, kinds...); err != nil {
		return Element{}, false, err
	}
	kind := t.f.Sets[name].Kind
	idx, ok := t.index[name]
	if !ok {
		idx = map[Element]Element{}
		for _, e := range t.f.Elements[name] {
			k, err := keyOf(kind, e)
			if err != nil {
				return Element{}, false, fmt.Errorf("set %q: %w", name, err)
			}
			idx[k] = e
		}
		t.index[name] = idx
	}
	k, err := keyOf(kind, key)
	if err != nil {
		return Element{}, false, fmt.Errorf("set %q: %w", name, err)
	}
	e, found := idx[k]
	return e, found, nil
}

// addrIn looks an address up in an address or prefix set, or the keys of an affinity map.
func (t *tracer) addrIn(name string, a netip.Addr) (bool, error) {
	if err := needSet(t.f, name, addrSetKinds...); err != nil {
		return false, err
	}
	switch kind := t.f.Sets[name].Kind; {
	case SetKindDynamic(kind):
		// The packets themselves fill a dynamic set (an affinity map's clients); a trace starts
		// from an empty one.
		return false, nil
	case kind == KindPrefix:
		for _, e := range t.f.Elements[name] {
			if e.Prefix.Contains(a) {
				return true, nil
			}
		}
		return false, nil
	}
	_, found, err := t.lookup(name, Element{Addr: a}, KindAddr)
	return found, err
}

// checkNAT refuses NAT statements where the kernel would refuse to load them.
func (t *tracer) checkNAT(st pstate, what string, hooks ...Hook) error {
	if st.base.Type != NATType || !slices.Contains(hooks, st.hook) {
		return fmt.Errorf("%s reached from base chain %q (type %s, hook %s): the kernel only allows it in nat chains at %v",
			what, st.base.Name, st.base.Type, st.hook, hooks)
	}
	return nil
}

// gotoChain replaces the current frame with chain (goto semantics).
func (t *tracer) gotoChain(st pstate, chain string) (pstate, error) {
	if _, ok := t.f.Chains[chain]; !ok {
		return st, fmt.Errorf("goto missing chain %q", chain)
	}
	top := len(st.stack) - 1
	st.stack = append(st.stack[:top:top], frame{chain: chain})
	st.jumps = append(st.jumps[:len(st.jumps):len(st.jumps)], Jump{Rule: st.rule, To: chain})
	return st, nil
}

// applyVerdict runs a verdict found in a verdict map. It reports whether the branch goes on.
func (t *tracer) applyVerdict(st pstate, e Element, by string, done func(pstate, verdict, string)) (pstate, bool) {
	switch e.Verdict {
	case VerdictGoto, VerdictReject:
		c := e.Chain
		if e.Verdict == VerdictReject {
			c = cmp.Or(c, ChainReject)
		}
		next, err := t.gotoChain(st, c)
		if err != nil {
			t.fail("%s: %v", by, err)
			return st, false
		}
		return next, true
	case VerdictDrop:
		done(st, vDrop, by)
		return st, false
	}
	t.fail("%s: element %+v has unknown verdict kind %d", by, e, e.Verdict)
	return st, false
}

// act performs the action of rule r (all of whose matches hold). It reports whether the branch goes
// on with the next rule of its (possibly new) current chain; if not, act has already called done, or
// continued the branch itself.
func (t *tracer) act(st pstate, ch *Chain, idx int, r Rule, text string, done func(pstate, verdict, string)) (pstate, bool) {
	a := r.Action
	by := fmt.Sprintf("%s#%d (%s)", ch.Name, idx, cmp.Or(r.Comment, text))
	d := actionKindDescs[a.Kind] // kinds.go
	if d == nil {
		t.fail("%s: unknown action kind %d", by, a.Kind)
		return st, false
	}
	// The routes a trace hook records itself (not through sendTo) are given their rule here.
	before := len(t.finals)
	next, cont := d.trace(actCall{t: t, ch: ch, idx: idx, text: text, by: by, rule: r, done: done}, st, a)
	for i := before; i < len(t.finals); i++ {
		if fi := &t.finals[i]; fi.outcome == OutcomeRoute && fi.rule.Chain == "" {
			fi.rule, fi.cand.Rule = st.rule, st.rule
			if fi.cand.Branch == "" {
				fi.cand.Branch = fi.cand.Why
			}
		}
	}
	return next, cont
}

// actCall is the rule an action acts for, as tracer.act hands it to the trace hook of an action
// kind's descriptor (actionKindDesc.trace, kinds.go).
type actCall struct {
	t    *tracer
	ch   *Chain
	idx  int
	text string
	// by names the rule in decisions and failures: "chain#index (comment or text)".
	by string
	// rule is the rule itself (its matches and action).
	rule Rule
	// done ends the branch with a verdict (as tracer.exec's done).
	done func(pstate, verdict, string)
}

// match logs that the rule matched and acted; noMatch that it did not match after all (a lookup
// the action makes failed).
func (c actCall) match(st pstate, note string) *Step {
	return c.t.stepOf(st, StepMatch, c.ch.Name, c.idx, c.text, note)
}

func (c actCall) noMatch(st pstate, note string) {
	c.t.stepOf(st, StepNoMatch, c.ch.Name, c.idx, c.text, note)
}

// fail fails the trace at the rule.
func (c actCall) fail(err error) { c.t.fail("%s: %v", c.by, err) }

// entryKey is the packet's (daddr, proto, dport) or (proto, dport) lookup key, and its nft spelling.
func (t *tracer) entryKey(st pstate, tuple bool) (Element, string) {
	if tuple {
		return Element{Addr: st.dst, Proto: t.proto, Port: st.port},
			fmt.Sprintf("%s . %s . %d", st.dst, ProtoName(t.proto), st.port)
	}
	return Element{Proto: t.proto, Port: st.port}, fmt.Sprintf("%s . %d", ProtoName(t.proto), st.port)
}

// outcomeOrder sorts the non-DNAT outcomes in Result.Others.
var outcomeOrder = map[Outcome]int{OutcomeDrop: 0, OutcomeReject: 1, OutcomeAccept: 2}

func (t *tracer) result() Result {
	r := Result{Steps: t.steps}
	if t.err != nil {
		r.Outcome, r.Reason = OutcomeError, t.err.Error()
		return r
	}
	type candKey struct {
		ep   netip.AddrPort
		masq bool
	}
	seenCand := map[candKey]int{}
	seenOther := map[Outcome]bool{}
	var reasons []string
	routed := false
	for _, fi := range t.finals {
		if fi.by != "" && !slices.Contains(reasons, fi.by) {
			reasons = append(reasons, fi.by)
			r.Decisions = append(r.Decisions, Decision{Outcome: fi.outcome, Rule: fi.rule, By: fi.by})
		}
		if fi.outcome == OutcomeRoute {
			routed = true
		}
		if fi.outcome != OutcomeDNAT && fi.outcome != OutcomeRoute {
			if !seenOther[fi.outcome] {
				seenOther[fi.outcome] = true
				r.Others = append(r.Others, fi.outcome)
			}
			continue
		}
		// The same endpoint may be reached by several branches: keep it once per masquerade value.
		// Its probability is the sum of theirs (unknown if one is).
		key := candKey{fi.cand.Endpoint, fi.cand.Masquerade}
		if i, ok := seenCand[key]; ok {
			if c := &r.Candidates[i-1]; c.Probability == 0 || fi.cand.Probability == 0 {
				c.Probability = 0
			} else {
				c.Probability += fi.cand.Probability
			}
			continue
		}
		r.Candidates = append(r.Candidates, fi.cand)
		seenCand[key] = len(r.Candidates)
	}
	slices.SortFunc(r.Candidates, func(a, b Candidate) int {
		if c := a.Endpoint.Compare(b.Endpoint); c != 0 {
			return c
		}
		return cmp.Compare(boolInt(a.Masquerade), boolInt(b.Masquerade))
	})
	slices.SortFunc(r.Others, func(a, b Outcome) int { return cmp.Compare(outcomeOrder[a], outcomeOrder[b]) })
	switch {
	case len(r.Candidates) > 0 && len(r.Others) == 0 && routed:
		r.Outcome = OutcomeRoute
	case len(r.Candidates) > 0 && len(r.Others) == 0:
		r.Outcome = OutcomeDNAT
	case len(r.Candidates) == 0 && len(r.Others) == 1:
		r.Outcome, r.Others = r.Others[0], nil
	case len(r.Candidates) == 0 && len(r.Others) == 0:
		r.Outcome, r.Reason = OutcomeError, "no branch of the trace reached an outcome"
		return r
	default:
		r.Outcome = OutcomeMixed
	}
	r.Reason = strings.Join(reasons, "; ")
	return r
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
