package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/lab"
)

// dpLabSpec is the lab of the dataplane tests: two nodes, both running vipgate, with pods spread
// unevenly so that "local" and "cluster" endpoint sets differ.
var dpLabSpec = lab.Spec{Nodes: []lab.NodeSpec{
	{Name: "node1", Pods: []string{"a1", "a2"}},
	{Name: "node2", Pods: []string{"b1"}},
}}

// dpRoutedViaNode1 are the prefixes the router sends to node1, so that the client (outside the cluster) reaches cluster IPs
// and VIPs through node1's vipgate.
var dpRoutedViaNode1 = []string{"10.96.0.0/16", "203.0.113.0/24", "2001:db8:96::/108", "2001:db8:ff::/64"}

// TestDataplane is the specification of `vipgate node` in packets: every Service semantic kube-proxy
// implements, checked by which pod answers and which source address it saw. The manifests are
// rewritten while vipgate runs, and every check polls until the behaviour shows, so the test also
// proves that changes reach the kernel (and reports how fast).
func TestDataplane(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	// Most probes below are answered within a millisecond; the ones expected to fail by a drop wait for
	// the timeout, so keep it short (and the test fast) without risking false timeouts.
	oldTimeout := lab.ProbeTimeout
	lab.ProbeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { lab.ProbeTimeout = oldTimeout })

	l := lab.NewForTest(t, dpLabSpec)
	d := dpStartVIPGate(t, l, map[string]string{"node1": "zone-a", "node2": "zone-b"})
	for _, p := range dpRoutedViaNode1 {
		if err := l.AddRoute(netip.MustParsePrefix(p), "node1"); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	all := dpNames(a1, a2, b1)
	client4, client6 := lab.Clientv4, lab.Clientv6
	// What a pod sees when node1 masquerades: node1's LAN address (endpoint on another node) or its
	// pod bridge address (endpoint on node1).
	node1Masq4 := []netip.Addr{lab.NodeIPv4(1), lab.PodGatewayv4(1)}
	node1Masq6 := []netip.Addr{lab.NodeIPv6(1), lab.PodGatewayv6(1)}
	node2Masq4 := []netip.Addr{lab.NodeIPv4(2), lab.PodGatewayv4(2)}

	// latencies collects, per manifest change, when the new behaviour showed after the file was
	// written: control plane to dataplane, as a user sees it. Only changes bracketed to within
	// preciseBracket count for the figure; the rest were observed through a probe that had to time out
	// (the old state dropped the packet), which says "somewhere within the timeout".
	const preciseBracket = 300 * time.Millisecond
	var latencies []time.Duration
	applied := func(t *testing.T, written time.Time, what string, cond func() string) {
		t.Helper()
		lastFail, seen := dpPoll(t, dpSettleTimeout, what, cond)
		hi := seen.Sub(written)
		lo := time.Duration(0)
		if !lastFail.IsZero() {
			lo = lastFail.Sub(written)
		}
		if hi-lo <= preciseBracket {
			latencies = append(latencies, hi)
		}
		t.Logf("%s: shown between %v and %v after the manifest was written", what, lo.Round(time.Millisecond), hi.Round(time.Millisecond))
	}

	// 0. The readiness endpoint the DaemonSet probes: 200 once the first sync is in the kernel (before
	// it, 503; the unit test of healthcheck.ProxyHealthServer covers that window, too short to catch
	// here).
	t.Run("readyz after the first sync", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("needs curl")
		}
		for _, node := range []string{"node1", "node2"} {
			dpEventually(t, dpSettleTimeout, node+" /readyz", func() string {
				code, body, err := d.httpGet(node, "http://127.0.0.1:10256/readyz")
				if err != nil || code != 200 || !strings.Contains(body, `"synced":true`) {
					return fmt.Sprintf("GET /readyz: %d %q %v, want 200 and synced", code, body, err)
				}
				return ""
			})
			// kube-proxy's HTTP surface: /healthz with its v1.36 JSON fields on the healthz port,
			// /proxyMode on the metrics port (what upstream e2e reads to know the mode).
			code, body, err := d.httpGet(node, "http://127.0.0.1:10256/healthz")
			var hz map[string]any
			if err == nil {
				err = json.Unmarshal([]byte(body), &hz)
			}
			if err != nil || code != 200 || hz["nodeEligible"] != true || hz["healthy"] != true || hz["lastUpdated"] == nil || hz["currentTime"] == nil {
				t.Errorf("%s GET /healthz: %d %q %v, want 200 with kube-proxy's fields", node, code, body, err)
			}
			if code, body, err := d.httpGet(node, "http://127.0.0.1:10249/proxyMode"); err != nil || code != 200 || body != "nftables" {
				t.Errorf("%s GET :10249/proxyMode: %d %q %v, want 200 \"nftables\"", node, code, body, err)
			}
		}
	})

	// 1. ClusterIP: two ports, TCP and UDP, named target ports, random choice, no SNAT from pods,
	// masquerade from outside; headless Services get nothing.
	t.Run("ClusterIP", func(t *testing.T) {
		web := dpSvcSpec{Name: "web", ClusterIPs: []string{"10.96.1.1"}, Ports: []dpSvcPort{
			{Name: "a-tcp", Protocol: corev1.ProtocolTCP, Port: 80, Target: 8080, TargetName: "srv-a"},
			{Name: "a-udp", Protocol: corev1.ProtocolUDP, Port: 80, Target: 8080, TargetName: "srv-a"},
			{Name: "b-tcp", Protocol: corev1.ProtocolTCP, Port: 81, Target: 8081, TargetName: "srv-b"},
			{Name: "b-udp", Protocol: corev1.ProtocolUDP, Port: 81, Target: 8081, TargetName: "srv-b"},
		}}
		// First the Service alone: a new Service with no endpoints is rejected at once. Then the
		// endpoints: that latency (reject -> answer, no probe timeout in the way) is the figure for an
		// endpoint change reaching the kernel.
		written := d.write(t, "01-web.yaml", dpManifest(web, nil))
		applied(t, written, "new Service without endpoints rejects", d.expectError(t, "a1", "tcp", dpAP("10.96.1.1", 80), "refused"))
		written = d.write(t, "01-web.yaml", dpManifest(web, dpReady(a1, a2, b1)))
		applied(t, written, "endpoints added, ClusterIP answers", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.1.1", 80), all))

		for _, port := range []struct{ svc, target int }{{80, 8080}, {81, 8081}} {
			for _, proto := range []string{"tcp", "udp"} {
				for _, from := range []*lab.Pod{a1, b1} {
					name := fmt.Sprintf("%s port %d from %s", proto, port.svc, from.Name)
					t.Run(name, func(t *testing.T) {
						rs := d.probeN(t, from.Name, proto, dpAP("10.96.1.1", port.svc), 12)
						for _, r := range rs {
							if why := dpJudge(r, all, nil); why != "" {
								t.Fatal(why)
							}
							if int(r.Dst.Port()) != port.target {
								t.Errorf("%v: reached port %d, want the target port %d", r, r.Dst.Port(), port.target)
							}
							// Inside the cluster the pod sees the client pod as it is; only a pod
							// reaching itself is masqueraded (hairpin, see its own test).
							if r.Pod != from.Name && r.Src.Addr() != from.IPv4 {
								t.Errorf("%v: source %s, want the client pod's own %s (no SNAT inside the cluster)", r, r.Src.Addr(), from.IPv4)
							}
						}
						if got := dpTally(rs); len(got) < 2 {
							t.Errorf("12 new flows all went to %v: want a random choice among %v", got, all)
						}
					})
				}
			}
		}

		t.Run("from outside the cluster is masqueraded", func(t *testing.T) {
			for _, proto := range []string{"tcp", "udp"} {
				rs := d.probeN(t, "client", proto, dpAP("10.96.1.1", 80), 12)
				for _, r := range rs {
					if why := dpJudge(r, all, node1Masq4); why != "" {
						t.Errorf("%s client -> 10.96.1.1:80: %s (the client %s must not be seen)", proto, why, client4)
					}
				}
				if got := dpTally(rs); len(got) < 2 {
					t.Errorf("%s: 12 new flows all went to %v: want a random choice", proto, got)
				}
			}
		})

		t.Run("headless Service gets no rules", func(t *testing.T) {
			// The headless Service's endpoint address is used nowhere else, so it appearing in the
			// ruleset would mean vipgate programmed it. The canary in the same file proves the file
			// was applied before the ruleset is inspected.
			headless := dpSvcSpec{Name: "headless", ClusterIPs: []string{corev1.ClusterIPNone}, Ports: dpTcpUDP("web", 80, 8080, 0)}
			canary := dpSvcSpec{Name: "canary", ClusterIPs: []string{"10.96.1.2"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
			content := dpManifest(headless, []dpEndpoint{{Pod: a1, Ready: true, Serving: true, IPv4: "10.244.1.99"}}) +
				"---\n" + dpManifest(canary, dpReady(a2))
			written := d.write(t, "01-headless.yaml", content)
			applied(t, written, "canary next to the headless Service answers", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.1.2", 80), dpNames(a2)))
			for _, node := range []string{"node1", "node2"} {
				out, err := d.Exec(node, "nft", "list", "table", "ip", "vipgate")
				if err != nil {
					t.Fatal(err)
				}
				// The canary's endpoint must be listed, or the absence below would prove nothing.
				if !strings.Contains(out, a2.IPv4.String()) {
					t.Fatalf("%s: the canary's endpoint %s is not in the listing either:\n%s", node, a2.IPv4, out)
				}
				if strings.Contains(out, "10.244.1.99") {
					t.Errorf("%s: the headless Service's endpoint 10.244.1.99 is in the ruleset:\n%s", node, dpGrepLines(out, "10.244.1.99"))
				}
			}
		})
	})

	// 1b. A named targetPort that resolves to different numbers on different pods (the upstream e2e
	// "should support named targetPorts that resolve to different ports on different endpoints",
	// with its port name longer than a container port name may be). The EndpointSlice controller
	// writes one slice per port mapping; each pod must be reached on its own slice's number.
	t.Run("named targetPort resolving to different ports", func(t *testing.T) {
		port := func(target int32) []dpSvcPort {
			return []dpSvcPort{{Name: "mutable-named-port", Protocol: corev1.ProtocolTCP, Port: 8001, Target: target, TargetName: "mutable-port"}}
		}
		spec := dpSvcSpec{Name: "named", ClusterIPs: []string{"10.96.1.3"}, Ports: port(8080)}
		on8081 := spec
		on8081.Ports = port(8081)
		sliceA := dpEndpointSlices(spec, dpReady(a1))[0]
		sliceB := dpEndpointSlices(on8081, dpReady(b1))[0]
		sliceA.Name, sliceB.Name = "named-8080", "named-8081"
		written := d.write(t, "01-named.yaml", dpYamlDocs(dpService(spec), sliceA, sliceB))
		applied(t, written, "both pods answer on their own port", d.expectAnswer(t, "a2", "tcp", dpAP("10.96.1.3", 8001), dpNames(a1, b1)))
		want := map[string]uint16{a1.Name: 8080, b1.Name: 8081}
		rs := d.probeN(t, "a2", "tcp", dpAP("10.96.1.3", 8001), 16)
		for _, r := range rs {
			if why := dpJudge(r, dpNames(a1, b1), nil); why != "" {
				t.Fatal(why)
			}
			if r.Dst.Port() != want[r.Pod] {
				t.Errorf("%v: %s reached on port %d, want its slice's %d", r, r.Pod, r.Dst.Port(), want[r.Pod])
			}
		}
		if got := dpTally(rs); len(got) < 2 {
			t.Errorf("16 new flows all went to %v: want both pods", got)
		}
	})

	// 1c. The service.kubernetes.io/headless label: kube-proxy ignores the Service and its slices
	// entirely (not even the ClusterIP is programmed), and so must vipgate.
	t.Run("service.kubernetes.io/headless label", func(t *testing.T) {
		marked := dpSvcSpec{Name: "marked", ClusterIPs: []string{"10.96.1.4"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		svc := dpService(marked)
		svc.Labels = map[string]string{cluster.LabelHeadless: ""}
		slice := dpEndpointSlices(marked, []dpEndpoint{{Pod: a1, Ready: true, Serving: true, IPv4: "10.244.1.98"}})[0]
		slice.Labels[cluster.LabelHeadless] = ""
		canary := dpSvcSpec{Name: "canary-marked", ClusterIPs: []string{"10.96.1.5"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		written := d.write(t, "01-marked.yaml", dpYamlDocs(svc, slice)+"---\n"+dpManifest(canary, dpReady(a2)))
		applied(t, written, "canary next to the labelled Service answers", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.1.5", 80), dpNames(a2)))
		for _, node := range []string{"node1", "node2"} {
			out, err := d.Exec(node, "nft", "list", "table", "ip", "vipgate")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "10.96.1.5") {
				t.Fatalf("%s: the canary's ClusterIP is not in the listing either:\n%s", node, out)
			}
			for _, addr := range []string{"10.96.1.4", "10.244.1.98"} {
				if strings.Contains(out, addr) {
					t.Errorf("%s: %s of the labelled Service is in the ruleset:\n%s", node, addr, dpGrepLines(out, addr))
				}
			}
		}
	})

	// 2. NodePort on the node addresses, not on loopback.
	t.Run("NodePort", func(t *testing.T) {
		np := dpSvcSpec{Name: "nodeport", Type: corev1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.2.1"}, Ports: dpTcpUDP("web", 80, 8080, 30080)}
		written := d.write(t, "02-nodeport.yaml", dpManifest(np, dpReady(a1, a2, b1)))
		applied(t, written, "NodePort answers", d.expectAnswer(t, "client", "tcp", dpAP("192.0.2.11", 30080), all, node1Masq4...))
		for _, proto := range []string{"tcp", "udp"} {
			for _, r := range d.probeN(t, "client", proto, dpAP("192.0.2.11", 30080), 6) {
				if why := dpJudge(r, all, node1Masq4); why != "" {
					t.Errorf("%s client -> node1:30080: %s", proto, why)
				}
			}
			// node2's own vipgate serves its NodePort and masquerades to node2's addresses.
			for _, r := range d.probeN(t, "client", proto, dpAP("192.0.2.12", 30080), 6) {
				if why := dpJudge(r, all, node2Masq4); why != "" {
					t.Errorf("%s client -> node2:30080: %s", proto, why)
				}
			}
		}
		// kube-proxy's nftables mode (and vipgate) never DNATs NodePorts on loopback: that needs
		// route_localnet, which opens the node's loopback services to the network.
		if r := d.probe(t, "node1", "tcp", dpAP("127.0.0.1", 30080)); r.OK() {
			t.Errorf("node1 -> 127.0.0.1:30080: %v, want no answer (NodePorts are not served on loopback)", r)
		} else {
			t.Logf("node1 -> 127.0.0.1:30080: %v (not DNATed)", r)
		}
	})

	// 3. LoadBalancer ingress IPs and spec.externalIPs.
	t.Run("LoadBalancer and externalIPs", func(t *testing.T) {
		lb := dpSvcSpec{Name: "lb", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.3.1"}, Ports: dpTcpUDP("web", 80, 8080, 30083),
			LoadBalancerIPs: []string{"203.0.113.10"}, ExternalIPs: []string{"203.0.113.20"}}
		written := d.write(t, "03-lb.yaml", dpManifest(lb, dpReady(a1, a2, b1)))
		applied(t, written, "LoadBalancer IP answers", d.expectAnswer(t, "client", "tcp", dpAP("203.0.113.10", 80), all, node1Masq4...))
		for _, vip := range []string{"203.0.113.10", "203.0.113.20"} {
			for _, proto := range []string{"tcp", "udp"} {
				dpEventually(t, dpSettleTimeout, proto+" client -> "+vip, d.expectAnswer(t, "client", proto, dpAP(vip, 80), all, node1Masq4...))
			}
		}
	})

	// 4 and 5. externalTrafficPolicy and healthCheckNodePort.
	t.Run("externalTrafficPolicy", func(t *testing.T) {
		clusterSvc := dpSvcSpec{Name: "etp-cluster", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.4.1"},
			Ports: dpTcpUDP("web", 80, 8080, 0), LoadBalancerIPs: []string{"203.0.113.11"}}
		localSvc := dpSvcSpec{Name: "etp-local", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.4.2"},
			Ports: dpTcpUDP("web", 80, 8080, 0), LoadBalancerIPs: []string{"203.0.113.12"}, ExternalLocal: true, HealthCheckNodePort: 32001}
		remoteSvc := dpSvcSpec{Name: "etp-remote", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.4.3"},
			Ports: dpTcpUDP("web", 80, 8080, 0), LoadBalancerIPs: []string{"203.0.113.13"}, ExternalLocal: true, HealthCheckNodePort: 32002}
		written := d.write(t, "04-etp.yaml", dpManifest(clusterSvc, dpReady(a1, a2, b1))+"---\n"+
			dpManifest(localSvc, dpReady(a1, a2, b1))+"---\n"+dpManifest(remoteSvc, dpReady(b1)))
		applied(t, written, "eTP=Local LoadBalancer IP answers", d.expectAnswer(t, "client", "tcp", dpAP("203.0.113.12", 80), dpNames(a1, a2), client4))

		t.Run("Cluster: any pod, source NATed", func(t *testing.T) {
			rs := d.probeN(t, "client", "tcp", dpAP("203.0.113.11", 80), 12)
			for _, r := range rs {
				if why := dpJudge(r, all, node1Masq4); why != "" {
					t.Error(why)
				}
			}
			if got := dpTally(rs); len(got) < 2 {
				t.Errorf("12 flows all went to %v: want a random choice", got)
			}
		})
		t.Run("Local: node1's pods only, client IP kept", func(t *testing.T) {
			for _, proto := range []string{"tcp", "udp"} {
				rs := d.probeN(t, "client", proto, dpAP("203.0.113.12", 80), 12)
				for _, r := range rs {
					if why := dpJudge(r, dpNames(a1, a2), []netip.Addr{client4}); why != "" {
						t.Errorf("%s: %s", proto, why)
					}
				}
				if got := dpTally(rs); len(got) < 2 {
					t.Errorf("%s: 12 flows all went to %v: want a random choice among a1, a2", proto, got)
				}
			}
		})
		t.Run("Local without a local endpoint drops", func(t *testing.T) {
			// The LB (here: the router's static route) should not have sent it; a drop rather than a
			// reject is what kube-proxy does, so the client retries elsewhere instead of failing.
			dpEventually(t, dpSettleTimeout, "client -> node2-only eTP=Local VIP via node1", d.expectError(t, "client", "tcp", dpAP("203.0.113.13", 80), "timeout"))
		})
		t.Run("Local short-circuits pods and the node itself", func(t *testing.T) {
			// Traffic from inside the cluster is not "external": it goes to any endpoint.
			dpEventually(t, dpSettleTimeout, "a1 -> node2-only eTP=Local VIP", d.expectAnswer(t, "a1", "tcp", dpAP("203.0.113.13", 80), dpNames(b1), a1.IPv4))
			dpEventually(t, dpSettleTimeout, "node1 -> node2-only eTP=Local VIP", d.expectAnswer(t, "node1", "tcp", dpAP("203.0.113.13", 80), dpNames(b1)))
		})

		// 5. The health check tells an LB which nodes have local endpoints.
		t.Run("healthCheckNodePort", func(t *testing.T) {
			if _, err := exec.LookPath("curl"); err != nil {
				t.Skip("needs curl")
			}
			check := func(url string, wantCode int, wantService string, wantLocal int) func() string {
				return func() string {
					code, body, err := d.httpGet("lanclient", url)
					if err != nil {
						return err.Error()
					}
					hb, err := dpParseHealthBody(body)
					if err != nil {
						return err.Error()
					}
					if code != wantCode || hb.LocalEndpoints != wantLocal || hb.Service.Name != wantService || hb.Service.Namespace != dpE2eNamespace {
						return fmt.Sprintf("GET %s: %d %s, want %d with %d local endpoints of %s/%s", url, code, body, wantCode, wantLocal, dpE2eNamespace, wantService)
					}
					return ""
				}
			}
			dpEventually(t, dpSettleTimeout, "node1 health check of etp-local", check("http://192.0.2.11:32001/", 200, "etp-local", 2))
			dpEventually(t, dpSettleTimeout, "node1 health check of etp-remote", check("http://192.0.2.11:32002/", 503, "etp-remote", 0))
			dpEventually(t, dpSettleTimeout, "node2 health check of etp-remote", check("http://192.0.2.12:32002/", 200, "etp-remote", 1))
			dpEventually(t, dpSettleTimeout, "node2 health check of etp-local", check("http://192.0.2.12:32001/", 200, "etp-local", 1))
		})
	})

	// 6. internalTrafficPolicy: Local.
	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		local := dpSvcSpec{Name: "itp-local", ClusterIPs: []string{"10.96.6.1"}, Ports: dpTcpUDP("web", 80, 8080, 0), InternalLocal: true}
		remote := dpSvcSpec{Name: "itp-remote", ClusterIPs: []string{"10.96.6.2"}, Ports: dpTcpUDP("web", 80, 8080, 0), InternalLocal: true}
		written := d.write(t, "06-itp.yaml", dpManifest(local, dpReady(a1, a2, b1))+"---\n"+dpManifest(remote, dpReady(b1)))
		applied(t, written, "iTP=Local ClusterIP answers", d.expectAnswer(t, "a2", "tcp", dpAP("10.96.6.1", 80), dpNames(a1, a2)))
		for _, proto := range []string{"tcp", "udp"} {
			for _, r := range d.probeN(t, "a2", proto, dpAP("10.96.6.1", 80), 8) {
				if why := dpJudge(r, dpNames(a1, a2), nil); why != "" {
					t.Errorf("%s a2 (node1) -> itp-local: %s", proto, why)
				}
			}
			for _, r := range d.probeN(t, "b1", proto, dpAP("10.96.6.1", 80), 4) {
				if why := dpJudge(r, dpNames(b1), nil); why != "" {
					t.Errorf("%s b1 (node2) -> itp-local: %s", proto, why)
				}
			}
		}
		dpEventually(t, dpSettleTimeout, "a1 (node1) -> iTP=Local Service with endpoints only on node2", d.expectError(t, "a1", "tcp", dpAP("10.96.6.2", 80), "timeout"))
		dpEventually(t, dpSettleTimeout, "b1 (node2) -> iTP=Local Service with its own endpoint", d.expectAnswer(t, "b1", "tcp", dpAP("10.96.6.2", 80), dpNames(b1)))
	})

	// 7. Hairpin: a pod reaching itself through its Service.
	t.Run("hairpin", func(t *testing.T) {
		hp := dpSvcSpec{Name: "hairpin", ClusterIPs: []string{"10.96.7.1", "2001:db8:96::7"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		written := d.write(t, "07-hairpin.yaml", dpManifest(hp, dpReady(a1)))
		applied(t, written, "hairpin Service answers", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.7.1", 80), dpNames(a1)))
		for _, vip := range []string{"10.96.7.1", "2001:db8:96::7"} {
			for _, proto := range []string{"tcp", "udp"} {
				r := d.probe(t, "a1", proto, dpAP(vip, 80))
				if why := dpJudge(r, dpNames(a1), nil); why != "" {
					t.Errorf("%s a1 -> %s: %s", proto, vip, why)
					continue
				}
				// Without masquerade the pod would answer itself directly and the reply would skip
				// the un-DNAT: the connection would never be established.
				if own := []netip.Addr{a1.IPv4, a1.IPv6}; slices.Contains(own, r.Src.Addr()) {
					t.Errorf("%s a1 -> %s: %v, want a masqueraded source, not a1's own", proto, vip, r)
				} else {
					t.Logf("%s a1 -> %s: a1 sees %s", proto, vip, r.Src.Addr())
				}
			}
		}
	})

	// 8. No endpoints and undefined ports are rejected, unallocated cluster IPs dropped.
	t.Run("no endpoints", func(t *testing.T) {
		none := dpSvcSpec{Name: "noep", ClusterIPs: []string{"10.96.8.1"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		empty := dpSvcSpec{Name: "noep-empty", ClusterIPs: []string{"10.96.8.2"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		written := d.write(t, "08-noep.yaml", dpManifest(none, nil)+"---\n"+dpManifest(empty, []dpEndpoint{}))
		applied(t, written, "Service without endpoints rejects", d.expectError(t, "a1", "tcp", dpAP("10.96.8.1", 80), "refused"))
		for _, vip := range []string{"10.96.8.1", "10.96.8.2"} {
			for _, proto := range []string{"tcp", "udp"} {
				start := time.Now()
				r := d.probe(t, "a1", proto, dpAP(vip, 80))
				if r.Err != "refused" {
					t.Errorf("%s a1 -> %s:80 (no endpoints): %v, want refused", proto, vip, r)
				}
				t.Logf("%s a1 -> %s:80: %v after %v (including the probe's exec)", proto, vip, r, time.Since(start).Round(time.Millisecond))
			}
			if r := d.probe(t, "client", "tcp", dpAP(vip, 80)); r.Err != "refused" {
				t.Errorf("tcp client -> %s:80 (no endpoints): %v, want refused", vip, r)
			}
		}
		if r := d.probe(t, "a1", "tcp", dpAP("10.96.1.1", 9999)); r.Err != "refused" {
			t.Errorf("a1 -> 10.96.1.1:9999 (a port the Service does not define): %v, want refused", r)
		}
		if r := d.probe(t, "a1", "tcp", dpAP("10.96.99.99", 80)); r.Err != "timeout" {
			t.Errorf("a1 -> 10.96.99.99:80 (no Service has this cluster IP): %v, want timeout (dropped)", r)
		}
	})

	// 9. Terminating endpoints are used when nothing is ready, if they still serve.
	t.Run("terminating fallback", func(t *testing.T) {
		term := dpSvcSpec{Name: "term", ClusterIPs: []string{"10.96.9.1"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		written := d.write(t, "09-term.yaml", dpManifest(term, dpTerminating(true, a2, b1)))
		applied(t, written, "serving terminating endpoints answer", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.9.1", 80), dpNames(a2, b1)))
		for _, r := range d.probeN(t, "client", "tcp", dpAP("10.96.9.1", 80), 4) {
			if why := dpJudge(r, dpNames(a2, b1), node1Masq4); why != "" {
				t.Errorf("client -> terminating Service: %s", why)
			}
		}
		written = d.write(t, "09-term.yaml", dpManifest(term, dpTerminating(false, a2, b1)))
		applied(t, written, "terminating endpoints that stopped serving are not used", d.expectError(t, "a1", "tcp", dpAP("10.96.9.1", 80), "refused"))
	})

	// 10. sessionAffinity: ClientIP.
	t.Run("session affinity", func(t *testing.T) {
		aff := dpSvcSpec{Name: "affinity", ClusterIPs: []string{"10.96.10.1"}, Ports: dpTcpUDP("web", 80, 8080, 0), ClientIPAffinity: true}
		written := d.write(t, "10-affinity.yaml", dpManifest(aff, dpReady(a1, a2, b1)))
		applied(t, written, "affinity Service answers", d.expectAnswer(t, "client", "tcp", dpAP("10.96.10.1", 80), all))
		for _, from := range []string{"client", "a2", "b1"} {
			for _, proto := range []string{"tcp", "udp"} {
				rs := d.probeN(t, from, proto, dpAP("10.96.10.1", 80), 10)
				if got := dpTally(rs); len(got) != 1 || !rs[0].OK() {
					t.Errorf("%s %s -> affinity Service: %v, want all 10 flows on one pod", proto, from, got)
				}
			}
		}
	})

	// 11. loadBalancerSourceRanges.
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		spec := dpSvcSpec{Name: "ranges", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.11.1"}, Ports: dpTcpUDP("web", 80, 8080, 0),
			LoadBalancerIPs: []string{"203.0.113.14"}, SourceRanges: []string{"198.51.100.0/24"}}
		written := d.write(t, "11-ranges.yaml", dpManifest(spec, dpReady(a1, a2, b1)))
		applied(t, written, "client inside the source ranges answered", d.expectAnswer(t, "client", "tcp", dpAP("203.0.113.14", 80), all, node1Masq4...))

		spec.SourceRanges = []string{"192.0.2.0/24"}
		written = d.write(t, "11-ranges.yaml", dpManifest(spec, dpReady(a1, a2, b1)))
		applied(t, written, "client outside the source ranges dropped", d.expectError(t, "client", "tcp", dpAP("203.0.113.14", 80), "timeout"))
		dpEventually(t, dpSettleTimeout, "lanclient inside the new range", d.expectAnswer(t, "lanclient", "tcp", dpAP("203.0.113.14", 80), all))
		// The ranges guard the load-balancer IP only, not the cluster IP.
		dpEventually(t, dpSettleTimeout, "client -> the Service's cluster IP", d.expectAnswer(t, "client", "tcp", dpAP("10.96.11.1", 80), all, node1Masq4...))
	})

	// 12. UDP conntrack entries to a removed endpoint are deleted, so a client that keeps its source
	// port moves on instead of being blackholed.
	t.Run("UDP conntrack cleanup", func(t *testing.T) {
		if _, err := exec.LookPath("conntrack"); err != nil {
			t.Skip("needs conntrack")
		}
		spec := dpSvcSpec{Name: "udpct", ClusterIPs: []string{"10.96.12.1"}, Ports: dpTcpUDP("web", 53, 8080, 0)}
		written := d.write(t, "12-udpct.yaml", dpManifest(spec, dpReady(a2, b1)))
		applied(t, written, "UDP Service answers", d.expectAnswer(t, "a1", "udp", dpAP("10.96.12.1", 53), dpNames(a2, b1)))

		conn, err := dpListenUDPIn(a1.NS, netip.AddrPortFrom(a1.IPv4, 40053))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		dst := dpAP("10.96.12.1", 53)
		ask := func() lab.ProbeResult {
			r, err := dpUdpAsk(conn, dst, lab.ProbeTimeout)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		first := ask()
		if why := dpJudge(first, dpNames(a2, b1), []netip.Addr{a1.IPv4}); why != "" {
			t.Fatalf("a1:40053 -> %s: %s", dst, why)
		}
		// The same 5-tuple stays on the same endpoint: that is the conntrack entry at work.
		for range 5 {
			if r := ask(); r.Pod != first.Pod {
				t.Fatalf("a1:40053 -> %s: %v after %v: one flow must stay on one endpoint", dst, r, first)
			}
		}
		gone, stays := a2, b1
		if first.Pod == b1.Name {
			gone, stays = b1, a2
		}
		entries, err := d.conntrackEntries("node1", "udp", dst.Addr(), gone.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			t.Fatalf("node1 has no conntrack entry to %s before the removal: the check below would prove nothing", gone.IPv4)
		}

		written = d.write(t, "12-udpct.yaml", dpManifest(spec, dpReady(stays)))
		applied(t, written, fmt.Sprintf("the same UDP flow moves from removed %s to %s", gone.Name, stays.Name), func() string {
			if r := ask(); r.Pod != stays.Name {
				return fmt.Sprintf("a1:40053 -> %s: %v, want %s", dst, r, stays.Name)
			}
			return ""
		})
		dpEventually(t, dpSettleTimeout, "no conntrack entry to the removed endpoint", func() string {
			entries, err := d.conntrackEntries("node1", "udp", dst.Addr(), gone.IPv4)
			if err != nil {
				return err.Error()
			}
			if len(entries) > 0 {
				return fmt.Sprintf("node1 still has %d entries to %s:\n%s", len(entries), gone.IPv4, strings.Join(entries, "\n"))
			}
			return ""
		})
	})

	// 13. Dual-stack: IPv6 cluster IP and LoadBalancer IP.
	t.Run("dual-stack", func(t *testing.T) {
		spec := dpSvcSpec{Name: "dual", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.13.1", "2001:db8:96::a"},
			Ports: dpTcpUDP("web", 80, 8080, 0), LoadBalancerIPs: []string{"203.0.113.15", "2001:db8:ff::10"}}
		written := d.write(t, "13-dual.yaml", dpManifest(spec, dpReady(a2, b1)))
		applied(t, written, "IPv6 cluster IP answers", d.expectAnswer(t, "a1", "tcp", dpAP("2001:db8:96::a", 80), dpNames(a2, b1), a1.IPv6))
		for _, proto := range []string{"tcp", "udp"} {
			for _, r := range d.probeN(t, "a1", proto, dpAP("2001:db8:96::a", 80), 6) {
				if why := dpJudge(r, dpNames(a2, b1), []netip.Addr{a1.IPv6}); why != "" {
					t.Errorf("%s a1 -> [2001:db8:96::a]:80: %s", proto, why)
				}
			}
			for _, r := range d.probeN(t, "client", proto, dpAP("2001:db8:ff::10", 80), 6) {
				if why := dpJudge(r, dpNames(a2, b1), node1Masq6); why != "" {
					t.Errorf("%s client -> [2001:db8:ff::10]:80: %s (the client %s must not be seen)", proto, why, client6)
				}
			}
			for _, r := range d.probeN(t, "client", proto, dpAP("203.0.113.15", 80), 4) {
				if why := dpJudge(r, dpNames(a2, b1), node1Masq4); why != "" {
					t.Errorf("%s client -> 203.0.113.15:80: %s", proto, why)
				}
			}
		}
	})

	// 14. Topology hints: a node uses the endpoints hinted for its zone.
	t.Run("topology hints", func(t *testing.T) {
		spec := dpSvcSpec{Name: "topo", ClusterIPs: []string{"10.96.14.1"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		eps := dpReady(a1, a2, b1)
		eps[0].Zones, eps[1].Zones, eps[2].Zones = []string{"zone-a"}, []string{"zone-b"}, []string{"zone-b"}
		written := d.write(t, "14-topo.yaml", dpManifest(spec, eps))
		applied(t, written, "zone-a node1 uses a1 only", d.expectAnswer(t, "a2", "tcp", dpAP("10.96.14.1", 80), dpNames(a1)))
		if got := dpTally(d.probeN(t, "a2", "tcp", dpAP("10.96.14.1", 80), 10)); got[a1.Name] != 10 {
			t.Errorf("a2 (node1, zone-a) -> topo: %v, want a1 only (the only endpoint hinted for zone-a)", got)
		}
		for _, r := range d.probeN(t, "b1", "tcp", dpAP("10.96.14.1", 80), 10) {
			if why := dpJudge(r, dpNames(a2, b1), nil); why != "" {
				t.Errorf("b1 (node2, zone-b) -> topo: %s", why)
			}
		}
	})

	// 15. Bad input refuses only itself.
	t.Run("bad manifests", func(t *testing.T) {
		bad := dpSvcSpec{Name: "bad-svc", Type: corev1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.15.2"}, Ports: dpTcpUDP("web", 80, 8080, 30099)}
		badSvc := dpService(bad)
		badSvc.Spec.Ports[0].NodePort = 99999 // outside the NodePort range
		good := dpSvcSpec{Name: "good-svc", ClusterIPs: []string{"10.96.15.1"}, Ports: dpTcpUDP("web", 80, 8080, 0)}
		content := dpYamlDocs("apiVersion: v1\nkind: Service\nmetadata: {name: broken\nspec: [ports: {\n", badSvc) +
			"---\n" + dpManifest(good, dpReady(a2))
		written := d.write(t, "15-bad.yaml", content)
		applied(t, written, "good Service next to bad ones answers", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.15.1", 80), dpNames(a2)))
		dpEventually(t, dpSettleTimeout, "earlier Services keep working", d.expectAnswer(t, "a1", "tcp", dpAP("10.96.1.1", 80), all))
		d.waitLog(t, "node1", "bad-svc", dpSettleTimeout)
		log := d.Procs["node1"].Log()
		for _, want := range []string{"15-bad.yaml document 1", "15-bad.yaml document 2", "99999"} {
			if !strings.Contains(log, want) {
				t.Errorf("node1's vipgate log does not mention %q; rejections logged:\n%s", want, dpGrepLines(log, "rejected"))
			}
		}
		t.Logf("rejections in node1's log:\n%s", dpGrepLines(log, "15-bad.yaml"))
		if r := d.probe(t, "a1", "tcp", dpAP("10.96.15.2", 80)); r.OK() {
			t.Errorf("the invalid Service answers: %v", r)
		}
	})

	// vipgate render prints what vipgate node programs; nft must accept it.
	t.Run("render passes nft -c", func(t *testing.T) {
		if _, err := exec.LookPath("nft"); err != nil {
			t.Skip("needs nft")
		}
		out := filepath.Join(l.Dir(), "render.nft")
		errLog := filepath.Join(l.Dir(), "render.log")
		// Rendered inside node1 so that the NodePort addresses are node1's. Stderr (the warnings about
		// the bad manifests) stays out of the ruleset file.
		if _, err := d.Exec("node1", "sh", "-c", fmt.Sprintf("exec %q render --config %q --manifests %q >%q 2>%q",
			d.Bin, d.Configs["node1"], d.Manifests, out, errLog)); err != nil {
			b, _ := os.ReadFile(errLog)
			t.Fatalf("vipgate render: %v\n%s", err, b)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "10.96.1.1") || !strings.Contains(string(b), "2001:db8:96::a") {
			t.Errorf("rendered ruleset lacks the test Services:\n%s", b)
		}
		// Checked in a namespace without vipgate, so nothing in it can collide with live tables.
		if msg, err := d.Exec("lanclient", "nft", "-c", "-f", out); err != nil {
			t.Errorf("nft -c -f rejects the rendered ruleset: %v\n%s", err, msg)
		}
		t.Logf("rendered ruleset: %d lines", strings.Count(string(b), "\n"))
	})

	for name, p := range d.Procs {
		if exited, err := p.Exited(); exited {
			t.Errorf("vipgate on %s exited during the test: %v\n%s", name, err, p.Tail(20))
		}
	}
	if len(latencies) > 0 {
		sorted := slices.Clone(latencies)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		t.Logf("manifest written -> behaviour shown in the kernel, %d changes measured to within %v: min %v, median %v, max %v "+
			"(upper bounds: file watch debounce of 100 ms, parse, sync, one probe; polled every %v)",
			len(sorted), preciseBracket, sorted[0].Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond),
			sorted[len(sorted)-1].Round(time.Millisecond), dpPollInterval)
	}
}

// dpGrepLines returns the lines of text that contain substr.
func dpGrepLines(text, substr string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
