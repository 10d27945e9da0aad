package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"unicode"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// NetlinkProgrammer is the netlink edge: it encodes a Tx into nftables netlink messages and sends them
// as one batch (one atomic kernel transaction). It never execs the nft binary.
//
// A connection that saw an error is never reused (google/nftables drops a failed message from its
// queue but still sends the rest on the next Flush). The batch socket of Apply is kept between
// successful batches (see send); Close releases it.
type NetlinkProgrammer struct {
	// NetNSFd, if non-zero, programs that network namespace instead of the current one.
	NetNSFd int
	// SocketBuffer is the send/receive buffer size forced on the socket (a full sync of 10,000
	// Services is several MiB in one batch). Default 64 MiB.
	SocketBuffer int
	// Decode is what ReadTable's decoder is told about the role's tables (DecodeOptions).
	Decode DecodeOptions

	batchMu   sync.Mutex
	batchConn *netlink.Conn // the socket of the last successful batch, for the next one
}

// Close releases the socket kept for the next batch (it also holds NetNSFd's namespace alive).
// The programmer stays usable: the next Apply opens a new one.
func (n *NetlinkProgrammer) Close() error {
	n.batchMu.Lock()
	defer n.batchMu.Unlock()
	if n.batchConn == nil {
		return nil
	}
	err := n.batchConn.Close()
	n.batchConn = nil
	return err
}

// Registers. nftables has four 16-byte registers (1-4) that are also addressable as sixteen 4-byte
// ones (8-23). Concatenations are laid out field after field in 4-byte steps.
const (
	reg1   = 1 // 16-byte register 1 = reg32 0..3
	reg2   = 2
	reg32  = 8 // first 4-byte register (same storage as reg1)
	regVer = 0
)

func (n *NetlinkProgrammer) conn() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(n.socketBuffers)}
	if n.NetNSFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(n.NetNSFd))
	}
	return nftables.New(opts...)
}

// socketBuffers sizes a socket's buffers for a big batch. SO_*BUFFORCE lifts the sysctl caps (we
// are root); without the privilege the capped sizes are asked for.
func (n *NetlinkProgrammer) socketBuffers(c *netlink.Conn) error {
	buf := n.SocketBuffer
	if buf == 0 {
		buf = 64 << 20
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, buf); e != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, buf)
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, buf); e != nil && serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, buf)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

func tableFamily(f cluster.Family) nftables.TableFamily {
	if isNetdev(f) {
		return nftables.TableFamilyNetdev // gateway_netdev.go
	}
	if f == cluster.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// Apply sends tx as one batch (see netlink_batch.go).
func (n *NetlinkProgrammer) Apply(tx *Tx) error {
	b, err := newBatch(tx.Family, tx.Table)
	if err != nil {
		return err
	}
	enc := newEncoder(tx, b)
	enc.ifindex = ifindexIn(n.NetNSFd)
	if err := enc.encode(tx); err != nil {
		return err
	}
	if err := n.send(b); err != nil {
		return err
	}
	if len(tx.Purges) > 0 {
		return n.purgeAffinity(tx)
	}
	return nil
}

// DeleteTable removes the table of family f if it exists (for `vipgate node --cleanup`).
func (n *NetlinkProgrammer) DeleteTable(f cluster.Family, name string) error {
	c, err := n.conn()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: name, Family: tableFamily(f)}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}

type encoder struct {
	f cluster.Family // the packets' IP family
	// netdev: the table is of the netdev family (gateway_netdev.go): every rule starts with the
	// `meta protocol` its payload matches depend on. ifindex finds a fwd device's index (nil: in
	// the current network namespace).
	netdev  bool
	ifindex func(string) (int, error)
	// ifnames names the interfaces by index when decoding a netdev table (decode.go).
	ifnames map[uint32]string
	t       *nftables.Table
	c       *nftables.Conn // queues into b
	b       *batch
	sets    map[string]*nftables.Set // created in this batch (carry IDs) or referenced
	kinds   map[string]*Set
	chains  map[string]*nftables.Chain
}

// newEncoder returns an encoder of tx into b.
func newEncoder(tx *Tx, b *batch) *encoder {
	return &encoder{f: ipFamily(tx.Family), netdev: isNetdev(tx.Family), t: &nftables.Table{Name: tx.Table, Family: tableFamily(tx.Family)}, c: b.lib, b: b,
		sets: map[string]*nftables.Set{}, kinds: tx.Sets, chains: map[string]*nftables.Chain{}}
}

func (e *encoder) chain(name string) *nftables.Chain {
	if ch, ok := e.chains[name]; ok {
		return ch
	}
	ch := &nftables.Chain{Name: name, Table: e.t}
	e.chains[name] = ch
	return ch
}

