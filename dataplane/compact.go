package dataplane

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"sync"

	"github.com/vipgate/vipgate/cluster"
)

// The proxier keeps every Service's Part between syncs, to diff it against the next one; at 10,000
// Services that is ~146,000 elements and 100,000 backends. As Elements they cost 160 bytes each
// (two strings, three netip.Addr and a netip.Prefix, each Addr 24 bytes with a pointer), a Backend
// 40: together ~28 MiB, the largest thing the proxier held. So the proxier's parts are built packed
// (buildService): one string of bytes per part, no pointers, in which the set and chain names are
// indices into a small table of the part's own (a part uses a handful of names) and an address is
// its 4 or 16 bytes, or nothing when it is not set. The packed form is private to the proxier: what
// it hands out (Flatten, BuildRuleset, the transactions) is Elements again, bit for bit the same
// values. A part the packed form cannot hold exactly (an address with a zone, more than 256 names)
// stays unpacked.
//
// Each element and backend is written as its difference from the one before it (the first from the
// zero value): a mask of the fields that changed, then those fields. A part's elements come in runs
// that differ in a field or two: the ten endpoint elements of a port share their set, cluster IP,
// protocol, port and data port and differ in their index and endpoint address, so each takes 3 to
// 6 bytes (IPv4) where a fixed layout took 22, and a backend 2 to 5 instead of 8: an endpoint
// address that differs from the one before only in its last byte or two (pods of a node's range,
// or of one cluster CIDR) is written as those bytes. The parts are only ever read from the start,
// so the difference costs nothing to undo. With the name tables shared (nameInterner) and the
// header in the bytes, the packed parts of 10,000 Services went from 5.6 to 1.7 MiB.

// packedPart holds a Part's elements and backends in packed form (Part.packed): 32 bytes besides
// the data, one of them per Service.
type packedPart struct {
	// names are the set and chain names the elements use; an element refers to them by index. Parts
	// built in one sync share equal tables (nameInterner): most Services have the same few names.
	names *[]string
	// data holds a header (the numbers of elements and backends, the length of the elements;
	// uvarints), the elements, then the backends, as packElements writes them.
	data []byte
}

// Field masks of a packed element: which fields differ from the element before. The most
// changing ones come first: a mask below 128 is one byte.
const (
	pmIndex     = 1 << iota
	pmDataAddr1 // DataAddr differs from the one before in its last byte only: that byte
	pmDataAddr2 // in its last two bytes only: those
	pmDataAddr
	pmAddr
	pmSet
	pmChain
	pmVerdict
	pmPort
	pmDataPort
	pmProto
	pmKinds // the four addresses' kinds, two bits each (addrKind), one byte
	pmBits  // Prefix.Bits()+1 (0 for an invalid prefix), one byte
	pmAddr2
	pmPrefixAddr
)

// Field masks of a packed backend (one byte).
const (
	bmAddr = 1 << iota // the address, as long as its kind says
	bmProto
	bmPort
	bmKind
	bmAddr1 // the address's last byte (the others are the address before's)
	bmAddr2 // its last two bytes
)

// Address kinds, as packed: two bits each.
const (
	addrNone uint8 = iota
	addrV4
	addrV6
	// addrZoned is an address the packed form cannot hold (an IPv6 address with a zone).
	addrZoned
)

func addrKind(a netip.Addr) uint8 {
	switch {
	case !a.IsValid():
		return addrNone
	case a.Is4():
		return addrV4
	case a.Zone() != "":
		return addrZoned
	}
	return addrV6
}

func appendAddr(b []byte, a netip.Addr) []byte {
	switch addrKind(a) {
	case addrV4:
		v := a.As4()
		return append(b, v[:]...)
	case addrV6:
		v := a.As16()
		return append(b, v[:]...)
	}
	return b
}

// readAddr reads an address of kind k at b[*off:] and moves *off past it.
func readAddr(b []byte, off *int, k uint8) netip.Addr {
	switch k {
	case addrV4:
		*off += 4
		return netip.AddrFrom4([4]byte(b[*off-4 : *off]))
	case addrV6:
		*off += 16
		return netip.AddrFrom16([16]byte(b[*off-16 : *off]))
	}
	return netip.Addr{}
}

