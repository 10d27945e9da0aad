package main

import (
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

func TestParseDest(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		proto    uint8
		bad      bool
	}{
		{in: "10.96.0.10:80", want: "10.96.0.10:80", proto: dataplane.ProtoTCP},
		{in: "10.96.0.10:53/udp", want: "10.96.0.10:53", proto: dataplane.ProtoUDP},
		{in: "[2001:db8::1]:443/SCTP", want: "[2001:db8::1]:443", proto: dataplane.ProtoSCTP},
		{in: "10.96.0.10", bad: true},
		{in: "10.96.0.10:80/icmp", bad: true},
		{in: "10.96.0.10:0", bad: true},
	} {
		ap, proto, err := parseDest(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseDest(%q) = %v, want an error", tc.in, ap)
			}
			continue
		}
		if err != nil || ap.String() != tc.want || proto != tc.proto {
			t.Errorf("parseDest(%q) = %v %d %v, want %s %d", tc.in, ap, proto, err, tc.want, tc.proto)
		}
	}
}

// TestExplainRendered explains packets through the ruleset rendered from the demo manifests (no
// kernel): outcomes, candidates, masquerade reasons and the words for drops and rejects.
func TestExplainRendered(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11", "2001:db8:1::11"]
clusterCIDRs: ["10.244.0.0/16", "2001:db8:244::/48"]
serviceCIDRs: ["10.96.0.0/16", "2001:db8:96::/108"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	manifests := filepath.Join("..", "..", "deploy", "examples", "demo")
	for _, tc := range []struct {
		name, from, to string
		host           bool
		outcome        string
		summary        string
		service        string
		why            string // substring of a Why line or masquerade reason
	}{
		{name: "eTP=Cluster VIP", from: "198.51.100.7", to: "203.0.113.11:80", outcome: "DNAT",
			summary: "10.244.1.11:8080, 10.244.1.12:8080, 10.244.2.11:8080 masq", service: "demo/web-cluster port 80/TCP", why: "externalTrafficPolicy=Cluster"},
		{name: "eTP=Local VIP keeps the source", from: "198.51.100.7", to: "203.0.113.10:80/udp", outcome: "DNAT",
			summary: "10.244.1.11:8080, 10.244.1.12:8080", service: "demo/web-local port 80/UDP"},
		{name: "eTP=Local VIP from the host", host: true, to: "203.0.113.10:80", outcome: "DNAT",
			summary: "10.244.1.11:8080, 10.244.1.12:8080, 10.244.2.11:8080 masq", why: "from this host"},
		{name: "ClusterIP from outside", from: "198.51.100.7", to: "10.96.0.10:80", outcome: "DNAT", why: "outside the pod network"},
		{name: "hairpin", from: "10.244.1.11", to: "10.96.0.10:80", outcome: "DNAT",
			summary: "10.244.1.11:8080 masq, 10.244.1.12:8080, 10.244.2.11:8080", why: "hairpin"},
		{name: "undefined ClusterIP port", from: "10.244.1.11", to: "10.96.0.10:81", outcome: "REJECT", why: "has no port 81/tcp"},
		{name: "unallocated ClusterIP", from: "10.244.1.11", to: "10.96.0.99:80", outcome: "DROP", why: "no Service has it"},
		{name: "undefined VIP port", from: "198.51.100.7", to: "203.0.113.11:81", outcome: "ACCEPT", why: "no Service port 81/tcp"},
		{name: "not Service traffic", from: "198.51.100.7", to: "10.244.1.11:8080", outcome: "ACCEPT", why: "not Service traffic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := explain(&explainFlags{from: tc.from, to: tc.to, host: tc.host, config: cfg, manifests: manifests})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.writeText(&b)
			text := b.String()
			if rep.Outcome != tc.outcome || (tc.summary != "" && rep.Summary != tc.summary) || (tc.service != "" && rep.Service != tc.service) ||
				rep.Ruleset != "rendered" {
				t.Errorf("got %s %q service %q, want %s %q %q\n%s", rep.Outcome, rep.Summary, rep.Service, tc.outcome, tc.summary, tc.service, text)
			}
			if tc.why != "" && !strings.Contains(text, tc.why) {
				t.Errorf("output lacks %q:\n%s", tc.why, text)
			}
		})
	}
	if _, err := explain(&explainFlags{from: "1.2.3.4", to: "10.96.0.10:80", manifests: manifests}); err == nil {
		t.Errorf("--manifests without --config: no error")
	}
}

