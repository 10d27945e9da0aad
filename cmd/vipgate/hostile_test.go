package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/proxy"
)

// victimManifests is kube-dns, dual-stack, created after every attacker below: its cluster IP
// entries are its own whatever age or name a Service that claims them has.
const victimManifests = `apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, creationTimestamp: "2026-06-01T00:00:00Z", uid: 5f0c2d1e-victim}
spec:
  clusterIPs: [10.96.0.10, "2001:db8:96::a"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v4, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints: [{addresses: [10.244.1.10], nodeName: node1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v6, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv6
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints: [{addresses: ["2001:db8:244:1::10"], nodeName: node1}]
`

// attacker is a Service in default, older than kube-dns and sorting before it, that claims the
// given externalIPs (or LoadBalancer ingress IPs) on UDP and TCP 53 and 80, with an endpoint.
func attacker(name, family, field string, ips ...string) string {
	cip, ep, fam := "10.96.0.200", "10.244.2.66", "IPv4"
	if family == "IPv6" {
		cip, ep, fam = "2001:db8:96::c8", "2001:db8:244:2::66", "IPv6"
	}
	typ, status, spec := "ClusterIP", "", ""
	quoted := `"` + strings.Join(ips, `", "`) + `"`
	if field == "lb" {
		typ = "LoadBalancer"
		var ing []string
		for _, ip := range ips {
			ing = append(ing, fmt.Sprintf("{ip: %q, ipMode: VIP}", ip))
		}
		status = "status: {loadBalancer: {ingress: [" + strings.Join(ing, ", ") + "]}}\n"
	} else {
		spec = "  externalIPs: [" + quoted + "]\n"
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default, creationTimestamp: "2020-01-01T00:00:00Z", uid: 0000-%[1]s}
spec:
  type: %[2]s
  clusterIP: %[3]q
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}, {name: http, port: 80}]
%[4]s%[5]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-a, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: %[6]s
ports: [{name: dns, port: 5353, protocol: UDP}, {name: dns-tcp, port: 5353, protocol: TCP}, {name: http, port: 8080}]
endpoints: [{addresses: [%[7]q]}]
`, name, typ, cip, spec, status, fam, ep)
}

// attackerSlice is an EndpointSlice that points a Service of default at the given addresses.
func attackerSlice(name, family string, addrs ...string) string {
	cip := "10.96.0.201"
	if family == "IPv6" {
		cip = "2001:db8:96::c9"
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec: {clusterIP: %[2]q, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-a, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: %[3]s
ports: [{port: 80}]
endpoints: [{addresses: ["%[4]s"]}]
`, name, cip, family, strings.Join(addrs, `", "`))
}

const hostileNodeConfig = `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11", "2001:db8:1::11"]
clusterCIDRs: ["10.244.0.0/16", "2001:db8:244::/48"]
serviceCIDRs: ["10.96.0.0/16", "2001:db8:96::/108"]
`

// hostileExternalIPs turns externalIPs on everywhere (kube-proxy's behaviour; the default allows
// none), so that the corpus proves the screens behind the allow-list. A case whose config sets
// externalIPs itself replaces it.
const hostileExternalIPs = "externalIPs: {allowedCIDRs: [\"0.0.0.0/0\", \"::/0\"]}\n"

// hostileCase is one hostile object (or pair), what must be refused and why, and the addresses that
// must not lead to the attacker.
type hostileCase struct {
	name      string
	manifests string
	// config is appended to hostileNodeConfig.
	config string
	// object is the refused object, "Kind namespace/name"; reason a word of the reason.
	object, reason string
	// probes are destinations ("ADDR:PORT/PROTO") that must not reach the attacker's endpoint.
	probes []string
}

