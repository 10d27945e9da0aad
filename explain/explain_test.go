package explain

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// demo is the example manifest directory the tests render rulesets for.
var demo = filepath.Join("..", "deploy", "examples", "demo")

// loadConfig writes a config file and loads it as `vipgate explain --config` does.
func loadConfig(t *testing.T, text string) any {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTraceRendered traces packets through the rulesets rendered for the demo manifests, a node's
// and a gateway's: the Service, the candidates and their masquerade reasons, the words for a drop,
// the gateway's Maglev slot for a flow with a source port; the JSON leaves the text's own fields
// (Algorithm, SrcPort) out.
func TestTraceRendered(t *testing.T) {
	node := loadConfig(t, `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11", "2001:db8:1::11"]
clusterCIDRs: ["10.244.0.0/16", "2001:db8:244::/48"]
serviceCIDRs: ["10.96.0.0/16", "2001:db8:96::/108"]
`)
	// A route forwarding gateway: Maglev picks the node a flow is routed to.
	gw := loadConfig(t, `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [192.0.2.13, 2001:db8::13]
forwarding: route
nodes:
- {name: node1, addresses: [192.0.2.11, 2001:db8::11]}
- {name: node2, addresses: [192.0.2.12, 2001:db8::12]}
`)
	src := netip.MustParseAddr("198.51.100.7")
	for _, c := range []struct {
		name    string
		cfg     any
		to      string
		srcPort uint16
		outcome dataplane.Outcome
		service string
		why     string // in Why or a candidate's masquerade reason
		maglev  bool
	}{
		{name: "eTP=Cluster VIP", cfg: node, to: "203.0.113.11:80", outcome: dataplane.OutcomeDNAT,
			service: "demo/web-cluster port 80/TCP", why: "externalTrafficPolicy=Cluster"},
		{name: "unallocated ClusterIP", cfg: node, to: "10.96.0.99:80", outcome: dataplane.OutcomeDrop, why: "no Service has it"},
		{name: "gateway flow", cfg: gw, to: "203.0.113.11:80", srcPort: 40001, outcome: dataplane.OutcomeRoute, maglev: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, err := Trace(Options{Config: c.cfg, Manifests: demo, Dst: netip.MustParseAddrPort(c.to), Proto: dataplane.ProtoTCP, Src: src, SrcPort: c.srcPort})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Ruleset != "rendered" || c.outcome != "" && rep.Outcome != string(c.outcome) || c.service != "" && rep.Service != c.service {
				t.Errorf("ruleset %s, outcome %s, service %q; want rendered, %s, %q", rep.Ruleset, rep.Outcome, rep.Service, c.outcome, c.service)
			}
			words := strings.Join(rep.Why, "\n")
			for _, cand := range rep.Candidates {
				words += "\n" + cand.MasqueradeReason
			}
			if !strings.Contains(words, c.why) {
				t.Errorf("no %q in the words:\n%s", c.why, words)
			}
			if (rep.Maglev != nil) != c.maglev || rep.SrcPort != c.srcPort {
				t.Errorf("maglev %+v, source port %d; want maglev %v, %d", rep.Maglev, rep.SrcPort, c.maglev, c.srcPort)
			}
			js, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(js), "lgorithm") || strings.Contains(string(js), "rcPort") {
				t.Errorf("the JSON has the text's own fields: %s", js)
			}
		})
	}
	if _, err := Trace(Options{Manifests: demo, Dst: netip.MustParseAddrPort("10.96.0.10:80"), Proto: dataplane.ProtoTCP, Src: src}); err == nil {
		t.Error("manifests without a config: no error")
	}
}
