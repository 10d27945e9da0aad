package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// upstreamDirectives is CoreDNS's own directive order (from its plugin.cfg), saved before
// main's init replaces dnsserver.Directives: package variables are initialised before any init.
var upstreamDirectives = slices.Clone(dnsserver.Directives)

const manifestPath = "../cluster/manifests/coredns.yaml"

// TestDirectives checks the compiled-in chain: CoreDNS's order, and a registered plugin for each.
func TestDirectives(t *testing.T) {
	if len(upstreamDirectives) < 40 {
		t.Fatalf("upstream directive list looks wrong: %v", upstreamDirectives)
	}
	if !slices.Equal(dnsserver.Directives, directives) {
		t.Fatalf("dnsserver.Directives = %v, want %v", dnsserver.Directives, directives)
	}
	// directives must be a subsequence of upstreamDirectives.
	i := 0
	for _, d := range directives {
		j := slices.Index(upstreamDirectives[i:], d)
		if j < 0 {
			t.Fatalf("directive %q is not in CoreDNS's list after position %d (out of order or unknown): %v", d, i, upstreamDirectives)
		}
		i += j + 1
	}
	registered := caddy.ListPlugins()["others"] // "dns.<name>" for plugins of the dns server type
	for _, d := range directives {
		if !slices.Contains(registered, "dns."+d) {
			t.Errorf("directive %q has no registered plugin (missing import?); registered: %v", d, registered)
		}
	}
}

type object struct {
	u   *unstructured.Unstructured
	raw []byte
}

func readManifest(t *testing.T) map[string]object {
	t.Helper()
	f, err := os.Open(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	objs := map[string]object{}
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), 4096).Decode(&u.Object); err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		key := u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
		if _, dup := objs[key]; dup {
			t.Fatalf("duplicate object %s", key)
		}
		objs[key] = object{u: u, raw: doc}
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// TestManifest decodes every document of the manifest, strictly, into its typed API object and
// checks what the cluster and the e2e tests rely on.
func TestManifest(t *testing.T) {
	objs := readManifest(t)
	want := []string{
		"ServiceAccount/kube-system/coredns",
		"ClusterRole//system:coredns",
		"ClusterRoleBinding//system:coredns",
		"ConfigMap/kube-system/coredns",
		"Deployment/kube-system/coredns",
		"Service/kube-system/kube-dns",
	}
	var got []string
	for k := range objs {
		got = append(got, k)
	}
	slices.Sort(got)
	sortedWant := slices.Clone(want)
	slices.Sort(sortedWant)
	if !slices.Equal(got, sortedWant) {
		t.Fatalf("objects = %v, want %v", got, sortedWant)
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	typed := map[string]runtime.Object{}
	for k, o := range objs {
		obj, _, err := dec.Decode(o.raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: strict decode: %v", k, err)
		}
		typed[k] = obj
	}

	svc := typed["Service/kube-system/kube-dns"].(*corev1.Service)
	if svc.Spec.ClusterIP != "10.96.0.10" || svc.Spec.Selector["k8s-app"] != "kube-dns" || svc.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("Service kube-dns: clusterIP %q selector %v labels %v", svc.Spec.ClusterIP, svc.Spec.Selector, svc.Labels)
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, p.Name+":"+string(p.Protocol)+":"+p.TargetPort.String())
	}
	if !slices.Equal(ports, []string{"dns:UDP:53", "dns-tcp:TCP:53", "metrics:TCP:9153"}) {
		t.Errorf("Service kube-dns ports = %v", ports)
	}

	crb := typed["ClusterRoleBinding//system:coredns"].(*rbacv1.ClusterRoleBinding)
	if crb.RoleRef.Name != "system:coredns" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "coredns" || crb.Subjects[0].Namespace != "kube-system" {
		t.Errorf("ClusterRoleBinding: %+v", crb)
	}
	cr := typed["ClusterRole//system:coredns"].(*rbacv1.ClusterRole)
	allowed := map[string]bool{}
	for _, r := range cr.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") {
					allowed[g+"/"+res] = true
				}
			}
		}
	}
	for _, need := range []string{"discovery.k8s.io/endpointslices", "/services", "/namespaces", "/pods"} {
		if !allowed[need] {
			t.Errorf("ClusterRole system:coredns does not allow list+watch on %s", need)
		}
	}

	dep := typed["Deployment/kube-system/coredns"].(*appsv1.Deployment)
	pod := dep.Spec.Template
	if pod.Labels["k8s-app"] != "kube-dns" || dep.Spec.Selector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("Deployment labels %v selector %v", pod.Labels, dep.Spec.Selector)
	}
	if pod.Spec.ServiceAccountName != "coredns" || pod.Spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("Deployment serviceAccount %q priorityClass %q", pod.Spec.ServiceAccountName, pod.Spec.PriorityClassName)
	}
	c := pod.Spec.Containers[0]
	if wantImage := "registry.k8s.io/coredns/coredns:" + corednsVersion(t); c.Image != wantImage {
		t.Errorf("image %q, want %q (the CoreDNS version this module builds)", c.Image, wantImage)
	}
	if !slices.Equal(c.Args, []string{"-conf", "/etc/coredns/Corefile"}) {
		t.Errorf("args %v", c.Args)
	}
	if p := c.ReadinessProbe.HTTPGet; p.Path != "/ready" || p.Port.String() != "readiness-probe" {
		t.Errorf("readiness probe %+v", p)
	}
	if p := c.LivenessProbe.HTTPGet; p.Path != "/health" || p.Port.String() != "liveness-probe" {
		t.Errorf("liveness probe %+v", p)
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Add, "NET_BIND_SERVICE") {
		t.Errorf("capabilities %+v", c.SecurityContext.Capabilities)
	}

	cm := typed["ConfigMap/kube-system/coredns"].(*corev1.ConfigMap)
	for _, it := range pod.Spec.Volumes[0].ConfigMap.Items {
		if _, ok := cm.Data[it.Key]; !ok {
			t.Errorf("volume item %q not in ConfigMap coredns", it.Key)
		}
	}
	checkCorefile(t, cm.Data["Corefile"])
	if _, err := parseZone(cm.Data["root.db"]); err != nil {
		t.Errorf("root.db: %v", err)
	}
}

