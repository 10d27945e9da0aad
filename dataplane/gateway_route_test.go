package dataplane

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

func TestGatewayFlowsRoute(t *testing.T) {
	one := Health{{gwNode1, 32001}: true}
	cfg := GatewayConfig{Forwarding: cluster.ForwardRoute}
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
	if targets := GatewayHealthTargets(cfg, gwState()); len(targets) != 2 {
		t.Errorf("health targets %v: want both nodes' healthCheckNodePort of the eTP=Local Service", targets)
	}
	// The same flow, on any gateway: the slot and so the node depend only on the flow.
	grs, err := BuildGatewayRuleset(cfg, cluster.IPv4, gwState(), one)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range grs.Entries {
		if e.SNAT {
			t.Errorf("%s: routed entries never SNAT", e)
		}
	}
}

// Rendered routed gateway tables load with nft -c; programmed over netlink, nft lists the dup rule
// back as vipgate renders it.
func TestGatewayRouteKernel(t *testing.T) {
	cfg := GatewayConfig{Forwarding: cluster.ForwardRoute}
	text := RenderString(gwFlat(t, cfg, gwState(), Health{{gwNode1, 32001}: true}))
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
	p := NewGatewayProxier(hclog.NewNullLogger(), cfg, &NetlinkProgrammer{NetNSFd: fd})
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