// TestExplainGatewayRendered: explain on a rendered gateway table, both DNAT forwarding and route,
// names the Maglev slot and backend the kernel's jhash would pick for a flow with a source port.
func TestExplainGatewayRendered(t *testing.T) {
	manifests := filepath.Join("..", "..", "deploy", "examples", "demo")
	for _, c := range []struct{ fwd, outcome, verb string }{{"nodePort", "DNAT", "DNAT to"}, {"route", "ROUTE", "routed to node"}} {
		t.Run(c.fwd, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "gw.yaml")
			if err := os.WriteFile(cfg, []byte(`apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [192.0.2.13]
forwarding: `+c.fwd+`
nodes:
- {name: node1, addresses: [192.0.2.11]}
- {name: node2, addresses: [192.0.2.12]}
`), 0o644); err != nil {
				t.Fatal(err)
			}
			src, dst := netip.MustParseAddrPort("198.51.100.10:40001"), netip.MustParseAddrPort("203.0.113.20:80")
			rep, err := explain(&explainFlags{from: src.String(), to: dst.String(), config: cfg, manifests: manifests})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.writeText(&b)
			if rep.Outcome != c.outcome || rep.Maglev == nil || len(rep.Candidates) != 2 || rep.Service != "demo/web-gw port 80/TCP" {
				t.Fatalf("outcome %s, maglev %+v, %d candidates, service %q\n%s", rep.Outcome, rep.Maglev, len(rep.Candidates), rep.Service, b.String())
			}
			if rep.Maglev.Slot != dataplane.GatewaySlot(src, dst, maglev.DefaultSize) || !strings.Contains(b.String(), c.verb+" "+rep.Maglev.Backend) {
				t.Errorf("maglev %+v (want slot %d)\n%s", rep.Maglev, dataplane.GatewaySlot(src, dst, maglev.DefaultSize), b.String())
			}
		})
	}
}

// TestMentionsAddr: explain lists a rejection for a destination only when the rejection names that
// very address, alone or with a port, not a longer one that starts the same.
func TestMentionsAddr(t *testing.T) {
	for _, tc := range []struct {
		text, addr string
		want       bool
	}{
		{"udp 10.96.0.10:53 is held by Service kube-system/kube-dns", "10.96.0.10", true},
		{"udp 10.96.0.10:53 is held by Service kube-system/kube-dns", "10.96.0.1", false},
		{"spec.externalIPs[0]: 127.0.0.1 is a special address (loopback)", "127.0.0.1", true},
		{"spec.externalIPs[0]: :: is a special address (unspecified)", "::", true},
		{"tcp [2001:db8:ff::50]:80 is held by Service default/zzz-old", "2001:db8:ff::50", true},
		{"tcp [2001:db8:ff::50]:80 is held by Service default/zzz-old", "2001:db8:ff::5", false},
		{"spec.externalIPs 192.0.2.11 is not programmed: it is a node's address.", "192.0.2.11", true},
	} {
		if got := mentionsAddr(tc.text, netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("mentionsAddr(%q, %s) = %v, want %v", tc.text, tc.addr, got, tc.want)
		}
	}
}

// TestExplainJSONSteps: the steps of `explain --output json` keep their fields; the typed fields the
// tracer adds for programs (dataplane.Step.Kind and the like) are not part of them.
func TestExplainJSONSteps(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11"]
clusterCIDRs: ["10.244.0.0/16"]
serviceCIDRs: ["10.96.0.0/16"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := explain(&explainFlags{from: "198.51.100.7", to: "10.96.0.10:80", config: cfg, manifests: filepath.Join("..", "..", "deploy", "examples", "demo")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep.Steps[0])
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(keys)); !slices.Equal(got, []string{"Branch", "Chain", "Hook", "Note", "Rule", "Text"}) {
		t.Errorf("a step's JSON has the fields %v", got)
	}
}
