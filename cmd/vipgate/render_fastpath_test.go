package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/gateway"

	"github.com/vipgate/vipgate/test/lab"
)

// fastPathGateway is a route forwarding gateway whose nodes are on 192.0.2.0/24 and 2001:db8::/64;
// extra is appended (routeFastPath).
const fastPathGateway = `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [192.0.2.13, 2001:db8::13]
forwarding: route
nodes:
- {name: node1, addresses: [192.0.2.11, 2001:db8::11]}
- {name: node2, addresses: [192.0.2.12, 2001:db8::12]}
`

// TestRenderGatewayFastPath: `vipgate render` of a route forwarding gateway prints, after each
// family's table, the fast path's netdev table, on the devices stated (--ingress-devices,
// --node-device), named in the config (routeFastPath.devices), or found as the running gateway
// would find them (the up interfaces and the route to the nodes, here inside a namespace); where the
// fast path cannot be planned it prints an nft comment saying why, never nothing. nft (Debian's
// 1.0.6 where the test runs) accepts the whole output with `nft -c -f` in a throwaway namespace
// that has the devices (veth pairs: a netdev chain's devices must exist).
func TestRenderGatewayFastPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, bin := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
	manifests := filepath.Join("..", "..", "deploy", "examples", "demo")
	// The machine the rendering is for: s0/s1 (clients' side, down) and n0/n1 (nodes' side, up,
	// n0 on the nodes' subnets).
	ns := renderNetns(t, "s0:s1", "n0:n1")
	for _, cmd := range [][]string{
		{"link", "set", "n0", "up"}, {"link", "set", "n1", "up"},
		{"addr", "add", "192.0.2.1/24", "dev", "n0"}, {"addr", "add", "2001:db8::1/64", "dev", "n0", "nodad"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, cmd...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", cmd, err, out)
		}
	}
	// An empty namespace: the nodes are not on-link there.
	bare := renderNetns(t)

	for _, c := range []struct {
		name, extra, netns string
		ingress            []string
		nodeDev            string
		// want are in the output; wantNot are not.
		want, wantNot []string
	}{
		{name: "stated devices", netns: bare, ingress: []string{"s0", "s1"}, nodeDev: "n0",
			want: []string{"table netdev vipgate-fwd4 {", "table netdev vipgate-fwd6 {",
				`type filter hook ingress devices = { "s0" } priority 0; policy accept;`,
				`type filter hook ingress devices = { "s1" } priority 0; policy accept;`,
				`fwd ip to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns device "n0"`,
				`fwd ip6 to ip6 daddr . meta l4proto . th dport . meta mark map @gateway-conns device "n0"`},
			wantNot: []string{"gateway-ingress-n0", "# No route forwarding fast path"}},
		{name: "config's devices, stated node device", extra: "routeFastPath: {devices: [s1]}\n", netns: bare, nodeDev: "n0",
			want:    []string{"gateway-ingress-s1", `device "n0"`},
			wantNot: []string{"gateway-ingress-s0", "gateway-ingress-n0"}},
		// What the gateway would do on the machine: every up interface but lo, and the device of
		// the route to the nodes.
		{name: "discovered", netns: ns,
			want: []string{"table netdev vipgate-fwd4 {", "table netdev vipgate-fwd6 {", "gateway-ingress-n0 {", "gateway-ingress-n1 {",
				`fwd ip to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns device "n0"`},
			wantNot: []string{"gateway-ingress-s0", "gateway-ingress-lo", "# No route forwarding fast path"}},
		{name: "nodes not on-link", netns: bare,
			want: []string{"# No route forwarding fast path for IPv4 (table netdev vipgate-fwd4): node 192.0.2.11",
				"# No route forwarding fast path for IPv6 (table netdev vipgate-fwd6): node 2001:db8::11",
				"# The gateway would forward IPv4 with table ip vipgate alone (dup at prerouting)"},
			wantNot: []string{"table netdev vipgate-fwd4 {", "table netdev vipgate-fwd6 {"}},
		{name: "fast path off", extra: "routeFastPath: {enabled: false}\n", netns: ns,
			wantNot: []string{"table netdev", "fast path"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "gw.yaml")
			if err := os.WriteFile(cfg, []byte(fastPathGateway+c.extra), 0o644); err != nil {
				t.Fatal(err)
			}
			o, err := loadOfflineFile(t, cfg, manifests)
			if err != nil {
				t.Fatal(err)
			}
			o.IngressDevices, o.NodeDevice = c.ingress, c.nodeDev
			var out string
			if err := inNetns(c.netns, func() error {
				var b strings.Builder
				err := renderGateway(&b, o)
				out = b.String()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "table ip vipgate {\n") || !strings.Contains(out, "table ip6 vipgate {\n") {
				t.Fatalf("the families' tables are not rendered:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("render lacks %q:\n%s", w, out)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("render has %q:\n%s", w, out)
				}
			}
			// The tables come in the order the gateway programs them: each family's table, then
			// its netdev table.
			if i, j := strings.Index(out, "table ip vipgate {"), strings.Index(out, "table netdev vipgate-fwd4 {"); j >= 0 && j < i {
				t.Errorf("the netdev table comes before the family's table")
			}
			path := filepath.Join(t.TempDir(), "render.nft")
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if res, err := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", path).CombinedOutput(); err != nil {
				t.Fatalf("nft -c -f: %v\n%s\n--- rendered:\n%s", err, res, out)
			}
		})
	}
}

