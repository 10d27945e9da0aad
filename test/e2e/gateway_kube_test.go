package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestGatewayKube runs `vipgate gateway --kubeconfig` against a real kube-apiserver (in the lab's
// LAN client namespace), with forwarding: route in front of two nodes running `vipgate node
// --kubeconfig`. An externalTrafficPolicy=Local LoadBalancer Service created through the API (the API
// server allocates its healthCheckNodePort) is reached from the client through the gateway, only on
// the node with the endpoint, and the pod sees the client's own address: no NAT anywhere on the path.
// Then the API server goes away: traffic keeps flowing, a gateway restarted meanwhile says why it
// cannot sync and keeps the table in place, and after the API server is back a change applies.
func TestGatewayKube(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"kg1"}},
		{Name: "node2", Pods: []string{"kg2"}},
		{Name: "gw1"},
	}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := vipgateBinary(t)
	dir := t.TempDir()
	procs := map[string]*lab.Proc{}
	for _, name := range []string{"node1", "node2"} {
		n := l.Node(name)
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, filepath.Join(dir, n.Name+".log"), bin, "node", "--config", cfg, "--kubeconfig", srv.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	gw := l.Node("gw1")
	gwCfg := filepath.Join(dir, "gw1.yaml")
	if err := os.WriteFile(gwCfg, []byte(fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [%q]
forwarding: route
healthCheckInterval: 250ms
`, gw.IPv4)), 0o644); err != nil {
		t.Fatal(err)
	}
	startGW := func(i int) *lab.Proc {
		p, err := l.Start("gw1", filepath.Join(dir, fmt.Sprintf("gw1-%d.log", i)), bin, "gateway", "--config", gwCfg, "--kubeconfig", srv.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		procs["gw1"] = p
		return p
	}
	startGW(0)
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
	vip := netip.MustParseAddr("203.0.113.40")
	if err := l.AddRoute(netip.PrefixFrom(vip, 32), "gw1"); err != nil {
		t.Fatal(err)
	}

	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gwweb", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatalf("the API server allocated no healthCheckNodePort: %+v", svc.Spec)
	}
	kg1, kg2 := l.Pod("kg1"), l.Pod("kg2")
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "gwweb-1", Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: "gwweb", discoveryv1.LabelManagedBy: "vipgate-e2e",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{kg1.IPv4.String()}, NodeName: new("node1")}},
	}
	if slice, err = c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: vip.String()}}
	if _, err := c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	target := netip.AddrPortFrom(vip, 80).String()
	r := kubeWaitProbe(t, l, target, func(r lab.ProbeResult) bool { return r.OK() })
	t.Logf("API write -> first answer through the gateway: %v", time.Since(written).Round(time.Millisecond))
	s, err := l.ProbeMany(lab.RoleClient, "tcp", target, 20, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if s.OK != s.Sent || s.Pods[kg1.Name] != s.Sent || s.Sources[lab.Clientv4.String()] != s.Sent {
		t.Errorf("eTP=Local through a routing gateway: want every probe answered by %s seeing the client %s, got pods %v sources %v errors %v (first: %v)",
			kg1.Name, lab.Clientv4, s.Pods, s.Sources, s.Errors, r)
	}

	t.Run("API server unreachable", func(t *testing.T) {
		srv.Stop()
		// A gateway (re)started while the API is away cannot sync: it says so and leaves the table.
		if err := procs["gw1"].Stop(); err != nil {
			t.Logf("stopping the gateway: %v", err)
		}
		p := startGW(1)
		s, err := l.ProbeMany(lab.RoleClient, "tcp", target, 30, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK != s.Sent {
			t.Errorf("API server down, gateway restarted: %d of %d answered (%v)", s.OK, s.Sent, s.Errors)
		}
		if !strings.Contains(p.Log(), "cannot reach the Kubernetes API server") {
			t.Errorf("the restarted gateway does not say why it cannot sync:\n%s", p.Tail(20))
		}
		if strings.Contains(p.Log(), "synced") {
			t.Errorf("the gateway synced without the API:\n%s", p.Tail(20))
		}
	})

	t.Run("change after the API server is back", func(t *testing.T) {
		srv.Restart(t)
		// The endpoint moves to node2: the gateway's health checks follow it.
		slice.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{kg2.IPv4.String()}, NodeName: new("node2")}}
		if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		kubeWaitProbe(t, l, target, func(r lab.ProbeResult) bool { return r.Pod == kg2.Name && r.Src.Addr() == lab.Clientv4 })
		t.Logf("API write after the outage -> the endpoint's new node serves through the gateway: %v", time.Since(written).Round(time.Millisecond))
	})
}

// TestGatewayRouteDualStack: forwarding route in a dual-stack lab, IPv4 and IPv6 VIPs of one Service
// through one gateway (nf_dup_ipv6 with the node as next hop for IPv6), eTP=Local, client address
// kept in both families.
func TestGatewayRouteDualStack(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(map[bool]string{false: "dup", true: "fastPath"}[fast], func(t *testing.T) { testGatewayRouteDualStack(t, fast) })
	}
}

// testGatewayRouteDualStack is TestGatewayRouteDualStack with route forwarding's netdev fast path
// (routeFastPath) or without.
func testGatewayRouteDualStack(t *testing.T, fast bool) {
	extra := routeDupConfig
	if fast {
		extra = routeFastPathConfig
	}
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"d1"}},
		{Name: "node2", Pods: []string{"d2"}},
		{Name: "gw1"},
	}})
	bin := vipgateBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	d1 := l.Pod("d1")
	vip4, vip6 := netip.MustParseAddr("203.0.113.41"), netip.MustParseAddr("2001:db8:ff::41")
	w := &ndWriter{t: t, dir: manifests}
	w.write("svc.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: ds, namespace: e2e}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 32041
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.9.41
  clusterIPs: [10.96.9.41, "2001:db8:96::41"]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30941}]
status:
  loadBalancer:
    ingress: [{ip: %s}, {ip: %q}]
`, vip4, vip6),
		ndSlice("ds", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(d1, "node1")),
		ndSlice("ds", "IPv6", []ndSlicePort{{"http", "TCP", 8080}}, ndEp6(d1, "node1")))
	procs := map[string]*lab.Proc{}
	var nodes strings.Builder
	for _, name := range []string{"node1", "node2"} {
		n := l.Node(name)
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(name, filepath.Join(dir, name+".log"), bin, "node", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		procs[name] = p
		fmt.Fprintf(&nodes, "- {name: %s, addresses: [%q, %q]}\n", name, n.IPv4, n.IPv6)
	}
	gw := l.Node("gw1")
	gwCfg := filepath.Join(dir, "gw1.yaml")
	if err := os.WriteFile(gwCfg, []byte(fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [%q, %q]
forwarding: route
healthCheckInterval: 250ms
%snodes:
%s`, gw.IPv4, gw.IPv6, extra, nodes.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := l.Start("gw1", filepath.Join(dir, "gw1.log"), bin, "gateway", "--config", gwCfg, "--manifests", manifests)
	if err != nil {
		t.Fatal(err)
	}
	procs["gw1"] = p
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
	for _, v := range []netip.Addr{vip4, vip6} {
		if err := l.AddRoute(netip.PrefixFrom(v, v.BitLen()), "gw1"); err != nil {
			t.Fatal(err)
		}
	}
	if fast {
		// The fast path's ingress chains are added after the gateway's first flows could pass
		// (the netdev table is seeded from the family table's connection table before it takes
		// traffic): wait for them, so that every probe below goes through the fast path.
		for _, nd := range []string{"vipgate-fwd4", "vipgate-fwd6"} {
			hooked := false
			for deadline := time.Now().Add(10 * time.Second); !hooked && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				out, _ := l.Exec("gw1", "nft", "list", "table", "netdev", nd)
				hooked = strings.Contains(out, "hook ingress")
			}
			if !hooked {
				t.Fatalf("table netdev %s has no ingress chain 10 s after the gateway started", nd)
			}
		}
	}
	for _, c := range []struct {
		vip    netip.Addr
		client netip.Addr
	}{{vip4, lab.Clientv4}, {vip6, lab.Clientv6}} {
		target := netip.AddrPortFrom(c.vip, 80).String()
		ndWait(t, l, lab.RoleClient, "tcp", target, func(r lab.ProbeResult) bool { return r.OK() })
		s := ndMany(t, l, lab.RoleClient, "tcp", target, 20)
		if s.Pods[d1.Name] != s.Sent || s.Sources[c.client.String()] != s.Sent {
			t.Errorf("%s through the routing gateway: pods %v, sources %v; want %s seeing %s every time", target, s.Pods, s.Sources, d1.Name, c.client)
		}
	}
	if fast {
		// The packets write the connection table of the table that forwarded them: the netdev ones.
		for _, tb := range []struct{ family, fast, ip string }{{"IPv4", "vipgate-fwd4", "ip"}, {"IPv6", "vipgate-fwd6", "ip6"}} {
			fastFlows, _ := l.Exec("gw1", "nft", "list", "map", "netdev", tb.fast, gateway.MapGatewayFlows)
			ipFlows, _ := l.Exec("gw1", "nft", "list", "map", tb.ip, "vipgate", gateway.MapGatewayFlows)
			if !strings.Contains(fastFlows, " expires ") || strings.Contains(ipFlows, " expires ") {
				t.Errorf("%s: the flows are not in the fast path's connection table:\nnetdev:\n%s\n%s:\n%s", tb.family, fastFlows, tb.ip, ipFlows)
			}
		}
	}
}
