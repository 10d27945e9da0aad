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
	"github.com/vipgate/vipgate/explain"
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
			rep, err := explainFor(&explainFlags{from: tc.from, to: tc.to, host: tc.host, config: cfg, manifests: manifests})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			writeExplain(&b, rep)
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
	if _, err := explainFor(&explainFlags{from: "1.2.3.4", to: "10.96.0.10:80", manifests: manifests}); err == nil {
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
			rep, err := explainFor(&explainFlags{from: src.String(), to: dst.String(), config: cfg, manifests: manifests})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			writeExplain(&b, rep)
			if rep.Outcome != c.outcome || rep.Maglev == nil || len(rep.Candidates) != 2 || rep.Service != "demo/web-gw port 80/TCP" {
				t.Fatalf("outcome %s, maglev %+v, %d candidates, service %q\n%s", rep.Outcome, rep.Maglev, len(rep.Candidates), rep.Service, b.String())
			}
			if rep.Maglev.Slot != dataplane.GatewaySlot(src, dst, maglev.DefaultSize) || !strings.Contains(b.String(), c.verb+" "+rep.Maglev.Backend) {
				t.Errorf("maglev %+v (want slot %d)\n%s", rep.Maglev, dataplane.GatewaySlot(src, dst, maglev.DefaultSize), b.String())
			}
		})
	}
}

// TestExplainRejectedByAddr: explain lists the rejections whose address (Rejection.Addr, typed
// where the rejection is made) is the destination: an external IP the node's policy refuses and a
// special address the source refuses; not those of another address, even one whose text starts the
// same; and /status's JSON carries the address for explain on a live node.
func TestExplainRejectedByAddr(t *testing.T) {
	cases := map[string]hostileCase{}
	for _, tc := range hostileCorpus() {
		cases[tc.name] = tc
	}
	for _, c := range []struct {
		tc, to string
		want   []string // "Kind Object" of the listed rejections
	}{
		{"IPv4 externalIP on kube-dns's cluster IP", "10.96.0.10:53/udp", []string{"Service default/aaa-capture"}},
		{"IPv4 externalIP on kube-dns's cluster IP", "10.96.0.1:53/udp", nil},
		{"IPv6 externalIP on kube-dns's cluster IP", "[2001:db8:96::a]:53/udp", []string{"Service default/aaa-capture"}},
		{"IPv4 externalIP 127.0.0.1", "127.0.0.1:80/tcp", []string{"Service default/aaa-special"}},
		{"IPv4 externalIP 127.0.0.1", "127.0.0.10:80/tcp", nil},
		{"IPv6 two externalIP claims, the younger sorts first", "[2001:db8:ff::50]:80/tcp", []string{"Service default/aaa-young"}},
		{"IPv6 two externalIP claims, the younger sorts first", "[2001:db8:ff::5]:80/tcp", nil},
	} {
		tc, ok := cases[c.tc]
		if !ok {
			t.Fatalf("no hostile case %q", c.tc)
		}
		_, _, cfgPath, manifests := renderCase(t, tc)
		rep, err := explainFor(&explainFlags{from: fromFor(c.to), to: c.to, config: cfgPath, manifests: manifests})
		if err != nil {
			t.Fatal(err)
		}
		dst, _, err := parseDest(c.to)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rep.Rejected {
			got = append(got, r.Kind+" "+r.Object)
			if r.Addr != dst.Addr() {
				t.Errorf("%s: %s lists a rejection of %s: %+v", c.tc, c.to, r.Addr, r)
			}
			js, err := json.Marshal(r)
			if err != nil || !strings.Contains(string(js), `"addr":"`+dst.Addr().String()+`"`) {
				t.Errorf("%s: rejection as JSON %s (%v) does not name its address", c.tc, js, err)
			}
		}
		// One rejection per entry: a Service's ports on the address each have theirs.
		slices.Sort(got)
		if got = slices.Compact(got); !slices.Equal(got, c.want) {
			t.Errorf("%s: explain %s lists %q, want %q", c.tc, c.to, got, c.want)
		}
	}
	// A rejection about no address (a file's syntax) never says "addr".
	if js, _ := json.Marshal(explain.RejectedObject{Kind: "file", Object: "x.yaml", Reason: "bad"}); strings.Contains(string(js), "addr") {
		t.Errorf("rejection without an address as JSON: %s", js)
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
	rep, err := explainFor(&explainFlags{from: "198.51.100.7", to: "10.96.0.10:80", config: cfg, manifests: filepath.Join("..", "..", "deploy", "examples", "demo")})
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