// addrTail returns n (1 or 2) when a and prev are addresses of the same kind that differ in their
// last n bytes only, else 0.
func addrTail(prev, a netip.Addr) int {
	switch k := addrKind(a); {
	case k != addrKind(prev):
		return 0
	case k == addrV4:
		x, y := a.As4(), prev.As4()
		switch {
		case x[0] != y[0] || x[1] != y[1]:
			return 0
		case x[2] == y[2]:
			return 1
		}
		return 2
	case k == addrV6:
		x, y := a.As16(), prev.As16()
		switch {
		case [14]byte(x[:14]) != [14]byte(y[:14]):
			return 0
		case x[14] == y[14]:
			return 1
		}
		return 2
	}
	return 0
}

// appendTail appends a's last n bytes (1 or 2).
func appendTail(b []byte, a netip.Addr, n int) []byte {
	var last2 [2]byte
	if a.Is4() {
		x := a.As4()
		last2 = [2]byte(x[2:])
	} else {
		x := a.As16()
		last2 = [2]byte(x[14:])
	}
	if n == 1 {
		return append(b, last2[1])
	}
	return append(b, last2[0], last2[1])
}

// readTail returns prev with its last n bytes (1 or 2) read from b[*off:], and moves *off past
// them. (On the path of every element a full sync adds: no copy, no loop.)
func readTail(b []byte, off *int, prev netip.Addr, n int) netip.Addr {
	o := *off
	*off += n
	if prev.Is4() {
		x := prev.As4()
		if n == 1 {
			x[3] = b[o]
		} else {
			x[2], x[3] = b[o], b[o+1]
		}
		return netip.AddrFrom4(x)
	}
	x := prev.As16()
	if n == 1 {
		x[15] = b[o]
	} else {
		x[14], x[15] = b[o], b[o+1]
	}
	return netip.AddrFrom16(x)
}

// elementKinds returns the kinds of e's addresses, two bits each in packed order (Addr, Addr2,
// Prefix's address, DataAddr).
func elementKinds(e *Element) uint8 {
	return addrKind(e.Addr) | addrKind(e.Addr2)<<2 | addrKind(e.Prefix.Addr())<<4 | addrKind(e.DataAddr)<<6
}

// nameIndex returns the index of s in names, appending it if new; false when the table is full.
func nameIndex(names []string, s string) ([]string, uint8, bool) {
	for i, n := range names {
		if n == s {
			return names, uint8(i), true
		}
	}
	if len(names) > 0xff {
		return names, 0, false
	}
	return append(names, s), uint8(len(names)), true
}

// NameInterner hands out one copy of each short list of names (a packed part's name table, a
// part's Uses) to the parts built in one sync: a full sync builds the same few lists for most
// Services. Lists handed out are shared and never changed (their capacity is their length). A nil
// interner copies every list.
type NameInterner struct {
	m map[nameKey]*[]string
}

type nameKey struct {
	n int
	s [8]string
}

func NewNameInterner() *NameInterner { return &NameInterner{m: map[nameKey]*[]string{}} }

// noNames is the name table of a part that uses none.
var noNames = []string{}

// Intern returns a list equal to names that the caller must not change.
func (in *NameInterner) Intern(names []string) *[]string {
	if len(names) == 0 {
		return &noNames
	}
	if in == nil || len(names) > len(nameKey{}.s) {
		s := make([]string, len(names))
		copy(s, names)
		return &s
	}
	k := nameKey{n: len(names)}
	copy(k.s[:], names)
	if p, ok := in.m[k]; ok {
		return p
	}
	s := make([]string, len(names))
	copy(s, names)
	in.m[k] = &s
	return &s
}

// packScratch holds the bytes of a part while packElements writes them (then copied at their exact
// size).
var packScratch = sync.Pool{New: func() any { s := make([]byte, 0, 1024); return &s }}

