package gateway

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// TestHostileGatewayServiceCost: on a gateway, where maglev is the default, a LoadBalancer Service
// of 200 ports (204,200 elements before) is refused as a whole with the reason; one of 100 ports,
// and the other Services, are programmed.
func TestHostileGatewayServiceCost(t *testing.T) {
	for _, c := range []struct {
		ports, vips int
		refused     bool
	}{{200, 1, true}, {100, 1, false}, {20, 200, true}, {1, 200, true}, {1, 100, false}} {
		t.Run(fmt.Sprintf("%dp-%dvips", c.ports, c.vips), func(t *testing.T) {
			st := gwState()
			svc, eps := hostileService(hostileShape{Name: "big", Ports: c.ports, LBIPs: 1, Endpoints: 2})
			svc.LoadBalancerIPs = nil
			for i := range c.vips {
				svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(55 + i)}))
			}
			st.Services[svc.Key], st.EndpointSlices[svc.Key] = svc, eps
			grs, err := BuildRuleset(Config{}, cluster.IPv4, st, Health{{gwNode1, 32001}: true})
			if err != nil {
				t.Fatal(err)
			}
			var why []string
			for _, r := range grs.Conflicts {
				if r.Object == svc.Key.String() && strings.Contains(r.Reason, "serviceLimits.max") {
					why = append(why, r.Reason)
				}
			}
			if (len(why) > 0) != c.refused {
				t.Errorf("refused %q, want refused %v", why, c.refused)
			}
			elements := 0
			if p := grs.Ruleset.Services[svc.Key]; p != nil {
				elements = len(p.Elements)
			}
			if elements > cluster.DefaultMaxServiceElements || elements*kernelBytesPerElement > maxKernelState {
				t.Errorf("the Service costs %d elements", elements)
			}
			if c.refused && elements != 0 {
				t.Errorf("a refused Service has %d elements", elements)
			}
			if p := grs.Ruleset.Services[cluster.ServiceKey{Namespace: "gw", Name: "web"}]; p == nil || len(p.Entries) == 0 {
				t.Errorf("gw/web is not programmed")
			}
			t.Logf("%d ports x %d VIPs: %d elements (table %d), refused %q", c.ports, c.vips, elements, grs.MaglevSize, why)
		})
	}
}

