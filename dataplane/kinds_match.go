package dataplane

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The match kinds of model.go (kinds.go), and the sets they look up: addresses, prefixes and the
// hairpin connections. The fast path's matches are kinds_gateway.go's.

func init() {
	registerSetKinds(map[SetKind]*setKindDesc{
		KindAddr: {
			decl: func(fam nftFamily, s *Set) (string, []string) { return "set", []string{"type " + fam.addrType} },
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				ns.KeyType = e.addrType()
			},
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putAddr(key, el.Addr)
				w.element(key[:alen], nil, nil, false)
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				return addrText(fam, e.Addr)
			},
			decode: keyedElement(dataNone, func(el *Element, k, _ *keyReader, alen int) {
				el.Addr = k.addr(alen)
			}),
			traceKey: func(e Element) Element { return Element{Addr: e.Addr.Unmap()} },
		},
		KindPrefix: {
			decl: func(fam nftFamily, s *Set) (string, []string) {
				return "set", []string{"type " + fam.addrType, "flags interval"}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				ns.KeyType, ns.Interval = e.addrType(), true
			},
			// An interval element is a start and an end element.
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putAddr(key, el.Prefix.Masked().Addr())
				w.element(key[:alen], nil, nil, false)
				if end, ok := prefixEnd(el.Prefix); ok {
					putAddr(key, end)
					w.element(key[:alen], nil, nil, true)
				}
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				return prefixText(fam, e.Prefix)
			},
			intervals: true,
			traceKey:  func(e Element) Element { return Element{Prefix: e.Prefix.Masked()} },
		},
		KindHairpin: {
			decl: func(fam nftFamily, s *Set) (string, []string) {
				a := fam.addrType
				return "set", []string{"type " + a + " . " + a + " . inet_proto . inet_service"}
			},
			nftSet: func(e *encoder, s *Set, ns *nftables.Set) {
				a := e.addrType()
				ns.KeyType = nftables.MustConcatSetType(a, a, nftables.TypeInetProto, nftables.TypeInetService)
			},
			element: func(w *elementLists, key, _ []byte, el Element, alen int) error {
				putPort(putProto(putAddr(putAddr(key, el.Addr), el.Addr2), el.Proto), el.Port)
				w.element(key[:2*alen+8], nil, nil, false)
				return nil
			},
			text: func(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
				a, err := addrText(fam, e.Addr)
				if err != nil {
					return "", err
				}
				a2, err := addrText(fam, e.Addr2)
				if err != nil {
					return "", err
				}
				return a + " . " + a2 + " . " + ProtoName(e.Proto) + " . " + strconv.Itoa(int(e.Port)), nil
			},
			decode: keyedElement(dataNone, func(el *Element, k, _ *keyReader, alen int) {
				el.Addr, el.Addr2, el.Proto, el.Port = k.addr(alen), k.addr(alen), k.proto(), k.port()
			}),
			traceKey: func(e Element) Element {
				return Element{Addr: e.Addr.Unmap(), Addr2: e.Addr2.Unmap(), Proto: e.Proto, Port: e.Port}
			},
		},
	})
}

