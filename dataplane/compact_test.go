package dataplane

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

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

// dualStackState is SyntheticState with every Service dual-stack: an IPv6 cluster IP and an IPv6
// EndpointSlice beside the IPv4 ones, so both families' tables have every per-Service kind.
func dualStackState(n, m int) *cluster.State {
	st := SyntheticState(n, m)
	for k, svc := range st.Services {
		var i int
		if _, err := fmt.Sscanf(svc.Key.Name, "svc-%d", &i); err != nil {
			panic(err)
		}
		v6 := func(prefix string, x int) netip.Addr {
			return netip.MustParseAddr(fmt.Sprintf("%s%x:%x", prefix, x>>16, x&0xffff))
		}
		svc.ClusterIPs = append(svc.ClusterIPs, v6("2001:db8:96::", i))
		if i%3 == 0 {
			// A second port, UDP (backends that conntrack cleanup reads), on every third Service.
			sp := cluster.ServicePort{Name: "dns", Protocol: cluster.UDP, Port: 53}
			if svc.Ports[0].NodePort != 0 {
				sp.NodePort = uint16(40000 + i)
			}
			svc.Ports = append(slices.Clone(svc.Ports), sp)
			es := st.EndpointSlices[k][0]
			es.Ports = append(slices.Clone(es.Ports), cluster.EndpointPort{Name: "dns", Protocol: cluster.UDP, Port: 5353})
		}
		for _, a := range svc.LoadBalancerIPs {
			if a.Is4() {
				svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, v6("2001:db8:18::", i))
				break
			}
		}
		es := *st.EndpointSlices[k][0]
		es.Family, es.Name = cluster.IPv6, es.Name+"-v6"
		es.Endpoints = slices.Clone(es.Endpoints)
		for j := range es.Endpoints {
			es.Endpoints[j].Addresses = []netip.Addr{v6("2001:db8:244::", i*m+j)}
		}
		st.EndpointSlices[k] = append(st.EndpointSlices[k], &es)
	}
	return st
}

// Every element and backend a node's table holds, of both families, survives packing unchanged.
func TestPackRoundTripNode(t *testing.T) {
	st := dualStackState(200, 3)
	for _, svc := range st.Services {
		// Source ranges give firewall chains and elements (on half the LoadBalancer Services).
		if svc.Type == cluster.TypeLoadBalancer && svc.Key.Name[len(svc.Key.Name)-2]%2 == 0 {
			svc.LoadBalancerSourceRanges = []netip.Prefix{
				netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:51::/64")}
		}
	}
	cfg := testConfig()
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		base := BuildBase(BaseConfig{Family: f, ClusterCIDRs: cfg.ClusterCIDRs, ServiceCIDRs: cfg.ServiceCIDRs, NodePortIPs: cfg.NodePortIPs})
		packRoundTrip(t, fmt.Sprintf("IPv%d base", f), base.Elements, base.Backends)
		n := NodeInfo{Family: f, NodeName: "node1", NodeIPs: cfg.NodeIPs, PodTrafficKnown: true}
		kinds := map[SetKind]bool{}
		sets := BuildBase(BaseConfig{Family: f}).Sets
		for key, svc := range st.Services {
			p := BuildService(n, svc, st.EndpointSlices[key])
			packRoundTrip(t, fmt.Sprintf("IPv%d %s", f, key), p.Elements, p.Backends)
			for _, e := range p.Elements {
				for _, s := range sets {
					if s.Name == e.Set {
						kinds[s.Kind] = true
					}
				}
			}
			// The packed build is the unpacked one, packed.
			pp := buildService(n, svc, st.EndpointSlices[key], true)
			if pp.packed == nil {
				t.Fatalf("IPv%d %s: not packed", f, key)
			}
			if got := pp.unpacked(); !slices.Equal(got.Elements, p.Elements) || !slices.Equal(got.Backends, p.Backends) {
				t.Fatalf("IPv%d %s: packed build differs:\n got %v\nwant %v", f, key, got.Elements, p.Elements)
			}
		}
		for _, k := range []SetKind{KindAddr, KindTupleVmap, KindProtoPortVmap, KindTupleEndpoints, KindProtoPortEndpoints, KindHairpin} {
			if !kinds[k] {
				t.Errorf("IPv%d: no element of set kind %d in the test state", f, k)
			}
		}
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
		p.pack()
		if p.packed != nil || !slices.Equal(p.Elements, want) {
			t.Errorf("a part that cannot be packed was changed: packed=%v", p.packed != nil)
		}
	}
}