// TestExplainGateway: on a gateway table the candidates are picked by Maglev slots: Explain says how
// many slots lead to each, the algorithm, the masquerade reason of snat: always, and, with a source
// port, the one slot and backend the flow takes.
func TestExplainGateway(t *testing.T) {
	key := cluster.ServiceKey{Namespace: "gw", Name: "web"}
	svc := &cluster.Service{Key: key, Type: cluster.TypeLoadBalancer, ClusterIPs: trAddrs("10.96.7.1"),
		Ports:           []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: 30080}},
		LoadBalancerIPs: trAddrs("203.0.113.50")}
	slice := &cluster.EndpointSlice{Namespace: "gw", Name: "web-1", Service: key, Family: cluster.IPv4,
		Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}, Endpoints: []cluster.Endpoint{trEp("10.244.1.11", "node1"), trEp("10.244.2.11", "node2")}}
	st := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{key: svc},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: {slice}},
		Nodes: map[string]*cluster.Node{
			"node1": {Name: "node1", Addresses: trAddrs("192.0.2.11")},
			"node2": {Name: "node2", Addresses: trAddrs("192.0.2.12")},
		},
	}
	for _, c := range []struct {
		name string
		cfg  Config
		out  dataplane.Outcome
		masq dataplane.MasqReason
	}{
		{"nodePort snat always", Config{Forwarding: cluster.ForwardNodePort, SNAT: cluster.SNATAlways}, dataplane.OutcomeDNAT, dataplane.MasqGatewaySNAT},
		{"route", Config{Forwarding: cluster.ForwardRoute}, dataplane.OutcomeRoute, dataplane.MasqNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			grs, err := BuildRuleset(cfg, cluster.IPv4, st, ExpectedHealth(cfg, st))
			if err != nil {
				t.Fatal(err)
			}
			f := grs.Ruleset.Flatten()
			src := netip.MustParseAddrPort("198.51.100.10:40001")
			ex := dataplane.Explain(f, dataplane.HostInfo{}, dataplane.Packet{Src: src.Addr(), SrcPort: src.Port(), Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80}, ExplainRole)
			if ex.Result.Outcome != c.out || len(ex.Candidates) != 2 || ex.Algorithm != cluster.LBMaglev {
				t.Fatalf("outcome %s, %d candidates, algorithm %q\n%s", ex.Result.Outcome, len(ex.Candidates), ex.Algorithm, ex.Result.Explain())
			}
			var slots uint32
			for _, ca := range ex.Candidates {
				if ca.MasqReason != c.masq || ca.Rule.Chain == "" || ca.SlotsOf == 0 || ca.Slots == 0 || ca.Probability <= 0 {
					t.Errorf("candidate %+v", ca)
				}
				slots += ca.Slots
			}
			if slots != ex.Candidates[0].SlotsOf {
				t.Errorf("the candidates have %d of %d slots", slots, ex.Candidates[0].SlotsOf)
			}
			m := ex.Maglev
			if m == nil {
				t.Fatalf("no Maglev choice for a flow with a source port")
			}
			if m.Slot != dataplane.GatewaySlot(src, netip.MustParseAddrPort("203.0.113.50:80"), m.Slots) || m.Routed != (c.out == dataplane.OutcomeRoute) {
				t.Errorf("maglev %+v", m)
			}
			found := false
			for _, ca := range ex.Candidates {
				found = found || ca.Endpoint.Addr() == m.Backend.Addr()
			}
			if !found {
				t.Errorf("maglev backend %s is not a candidate", m.Backend)
			}
		})
	}
}