// hostileCorpus holds the cases of issue 15, both families.
func hostileCorpus() []hostileCase {
	var out []hostileCase
	for _, fam := range []string{"IPv4", "IPv6"} {
		v4 := fam == "IPv4"
		pick := func(a, b string) string {
			if v4 {
				return a
			}
			return b
		}
		probe := func(addr string, ports ...string) []string {
			var out []string
			for _, p := range ports {
				var port uint16
				var proto string
				fmt.Sscanf(strings.Replace(p, "/", " ", 1), "%d %s", &port, &proto)
				out = append(out, netip.AddrPortFrom(netip.MustParseAddr(addr), port).String()+"/"+proto)
			}
			return out
		}
		dns := pick("10.96.0.10", "2001:db8:96::a")
		out = append(out,
			hostileCase{name: fam + " externalIP on kube-dns's cluster IP", manifests: attacker("aaa-capture", fam, "ext", dns),
				object: "Service default/aaa-capture", reason: "inside the service CIDR", probes: probe(dns, "53/udp", "53/tcp", "80/tcp")},
			hostileCase{name: fam + " externalIP on kube-dns's cluster IP, service CIDRs allowed", manifests: attacker("aaa-capture", fam, "ext", dns),
				config: "externalIPs: {allowedCIDRs: [\"0.0.0.0/0\", \"::/0\"], allowClusterCIDRs: true}\n",
				object: "Service default/aaa-capture", reason: "a cluster IP entry always wins", probes: probe(dns, "53/udp", "53/tcp")},
			hostileCase{name: fam + " LoadBalancer IP on kube-dns's cluster IP", manifests: attacker("aaa-lb", fam, "lb", dns),
				object: "Service default/aaa-lb", reason: "inside the service CIDR", probes: probe(dns, "53/udp", "53/tcp", "80/tcp")},
			hostileCase{name: fam + " externalIP on the node's IP", manifests: attacker("aaa-node", fam, "ext", pick("192.0.2.11", "2001:db8:1::11")),
				object: "Service default/aaa-node", reason: "node's address", probes: probe(pick("192.0.2.11", "2001:db8:1::11"), "80/tcp", "53/udp")},
			hostileCase{name: fam + " externalIP on a pod IP", manifests: attacker("aaa-pod", fam, "ext", pick("10.244.1.10", "2001:db8:244:1::10")),
				object: "Service default/aaa-pod", reason: "pod", probes: probe(pick("10.244.1.10", "2001:db8:244:1::10"), "53/udp", "80/tcp")},
		)
		for _, sa := range []struct{ v4, v6, class string }{
			{"127.0.0.1", "::1", "loopback"},
			{"0.0.0.0", "::", "unspecified"},
			{"224.0.0.251", "ff02::fb", "multicast"},
			{"169.254.169.254", "fe80::1", "link-local"},
			{"255.255.255.255", "", "broadcast"},
		} {
			a := pick(sa.v4, sa.v6)
			if a == "" {
				continue
			}
			out = append(out,
				hostileCase{name: fam + " externalIP " + a, manifests: attacker("aaa-special", fam, "ext", a),
					object: "Service default/aaa-special", reason: sa.class, probes: probe(a, "80/tcp", "53/udp")},
				hostileCase{name: fam + " LoadBalancer IP " + a, manifests: attacker("aaa-special-lb", fam, "lb", a),
					object: "Service default/aaa-special-lb", reason: sa.class, probes: probe(a, "80/tcp", "53/udp")},
			)
		}
		for _, ep := range []string{pick("127.0.0.1", "::1"), pick("169.254.169.254", "fe80::1")} {
			out = append(out, hostileCase{name: fam + " endpoint " + ep, manifests: attackerSlice("aaa-ep", fam, ep),
				object: "EndpointSlice default/aaa-ep-a", reason: "an endpoint", probes: probe(pick("10.96.0.201", "2001:db8:96::c9"), "80/tcp")})
		}
		// Equals: two external IP claims on one address. The younger sorts first and loses.
		vip := pick("203.0.113.50", "2001:db8:ff::50")
		young := strings.Replace(attacker("aaa-young", fam, "ext", vip), "2020-01-01T00:00:00Z", "2026-07-01T00:00:00Z", 1)
		old := strings.Replace(strings.ReplaceAll(attacker("zzz-old", fam, "ext", vip), pick("10.96.0.200", "2001:db8:96::c8"), pick("10.96.0.202", "2001:db8:96::ca")),
			pick("10.244.2.66", "2001:db8:244:2::66"), pick("10.244.2.67", "2001:db8:244:2::67"), 1)
		out = append(out, hostileCase{name: fam + " two externalIP claims, the younger sorts first", manifests: young + old,
			object: "Service default/aaa-young", reason: "it was created first", probes: probe(vip, "80/tcp")})
		// KEP-5707: externalIPs are off by default, and outside the allow-list when it is set.
		out = append(out,
			hostileCase{name: fam + " externalIP with externalIPs off (the default)", manifests: attacker("aaa-ext", fam, "ext", vip),
				config: "externalIPs: {}\n", object: "Service default/aaa-ext", reason: "externalIPs are off", probes: probe(vip, "80/tcp")},
			hostileCase{name: fam + " externalIP outside externalIPs.allowedCIDRs", manifests: attacker("aaa-ext", fam, "ext", vip),
				config: "externalIPs: {allowedCIDRs: [\"198.51.100.0/24\", \"2001:db8:aa::/64\"]}\n", object: "Service default/aaa-ext",
				reason: "outside externalIPs.allowedCIDRs", probes: probe(vip, "80/tcp")},
		)
		// Issue #27: Services whose cost is a product of their fields (ports x addresses x slots)
		// are refused as a whole, over the node's serviceLimits; the configured limit is used.
		cip := pick("10.96.0.203", "2001:db8:96::cb")
		out = append(out,
			hostileCase{name: fam + " 400 externalIPs x 200 ports", manifests: costlyService(fam, cip, 400, 200, ""),
				object: "Service default/aaa-costly", reason: "serviceLimits.maxEntries 20000", probes: probe(cip, "1000/tcp", "1199/tcp")},
			hostileCase{name: fam + " maglev over a configured maxElements", manifests: costlyService(fam, cip, 0, 40, "maglev"),
				config: "serviceLimits: {maxElements: 4000}\n",
				object: "Service default/aaa-costly", reason: "serviceLimits.maxElements 4000", probes: probe(cip, "1000/tcp")},
		)
	}
	return out
}

