package testcluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/test/lab"
)

// specCNI is the CNI of the clusters the package's tests build: EnvClusterCNI, else the default.
func specCNI() string { return os.Getenv(EnvClusterCNI) }

func TestCheckCNISpec(t *testing.T) {
	for _, tc := range []struct {
		spec    Spec
		want    string
		wantErr string
	}{
		{spec: Spec{}, want: CNIBridge},
		{spec: Spec{CNI: CNIBridge}, want: CNIBridge},
		{spec: Spec{CNI: "calico"}, wantErr: `unknown CNI "calico"`},
		{spec: Spec{CNI: CNIFlannel, Proxy: ProxyNone}, wantErr: "needs a service proxy"},
		{spec: Spec{CNI: CNIFlannel, Proxy: ProxyVipgate, BinDir: t.TempDir()}, wantErr: "flannel.tar missing"},
	} {
		spec := tc.spec
		err := checkCNISpec(&spec)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v: error %v, want one with %q", tc.spec, err, tc.wantErr)
		case tc.wantErr == "" && err != nil:
			t.Errorf("%+v: %v", tc.spec, err)
		case tc.wantErr == "" && spec.CNI != tc.want:
			t.Errorf("%+v: CNI %q, want %q", tc.spec, spec.CNI, tc.want)
		}
	}
}

