package dataplane

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// lbAnnotated is the flow-test fixture with every Service annotated with alg.
func lbAnnotated(alg cluster.LBAlgorithm) []trService { return withAlgorithm(trFixture(), alg) }

// The tracer over each algorithm: round-robin and maglev may lead to every endpoint (the counter and
// the source port are unknown), source-hash to exactly the one the client's address hashes to.
func TestLBAlgorithmTrace(t *testing.T) {
	webIPv4 := "10.244.1.10:8080, 10.244.2.10:8080"
	for _, c := range []struct {
		alg  cluster.LBAlgorithm
		want func(src string) string
	}{
		{cluster.LBRandom, func(string) string { return webIPv4 }},
		{cluster.LBRoundRobin, func(string) string { return webIPv4 }},
		{cluster.LBMaglev, func(string) string { return webIPv4 }},
		{cluster.LBSourceHash, func(src string) string {
			eps := []string{"10.244.1.10:8080", "10.244.2.10:8080"}
			return eps[SourceHashSlot(netip.MustParseAddr(src), 2)]
		}},
	} {
		t.Run(string(c.alg), func(t *testing.T) {
			f := trFlat(t, cluster.IPv4, false, lbAnnotated(c.alg))
			for _, src := range []string{podHere, podAway, "10.244.7.1", "10.244.9.200"} {
				r := Trace(f, trHost, Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.96.0.10"), Proto: ProtoTCP, Port: 80})
				if got := r.String(); got != c.want(src) {
					t.Errorf("%s -> web: got %q, want %q\n%s", src, got, c.want(src), r.Explain())
				}
			}
			// Every entry of every Service traces without error (eTP=Local, NodePorts, source ranges).
			for _, e := range f.Elements[MapServiceIPs] {
				r := Trace(f, trHost, Packet{Src: netip.MustParseAddr(outside), Dst: e.Addr, Proto: e.Proto, Port: e.Port})
				if r.Outcome == OutcomeError {
					t.Errorf("%s -> %s:%d: %s", outside, e.Addr, e.Port, r.Reason)
				}
			}
		})
	}
}

// Round-robin's trace says each endpoint's share: its turn comes for 1 in n of the new connections
// reaching its rule, so the candidates' probabilities sum to 1.
func TestRoundRobinTraceTyped(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, lbAnnotated(cluster.LBRoundRobin))
	r := Trace(f, trHost, Packet{Src: netip.MustParseAddr(podAway), Dst: netip.MustParseAddr("10.96.0.10"), Proto: ProtoTCP, Port: 80})
	wantTypedTrace(t, r, 2)
	for _, c := range r.Candidates {
		if c.Rule.Action != ActDNATRoundRobin || math.Abs(c.Probability-0.5) > 1e-9 {
			t.Errorf("candidate %s: probability %v, rule %+v", c.Endpoint, c.Probability, c.Rule)
		}
	}
}

// Round-robin's cascade: rule i takes every (n-i)-th new connection that reaches it, so n
// connections in a row meet each endpoint once. Simulated over the model's own rules.
func TestRoundRobinCascadeIsExact(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, lbAnnotated(cluster.LBRoundRobin))
	var ch *Chain
	for name, c := range f.Chains {
		if strings.HasPrefix(name, "rr-ns1/web/tcp/80-") {
			ch = c
		}
	}
	if ch == nil || len(ch.Rules) != 2 {
		t.Fatalf("no 2-rule round-robin chain for web: %+v", ch)
	}
	counters := make([]uint32, len(ch.Rules))
	got := map[netip.Addr]int{}
	for conn := 0; conn < 2000; conn++ {
		for i, r := range ch.Rules {
			if r.Action.Value == 0 {
				got[r.Action.Addr]++
				break
			}
			c := counters[i]
			counters[i]++
			if c%r.Action.Value == 0 {
				got[r.Action.Addr]++
				break
			}
		}
	}
	for a, n := range got {
		if n != 1000 {
			t.Errorf("%s got %d of 2000", a, n)
		}
	}
}