// costlyService is a Service of default with n externalIPs (IPv4: 198.51.100.0/24 and on; IPv6:
// 2001:db8:e::/64) and the given number of ports, the given lb-algorithm, and one endpoint (the
// attacker's).
func costlyService(family, cip string, n, ports int, alg string) string {
	var ips, sp, ep []string
	for i := range n {
		if family == "IPv4" {
			ips = append(ips, fmt.Sprintf("%q", netip.AddrFrom4([4]byte{198, 51, byte(100 + i/250), byte(1 + i%250)}).String()))
		} else {
			ips = append(ips, fmt.Sprintf(`"2001:db8:e::%x"`, i+1))
		}
	}
	for i := range ports {
		sp = append(sp, fmt.Sprintf("{name: p%d, port: %d}", i, 1000+i))
		ep = append(ep, fmt.Sprintf("{name: p%d, port: %d}", i, 8000+i))
	}
	addr := "10.244.2.66"
	if family == "IPv6" {
		addr = "2001:db8:244:2::66"
	}
	ann := ""
	if alg != "" {
		ann = fmt.Sprintf(", annotations: {vipgate.io/lb-algorithm: %s}", alg)
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: aaa-costly, namespace: default, creationTimestamp: "2020-01-01T00:00:00Z", uid: 0000-costly%s}
spec:
  clusterIP: %q
  externalIPs: [%s]
  ports: [%s]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aaa-costly-a, namespace: default, labels: {kubernetes.io/service-name: aaa-costly}}