func (e *encoder) encode(tx *Tx) error {
	if tx.Full {
		// Add-then-delete makes the delete valid whether or not the table exists; the batch then
		// re-creates it. The kernel applies all of it atomically: no packet sees an empty table.
		e.c.AddTable(e.t)
		e.c.DelTable(e.t)
		if !e.netdev || len(tx.AddSets) > 0 || len(tx.AddChains) > 0 {
			e.c.AddTable(e.t)
		} // else an empty netdev table: deleted (gateway_netdev.go, no fast path)
	}
	for _, s := range tx.AddSets {
		ns, err := e.nftSet(s)
		if err != nil {
			return err
		}
		if err := e.c.AddSet(ns, nil); err != nil {
			return fmt.Errorf("adding set %s: %w", s.Name, err)
		}
		e.sets[s.Name] = ns
	}
	for _, ch := range tx.AddChains {
		if len(ch.Devices) > 1 {
			// google/nftables v0.3.0 writes one NFTA_HOOK_DEV; gateway_netdev.go makes a chain per device.
			return fmt.Errorf("chain %s: %d devices; one per chain", ch.Name, len(ch.Devices))
		}
		e.c.AddChain(e.nftChain(ch))
	}
	for _, ch := range tx.FlushChains {
		e.c.FlushChain(e.chain(ch.Name))
	}
	for _, list := range [][]*Chain{tx.AddChains, tx.FlushChains} {
		for _, ch := range list {
			for i, r := range ch.Rules {
				exprs, err := e.rule(r)
				if err != nil {
					return fmt.Errorf("chain %s rule %d: %w", ch.Name, i, err)
				}
				e.c.AddRule(&nftables.Rule{Table: e.t, Chain: e.chain(ch.Name), Exprs: exprs, UserData: ruleUserData(r.Comment)})
			}
		}
	}
	if e.netdev {
		e.b.fwd = uint32(e.natFamily()) // take rewrites the rules (gateway_netdev.go)
	}
	if err := e.b.take(); err != nil {
		return err
	}
	if err := e.elements(slices.Values(tx.DelElements), false); err != nil {
		return err
	}
	if err := e.elements(tx.AddedElements(), true); err != nil {
		return err
	}
	for _, name := range tx.DelChains {
		e.c.FlushChain(e.chain(name))
	}
	for _, name := range tx.DelChains {
		e.c.DelChain(e.chain(name))
	}
	for _, name := range tx.DelSets {
		e.c.DelSet(&nftables.Set{Table: e.t, Name: name})
	}
	return e.b.take()
}

// Rule comments travel in the rule's userdata (NFTA_RULE_USERDATA), as nft writes them: a list of
// type-length-value records (libnftnl's udata), the comment being type NFTNL_UDATA_RULE_COMMENT with a
// NUL-terminated string. So `nft list ruleset` shows vipgate's comments, and decode.go reads them back.
const (
	udataRuleComment = 0 // NFTNL_UDATA_RULE_COMMENT
	// maxCommentLen is what render.go's quote keeps of a comment (nft refuses more than 128 bytes).
	maxCommentLen = 127
)

// commentText is a comment as vipgate writes it, to the kernel (userdata) and in `nft -f` text alike:
// no double quote (it would end nft's string), no control character (a newline would end the line,
// an escape sequence would reach an operator's terminal), at most maxCommentLen bytes of valid UTF-8.
func commentText(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '"':
			return '\''
		case unicode.IsControl(r):
			return ' '
		}
		return r
	}, s)
	if len(s) > maxCommentLen {
		s = strings.ToValidUTF8(s[:maxCommentLen], "")
	}
	return s
}

// ruleUserData returns the userdata that carries comment (nil for none). A comment longer than nft
// allows is cut as render.go cuts it: a comment never fails a sync.
func ruleUserData(comment string) []byte {
	if comment == "" {
		return nil
	}
	comment = commentText(comment)
	ud := make([]byte, 0, 2+len(comment)+1)
	ud = append(ud, udataRuleComment, byte(len(comment)+1))
	ud = append(ud, comment...)
	return append(ud, 0)
}

// userDataComment reads the comment out of a rule's userdata. ok is false when there is none (a rule
// without a comment, or written by a vipgate that did not write comments). Malformed records end the
// walk: nothing past them is trusted.
func userDataComment(ud []byte) (comment string, ok bool) {
	for len(ud) >= 2 {
		typ, n := ud[0], int(ud[1])
		if len(ud) < 2+n {
			return "", false
		}
		if typ == udataRuleComment {
			v := ud[2 : 2+n]
			if i := bytes.IndexByte(v, 0); i >= 0 {
				v = v[:i]
			}
			// Another process may have written this table: what it wrote is printed by explain and
			// the tracer, so control characters (terminal escapes) do not pass.
			return commentText(string(v)), true
		}
		ud = ud[2+n:]
	}
	return "", false
}

