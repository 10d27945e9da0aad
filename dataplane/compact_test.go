package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipgate/vipgate/cluster"
)

// packRoundTrip packs els and backends and checks that unpacking gives them back exactly, in order.
func packRoundTrip(t *testing.T, what string, els []Element, backends []Backend) {
	t.Helper()
	pp, ok := packElements(els, backends, nil)
	if !ok {
		t.Fatalf("%s: cannot be packed", what)
	}
	var gotEls []Element
	for e := range pp.elements {
		gotEls = append(gotEls, e)
	}
	var gotBackends []Backend
	for b := range pp.backends {
		gotBackends = append(gotBackends, b)
	}
	if !slices.Equal(gotEls, els) {
		for i := range min(len(gotEls), len(els)) {
			if gotEls[i] != els[i] {
				t.Fatalf("%s: element %d:\n got %#v\nwant %#v", what, i, gotEls[i], els[i])
			}
		}
		t.Fatalf("%s: %d elements back, want %d", what, len(gotEls), len(els))
	}
	if !slices.Equal(gotBackends, backends) {
		t.Fatalf("%s: backends:\n got %v\nwant %v", what, gotBackends, backends)
	}
	if pp.numElements() != len(els) || pp.numBackends() != len(backends) {
		t.Fatalf("%s: counts %d/%d, want %d/%d", what, pp.numElements(), pp.numBackends(), len(els), len(backends))
	}
}