// TestRenderFlags: render's fast path flags are checked, and stated devices with a gateway that has
// no fast path are an error rather than ignored.
func TestRenderFlags(t *testing.T) {
	base := []string{"--config", "c.yaml", "--manifests", "m"}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--ingress-devices", "eth0,eth1", "--node-device", "eth1"}, ""},
		{[]string{"--ingress-devices", "eth0,,eth1"}, "an empty device name"},
		{[]string{"--ingress-devices", "eth0/1"}, "not an interface name"},
		{[]string{"--node-device", "a-name-far-too-long"}, "not an interface name"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		rf, err := parseRenderFlags(append(slices.Clone(base), c.args...))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.err == "" && (rf.ingressDevices != "eth0,eth1" || rf.nodeDevice != "eth1"):
			t.Errorf("%v: parsed %+v", c.args, rf)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%v: error %v, want one with %q", c.args, err, c.err)
		}
	}
	if _, err := parseRenderFlags([]string{"--config", "c.yaml"}); err == nil || !strings.Contains(err.Error(), "--manifests") {
		t.Errorf("without --manifests: %v", err)
	}

	cfg := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(fastPathGateway, "forwarding: route", "forwarding: nodePort", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := loadOfflineFile(t, cfg, filepath.Join("..", "..", "deploy", "examples", "demo"))
	if err != nil {
		t.Fatal(err)
	}
	o.NodeDevice = "eth1"
	if err := renderGateway(&strings.Builder{}, o); err == nil || !strings.Contains(err.Error(), "fast path") {
		t.Errorf("--node-device with nodePort forwarding: %v, want an error", err)
	}
}

// renderNetns creates a network namespace with the veth pairs "a:b" of pairs, removed when the test
// ends, and returns its name.
func renderNetns(t *testing.T, pairs ...string) string {
	t.Helper()
	name := fmt.Sprintf("vgt%d-rf%d", os.Getpid(), time.Now().UnixNano()%1000000)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	for _, p := range pairs {
		a, b, _ := strings.Cut(p, ":")
		if out, err := exec.Command("ip", "-n", name, "link", "add", a, "type", "veth", "peer", "name", b).CombinedOutput(); err != nil {
			t.Fatalf("ip link add %s: %v: %s", a, err, out)
		}
	}
	return name
}

// inNetns runs fn on an OS thread that is in the named network namespace, as `vipgate render`
// would run there (its interface list and route lookups are netlink requests of that thread).
var inNetns = lab.InNetns