// TestExplainFastPath: a packet arriving on an ingress device of the fast path's netdev table
// (NetdevRuleset) is forwarded by fwd through the nodes' device when it is a VIP port's with
// nodes, and passed on to the family's table otherwise: another device, no VIP, a packet from the
// host. Without a fast path, NetdevRuleset says why.
func TestExplainFastPath(t *testing.T) {
	st := gwState()
	fp := &FastPath{Devices: []string{"s1", "s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "eth1", true, nil }}
	cfg := Config{Forwarding: cluster.ForwardRoute, FastPath: fp}
	grs, err := BuildRuleset(cfg, cluster.IPv4, st, Health{})
	if err != nil {
		t.Fatal(err)
	}
	nrs, why := NetdevRuleset(cfg, cluster.IPv4, st, grs)
	if nrs == nil {
		t.Fatalf("no fast path: %s", why)
	}
	nd := nrs.Flatten()
	if nd.Table != "vipgate-fwd4" || !dataplane.IsNetdev(nd.Family) {
		t.Fatalf("netdev table %s of family %#x", nd.Table, nd.Family)
	}
	vip := netip.MustParseAddr("203.0.113.50")
	for _, c := range []struct {
		name, dev, dst string
		fromHost       bool
		srcPort        uint16
		device         string // the device traced
		taken          bool
	}{
		{name: "VIP on s1", dev: "s1", dst: "203.0.113.50", device: "s1", taken: true},
		{name: "VIP, any device", dst: "203.0.113.50", srcPort: 40001, device: "s0", taken: true},
		{name: "a device without a chain", dev: "eth9", dst: "203.0.113.50"},
		{name: "no VIP", dev: "s0", dst: "203.0.113.99", device: "s0"},
		{name: "from the host", dev: "s0", dst: "203.0.113.50", fromHost: true, device: "s0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ex := dataplane.ExplainFastPath(nd, c.dev, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr(c.dst), Proto: dataplane.ProtoTCP, Port: 80, SrcPort: c.srcPort, FromHost: c.fromHost}, ExplainRole)
			if ex.Taken != c.taken || ex.Device != c.device || !slices.Equal(ex.Devices, []string{"s0", "s1"}) {
				t.Fatalf("taken %v device %q devices %v, want %v %q [s0 s1]\n%s", ex.Taken, ex.Device, ex.Devices, c.taken, c.device, ex.Result.Explain())
			}
			if !c.taken {
				if ex.Result.Outcome != dataplane.OutcomeAccept || ex.NodeDevice != "" {
					t.Errorf("not taken: outcome %s, node device %q; want ACCEPT (on to the IP stack)", ex.Result.Outcome, ex.NodeDevice)
				}
				return
			}
			if ex.Result.Outcome != dataplane.OutcomeRoute || ex.NodeDevice != "eth1" || len(ex.Candidates) != 2 || ex.Algorithm != cluster.LBMaglev {
				t.Errorf("outcome %s, node device %q, %d candidates, algorithm %q; want ROUTE by eth1 to 2 nodes by Maglev\n%s",
					ex.Result.Outcome, ex.NodeDevice, len(ex.Candidates), ex.Algorithm, ex.Result.Explain())
			}
			for _, s := range ex.Result.Steps {
				if s.Chain != "" && strings.HasPrefix(s.Chain, PrefixGatewayIngress) && s.Chain != PrefixGatewayIngress+c.device {
					t.Errorf("the trace passes the chain of another device: %s", s)
				}
			}
			if c.srcPort != 0 {
				// The flow's slot, as the family's table would pick it (the same maps).
				fam := dataplane.Explain(grs.Ruleset.Flatten(), dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: vip, Proto: dataplane.ProtoTCP, Port: 80, SrcPort: c.srcPort}, ExplainRole)
				if ex.Maglev == nil || fam.Maglev == nil || *ex.Maglev != *fam.Maglev || !ex.Maglev.Routed {
					t.Errorf("the fast path's slot %+v, the family table's %+v: want the same, routed", ex.Maglev, fam.Maglev)
				}
			}
		})
	}

	for _, c := range []struct {
		name string
		cfg  Config
		why  string
	}{
		{"off", Config{Forwarding: cluster.ForwardRoute}, "off"},
		{"nodePort", Config{Forwarding: cluster.ForwardNodePort, FastPath: fp}, "off"},
		{"not on-link", Config{Forwarding: cluster.ForwardRoute, FastPath: &FastPath{Devices: []string{"s0"},
			NodeDevice: func(netip.Addr) (string, bool, error) { return "eth1", false, nil }}}, "not on a directly connected subnet"},
	} {
		if nrs, why := NetdevRuleset(c.cfg, cluster.IPv4, st, grs); nrs != nil || !strings.Contains(why, c.why) {
			t.Errorf("%s: table %v, why %q; want none, why %q", c.name, nrs != nil, why, c.why)
		}
	}
}

// TestGatewaySourceHashDecodeRoundTrip: gateway tables with maglev and source-hash VIPs, both
// families, through the kernel and back.
func TestGatewaySourceHashDecodeRoundTrip(t *testing.T) {
	for _, fwd := range []cluster.Forwarding{cluster.ForwardNodePort, cluster.ForwardRoute} {
		t.Run(string(fwd), func(t *testing.T) {
			_, fd := testNetns(t)
			prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
			cfg := Config{Forwarding: fwd}
			health := Health{{gwNode1, 32001}: true, {netip.MustParseAddr("2001:db8:1::11"), 32002}: true}
			st := gwDualState()
			rep, err := NewProxier(hclog.NewNullLogger(), cfg, prog).Sync(st, health)
			if err != nil {
				t.Fatal(err)
			}
			if !slicesContainsReason(rep.Conflicts, "round-robin is not done by gateways") {
				t.Errorf("conflicts %v: want the round-robin refusal", rep.Conflicts)
			}
			for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildRuleset(cfg, f, st, health)
				if err != nil {
					t.Fatal(err)
				}
				got, err := prog.ReadTable(f, "vipgate")
				if err != nil {
					t.Fatalf("IPv%d: reading the table back: %v", f, err)
				}
				if ok, diff := dataplane.FlatEqual(grs.Ruleset.Flatten(), got); !ok {
					t.Errorf("IPv%d: the kernel's table decodes to something else: %s", f, diff)
				}
			}
		})
	}
}