// TestLBAlgorithmDecodeRoundTrip programs the fixture with each algorithm into a throwaway namespace,
// reads it back (decode(program(model)) == model, and every entry traces alike through both), and
// wants `nft list` to print the algorithm's rules as render does.
func TestLBAlgorithmDecodeRoundTrip(t *testing.T) {
	for _, alg := range cluster.LBAlgorithms {
		t.Run(string(alg), func(t *testing.T) {
			ns, fd := testNetns(t)
			prog := &NetlinkProgrammer{NetNSFd: fd}
			p := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
			st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
			for _, s := range lbAnnotated(alg) {
				st.Services[s.svc.Key] = s.svc
				st.EndpointSlices[s.svc.Key] = s.slices
			}
			if _, err := p.Sync(st); err != nil {
				t.Fatalf("sync: %v", err)
			}
			dcCheckRoundTrip(t, prog, p)
			for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				ip := map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]
				out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", ip, "vipgate").CombinedOutput()
				if err != nil {
					t.Fatalf("nft list: %v\n%s", err, out)
				}
				want := map[cluster.LBAlgorithm]string{
					cluster.LBRandom:     "numgen random mod 2 map @endpoints",
					cluster.LBRoundRobin: "numgen inc mod 2 0 dnat to", // nft lists the implicit == without it
					cluster.LBSourceHash: "jhash " + ip + " saddr mod 2 seed 0x76697067 map @endpoints",
					cluster.LBMaglev:     "jhash " + flowHashText(ip) + " mod 211 seed 0x76697067 map @endpoints", // 2 endpoints: maglev.NodeSizeFor(2)
				}[alg]
				if !strings.Contains(string(out), want) {
					t.Errorf("IPv%d: nft list lacks %q:\n%s", fam, want, out)
				}
			}
		})
	}
}

// TestGatewaySourceHashDecodeRoundTrip: gateway tables with maglev and source-hash VIPs, both
// families, through the kernel and back.
func TestGatewaySourceHashDecodeRoundTrip(t *testing.T) {
	for _, fwd := range []cluster.Forwarding{cluster.ForwardNodePort, cluster.ForwardRoute} {
		t.Run(string(fwd), func(t *testing.T) {
			_, fd := testNetns(t)
			prog := &NetlinkProgrammer{NetNSFd: fd}
			cfg := GatewayConfig{Forwarding: fwd}
			health := Health{{gwNode1, 32001}: true, {netip.MustParseAddr("2001:db8:1::11"), 32002}: true}
			st := gwDualState()
			rep, err := NewGatewayProxier(hclog.NewNullLogger(), cfg, prog).Sync(st, health)
			if err != nil {
				t.Fatal(err)
			}
			if !slicesContainsReason(rep.Conflicts, "round-robin is not done by gateways") {
				t.Errorf("conflicts %v: want the round-robin refusal", rep.Conflicts)
			}
			for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildGatewayRuleset(cfg, f, st, health)
				if err != nil {
					t.Fatal(err)
				}
				got, err := prog.ReadTable(f, "vipgate")
				if err != nil {
					t.Fatalf("IPv%d: reading the table back: %v", f, err)
				}
				if ok, diff := FlatEqual(grs.Ruleset.Flatten(), got); !ok {
					t.Errorf("IPv%d: the kernel's table decodes to something else: %s", f, diff)
				}
			}
		})
	}
}

func slicesContainsReason(rs []cluster.Rejection, sub string) bool {
	for _, r := range rs {
		if strings.Contains(r.Reason, sub) {
			return true
		}
	}
	return false
}

// A bad annotation keeps the default and says why, on nodes and gateways.
func TestLBAlgorithmInvalid(t *testing.T) {
	s := trFixture()[0]
	svc := *s.svc
	svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: "leastconn"}
	p := BuildService(trNodeInfo(cluster.IPv4), &svc, s.slices)
	if len(p.Refused) != 1 || !strings.Contains(p.Refused[0].Reason, `unknown algorithm "leastconn"`) {
		t.Fatalf("refused %+v, want the annotation error", p.Refused)
	}
	def := BuildService(trNodeInfo(cluster.IPv4), s.svc, s.slices)
	if fmt.Sprint(p.Elements) != fmt.Sprint(def.Elements) || fmt.Sprint(p.Uses) != fmt.Sprint(def.Uses) {
		t.Errorf("a bad annotation changed the Service's rules")
	}
	st := gwState()
	for _, v := range st.Services {
		v.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: "fastest"}
	}
	grs, err := BuildGatewayRuleset(GatewayConfig{}, cluster.IPv4, st, Health{{gwNode1, 32001}: true})
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
				grs, err := BuildGatewayRuleset(GatewayConfig{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{fam}}, fam, st, nil)
				if err != nil {
					t.Fatal(err)
				}
				if grs.MaglevSize != m {
					t.Fatalf("table size %d, want %d", grs.MaglevSize, m)
				}
				f := grs.Ruleset.Flatten()
				r := Trace(f, HostInfo{}, Packet{Src: client, Dst: vip, Proto: ProtoTCP, Port: 80})
				if r.Outcome != OutcomeRoute || len(r.Candidates) != n {
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
					hits[table[GatewaySlot(flow, netip.AddrPortFrom(vip, 80), uint32(m))]]++
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

// maxDeviation is the largest |count/even - 1| over the backends.
func maxDeviation(counts map[netip.Addr]int, even float64) float64 {
	d := 0.0
	for _, c := range counts {
		d = math.Max(d, math.Abs(float64(c)/even-1))
	}
	return d
}
