package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestNodeHostileInput is issue 15's acceptance test on live nodes: a corpus of hostile objects (both
// families) in the manifest directory of two `vipgate node`s — node1 with externalIPs allowed
// anywhere (kube-proxy's behaviour; they are off by default) but otherwise the default policy, node2
// allowing the cluster's ranges too so that its conflict resolution, not the policy, has to
// keep kube-dns's entries — and then hostile files. Real packets show that the victim keeps working
// and no special address answers; /status shows each hostile object refused alone, with its reason;
// and after each hostile file the node still applies a normal change.
func TestNodeHostileInput(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := vipgateBinary(t)
	dir, manifests, _ := ndStartNodes(t, l, bin, func(n *lab.Node) string {
		body := ndNodeConfig(n, "zone-a")
		if n.Name == "node2" {
			return body + "externalIPs: {allowedCIDRs: [\"0.0.0.0/0\", \"::/0\"], allowClusterCIDRs: true}\n"
		}
		return body + ndExternalIPsAny
	})
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	node1, node2 := l.Node("node1"), l.Node("node2")
	w := &ndWriter{t: t, dir: manifests}

	// The victim: kube-dns, dual-stack, endpoints a1 and b1, created after every attacker.
	w.write("10-victim.yaml", hvVictim(a1, b1), hvNode(node1), hvNode(node2))
	for _, target := range []string{"10.96.5.10:53", "[2001:db8:96::5:a]:53"} {
		ndWait(t, l, "client", "udp", target, func(r lab.ProbeResult) bool { return r.OK() })
	}

	type hostile struct {
		object, reason string // "Kind namespace/name", a word of the reason
		node           string // whose /status must say so ("" both)
	}
	var corpus []string
	var want []hostile
	add := func(doc string, h ...hostile) {
		corpus = append(corpus, doc)
		want = append(want, h...)
	}
	// Capture of kube-dns by externalIPs and by a LoadBalancer status, both families, by a Service
	// that is older and sorts first.
	add(hvAttacker("aaa-capture", "10.96.5.200", "2001:db8:96::5:c8", "  externalIPs: [10.96.5.10, \"2001:db8:96::5:a\"]\n", "", a2),
		hostile{"Service hostile/aaa-capture", "inside the service CIDR", "node1"},
		hostile{"Service hostile/aaa-capture", "a cluster IP entry always wins", "node2"})
	add(hvAttacker("aaa-lb", "10.96.5.201", "2001:db8:96::5:c9", "  type: LoadBalancer\n", "status: {loadBalancer: {ingress: [{ip: 10.96.5.10, ipMode: VIP}, {ip: \"2001:db8:96::5:a\", ipMode: VIP}]}}\n", a2),
		hostile{"Service hostile/aaa-lb", "inside the service CIDR", "node1"},
		hostile{"Service hostile/aaa-lb", "a cluster IP entry always wins", "node2"})
	// The node's own addresses and a pod's.
	add(hvAttacker("aaa-node", "10.96.5.202", "2001:db8:96::5:ca", fmt.Sprintf("  externalIPs: [%q, %q, %q, %q]\n", node1.IPv4, node1.IPv6, node2.IPv4, node2.IPv6), "", a2),
		hostile{"Service hostile/aaa-node", "node's address", ""})
	add(hvAttacker("aaa-pod", "10.96.5.203", "2001:db8:96::5:cb", fmt.Sprintf("  externalIPs: [%q, %q]\n", a1.IPv4, a1.IPv6), "", a2),
		hostile{"Service hostile/aaa-pod", "pod", "node1"})
	// Special addresses, one Service each (each is rejected whole).
	specials := []struct{ addr, class string }{
		{"127.0.0.1", "loopback"}, {"0.0.0.0", "unspecified"}, {"224.0.0.251", "multicast"},
		{"169.254.169.254", "link-local"}, {"255.255.255.255", "broadcast"},
		{"::1", "loopback"}, {"::", "unspecified"}, {"ff02::fb", "multicast"}, {"fe80::1", "link-local"},
	}
	for i, s := range specials {
		name := fmt.Sprintf("aaa-special-%d", i)
		cip4, cip6 := fmt.Sprintf("10.96.5.%d", 210+i), fmt.Sprintf("2001:db8:96::5:%x", 0xd0+i)
		add(hvAttacker(name, cip4, cip6, fmt.Sprintf("  externalIPs: [%q]\n", s.addr), "", a2),
			hostile{"Service hostile/" + name, s.class, ""})
	}
	add(hvAttacker("aaa-lb-loopback", "10.96.5.230", "2001:db8:96::5:e6", "  type: LoadBalancer\n", "status: {loadBalancer: {ingress: [{ip: 127.0.0.1, ipMode: VIP}]}}\n", a2),
		hostile{"Service hostile/aaa-lb-loopback", "loopback", ""})
	// Endpoints on loopback and on the metadata address, both families.
	add(hvSliceAttack("ep-v4", "10.96.5.240", "IPv4", "127.0.0.1", "169.254.169.254"),
		hostile{"EndpointSlice hostile/ep-v4-a", "loopback", ""})
	add(hvSliceAttack("ep-v6", "2001:db8:96::5:f0", "IPv6", "::1", "fe80::1"),
		hostile{"EndpointSlice hostile/ep-v6-a", "loopback", ""})
	// Equals: two external IP claims on one address; the younger sorts first and loses.
	young := strings.Replace(hvAttacker("aaa-young", "10.96.5.250", "2001:db8:96::5:fa", "  externalIPs: [203.0.113.50, \"2001:db8:ff::50\"]\n", "", a2), "2020-01-01T00:00:00Z", "2026-07-01T00:00:00Z", 1)
	add(young, hostile{"Service hostile/aaa-young", "it was created first", ""})
	add(hvAttacker("zzz-old", "10.96.5.251", "2001:db8:96::5:fb", "  externalIPs: [203.0.113.50, \"2001:db8:ff::50\"]\n", "", a1))
	// Issue #27, what a Service costs: 150 IPv4 and 400 IPv6 external IPs x 200 ports (30,200 and
	// 80,200 entries; a 23 KB object) is refused as a whole over serviceLimits.maxEntries; a
	// 500-port maglev Service of one endpoint (500 tables of 101 slots, ~4.8 MiB of kernel state a
	// family; 1021 slots and ~46 MiB before) is programmed.
	add(hvCostly(a2), hostile{"Service hostile/aaa-costly", "serviceLimits.maxEntries 20000", ""})
	add(hvMaglevPorts(a1))
	w.write("20-hostile.yaml", corpus...)

	t.Run("every hostile object refused alone, with its reason", func(t *testing.T) {
		for _, node := range []string{"node1", "node2"} {
			rejected := hvWaitRejected(t, l, node, func(rs []hvRejected) bool {
				return hvFind(rs, "Service hostile/aaa-young", "created first")
			})
			for _, h := range want {
				if h.node != "" && h.node != node {
					continue
				}
				if !hvFind(rejected, h.object, h.reason) {
					t.Errorf("%s: no rejection of %s naming %q", node, h.object, h.reason)
				}
			}
			for _, r := range rejected {
				if !strings.HasPrefix(r.Object, "hostile/") {
					t.Errorf("%s: an object that is not hostile is refused: %+v", node, r)
				}
			}
		}
	})

	t.Run("a costly Service is refused whole, a large maglev one programmed", func(t *testing.T) {
		for _, target := range []string{"10.96.5.60:1000", "10.96.5.60:1499", "[2001:db8:96::5:3c]:1250"} {
			r := ndWait(t, l, "client", "tcp", target, func(r lab.ProbeResult) bool { return r.OK() })
			if r.Pod != "a1" {
				t.Errorf("maglev %s: %v, want a1", target, r)
			}
		}
		for _, target := range []string{"203.0.113.100:1000", "[2001:db8:e::1]:1199", "10.96.5.61:1000"} {
			r, err := l.Probe("client", "tcp", target)
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod == "a2" {
				t.Errorf("%s reached the refused Service's pod: %v", target, r)
			}
		}
		// In the kernel: no map element holds one of its addresses (each would be an entry).
		for _, fam := range []string{"ip", "ip6"} {
			out, err := l.Exec("node1", "nft", "list", "map", fam, "vipgate", "service-ips")
			if err != nil {
				t.Fatalf("nft: %v\n%s", err, out)
			}
			if strings.Contains(out, "203.0.113.100") || strings.Contains(out, "2001:db8:e::1 ") {
				t.Errorf("%s service-ips holds an entry of the refused Service", fam)
			}
		}
	})

	t.Run("the victim keeps its entries, both families, through both nodes", func(t *testing.T) {
		for _, from := range []string{"client", "a2", "b1", "node1", "node2"} {
			for _, target := range []string{"10.96.5.10:53", "[2001:db8:96::5:a]:53"} {
				for _, proto := range []string{"udp", "tcp"} {
					s := ndMany(t, l, from, proto, target, 6)
					if s.Pods["a2"] > 0 {
						t.Errorf("%s %s from %s reached the attacker's pod a2: %v", proto, target, from, s.Pods)
					}
				}
			}
		}
	})

	t.Run("no special address, node address or pod address leads to the attacker", func(t *testing.T) {
		probes := []struct{ from, proto, target string }{
			{"node1", "tcp", "127.0.0.1:80"}, {"node1", "udp", "127.0.0.1:53"}, {"node1", "tcp", "[::1]:80"},
			{"node1", "tcp", "0.0.0.0:80"}, {"node1", "tcp", "[::]:80"},
			{"a1", "tcp", "169.254.169.254:80"}, {"a1", "udp", "224.0.0.251:53"}, {"a1", "udp", "255.255.255.255:53"},
			{"client", "tcp", node1.IPv4.String() + ":80"}, {"client", "tcp", "[" + node1.IPv6.String() + "]:80"},
			{"b1", "tcp", node1.IPv4.String() + ":80"},
			{"node1", "tcp", a1.IPv4.String() + ":8080"}, {"node1", "tcp", "[" + a1.IPv6.String() + "]:8080"},
		}
		for _, p := range probes {
			r, err := l.Probe(p.from, p.proto, p.target)
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod == "a2" {
				t.Errorf("%s %s from %s reached the attacker's pod a2 (%v)", p.proto, p.target, p.from, r)
			}
		}
		// Of two equal claims the older Service holds the address.
		for _, target := range []string{"203.0.113.50:80", "[2001:db8:ff::50]:80"} {
			ndWait(t, l, "client", "tcp", target, func(r lab.ProbeResult) bool { return r.OK() })
			if s := ndMany(t, l, "client", "tcp", target, 6); s.Pods["a2"] > 0 {
				t.Errorf("%s reached the younger Service's pod a2: %v", target, s.Pods)
			}
		}
	})

	t.Run("explain on the node shows the holder and the refusal", func(t *testing.T) {
		out, err := l.Exec("node1", bin, "explain", "--config", filepath.Join(dir, "node1.yaml"), "--from", "198.51.100.10", "--to", "10.96.5.10:53/udp")
		if err != nil {
			t.Fatalf("explain: %v\n%s", err, out)
		}
		for _, want := range []string{"rejected: Service hostile/aaa-capture: spec.externalIPs 10.96.5.10 is not programmed", a1.IPv4.String() + ":8080"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, a2.IPv4.String()) {
			t.Errorf("explain shows the attacker's endpoint:\n%s", out)
		}
	})

	// Hostile files, one at a time; after each, a normal change must still be applied.
	fifo := filepath.Join(dir, "outside.fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	var eps strings.Builder
	for i := 0; i < 1100; i++ {
		fmt.Fprintf(&eps, "- addresses: [10.244.%d.%d]\n", 100+i/250, 1+i%250)
	}
	var ports strings.Builder
	for i := 1; i <= 65535; i++ {
		fmt.Fprintf(&ports, "  - {name: p%d, port: %d, protocol: UDP}\n", i, i)
	}
	files := []struct {
		name, reason string
		create       func(path string) error
	}{
		{"30-fifo.yaml", "a FIFO", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"31-device.yaml", "a character device", func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o644, 1<<8|3) }},
		{"32-link.yaml", "a FIFO", func(p string) error { return os.Symlink(fifo, p) }},
		{"33-big-slice.yaml", "1100 endpoints", func(p string) error {
			return os.WriteFile(p, []byte("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: kube-dns-big, namespace: hostile, labels: {kubernetes.io/service-name: kube-dns}}\naddressType: IPv4\nports: [{name: dns, port: 8080, protocol: UDP}]\nendpoints:\n"+eps.String()), 0o644)
		}},
		{"34-ports.yaml", "65535 ports", func(p string) error {
			return os.WriteFile(p, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: many-ports, namespace: hostile}\nspec:\n  clusterIP: 10.96.5.99\n  ports:\n"+ports.String()), 0o644)
		}},
	}
	for i, f := range files {
		t.Run("hostile file "+f.name+", then a normal change", func(t *testing.T) {
			if err := f.create(filepath.Join(manifests, f.name)); err != nil {
				t.Fatal(err)
			}
			// The normal change, written after the hostile file: a new Service to a1.
			cip := fmt.Sprintf("10.96.6.%d", 10+i)
			name := fmt.Sprintf("after-%d", i)
			w.write(fmt.Sprintf("40-after-%d.yaml", i),
				fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: e2e}\nspec:\n  clusterIP: %s\n  ports: [{name: http, port: 80, targetPort: 8080}]\n", name, cip),
				ndSlice(name, "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(a1, "node1")))
			for _, from := range []string{"client", "b1"} {
				r := ndWait(t, l, from, "tcp", cip+":80", func(r lab.ProbeResult) bool { return r.OK() })
				if r.Pod != "a1" {
					t.Errorf("%s -> %s: %v, want a1", from, cip, r)
				}
			}
			for _, node := range []string{"node1", "node2"} {
				object := f.name
				if strings.Contains(f.reason, "endpoints") {
					object = "hostile/kube-dns-big"
				} else if strings.Contains(f.reason, "ports") {
					object = "hostile/many-ports"
				}
				hvWaitRejected(t, l, node, func(rs []hvRejected) bool { return hvFindObject(rs, object, f.reason) })
			}
			// The victim still answers.
			ndWait(t, l, "client", "udp", "10.96.5.10:53", func(r lab.ProbeResult) bool { return r.OK() && r.Pod != "a2" })
		})
	}
}