// A bad annotation keeps the default (maglev on a gateway) and says why (the node's half:
// dataplane's TestLBAlgorithmInvalid).
func TestGatewayLBAlgorithmInvalid(t *testing.T) {
	st := gwState()
	for _, v := range st.Services {
		v.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: "fastest"}
	}
	grs, err := BuildRuleset(Config{}, cluster.IPv4, st, Health{{gwNode1, 32001}: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slicesContainsReason(grs.Conflicts, `unknown algorithm "fastest"`) {
		t.Errorf("gateway conflicts %v, want the annotation error", grs.Conflicts)
	}
}

// TestMaglevSizeImbalance measures how evenly new flows spread over N backends with the table size
// derived from N: the slot shares of the Maglev table (read off the tracer, which groups a VIP
// port's slots by backend), and 2,000,000 random flows hashed as the kernel does (GatewaySlot).
func TestMaglevSizeImbalance(t *testing.T) {
	for _, n := range []int{3, 10, 50} {
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			t.Run(fmt.Sprintf("N=%d/IPv%d", n, fam), func(t *testing.T) {
				m := maglev.SizeFor(n)
				if m < 100*n || !maglev.IsPrime(m) {
					t.Fatalf("maglev.SizeFor(%d) = %d: want a prime >= %d", n, m, 100*n)
				}
				// A gateway (route forwarding) with n nodes and one VIP port.
				st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, Nodes: map[string]*cluster.Node{}}
				vip, client := netip.MustParseAddr("203.0.113.80"), netip.MustParseAddr("198.51.100.7")
				if fam == cluster.IPv6 {
					vip, client = netip.MustParseAddr("2001:db8:ff::80"), netip.MustParseAddr("2001:db8:c::7")
				}
				svc := gwService("web", vip.String(), false, 80, 30080, 0)
				st.Services[svc.Key] = svc
				for i := range n {
					a := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
					if fam == cluster.IPv6 {
						a = netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%x", 0x10+i))
					}
					st.Nodes[fmt.Sprintf("node%02d", i)] = &cluster.Node{Name: fmt.Sprintf("node%02d", i), Addresses: []netip.Addr{a}}
				}
				grs, err := BuildRuleset(Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{fam}}, fam, st, nil)
				if err != nil {
					t.Fatal(err)
				}
				if grs.MaglevSize != m {
					t.Fatalf("table size %d, want %d", grs.MaglevSize, m)
				}
				f := grs.Ruleset.Flatten()
				r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: client, Dst: vip, Proto: dataplane.ProtoTCP, Port: 80})
				if r.Outcome != dataplane.OutcomeRoute || len(r.Candidates) != n {
					t.Fatalf("trace: %s with %d candidates, want ROUTE to %d nodes\n%s", r.Outcome, len(r.Candidates), n, r.Explain())
				}
				slots := map[netip.Addr]int{}
				for _, c := range r.Candidates {
					var k, of int
					if _, err := fmt.Sscanf(c.Why, "jhash slots %d of %d", &k, &of); err != nil || of != m {
						t.Fatalf("candidate %v: %q", c.Endpoint, c.Why)
					}
					slots[c.Endpoint.Addr()] = k
				}
				tableDev := maxDeviation(slots, float64(m)/float64(n))
				// Flows: random client addresses and ports through the kernel's hash and the table.
				table := map[uint32]netip.Addr{}
				for _, e := range f.Elements[MapGatewayRoutes] {
					table[e.Index] = e.DataAddr
				}
				rng := rand.New(rand.NewPCG(uint64(n), uint64(fam)))
				const flows = 2_000_000
				hits := map[netip.Addr]int{}
				for range flows {
					var src netip.Addr
					if fam == cluster.IPv4 {
						src = netip.AddrFrom4([4]byte{198, 51, byte(rng.IntN(256)), byte(rng.IntN(256))})
					} else {
						b := vip.As16()
						b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
						for i := 8; i < 16; i++ {
							b[i] = byte(rng.IntN(256))
						}
						src = netip.AddrFrom16(b)
					}
					flow := netip.AddrPortFrom(src, uint16(32768+rng.IntN(28232)))
					hits[table[dataplane.GatewaySlot(flow, netip.AddrPortFrom(vip, 80), uint32(m))]]++
				}
				flowDev := maxDeviation(hits, float64(flows)/float64(n))
				t.Logf("N=%d IPv%d: M=%d slots (%d elements per VIP port); slot shares within %.2f%% of even; %d new flows within %.2f%% of even",
					n, fam, m, m, 100*tableDev, flows, 100*flowDev)
				if tableDev > 0.02 || flowDev > 0.02 {
					t.Errorf("imbalance above 2%%: table %.2f%%, flows %.2f%%", 100*tableDev, 100*flowDev)
				}
			})
		}
	}
}

