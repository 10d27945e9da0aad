package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/explain"
)

// TestRenderGatewaySNAT: `vipgate render` of a gateway with snatAddresses prints, after vipgate's
// own tables, the vipgate-snat tables the gateway programs (its own SNAT address per family, the
// guard for every gateway's), and nft (Debian's 1.0.6 where the test runs) accepts the whole output
// with `nft -c -f`, in a network namespace of its own (dataplane/render_nft_test.go's approach). A
// gateway without snatAddresses prints no vipgate-snat. (ctsync's TestRenderSNATLoadsAsProgrammed
// proves the rendering equal to what ProgramSNAT programs.)
func TestRenderGatewaySNAT(t *testing.T) {
	manifests := filepath.Join("..", "..", "deploy", "examples", "demo")
	const base = `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [192.0.2.13, 2001:db8::13]
forwarding: nodePort
snat: always
speaker: {members: [{name: gw1, address: 192.0.2.13}, {name: gw2, address: 192.0.2.14}]}
nodes:
- {name: node1, addresses: [192.0.2.11]}
- {name: node2, addresses: [192.0.2.12]}
`
	for _, c := range []struct {
		name, extra string
		want        []string
		// noV6SNAT: gw1 has no IPv6 SNAT address, so no IPv6 postrouting chain.
		noV6SNAT bool
	}{
		{"dual-stack", `snatAddresses:
- {gateway: gw1, addresses: [192.0.2.240, 2001:db8::240]}
- {gateway: gw2, addresses: [192.0.2.241, 2001:db8::241]}
`, []string{
			"table ip vipgate-snat {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority 99; policy accept;\n" +
				"\t\tmeta mark & 0x00004000 != 0x00000000 meta mark set meta mark & 0xffffbfff snat to 192.0.2.240 fully-random\n\t}\n" +
				"\tchain prerouting {\n\t\ttype filter hook prerouting priority -150; policy accept;\n" +
				"\t\tip daddr 192.0.2.240 ct state invalid,new drop\n\t\tip daddr 192.0.2.241 ct state invalid,new drop\n\t}\n}\n",
			"table ip6 vipgate-snat {",
			"snat to 2001:db8::240 fully-random",
			"ip6 daddr 2001:db8::241 ct state invalid,new drop",
		}, false},
		// gw1 has no IPv6 SNAT address: no IPv6 SNAT rule (vipgate's masquerade applies), but the
		// guard of gw2's IPv6 address all the same (gw1 answers for it when gw2 dies).
		{"peer's IPv6 only", `snatAddresses:
- {gateway: gw1, addresses: [192.0.2.240]}
- {gateway: gw2, addresses: [192.0.2.241, 2001:db8::241]}
`, []string{"snat to 192.0.2.240 fully-random", "table ip6 vipgate-snat {\n\tchain prerouting {", "ip6 daddr 2001:db8::241 ct state invalid,new drop"}, true},
		{"no snatAddresses", "", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "gw.yaml")
			if err := os.WriteFile(cfg, []byte(base+c.extra), 0o644); err != nil {
				t.Fatal(err)
			}
			o, err := loadOfflineFile(t, cfg, manifests)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if err := renderGateway(&b, o); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if !strings.Contains(out, "table ip vipgate {\n") || !strings.Contains(out, "table ip6 vipgate {\n") {
				t.Fatalf("no vipgate table rendered:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("render lacks %q:\n%s", w, out)
				}
			}
			if c.want == nil && strings.Contains(out, "vipgate-snat") {
				t.Errorf("vipgate-snat rendered without snatAddresses:\n%s", out)
			}
			if c.noV6SNAT && strings.Contains(out, "table ip6 vipgate-snat {\n\tchain postrouting") {
				t.Errorf("an IPv6 SNAT rule without an IPv6 SNAT address of this gateway:\n%s", out)
			}
			nftCheckRendered(t, out)
		})
	}
}

// loadOfflineFile loads a config file and a manifest directory as `vipgate render` does.
func loadOfflineFile(t *testing.T, cfgPath, manifests string) (*explain.Offline, error) {
	t.Helper()
	anyCfg, err := cluster.LoadConfig(cfgPath)
	if err != nil {
		return nil, err
	}
	return explain.LoadOffline(anyCfg, manifests, false, "error")
}

// nftCheckRendered runs `nft -c -f` over text in a network namespace that exists for that one
// command (unshare -n: nft -c still opens a netlink socket), or skips where it cannot.
func nftCheckRendered(t *testing.T, text string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root (a network namespace of its own)")
	}
	for _, bin := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
	path := filepath.Join(t.TempDir(), "render.nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f: %v\n%s\n--- rendered:\n%s", err, out, text)
	}
}
