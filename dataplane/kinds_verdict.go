package dataplane

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// The verdict kinds (kinds.go): jump, goto, return, drop, reject, and the mark and masquerade
// actions of the masquerade path.

func init() {
	registerActionKinds(map[ActionKind]*actionKindDesc{
		ActJump: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: a.Chain}}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				return "jump " + a.Chain, needChain(f, a.Chain)
			},
			hint:  chainHint,
			trace: traceJump,
		},
		ActGoto: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: a.Chain}}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				return "goto " + a.Chain, needChain(f, a.Chain)
			},
			hint: chainHint,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				c.match(st, "match: goto "+a.Chain).Target = a.Chain
				next, err := c.t.gotoChain(st, a.Chain)
				if err != nil {
					c.fail(err)
					return st, false
				}
				return next, true
			},
		},
		ActReturn: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) { return "return", nil },
			hint: noActionParams,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				top := len(st.stack) - 1
				if top == 0 {
					c.match(st, "match: return from the base chain: policy accept")
					c.done(st, vAccept, c.by)
					return st, false
				}
				c.match(st, "match: return to "+st.stack[top-1].chain).Target = st.stack[top-1].chain
				st.stack = st.stack[:top:top]
				return st, true
			},
		},
		ActDrop: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) { return "drop", nil },
			hint: noActionParams,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				c.match(st, "match: DROP")
				c.done(st, vDrop, c.by)
				return st, false
			},
		},
		ActReject: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				code := uint8(3) // ICMP port unreachable
				if e.f == cluster.IPv6 {
					code = 4 // ICMPv6 port unreachable
				}
				return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code}}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) { return "reject", nil },
			hint: noActionParams,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				c.match(st, "match: REJECT")
				c.done(st, vReject, c.by)
				return st, false
			},
		},
		ActMarkSet: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{
					&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(^a.Value), Xor: hostU32(a.Value)},
					&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
				}, nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				return fmt.Sprintf("meta mark set meta mark | %#x", a.Value), nil
			},
			hint: markHint,
			trace: func(c actCall, st pstate, a Action) (pstate, bool) {
				st.mark |= a.Value
				c.match(st, fmt.Sprintf("match: mark is now %#x", st.mark))
				return st, true
			},
		},
		ActMasqClearMark: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				xs := []expr.Any{
					&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
					&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(0xffffffff), Xor: hostU32(a.Value)},
					&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
				}
				if a.Port == 0 {
					return append(xs, &expr.Masq{FullyRandom: true}), nil
				}
				if a.PortMax < a.Port {
					return nil, fmt.Errorf("masquerade ports %d-%d: not a range", a.Port, a.PortMax)
				}
				return append(xs,
					&expr.Immediate{Register: reg1, Data: []byte{byte(a.Port >> 8), byte(a.Port)}},
					&expr.Immediate{Register: reg2, Data: []byte{byte(a.PortMax >> 8), byte(a.PortMax)}},
					&expr.Masq{ToPorts: true, FullyRandom: true, RegProtoMin: reg1, RegProtoMax: reg2}), nil
			},
			text: func(f *Flat, fam nftFamily, a Action) (string, error) {
				if a.Port == 0 {
					return fmt.Sprintf("meta mark set meta mark ^ %#x masquerade fully-random", a.Value), nil
				}
				// nft refuses a port range without a transport protocol in its context; the gateway
				// marks only VIP ports' flows, so the match never changes what the rule does.
				return fmt.Sprintf("meta mark set meta mark ^ %#x meta l4proto { tcp, udp, sctp } masquerade to :%d-%d fully-random", a.Value, a.Port, a.PortMax), nil
			},
			hint: func(h hints) Action {
				a := markHint(h)
				if len(h.imm) == 2 && len(h.imm[0]) == 2 && len(h.imm[1]) == 2 {
					a.Port, a.PortMax = binary.BigEndian.Uint16(h.imm[0]), binary.BigEndian.Uint16(h.imm[1])
				}
				return a
			},
			trace: traceMasquerade,
		},
		ActMasquerade: {
			encode: func(e *encoder, a Action) ([]expr.Any, error) {
				return []expr.Any{&expr.Masq{FullyRandom: true}}, nil
			},
			text:  func(f *Flat, fam nftFamily, a Action) (string, error) { return "masquerade fully-random", nil },
			hint:  noActionParams,
			trace: traceMasquerade,
		},
	})
}

// chainHint proposes the chain a jump or goto goes to; markHint the bits a mark action sets or
// clears.
func chainHint(h hints) Action {
	var a Action
	if h.verdict != nil {
		a.Chain = h.verdict.Chain
	}
	return a
}

func markHint(h hints) Action { return Action{Value: u32(h.xor)} }

func traceJump(c actCall, st pstate, a Action) (pstate, bool) {
	if _, ok := c.t.f.Chains[a.Chain]; !ok {
		c.t.fail("%s: jump to missing chain %q", c.by, a.Chain)
		return st, false
	}
	if len(st.stack) >= maxJumpDepth {
		c.t.fail("%s: more than %d nested jumps", c.by, maxJumpDepth)
		return st, false
	}
	c.match(st, "match: jump "+a.Chain).Target = a.Chain
	st.jumps = append(st.jumps[:len(st.jumps):len(st.jumps)], Jump{Rule: st.rule, To: a.Chain})
	st.stack = append(st.stack[:len(st.stack):len(st.stack)], frame{chain: a.Chain})
	return st, true
}

// traceMasquerade traces ActMasqClearMark and ActMasquerade: the branch ends accepted, masqueraded
// (for hairpin traffic when the rule matches the hairpin set).
func traceMasquerade(c actCall, st pstate, a Action) (pstate, bool) {
	if err := c.t.checkNAT(st, "masquerade", HookPostrouting); err != nil {
		c.fail(err)
		return st, false
	}
	if a.Kind == ActMasqClearMark {
		st.mark ^= a.Value
	}
	st.masq, st.masqWhy, st.masqRule = true, c.by, st.rule
	c.match(st, "match: MASQUERADE")
	c.done(st, vAccept, c.by)
	return st, false
}
