package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/test/lab"
)

// TestGateway proves `vipgate gateway` with real packets: the lab's lanclient namespace
// (192.0.2.100) plays the gateway in front of node1 (pods a1, a2) and node2 (pod b1), which run
// `vipgate node`. The router sends the VIPs (203.0.113.0/24) to the gateway; the nodes route the
// client network back through it, as a cluster behind a gateway that keeps client addresses must.
//
//	client -> router -> gateway (lanclient) -> node[:NodePort] or pod -> ... -> gateway -> client
//
// Both forwarding modes run in turn against the same cluster. Each probe checks which pod answered
// and which source address it saw.
func TestGateway(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := gwBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	node1, node2 := l.Node("node1"), l.Node("node2")
	gwIP := lab.LANClientv4
	client := lab.Clientv4

	// Routing: VIPs to the gateway; the gateway forwards and reaches the pod networks through their
	// nodes; the nodes send replies to clients back through the gateway.
	gwSh(t, l, lab.RoleRouter, "ip", "route", "add", "203.0.113.0/24", "via", gwIP.String())
	gwSh(t, l, lab.RoleLANClient, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for _, n := range l.Nodes() {
		gwSh(t, l, lab.RoleLANClient, "ip", "route", "add", n.PodCIDRv4.String(), "via", n.IPv4.String())
		gwSh(t, l, n.Name, "ip", "route", "add", lab.ClientNetv4.String(), "via", gwIP.String())
	}

	w := &gwWriter{t: t, dir: manifests}
	w.write("web.yaml",
		gwService("web", "LoadBalancer", "10.96.5.1", "Cluster", []gwPort{{"http", "TCP", 80, 30080, "http"}}, gwStatus("203.0.113.50")),
		gwSlice("web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, gwEp(a1, "node1"), gwEp(a2, "node1"), gwEp(b1, "node2")))
	locSlice := func(eps ...string) string {
		return gwSlice("loc", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, eps...)
	}
	locSvc := gwService("loc", "LoadBalancer", "10.96.5.2", "Local", []gwPort{{"http", "TCP", 80, 30081, "http"}}, "  healthCheckNodePort: 32001\n", gwStatus("203.0.113.51"))
	w.write("loc.yaml", locSvc, locSlice(gwEp(a1, "node1"), gwEp(b1, "node2")))

	nodes := map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		cfg := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(gwNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, filepath.Join(dir, n.Name+".log"), bin, "node", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Name] = p
	}
	var gw *lab.Proc
	starts := 0
	startGateway := func(forwarding string) {
		t.Helper()
		if gw != nil {
			if err := gw.Stop(); err != nil {
				t.Logf("stopping the previous gateway: %v", err)
			}
		}
		cfg := filepath.Join(dir, "gateway-"+forwarding+".yaml")
		if err := os.WriteFile(cfg, []byte(gwConfig(forwarding, gwIP, node1, node2)), 0o644); err != nil {
			t.Fatal(err)
		}
		// A log of its own per start: "synced" in a previous run's log must not count.
		starts++
		p, err := l.Start(lab.RoleLANClient, filepath.Join(dir, fmt.Sprintf("gateway-%s-%d.log", forwarding, starts)), bin, "gateway", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		gw = p
		// Until its first sync, the previous gateway's table is still in place.
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(gw.Log(), "synced") {
			if time.Now().After(deadline) {
				t.Fatalf("gateway (%s) did not sync within 10 s:\n%s", forwarding, gw.Tail(20))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range nodes {
				t.Logf("--- vipgate node on %s:\n%s", name, p.Tail(30))
			}
			if gw != nil {
				t.Logf("--- vipgate gateway:\n%s", gw.Tail(60))
			}
			out, _ := l.Exec(lab.RoleLANClient, "nft", "list", "table", "ip", "vipgate")
			if len(out) > 4000 {
				out = out[:4000] + "\n..."
			}
			t.Logf("--- gateway table (start):\n%s", out)
		}
	})

	t.Run("direct: to the pods, client address kept, Maglev slot as computed", func(t *testing.T) {
		startGateway("direct")
		gwWait(t, l, "client", "tcp", "203.0.113.50:80", func(r lab.ProbeResult) bool { return r.OK() })
		// The pod sees the client's own address and port, so the test can recompute the kernel's jhash
		// slot and the Maglev table and predict which pod each connection reaches.
		backends := []string{
			netip.AddrPortFrom(a1.IPv4, 8080).String(), netip.AddrPortFrom(a2.IPv4, 8080).String(), netip.AddrPortFrom(b1.IPv4, 8080).String(),
		}
		table, err := maglev.Table(backends, maglev.DefaultSize)
		if err != nil {
			t.Fatal(err)
		}
		vip := netip.MustParseAddrPort("203.0.113.50:80")
		pods := map[string]int{}
		for i := 0; i < 20; i++ {
			r, err := l.Probe("client", "tcp", vip.String())
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK() {
				t.Errorf("probe %d: %v", i, r)
				continue
			}
			pods[r.Pod]++
			if r.Src.Addr() != client {
				t.Errorf("direct, snat auto: pod %s saw source %v, want the client %v", r.Pod, r.Src, client)
				continue
			}
			want := backends[table[dataplane.GatewaySlot(r.Src, vip, maglev.DefaultSize)]]
			if r.Dst.String() != want {
				t.Errorf("flow %v -> %v reached %v, the jhash slot and Maglev table predict %s", r.Src, vip, r.Dst, want)
			}
			if i < 5 {
				// vipgate explain on the gateway, reading the kernel's table, names the same backend.
				out, err := l.Exec(lab.RoleLANClient, bin, "explain", "--from", r.Src.String(), "--to", vip.String(), "--output", "json")
				var rep struct {
					Maglev      *struct{ Backend string } `json:"maglev"`
					NATFastPath *struct {
						Taken, Known bool
						To           string
					} `json:"natFastPath"`
				}
				if err != nil || json.Unmarshal([]byte(out), &rep) != nil || rep.Maglev == nil || rep.Maglev.Backend != r.Dst.String() {
					t.Errorf("vipgate explain --from %v --to %v on the gateway: want maglev backend %v (%v)\n%s", r.Src, vip, r.Dst, err, out)
				}
				// The NAT fast path took the connection: its flow entry names the same pod.
				if np := rep.NATFastPath; np == nil || !np.Taken || !np.Known || np.To != r.Dst.String() {
					t.Errorf("vipgate explain --from %v --to %v: NAT fast path %+v, want the VIP port taken and the flow known, to %v\n%s", r.Src, vip, np, r.Dst, out)
				}
			}
		}
		t.Logf("20 connections: %v", pods)
		if len(pods) < 2 {
			t.Errorf("20 connections all reached %v: want them spread", pods)
		}
		r := gwWait(t, l, "client", "tcp", "203.0.113.51:80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Src.Addr() != client {
			t.Errorf("direct eTP=Local: source %v, want the client", r.Src)
		}
		gwWait(t, l, "client", "tcp", "203.0.113.50:81", func(r lab.ProbeResult) bool { return r.Err == "refused" })
	})

	// The NAT fast path (natFastPath, on by default with direct and nodePort): the BPF program takes
	// the flows; it stays attached when the gateway ends (as the nftables table stays), and the next
	// run adopts its flow table, so connections go on through restarts: a stop, a SIGKILL, a
	// restart into the other NAT mode. Masqueraded ones too (eTP=Cluster with nodePort: snat auto),
	// whose port conntrack would not know.
	t.Run("NAT fast path: held connections survive gateway restarts", func(t *testing.T) {
		startGateway("nodePort")
		gwWait(t, l, "client", "tcp", "203.0.113.50:80", func(r lab.ProbeResult) bool { return r.OK() })
		metric := func(name string) float64 {
			t.Helper()
			code, body := ndHTTP(t, l, lab.RoleLANClient, "http://127.0.0.1:10249/metrics")
			if code != 200 {
				t.Fatalf("gateway /metrics: HTTP %d", code)
			}
			for _, line := range strings.Split(body, "\n") {
				if v, ok := strings.CutPrefix(line, name+" "); ok {
					var f float64
					fmt.Sscan(v, &f)
					return f
				}
			}
			t.Fatalf("gateway /metrics lacks %s", name)
			return 0
		}
		if metric("vipgate_gateway_nat_fast_path") != 1 {
			t.Fatalf("the NAT fast path is not on:\n%s", gw.Tail(20))
		}
		hold, err := l.StartHold(lab.RoleClient, "203.0.113.50:80", 50, 12*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hold.WaitOpened(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if n := metric(`vipgate_gateway_nat_fast_path_packets_total{what="new"}`); n < 50 {
			t.Errorf("the program took %v new flows, want the 50 held connections", n)
		}
		time.Sleep(time.Second)
		startGateway("nodePort") // stopped (SIGTERM), started again
		time.Sleep(time.Second)
		if err := gw.Kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // no gateway process: the program forwards alone
		startGateway("direct")
		if !strings.Contains(gw.Log(), "flow table adopted") {
			t.Errorf("the restarted gateway did not adopt the flow table:\n%s", gw.Tail(20))
		}
		time.Sleep(2 * time.Second)
		// This run's counters: the held connections' pings as known flows, none dealt again.
		fwd, dealt := metric(`vipgate_gateway_nat_fast_path_packets_total{what="forwarded"}`), metric(`vipgate_gateway_nat_fast_path_packets_total{what="new"}`)
		if fwd == 0 || dealt != 0 {
			t.Errorf("after the restarts: %v packets of known flows forwarded, %v new flows; want the held ones forwarded, none new", fwd, dealt)
		}
		res, err := hold.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("held connections through a stop, a SIGKILL and a mode change: %d opened, %d broken (%v)", res.Opened, res.Broken, res.Errors)
		if res.Opened != 50 || res.Broken != 0 {
			t.Errorf("held connections: %d opened, %d broken (%v); want 50, none broken", res.Opened, res.Broken, res.Errors)
		}
	})

	t.Run("nodePort: eTP=Cluster masqueraded, eTP=Local keeps the client and follows the health checks", func(t *testing.T) {
		startGateway("nodePort")
		r := gwWait(t, l, "client", "tcp", "203.0.113.50:80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Src.Addr() == client {
			t.Errorf("nodePort eTP=Cluster: the pod saw the client address %v; the gateway (snat auto) and the node masquerade it", r.Src)
		}
		// eTP=Local: both nodes have a local pod and answer 200 on 32001.
		gwWaitBackend(t, l, "203.0.113.51", node2.IPv4, true, 10*time.Second)
		gwWaitBackend(t, l, "203.0.113.51", node1.IPv4, true, 10*time.Second)
		s := gwMany(t, l, "client", "tcp", "203.0.113.51:80", 30)
		for src := range s.Sources {
			if src != client.String() {
				t.Errorf("nodePort eTP=Local: a pod saw source %s, want the client %s", src, client)
			}
		}
		if s.Pods["a1"] == 0 || s.Pods["b1"] == 0 {
			t.Errorf("nodePort eTP=Local with both nodes healthy: %v, want both a1 (node1) and b1 (node2)", s.Pods)
		}

		// The only pod on node2 goes away (its EndpointSlice loses it): node2's healthCheckNodePort
		// turns 503 and the gateway drops node2.
		w.write("loc.yaml", locSvc, locSlice(gwEp(a1, "node1")))
		took := gwWaitBackend(t, l, "203.0.113.51", node2.IPv4, false, 10*time.Second)
		t.Logf("pod removed from the EndpointSlice -> node2 out of the gateway's set: %v (node reload + probe at 250 ms + sync)", took.Round(time.Millisecond))
		s = gwMany(t, l, "client", "tcp", "203.0.113.51:80", 20)
		if s.Pods["b1"] > 0 || s.Pods["a1"] != 20 {
			t.Errorf("after node2 lost its pod: %v, want every connection on a1", s.Pods)
		}

		// The pod comes back; then node2's vipgate dies (its healthCheckNodePort stops answering).
		w.write("loc.yaml", locSvc, locSlice(gwEp(a1, "node1"), gwEp(b1, "node2")))
		took = gwWaitBackend(t, l, "203.0.113.51", node2.IPv4, true, 10*time.Second)
		t.Logf("pod back -> node2 back in the set: %v", took.Round(time.Millisecond))
		if err := nodes["node2"].Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		took = gwWaitBackend(t, l, "203.0.113.51", node2.IPv4, false, 10*time.Second)
		t.Logf("node2's vipgate killed -> node2 out of the gateway's set: %v (one refused probe, every 250 ms)", took.Round(time.Millisecond))
		t.Logf("gateway log at that point:\n%s", gw.Tail(3))
		if took > time.Second {
			t.Logf("WARNING: removal took longer than 1 s")
		}
		if !strings.Contains(gw.Log(), "health check down") {
			t.Errorf("the gateway's log does not record the health check going down")
		}
	})

	// `vipgate render` with the GatewayConfig prints the gateway ruleset; its ip table passes nft -c
	// (in a throwaway namespace: the gateway's live table must not interfere).
	t.Run("render a GatewayConfig passes nft -c", func(t *testing.T) {
		cfg := filepath.Join(dir, "gateway-nodePort.yaml")
		out := filepath.Join(dir, "gateway-render.nft")
		script := bin + " render --config " + cfg + " --manifests " + manifests + " > " + out +
			" && sed -n '/^table ip vipgate/,/^}/p' " + out + " > " + out + ".ip && unshare -n nft -c -f " + out + ".ip 2>&1"
		if res, err := l.Exec(lab.RoleLANClient, "sh", "-c", script); err != nil {
			t.Fatalf("render | nft -c: %v\n%s", err, res)
		}
		text, _ := os.ReadFile(out)
		if !strings.Contains(string(text), "jhash ip saddr . th sport . ip daddr . th dport") {
			t.Errorf("rendered gateway ruleset lacks the jhash DNAT:\n%s", text)
		}
	})
}

// gwWaitBackend polls the gateway's nftables map until node does (or does not) appear as a backend of
// vip, and returns how long that took.
func gwWaitBackend(t *testing.T, l *lab.Lab, vip string, node netip.Addr, present bool, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	needle := node.String() + " . "
	for {
		out, err := l.Exec(lab.RoleLANClient, "nft", "list", "map", "ip", "vipgate", gateway.MapGatewayBackends)
		if err == nil {
			found := false
			for _, line := range strings.Split(out, ",") {
				line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "elements = {"))
				if strings.HasPrefix(line, vip+" . ") && strings.Contains(line, ": "+needle) {
					found = true
					break
				}
			}
			if found == present {
				return time.Since(start)
			}
		}
		if time.Since(start) > timeout {
			t.Fatalf("after %v, node %s is still %s backend of %s (nft err %v)", timeout, node, map[bool]string{true: "not a", false: "a"}[present], vip, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gwSh(t *testing.T, l *lab.Lab, role string, args ...string) {
	t.Helper()
	if out, err := l.Exec(role, args...); err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), role, err, out)
	}
}

func gwConfig(forwarding string, gwIP netip.Addr, nodes ...*lab.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
gatewayIPs: [%q]
forwarding: %s
snat: auto
healthCheckInterval: 250ms
clusterCIDRs: [%q]
serviceCIDRs: [%q]
nodes:
`, gwIP, forwarding, lab.ClusterCIDRv4, lab.ServiceCIDRv4)
	for _, n := range nodes {
		fmt.Fprintf(&b, "- {name: %s, addresses: [%q]}\n", n.Name, n.IPv4)
	}
	return b.String()
}

// The gateway tests' names for the shared helpers (node_test.go, helpers_test.go).
type (
	gwPort      = ndPort
	gwSlicePort = ndSlicePort
	gwWriter    = ndWriter
)

var (
	gwBinary     = vipgateBinary
	gwNodeConfig = labNodeConfig
	gwService    = ndService
	gwStatus     = ndStatus
	gwSlice      = ndSlice
	gwEp         = ndEp
	gwWait       = ndWait
	gwMany       = ndMany
)
