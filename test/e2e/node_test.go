package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestNodeDataplane proves the node dataplane's Service semantics with real packets: one lab (node1
// with pods a1 and a2, node2 with pod b1), `vipgate node` in both nodes reading the same manifest
// directory, and one subtest per semantic that rewrites the manifests and probes until the expected
// behaviour shows (no fixed sleeps as assertions). Each probe checks which pod answered and which
// source address it saw.
func TestNodeDataplane(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := vipgateBinary(t)
	dir, manifests, procs := ndStartNodes(t, l, bin, func(n *lab.Node) string {
		zone := "zone-b"
		if n.Name == "node1" {
			zone = "zone-a"
		}
		// The lbc Service's externalIP 203.0.113.20: externalIPs are off by default (KEP-5707).
		return ndNodeConfig(n, zone) + ndExternalIPsLab
	})
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	node1 := l.Node("node1")
	client := netip.MustParseAddr("198.51.100.10")

	w := &ndWriter{t: t, dir: manifests}

	t.Run("ClusterIP TCP and UDP, named ports, random choice, pod source kept", func(t *testing.T) {
		start := time.Now()
		w.write("web.yaml", ndService("web", "ClusterIP", "10.96.1.1", "", []ndPort{{"http", "TCP", 80, 0, "http"}, {"dns", "UDP", 53, 0, "dns"}, {"alt", "TCP", 81, 0, "alt"}}),
			ndSlice("web", "IPv4", []ndSlicePort{{"http", "TCP", 8080}, {"dns", "UDP", 8080}, {"alt", "TCP", 8081}}, ndEp(a1, "node1"), ndEp(a2, "node1"), ndEp(b1, "node2")))
		r := ndWait(t, l, "b1", "tcp", "10.96.1.1:80", func(r lab.ProbeResult) bool { return r.OK() })
		t.Logf("manifest written -> first answer through the new ClusterIP: %v", time.Since(start).Round(time.Millisecond))
		_ = r
		s := ndMany(t, l, "b1", "tcp", "10.96.1.1:80", 30)
		if len(s.Pods) < 2 {
			t.Errorf("30 connections all went to %v: want a random choice among 3 pods", s.Pods)
		}
		for src := range s.Sources {
			if src != b1.IPv4.String() && src != "10.244.2.1" { // hairpin to b1 itself is masqueraded
				t.Errorf("pod b1 -> ClusterIP: a server saw source %s, want b1's own address (no SNAT)", src)
			}
		}
		u := ndWait(t, l, "a1", "udp", "10.96.1.1:53", func(r lab.ProbeResult) bool { return r.OK() })
		if u.Dst.Port() != 8080 {
			t.Errorf("UDP port 53 reached %v, want target port 8080 (named port dns)", u.Dst)
		}
		alt := ndWait(t, l, "b1", "tcp", "10.96.1.1:81", func(r lab.ProbeResult) bool { return r.OK() })
		if alt.Dst.Port() != 8081 {
			t.Errorf("port 81 reached %v, want 8081 (named port alt)", alt.Dst)
		}
		// From outside the cluster CIDRs (client routed via node1): masqueraded.
		c := ndWait(t, l, "client", "tcp", "10.96.1.1:80", func(r lab.ProbeResult) bool { return r.OK() })
		if c.Src.Addr() == client {
			t.Errorf("client -> ClusterIP kept the client source %v: traffic from outside the cluster must be masqueraded", c.Src)
		}
		// Undefined port of a ClusterIP: rejected.
		ndWait(t, l, "b1", "tcp", "10.96.1.1:99", func(r lab.ProbeResult) bool { return r.Err == "refused" })
	})

	t.Run("headless Service gets no rules", func(t *testing.T) {
		w.write("headless.yaml", ndService("headless", "ClusterIP", "None", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("headless", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1")))
		out := ndNft(t, l, "node1")
		if strings.Contains(out, "headless") {
			t.Errorf("headless Service appears in the ruleset")
		}
	})

	t.Run("NodePort on node addresses only, SNAT", func(t *testing.T) {
		w.write("np.yaml", ndService("np", "NodePort", "10.96.1.2", "", []ndPort{{"http", "TCP", 80, 30080, "http"}, {"dns", "UDP", 53, 30053, "dns"}}),
			ndSlice("np", "IPv4", []ndSlicePort{{"http", "TCP", 8080}, {"dns", "UDP", 8080}}, ndEp(a1, "node1"), ndEp(b1, "node2")))
		r := ndWait(t, l, "client", "tcp", node1.IPv4.String()+":30080", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Src.Addr() == client {
			t.Errorf("NodePort with eTP=Cluster kept the client source: want SNAT")
		}
		ndWait(t, l, "client", "udp", node1.IPv4.String()+":30053", func(r lab.ProbeResult) bool { return r.OK() })
		ndWait(t, l, "client", "tcp", "["+node1.IPv6.String()+"]:30080", func(r lab.ProbeResult) bool { return r.Err != "" || r.OK() })
		// Never on loopback: 127.0.0.1:30080 on node1 is not DNATed (nothing listens there).
		lo, err := l.Probe("node1", "tcp", "127.0.0.1:30080")
		if err != nil {
			t.Fatal(err)
		}
		if lo.OK() {
			t.Errorf("NodePort answered on 127.0.0.1 (%v): NodePorts must never be on loopback", lo)
		}
	})

	t.Run("LoadBalancer IP and externalIP, eTP Cluster and Local", func(t *testing.T) {
		w.write("lb.yaml",
			ndService("lbc", "LoadBalancer", "10.96.1.3", "Cluster", []ndPort{{"http", "TCP", 80, 30081, "http"}}, "  externalIPs: [203.0.113.20]\n", ndStatus("203.0.113.10")),
			ndSlice("lbc", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1"), ndEp(b1, "node2")),
			ndService("lbl", "LoadBalancer", "10.96.1.4", "Local", []ndPort{{"http", "TCP", 80, 30082, "http"}}, "  healthCheckNodePort: 32001\n", ndStatus("203.0.113.11")),
			ndSlice("lbl", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1"), ndEp(a2, "node1"), ndEp(b1, "node2")),
			ndService("lbr", "LoadBalancer", "10.96.1.5", "Local", []ndPort{{"http", "TCP", 80, 30083, "http"}}, "  healthCheckNodePort: 32002\n", ndStatus("203.0.113.12")),
			ndSlice("lbr", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(b1, "node2")))
		r := ndWait(t, l, "client", "tcp", "203.0.113.10:80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Src.Addr() == client {
			t.Errorf("eTP=Cluster LB IP kept the client source")
		}
		ndWait(t, l, "client", "tcp", "203.0.113.20:80", func(r lab.ProbeResult) bool { return r.OK() })
		ndWait(t, l, "client", "tcp", "203.0.113.11:80", func(r lab.ProbeResult) bool { return r.OK() })
		s := ndMany(t, l, "client", "tcp", "203.0.113.11:80", 20)
		for pod := range s.Pods {
			if pod != "a1" && pod != "a2" {
				t.Errorf("eTP=Local via node1 reached %s: only node1's pods may answer", pod)
			}
		}
		for src := range s.Sources {
			if src != client.String() {
				t.Errorf("eTP=Local: a pod saw source %s, want the client's %s", src, client)
			}
		}
		// Only endpoint on node2: via node1 the external client is dropped (no answer, not refused)...
		ndWait(t, l, "client", "tcp", "203.0.113.12:80", func(r lab.ProbeResult) bool { return r.Err == "timeout" })
		// ...but a pod on node1 short-circuits to the cluster-wide endpoints.
		ndWait(t, l, "a1", "tcp", "203.0.113.12:80", func(r lab.ProbeResult) bool { return r.Pod == "b1" })

		// healthCheckNodePort: 200 with local endpoints, 503 without, kube-proxy's JSON body.
		code, body := ndHTTP(t, l, "lanclient", "http://"+node1.IPv4.String()+":32001/")
		if code != 200 || !strings.Contains(body, `"localEndpoints": 2`) {
			t.Errorf("healthCheckNodePort of lbl on node1: %d %s, want 200 with 2 local endpoints", code, body)
		}
		code, body = ndHTTP(t, l, "lanclient", "http://"+node1.IPv4.String()+":32002/")
		if code != 503 || !strings.Contains(body, `"localEndpoints": 0`) {
			t.Errorf("healthCheckNodePort of lbr on node1: %d %s, want 503 with 0 local endpoints", code, body)
		}
	})

	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		w.write("itp.yaml", ndService("itp", "ClusterIP", "10.96.1.6", "", []ndPort{{"http", "TCP", 80, 0, "http"}}, "  internalTrafficPolicy: Local\n"),
			ndSlice("itp", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1"), ndEp(b1, "node2")))
		ndWait(t, l, "a2", "tcp", "10.96.1.6:80", func(r lab.ProbeResult) bool { return r.OK() })
		s := ndMany(t, l, "a2", "tcp", "10.96.1.6:80", 15)
		if s.Pods["b1"] > 0 {
			t.Errorf("iTP=Local from node1 reached b1 on node2: %v", s.Pods)
		}
		w.write("itp.yaml", ndService("itp", "ClusterIP", "10.96.1.6", "", []ndPort{{"http", "TCP", 80, 0, "http"}}, "  internalTrafficPolicy: Local\n"),
			ndSlice("itp", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(b1, "node2")))
		ndWait(t, l, "a2", "tcp", "10.96.1.6:80", func(r lab.ProbeResult) bool { return r.Err == "timeout" })
	})

	t.Run("hairpin: a pod reaches itself through its Service", func(t *testing.T) {
		w.write("self.yaml", ndService("self", "ClusterIP", "10.96.1.7", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("self", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1")))
		r := ndWait(t, l, "a1", "tcp", "10.96.1.7:80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Pod != "a1" || r.Src.Addr() == a1.IPv4 {
			t.Errorf("hairpin: %v, want a1 answering a masqueraded source", r)
		}
	})

	t.Run("no endpoints rejects; terminating fallback", func(t *testing.T) {
		w.write("empty.yaml", ndService("empty", "ClusterIP", "10.96.1.8", "", []ndPort{{"http", "TCP", 80, 0, "http"}}))
		ndWait(t, l, "a1", "tcp", "10.96.1.8:80", func(r lab.ProbeResult) bool { return r.Err == "refused" })
		w.write("term.yaml", ndService("term", "ClusterIP", "10.96.1.9", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("term", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEpCond(a1, "node1", false, true, true)))
		ndWait(t, l, "b1", "tcp", "10.96.1.9:80", func(r lab.ProbeResult) bool { return r.Pod == "a1" })
		w.write("term.yaml", ndService("term", "ClusterIP", "10.96.1.9", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("term", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEpCond(a1, "node1", false, false, true)))
		ndWait(t, l, "b1", "tcp", "10.96.1.9:80", func(r lab.ProbeResult) bool { return r.Err == "refused" })
	})

	t.Run("session affinity ClientIP", func(t *testing.T) {
		w.write("aff.yaml", ndService("aff", "ClusterIP", "10.96.1.10", "", []ndPort{{"http", "TCP", 80, 0, "http"}}, "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 60\n"),
			ndSlice("aff", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1"), ndEp(a2, "node1"), ndEp(b1, "node2")))
		ndWait(t, l, "b1", "tcp", "10.96.1.10:80", func(r lab.ProbeResult) bool { return r.OK() })
		s := ndMany(t, l, "b1", "tcp", "10.96.1.10:80", 12)
		if len(s.Pods) != 1 {
			t.Errorf("session affinity: 12 connections from one client went to %v, want one pod", s.Pods)
		}
	})

	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		w.write("fw.yaml",
			ndService("fwok", "LoadBalancer", "10.96.1.11", "Cluster", []ndPort{{"http", "TCP", 80, 30084, "http"}}, "  loadBalancerSourceRanges: [198.51.100.0/24]\n", ndStatus("203.0.113.13")),
			ndSlice("fwok", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1")),
			ndService("fwno", "LoadBalancer", "10.96.1.12", "Cluster", []ndPort{{"http", "TCP", 80, 30085, "http"}}, "  loadBalancerSourceRanges: [192.0.2.0/24]\n", ndStatus("203.0.113.14")),
			ndSlice("fwno", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1")))
		ndWait(t, l, "client", "tcp", "203.0.113.13:80", func(r lab.ProbeResult) bool { return r.OK() })
		ndWait(t, l, "client", "tcp", "203.0.113.14:80", func(r lab.ProbeResult) bool { return r.Err == "timeout" })
	})

	t.Run("UDP conntrack entries of a removed endpoint are deleted", func(t *testing.T) {
		w.write("udp.yaml", ndService("udp", "ClusterIP", "10.96.1.13", "", []ndPort{{"dns", "UDP", 53, 0, "dns"}}),
			ndSlice("udp", "IPv4", []ndSlicePort{{"dns", "UDP", 8080}}, ndEp(a2, "node1"), ndEp(b1, "node2")))
		ndWait(t, l, "a1", "udp", "10.96.1.13:53", func(r lab.ProbeResult) bool { return r.Pod == "b1" })
		w.write("udp.yaml", ndService("udp", "ClusterIP", "10.96.1.13", "", []ndPort{{"dns", "UDP", 53, 0, "dns"}}),
			ndSlice("udp", "IPv4", []ndSlicePort{{"dns", "UDP", 8080}}, ndEp(a2, "node1")))
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, _ := l.Exec("node1", "conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.1.13")
			if !strings.Contains(out, "src="+b1.IPv4.String()) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("conntrack still holds a UDP entry to the removed endpoint b1:\n%s", out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		ndWait(t, l, "a1", "udp", "10.96.1.13:53", func(r lab.ProbeResult) bool { return r.Pod == "a2" })
	})

	t.Run("IPv6 ClusterIP and LoadBalancer IP", func(t *testing.T) {
		w.write("v6.yaml", ndServiceV6("v6", "2001:db8:96::a", "2001:db8:ff::10"),
			ndSlice("v6", "IPv6", []ndSlicePort{{"http", "TCP", 8080}}, ndEp6(a1, "node1"), ndEp6(b1, "node2")))
		r := ndWait(t, l, "b1", "tcp", "[2001:db8:96::a]:80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Pod == "a1" && r.Src.Addr() != b1.IPv6 {
			t.Errorf("IPv6 pod -> ClusterIP: source %v, want b1's %v", r.Src, b1.IPv6)
		}
		ndWait(t, l, "client", "tcp", "[2001:db8:ff::10]:80", func(r lab.ProbeResult) bool { return r.OK() })
	})

	t.Run("topology hints", func(t *testing.T) {
		w.write("topo.yaml", ndService("topo", "ClusterIP", "10.96.1.14", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("topo", "IPv4", []ndSlicePort{{"http", "TCP", 8080}},
				ndEp(a1, "node1")+"  hints:\n    forZones: [{name: zone-a}]\n",
				ndEp(b1, "node2")+"  hints:\n    forZones: [{name: zone-b}]\n"))
		ndWait(t, l, "a2", "tcp", "10.96.1.14:80", func(r lab.ProbeResult) bool { return r.OK() })
		s := ndMany(t, l, "a2", "tcp", "10.96.1.14:80", 15)
		if s.Pods["b1"] > 0 || s.Pods["a1"] == 0 {
			t.Errorf("zone hints from node1 (zone-a): %v, want only a1", s.Pods)
		}
	})

	t.Run("bad input is rejected alone", func(t *testing.T) {
		w.write("bad.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: e2e}\nspec:\n  type: NodePort\n  clusterIP: 10.96.1.15\n  ports: [{port: 80, nodePort: 99, protocol: TCP}]\n",
			"this: is: not: yaml: [")
		w.write("good-after-bad.yaml", ndService("good", "ClusterIP", "10.96.1.16", "", []ndPort{{"http", "TCP", 80, 0, "http"}}),
			ndSlice("good", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a2, "node1")))
		ndWait(t, l, "b1", "tcp", "10.96.1.16:80", func(r lab.ProbeResult) bool { return r.Pod == "a2" })
		ndWait(t, l, "b1", "tcp", "10.96.1.1:80", func(r lab.ProbeResult) bool { return r.OK() })
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(procs["node1"].Log(), "broken") {
			if time.Now().After(deadline) {
				t.Fatalf("vipgate's log does not name the rejected Service e2e/broken")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	// Checked in a throwaway namespace (unshare -n): nft -c checks against the namespace's ruleset, and
	// node1 already holds the live table.
	t.Run("render passes nft -c", func(t *testing.T) {
		cfg := filepath.Join(dir, "node1.yaml")
		out, err := l.Exec("node1", "sh", "-c", bin+" render --config "+cfg+" --manifests "+manifests+" > "+filepath.Join(dir, "render.nft")+" 2>/dev/null && unshare -n nft -c -f "+filepath.Join(dir, "render.nft")+" 2>&1")
		if err != nil {
			rendered, _ := os.ReadFile(filepath.Join(dir, "render.nft"))
			t.Logf("rendered ruleset:\n%s", rendered)
		}
		if err != nil {
			t.Fatalf("render | nft -c: %v\n%s", err, out)
		}
	})
}

// ndExternalIPsLab turns spec.externalIPs on within the lab's VIP ranges (they are off by default,
// KEP-5707); append it to ndNodeConfig's config.
const ndExternalIPsLab = "externalIPs: {allowedCIDRs: [\"203.0.113.0/24\", \"2001:db8:ff::/64\"]}\n"

// ndExternalIPsAny turns spec.externalIPs on everywhere, kube-proxy's behaviour.
const ndExternalIPsAny = "externalIPs: {allowedCIDRs: [\"0.0.0.0/0\", \"::/0\"]}\n"

func ndNodeConfig(n *lab.Node, zone string) string {
	ips := fmt.Sprintf("%q", n.IPv4)
	cidrs, svcs := `"10.244.0.0/16"`, `"10.96.0.0/16"`
	if n.IPv6.IsValid() {
		ips += fmt.Sprintf(", %q", n.IPv6)
		cidrs += `, "2001:db8:244::/48"`
		svcs += `, "2001:db8:96::/108"`
	}
	return fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: %s
nodeIPs: [%s]
clusterCIDRs: [%s]
serviceCIDRs: [%s]
nodeZone: %s
healthzBindAddress: "127.0.0.1:10256"
metricsBindAddress: "127.0.0.1:10249"
`, n.Name, ips, cidrs, svcs, zone)
}

type ndPort struct {
	name, proto string
	port        int
	nodePort    int
	target      string
}

type ndSlicePort struct {
	name, proto string
	port        int
}

func ndService(name, typ, clusterIP, etp string, ports []ndPort, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: e2e\nspec:\n  type: %s\n  clusterIP: %s\n", name, typ, clusterIP)
	if clusterIP != "None" {
		fmt.Fprintf(&b, "  clusterIPs: [%s]\n", clusterIP)
	}
	if etp != "" {
		fmt.Fprintf(&b, "  externalTrafficPolicy: %s\n", etp)
	}
	b.WriteString("  ports:\n")
	for _, p := range ports {
		fmt.Fprintf(&b, "  - {name: %s, protocol: %s, port: %d, targetPort: %s", p.name, p.proto, p.port, p.target)
		if p.nodePort != 0 {
			fmt.Fprintf(&b, ", nodePort: %d", p.nodePort)
		}
		b.WriteString("}\n")
	}
	status := ""
	for _, e := range extra {
		if strings.HasPrefix(e, "status:") {
			status = e
			continue
		}
		b.WriteString(e)
	}
	b.WriteString(status)
	return b.String()
}

func ndServiceV6(name, clusterIP, lbIP string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: e2e}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Cluster
  ipFamilies: [IPv6]
  clusterIP: %s
  clusterIPs: [%s]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: http, nodePort: 30090}]
status:
  loadBalancer:
    ingress: [{ip: %s}]
`, name, clusterIP, clusterIP, lbIP)
}

func ndStatus(ip string) string {
	return fmt.Sprintf("status:\n  loadBalancer:\n    ingress: [{ip: %s}]\n", ip)
}

func ndSlice(svc, family string, ports []ndSlicePort, eps ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-%s\n  namespace: e2e\n  labels: {kubernetes.io/service-name: %s}\naddressType: %s\nports:\n", svc, strings.ToLower(family), svc, family)
	for _, p := range ports {
		fmt.Fprintf(&b, "- {name: %s, protocol: %s, port: %d}\n", p.name, p.proto, p.port)
	}
	b.WriteString("endpoints:\n")
	if len(eps) == 0 {
		return strings.Replace(b.String(), "endpoints:\n", "endpoints: []\n", 1)
	}
	for _, e := range eps {
		b.WriteString(e)
	}
	return b.String()
}

func ndEp(p *lab.Pod, node string) string { return ndEpCond(p, node, true, true, false) }

func ndEp6(p *lab.Pod, node string) string {
	return fmt.Sprintf("- addresses: [%q]\n  nodeName: %s\n  conditions: {ready: true, serving: true, terminating: false}\n", p.IPv6, node)
}

func ndEpCond(p *lab.Pod, node string, ready, serving, terminating bool) string {
	return fmt.Sprintf("- addresses: [%q]\n  nodeName: %s\n  conditions: {ready: %v, serving: %v, terminating: %v}\n", p.IPv4, node, ready, serving, terminating)
}

// ndWriter writes manifest files atomically (write + rename), as an editor or a config tool would.
type ndWriter struct {
	t   *testing.T
	dir string
}

func (w *ndWriter) write(name string, docs ...string) {
	w.t.Helper()
	tmp := filepath.Join(w.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(w.dir, name)); err != nil {
		w.t.Fatal(err)
	}
}

// ndWait probes until ok holds (10 s at most): vipgate applies a manifest change within about a second.
func ndWait(t *testing.T, l *lab.Lab, from, proto, hostport string, ok func(lab.ProbeResult) bool) lab.ProbeResult {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := l.Probe(from, proto, hostport)
		if err != nil {
			t.Fatal(err)
		}
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s from %s: last result %v never became what the test waits for", proto, hostport, from, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ndMany(t *testing.T, l *lab.Lab, from, proto, hostport string, n int) lab.ProbeSummary {
	t.Helper()
	s, err := l.ProbeMany(from, proto, hostport, n, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if s.OK != n {
		t.Errorf("%s %s from %s: %d of %d probes answered (%v)", proto, hostport, from, s.OK, n, s.Errors)
	}
	return s
}

func ndNft(t *testing.T, l *lab.Lab, node string) string {
	t.Helper()
	out, err := l.Exec(node, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v\n%s", node, err, out)
	}
	return out
}

// ndHTTP GETs url from inside a lab namespace (the socket is created in that namespace).
func ndHTTP(t *testing.T, l *lab.Lab, role, url string) (int, string) {
	t.Helper()
	dial := apiserver.DialerInNetns(l.NS(role))
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dial(ctx, network, addr)
	}}}
	var lastErr error
	for i := 0; i < 30; i++ {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("GET %s from %s: %v", url, role, lastErr)
	return 0, ""
}

// ndStartNodes starts `vipgate node` in every node of l on one shared manifest directory, each with
// the NodeConfig config(n) (written to dir/<node>.yaml, its log to dir/<node>.log), shows the tails
// of their logs when the test failed, and routes the client's ClusterIP and VIP ranges through
// node1, as a static route to a node would. It returns dir, the manifest directory and the
// processes by node.
func ndStartNodes(t *testing.T, l *lab.Lab, bin string, config func(n *lab.Node) string) (dir, manifests string, procs map[string]*lab.Proc) {
	t.Helper()
	dir = t.TempDir()
	manifests = filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	procs = map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		cfg := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(config(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, filepath.Join(dir, n.Name+".log"), bin, "node", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(60))
			}
		}
	})
	for _, p := range []string{"10.96.0.0/16", "203.0.113.0/24", "2001:db8:96::/108", "2001:db8:ff::/64"} {
		if err := l.AddRoute(netip.MustParsePrefix(p), "node1"); err != nil {
			t.Fatal(err)
		}
	}
	return dir, manifests, procs
}
