package dataplane

import (
	"fmt"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/vipgate/vipgate/cluster"
)

// The gateway's kinds (kinds.go): the node maps of routed forwarding (gateway_route.go), the
// connection table's maps and actions (gateway_conntable.go), the consistent-hash DNAT
// (gateway_ir.go) and the fast path's matches and fwd action (gateway_netdev.go). Their code stays
// in those files, with the feature it belongs to; here it is given to the consumers.

func init() {
	registerSetKinds(map[SetKind]*setKindDesc{
		KindTupleAddr: {
			// A connection table's node map is declared keyed by the mark (render.go, gatewayConnsDecl).
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "map", []string{fmt.Sprintf("typeof %[1]s daddr . meta l4proto . th dport . numgen random mod 1 : %[1]s daddr", fam.table)}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				a := e.addrType()
				ns.KeyType = nftables.MustConcatSetType(a, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
				ns.IsMap, ns.DataType = true, a
			},
			element: func(w *elementLists, key, val []byte, el Element, alen int) error {
				putU32(putPort(putProto(putAddr(key, el.Addr), el.Proto), el.Port), el.Index)
				putAddr(val, el.DataAddr)
				w.element(key[:tupleAddrKeyLen(alen)], val[:alen], nil, false)
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				d, err := addrText(fam, e.DataAddr)
				if err != nil {
					return "", err
				}
				a, err := addrText(fam, e.Addr)
				if err != nil {
					return "", err
				}
				return a + " . " + ProtoName(e.Proto) + " . " + strconv.Itoa(int(e.Port)) + " . " + strconv.FormatUint(uint64(e.Index), 10) + " : " + d, nil
			},
			decode: keyedElement(dataAddr, func(el *Element, k, _ *keyReader, alen int) {
				el.Addr, el.Proto, el.Port, el.Index = k.addr(alen), k.proto(), k.port(), k.hostU32()
			}),
			traceKey: tupleSlotKey,
		},
		KindTupleMark: {
			decl: tupleMarkDecl, nftSet: tupleMarkNftSet, element: tupleMarkElement, text: tupleMarkText,
			decode: decodeMarkElement, traceKey: tupleSlotKey,
		},
		// Filled by the packets (its nftables set is dynamic), but not dynamic in setKindDesc's
		// sense: a table never holds elements of it to keep or purge, so it has none to write,
		// spell, decode or look up.
		KindGatewayFlows: {timeout: true, decl: gatewayFlowsDecl, nftSet: gatewayFlowsNftSet},
	})
}

func init() {
	registerMatchKinds(map[MatchKind]*matchKindDesc{
		MatchFragment: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) { return e.fragmentMatch(), nil },
			text:   func(f *Flat, fam nftFamily, m Match) (string, error) { return fragmentText(fam), nil },
			hint:   noMatchParams,
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				return false, "a traced packet is not a fragment", 0, nil
			},
		},
		MatchPktTypeHost: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) { return pktTypeHostMatch(), nil },
			text:   func(f *Flat, fam nftFamily, m Match) (string, error) { return "meta pkttype host", nil },
			hint:   noMatchParams,
			// A traced packet is sent to the gateway (its MAC address), as the VIP's owner.
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) { return true, "", 0, nil },
		},
	})
	flow := hashShape{tuple: true, flow: true}
	registerActionKinds(map[ActionKind]*actionKindDesc{
		ActDNATJhashMap: {
			encode: encodeJhashMap(flow, false), text: jhashMapText(flow, false), hint: mapModulusHint,
			trace: traceJhashMapDNAT(KindTupleEndpoints), algorithm: cluster.LBMaglev,
			slots: &slotMap{kind: KindTupleEndpoints, flow: true},
		},
		ActDupJhashMap: {
			encode: encodeJhashMap(flow, true), text: jhashMapText(flow, true), hint: mapModulusHint,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				return c.t.gatewayRouteAct(st, c.ch, c.idx, c.rule, c.text, c.by, c.done)
			},
			algorithm: cluster.LBMaglev,
			slots:     &slotMap{kind: KindTupleAddr, flow: true, routed: true},
		},
		// The connection table's maps are named by the rule (Set: flows, Conns: nodes, Map: slots).
		ActFlowRecall: {encode: encodeFlowRecall, text: flowRecallText, hint: flowRecallHint, trace: traceFlowRecall},
		ActFlowPick: {
			encode: encodeFlowPick, text: flowSlotText(""), hint: flowSlotHint, trace: traceFlowPick,
			algorithm: cluster.LBMaglev, slots: &slotMap{kind: KindTupleMark},
		},
		ActFlowDaisy: {
			encode: encodeFlowPick, text: flowSlotText("tcp flags & syn == 0 "), hint: flowSlotHint,
			trace: traceFlowDaisy,
		},
		// The route forwarding fast path's stateless rule.
		ActFwdJhashMap: {
			encode: encodeFwdJhashMap, text: fwdJhashMapText, hint: fwdJhashMapHint, trace: traceFwdJhashMap,
			algorithm: cluster.LBMaglev, slots: &slotMap{kind: KindTupleAddr, flow: true, routed: true},
		},
	})
}

// flowRecallHint proposes ActFlowRecall's maps: the flows (looked up, then updated) and the nodes
// (the second lookup); flowSlotHint ActFlowPick's and ActFlowDaisy's: the slots (the first
// lookup), the nodes (the second), the flows (added to) and the slot count.
func flowRecallHint(h hints) Action { return Action{Set: h.dynset, Conns: h.set2} }
func flowSlotHint(h hints) Action {
	return Action{Map: h.set, Conns: h.set2, Set: h.dynset, Value: h.modulus}
}