// TestFlannel: a cluster on Flannel (VXLAN, nftables mode) with vipgate as the only service proxy.
// Pods on different nodes reach each other over flannel.1 (its route, a ping and HTTP, the
// source address unchanged); a LoadBalancer answers the outside client from pods on both nodes;
// with externalTrafficPolicy Local the pod sees the client's own address; a pod reaches itself
// through its Service (hairpin). The CI version of `make cluster CNI=flannel`; the longer runs
// are VIPGATE_CLUSTER_CNI=flannel for the package's other tests and `make conformance CNI=flannel`.
func TestFlannel(t *testing.T) {
	c := ownClusterSpec(t, Spec{Nodes: 2, CNI: CNIFlannel})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// What flanneld set up on each node.
	for i, n := range c.Nodes {
		st, err := c.Flannel(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: flannel.1 routes:\n%s\nsubnet.env:\n%s", n.Name, st.Routes, st.SubnetEnv)
		for j, o := range c.Nodes {
			if i == j {
				continue
			}
			// `ip route show dev flannel.1`: "10.244.2.0/24 via 10.244.2.0 onlink"
			want := fmt.Sprintf("%s via %s onlink", o.Lab.PodCIDRv4, o.Lab.PodCIDRv4.Addr())
			if !strings.Contains(st.Routes, want) {
				t.Errorf("%s: no route %q over flannel.1:\n%s", n.Name, want, st.Routes)
			}
		}
		if !strings.Contains(st.Link, "vxlan id 1 ") || !strings.Contains(st.Link, "mtu 1450") {
			t.Errorf("%s: flannel.1 is not VXLAN id 1 with MTU 1450:\n%s", n.Name, st.Link)
		}
		if !strings.Contains(st.SubnetEnv, "FLANNEL_SUBNET="+lab.PodGatewayv4(n.Lab.Index).String()+"/24") ||
			!strings.Contains(st.SubnetEnv, "FLANNEL_MTU=1450") {
			t.Errorf("%s: subnet.env is not the node's pod CIDR with MTU 1450:\n%s", n.Name, st.SubnetEnv)
		}
		if !strings.Contains(st.NFT, "chain postrtg") {
			t.Errorf("%s: no flannel nftables table (EnableNFTables):\n%s", n.Name, st.NFT)
		}
	}

	ns := "flannel"
	kubectl(t, ctx, c, "create", "namespace", ns)
	apply(t, ctx, c, fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: web, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: agnhost
          image: registry.k8s.io/e2e-test-images/agnhost:2.63.0
          args: [netexec, --http-port=8080]
          ports: [{containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /hostname, port: 8080}
            periodSeconds: 1
`, ns), lbService(ns, "cluster", "web", "", "Cluster"), lbService(ns, "local", "web", "", "Local"))
	kubectl(t, ctx, c, "-n", ns, "rollout", "status", "ds/web", "--timeout=3m")
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		byNode[p.Spec.NodeName] = p
	}
	a, b := byNode[c.Nodes[0].Name], byNode[c.Nodes[1].Name]
	if a.Name == "" || b.Name == "" {
		t.Fatalf("want a web pod on each node, have %v", byNode)
	}

	t.Run("cross-node pods over VXLAN", func(t *testing.T) {
		out, err := c.Lab.ExecContext(ctx, c.Nodes[0].Name, "ip", "-4", "route", "get", b.Status.PodIP)
		if err != nil || !strings.Contains(out, "dev flannel.1") {
			t.Errorf("node1's route to %s (on node2): %q, %v; want dev flannel.1", b.Status.PodIP, out, err)
		}
		t.Logf("node1: ip route get %s: %s", b.Status.PodIP, strings.TrimSpace(out))
		mtu := kubectl(t, ctx, c, "-n", ns, "exec", a.Name, "--", "cat", "/sys/class/net/eth0/mtu")
		if strings.TrimSpace(mtu) != "1450" {
			t.Errorf("pod eth0 MTU %q, want 1450 (VXLAN)", strings.TrimSpace(mtu))
		}
		ping := kubectl(t, ctx, c, "-n", ns, "exec", a.Name, "--", "ping", "-c", "3", "-W", "2", b.Status.PodIP)
		if !strings.Contains(ping, "3 packets received") {
			t.Errorf("ping %s from %s:\n%s", b.Status.PodIP, a.Name, ping)
		}
		// A full-size TCP exchange: 1450-byte pod MTU through the 1500-byte LAN.
		got := kubectl(t, ctx, c, "-n", ns, "exec", a.Name, "--", "curl", "-sS", "-m", "5",
			"http://"+net.JoinHostPort(b.Status.PodIP, "8080")+"/clientip")
		host, _, _ := net.SplitHostPort(strings.TrimSpace(got))
		if host != a.Status.PodIP {
			t.Errorf("pod %s on node2 saw the client %q, want pod %s's own %s (no SNAT between pods)", b.Name, got, a.Name, a.Status.PodIP)
		}
		t.Logf("%s (node1) -> %s (node2): %s; the server saw %s", a.Status.PodIP, b.Status.PodIP, lastLine(ping), strings.TrimSpace(got))
	})

	t.Run("LoadBalancer from outside", func(t *testing.T) {
		ip := waitService(t, ctx, c, ns, "cluster").Status.LoadBalancer.Ingress[0].IP
		seen := map[string]bool{}
		if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			out, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+net.JoinHostPort(ip, "8080")+"/hostname")
			if err != nil {
				return err
			}
			seen[strings.TrimSpace(out)] = true
			if !seen[a.Name] || !seen[b.Name] {
				return fmt.Errorf("answered by %v so far", seen)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("LoadBalancer %s (externalTrafficPolicy Cluster) answered by the pods of both nodes: %v", ip, seen)
		// Masqueraded once, by the node the router chose, to its address on the way to the pod:
		// cni0's (10.244.N.1) for a pod of its own, flannel.1's (10.244.N.0) for another node's.
		var saw []string
		for range 4 {
			cl, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+net.JoinHostPort(ip, "8080")+"/clientip")
			if err != nil {
				t.Fatal(err)
			}
			host, _, _ := net.SplitHostPort(strings.TrimSpace(cl))
			if a, err := netip.ParseAddr(host); err != nil || !lab.ClusterCIDRv4.Contains(a) {
				t.Errorf("externalTrafficPolicy Cluster: the pod saw the client as %q, want a node's pod-network address (masqueraded once)", cl)
			}
			saw = append(saw, host)
		}
		t.Logf("externalTrafficPolicy Cluster: the pods saw the client as %v", saw)
	})

	t.Run("externalTrafficPolicy Local keeps the client IP", func(t *testing.T) {
		ip := waitService(t, ctx, c, ns, "local").Status.LoadBalancer.Ingress[0].IP
		seen := map[string]string{}
		if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			for range 6 {
				name, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+net.JoinHostPort(ip, "8080")+"/hostname")
				if err != nil {
					return err
				}
				cl, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+net.JoinHostPort(ip, "8080")+"/clientip")
				if err != nil {
					return err
				}
				seen[strings.TrimSpace(name)] = strings.TrimSpace(cl)
				host, _, _ := net.SplitHostPort(strings.TrimSpace(cl))
				if host != lab.Clientv4.String() {
					return errStop{fmt.Errorf("the pod saw the client as %q, want %s", cl, lab.Clientv4)}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("LoadBalancer %s (externalTrafficPolicy Local): pods saw %v", ip, seen)
	})

	t.Run("hairpin through the Service", func(t *testing.T) {
		svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "cluster", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// From pod a to the ClusterIP until pod a itself answered (both pods are endpoints).
		if err := poll(ctx, time.Minute, func(ctx context.Context) error {
			out, err := c.Kubectl(ctx, "", "-n", ns, "exec", a.Name, "--", "curl", "-sS", "-m", "2",
				"http://"+net.JoinHostPort(svc.Spec.ClusterIP, "8080")+"/hostname")
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) != a.Name {
				return fmt.Errorf("answered by %s", strings.TrimSpace(out))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
