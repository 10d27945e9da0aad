package dataplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// The dispatch kinds (kinds.go): the verdict maps a packet's entry is looked up in (service-ips,
// service-nodeports), the endpoint maps of the random picker, and the actions that use them.

func init() {
	registerSetKinds(map[SetKind]*setKindDesc{
		KindTupleVmap: {
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "map", []string{"type " + fam.addrType + " . inet_proto . inet_service : verdict"}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				ns.KeyType, ns.IsMap, ns.DataType = nftables.MustConcatSetType(e.addrType(), nftables.TypeInetProto, nftables.TypeInetService), true, nftables.TypeVerdict
			},
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putPort(putProto(putAddr(key, el.Addr), el.Proto), el.Port)
				w.element(key[:alen+8], nil, verdictData(el), false)
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				v, err := verdictText(f, e)
				if err != nil {
					return "", err
				}
				a, err := addrText(fam, e.Addr)
				if err != nil {
					return "", err
				}
				return a + " . " + ProtoName(e.Proto) + " . " + strconv.Itoa(int(e.Port)) + " : " + v, nil
			},
			decode: keyedElement(dataVerdict, func(el *Element, k, _ *keyReader, alen int) {
				el.Addr, el.Proto, el.Port = k.addr(alen), k.proto(), k.port()
			}),
			traceKey: func(e Element) Element { return Element{Addr: e.Addr.Unmap(), Proto: e.Proto, Port: e.Port} },
		},
		KindProtoPortVmap: {
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "map", []string{"type inet_proto . inet_service : verdict"}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				ns.KeyType, ns.IsMap, ns.DataType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService), true, nftables.TypeVerdict
			},
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putPort(putProto(key, el.Proto), el.Port)
				w.element(key[:8], nil, verdictData(el), false)
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				v, err := verdictText(f, e)
				if err != nil {
					return "", err
				}
				return ProtoName(e.Proto) + " . " + strconv.Itoa(int(e.Port)) + " : " + v, nil
			},
			decode: keyedElement(dataVerdict, func(el *Element, k, _ *keyReader, alen int) {
				el.Proto, el.Port = k.proto(), k.port()
			}),
			traceKey: func(e Element) Element { return Element{Proto: e.Proto, Port: e.Port} },
		},
		KindTupleEndpoints: {
			// `typeof`, not `type ... . mark`: nft types `numgen random mod N` as a plain integer and
			// refuses to look it up in a map keyed by mark.
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "map", []string{fmt.Sprintf("typeof %[1]s daddr . meta l4proto . th dport . numgen random mod 1 : %[1]s daddr . th dport", fam.table)}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				a := e.addrType()
				ns.KeyType = nftables.MustConcatSetType(a, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
				ns.IsMap, ns.DataType = true, nftables.MustConcatSetType(a, nftables.TypeInetService)
			},
			element: func(w *elementLists, key, val []byte, el Element, alen int) error {
				putU32(putPort(putProto(putAddr(key, el.Addr), el.Proto), el.Port), el.Index)
				putPort(putAddr(val, el.DataAddr), el.DataPort)
				w.element(key[:alen+12], val[:alen+4], nil, false)
				return nil
			},
			text: endpointElementText(true),
			decode: keyedElement(dataEndpoint, func(el *Element, k, _ *keyReader, alen int) {
				el.Addr, el.Proto, el.Port, el.Index = k.addr(alen), k.proto(), k.port(), k.hostU32()
			}),
			traceKey: tupleSlotKey,
		},
		KindProtoPortEndpoints: {
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "map", []string{fmt.Sprintf("typeof meta l4proto . th dport . numgen random mod 1 : %s daddr . th dport", fam.table)}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				ns.KeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
				ns.IsMap, ns.DataType = true, nftables.MustConcatSetType(e.addrType(), nftables.TypeInetService)
			},
			element: func(w *elementLists, key, val []byte, el Element, alen int) error {
				putU32(putPort(putProto(key, el.Proto), el.Port), el.Index)
				putPort(putAddr(val, el.DataAddr), el.DataPort)
				w.element(key[:12], val[:alen+4], nil, false)
				return nil
			},
			text: endpointElementText(false),
			decode: keyedElement(dataEndpoint, func(el *Element, k, _ *keyReader, alen int) {
				el.Proto, el.Port, el.Index = k.proto(), k.port(), k.hostU32()
			}),
			traceKey: func(e Element) Element { return Element{Proto: e.Proto, Port: e.Port, Index: e.Index} },
		},
	})
}

// endpointElementText spells an element of an endpoint map, keyed by the entry (tuple: address,
// protocol and port; else protocol and port) and the endpoint's index.
func endpointElementText(tuple bool) func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
	return func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
		d, err := addrText(fam, e.DataAddr)
		if err != nil {
			return "", err
		}
		data := d + " . " + strconv.Itoa(int(e.DataPort))
		key := ProtoName(e.Proto) + " . " + strconv.Itoa(int(e.Port)) + " . " + strconv.FormatUint(uint64(e.Index), 10)
		if !tuple {
			return key + " : " + data, nil
		}
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", err
		}
		return a + " . " + key + " : " + data, nil
	}
}

// tupleSlotKey is the trace key of the maps keyed by an entry's address, protocol, port and a slot
// (the endpoint maps, the gateway's node maps).
func tupleSlotKey(e Element) Element {
	return Element{Addr: e.Addr.Unmap(), Proto: e.Proto, Port: e.Port, Index: e.Index}
}

