package dataplane

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/vipgate/vipgate/cluster"
)

// One descriptor per kind. A set, match or action kind of model.go means one thing to each consumer:
// its nft text (render.go), its netlink encoding (netlink.go), its decoding (decode.go) and what the
// packet tracer does with it (trace.go). Each kind says all of that in one place, its descriptor
// (setKindDesc, matchKindDesc, actionKindDesc below), and the consumers only look kinds up here: none
// of them has a switch over kinds, and a kind without a descriptor is an "unknown kind" error in each.
//
// The descriptors sit next to each other, by family of kinds:
//
//	kinds_match.go     the match kinds, and the address and hairpin sets they look up
//	kinds_verdict.go   jump, goto, return, drop, reject, mark, masquerade
//	kinds_dispatch.go  the verdict maps and the endpoint maps of the random picker, with their actions
//	kinds_affinity.go  session affinity: its dynamic map and its three actions
//	kinds_lbalgo.go    the balancing algorithms' actions (their code is lbalgo.go's)
//	kinds_gateway.go   the gateway's sets, matches and actions (their code is gateway_ir.go's,
//	                   gateway_route.go's, gateway_conntable.go's and gateway_netdev.go's)
//
// Every file registers its descriptors in an init function (registerSetKinds, registerMatchKinds,
// registerActionKinds), never in a map literal: a trace hook may run rules through the tracer, which
// reads these maps, and a literal would be an initialization cycle for the compiler. A kind
// registered twice panics at start.
//
// How to add a rule kind:
//
//  1. Its constant, with its nft spelling in a comment: in model.go, or next to the feature's code
//     for a feature's kind (as lbalgo.go and gateway_conntable.go do), numbered away from model.go's
//     iota range and from the other features' numbers.
//  2. One descriptor, registered from the kinds_*.go file of its family, with every field set:
//     a set kind its declaration, netlink set, element encoding, text, decoding and trace key (a
//     dynamic set, filled by packets, has no elements to write but the purges' keys); a match or
//     action kind its encoding, text, hint (the parameters decode.go proposes from a rule's
//     expressions, proved by encoding them again) and trace; an action that picks an endpoint
//     also its algorithm, and one that picks by a flow hash over a map's slots its slots (both
//     for explain.go).
//  3. Tests: TestKindDescriptorsComplete (kinds_test.go) type-checks the package's source and fails
//     on a kind constant without a complete descriptor, or two kinds with one number; then a render
//     golden file or an `nft -c` check of the text, a tracer flow, and the netlink round trip in a
//     throwaway netns (decode(program(model)) == model) that proves encoding and hint agree with the
//     kernel.

// setKindDesc is what a set kind means to each consumer.
type setKindDesc struct {
	// dynamic: the packet path fills the set, with a timeout. Its elements are runtime state: never
	// programmed, rendered or compared, only deleted by key (Tx.Purges).
	dynamic bool
	// timeout: the set's Timeout is part of its program, and decodeSet reads it back.
	timeout bool
	// decl is the nft declaration: keyword (set or map) and lines.
	decl func(fam nftFamily, s *Set) (keyword string, lines []string)
	// nftSet fills in the netlink set (ns has its table, name and comment).
	nftSet func(e *encoder, s *Set, ns *nftables.Set)
	// element writes el into w (key and val are scratch space, alen the address length); nil for a
	// set whose elements are never written, not even by key.
	element func(w *elementLists, key, val []byte, el Element, alen int) error
	// text is the nft spelling of element e (render.go wraps its error with the set and element);
	// nil for a dynamic set.
	text func(f *Flat, fam nftFamily, s *Set, e Element) (string, error)
	// decode reads one element back from the kernel; intervals instead: the kernel holds each
	// element as a start and an end, which decodeIntervals pairs. Neither for a dynamic set: its
	// elements are not listed back.
	decode    func(s *Set, alen int, ke KernelElement) (Element, error)
	intervals bool
	// traceKey projects an element onto the fields the kernel compares in a lookup (the tracer's
	// index); nil for a set the tracer never looks up by key.
	traceKey func(e Element) Element
	// traceMiss is what the tracer adds, in parentheses, to the note of a lookup that misses the
	// set ("" for nothing): a dynamic set is empty at trace time.
	traceMiss string
}

