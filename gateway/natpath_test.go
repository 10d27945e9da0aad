package gateway

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/gateway/natpath"
	"github.com/vipgate/vipgate/tablenames"
)

// natFake records what the gateway gives the NAT fast path.
type natFake struct {
	ports    [][]natpath.VIPPort
	attached [][]int
	flows    []natpath.Flow // what DeleteFlows looks at
	deleted  []natpath.Flow
}

func (f *natFake) Sync(ports []natpath.VIPPort) error { f.ports = append(f.ports, ports); return nil }
func (f *natFake) Attach(idx []int) error             { f.attached = append(f.attached, idx); return nil }
func (f *natFake) DeleteFlows(stale func(natpath.Flow) bool) (int, error) {
	n := 0
	for _, fl := range f.flows {
		if stale(fl) {
			f.deleted = append(f.deleted, fl)
			n++
		}
	}
	return n, nil
}

func natGateway(fwd cluster.Forwarding, nat *NATPath) *Proxier {
	nat.Interfaces = func() ([]string, error) { return []string{"eth0", "eth1", "wg0"}, nil }
	nat.Index = func(d string) int { return map[string]int{"eth0": 2, "eth1": 3, "wg0": 4}[d] }
	nat.Ethernet = func(d string) bool { return d != "wg0" }
	return NewProxier(hclog.NewNullLogger(), Config{Forwarding: fwd, Families: []cluster.Family{cluster.IPv4}, NATPath: nat}, &gwRecorder{})
}

// The NAT fast path gets every VIP port with backends, each with the Maglev table the family's
// table holds (gateway-backends, slot for slot), and is attached to the up interfaces.
func TestGatewayNATPathPorts(t *testing.T) {
	for _, fwd := range []cluster.Forwarding{cluster.ForwardDirect, cluster.ForwardNodePort} {
		fake := &natFake{}
		p := natGateway(fwd, &NATPath{Path: fake})
		both := Health{{gwNode1, 32001}: true, {gwNode2, 32001}: true}
		st := gwState()
		rep, err := p.Sync(st, both)
		if err != nil {
			t.Fatal(err)
		}
		if len(fake.ports) != 1 || len(fake.attached) != 1 || !slices.Equal(fake.attached[0], []int{2, 3}) || len(rep.NATPathWarnings) > 0 {
			t.Fatalf("%s: synced %d times, attached %v, warnings %v", fwd, len(fake.ports), fake.attached, rep.NATPathWarnings)
		}
		// Slot tables as the family's table holds them.
		f := p.Flatten(cluster.IPv4)
		want := map[natpath.VIPKey][]netip.AddrPort{}
		for _, e := range f.Elements[MapGatewayBackends] {
			k := natpath.VIPKey{VIP: e.Addr, Proto: e.Proto, Port: e.Port}
			for len(want[k]) <= int(e.Index) {
				want[k] = append(want[k], netip.AddrPort{})
			}
			want[k][e.Index] = netip.AddrPortFrom(e.DataAddr, e.DataPort)
		}
		got := fake.ports[0]
		if len(got) != len(want) || len(got) == 0 {
			t.Errorf("%s: %d VIP ports, the table has %d", fwd, len(got), len(want))
		}
		for _, v := range got {
			if !slices.Equal(v.Table, want[v.Key()]) {
				t.Errorf("%s: %s: the NAT fast path's table differs from gateway-backends", fwd, v.Key())
			}
			// snat auto: nodePort forwarding to eTP=Cluster Services (all but loc, .51).
			if v.SNAT != (fwd == cluster.ForwardNodePort && v.VIP != netip.MustParseAddr("203.0.113.51")) {
				t.Errorf("%s: %s SNAT %v", fwd, v.Key(), v.SNAT)
			}
		}
		// An unchanged sync hands over the same tables (the same slices: nothing rebuilt).
		if _, err := p.Sync(st, both); err != nil {
			t.Fatal(err)
		}
		if len(fake.ports) != 2 || &fake.ports[1][0].Table[0] != &fake.ports[0][0].Table[0] {
			t.Errorf("%s: an unchanged Service's tables were rebuilt", fwd)
		}
	}
}

// What the NAT fast path does not take: source-hash VIP ports, masqueraded ones with NoSNAT (the
// SNAT state conntrackd replicates), route forwarding (it has its own fast path).
func TestGatewayNATPathLeavesOut(t *testing.T) {
	st := gwState()
	web := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "web"}]
	sh := *web
	sh.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: string(cluster.LBSourceHash)}
	st.Services[web.Key] = &sh
	fake := &natFake{}
	p := natGateway(cluster.ForwardDirect, &NATPath{Path: fake})
	if _, err := p.Sync(st, nil); err != nil {
		t.Fatal(err)
	}
	for _, v := range fake.ports[0] {
		if v.VIP == web.LoadBalancerIPs[0] {
			t.Errorf("source-hash VIP port %s given to the NAT fast path", v.Key())
		}
	}
	fake = &natFake{}
	p = natGateway(cluster.ForwardNodePort, &NATPath{Path: fake, NoSNAT: true})
	if _, err := p.Sync(gwState(), Health{{gwNode1, 32001}: true}); err != nil {
		t.Fatal(err)
	}
	if len(fake.ports[0]) != 1 || fake.ports[0][0].SNAT || fake.ports[0][0].VIP != netip.MustParseAddr("203.0.113.51") {
		t.Errorf("NoSNAT: got %v, want only the eTP=Local VIP port (not masqueraded)", fake.ports[0])
	}
}

