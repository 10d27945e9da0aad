package proxy

import (
	"math"
	"net/netip"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// TestExplainNode: Explain's values for the node fixture of the tracer tests (trace_test.go): the
// candidates with their rule, probability and masquerade reason, the reasons of drops, rejects and
// accepts. None of it is read from the trace's prose.
func TestExplainNode(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	type cand struct {
		ep   string
		masq dataplane.MasqReason
	}
	for _, tc := range []struct {
		name, src, dst string
		port           uint16
		fromHost       bool
		outcome        dataplane.Outcome
		cands          []cand
		alg            cluster.LBAlgorithm
		verdicts       []dataplane.VerdictReason
		servicePort    string // of a VerdictSourceRange
		accept         dataplane.AcceptReason
	}{
		{name: "pod to ClusterIP", src: podHere, dst: "10.96.0.10", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.10:8080", dataplane.MasqNone}, {"10.244.2.10:8080", dataplane.MasqNone}}, alg: cluster.LBRandom},
		{name: "hairpin", src: "10.244.1.10", dst: "10.96.0.10", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.10:8080", dataplane.MasqHairpin}, {"10.244.2.10:8080", dataplane.MasqNone}}, alg: cluster.LBRandom},
		{name: "outside to ClusterIP", src: outside, dst: "10.96.0.10", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.10:8080", dataplane.MasqClusterIPFromOutside}, {"10.244.2.10:8080", dataplane.MasqClusterIPFromOutside}}, alg: cluster.LBRandom},
		{name: "LB IP eTP=Cluster", src: outside, dst: "198.51.100.10", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.10:8080", dataplane.MasqExternalCluster}, {"10.244.2.10:8080", dataplane.MasqExternalCluster}}, alg: cluster.LBRandom},
		{name: "LB IP eTP=Local from the host", src: trNodeIP4.String(), dst: "198.51.100.11", port: 80, fromHost: true, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.11:8080", dataplane.MasqLocalFromHost}, {"10.244.2.11:8080", dataplane.MasqLocalFromHost}}, alg: cluster.LBRandom},
		{name: "LB IP eTP=Local from outside", src: outside, dst: "198.51.100.11", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.11:8080", dataplane.MasqNone}}, alg: cluster.LBRandom},
		{name: "session affinity", src: podHere, dst: "10.96.0.19", port: 80, outcome: dataplane.OutcomeDNAT,
			cands: []cand{{"10.244.1.16:8080", dataplane.MasqNone}, {"10.244.2.16:8080", dataplane.MasqNone}, {"10.244.3.16:8080", dataplane.MasqNone}}, alg: cluster.LBRandom},
		{name: "no endpoints", src: podHere, dst: "10.96.0.11", port: 80, outcome: dataplane.OutcomeReject, verdicts: []dataplane.VerdictReason{dataplane.VerdictNoEndpoints}},
		{name: "eTP=Local, no local endpoint", src: outside, dst: "198.51.100.12", port: 80, outcome: dataplane.OutcomeDrop, verdicts: []dataplane.VerdictReason{dataplane.VerdictNoLocalEndpoints}},
		{name: "undefined port of a ClusterIP", src: podHere, dst: "10.96.0.10", port: 81, outcome: dataplane.OutcomeReject, verdicts: []dataplane.VerdictReason{dataplane.VerdictClusterIPNoPort}},
		{name: "unallocated ClusterIP", src: podHere, dst: "10.96.99.99", port: 80, outcome: dataplane.OutcomeDrop, verdicts: []dataplane.VerdictReason{dataplane.VerdictClusterIPUnallocated}},
		{name: "source range denied", src: bad, dst: "198.51.100.13", port: 80, outcome: dataplane.OutcomeDrop,
			verdicts: []dataplane.VerdictReason{dataplane.VerdictSourceRange}, servicePort: "ns1/lb-fw port 80/tcp"},
		{name: "LB IP undefined port", src: outside, dst: "198.51.100.10", port: 81, outcome: dataplane.OutcomeAccept, accept: dataplane.AcceptUndefinedPort},
		{name: "not Service traffic", src: outside, dst: "10.244.2.10", port: 8080, outcome: dataplane.OutcomeAccept, accept: dataplane.AcceptNotServiceTraffic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := dataplane.Explain(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst), Proto: dataplane.ProtoTCP, Port: tc.port, FromHost: tc.fromHost}, ExplainRole)
			res := ex.Result
			if res.Outcome != tc.outcome || len(ex.Candidates) != len(tc.cands) {
				t.Fatalf("outcome %s with %d candidates, want %s with %d\n%s", res.Outcome, len(ex.Candidates), tc.outcome, len(tc.cands), res.Explain())
			}
			sum := 0.0
			for i, c := range ex.Candidates {
				if got := (cand{c.Endpoint.String(), c.MasqReason}); got != tc.cands[i] {
					t.Errorf("candidate %d: %v, want %v\n%s", i, got, tc.cands[i], res.Explain())
				}
				if c.Masquerade != (c.MasqReason != dataplane.MasqNone) || c.Masquerade != (c.MasqRule.Chain != "") {
					t.Errorf("candidate %s: masquerade %v, reason %v, rule %+v", c.Endpoint, c.Masquerade, c.MasqReason, c.MasqRule)
				}
				if c.Rule.Chain == "" || c.Rule.Index < 0 || c.Rule.Text == "" {
					t.Errorf("candidate %s has no DNAT rule: %+v", c.Endpoint, c.Rule)
				}
				if r := f.Chains[c.Rule.Chain]; r == nil || c.Rule.Index >= len(r.Rules) || r.Rules[c.Rule.Index].Action.Kind != c.Rule.Action {
					t.Errorf("candidate %s: rule %+v is not in the table", c.Endpoint, c.Rule)
				}
				if c.Probability <= 0 {
					t.Errorf("candidate %s: probability %v", c.Endpoint, c.Probability)
				}
				sum += c.Probability
			}
			if len(tc.cands) > 0 && math.Abs(sum-1) > 1e-9 {
				t.Errorf("probabilities sum to %v, want 1", sum)
			}
			if ex.Algorithm != tc.alg {
				t.Errorf("algorithm %q, want %q", ex.Algorithm, tc.alg)
			}
			var got []dataplane.VerdictReason
			for _, v := range ex.Verdicts {
				got = append(got, v.Reason)
				if v.Outcome != tc.outcome || v.Rule.Chain == "" {
					t.Errorf("verdict %+v", v)
				}
				if v.ServicePort != tc.servicePort {
					t.Errorf("verdict service port %q, want %q", v.ServicePort, tc.servicePort)
				}
			}
			if len(got) != len(tc.verdicts) || (len(got) > 0 && got[0] != tc.verdicts[0]) {
				t.Errorf("verdicts %v, want %v\n%s", got, tc.verdicts, res.Explain())
			}
			if ex.Accept != tc.accept {
				t.Errorf("accept reason %v, want %v", ex.Accept, tc.accept)
			}
		})
	}
}

// TestExplainSteps: the steps carry their kind and targets as values.
func TestExplainSteps(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	ex := dataplane.Explain(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(outside), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80}, ExplainRole)
	kinds := map[dataplane.StepKind]int{}
	var jumpMasq, done int
	for _, s := range ex.Result.Steps {
		kinds[s.Kind]++
		if s.Kind == dataplane.StepMatch && s.Action == dataplane.ActJump && s.Target == ChainMarkForMasquerade {
			jumpMasq++
		}
		if s.Kind == dataplane.StepDone && s.Endpoint.IsValid() {
			done++
		}
		if (s.Kind == dataplane.StepRouting) != (s.Hook == "routing") || (s.Rule >= 0) != (s.Kind <= dataplane.StepRandomNotTaken) {
			t.Errorf("step %q has kind %d", s, s.Kind)
		}
	}
	for _, k := range []dataplane.StepKind{dataplane.StepNoMatch, dataplane.StepMatch, dataplane.StepBaseChain, dataplane.StepChainEnd, dataplane.StepPolicy, dataplane.StepRouting, dataplane.StepDone} {
		if kinds[k] == 0 {
			t.Errorf("no step of kind %d:\n%s", k, ex.Result.Explain())
		}
	}
	if jumpMasq == 0 || done != len(ex.Candidates) {
		t.Errorf("%d jumps to %s, %d done steps for %d candidates\n%s", jumpMasq, ChainMarkForMasquerade, done, len(ex.Candidates), ex.Result.Explain())
	}
	// Session affinity picks uniformly by `numgen random mod N == 0` rules: each of the three
	// endpoints takes a third.
	aff := dataplane.Explain(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(podHere), Dst: netip.MustParseAddr("10.96.0.19"), Proto: dataplane.ProtoTCP, Port: 80}, ExplainRole)
	taken, notTaken := 0, 0
	for _, s := range aff.Result.Steps {
		taken += boolInt(s.Kind == dataplane.StepRandomTaken)
		notTaken += boolInt(s.Kind == dataplane.StepRandomNotTaken)
	}
	if taken == 0 || notTaken == 0 || len(aff.Candidates) != 3 {
		t.Errorf("%d random choices taken, %d not, %d candidates\n%s", taken, notTaken, len(aff.Candidates), aff.Result.Explain())
	}
	for _, c := range aff.Candidates {
		if math.Abs(c.Probability-1.0/3) > 1e-9 || c.Rule.Action != dataplane.ActAffinityDNAT {
			t.Errorf("candidate %s: probability %v, rule %+v", c.Endpoint, c.Probability, c.Rule)
		}
	}
	for _, c := range ex.Candidates {
		if c.MarkRule.Chain != tablenames.ChainServices {
			t.Errorf("candidate %s marked for masquerade by %+v, want a rule of %s", c.Endpoint, c.MarkRule, tablenames.ChainServices)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