// TestExplainGatewayFastPath: `vipgate explain --manifests` of a route forwarding gateway traces an
// arriving packet through the fast path's netdev table first, as planned where explain runs (here a
// namespace whose n0 is on the nodes' subnets): on an ingress device the packet is forwarded by fwd
// through n0; on a device without an ingress chain it is passed on to the family's table; where
// the nodes are not on-link, explain says there is no fast path and why.
func TestExplainGatewayFastPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	ns := renderNetns(t, "s0:s1", "n0:n1")
	for _, cmd := range [][]string{{"link", "set", "n0", "up"}, {"link", "set", "n1", "up"}, {"addr", "add", "192.0.2.1/24", "dev", "n0"}} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, cmd...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", cmd, err, out)
		}
	}
	bare := renderNetns(t)
	cfg := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(cfg, []byte(fastPathGateway), 0o644); err != nil {
		t.Fatal(err)
	}
	manifests := filepath.Join("..", "..", "deploy", "examples", "demo")
	for _, c := range []struct {
		name, netns, device string
		forwarded           bool
		want                string
	}{
		{"on an ingress device", ns, "n1", true, "-> FORWARDED by fwd through device n0 to one of 2 nodes (192.0.2.11, 192.0.2.12)"},
		{"any ingress device", ns, "", true, "the packet arriving on n0 (ingress chains on devices n0, n1)"},
		{"a device without a chain", ns, "s0", false, "-> passed on to the IP stack (no ingress chain of table netdev vipgate-fwd4 on device s0"},
		{"no fast path", bare, "n1", false, "fast path: none for this family (node 192.0.2.11: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rep *explain.Report
			if err := inNetns(c.netns, func() (err error) {
				rep, err = explainFor(&explainFlags{config: cfg, manifests: manifests, from: "198.51.100.7:40001", to: "203.0.113.11:80", device: c.device})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			writeExplain(&b, rep)
			if !strings.Contains(b.String(), c.want) {
				t.Errorf("explain lacks %q:\n%s", c.want, b.String())
			}
			if got := rep.FastPath != nil && rep.FastPath.Forwarded; got != c.forwarded {
				t.Errorf("forwarded by the fast path: %v, want %v\n%s", got, c.forwarded, b.String())
			}
			// The family's table is traced all the same: it decides what the fast path passes on.
			if rep.Outcome != "ROUTE" {
				t.Errorf("the family's table: %s, want ROUTE\n%s", rep.Outcome, b.String())
			}
		})
	}
}

// TestExplainKernelFastPath: `vipgate explain` without --manifests reads the fast path's netdev
// table back from the kernel too, where a gateway programmed it (here into a namespace, with the
// fast path on n1 and n0 as the nodes' device), and traces the packet through it first.
func TestExplainKernelFastPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	ns := renderNetns(t, "n0:n1")
	cfgPath := filepath.Join(t.TempDir(), "gw.yaml")
	if err := os.WriteFile(cfgPath, []byte(fastPathGateway+"routeFastPath: {devices: [n1]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := loadOfflineFile(t, cfgPath, filepath.Join("..", "..", "deploy", "examples", "demo"))
	if err != nil {
		t.Fatal(err)
	}
	nsFile, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsFile.Close()
	dpCfg := gateway.ConfigFor(o.Gateway)
	dpCfg.FastPath.NodeDevice = func(netip.Addr) (string, bool, error) { return "n0", true, nil }
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(nsFile.Fd())}
	defer prog.Close()
	rep, err := gateway.NewProxier(hclog.NewNullLogger(), dpCfg, prog).Sync(o.State, gateway.ExpectedHealth(dpCfg, o.State))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NoFastPath) > 0 {
		t.Fatalf("no fast path: %v", rep.NoFastPath)
	}
	var ex *explain.Report
	if err := inNetns(ns, func() (err error) {
		ex, err = explainFor(&explainFlags{config: cfgPath, from: "198.51.100.7:40001", to: "203.0.113.11:80"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeExplain(&b, ex)
	if fp := ex.FastPath; fp == nil || !fp.Forwarded || fp.Device != "n1" || fp.NodeDevice != "n0" || ex.Ruleset != "kernel" {
		t.Errorf("the kernel's fast path is not traced as forwarding on n1 by n0:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "fast path: table netdev vipgate-fwd4, the packet arriving on n1") {
		t.Errorf("explain lacks the fast path:\n%s", b.String())
	}
}