func init() {
	registerActionKinds(map[ActionKind]*actionKindDesc{
		ActVmapTuple: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				key, _ := e.tupleKey()
				l, err := e.mapLookup(a.Map, reg32, regVer)
				if err != nil {
					return nil, err
				}
				return append(key, l), nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				return fam.table + " daddr . meta l4proto . th dport vmap @" + a.Map, needSet(f, a.Map, KindTupleVmap)
			},
			hint:  mapHint,
			trace: traceVmap,
		},
		ActVmapProtoPort: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				l, err := e.mapLookup(a.Map, reg32, regVer)
				if err != nil {
					return nil, err
				}
				return []expr.Any{loadL4Proto(reg32), loadDport(reg32 + 1), l}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				return "meta l4proto . th dport vmap @" + a.Map, needSet(f, a.Map, KindProtoPortVmap)
			},
			hint:  mapHint,
			trace: traceVmap,
		},
		ActDNATTupleMap: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				key, next := e.tupleKey()
				key = append(key, &expr.Numgen{Register: next, Modulus: a.Value, Type: unix.NFT_NG_RANDOM})
				l, err := e.mapLookup(a.Map, reg32, reg1)
				if err != nil {
					return nil, err
				}
				return append(key, l, e.dnatFromMap()), nil
			},
			text:      dnatMapText,
			hint:      mapModulusHint,
			trace:     traceDNATMap,
			algorithm: cluster.LBRandom,
		},
		ActDNATProtoPortMap: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				l, err := e.mapLookup(a.Map, reg32, reg1)
				if err != nil {
					return nil, err
				}
				return []expr.Any{loadL4Proto(reg32), loadDport(reg32 + 1), &expr.Numgen{Register: reg32 + 2, Modulus: a.Value, Type: unix.NFT_NG_RANDOM}, l, e.dnatFromMap()}, nil
			},
			text:      dnatMapText,
			hint:      mapModulusHint,
			trace:     traceDNATMap,
			algorithm: cluster.LBRandom,
		},
	})
}

// mapHint proposes the map an action looks up; mapModulusHint also the modulus of its slot (the
// picker's numgen or a flow hash).
func mapHint(h hints) Action { return Action{Map: h.set} }

func mapModulusHint(h hints) Action { return Action{Map: h.set, Value: h.modulus} }

// dnatMapText spells ActDNATTupleMap and ActDNATProtoPortMap.
func dnatMapText(f *Flat, fam nftFamily, a Action) (string, error) {
	ip := fam.table
	tuple := ip + " daddr . meta l4proto . th dport"
	if a.Value == 0 {
		return "", fmt.Errorf("numgen modulus 0")
	}
	key, kind := tuple, KindTupleEndpoints
	if a.Kind == ActDNATProtoPortMap {
		key, kind = "meta l4proto . th dport", KindProtoPortEndpoints
	}
	return fmt.Sprintf("dnat %s addr . port to %s . numgen random mod %d map @%s", ip, key, a.Value, a.Map), needSet(f, a.Map, kind)
}

// traceVmap traces ActVmapTuple and ActVmapProtoPort: the packet's entry is looked up, and the
// verdict found applied; no element, no match.
func traceVmap(c actCall, st pstate, a Action) (pstate, bool) {
	t := c.t
	key, keyText := t.entryKey(st, a.Kind == ActVmapTuple)
	kind := KindProtoPortVmap
	if a.Kind == ActVmapTuple {
		kind = KindTupleVmap
	}
	e, found, err := t.lookup(a.Map, key, kind)
	if err != nil {
		c.fail(err)
		return st, false
	}
	if !found {
		c.noMatch(st, fmt.Sprintf("no match: %s not in @%s", keyText, a.Map))
		return st, true
	}
	v, _ := verdictText(t.f, e)
	ms := c.match(st, fmt.Sprintf("match: %s -> %s", keyText, v))
	if e.Verdict == VerdictGoto || e.Verdict == VerdictReject {
		ms.Target = cmp.Or(e.Chain, ChainReject)
	}
	return t.applyVerdict(st, e, c.by, c.done)
}

// traceDNATMap traces ActDNATTupleMap and ActDNATProtoPortMap: the picker's `numgen random mod N`
// yields every index, each a branch.
func traceDNATMap(c actCall, st pstate, a Action) (pstate, bool) {
	t, by := c.t, c.by
	if err := t.checkNAT(st, "dnat", HookPrerouting, HookOutput); err != nil {
		c.fail(err)
		return st, false
	}
	if a.Value == 0 {
		t.fail("%s: numgen modulus 0", by)
		return st, false
	}
	tuple := a.Kind == ActDNATTupleMap
	kind := KindProtoPortEndpoints
	if tuple {
		kind = KindTupleEndpoints
	}
	for i := uint32(0); i < a.Value && t.err == nil; i++ {
		b := st
		if a.Value > 1 {
			b = st.fork(fmt.Sprintf("endpoint %d of %d", i, a.Value), 1/float64(a.Value))
		}
		key, keyText := t.entryKey(b, tuple)
		key.Index = i
		e, found, err := t.lookup(a.Map, key, kind)
		if err != nil {
			c.fail(err)
			return st, false
		}
		if !found {
			// The kernel's map lookup fails, so the rule does not match and the packet goes on.
			c.noMatch(b, fmt.Sprintf("no match: %s . %d not in @%s", keyText, i, a.Map))
			t.exec(b, c.done)
			continue
		}
		b.dst, b.port, b.dnat, b.dnatBy = e.DataAddr.Unmap(), e.DataPort, true, by
		c.match(b, fmt.Sprintf("match: DNAT to %s", netip.AddrPortFrom(b.dst, b.port))).Endpoint = netip.AddrPortFrom(b.dst, b.port)
		c.done(b, vAccept, by)
	}
	return st, false
}