// appendElement appends e, packed as its difference from prev.
func appendElement(b []byte, prev, e *Element, names []string) []byte {
	kinds, prevKinds := elementKinds(e), elementKinds(prev)
	bits, prevBits := uint8(e.Prefix.Bits()+1), uint8(prev.Prefix.Bits()+1)
	var mask uint64
	set := func(changed bool, m uint64) {
		if changed {
			mask |= m
		}
	}
	set(e.Index != prev.Index, pmIndex)
	if e.DataAddr != prev.DataAddr {
		switch addrTail(prev.DataAddr, e.DataAddr) {
		case 1:
			mask |= pmDataAddr1
		case 2:
			mask |= pmDataAddr2
		default:
			mask |= pmDataAddr
		}
	}
	set(e.Addr != prev.Addr, pmAddr)
	set(e.Set != prev.Set, pmSet)
	set(e.Chain != prev.Chain, pmChain)
	set(e.Verdict != prev.Verdict, pmVerdict)
	set(e.Port != prev.Port, pmPort)
	set(e.DataPort != prev.DataPort, pmDataPort)
	set(e.Proto != prev.Proto, pmProto)
	set(kinds != prevKinds, pmKinds)
	set(bits != prevBits, pmBits)
	set(e.Addr2 != prev.Addr2, pmAddr2)
	set(e.Prefix.Addr() != prev.Prefix.Addr(), pmPrefixAddr)
	b = binary.AppendUvarint(b, mask)
	if mask&pmKinds != 0 {
		b = append(b, kinds)
	}
	if mask&pmSet != 0 {
		_, i, _ := nameIndex(names, e.Set)
		b = append(b, i)
	}
	if mask&pmChain != 0 {
		_, i, _ := nameIndex(names, e.Chain)
		b = append(b, i)
	}
	if mask&pmProto != 0 {
		b = append(b, e.Proto)
	}
	if mask&pmVerdict != 0 {
		b = append(b, byte(e.Verdict))
	}
	if mask&pmBits != 0 {
		b = append(b, bits)
	}
	if mask&pmPort != 0 {
		b = binary.LittleEndian.AppendUint16(b, e.Port)
	}
	if mask&pmDataPort != 0 {
		b = binary.LittleEndian.AppendUint16(b, e.DataPort)
	}
	if mask&pmIndex != 0 {
		b = binary.AppendUvarint(b, uint64(e.Index))
	}
	if mask&pmAddr != 0 {
		b = appendAddr(b, e.Addr)
	}
	if mask&pmAddr2 != 0 {
		b = appendAddr(b, e.Addr2)
	}
	if mask&pmPrefixAddr != 0 {
		b = appendAddr(b, e.Prefix.Addr())
	}
	switch {
	case mask&pmDataAddr != 0:
		b = appendAddr(b, e.DataAddr)
	case mask&pmDataAddr1 != 0:
		b = appendTail(b, e.DataAddr, 1)
	case mask&pmDataAddr2 != 0:
		b = appendTail(b, e.DataAddr, 2)
	}
	return b
}

// appendBackend appends be, packed as its difference from prev.
func appendBackend(b []byte, prev, be *Backend) []byte {
	a, pa := be.Endpoint.Addr(), prev.Endpoint.Addr()
	var mask byte
	if a != pa {
		switch addrTail(pa, a) {
		case 1:
			mask |= bmAddr1
		case 2:
			mask |= bmAddr2
		default:
			mask |= bmAddr
		}
	}
	if be.Proto != prev.Proto {
		mask |= bmProto
	}
	if be.Endpoint.Port() != prev.Endpoint.Port() {
		mask |= bmPort
	}
	if addrKind(a) != addrKind(pa) {
		mask |= bmKind
	}
	b = append(b, mask)
	if mask&bmProto != 0 {
		b = append(b, be.Proto)
	}
	if mask&bmPort != 0 {
		b = binary.LittleEndian.AppendUint16(b, be.Endpoint.Port())
	}
	if mask&bmKind != 0 {
		b = append(b, addrKind(a))
	}
	switch {
	case mask&bmAddr != 0:
		b = appendAddr(b, a)
	case mask&bmAddr1 != 0:
		b = appendTail(b, a, 1)
	case mask&bmAddr2 != 0:
		b = appendTail(b, a, 2)
	}
	return b
}