// Stale flows end in the NAT fast path as in conntrack: by VIP port and backend.
func TestGatewayNATPathStaleFlows(t *testing.T) {
	ap := netip.MustParseAddrPort
	fl := func(dst, backend string) natpath.Flow {
		return natpath.Flow{Proto: 17, Src: ap("198.51.100.10:40000"), Dst: ap(dst), NewSrc: ap("198.51.100.10:40000"), NewDst: ap(backend)}
	}
	flows := []natpath.Flow{fl("203.0.113.50:53", "10.244.1.11:53"), fl("203.0.113.50:53", "10.244.2.11:53"), fl("203.0.113.51:53", "10.244.1.11:53")}
	stale := []conntrack.StaleFlow{{Proto: 17, OrigDst: netip.MustParseAddr("203.0.113.50"), OrigDstPort: 53, ReplySrc: netip.MustParseAddr("10.244.1.11"), ReplySrcPort: 53}}
	var got []natpath.Flow
	for _, f := range flows {
		if natFlowStale(f, stale) != natStaleMatcher(stale)(f) {
			t.Errorf("%v: the indexed matcher and the filter disagree", f)
		}
		if natFlowStale(f, stale) {
			got = append(got, f)
		}
	}
	if len(got) != 1 || got[0] != flows[0] {
		t.Errorf("stale: %v", got)
	}
	// A drained node: every flow to it, any VIP port (no original destination given).
	stale = []conntrack.StaleFlow{{Proto: 17, ReplySrc: netip.MustParseAddr("10.244.1.11")}}
	if n := len(slices.DeleteFunc(slices.Clone(flows), func(f natpath.Flow) bool { return !natFlowStale(f, stale) })); n != 2 {
		t.Errorf("drained node: %d stale flows, want 2", n)
	}
	if natFlowStale(natpath.Flow{Proto: 6, Dst: ap("203.0.113.50:53"), NewDst: ap("10.244.1.11:53")}, stale) {
		t.Error("a TCP flow matched a UDP stale flow")
	}
	// The gateway's own filters (a backend and its port) through the indexed matcher.
	match := natStaleMatcher([]conntrack.StaleFlow{{Proto: 17, ReplySrc: netip.MustParseAddr("10.244.2.11"), ReplySrcPort: 53}})
	for i, want := range []bool{false, true, false} {
		if match(flows[i]) != want {
			t.Errorf("indexed matcher, flow %v: %v, want %v", flows[i], !want, want)
		}
	}
}

// The program goes on Ethernet devices only: a tunnel of the interface list is left out quietly, a
// listed one (or one that does not exist) is a warning.
func TestGatewayNATPathDevices(t *testing.T) {
	fake := &natFake{}
	p := natGateway(cluster.ForwardDirect, &NATPath{Path: fake, Devices: []string{"eth1", "wg0", "nope0"}})
	rep, err := p.Sync(gwState(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fake.attached[0], []int{3}) || len(rep.NATPathWarnings) != 2 {
		t.Errorf("attached %v, warnings %q; want eth1 (3) and two warnings (not Ethernet: wg0; missing: nope0)", fake.attached, rep.NATPathWarnings)
	}
}

// The family's table masquerades what the NAT fast path does not take to ports the program never
// uses (issue #27: neither knows the other's ports, so a shared one gives one flow's replies to the
// other); without the program's masquerade (NoSNAT, no NAT fast path) it keeps the whole range.
func TestGatewayNATPathMasqueradePorts(t *testing.T) {
	for _, c := range []struct {
		name       string
		nat        *NATPath
		wantLo, hi uint16
	}{
		{"default 61000-65535", &NATPath{Path: &natFake{}}, 1024, 60999},
		{"40000-49999", &NATPath{Path: &natFake{}, SNATPortMin: 40000, SNATPortMax: 49999}, 1024, 39999},
		{"2000-40000", &NATPath{Path: &natFake{}, SNATPortMin: 2000, SNATPortMax: 40000}, 40001, 65535},
		{"NoSNAT", &NATPath{Path: &natFake{}, NoSNAT: true}, 0, 0},
		{"no NAT fast path", nil, 0, 0},
	} {
		cfg := Config{Forwarding: cluster.ForwardNodePort, Families: []cluster.Family{cluster.IPv4}, NATPath: c.nat}
		var p *Proxier
		if c.nat != nil {
			p = natGateway(cluster.ForwardNodePort, c.nat)
		} else {
			p = NewProxier(hclog.NewNullLogger(), cfg, &gwRecorder{})
		}
		if _, err := p.Sync(gwState(), Health{{gwNode1, 32001}: true}); err != nil {
			t.Fatal(err)
		}
		ch := p.Flatten(cluster.IPv4).Chains[tablenames.ChainMasquerading]
		if ch == nil || len(ch.Rules) != 1 || ch.Rules[0].Action.Kind != dataplane.ActMasqClearMark {
			t.Fatalf("%s: masquerading chain %+v", c.name, ch)
		}
		if a := ch.Rules[0].Action; a.Port != c.wantLo || a.PortMax != c.hi {
			t.Errorf("%s: conntrack masquerades to %d-%d, want %d-%d", c.name, a.Port, a.PortMax, c.wantLo, c.hi)
		}
	}
}
