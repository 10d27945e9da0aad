package speaker

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// explainState loads explain's fixture (explain/testdata/speaker): node1-node4 (node4 excluded),
// pool lan announced by L2 from rack a (node1, node2) preferring node2, pool routed by BGP.
func explainState(t *testing.T) *cluster.State {
	t.Helper()
	st, err := cluster.NewFileSource(filepath.Join("..", "explain", "testdata", "speaker"), hclog.NewNullLogger()).Load()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var explainNodes = []string{"node1", "node2", "node3", "node4"}

func l2Of(t *testing.T, in ExplainInput, svc string) *L2Explanation {
	t.Helper()
	ns, name, _ := strings.Cut(svc, "/")
	in.Query = ExplainQuery{Service: cluster.ServiceKey{Namespace: ns, Name: name}}
	e, err := ExplainVIPs(in, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.VIPs) != 1 || e.VIPs[0].L2 == nil {
		t.Fatalf("%s: %+v", svc, e.VIPs)
	}
	return e.VIPs[0].L2
}

func nodeReason(l2 *L2Explanation, n string) string {
	for _, x := range l2.Nodes {
		if x.Node == n {
			return x.Reason
		}
	}
	return ""
}

// TestExplainMembership: a node the membership does not count is no candidate, and says so; the
// preferred node dead, the owner is the other candidate.
func TestExplainMembership(t *testing.T) {
	in := ExplainInput{State: explainState(t), Self: "node1", Speakers: explainNodes,
		Live: map[string]bool{"node1": true, "node3": true, "node4": true}}
	l2 := l2Of(t, in, "demo/web-cluster")
	if l2.Owner != "node1" || !strings.HasPrefix(nodeReason(l2, "node2"), "not a candidate in the membership") {
		t.Errorf("owner %q, node2 %q: want node1, node2 not a candidate", l2.Owner, nodeReason(l2, "node2"))
	}
}

// TestExplainWithdrawn: Self withdrawn from the pool's segment by link-aware ownership says why,
// and the eTP=Local VIP it alone could own has no owner.
func TestExplainWithdrawn(t *testing.T) {
	in := ExplainInput{State: explainState(t), Self: "node1", Speakers: explainNodes,
		Live:        map[string]bool{"node2": true, "node3": true, "node4": true},
		Withdrawals: []Withdrawal{{Segment: L2Segment{Pools: []string{"metallb-system/lan"}}, Reason: "link eth0 down"}}}
	l2 := l2Of(t, in, "demo/web-local")
	if l2.Owner != "" || !strings.Contains(l2.Reason, "no live eligible node with a local endpoint") ||
		nodeReason(l2, "node1") != "withdrawn from the IP's L2 segment (link-aware ownership): link eth0 down" {
		t.Errorf("owner %q reason %q node1 %q", l2.Owner, l2.Reason, nodeReason(l2, "node1"))
	}
}

// TestExplainAgreesWithDecideL2: for every subset of live speakers, the owner explained is the one
// the per-node filters leave as a candidate, and no candidate means no owner: the replayed
// filters are the decider's.
func TestExplainAgreesWithDecideL2(t *testing.T) {
	st := explainState(t)
	for mask := 0; mask < 1<<len(explainNodes); mask++ {
		live := map[string]bool{}
		for i, n := range explainNodes {
			if mask&(1<<i) != 0 {
				live[n] = true
			}
		}
		for _, svc := range []string{"demo/web-local", "demo/web-cluster"} {
			l2 := l2Of(t, ExplainInput{State: st, Self: "node1", Speakers: explainNodes, Live: live}, svc)
			cands, owners := 0, 0
			for _, n := range l2.Nodes {
				if n.Candidate {
					cands++
				}
				if n.Owner {
					owners++
					if !n.Candidate || n.Node != l2.Owner {
						t.Errorf("live %v %s: owner %s is not a candidate: %+v", live, svc, n.Node, n)
					}
				}
			}
			if (cands > 0) != (l2.Owner != "") || owners > 1 {
				t.Errorf("live %v %s: %d candidates, owner %q", live, svc, cands, l2.Owner)
			}
		}
	}
}

// TestExplainVIPUnknown: an IP of no Service is not announced; an unknown Service is an error.
func TestExplainVIPUnknown(t *testing.T) {
	in := ExplainInput{State: explainState(t), Self: "node1", Query: ExplainQuery{VIP: netip.MustParseAddr("198.51.100.202")}}
	e, err := ExplainVIPs(in, false)
	if err != nil || len(e.VIPs) != 1 || e.VIPs[0].NotAnnounced == "" || e.VIPs[0].L2 != nil {
		t.Errorf("%+v %v", e, err)
	}
	in.Query = ExplainQuery{Service: cluster.ServiceKey{Namespace: "demo", Name: "nope"}}
	if _, err := ExplainVIPs(in, false); err == nil {
		t.Error("unknown Service: no error")
	}
}