func (e *encoder) nftChain(c *Chain) *nftables.Chain {
	ch := e.chain(c.Name)
	if c.IsBase() {
		var hook *nftables.ChainHook
		switch c.Hook {
		case HookPrerouting:
			hook = nftables.ChainHookPrerouting
		case HookInput:
			hook = nftables.ChainHookInput
		case HookForward:
			hook = nftables.ChainHookForward
		case HookOutput:
			hook = nftables.ChainHookOutput
		case HookPostrouting:
			hook = nftables.ChainHookPostrouting
		case HookIngress:
			hook = nftables.ChainHookIngress
			if len(c.Devices) > 0 {
				ch.Device = c.Devices[0]
			}
		}
		ch.Hooknum = hook
		ch.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority))
		if c.Type == NATType {
			ch.Type = nftables.ChainTypeNAT
		} else {
			ch.Type = nftables.ChainTypeFilter
		}
		accept := nftables.ChainPolicyAccept
		ch.Policy = &accept
	}
	return ch
}

func (e *encoder) addrType() nftables.SetDatatype {
	if e.f == cluster.IPv6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

func (e *encoder) nftSet(s *Set) (*nftables.Set, error) {
	ns := &nftables.Set{Table: e.t, Name: s.Name, Comment: s.Comment}
	d := setKindDescs[s.Kind] // kinds.go
	if d == nil {
		return nil, fmt.Errorf("set %s: unknown kind %d", s.Name, s.Kind)
	}
	d.nftSet(e, s, ns)
	return ns, nil
}

// setRef returns the set to reference by name (and ID when it is created in this batch).
func (e *encoder) setRef(name string) (*nftables.Set, error) {
	if s, ok := e.sets[name]; ok {
		return s, nil
	}
	k, ok := e.kinds[name]
	if !ok {
		return nil, fmt.Errorf("unknown set %q", name)
	}
	s, err := e.nftSet(k)
	if err != nil {
		return nil, err
	}
	e.sets[name] = s
	return s, nil
}

// elements writes els, in one pass: a set's elements go in its own run of list messages, in their
// order, each message added to the batch as it fills; the last, partly filled, messages follow in
// the order in which the sets first appear. (The kernel applies the batch as a whole: the order of
// the messages of different sets does not matter.) One pass keeps a full sync from building an index
// of its ~146,000 elements by set, or a slice of them at all (Tx.AddedElements reads the packed parts).
func (e *encoder) elements(els iter.Seq[Element], add bool) error {
	type setWriter struct {
		kind *Set
		w    *elementLists
	}
	writers := map[string]*setWriter{}
	var order []*setWriter
	var last *setWriter
	var key, val [64]byte
	for el := range els {
		sw := last
		if sw == nil || sw.w.set.Name != el.Set {
			sw = writers[el.Set]
			if sw == nil {
				k, ok := e.kinds[el.Set]
				if !ok {
					return fmt.Errorf("element for unknown set %q", el.Set)
				}
				s, err := e.setRef(el.Set)
				if err != nil {
					return err
				}
				sw = &setWriter{kind: k, w: &elementLists{b: e.b, set: s, add: add}}
				writers[el.Set] = sw
				order = append(order, sw)
			}
			last = sw
		}
		if err := e.writeElement(sw.w, key[:], val[:], sw.kind, el); err != nil {
			return fmt.Errorf("set %s: %w", el.Set, err)
		}
	}
	for _, sw := range order {
		sw.w.close()
	}
	return nil
}

func addrBytes(a netip.Addr) []byte {
	if a.Is4() {
		b := a.As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

// putAddr, putProto, putPort and putU32 write one concatenation field (padded to 4 bytes) at b and
// return the rest.
func putAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return b[copy(b, v[:]):]
	}
	v := a.As16()
	return b[copy(b, v[:]):]
}

func putProto(b []byte, p uint8) []byte {
	b[0], b[1], b[2], b[3] = p, 0, 0, 0
	return b[4:]
}

func putPort(b []byte, p uint16) []byte {
	b[0], b[1], b[2], b[3] = byte(p>>8), byte(p), 0, 0
	return b[4:]
}

func putU32(b []byte, v uint32) []byte {
	binary.NativeEndian.PutUint32(b, v)
	return b[4:]
}

func hostU32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

// writeElement encodes one model element into w (an interval element becomes a start and an end
// element), using key and val as scratch space.
func (e *encoder) writeElement(w *elementLists, key, val []byte, s *Set, el Element) error {
	alen := 4
	if e.f == cluster.IPv6 {
		alen = 16
	}
	d := setKindDescs[s.Kind] // kinds.go
	if d == nil || d.element == nil {
		return fmt.Errorf("unknown set kind %d", s.Kind)
	}
	return d.element(w, key, val, el, alen)
}

// prefixEnd returns the first address after p (the exclusive end of an interval), if there is one.
func prefixEnd(p netip.Prefix) (netip.Addr, bool) {
	p = p.Masked()
	b := addrBytes(p.Addr())
	bits := p.Bits()
	// Set all host bits, then add one.
	for i := bits; i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	for i := len(b) - 1; i >= 0; i-- {
		b[i]++
		if b[i] != 0 {
			a, _ := netip.AddrFromSlice(b)
			return a, true
		}
	}
	return netip.Addr{}, false // the prefix runs to the end of the address space
}

func verdictData(el Element) *expr.Verdict {
	switch el.Verdict {
	case VerdictGoto, VerdictReject:
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: el.Chain}
	case VerdictDrop:
		return &expr.Verdict{Kind: expr.VerdictDrop}
	}
	return &expr.Verdict{Kind: expr.VerdictAccept}
}

