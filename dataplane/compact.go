package dataplane

import (
	"encoding/binary"
	"iter"
	"net/netip"
)

// The proxier keeps every Service's Part between syncs, to diff it against the next one; at 10,000
// Services that is ~146,000 elements and 100,000 backends. As Elements they cost 160 bytes each
// (two strings, three netip.Addr and a netip.Prefix, each Addr 24 bytes with a pointer), a Backend
// 40: together ~28 MiB, the largest thing the proxier held. So the proxier's parts are built packed
// (buildService): one string of bytes per part, no pointers, in which the set and chain names are
// indices into a small table of the part's own (a part uses a handful of names) and an address is
// its 4 or 16 bytes, or nothing when it is not set. An element of an IPv4 table then takes 18-22
// bytes, a backend 8. The packed form is private to the proxier: what it hands out (Flatten,
// BuildRuleset, the transactions) is Elements again, bit for bit the same values. A part the packed
// form cannot hold exactly (an address with a zone, more than 256 names) stays unpacked.

// packedPart holds a Part's elements and backends in packed form (Part.packed).
type packedPart struct {
	// names are the set and chain names the elements use; an element refers to them by index.
	names []string
	// data holds the elements, then (from backendsAt) the backends, as packElements writes them.
	data                 []byte
	nElements, nBackends int32
	backendsAt           int32
}

