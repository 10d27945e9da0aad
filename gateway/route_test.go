package gateway

import (
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

func TestGatewayFlowsRoute(t *testing.T) {
	one := Health{{gwNode1, 32001}: true}
	cfg := Config{Forwarding: cluster.ForwardRoute}
	gwRun(t, gwFlat(t, cfg, gwState(), one), []gwFlow{
		{"eTP=Cluster: to every node, unchanged", "203.0.113.50", 80, "ROUTE via 192.0.2.11:80, 192.0.2.12:80"},
		{"eTP=Local: only healthy nodes", "203.0.113.51", 80, "ROUTE via 192.0.2.11:80"},
		{"no NodePort does not matter (the node takes the VIP itself)", "203.0.113.52", 80, "ROUTE via 192.0.2.11:80, 192.0.2.12:80"},
		{"undefined port of a VIP: rejected", "203.0.113.50", 81, "REJECT"},
		{"not a VIP: untouched", "198.51.100.99", 80, "ACCEPT"},
	})
	gwRun(t, gwFlat(t, cfg, gwState(), nil), []gwFlow{
		{"eTP=Local: no probe answered yet", "203.0.113.51", 80, "REJECT"},
	})
	if targets := HealthTargets(cfg, gwState()); len(targets) != 2 {
		t.Errorf("health targets %v: want both nodes' healthCheckNodePort of the eTP=Local Service", targets)
	}
	// The same flow, on any gateway: the slot and so the node depend only on the flow.
	grs, err := BuildRuleset(cfg, cluster.IPv4, gwState(), one)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range grs.Entries {
		if e.SNAT {
			t.Errorf("%s: routed entries never SNAT", e)
		}
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

// A routed Service's trace says each node's share of new flows (its Maglev slots over the table).
func TestGatewayRouteTraceTyped(t *testing.T) {
	cfg := Config{Forwarding: cluster.ForwardRoute}
	f := gwFlat(t, cfg, gwState(), Health{{gwNode1, 32001}: true})
	r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80})
	if r.Outcome != dataplane.OutcomeRoute {
		t.Fatalf("outcome %s:\n%s", r.Outcome, r.Explain())
	}
	wantTypedTrace(t, r, 2)
	for _, c := range r.Candidates {
		if c.Rule.Action != dataplane.ActFlowPick && c.Rule.Action != dataplane.ActDupJhashMap {
			t.Errorf("candidate %s: rule %+v, want the Maglev pick", c.Endpoint, c.Rule)
		}
	}
}

// Rendered routed gateway tables load with nft -c; programmed over netlink, nft lists the dup rule
// back as vipgate renders it.
func TestGatewayRouteKernel(t *testing.T) {
	cfg := Config{Forwarding: cluster.ForwardRoute}
	text := dataplane.RenderString(gwFlat(t, cfg, gwState(), Health{{gwNode1, 32001}: true}))
	rule := "dup to ip daddr . meta l4proto . th dport . jhash ip saddr . th sport . ip daddr . th dport mod 1021 seed 0x76697067 map @gateway-routes drop"
	if !strings.Contains(text, rule) || !strings.Contains(text, "type filter hook prerouting priority -300") {
		t.Fatalf("rendered table lacks the routed shape:\n%s", text)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	path := filepath.Join(t.TempDir(), "gw.nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s", err, out)
	}
	ns, fd := testNetns(t)
	st := gwState()
	v6 := gwService("web6", "2001:db8:ff::50", false, 80, 30090, 0)
	st.Services[v6.Key] = v6
	st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
	p := NewProxier(hclog.NewNullLogger(), cfg, &dataplane.NetlinkProgrammer{NetNSFd: fd})
	if _, err := p.Sync(st, Health{{gwNode1, 32001}: true}); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "vipgate").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	for _, want := range []string{rule, "203.0.113.51 . tcp . 80 : goto gateway-route", "203.0.113.51 . tcp . 80 . 0x00000000 : 192.0.2.11"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nft list lacks %q:\n%s", want, out)
		}
	}
	if _, err := p.Sync(st, Health{{gwNode1, 32001}: true, {gwNode2, 32001}: true}); err != nil {
		t.Fatalf("incremental sync: %v", err)
	}
	out6, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip6", "vipgate").CombinedOutput()
	if err != nil || !strings.Contains(string(out6), "dup to ip6 daddr") {
		t.Errorf("ip6 table: %v\n%s", err, out6)
	}
}