// packElements returns els and backends in packed form, or false if one of them cannot be packed
// exactly. Its name table comes from in (nil: a copy of its own).
func packElements(els []Element, backends []Backend, in *NameInterner) (*packedPart, bool) {
	// First the names and whether everything can be packed; then the bytes, written in scratch
	// space and kept in one allocation of their exact size.
	var namesBuf [16]string // a part uses a handful: kept at their exact number
	names := namesBuf[:0]
	for i := range els {
		e := &els[i]
		var ok1, ok2 bool
		names, _, ok1 = nameIndex(names, e.Set)
		names, _, ok2 = nameIndex(names, e.Chain)
		if kinds := elementKinds(e); !ok1 || !ok2 || kinds&0x55&(kinds>>1) != 0 { // a kind of 3: addrZoned
			return nil, false
		}
	}
	for _, b := range backends {
		if addrKind(b.Endpoint.Addr()) == addrZoned {
			return nil, false
		}
	}
	scratch := packScratch.Get().(*[]byte)
	b := (*scratch)[:0]
	var prev Element
	for i := range els {
		b = appendElement(b, &prev, &els[i], names)
		prev = els[i]
	}
	elemLen := len(b)
	var prevB Backend
	for i := range backends {
		b = appendBackend(b, &prevB, &backends[i])
		prevB = backends[i]
	}
	var head [3 * binary.MaxVarintLen64]byte
	h := binary.AppendUvarint(head[:0], uint64(len(els)))
	h = binary.AppendUvarint(h, uint64(len(backends)))
	h = binary.AppendUvarint(h, uint64(elemLen))
	data := make([]byte, len(h)+len(b))
	copy(data, h)
	copy(data[len(h):], b)
	*scratch = b[:0]
	packScratch.Put(scratch)
	return &packedPart{names: in.Intern(names), data: data}, true
}

// header returns the numbers of elements and backends, the offset of the first element and that
// of the first backend.
func (pp *packedPart) header() (nElements, nBackends, elementsAt, backendsAt int) {
	ne, n1 := binary.Uvarint(pp.data)
	nb, n2 := binary.Uvarint(pp.data[n1:])
	el, n3 := binary.Uvarint(pp.data[n1+n2:])
	at := n1 + n2 + n3
	return int(ne), int(nb), at, at + int(el)
}

// packedReader reads a packed part's elements in order.
type packedReader struct {
	b     []byte
	off   int
	names []string
	e     Element // the element read last
	kinds uint8
	// pa and bits are the prefix's address and its bits+1, as packed.
	pa   netip.Addr
	bits uint8
}

// elementReader returns a reader of pp's elements and their number.
func (pp *packedPart) elementReader() (packedReader, int) {
	n, _, at, _ := pp.header()
	return packedReader{b: pp.data, off: at, names: *pp.names}, n
}

// next reads the next element.
func (r *packedReader) next() Element {
	b := r.b
	mask, n := binary.Uvarint(b[r.off:])
	off := r.off + n
	if mask&pmKinds != 0 {
		r.kinds = b[off]
		off++
	}
	if mask&pmSet != 0 {
		r.e.Set = r.names[b[off]]
		off++
	}
	if mask&pmChain != 0 {
		r.e.Chain = r.names[b[off]]
		off++
	}
	if mask&pmProto != 0 {
		r.e.Proto = b[off]
		off++
	}
	if mask&pmVerdict != 0 {
		r.e.Verdict = VerdictKind(b[off])
		off++
	}
	if mask&pmBits != 0 {
		r.bits = b[off]
		off++
	}
	if mask&pmPort != 0 {
		r.e.Port = binary.LittleEndian.Uint16(b[off:])
		off += 2
	}
	if mask&pmDataPort != 0 {
		r.e.DataPort = binary.LittleEndian.Uint16(b[off:])
		off += 2
	}
	if mask&pmIndex != 0 {
		v, n := binary.Uvarint(b[off:])
		r.e.Index = uint32(v)
		off += n
	}
	if mask&pmAddr != 0 {
		r.e.Addr = readAddr(b, &off, r.kinds&3)
	}
	if mask&pmAddr2 != 0 {
		r.e.Addr2 = readAddr(b, &off, r.kinds>>2&3)
	}
	if mask&pmPrefixAddr != 0 {
		r.pa = readAddr(b, &off, r.kinds>>4&3)
	}
	switch {
	case mask&pmDataAddr != 0:
		r.e.DataAddr = readAddr(b, &off, r.kinds>>6&3)
	case mask&pmDataAddr1 != 0:
		r.e.DataAddr = readTail(b, &off, r.e.DataAddr, 1)
	case mask&pmDataAddr2 != 0:
		r.e.DataAddr = readTail(b, &off, r.e.DataAddr, 2)
	}
	if mask&(pmPrefixAddr|pmBits) != 0 {
		r.e.Prefix = netip.Prefix{}
		if r.pa.IsValid() || r.bits != 0 {
			r.e.Prefix = netip.PrefixFrom(r.pa, int(r.bits)-1)
		}
	}
	r.off = off
	return r.e
}

func (pp *packedPart) numElements() int {
	n, _ := binary.Uvarint(pp.data)
	return int(n)
}

func (pp *packedPart) numBackends() int {
	_, nb, _, _ := pp.header()
	return nb
}