// A packed element is a head of elementHeadLen bytes: set and chain (indices into names), proto,
// verdict, kinds, Prefix.Bits()+1 (0 for an invalid prefix), port and data port (16 bits each),
// index (32 bits; numbers little-endian); then its four addresses (Addr, Addr2, Prefix's address, DataAddr),
// each as long as its kind (two bits each in kinds, addrKind) says: 0, 4 or 16 bytes. A packed
// backend is its protocol, its address's kind, its port (16 bits) and the address.
const (
	elementHeadLen = 14
	backendHeadLen = 4
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

// addrLen is the packed length of an address of kind k.
func addrLen(k uint8) int {
	switch k {
	case addrV4:
		return 4
	case addrV6:
		return 16
	}
	return 0
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

// elementAddrs are an element's four addresses in packed order.
func elementAddrs(e *Element) [4]netip.Addr {
	return [4]netip.Addr{e.Addr, e.Addr2, e.Prefix.Addr(), e.DataAddr}
}

// elementKinds returns the kinds of e's addresses (two bits each, in packed order) and e's packed
// length.
func elementKinds(e *Element) (kinds uint8, length int) {
	length = elementHeadLen
	for j, a := range elementAddrs(e) {
		k := addrKind(a)
		kinds |= k << (2 * j)
		length += addrLen(k)
	}
	return kinds, length
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

// packElements returns els and backends in packed form, or false if one of them cannot be packed
// exactly.
func packElements(els []Element, backends []Backend) (*packedPart, bool) {
	// First the size, the names and whether everything can be packed; then the bytes, in one
	// allocation of their exact size.
	var namesBuf [16]string // a part uses a handful: kept at their exact number
	names := namesBuf[:0]
	size := 0
	for i := range els {
		e := &els[i]
		kinds, n := elementKinds(e)
		var ok1, ok2 bool
		names, _, ok1 = nameIndex(names, e.Set)
		names, _, ok2 = nameIndex(names, e.Chain)
		if !ok1 || !ok2 || kinds&0x55&(kinds>>1) != 0 { // a kind of 3: addrZoned
			return nil, false
		}
		size += n
	}
	backendsAt := size
	for _, b := range backends {
		k := addrKind(b.Endpoint.Addr())
		if k == addrZoned {
			return nil, false
		}
		size += backendHeadLen + addrLen(k)
	}
	pp := &packedPart{nElements: int32(len(els)), nBackends: int32(len(backends)), backendsAt: int32(backendsAt)}
	if len(names) > 0 {
		pp.names = make([]string, len(names))
		copy(pp.names, names)
	}
	if size == 0 {
		return pp, true
	}
	b := make([]byte, 0, size)
	for i := range els {
		e := &els[i]
		kinds, _ := elementKinds(e)
		_, set, _ := nameIndex(names, e.Set)
		_, chain, _ := nameIndex(names, e.Chain)
		b = append(b, set, chain, e.Proto, byte(e.Verdict), kinds, uint8(e.Prefix.Bits()+1))
		b = binary.LittleEndian.AppendUint16(b, e.Port)
		b = binary.LittleEndian.AppendUint16(b, e.DataPort)
		b = binary.LittleEndian.AppendUint32(b, e.Index)
		for _, a := range elementAddrs(e) {
			b = appendAddr(b, a)
		}
	}
	for _, be := range backends {
		a := be.Endpoint.Addr()
		b = append(b, be.Proto, addrKind(a))
		b = binary.LittleEndian.AppendUint16(b, be.Endpoint.Port())
		b = appendAddr(b, a)
	}
	pp.data = b
	return pp, true
}

// readElement reads the element at b[off:] and returns it and the offset after it.
func readElement(b []byte, off int, names []string) (Element, int) {
	h := b[off : off+elementHeadLen]
	e := Element{Set: names[h[0]], Chain: names[h[1]], Proto: h[2], Verdict: VerdictKind(h[3]),
		Port: binary.LittleEndian.Uint16(h[6:]), DataPort: binary.LittleEndian.Uint16(h[8:]),
		Index: binary.LittleEndian.Uint32(h[10:])}
	kinds, bits := h[4], h[5]
	off += elementHeadLen
	e.Addr = readAddr(b, &off, kinds&3)
	e.Addr2 = readAddr(b, &off, kinds>>2&3)
	if pa := readAddr(b, &off, kinds>>4&3); pa.IsValid() || bits != 0 {
		e.Prefix = netip.PrefixFrom(pa, int(bits)-1)
	}
	e.DataAddr = readAddr(b, &off, kinds>>6&3)
	return e, off
}

func (pp *packedPart) numElements() int { return int(pp.nElements) }

func (pp *packedPart) numBackends() int { return int(pp.nBackends) }

// elements yields the packed elements in order.
func (pp *packedPart) elements(yield func(Element) bool) {
	off := 0
	for range pp.nElements {
		var e Element
		e, off = readElement(pp.data, off, pp.names)
		if !yield(e) {
			return
		}
	}
}

// backends yields the packed backends in order.
func (pp *packedPart) backends(yield func(Backend) bool) {
	off := int(pp.backendsAt)
	for range pp.nBackends {
		h := pp.data[off : off+backendHeadLen]
		off += backendHeadLen
		a := readAddr(pp.data, &off, h[1])
		if !yield(Backend{Proto: h[0], Endpoint: netip.AddrPortFrom(a, binary.LittleEndian.Uint16(h[2:]))}) {
			return
		}
	}
}

// pack moves the part's elements and backends into packed form, if they can be packed exactly. A
// packed part is read through allElements and allBackends.
func (p *Part) pack() {
	if p.packed != nil || (len(p.Elements) == 0 && len(p.Backends) == 0) {
		return
	}
	pp, ok := packElements(p.Elements, p.Backends)
	if !ok {
		return
	}
	p.packed, p.Elements, p.Backends = pp, nil, nil
}

// unpacked returns the part with its elements and backends as slices: p itself if it is not
// packed, else a copy.
func (p *Part) unpacked() *Part {
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

// allElements yields the part's elements, packed or not.
func (p *Part) allElements() iter.Seq[Element] {
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

// countElements counts the part's elements, and those of them in sharable sets.
func (p *Part) countElements() (all, sharable int) {
	if pp := p.packed; pp != nil {
		off := 0
		for range pp.nElements {
			h := pp.data[off : off+elementHeadLen]
			if sharableSets[pp.names[h[0]]] {
				sharable++
			}
			off += elementHeadLen
			for j := range 4 {
				off += addrLen(h[4] >> (2 * j) & 3)
			}
		}
		return pp.numElements(), sharable
	}
	for i := range p.Elements {
		if sharableSets[p.Elements[i].Set] {
			sharable++
		}
	}
	return len(p.Elements), sharable
}

// numElements counts the part's elements, packed or not.
func (p *Part) numElements() int {
	if p.packed != nil {
		return p.packed.numElements()
	}
	return len(p.Elements)
}

// allBackends yields the part's backends, packed or not.
func (p *Part) allBackends() iter.Seq[Backend] {
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

// elementRefs counts, for the sets whose elements several parts may hold (sharableSets: hairpin,
// cluster IPs), how many parts hold each element: one per cluster IP and per local endpoint, ~20,000
// at 10,000 Services. They are counted under a packed key of 38 bytes instead of the Element's
// 160; an element the key cannot hold exactly (any field a sharable element does not use set, an
// address with a zone) is counted under the Element itself.
type elementRefs struct {
	packed map[sharedKey]int32
	other  map[Element]int
}

// sharedKey is a sharable element: its set, protocol, port and two addresses (kinds: two bits each,
// addrKind; IPv4 addresses as their IPv4-mapped bytes).
type sharedKey struct {
	hairpin bool // SetHairpin; else SetClusterIPs
	proto   uint8
	kinds   uint8
	port    uint16
	addr    [16]byte
	addr2   [16]byte
}

// newElementRefs returns an empty count, with room for n elements (a full sync knows how many).
func newElementRefs(n int) *elementRefs {
	return &elementRefs{packed: make(map[sharedKey]int32, n), other: map[Element]int{}}
}

func sharedKeyOf(e Element) (sharedKey, bool) {
	if (e.Set != SetHairpin && e.Set != SetClusterIPs) || e.Chain != "" || e.Verdict != VerdictNone ||
		e.DataAddr.IsValid() || e.DataPort != 0 || e.Index != 0 || e.Prefix != (netip.Prefix{}) {
		return sharedKey{}, false
	}
	k1, k2 := addrKind(e.Addr), addrKind(e.Addr2)
	if k1 == addrZoned || k2 == addrZoned {
		return sharedKey{}, false
	}
	k := sharedKey{hairpin: e.Set == SetHairpin, proto: e.Proto, port: e.Port, kinds: k1 | k2<<2}
	if k1 != addrNone {
		k.addr = e.Addr.As16()
	}
	if k2 != addrNone {
		k.addr2 = e.Addr2.As16()
	}
	return k, true
}

// add adds delta to e's count and returns the new count; an element at 0 is forgotten.
func (r *elementRefs) add(e Element, delta int) int {
	if k, ok := sharedKeyOf(e); ok {
		n := int(r.packed[k]) + delta
		if n <= 0 {
			delete(r.packed, k)
		} else {
			r.packed[k] = int32(n)
		}
		return n
	}
	n := r.other[e] + delta
	if n <= 0 {
		delete(r.other, e)
	} else {
		r.other[e] = n
	}
	return n
}

// len counts the elements held.
func (r *elementRefs) len() int { return len(r.packed) + len(r.other) }
