package proxy

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

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
		kinds := map[dataplane.SetKind]bool{}
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
			if !pp.Packed() {
				t.Fatalf("IPv%d %s: not packed", f, key)
			}
			if got := pp.Unpacked(); !slices.Equal(got.Elements, p.Elements) || !slices.Equal(got.Backends, p.Backends) {
				t.Fatalf("IPv%d %s: packed build differs:\n got %v\nwant %v", f, key, got.Elements, p.Elements)
			}
		}
		for _, k := range []dataplane.SetKind{dataplane.KindAddr, dataplane.KindTupleVmap, dataplane.KindProtoPortVmap, dataplane.KindTupleEndpoints, dataplane.KindProtoPortEndpoints, dataplane.KindHairpin} {
			if !kinds[k] {
				t.Errorf("IPv%d: no element of set kind %d in the test state", f, k)
			}
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
			want := &dataplane.Ruleset{Family: f, Table: fs.rs.Table, Base: fs.rs.Base, Shared: fs.rs.Shared,
				Services: map[cluster.ServiceKey]*dataplane.Part{}}
			ni := p.nodeInfo(f)
			ni.Screen = p.screen(st)
			for k, svc := range st.Services {
				if part := BuildService(ni, svc, st.EndpointSlices[k]); len(part.Elements) > 0 || len(part.Chains) > 0 {
					want.Services[k] = part
				}
			}
			for k, part := range fs.rs.Services {
				if !part.Packed() && (len(part.Elements) > 0 || len(part.Backends) > 0) {
					t.Errorf("%s: IPv%d %s kept unpacked", when, f, k)
				}
				if w := want.Services[k]; w == nil || !slices.Equal(slices.Collect(part.AllBackends()), w.Backends) {
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
				if part.Packed() || !slices.Equal(part.Elements, want.Services[k].Elements) {
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

// Parts built in one sync share their equal name tables and Uses; the lists handed out are never
// changed by their users' appends.
func TestNameInterner(t *testing.T) {
	in := dataplane.NewNameInterner()
	a := in.Intern([]string{SetClusterIPs, "", MapEndpoints})
	b := in.Intern([]string{SetClusterIPs, "", MapEndpoints})
	c := in.Intern([]string{SetClusterIPs, MapEndpoints})
	if a != b || a == c || !slices.Equal(*c, []string{SetClusterIPs, MapEndpoints}) {
		t.Errorf("interned %v %v %v", *a, *b, *c)
	}
	if cap(*a) != len(*a) {
		t.Errorf("an interned list has room to grow in place: capacity %d, length %d", cap(*a), len(*a))
	}
	long := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	if l := in.Intern(long); !slices.Equal(*l, long) || &(*l)[0] == &long[0] {
		t.Errorf("a long list is not copied: %v", *l)
	}
	if e := in.Intern(nil); e == nil || len(*e) != 0 {
		t.Error("no names: not an empty list")
	}
	var none *dataplane.NameInterner
	if x, y := none.Intern([]string{"a"}), none.Intern([]string{"a"}); x == y || !slices.Equal(*x, *y) {
		t.Error("a nil interner shares or changes lists")
	}
	// A proxier's parts share them.
	p := NewProxier(hclog.NewNullLogger(), testConfig(), nopProgrammer{})
	if _, err := p.Sync(SyntheticState(50, 3)); err != nil {
		t.Fatal(err)
	}
	// (That packing with one interner shares the name tables is dataplane's TestPackSharesNames;
	// here: the proxier's parts of one sync share their Uses, interned the same way.)
	lists := map[*string]bool{}
	for _, part := range p.fams[cluster.IPv4].rs.Services {
		if !part.Packed() {
			t.Errorf("a part is not packed")
		}
		if len(part.Uses) > 0 {
			lists[&part.Uses[0]] = true
		}
	}
	if len(lists) == 0 || len(lists) > 25 {
		t.Errorf("50 Services' parts use %d Uses lists", len(lists))
	}
}

// packRoundTrip packs els and backends into a part and checks that it gives them back exactly, in
// order (the engine's own round trips of packing are dataplane's TestPackRoundTripEdges).
func packRoundTrip(t *testing.T, what string, els []dataplane.Element, backends []dataplane.Backend) {
	t.Helper()
	var p dataplane.Part
	if !p.PackFrom(els, backends, nil) {
		t.Fatalf("%s: cannot be packed", what)
	}
	gotEls := slices.Collect(p.AllElements())
	gotBackends := slices.Collect(p.AllBackends())
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
	if p.NumElements() != len(els) {
		t.Fatalf("%s: counts %d, want %d", what, p.NumElements(), len(els))
	}
}