func init() {
	registerMatchKinds(map[MatchKind]*matchKindDesc{
		MatchCtStateNew: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(expr.CtStateBitNEW), Xor: hostU32(0)},
					&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) { return "ct state new", nil },
			hint: noMatchParams,
			// A traced packet is the first of its connection.
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) { return true, "", 0, nil },
		},
		MatchCtStatusDNAT: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(ipsDstNAT), Xor: hostU32(0)},
					&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) { return "ct status dnat", nil },
			hint: noMatchParams,
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				return st.dnat, "the connection was not DNATed", 0, nil
			},
		},
		MatchDaddrInSet:    addrInSetMatch(true, false),
		MatchSaddrInSet:    addrInSetMatch(false, false),
		MatchSaddrNotInSet: addrInSetMatch(false, true),
		MatchSaddrInPrefix: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				p := m.Prefix.Masked()
				mask := make([]byte, p.Addr().BitLen()/8)
				for i := 0; i < p.Bits(); i++ {
					mask[i/8] |= 1 << (7 - uint(i%8))
				}
				return []expr.Any{
					e.loadSaddr(reg1),
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(len(mask)), Mask: mask, Xor: make([]byte, len(mask))},
					&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: addrBytes(p.Addr())},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) {
				p, err := prefixText(fam, m.Prefix)
				if err != nil {
					return "", fmt.Errorf("saddr match: %w", err)
				}
				return fam.table + " saddr " + p, nil
			},
			hint: func(h hints) Match {
				var m Match
				if a, ok := netip.AddrFromSlice(h.cmpData); ok {
					ones := 0
					for _, b := range h.mask {
						ones += bits.OnesCount8(b)
					}
					m.Prefix = netip.PrefixFrom(a, ones)
				}
				return m
			},
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				return m.Prefix.IsValid() && m.Prefix.Contains(st.src), fmt.Sprintf("%s not in %s", st.src, m.Prefix), 0, nil
			},
		},
		MatchFibSaddrLocal: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
					&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(unix.RTN_LOCAL)},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) { return "fib saddr type local", nil },
			hint: noMatchParams,
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				return t.isLoc(st.src), fmt.Sprintf("%s is not a local address", st.src), 0, nil
			},
		},
		MatchMarkAny: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(m.Value), Xor: hostU32(0)},
					&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) {
				return fmt.Sprintf("meta mark & %#x != 0", m.Value), nil
			},
			hint: func(h hints) Match { return Match{Value: u32(h.mask)} },
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				return st.mark&m.Value != 0, fmt.Sprintf("mark %#x has no bit of %#x", st.mark, m.Value), 0, nil
			},
		},
		MatchHairpin: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				r := uint32(reg32)
				out := []expr.Any{e.loadSaddr(r)}
				r += e.addrRegs()
				out = append(out, e.loadDaddr(r))
				r += e.addrRegs()
				out = append(out, loadL4Proto(r), loadDport(r+1))
				l, err := e.lookup(m.Set, reg32, false)
				if err != nil {
					return nil, err
				}
				return append(out, l), nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) {
				return fmt.Sprintf("%[1]s saddr . %[1]s daddr . meta l4proto . th dport @%s", fam.table, m.Set), needSet(f, m.Set, KindHairpin)
			},
			hint: setHint,
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				key := Element{Addr: st.src, Addr2: st.dst, Proto: t.proto, Port: st.port}
				_, hold, err := t.lookup(m.Set, key, KindHairpin)
				if err != nil {
					return false, "", 0, err
				}
				return hold, fmt.Sprintf("%s . %s . %s . %d not in @%s", st.src, st.dst, ProtoName(t.proto), st.port, m.Set), 0, nil
			},
		},
		MatchNumgenZero: {
			encode: func(e *encoder, m Match) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Numgen{Register: reg1, Modulus: m.Value, Type: unix.NFT_NG_RANDOM},
					&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, m Match) (string, error) {
				if m.Value == 0 {
					return "", fmt.Errorf("numgen modulus 0")
				}
				return fmt.Sprintf("numgen random mod %d == 0", m.Value), nil
			},
			hint: func(h hints) Match { return Match{Value: h.modulus} },
			// Random: the tracer follows both ways.
			trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
				if m.Value == 0 {
					return false, "", 0, fmt.Errorf("numgen modulus 0")
				}
				return true, "", m.Value, nil
			},
		},
	})
}

// addrInSetMatch is the descriptor of MatchDaddrInSet (daddr), MatchSaddrInSet and (not)
// MatchSaddrNotInSet: the packet's destination or source address looked up in an address set.
func addrInSetMatch(daddr, not bool) *matchKindDesc {
	field, op := "saddr", " @"
	if daddr {
		field = "daddr"
	}
	if not {
		op = " != @"
	}
	return &matchKindDesc{
		encode: encodeAddrInSet,
		text: func(f *Flat, fam nftFamily, m Match) (string, error) {
			return fam.table + " " + field + op + m.Set, needSet(f, m.Set, addrSetKinds...)
		},
		hint: setHint,
		trace: func(t *tracer, st pstate, m Match) (bool, string, uint32, error) {
			addr := st.src
			if daddr {
				addr = st.dst
			}
			in, err := t.addrIn(m.Set, addr)
			if err != nil {
				return false, "", 0, err
			}
			if not {
				return !in, fmt.Sprintf("%s is in @%s", addr, m.Set), 0, nil
			}
			why := fmt.Sprintf("%s not in @%s", addr, m.Set)
			if d := setKindDescs[t.f.Sets[m.Set].Kind]; d != nil && d.traceMiss != "" {
				why += " (" + d.traceMiss + ")" // a dynamic set is empty at trace time
			}
			return in, why, 0, nil
		},
	}
}

// encodeAddrInSet encodes MatchDaddrInSet, MatchSaddrInSet and MatchSaddrNotInSet.
func encodeAddrInSet(e *encoder, m Match) ([]expr.Any, error) {
	load := e.loadDaddr(reg1)
	if m.Kind != MatchDaddrInSet {
		load = e.loadSaddr(reg1)
	}
	l, err := e.lookup(m.Set, reg1, m.Kind == MatchSaddrNotInSet)
	if err != nil {
		return nil, err
	}
	return []expr.Any{load, l}, nil
}

// setHint proposes the set a match looks up.
func setHint(h hints) Match { return Match{Set: h.set} }

// addrSetKinds are the sets an address can be looked up in.
var addrSetKinds = []SetKind{KindAddr, KindPrefix, KindAffinity}