// hvVictim is kube-dns in kube-system: UDP and TCP 53 to a1 and b1, both families, created in 2026.
func hvVictim(a1, b1 *lab.Pod) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, creationTimestamp: "2026-06-01T00:00:00Z", uid: 5f0c2d1e-victim}
spec:
  clusterIPs: [10.96.5.10, "2001:db8:96::5:a"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 8080}, {name: dns-tcp, port: 53, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v4, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
ports: [{name: dns, port: 8080, protocol: UDP}, {name: dns-tcp, port: 8080, protocol: TCP}]
endpoints: [{addresses: [%q], nodeName: node1}, {addresses: [%q], nodeName: node2}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v6, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv6
ports: [{name: dns, port: 8080, protocol: UDP}, {name: dns-tcp, port: 8080, protocol: TCP}]
endpoints: [{addresses: [%q], nodeName: node1}, {addresses: [%q], nodeName: node2}]
`, a1.IPv4, b1.IPv4, a1.IPv6, b1.IPv6)
}

// hvCostly is a dual-stack Service in hostile with 150 IPv4 and 400 IPv6 external IPs and 200
// ports, endpoint pod: more entries than any node's default serviceLimits.maxEntries in each family.
func hvCostly(pod *lab.Pod) string {
	var ips, ports, eports []string
	for i := range 150 {
		ips = append(ips, fmt.Sprintf("203.0.113.%d", 100+i))
	}
	for i := range 400 {
		ips = append(ips, fmt.Sprintf("%q", fmt.Sprintf("2001:db8:e::%x", i+1)))
	}
	for i := range 200 {
		ports = append(ports, fmt.Sprintf("{name: p%d, port: %d, targetPort: 8080}", i, 1000+i))
		eports = append(eports, fmt.Sprintf("{name: p%d, port: 8080}", i))
	}
	return hvTwoFamilies("aaa-costly", "10.96.5.61", "2001:db8:96::5:3d", "", "  externalIPs: ["+strings.Join(ips, ", ")+"]\n",
		strings.Join(ports, ", "), strings.Join(eports, ", "), pod)
}

// hvMaglevPorts is a dual-stack Service in hostile with 500 ports and the maglev algorithm,
// endpoint pod.
func hvMaglevPorts(pod *lab.Pod) string {
	var ports, eports []string
	for i := range 500 {
		ports = append(ports, fmt.Sprintf("{name: p%d, port: %d, targetPort: 8080}", i, 1000+i))
		eports = append(eports, fmt.Sprintf("{name: p%d, port: 8080}", i))
	}
	return hvTwoFamilies("maglev-ports", "10.96.5.60", "2001:db8:96::5:3c", ", annotations: {vipgate.io/lb-algorithm: maglev}", "",
		strings.Join(ports, ", "), strings.Join(eports, ", "), pod)
}

// hvTwoFamilies is a dual-stack Service in hostile with its two slices, endpoint pod on node1.
func hvTwoFamilies(name, cip4, cip6, meta, spec, ports, eports string, pod *lab.Pod) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: hostile%[4]s}
spec:
  clusterIPs: [%[2]s, %[3]q]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [%[6]s]
%[5]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-v4, namespace: hostile, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [%[7]s]
endpoints: [{addresses: [%[8]q], nodeName: node1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-v6, namespace: hostile, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv6
ports: [%[7]s]
endpoints: [{addresses: [%[9]q], nodeName: node1}]
`, name, cip4, cip6, meta, spec, ports, eports, pod.IPv4, pod.IPv6)
}