// Payload offsets of the IP source and destination addresses.
func (e *encoder) addrOffsets() (saddr, daddr, length uint32) {
	if e.f == cluster.IPv6 {
		return 8, 24, 16
	}
	return 12, 16, 4
}

func (e *encoder) loadSaddr(reg uint32) expr.Any {
	s, _, l := e.addrOffsets()
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: s, Len: l}
}

func (e *encoder) loadDaddr(reg uint32) expr.Any {
	_, d, l := e.addrOffsets()
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: d, Len: l}
}

func (e *encoder) addrRegs() uint32 {
	if e.f == cluster.IPv6 {
		return 4
	}
	return 1
}

func loadL4Proto(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }

func loadDport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func (e *encoder) lookup(set string, sreg uint32, invert bool) (expr.Any, error) {
	s, err := e.setRef(set)
	if err != nil {
		return nil, err
	}
	return &expr.Lookup{SourceRegister: sreg, SetName: s.Name, SetID: s.ID, Invert: invert}, nil
}

func (e *encoder) mapLookup(set string, sreg, dreg uint32) (expr.Any, error) {
	s, err := e.setRef(set)
	if err != nil {
		return nil, err
	}
	return &expr.Lookup{SourceRegister: sreg, DestRegister: dreg, IsDestRegSet: true, SetName: s.Name, SetID: s.ID}, nil
}

// tupleKey loads daddr . l4proto . dport into consecutive 4-byte registers from reg32 and returns the
// next free one.
func (e *encoder) tupleKey() ([]expr.Any, uint32) {
	r := uint32(reg32)
	out := []expr.Any{e.loadDaddr(r)}
	r += e.addrRegs()
	out = append(out, loadL4Proto(r), loadDport(r+1))
	return out, r + 2
}

func (e *encoder) natFamily() uint32 {
	if e.f == cluster.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// dnatFromMap DNATs to the addr . port a map lookup left in reg1 and the registers after it.
func (e *encoder) dnatFromMap() expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: e.natFamily(), RegAddrMin: reg1, RegProtoMin: reg32 + e.addrRegs()}
}

func (e *encoder) rule(r Rule) ([]expr.Any, error) {
	var out []expr.Any
	if e.netdev {
		out = e.protoDependency()
	}
	for _, m := range r.Matches {
		x, err := e.match(m)
		if err != nil {
			return nil, err
		}
		out = append(out, x...)
	}
	x, err := e.action(r.Action)
	if err != nil {
		return nil, err
	}
	return append(out, x...), nil
}

// match encodes match m (its kind's encode, kinds.go).
func (e *encoder) match(m Match) ([]expr.Any, error) {
	d := matchKindDescs[m.Kind]
	if d == nil {
		return nil, fmt.Errorf("unknown match kind %d", m.Kind)
	}
	return d.encode(e, m)
}

// action encodes action a (its kind's encode, kinds.go).
func (e *encoder) action(a Action) ([]expr.Any, error) {
	d := actionKindDescs[a.Kind]
	if d == nil {
		return nil, fmt.Errorf("unknown action kind %d", a.Kind)
	}
	return d.encode(e, a)
}

// ipsDstNAT is IPS_DST_NAT from the kernel's nf_conntrack_common.h: the connection was DNATed.
const ipsDstNAT = 1 << 5

// Programmer applies a transaction to the kernel atomically: all of it or nothing. The netlink edge
// (NetlinkProgrammer) is the real one; tests may record instead.
type Programmer interface {
	Apply(tx *Tx) error
}