// gwDualState is gwState with IPv6 node addresses, an IPv6 VIP and Services of every gateway
// algorithm: web keeps the default (maglev), sh asks for source-hash, rr for round-robin (refused on
// gateways: maglev).
func gwDualState() *cluster.State {
	st := gwState()
	st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
	st.Nodes["node2"].Addresses = append(st.Nodes["node2"].Addresses, netip.MustParseAddr("2001:db8:1::12"))
	add := func(svc *cluster.Service, alg cluster.LBAlgorithm, eps ...cluster.Endpoint) {
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: string(alg)}
		st.Services[svc.Key] = svc
		sl := gwSlice(svc, eps...)
		if len(eps) > 0 && eps[0].Addresses[0].Is6() {
			sl.Family = cluster.IPv6
		}
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{sl}
	}
	add(gwService("sh", "203.0.113.60", false, 443, 30443, 0), cluster.LBSourceHash, gwEp("10.244.1.11", "node1"), gwEp("10.244.2.11", "node2"))
	add(gwService("rr", "203.0.113.61", false, 8080, 30808, 0), cluster.LBRoundRobin, gwEp("10.244.1.11", "node1"))
	web6 := gwService("web6", "2001:db8:ff::50", false, 80, 30090, 0)
	web6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::50")}
	add(web6, "", gwEp("2001:db8:244:1::11", "node1"), gwEp("2001:db8:244:2::11", "node2"))
	sh6 := gwService("sh6", "2001:db8:ff::51", false, 443, 30091, 0)
	sh6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::51")}
	add(sh6, cluster.LBSourceHash, gwEp("2001:db8:244:1::12", "node1"))
	loc6 := gwService("loc6", "2001:db8:ff::52", true, 80, 30092, 32002)
	loc6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::52")}
	add(loc6, "", gwEp("2001:db8:244:1::13", "node1"))
	return st
}

func TestRenderNftAcceptsGateway(t *testing.T) {
	nftCheckOrSkip(t)
	health := Health{{gwNode1, 32001}: true, {netip.MustParseAddr("2001:db8:1::11"), 32002}: true}
	for _, fwd := range []cluster.Forwarding{cluster.ForwardNodePort, cluster.ForwardDirect, cluster.ForwardRoute} {
		for _, snat := range []cluster.SNATMode{cluster.SNATAuto, cluster.SNATAlways, cluster.SNATNever} {
			if fwd == cluster.ForwardRoute && snat == cluster.SNATAlways {
				continue // a configuration error: route forwarding does not NAT
			}
			for _, size := range []int{0, 251} {
				name := fmt.Sprintf("gateway/%s/snat=%s/maglevTableSize=%d", fwd, snat, size)
				t.Run(name, func(t *testing.T) {
					cfg := Config{Forwarding: fwd, SNAT: snat, MaglevSize: size}
					var both strings.Builder
					for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
						grs, err := BuildRuleset(cfg, fam, gwDualState(), health)
						if err != nil {
							t.Fatal(err)
						}
						f := grs.Ruleset.Flatten()
						text := dataplane.RenderString(f)
						if !strings.Contains(text, "jhash "+map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]+" saddr mod") {
							t.Errorf("IPv%d table has no source-hash rule:\n%s", fam, text)
						}
						nftCheck(t, name+"/"+rdFamilyName(fam), text)
						both.WriteString(text)
					}
					nftCheck(t, name+"/dual-stack", both.String())
				})
			}
		}
	}
}

