package dataplane

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
)

// This file checks that everything vipgate programs, node and gateway, both families and both
// together, is printed by render in a form that Debian's nft (1.0.6) accepts with `nft -c -f`: an
// operator must be able to check and load what `vipgate render` prints. nft -c needs a network
// namespace of its own (it still opens a netlink socket), so every check runs under `unshare -n`:
// a namespace that exists only for that one command.

// nftCheckOrSkip skips the test where `nft -c` cannot run.
func nftCheckOrSkip(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root (a network namespace of its own)")
	}
	for _, bin := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
}

// nftCheck runs `nft -c -f` over text in a throwaway network namespace and fails with nft's message.
func nftCheck(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f of %s: %v\n%s\n--- rendered:\n%s", name, err, out, text)
	}
}

// withAlgorithm returns the fixture with every Service annotated with alg ("" leaves them as they
// are): each rule kind (affinity, eTP Local, NodePorts, source ranges, ...) meets each algorithm.
func withAlgorithm(svcs []trService, alg cluster.LBAlgorithm) []trService {
	if alg == "" {
		return svcs
	}
	out := make([]trService, len(svcs))
	for i, s := range svcs {
		c := *s.svc
		c.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: string(alg)}
		out[i] = trService{svc: &c, slices: s.slices}
	}
	return out
}

func TestRenderNftAcceptsNode(t *testing.T) {
	nftCheckOrSkip(t)
	for _, alg := range append([]cluster.LBAlgorithm{""}, cluster.LBAlgorithms...) {
		for _, masqAll := range []bool{false, true} {
			name := fmt.Sprintf("node/%s/masqueradeAll=%v", cmpOr(string(alg), "default"), masqAll)
			t.Run(name, func(t *testing.T) {
				svcs := withAlgorithm(trFixture(), alg)
				var both strings.Builder
				for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
					text := RenderString(trFlat(t, fam, masqAll, svcs))
					nftCheck(t, name+"/"+rdFamilyName(fam), text)
					both.WriteString(text)
				}
				nftCheck(t, name+"/dual-stack", both.String()) // as `vipgate render` prints a dual-stack node
			})
		}
	}
}

// gwDualState is gwState with IPv6 node addresses, an IPv6 VIP and Services of every gateway
// algorithm: web keeps the default (maglev), sh asks for source-hash, rr for round-robin (refused on
// gateways: maglev).
func gwDualState() *cluster.State {
	st := gwState()
	st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
	st.Nodes["node2"].Addresses = append(st.Nodes["node2"].Addresses, netip.MustParseAddr("2001:db8:1::12"))
	add := func(svc *cluster.Service, alg cluster.LBAlgorithm, eps ...cluster.Endpoint) {
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: string(alg)}
		st.Services[svc.Key] = svc
		sl := gwSlice(svc, eps...)
		if len(eps) > 0 && eps[0].Addresses[0].Is6() {
			sl.Family = cluster.IPv6
		}
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{sl}
	}
	add(gwService("sh", "203.0.113.60", false, 443, 30443, 0), cluster.LBSourceHash, gwEp("10.244.1.11", "node1"), gwEp("10.244.2.11", "node2"))
	add(gwService("rr", "203.0.113.61", false, 8080, 30808, 0), cluster.LBRoundRobin, gwEp("10.244.1.11", "node1"))
	web6 := gwService("web6", "2001:db8:ff::50", false, 80, 30090, 0)
	web6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::50")}
	add(web6, "", gwEp("2001:db8:244:1::11", "node1"), gwEp("2001:db8:244:2::11", "node2"))
	sh6 := gwService("sh6", "2001:db8:ff::51", false, 443, 30091, 0)
	sh6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::51")}
	add(sh6, cluster.LBSourceHash, gwEp("2001:db8:244:1::12", "node1"))
	loc6 := gwService("loc6", "2001:db8:ff::52", true, 80, 30092, 32002)
	loc6.ClusterIPs = []netip.Addr{netip.MustParseAddr("2001:db8:96::52")}
	add(loc6, "", gwEp("2001:db8:244:1::13", "node1"))
	return st
}

func TestRenderNftAcceptsGateway(t *testing.T) {
	nftCheckOrSkip(t)
	health := Health{{gwNode1, 32001}: true, {netip.MustParseAddr("2001:db8:1::11"), 32002}: true}
	for _, fwd := range []cluster.Forwarding{cluster.ForwardNodePort, cluster.ForwardDirect, cluster.ForwardRoute} {
		for _, snat := range []cluster.SNATMode{cluster.SNATAuto, cluster.SNATAlways, cluster.SNATNever} {
			if fwd == cluster.ForwardRoute && snat == cluster.SNATAlways {
				continue // a configuration error: route forwarding does not NAT
			}
			for _, size := range []int{0, 251} {
				name := fmt.Sprintf("gateway/%s/snat=%s/maglevTableSize=%d", fwd, snat, size)
				t.Run(name, func(t *testing.T) {
					cfg := GatewayConfig{Forwarding: fwd, SNAT: snat, MaglevSize: size}
					var both strings.Builder
					for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
						grs, err := BuildGatewayRuleset(cfg, fam, gwDualState(), health)
						if err != nil {
							t.Fatal(err)
						}
						f := grs.Ruleset.Flatten()
						text := RenderString(f)
						if !strings.Contains(text, "jhash "+map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]+" saddr mod") {
							t.Errorf("IPv%d table has no source-hash rule:\n%s", fam, text)
						}
						nftCheck(t, name+"/"+rdFamilyName(fam), text)
						both.WriteString(text)
					}
					nftCheck(t, name+"/dual-stack", both.String())
				})
			}
		}
	}
}

// TestRenderNftAcceptsGatewayFastPath checks the route forwarding fast path's netdev tables
// (gateway_netdev.go), alone and with the families' tables, as a gateway with FastPath renders them.
// The devices are lo: nft resolves fwd's device name, and lo is all the throwaway namespace has.
func TestRenderNftAcceptsGatewayFastPath(t *testing.T) {
	nftCheckOrSkip(t)
	plan := netdevPlan{ingress: []string{"lo"}, nodeDev: "lo"}
	for _, size := range []int{0, 251} {
		name := fmt.Sprintf("gateway/route/fastPath/maglevTableSize=%d", size)
		t.Run(name, func(t *testing.T) {
			cfg := GatewayConfig{Forwarding: cluster.ForwardRoute, MaglevSize: size}.withDefaults()
			var all strings.Builder
			for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildGatewayRuleset(cfg, fam, gwDualState(), Health{})
				if err != nil {
					t.Fatal(err)
				}
				text := RenderString(gatewayNetdevRuleset(cfg, fam, grs, plan).Flatten())
				ip := map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]
				for _, want := range []string{"table netdev " + NetdevTableName(cfg.Table, fam), `hook ingress devices = { "lo" }`, "fwd " + ip + " to ", "meta pkttype host " + ip + " daddr . meta l4proto . th dport vmap @service-ips"} {
					if !strings.Contains(text, want) {
						t.Errorf("IPv%d netdev table has no %q:\n%s", fam, want, text)
					}
				}
				if strings.Contains(text, "dup to") {
					t.Errorf("IPv%d netdev table dups:\n%s", fam, text)
				}
				nftCheck(t, name+"/"+rdFamilyName(fam), text)
				all.WriteString(RenderString(grs.Ruleset.Flatten()))
				all.WriteString(text)
			}
			nftCheck(t, name+"/dual-stack", all.String())
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
