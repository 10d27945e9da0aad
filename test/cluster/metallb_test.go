package testcluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vipgate/vipgate/test/lab"
)

// EnvClusterSlow enables the long versions of the cluster tests (make test leaves it unset).
const EnvClusterSlow = "VIPGATE_CLUSTER_SLOW"

// EnvMetalLBCombos picks TestKubeProxyMetalLB's combinations, e.g. "iptables/bgp,nftables/l2"
// (default: all four).
const EnvMetalLBCombos = "VIPGATE_METALLB_COMBOS"

// TestKubeProxyMetalLB: the cluster most users run, the real kube-proxy (iptables and nftables
// mode) with the real MetalLB v0.16.2 (L2 and native BGP), each combination in a cluster of its
// own: MetalLB's webhook (certificates from its own cert-rotator) rejects a bad pool, its controller
// gives a LoadBalancer Service an address of the mode's pool, kube-proxy programs it in the mode
// asked for, and a client behind the router reaches both pods through it: by the address a node's
// speaker answers ARP for (l2), or by the route the speakers announced to the router's BIRD (bgp).
// Long (a cluster per combination, about 2 minutes each): VIPGATE_CLUSTER_SLOW=1.
func TestKubeProxyMetalLB(t *testing.T) {
	if os.Getenv(EnvClusterSlow) == "" {
		t.Skipf("set %s=1 (and %s=1) for the real kube-proxy + real MetalLB combinations", EnvClusterSlow, EnvClusterTests)
	}
	combos := []string{"iptables/l2", "iptables/bgp", "nftables/l2", "nftables/bgp"}
	if v := os.Getenv(EnvMetalLBCombos); v != "" {
		combos = strings.Split(v, ",")
	}
	for _, combo := range combos {
		mode, mlb, ok := strings.Cut(combo, "/")
		if !ok {
			t.Fatalf("%s: %q is not MODE/METALLB (e.g. iptables/bgp)", EnvMetalLBCombos, combo)
		}
		t.Run(strings.ReplaceAll(combo, "/", "-"), func(t *testing.T) { testKubeProxyMetalLB(t, mode, mlb) })
	}
}