// matchKindDesc is what a match kind means to each consumer.
type matchKindDesc struct {
	// encode is the match's expressions.
	encode func(e *encoder, m Match) ([]expr.Any, error)
	// text is its nft spelling, after checking what it refers to.
	text func(f *Flat, fam nftFamily, m Match) (string, error)
	// hint proposes the match's parameters from a rule's expressions (decode.go); decode.go sets
	// the kind.
	hint func(h hints) Match
	// trace evaluates the match for the packet of st: whether it holds, and if not why (the note
	// of the rule's step). random, if not 0, is the modulus of a random match, which holds for one
	// in random packets: the tracer follows both ways (tracer.exec).
	trace func(t *tracer, st pstate, m Match) (hold bool, why string, random uint32, err error)
}

// actionKindDesc is what an action kind means to each consumer.
type actionKindDesc struct {
	// encode is the action's expressions.
	encode func(e *encoder, a Action) ([]expr.Any, error)
	// text is its nft spelling, after checking what it refers to.
	text func(f *Flat, fam nftFamily, a Action) (string, error)
	// hint proposes the action's parameters from a rule's expressions (decode.go); decode.go sets
	// the kind.
	hint func(h hints) Action
	// trace performs the action in a trace (trace.go; all of the rule's matches hold). Like
	// tracer.act it reports whether the branch goes on with the next rule of its current chain;
	// if not, it has ended the branch (c.done) or failed the trace.
	trace func(c actCall, st pstate, a Action) (pstate, bool)
	// algorithm is the balancing algorithm the action picks an endpoint by, for explain.go ("" for
	// an action that picks none).
	algorithm cluster.LBAlgorithm
	// slots, for an action that picks by a flow hash over the slots of a map, is that map, for
	// explain.go; nil for other actions.
	slots *slotMap
}

// slotMap is the map of slots a flow-hash action picks from (actionKindDesc.slots).
type slotMap struct {
	// kind is the map's set kind (the action's Map names it).
	kind SetKind
	// flow: the slot is GatewaySlot of the flow, in a map keyed by the entry's address (explain.go
	// names the slot a given flow takes); routed: the map's data is a next hop, not an endpoint.
	flow, routed bool
}

// The descriptors by kind, and the kinds in ascending order: the order in which decode.go tries
// its candidates (a kind's number says where it is tried, so the order never depends on which file
// registered first).
var (
	setKindDescs    = map[SetKind]*setKindDesc{}
	matchKindDescs  = map[MatchKind]*matchKindDesc{}
	actionKindDescs = map[ActionKind]*actionKindDesc{}

	allSetKinds []SetKind
	matchKinds  []MatchKind
	actionKinds []ActionKind
)

// register adds the descriptors of ds to descs and their kinds to the sorted list kinds.
func register[K ~uint8, D any](what string, descs map[K]*D, kinds *[]K, ds map[K]*D) {
	for k, d := range ds {
		if _, dup := descs[k]; dup {
			panic(fmt.Sprintf("%s kind %d has two descriptors", what, k))
		}
		descs[k] = d
		i, _ := slices.BinarySearch(*kinds, k)
		*kinds = slices.Insert(*kinds, i, k)
	}
}

func registerSetKinds(ds map[SetKind]*setKindDesc) { register("set", setKindDescs, &allSetKinds, ds) }

func registerMatchKinds(ds map[MatchKind]*matchKindDesc) {
	register("match", matchKindDescs, &matchKinds, ds)
}

func registerActionKinds(ds map[ActionKind]*actionKindDesc) {
	register("action", actionKindDescs, &actionKinds, ds)
}

// SetKindDynamic says whether sets of kind k are filled by packets (see setKindDesc.dynamic).
func SetKindDynamic(k SetKind) bool {
	d := setKindDescs[k]
	return d != nil && d.dynamic
}

// noMatchParams and noActionParams are the hints of kinds without parameters.
func noMatchParams(hints) Match   { return Match{} }
func noActionParams(hints) Action { return Action{} }