addressType: %s
ports: [%s]
endpoints: [{addresses: [%q]}]
`, ann, cip, strings.Join(ips, ", "), strings.Join(sp, ", "), family, strings.Join(ep, ", "), addr)
}

// renderCase renders the victim and one hostile case like `vipgate render`, and returns the node's
// rejections (the file source's and the node's own), the stderr log and the two families' rulesets.
func renderCase(t *testing.T, tc hostileCase) (rejected []cluster.Rejection, log string, cfgPath, dir string) {
	t.Helper()
	dir = t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"10-kube-dns.yaml": victimManifests, "20-hostile.yaml": tc.manifests} {
		if err := os.WriteFile(filepath.Join(manifests, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath = filepath.Join(dir, "node1.yaml")
	nodeConfig := hostileNodeConfig + tc.config
	if !strings.Contains(tc.config, "externalIPs:") {
		nodeConfig += hostileExternalIPs
	}
	if err := os.WriteFile(cfgPath, []byte(nodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.LoadNodeConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &logBuf, Level: hclog.Warn})
	st, err := cluster.NewFileSource(manifests, logger).Load()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := renderNode(&out, logger, cfg, st); err != nil {
		t.Fatalf("render: %v", err)
	}
	rejected = append(rejected, st.Rejected...)
	dpCfg := proxy.ConfigFor(cfg, logger)
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, conflicts, err := proxy.BuildRuleset(dpCfg, f, st)
		if err != nil {
			t.Fatal(err)
		}
		rejected = append(rejected, conflicts...)
		// No special address anywhere in the maps, as a key or as a DNAT target.
		for set, els := range rs.Flatten().Elements {
			for _, e := range els {
				for _, a := range []netip.Addr{e.Addr, e.DataAddr} {
					if a.IsValid() && cluster.SpecialAddrClass(a) != "" {
						t.Errorf("%s holds the special address %s: %+v", set, a, e)
					}
				}
			}
		}
	}
	return rejected, logBuf.String(), cfgPath, manifests
}

// TestHostileCorpusRender: every hostile object of the corpus is refused alone, with its reason, in
// what render reports (stderr) and in explain's trace; kube-dns keeps its entries in both families;
// no special address is programmed; the hostile addresses never lead to the attacker.
func TestHostileCorpusRender(t *testing.T) {
	for _, tc := range hostileCorpus() {
		t.Run(tc.name, func(t *testing.T) {
			rejected, log, cfgPath, manifests := renderCase(t, tc)
			found := false
			for _, r := range rejected {
				if r.Kind+" "+r.Object == tc.object && strings.Contains(r.Reason, tc.reason) {
					found = true
				} else if r.Object != "" && !strings.HasPrefix(r.Object, "default/") {
					t.Errorf("an object that is not the attacker's is refused: %v", r)
				}
			}
			if !found {
				t.Errorf("no rejection of %s naming %q: %v", tc.object, tc.reason, rejected)
			}
			if !strings.Contains(log, strings.SplitN(tc.object, " ", 2)[1]) {
				t.Errorf("render's stderr does not name %s:\n%s", tc.object, log)
			}
			// The victim answers in both families, with its own endpoint.
			for _, v := range []struct{ to, want string }{
				{"10.96.0.10:53/udp", "10.244.1.10:53"}, {"10.96.0.10:53/tcp", "10.244.1.10:53"},
				{"[2001:db8:96::a]:53/udp", "[2001:db8:244:1::10]:53"},
			} {
				rep, err := explainFor(&explainFlags{from: fromFor(v.to), to: v.to, config: cfgPath, manifests: manifests})
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Candidates) != 1 || rep.Candidates[0].Endpoint != v.want {
					t.Errorf("kube-dns %s: %s %v, want DNAT to %s", v.to, rep.Outcome, rep.Candidates, v.want)
				}
				if !strings.HasPrefix(rep.Service, "kube-system/kube-dns ") {
					t.Errorf("explain %s names the Service %q, want kube-dns", v.to, rep.Service)
				}
			}
			// The hostile destinations never lead to the attacker, and explain says why.
			for _, p := range tc.probes {
				rep, err := explainFor(&explainFlags{from: fromFor(p), to: p, config: cfgPath, manifests: manifests})
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range rep.Candidates {
					if strings.Contains(c.Endpoint, "10.244.2.66") || strings.Contains(c.Endpoint, "2001:db8:244:2::66") {
						t.Errorf("%s reaches the attacker's endpoint %s", p, c.Endpoint)
					}
				}
				if tc.reason != "an endpoint" && !strings.Contains(fmt.Sprint(rep.Rejected), tc.reason) {
					t.Errorf("explain %s does not say why: rejected %v", p, rep.Rejected)
				}
			}
		})
	}
}

// fromFor is a client address of the family of the destination "ADDR:PORT/PROTO".
func fromFor(to string) string {
	if strings.HasPrefix(to, "[") {
		return "2001:db8:2::10"
	}
	return "198.51.100.10"
}