// A proxier that keeps its parts packed shows the same ruleset as the parts BuildService builds,
// before and after incremental changes, and BuildRuleset hands out parts as slices.
func TestProxierPackedRuleset(t *testing.T) {
	st := dualStackState(60, 4)
	cfg := testConfig()
	p := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
	check := func(when string) {
		t.Helper()
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			fs := p.fams[f]
			want := &Ruleset{Family: f, Table: fs.rs.Table, Base: fs.rs.Base, Shared: fs.rs.Shared,
				Services: map[cluster.ServiceKey]*Part{}}
			ni := p.nodeInfo(f)
			ni.Screen = p.screen(st)
			for k, svc := range st.Services {
				if part := BuildService(ni, svc, st.EndpointSlices[k]); len(part.Elements) > 0 || len(part.Chains) > 0 {
					want.Services[k] = part
				}
			}
			for k, part := range fs.rs.Services {
				if part.packed == nil && (len(part.Elements) > 0 || len(part.Backends) > 0) {
					t.Errorf("%s: IPv%d %s kept unpacked", when, f, k)
				}
				if w := want.Services[k]; w == nil || !slices.Equal(slices.Collect(part.allBackends()), w.Backends) {
					t.Errorf("%s: IPv%d %s: backends differ", when, f, k)
				}
			}
			if got := p.Flatten(f); !reflect.DeepEqual(got, want.Flatten()) {
				t.Fatalf("%s: IPv%d: the proxier's ruleset differs from the built one", when, f)
			}
			built, _, err := BuildRuleset(cfg, f, st)
			if err != nil {
				t.Fatal(err)
			}
			for k, part := range built.Services {
				if part.packed != nil || !slices.Equal(part.Elements, want.Services[k].Elements) {
					t.Fatalf("%s: BuildRuleset handed out %s packed or different", when, k)
				}
			}
		}
	}
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	check("full sync")
	// svc-00003 has a UDP port: the endpoints it loses are stale flows, found in the packed
	// backends of its old part.
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00003"}
	short := *st.EndpointSlices[key][0]
	short.Endpoints = short.Endpoints[:2]
	st.EndpointSlices[key] = []*cluster.EndpointSlice{&short, st.EndpointSlices[key][1]}
	rep, err := p.Sync(st)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Full || len(rep.Txs) != 1 || len(rep.Txs[0].DelElements) == 0 {
		t.Fatalf("endpoint removal: %v", rep.Txs)
	}
	var stale []netip.AddrPort
	for _, f := range rep.StaleFlows {
		stale = append(stale, netip.AddrPortFrom(f.ReplySrc, f.ReplySrcPort))
	}
	slices.SortFunc(stale, netip.AddrPort.Compare)
	var want []netip.AddrPort
	full := SyntheticState(4, 4).EndpointSlices[key][0].Endpoints // the same addresses as dualStackState's
	for _, ep := range full[2:] {
		want = append(want, netip.AddrPortFrom(ep.Addresses[0], 5353))
	}
	slices.SortFunc(want, netip.AddrPort.Compare)
	if !slices.Equal(stale, want) {
		t.Errorf("stale flows %v, want %v", stale, want)
	}
	check("endpoint removed")
	delete(st.Services, key)
	delete(st.EndpointSlices, key)
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	check("Service deleted")
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
		if r.len() != len(want) {
			t.Fatalf("round %d: %d elements counted, want %d", round, r.len(), len(want))
		}
	}
	if _, ok := sharedKeyOf(Element{Set: SetHairpin, Addr: v4, Addr2: v4, Proto: ProtoTCP, Port: 80}); !ok {
		t.Error("a hairpin element is not counted under a packed key")
	}
	// The elements of an IPv4 table take the short key; an IPv4-mapped address the long one.
	r = newElementRefsOf(cluster.IPv6, 4)
	r.add(Element{Set: SetHairpin, Addr: v4, Addr2: v4, Proto: ProtoTCP, Port: 80}, 1)
	r.add(Element{Set: SetClusterIPs, Addr: v4}, 1)
	r.add(Element{Set: SetClusterIPs, Addr: mapped}, 1)
	if len(r.packed4) != 2 || len(r.packed) != 1 || len(r.other) != 0 {
		t.Errorf("counted %d under short keys, %d under long ones, %d as elements; want 2, 1, 0", len(r.packed4), len(r.packed), len(r.other))
	}
}

// Parts built in one sync share their equal name tables and Uses; the lists handed out are never
// changed by their users' appends.
func TestNameInterner(t *testing.T) {
	in := newNameInterner()
	a := in.intern([]string{SetClusterIPs, "", MapEndpoints})
	b := in.intern([]string{SetClusterIPs, "", MapEndpoints})
	c := in.intern([]string{SetClusterIPs, MapEndpoints})
	if a != b || a == c || !slices.Equal(*c, []string{SetClusterIPs, MapEndpoints}) {
		t.Errorf("interned %v %v %v", *a, *b, *c)
	}
	if cap(*a) != len(*a) {
		t.Errorf("an interned list has room to grow in place: capacity %d, length %d", cap(*a), len(*a))
	}
	long := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	if l := in.intern(long); !slices.Equal(*l, long) || &(*l)[0] == &long[0] {
		t.Errorf("a long list is not copied: %v", *l)
	}
	if e := in.intern(nil); e == nil || len(*e) != 0 {
		t.Error("no names: not an empty list")
	}
	var none *nameInterner
	if x, y := none.intern([]string{"a"}), none.intern([]string{"a"}); x == y || !slices.Equal(*x, *y) {
		t.Error("a nil interner shares or changes lists")
	}
	// A proxier's parts share them.
	p := NewProxier(hclog.NewNullLogger(), testConfig(), nopProgrammer{})
	if _, err := p.Sync(SyntheticState(50, 3)); err != nil {
		t.Fatal(err)
	}
	tables := map[*[]string]bool{}
	for _, part := range p.fams[cluster.IPv4].rs.Services {
		if part.packed != nil {
			tables[part.packed.names] = true
		}
	}
	if len(tables) == 0 || len(tables) > 25 {
		t.Errorf("50 Services' parts use %d name tables", len(tables))
	}
}