func testKubeProxyMetalLB(t *testing.T, mode, mlb string) {
	// Both ways in: at Up (Spec.MetalLB) with iptables, into the running cluster with nftables.
	late := mode == KubeProxyNFTables
	spec := Spec{Nodes: 2, Proxy: ProxyKubeProxy, KubeProxyMode: mode, MetalLB: mlb}
	if late {
		spec.MetalLB = ""
	}
	c := ownClusterSpec(t, spec)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Kubectl(context.Background(), "", "-n", MetalLBNamespace, "logs", "-l", "app=metallb", "--tail=30", "--prefix")
			t.Logf("MetalLB's logs:\n%s", out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if late {
		start := time.Now()
		if err := c.InstallMetalLB(ctx, mlb); err != nil {
			t.Fatal(err)
		}
		t.Logf("InstallMetalLB(%s) into the running cluster: %.1f s", mlb, time.Since(start).Seconds())
	}
	if mlb == MetalLBBGP && c.BIRD == nil {
		t.Error("bgp: Cluster.BIRD is nil")
	}
	// The speakers' memberlist key: MetalLB's controller creates it.
	if _, err := c.Kubectl(ctx, "", "-n", MetalLBNamespace, "get", "secret", "memberlist"); err != nil {
		t.Error(err)
	}

	// kube-proxy runs in the mode asked for: its rules are in the node's network namespace.
	for _, n := range c.Nodes {
		cmd, want := []string{"nft", "list", "table", "ip", "kube-proxy"}, "chain services"
		if mode == KubeProxyIPTables {
			cmd, want = []string{"iptables-nft-save", "-t", "nat"}, ":KUBE-SERVICES"
		}
		out, err := c.Lab.ExecContext(ctx, n.Name, cmd...)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("%s: no %s rules of kube-proxy: %v\n%s", n.Name, mode, err, out)
		}
	}

	// kube-proxy's own complaints (klog's E and W lines), reported for the record.
	if logs, err := c.Kubectl(ctx, "", "-n", "kube-system", "logs", "-l", "k8s-app=kube-proxy", "--tail=-1", "--prefix"); err == nil {
		var bad []string
		for _, l := range strings.Split(logs, "\n") {
			if _, msg, ok := strings.Cut(l, "] "); ok && (strings.HasPrefix(msg, "E") || strings.HasPrefix(msg, "W")) {
				bad = append(bad, l)
			}
		}
		t.Logf("kube-proxy (%s) logged %d warnings and errors:\n%s", mode, len(bad), strings.Join(bad, "\n"))
	}

	// MetalLB's webhook answers (its certificate and CA are the controller's own) and validates.
	bad := "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: bad, namespace: metallb-system}\nspec:\n  addresses: [not-an-address]\n"
	if out, err := c.Kubectl(ctx, bad, "apply", "-f", "-"); err == nil || !strings.Contains(out, "denied the request") {
		t.Errorf("MetalLB's webhook accepted an invalid pool (err %v):\n%s", err, out)
	} else {
		t.Logf("webhook: %s", firstLine(strings.TrimSpace(out)))
	}

	// The BGPPeer CRD converts through MetalLB's webhook (the controller injects its CA into the
	// CRD): reading the stored v1beta2 peer as v1beta1 goes through it.
	if mlb == MetalLBBGP {
		// (kubectl's output starts with the API server's deprecation warning for v1beta1.)
		if out, err := c.Kubectl(ctx, "", "-n", MetalLBNamespace, "get", "bgppeers.v1beta1.metallb.io", "router", "-o", "jsonpath={.apiVersion} {.spec.peerAddress}"); err != nil || !strings.HasSuffix(out, "metallb.io/v1beta1 "+lab.RouterLANv4.String()) {
			t.Errorf("BGPPeer as v1beta1 (conversion webhook): %v %q", err, out)
		}
	}

	ns := "kp-metallb"
	kubectl(t, ctx, c, "create", "namespace", ns)
	kubectl(t, ctx, c, "-n", ns, "create", "deployment", "web", "--replicas=2",
		"--image=registry.k8s.io/e2e-test-images/agnhost:2.63.0", "--", "/agnhost", "netexec", "--http-port=8080")
	kubectl(t, ctx, c, "-n", ns, "rollout", "status", "deployment/web", "--timeout=3m")
	created := time.Now()
	kubectl(t, ctx, c, "-n", ns, "expose", "deployment", "web", "--type=LoadBalancer", "--port=80", "--target-port=8080")
	ip := waitService(t, ctx, c, ns, "web").Status.LoadBalancer.Ingress[0].IP
	allocated := time.Since(created)
	addr := mustAddr(t, ip)
	switch mlb {
	case MetalLBL2:
		if !lab.LANv4.Contains(addr) {
			t.Errorf("l2: LoadBalancer IP %s is not on the LAN %s", ip, lab.LANv4)
		}
	case MetalLBBGP:
		if !LoadBalancerPool.Contains(addr) {
			t.Errorf("bgp: LoadBalancer IP %s is not from the pool %s", ip, LoadBalancerPool)
		}
	}

	pods := map[string]bool{}
	var first time.Duration
	if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		out, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+ip+"/hostname")
		if err != nil {
			return err
		}
		if first == 0 {
			first = time.Since(created)
		}
		pods[strings.TrimSpace(out)] = true
		if len(pods) < 2 {
			return fmt.Errorf("answered by %v so far", pods)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s from the client: %v (router: %s)", ip, err, routerState(c, ip))
	}

	// Who made the address reachable: a node's speaker (ARP) or the nodes' routes at the router.
	nodeIPs := map[string]string{}
	for _, n := range c.Nodes {
		nodeIPs[n.Lab.IPv4.String()] = n.Name
	}
	switch mlb {
	case MetalLBL2:
		mac, _, _ := strings.Cut(neighMAC(c, ip), " ")
		if node, ok := nodeMACs(t, c)[mac]; !ok {
			t.Errorf("l2: the router's neighbour entry for %s (%s) is no node's", ip, neighMAC(c, ip))
		} else {
			t.Logf("l2: %s answered by %s's speaker (%s)", ip, node, mac)
		}
	case MetalLBBGP:
		hops := routerNextHops(c, ip)
		if len(hops) != len(c.Nodes) {
			t.Errorf("bgp: the router's route to %s goes via %v, want every node", ip, hops)
		}
		for _, h := range hops {
			if _, ok := nodeIPs[h]; !ok {
				t.Errorf("bgp: next hop %s of %s is no node", h, ip)
			}
		}
		t.Logf("bgp: %s via %v", ip, hops)
	}
	t.Logf("kube-proxy %s + MetalLB %s: %s allocated %.1f s after kubectl expose, answered the outside client after %.1f s; pods %v",
		mode, mlb, ip, allocated.Seconds(), first.Seconds(), pods)

	// RemoveMetalLB: the workloads go, the objects and the Service's address stay, and the objects
	// can still be changed (no webhook left to reject them).
	if err := c.RemoveMetalLB(ctx); err != nil {
		t.Fatal(err)
	}
	if got := waitService(t, ctx, c, ns, "web").Status.LoadBalancer.Ingress[0].IP; got != ip {
		t.Errorf("after RemoveMetalLB the Service has %s, want %s", got, ip)
	}
	kubectl(t, ctx, c, "-n", MetalLBNamespace, "annotate", "ipaddresspool", "lan", "vipgate.test/touched=1")
	if mlb == MetalLBBGP {
		if err := poll(ctx, time.Minute, func(context.Context) error {
			if hops := routerNextHops(c, ip); len(hops) > 0 {
				return fmt.Errorf("the router still routes %s via %v", ip, hops)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
}

// routerState is the router's route and neighbour entry for ip, for failures.
func routerState(c *Cluster, ip string) string {
	route, _ := c.Lab.Exec(lab.RoleRouter, "ip", "-4", "route", "get", ip)
	return fmt.Sprintf("route %q, neighbour %q", strings.TrimSpace(route), neighMAC(c, ip))
}

// TestCheckProxySpec: the proxy fields' combinations Up accepts, fills in and rejects.
func TestCheckProxySpec(t *testing.T) {
	for _, tc := range []struct {
		spec     Spec
		wantMode string
		wantErr  string
	}{
		{spec: Spec{Proxy: ProxyKubeProxy}, wantMode: KubeProxyNFTables},
		{spec: Spec{Proxy: ProxyKubeProxy, KubeProxyMode: KubeProxyIPTables, MetalLB: MetalLBBGP}, wantMode: KubeProxyIPTables},
		{spec: Spec{Proxy: ProxyKubeProxy, MetalLB: MetalLBL2}, wantMode: KubeProxyNFTables},
		{spec: Spec{Proxy: ProxyVipgate}},
		{spec: Spec{Proxy: ProxyNone}},
		{spec: Spec{Proxy: "kube-router"}, wantErr: "unknown proxy"},
		{spec: Spec{Proxy: ProxyKubeProxy, KubeProxyMode: "ipvs"}, wantErr: "unknown kube-proxy mode"},
		{spec: Spec{Proxy: ProxyVipgate, KubeProxyMode: KubeProxyIPTables}, wantErr: "needs proxy kube-proxy"},
		{spec: Spec{Proxy: ProxyKubeProxy, MetalLB: "frr"}, wantErr: "unknown MetalLB mode"},
		{spec: Spec{Proxy: ProxyVipgate, MetalLB: MetalLBBGP}, wantErr: "with proxy kube-proxy only"},
		{spec: Spec{Proxy: ProxyNone, MetalLB: MetalLBL2}, wantErr: "with proxy kube-proxy only"},
	} {
		spec := tc.spec
		err := checkProxySpec(&spec)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%+v: %v", tc.spec, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: error %v, want one with %q", tc.spec, err, tc.wantErr)
		case err == nil && spec.KubeProxyMode != tc.wantMode:
			t.Errorf("%+v: mode %q, want %q", tc.spec, spec.KubeProxyMode, tc.wantMode)
		}
	}
}

// TestMetalLBManifests: MetalLB's manifest names the images `make test-images` builds, and the lab's
// objects for it are what its native BGP mode accepts and what the router's BIRD expects.
func TestMetalLBManifests(t *testing.T) {
	images := map[string]bool{}
	for _, o := range readManifest(t, "manifests/metallb-native.yaml") {
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			images[c.(map[string]any)["image"].(string)] = true
		}
	}
	want := map[string]bool{"quay.io/metallb/controller:v0.16.2": true, "quay.io/metallb/speaker:v0.16.2": true}
	if fmt.Sprint(images) != fmt.Sprint(want) {
		t.Errorf("metallb-native.yaml runs %v, want %v (deploy/image TestImages)", images, want)
	}
	for mode, file := range metalLBManifests {
		kinds := map[string]int{}
		for _, o := range readManifest(t, "manifests/"+file) {
			kinds[o.GetKind()]++
			if o.GetNamespace() != MetalLBNamespace {
				t.Errorf("%s: %s %s in namespace %q", file, o.GetKind(), o.GetName(), o.GetNamespace())
			}
			if o.GetKind() == "BFDProfile" {
				t.Errorf("%s: a BFDProfile (native BGP mode rejects it)", file)
			}
			if o.GetKind() != "BGPPeer" {
				continue
			}
			spec, _, _ := unstructured.NestedMap(o.Object, "spec")
			if fmt.Sprint(spec["myASN"]) != fmt.Sprint(NodeASN) || fmt.Sprint(spec["peerASN"]) != fmt.Sprint(RouterASN) || spec["peerAddress"] != lab.RouterLANv4.String() {
				t.Errorf("%s: BGPPeer %v, want AS %d to the router %s AS %d", file, spec, NodeASN, lab.RouterLANv4, RouterASN)
			}
			for _, frrOnly := range []string{"bfdProfile", "enableGracefulRestart", "keepaliveTime", "vrf", "connectTime"} {
				if _, ok := spec[frrOnly]; ok {
					t.Errorf("%s: BGPPeer sets %s (FRR mode only)", file, frrOnly)
				}
			}
		}
		wantBGP := 0
		if mode == MetalLBBGP {
			wantBGP = 1
		}
		if kinds["IPAddressPool"] == 0 || kinds["L2Advertisement"] != 1 || kinds["BGPPeer"] != wantBGP || kinds["BGPAdvertisement"] != wantBGP {
			t.Errorf("%s (%s): objects %v", file, mode, kinds)
		}
	}
}