// checkCorefile parses the cluster Corefile and checks it uses only compiled-in plugins and has
// no forward (the cluster has no upstream).
func checkCorefile(t *testing.T, corefile string) {
	t.Helper()
	blocks, err := caddyfile.Parse("Corefile", strings.NewReader(corefile), directives)
	if err != nil {
		t.Fatalf("Corefile: %v", err)
	}
	if len(blocks) != 1 || !slices.Equal(blocks[0].Keys, []string{".:53"}) {
		t.Fatalf("Corefile server blocks: %+v", blocks)
	}
	for _, d := range []string{"errors", "health", "ready", "kubernetes", "prometheus", "cache", "loop", "reload", "loadbalance", "file"} {
		if _, ok := blocks[0].Tokens[d]; !ok {
			t.Errorf("Corefile lacks %q", d)
		}
	}
	if _, ok := blocks[0].Tokens["forward"]; ok {
		t.Errorf("Corefile forwards to an upstream")
	}
	if !strings.Contains(corefile, "kubernetes cluster.local in-addr.arpa ip6.arpa {") {
		t.Errorf("Corefile kubernetes zones are not cluster.local in-addr.arpa ip6.arpa")
	}
}

func parseZone(z string) ([]dns.RR, error) {
	zp := dns.NewZoneParser(strings.NewReader(z), ".", "root.db")
	var rrs []dns.RR
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		rrs = append(rrs, rr)
	}
	return rrs, zp.Err()
}

func corednsVersion(t *testing.T) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	for _, m := range bi.Deps {
		if m.Path == "github.com/coredns/coredns" {
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	t.Fatal("github.com/coredns/coredns is not a dependency")
	return ""
}

// TestServe starts this build's CoreDNS in process, on 127.0.0.1 only, with the cluster's
// fallback (the root zone of the ConfigMap) plus a hosts entry, and queries it over UDP and TCP.
func TestServe(t *testing.T) {
	objs := readManifest(t)
	data, _, _ := unstructured.NestedStringMap(objs["ConfigMap/kube-system/coredns"].u.Object, "data")
	rootDB := filepath.Join(t.TempDir(), "root.db")
	if err := os.WriteFile(rootDB, []byte(data["root.db"]), 0o644); err != nil {
		t.Fatal(err)
	}
	corefile := `.:0 {
    bind 127.0.0.1
    errors
    hosts {
        192.0.2.55 test.example
        fallthrough
    }
    cache 30
    loop
    loadbalance
    file ` + rootDB + ` .
}
`
	caddy.Quiet = true
	dnsserver.Quiet = true
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(corefile), Filepath: "Corefile", ServerTypeName: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	srvs := inst.Servers()
	if len(srvs) != 1 || srvs[0].LocalAddr() == nil || srvs[0].Addr() == nil {
		t.Fatalf("servers: %+v", srvs)
	}
	udp, tcp := srvs[0].LocalAddr().String(), srvs[0].Addr().String()
	for _, a := range []string{udp, tcp} {
		if h, _, _ := net.SplitHostPort(a); h != "127.0.0.1" {
			t.Fatalf("listening on %s, want 127.0.0.1 only", a)
		}
	}

	for _, tc := range []struct {
		net, addr, name string
		rcode           int
		a               string
	}{
		{"udp", udp, "test.example.", dns.RcodeSuccess, "192.0.2.55"},
		{"tcp", tcp, "test.example.", dns.RcodeSuccess, "192.0.2.55"},
		{"udp", udp, "kubernetes.io.", dns.RcodeNameError, ""},
		{"udp", udp, "10.0.96.10.in-addr.arpa.", dns.RcodeNameError, ""},
	} {
		m := new(dns.Msg)
		qtype := dns.TypeA
		if strings.HasSuffix(tc.name, ".arpa.") {
			qtype = dns.TypePTR
		}
		m.SetQuestion(tc.name, qtype)
		cl := &dns.Client{Net: tc.net, Timeout: 5 * time.Second}
		r, _, err := cl.Exchange(m, tc.addr)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.net, tc.name, err)
		}
		if r.Rcode != tc.rcode {
			t.Errorf("%s %s: rcode %s, want %s", tc.net, tc.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode])
			continue
		}
		if tc.a != "" {
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != tc.a {
				t.Errorf("%s %s: answer %v, want A %s", tc.net, tc.name, r.Answer, tc.a)
			}
		} else if len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA || !r.Authoritative {
			t.Errorf("%s %s: NXDOMAIN without an authoritative SOA: %v", tc.net, tc.name, r)
		}
		t.Logf("%s %s %s: %s %v", tc.net, tc.name, dns.TypeToString[qtype], dns.RcodeToString[r.Rcode], r.Answer)
	}
}