// hvNode is a Node object, so that every node knows the others' addresses (as with the API).
func hvNode(n *lab.Node) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: %s}\nstatus: {addresses: [{type: InternalIP, address: %q}, {type: InternalIP, address: %q}]}\n", n.Name, n.IPv4, n.IPv6)
}

// hvAttacker is a dual-stack Service in hostile, created in 2020 (before kube-dns) and sorting before
// it, on UDP and TCP 53 and TCP 80 with endpoint pod; spec and status are added as given.
func hvAttacker(name, cip4, cip6, spec, status string, pod *lab.Pod) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: hostile, creationTimestamp: "2020-01-01T00:00:00Z", uid: 00000000-%[1]s}
spec:
  clusterIPs: [%[2]s, %[3]q]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 8080}, {name: dns-tcp, port: 53, protocol: TCP, targetPort: 8080}, {name: http, port: 80, targetPort: 8080}, {name: pod, port: 8080, targetPort: 8080}]
%[4]s%[5]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-v4, namespace: hostile, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: dns, port: 8080, protocol: UDP}, {name: dns-tcp, port: 8080, protocol: TCP}, {name: http, port: 8080}, {name: pod, port: 8080}]
endpoints: [{addresses: [%[6]q], nodeName: node1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-v6, namespace: hostile, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv6
ports: [{name: dns, port: 8080, protocol: UDP}, {name: dns-tcp, port: 8080, protocol: TCP}, {name: http, port: 8080}, {name: pod, port: 8080}]
endpoints: [{addresses: [%[7]q], nodeName: node1}]
`, name, cip4, cip6, spec, status, pod.IPv4, pod.IPv6)
}

// hvSliceAttack is a Service of one family whose EndpointSlice points at the given addresses.
func hvSliceAttack(name, cip, family string, addrs ...string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: hostile}
spec: {clusterIP: %[2]q, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-a, namespace: hostile, labels: {kubernetes.io/service-name: %[1]s}}
addressType: %[3]s
ports: [{port: 8080}]
endpoints: [{addresses: ["%[4]s"]}]
`, name, cip, family, strings.Join(addrs, `"]}, {addresses: ["`))
}

// hvRejected is an entry of /status "rejected".
type hvRejected struct {
	Kind, Object, Source, Reason string
}

// hvWaitRejected reads node's /status until ok holds for its rejections (10 s at most, as ndWait).
func hvWaitRejected(t *testing.T, l *lab.Lab, node string, ok func([]hvRejected) bool) []hvRejected {
	t.Helper()
	var last []hvRejected
	for i := 0; i < 100; i++ {
		code, body := ndHTTP(t, l, node, "http://127.0.0.1:10249/status")
		var st struct {
			Rejected []hvRejected `json:"rejected"`
		}
		if code == 200 && json.Unmarshal([]byte(body), &st) == nil {
			last = st.Rejected
			if ok(last) {
				return last
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s /status never showed the expected rejections; last: %+v", node, last)
	return nil
}

func hvFind(rs []hvRejected, object, reason string) bool {
	for _, r := range rs {
		if r.Kind+" "+r.Object == object && strings.Contains(r.Reason, reason) {
			return true
		}
	}
	return false
}

func hvFindObject(rs []hvRejected, object, reason string) bool {
	for _, r := range rs {
		if r.Object == object && strings.Contains(r.Reason, reason) {
			return true
		}
	}
	return false
}