// Hand-made elements: every address kind in every place, prefixes of every shape (including the
// invalid ones netip can make), the largest numbers.
func TestPackRoundTripEdges(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	mapped := netip.MustParseAddr("::ffff:192.0.2.1")
	addrs := []netip.Addr{{}, v4, v6, mapped, netip.IPv6Unspecified(), netip.IPv4Unspecified()}
	prefixes := []netip.Prefix{{}, netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("::/0"),
		netip.MustParsePrefix("2001:db8::1/128"), netip.PrefixFrom(v4, 33), netip.PrefixFrom(v6, -1),
		netip.PrefixFrom(v4, 24) /* not masked */, netip.PrefixFrom(mapped, 104)}
	var els []Element
	for i, a := range addrs {
		for j, p := range prefixes {
			els = append(els, Element{Set: fmt.Sprintf("set-%d", i), Addr: a, Addr2: addrs[(i+j)%len(addrs)], Prefix: p,
				Proto: uint8(i * j), Port: uint16(65535 - i), Index: ^uint32(j), Verdict: VerdictKind(j % 4),
				Chain: []string{"", "chain-a", "chain-b"}[j%3], DataAddr: addrs[(i+2*j)%len(addrs)], DataPort: uint16(j)})
		}
	}
	packRoundTrip(t, "mixed", els, []Backend{{Proto: ProtoUDP, Endpoint: netip.AddrPortFrom(v6, 53)},
		{Proto: ProtoTCP, Endpoint: netip.AddrPortFrom(v4, 80)}, {Proto: ProtoSCTP, Endpoint: netip.AddrPortFrom(mapped, 9)}, {}})
	var only4 []Element
	for _, e := range els {
		if addrKind(e.Addr) != addrV6 && addrKind(e.Addr2) != addrV6 && addrKind(e.DataAddr) != addrV6 && addrKind(e.Prefix.Addr()) != addrV6 {
			only4 = append(only4, e)
		}
	}
	packRoundTrip(t, "IPv4 only", only4, []Backend{{Proto: ProtoTCP, Endpoint: netip.AddrPortFrom(v4, 80)}, {}})
	packRoundTrip(t, "nothing", nil, nil)
	// Runs of elements that differ in a field or two, each field in turn, with a change of kind
	// among them; and their packed size: what did not change takes no room.
	var runs []Element
	e := Element{Set: MapEndpoints, Addr: v4, Proto: ProtoTCP, Port: 80, DataAddr: v4, DataPort: 8080}
	for i := range 40 {
		switch i % 8 {
		case 0:
			e.Index = uint32(i) << (i % 32)
		case 1:
			e.DataAddr = addrs[i%len(addrs)]
		case 2:
			e.Addr2 = addrs[(i/8)%len(addrs)]
		case 3:
			e.Prefix = prefixes[i%len(prefixes)]
		case 4:
			e.Chain, e.Verdict = fmt.Sprint("c", i%3), VerdictKind(i%4)
		case 5:
			e.Set, e.Proto = fmt.Sprint("s", i%2), uint8(i)
		case 6:
			e.Port, e.DataPort = uint16(i), uint16(65535-i)
		case 7:
			e.Addr = addrs[(i/8+1)%len(addrs)]
		}
		runs = append(runs, e)
	}
	packRoundTrip(t, "runs", runs, nil)
	endpoints := make([]Element, 10)
	backends := make([]Backend, 10)
	for i := range endpoints {
		a := netip.AddrFrom4([4]byte{10, 244, 2, byte(i)})
		endpoints[i] = Element{Set: MapEndpoints, Addr: v4, Proto: ProtoTCP, Port: 80, Index: uint32(i), DataAddr: a, DataPort: 8080}
		backends[i] = Backend{Proto: ProtoTCP, Endpoint: netip.AddrPortFrom(a, 8080)}
	}
	packRoundTrip(t, "endpoints", endpoints, backends)
	// Addresses that differ in their last byte, their last two, or more, of both families, and
	// an IPv4 address after an IPv6 one with the same last bytes.
	var tails []Element
	var tailBackends []Backend
	for i, s := range []string{"10.244.2.1", "10.244.2.9", "10.244.3.9", "10.245.3.9", "10.244.3.10", "2001:db8::a",
		"2001:db8::b", "2001:db8::1:b", "2001:db9::1:b", "::ffff:10.244.3.10", "10.244.3.10", "0.0.3.10", "::3:a", "::3:a"} {
		a := netip.MustParseAddr(s)
		tails = append(tails, Element{Set: MapEndpoints, Addr: v4, Index: uint32(i), DataAddr: a, DataPort: 80})
		tailBackends = append(tailBackends, Backend{Proto: ProtoTCP, Endpoint: netip.AddrPortFrom(a, 80)})
	}
	packRoundTrip(t, "address tails", tails, tailBackends)
	// The first element: mask (2 bytes), kinds, set, proto, port, data port, address, data
	// address (no index: 0); the others: mask, index and the data address's last byte. The first
	// backend: mask, proto, port, kind, address; the others: mask and the address's last byte. The
	// header: three numbers.
	want := (2 + 1 + 1 + 1 + 2 + 2 + 4 + 4) + 9*(1+1+1) + (1 + 1 + 2 + 1 + 4) + 9*(1+1) + 3
	if pp, _ := packElements(endpoints, backends, nil); len(pp.data) != want || cap(pp.data) != want {
		t.Errorf("a port's endpoints packed in %d bytes (capacity %d), want %d", len(pp.data), cap(pp.data), want)
	}

	// What the packed form cannot hold leaves the part as it was.
	zoned := netip.MustParseAddr("fe80::1%eth0")
	for _, p := range []*Part{
		{Elements: []Element{{Set: "s", Addr: v4}, {Set: "s", DataAddr: zoned}}},
		{Elements: []Element{{Set: "s", Addr: v4}}, Backends: []Backend{{Endpoint: netip.AddrPortFrom(zoned, 1)}}},
		{Elements: func() []Element {
			var out []Element
			for i := range 300 {
				out = append(out, Element{Set: fmt.Sprint("s", i)})
			}
			return out
		}()},
	} {
		want := slices.Clone(p.Elements)
		p.Pack()
		if p.packed != nil || !slices.Equal(p.Elements, want) {
			t.Errorf("a part that cannot be packed was changed: packed=%v", p.packed != nil)
		}
	}
}

