package proxy

import (
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
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
			return eps[dataplane.SourceHashSlot(netip.MustParseAddr(src), 2)]
		}},
	} {
		t.Run(string(c.alg), func(t *testing.T) {
			f := trFlat(t, cluster.IPv4, false, lbAnnotated(c.alg))
			for _, src := range []string{podHere, podAway, "10.244.7.1", "10.244.9.200"} {
				r := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80})
				if got := r.String(); got != c.want(src) {
					t.Errorf("%s -> web: got %q, want %q\n%s", src, got, c.want(src), r.Explain())
				}
			}
			// Every entry of every Service traces without error (eTP=Local, NodePorts, source ranges).
			for _, e := range f.Elements[tablenames.MapServiceIPs] {
				r := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(outside), Dst: e.Addr, Proto: e.Proto, Port: e.Port})
				if r.Outcome == dataplane.OutcomeError {
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
	r := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(podAway), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80})
	wantTypedTrace(t, r, 2)
	for _, c := range r.Candidates {
		if c.Rule.Action != dataplane.ActDNATRoundRobin || math.Abs(c.Probability-0.5) > 1e-9 {
			t.Errorf("candidate %s: probability %v, rule %+v", c.Endpoint, c.Probability, c.Rule)
		}
	}
}

// Round-robin's cascade: rule i takes every (n-i)-th new connection that reaches it, so n
// connections in a row meet each endpoint once. Simulated over the model's own rules.
func TestRoundRobinCascadeIsExact(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, lbAnnotated(cluster.LBRoundRobin))
	var ch *dataplane.Chain
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
			prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
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
					cluster.LBMaglev:     "jhash " + map[string]string{"ip": "ip saddr . th sport . ip daddr . th dport", "ip6": "ip6 saddr . th sport"}[ip] + " mod 211 seed 0x76697067 map @endpoints", // 2 endpoints: maglev.NodeSizeFor(2)
				}[alg]
				if !strings.Contains(string(out), want) {
					t.Errorf("IPv%d: nft list lacks %q:\n%s", fam, want, out)
				}
			}
		})
	}
}

// wantTypedTrace checks the typed fields the gateway's and the algorithms' trace hooks record: every
// candidate has its rule and a known probability, the probabilities sum to 1, and every rule step
// says whether its rule matched (no StepRule).
func wantTypedTrace(t *testing.T, r dataplane.Result, n int) {
	t.Helper()
	if len(r.Candidates) != n {
		t.Fatalf("%d candidates, want %d:\n%s", len(r.Candidates), n, r.Explain())
	}
	sum := 0.0
	for _, c := range r.Candidates {
		if c.Probability <= 0 || c.Rule.Chain == "" {
			t.Errorf("candidate %s: probability %v, rule %+v", c.Endpoint, c.Probability, c.Rule)
		}
		sum += c.Probability
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("probabilities sum to %v, want 1:\n%s", sum, r.Explain())
	}
	for _, s := range r.Steps {
		if s.Kind == dataplane.StepRule {
			t.Errorf("step %q has kind StepRule", s)
		}
		if s.Kind == dataplane.StepMatch && strings.Contains(s.Note, "DNAT to") && !s.Endpoint.IsValid() {
			t.Errorf("DNAT step %q has no Endpoint", s)
		}
	}
}

// An unknown lb-algorithm annotation is refused with its reason and changes nothing of the
// Service's rules (the gateway's half: gateway/engine_test.go, TestGatewayLBAlgorithmInvalid).
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
}

// A flow-hash DNAT whose modulus is 0 (render and the encoder refuse one; the tracer may be given
// any model) fails the trace with that reason, found when the tracer spells the rule: the action's
// trace (here dataplane.ActDNATProtoPortJhashMap's, the NodePort's rule) has no check of its own, and
// jhashBranches, with no slot to branch on, would end the branch with no verdict at all.
func TestJhashTraceModulusZero(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, lbAnnotated(cluster.LBMaglev))
	zeroed := 0
	for _, ch := range f.Chains {
		for i, r := range ch.Rules {
			if r.Action.Kind == dataplane.ActDNATProtoPortJhashMap {
				ch.Rules[i].Action.Value = 0
				zeroed++
			}
		}
	}
	if zeroed == 0 {
		t.Fatal("the Maglev fixture has no dataplane.ActDNATProtoPortJhashMap rule")
	}
	r := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(outside), Dst: trNodeIP4, Proto: dataplane.ProtoTCP, Port: 30080})
	if r.Outcome != dataplane.OutcomeError || !strings.Contains(r.Reason, "jhash modulus 0") {
		t.Errorf("outcome %s (%s), want an error for the modulus 0\n%s", r.Outcome, r.Reason, r.Explain())
	}
}