// elements yields the packed elements in order.
func (pp *packedPart) elements(yield func(Element) bool) {
	r, n := pp.elementReader()
	for range n {
		if !yield(r.next()) {
			return
		}
	}
}

// backends yields the packed backends in order.
func (pp *packedPart) backends(yield func(Backend) bool) {
	_, n, _, off := pp.header()
	b := pp.data
	var (
		proto, kind uint8
		port        uint16
		a           netip.Addr
	)
	for range n {
		mask := b[off]
		off++
		if mask&bmProto != 0 {
			proto = b[off]
			off++
		}
		if mask&bmPort != 0 {
			port = binary.LittleEndian.Uint16(b[off:])
			off += 2
		}
		if mask&bmKind != 0 {
			kind = b[off]
			off++
		}
		switch {
		case mask&bmAddr != 0:
			a = readAddr(b, &off, kind)
		case mask&bmAddr1 != 0:
			a = readTail(b, &off, a, 1)
		case mask&bmAddr2 != 0:
			a = readTail(b, &off, a, 2)
		}
		if !yield(Backend{Proto: proto, Endpoint: netip.AddrPortFrom(a, port)}) {
			return
		}
	}
}

// Pack moves the part's elements and backends into packed form, if they can be packed exactly. A
// packed part is read through allElements and allBackends.
func (p *Part) Pack() {
	if p.packed != nil || (len(p.Elements) == 0 && len(p.Backends) == 0) {
		return
	}
	pp, ok := packElements(p.Elements, p.Backends, nil)
	if !ok {
		return
	}
	p.packed, p.Elements, p.Backends = pp, nil, nil
}

// Packed says whether the part holds its elements and backends packed (read them through
// AllElements and AllBackends).
func (p *Part) Packed() bool { return p.packed != nil }

// PackFrom gives p the elements els and backends bs in packed form, if they can be packed exactly
// (with name tables from in; nil: fresh ones), and reports whether it did. Then p keeps neither
// slice (the caller may reuse them) and its Elements and Backends are nil; if not, p is unchanged.
func (p *Part) PackFrom(els []Element, bs []Backend, in *NameInterner) bool {
	pp, ok := packElements(els, bs, in)
	if !ok {
		return false
	}
	p.packed, p.Elements, p.Backends = pp, nil, nil
	return true
}

// Unpacked returns the part with its elements and backends as slices: p itself if it is not
// packed, else a copy.
func (p *Part) Unpacked() *Part {
	if p == nil || p.packed == nil {
		return p
	}
	np := *p
	np.packed = nil
	np.Elements = make([]Element, 0, p.packed.numElements())
	for e := range p.packed.elements {
		np.Elements = append(np.Elements, e)
	}
	if n := p.packed.numBackends(); n > 0 {
		np.Backends = make([]Backend, 0, n)
		for b := range p.packed.backends {
			np.Backends = append(np.Backends, b)
		}
	}
	return &np
}

// AllElements yields the part's elements, packed or not.
func (p *Part) AllElements() iter.Seq[Element] {
	return func(yield func(Element) bool) {
		if p.packed != nil {
			p.packed.elements(yield)
			return
		}
		for _, e := range p.Elements {
			if !yield(e) {
				return
			}
		}
	}
}

// CountElements counts the part's elements, and those of them in the sharable sets
// (DiffOptions.Sharable, as SharableSets).
func (p *Part) CountElements(sharableSets map[string]bool) (all, sharable int) {
	if pp := p.packed; pp != nil {
		r, n := pp.elementReader()
		for range n {
			if e := r.next(); sharableSets[e.Set] {
				sharable++
			}
		}
		return n, sharable
	}
	for i := range p.Elements {
		if sharableSets[p.Elements[i].Set] {
			sharable++
		}
	}
	return len(p.Elements), sharable
}

// NumElements counts the part's elements, packed or not.
func (p *Part) NumElements() int {
	if p.packed != nil {
		return p.packed.numElements()
	}
	return len(p.Elements)
}

// AllBackends yields the part's backends, packed or not.
func (p *Part) AllBackends() iter.Seq[Backend] {
	return func(yield func(Backend) bool) {
		if p.packed != nil {
			p.packed.backends(yield)
			return
		}
		for _, b := range p.Backends {
			if !yield(b) {
				return
			}
		}
	}
}