// elementRefs counts as a map of Elements does: packed keys for what they can hold, the Element
// for the rest, and no two distinct elements under one key.
func TestElementRefs(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("2001:db8::5")
	mapped, zoned := netip.MustParseAddr("::ffff:10.244.0.5"), netip.MustParseAddr("fe80::5%eth0")
	var els []Element
	for _, set := range []string{SetHairpin, SetClusterIPs} {
		for _, a := range []netip.Addr{{}, v4, v6, mapped, zoned} {
			for _, a2 := range []netip.Addr{{}, v4, mapped} {
				for _, port := range []uint16{0, 80} {
					els = append(els, Element{Set: set, Addr: a, Addr2: a2, Proto: ProtoTCP, Port: port})
				}
			}
		}
		els = append(els, Element{Set: set, Addr: v4, Chain: "c"}, Element{Set: set, Addr: v4, Index: 1},
			Element{Set: set, Addr: v4, DataAddr: v4}, Element{Set: set, Prefix: netip.MustParsePrefix("10.0.0.0/8")},
			Element{Set: set, Addr: v4, Verdict: VerdictDrop}, Element{Set: set, Addr: v4, DataPort: 1})
	}
	r, want := newElementRefs(0), map[Element]int{}
	for round := range 3 {
		for i, e := range els {
			delta := 1 + (i+round)%3
			if round == 2 {
				delta = -want[e]
			}
			n := r.add(e, delta)
			want[e] += delta
			if want[e] <= 0 {
				delete(want, e)
			}
			if n != want[e] && !(n <= 0 && want[e] == 0) {
				t.Fatalf("round %d: %+v: count %d, want %d", round, e, n, want[e])
			}
		}
		if r.Len() != len(want) {
			t.Fatalf("round %d: %d elements counted, want %d", round, r.Len(), len(want))
		}
	}
	if _, ok := r.sharedKeyOf(Element{Set: SetHairpin, Addr: v4, Addr2: v4, Proto: ProtoTCP, Port: 80}); !ok {
		t.Error("a hairpin element is not counted under a packed key")
	}
	// The elements of an IPv4 table take the short key; an IPv4-mapped address the long one.
	r = NewElementRefs(cluster.IPv6, 4)
	r.add(Element{Set: SetHairpin, Addr: v4, Addr2: v4, Proto: ProtoTCP, Port: 80}, 1)
	r.add(Element{Set: SetClusterIPs, Addr: v4}, 1)
	r.add(Element{Set: SetClusterIPs, Addr: mapped}, 1)
	if len(r.packed4) != 2 || len(r.packed) != 1 || len(r.other) != 0 {
		t.Errorf("counted %d under short keys, %d under long ones, %d as elements; want 2, 1, 0", len(r.packed4), len(r.packed), len(r.other))
	}
}

// Parts packed with one interner share their equal name tables (the proxier packs a sync's parts
// with one: proxy's TestNameInterner).
func TestPackSharesNames(t *testing.T) {
	in := NewNameInterner()
	els := func(port uint16) []Element {
		return []Element{{Set: SetClusterIPs, Addr: netip.MustParseAddr("10.96.0.1")},
			{Set: MapServiceIPs, Addr: netip.MustParseAddr("10.96.0.1"), Proto: ProtoTCP, Port: port, Verdict: VerdictGoto, Chain: "svc-x"}}
	}
	var a, b, c Part
	if !a.PackFrom(els(80), nil, in) || !b.PackFrom(els(81), nil, in) || !c.PackFrom(els(80), nil, nil) {
		t.Fatal("not packed")
	}
	if a.packed.names != b.packed.names || a.packed.names == c.packed.names {
		t.Errorf("name tables: shared %v, without an interner shared %v", a.packed.names == b.packed.names, a.packed.names == c.packed.names)
	}
	if !a.Packed() || !slices.Equal(slices.Collect(a.AllElements()), els(80)) {
		t.Errorf("packed %v, elements %v", a.Packed(), slices.Collect(a.AllElements()))
	}
}