// TestRenderNftAcceptsGatewayFastPath checks the route forwarding fast path's netdev tables
// (netdev.go), alone and with the families' tables, as a gateway with FastPath renders them.
// The devices are lo: nft resolves fwd's device name, and lo is all the throwaway namespace has.
func TestRenderNftAcceptsGatewayFastPath(t *testing.T) {
	nftCheckOrSkip(t)
	plan := netdevPlan{ingress: []string{"lo"}, nodeDev: "lo"}
	for _, size := range []int{0, 251} {
		name := fmt.Sprintf("gateway/route/fastPath/maglevTableSize=%d", size)
		t.Run(name, func(t *testing.T) {
			cfg := Config{Forwarding: cluster.ForwardRoute, MaglevSize: size}.withDefaults()
			var all strings.Builder
			for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildRuleset(cfg, fam, gwDualState(), Health{})
				if err != nil {
					t.Fatal(err)
				}
				text := dataplane.RenderString(gatewayNetdevRuleset(cfg, fam, grs, plan).Flatten())
				ip := map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]
				for _, want := range []string{"table netdev " + dataplane.NetdevTableName(cfg.Table, fam), `hook ingress devices = { "lo" }`, "fwd " + ip + " to ", "meta pkttype host " + ip + " daddr . meta l4proto . th dport vmap @service-ips"} {
					if !strings.Contains(text, want) {
						t.Errorf("IPv%d netdev table has no %q:\n%s", fam, want, text)
					}
				}
				if strings.Contains(text, "dup to") {
					t.Errorf("IPv%d netdev table dups:\n%s", fam, text)
				}
				nftCheck(t, name+"/"+rdFamilyName(fam), text)
				all.WriteString(dataplane.RenderString(grs.Ruleset.Flatten()))
				all.WriteString(text)
			}
			nftCheck(t, name+"/dual-stack", all.String())
		})
	}
}

// sessionAffinity ClientIP: the gateways keep a client on one backend by source-hash (Maglev over
// the flow's ports spread a client's connections over nodes whose affinity tables are their own:
// the upstream `[sig-network] LoadBalancers` affinity specs failed through the gateways), whatever
// the lb-algorithm annotation says, with a warning when it asked for something else.
func TestGatewayAffinityIsSourceHash(t *testing.T) {
	for _, c := range []struct {
		ann      string
		affinity bool
		want     cluster.LBAlgorithm
		warn     bool
	}{
		{"", false, cluster.LBMaglev, false},
		{"", true, cluster.LBSourceHash, false},
		{"source-hash", true, cluster.LBSourceHash, false},
		{"maglev", true, cluster.LBSourceHash, true},
		{"round-robin", true, cluster.LBSourceHash, true},
	} {
		svc := &cluster.Service{}
		if c.ann != "" {
			svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: c.ann}
		}
		if c.affinity {
			svc.AffinityTimeout = 3 * time.Hour
		}
		alg, warn := gatewayAlgorithm(Config{}, svc)
		if alg != c.want || (warn != "") != c.warn {
			t.Errorf("annotation %q, affinity %v: %s (warning %q), want %s (warning %v)", c.ann, c.affinity, alg, warn, c.want, c.warn)
		}
	}
}