// ElementRefs counts, for the sets whose elements several parts may hold (DiffOptions.Sharable: the
// node's hairpin and cluster IP sets), how many parts hold each element: one per cluster IP and per local endpoint, ~20,000
// at 10,000 Services. They are counted under a packed key instead of the Element's 160 bytes: 14
// bytes when both addresses are IPv4 (every element of an IPv4 table), else 38; an element no key
// can hold exactly (any field a sharable element does not use set, an address with a zone) is
// counted under the Element itself.
type ElementRefs struct {
	packed4 map[sharedKey4]int32
	packed  map[sharedKey]int32
	other   map[Element]int
	// sets numbers the sets of the packed keys (sharedKey.set), in the order they are met.
	sets map[string]uint8
}

// sharedKey is a sharable element: its set, protocol, port and two addresses (kinds: two bits each,
// addrKind; IPv4 addresses as their IPv4-mapped bytes).
type sharedKey struct {
	set   uint8 // ElementRefs.sets
	proto uint8
	kinds uint8
	port  uint16
	addr  [16]byte
	addr2 [16]byte
}

// sharedKey4 is a sharable element whose addresses are IPv4 or unset.
type sharedKey4 struct {
	set   uint8
	proto uint8
	kinds uint8
	port  uint16
	addr  [4]byte
	addr2 [4]byte
}

// newElementRefs returns an empty count, with room for n elements of an IPv4 table (a full sync
// knows how many).
func newElementRefs(n int) *ElementRefs {
	return NewElementRefs(cluster.IPv4, n)
}

// NewElementRefs returns an empty count with room for n elements of a table of family f.
func NewElementRefs(f cluster.Family, n int) *ElementRefs {
	r := &ElementRefs{other: map[Element]int{}, sets: map[string]uint8{}}
	if f == cluster.IPv4 {
		r.packed4, r.packed = make(map[sharedKey4]int32, n), map[sharedKey]int32{}
	} else {
		r.packed4, r.packed = map[sharedKey4]int32{}, make(map[sharedKey]int32, n)
	}
	return r
}

// sharedKeyOf packs e, numbering its set in r.sets (at most 256 sets are packed; the elements of
// others are counted under the Element).
func (r *ElementRefs) sharedKeyOf(e Element) (sharedKey, bool) {
	if e.Chain != "" || e.Verdict != VerdictNone ||
		e.DataAddr.IsValid() || e.DataPort != 0 || e.Index != 0 || e.Prefix != (netip.Prefix{}) {
		return sharedKey{}, false
	}
	k1, k2 := addrKind(e.Addr), addrKind(e.Addr2)
	if k1 == addrZoned || k2 == addrZoned {
		return sharedKey{}, false
	}
	set, ok := r.sets[e.Set]
	if !ok {
		if len(r.sets) > 255 {
			return sharedKey{}, false
		}
		set = uint8(len(r.sets))
		r.sets[e.Set] = set
	}
	k := sharedKey{set: set, proto: e.Proto, port: e.Port, kinds: k1 | k2<<2}
	if k1 != addrNone {
		k.addr = e.Addr.As16()
	}
	if k2 != addrNone {
		k.addr2 = e.Addr2.As16()
	}
	return k, true
}

// key4 returns k as a sharedKey4, if both its addresses are IPv4 or unset.
func (k sharedKey) key4() (sharedKey4, bool) {
	if k.kinds&0b1010 != 0 { // addrV6 in either place (addrZoned is not in a sharedKey)
		return sharedKey4{}, false
	}
	return sharedKey4{set: k.set, proto: k.proto, kinds: k.kinds, port: k.port,
		addr: [4]byte(k.addr[12:]), addr2: [4]byte(k.addr2[12:])}, true
}

// add adds delta to e's count and returns the new count; an element at 0 is forgotten.
func (r *ElementRefs) add(e Element, delta int) int {
	if k, ok := r.sharedKeyOf(e); ok {
		if k4, ok := k.key4(); ok {
			return addRef(r.packed4, k4, delta)
		}
		return addRef(r.packed, k, delta)
	}
	n := r.other[e] + delta
	if n <= 0 {
		delete(r.other, e)
	} else {
		r.other[e] = n
	}
	return n
}

func addRef[K comparable](m map[K]int32, k K, delta int) int {
	n := int(m[k]) + delta
	if n <= 0 {
		delete(m, k)
	} else {
		m[k] = int32(n)
	}
	return n
}

// Len counts the elements held.
func (r *ElementRefs) Len() int { return len(r.packed4) + len(r.packed) + len(r.other) }
