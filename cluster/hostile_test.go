package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// specialAddrs are the addresses no Service entry and no endpoint may be, both families, with the
// class the rejection must name.
var specialAddrs = []struct{ addr, class string }{
	{"0.0.0.0", "unspecified"},
	{"0.1.2.3", "this network"},
	{"::", "unspecified"},
	{"127.0.0.1", "loopback"},
	{"127.9.9.9", "loopback"},
	{"::1", "loopback"},
	{"169.254.169.254", "link-local"},
	{"fe80::1", "link-local"},
	{"224.0.0.251", "multicast"},
	{"239.1.2.3", "multicast"},
	{"ff02::fb", "multicast"},
	{"255.255.255.255", "broadcast"},
	{"::ffff:127.0.0.1", "loopback"}, // IPv4-mapped: the IPv4 address it is
}

// TestSpecialAddressesRejected: a special address in any Service field that becomes an entry, or in
// an EndpointSlice, rejects the object with the field and the class named; an ordinary address of
// the same family passes.
func TestSpecialAddressesRejected(t *testing.T) {
	for _, sa := range specialAddrs {
		a := netip.MustParseAddr(sa.addr).Unmap()
		v6 := a.Is6()
		cases := []struct {
			field  string
			mutate func(*corev1.Service)
		}{
			{"spec.externalIPs[0]", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{sa.addr} }},
			{"status.loadBalancer.ingress[0].ip", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: sa.addr}}
			}},
			{"spec.clusterIP", func(s *corev1.Service) { s.Spec.ClusterIP = sa.addr }},
		}
		for _, c := range cases {
			t.Run(c.field+"="+sa.addr, func(t *testing.T) {
				svc := baseService()
				if v6 {
					svc.Spec.ClusterIP = "2001:db8:96::10"
				}
				c.mutate(svc)
				_, err := ServiceFromAPI(svc)
				if err == nil {
					t.Fatalf("accepted %s %s", c.field, sa.addr)
				}
				if !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), sa.class) {
					t.Errorf("error %q names neither %s nor %q", err, c.field, sa.class)
				}
				if got := ErrorAddr(err); got != a {
					t.Errorf("ErrorAddr(%q) = %v, want %s", err, got, a)
				}
			})
		}
		t.Run("endpoint="+sa.addr, func(t *testing.T) {
			es := baseSlice()
			if v6 {
				es.AddressType = discoveryv1.AddressTypeIPv6
			}
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{sa.addr}})
			if v6 {
				es.Endpoints[0].Addresses = []string{"2001:db8:244::5"}
			}
			_, err := EndpointSliceFromAPI(es)
			if err == nil || !strings.Contains(err.Error(), "endpoints[1].addresses[0]") || !strings.Contains(err.Error(), sa.class) {
				t.Errorf("EndpointSliceFromAPI: %v", err)
			}
		})
	}
	// Ordinary addresses of both families still pass.
	svc := baseService()
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"203.0.113.5"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.6"}}
	if _, err := ServiceFromAPI(svc); err != nil {
		t.Errorf("ordinary addresses refused: %v", err)
	}
}

// TestRejectionAddr: a rejection about one address carries it (Rejection.Addr), from both sources:
// a special address, and in files a cluster IP another Service took first; a rejection about no
// one address (a node port taken, a parse error) carries none.
func TestRejectionAddr(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", `apiVersion: v1
kind: Service
metadata: {name: first, namespace: demo}
spec: {clusterIP: 10.96.0.20, type: NodePort, ports: [{port: 80, nodePort: 30080}]}
---
apiVersion: v1
kind: Service
metadata: {name: same-ip, namespace: demo}
spec: {clusterIP: 10.96.0.20, ports: [{port: 81}]}
---
apiVersion: v1
kind: Service
metadata: {name: same-nodeport, namespace: demo}
spec: {clusterIP: 10.96.0.21, type: NodePort, ports: [{port: 80, nodePort: 30080}]}
---
apiVersion: v1
kind: Service
metadata: {name: loopback, namespace: demo}
spec: {clusterIP: 10.96.0.22, externalIPs: ["127.0.0.1"], ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: not-an-ip, namespace: demo}
spec: {clusterIP: 10.96.0.23, externalIPs: ["x"], ports: [{port: 80}]}
`)
	st := loadWithin(t, NewFileSource(dir, hclog.NewNullLogger()))
	want := map[string]netip.Addr{
		"demo/same-ip":       netip.MustParseAddr("10.96.0.20"),
		"demo/same-nodeport": {},
		"demo/loopback":      netip.MustParseAddr("127.0.0.1"),
		"demo/not-an-ip":     {},
	}
	for _, r := range st.Rejected {
		if w, ok := want[r.Object]; !ok || r.Addr != w {
			t.Errorf("file source: %s has Addr %v, want %v", r, r.Addr, w)
		}
		delete(want, r.Object)
	}
	if len(want) != 0 {
		t.Errorf("file source: not rejected: %v", want)
	}

	b := newKubeBuilder(hclog.NewNullLogger(), nil)
	svc := apiService("loopback", "u1", "1", "10.96.0.24")
	svc.Spec.ExternalIPs = []string{"127.0.0.1"}
	kst := b.build(kubeObjects{services: []*corev1.Service{svc, apiService("bad", "u2", "1", "not-an-ip")}})
	if len(kst.Rejected) != 2 {
		t.Fatalf("Kubernetes source rejected %v, want loopback and bad", kst.Rejected)
	}
	for _, r := range kst.Rejected {
		if w := map[string]netip.Addr{"default/loopback": netip.MustParseAddr("127.0.0.1")}[r.Object]; r.Addr != w {
			t.Errorf("Kubernetes source: %s has Addr %v, want %v", r, r.Addr, w)
		}
	}
}

// TestServiceClaimFields: the Service model carries what orders claims (creationTimestamp, uid).
func TestServiceClaimFields(t *testing.T) {
	svc := baseService()
	at := time.Unix(1_700_000_000, 0)
	svc.CreationTimestamp = metav1.NewTime(at)
	svc.UID = "2c8b7f3e"
	got, err := ServiceFromAPI(svc)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Created.Equal(at) || got.UID != "2c8b7f3e" {
		t.Errorf("Created %v, UID %q", got.Created, got.UID)
	}
	mk := func(name string, created time.Time, uid string) *Service {
		return &Service{Key: ServiceKey{Namespace: "x", Name: name}, Created: created, UID: uid}
	}
	for _, tc := range []struct {
		a, b *Service
		want int
	}{
		{mk("zzz", at, "b"), mk("aaa", at.Add(time.Second), "a"), -1}, // older wins whatever the name
		{mk("zzz", at, "a"), mk("aaa", at, "b"), -1},                  // same second: smaller uid
		{mk("zzz", at, ""), mk("aaa", time.Time{}, "a"), -1},          // a stated age beats none
		{mk("zzz", at, ""), mk("aaa", at, "a"), 1},                    // a uid beats none
		{mk("aaa", time.Time{}, ""), mk("zzz", time.Time{}, ""), -1},  // nothing stated: the name
	} {
		if got := ClaimOrder(tc.a, tc.b); got != tc.want || ClaimOrder(tc.b, tc.a) != -tc.want {
			t.Errorf("ClaimOrder(%s, %s) = %d, want %d (and the opposite)", tc.a.Key.Name, tc.b.Key.Name, got, tc.want)
		}
	}
}

// TestObjectLimits: the API server's limits per object, each over-limit object rejected with the
// field named.
func TestObjectLimits(t *testing.T) {
	es := baseSlice()
	for i := 0; i <= MaxSliceEndpoints; i++ {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i/250, 1+i%250)}})
	}
	if _, err := EndpointSliceFromAPI(es); err == nil || !strings.Contains(err.Error(), "endpoints: 1002 endpoints") {
		t.Errorf("slice of %d endpoints: %v", len(es.Endpoints), err)
	}
	es = baseSlice()
	for i := 0; i <= MaxEndpointAddresses; i++ {
		es.Endpoints[0].Addresses = append(es.Endpoints[0].Addresses, fmt.Sprintf("10.244.2.%d", i+1))
	}
	if _, err := EndpointSliceFromAPI(es); err == nil || !strings.Contains(err.Error(), "endpoints[0].addresses") {
		t.Errorf("endpoint of %d addresses: %v", len(es.Endpoints[0].Addresses), err)
	}
	es = baseSlice()
	for i := 0; i <= MaxSlicePorts; i++ {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", i)), Port: ptr.To[int32](int32(1 + i%65535))})
	}
	if _, err := EndpointSliceFromAPI(es); err == nil || !strings.Contains(err.Error(), "ports: 20002 ports") {
		t.Errorf("slice of %d ports: %v", len(es.Ports), err)
	}
	svc := baseService()
	svc.Spec.Ports = nil
	for i := 1; i <= 65535; i++ {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(i)})
	}
	if _, err := ServiceFromAPI(svc); err == nil || !strings.Contains(err.Error(), "spec.ports: 65535 ports") {
		t.Errorf("Service of 65,535 ports: %v", err)
	}
	svc.Spec.Ports = svc.Spec.Ports[:MaxServicePorts]
	if _, err := ServiceFromAPI(svc); err != nil {
		t.Errorf("Service of %d ports: %v", MaxServicePorts, err)
	}
}

// hostileDir is a manifest directory with one good Service and its slice.
func hostileDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "10-good.yaml", `apiVersion: v1
kind: Service
metadata: {name: good, namespace: demo}
spec: {clusterIP: 10.96.0.50, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-a, namespace: demo, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.50]}]
`)
	return dir
}

// loadWithin loads the directory and fails the test if that does not finish: a FIFO must never
// block the file source. (Not a timing assertion: the bound only turns a hang into a failure.)
func loadWithin(t *testing.T, fs *FileSource) *State {
	t.Helper()
	type result struct {
		st  *State
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := fs.Load()
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Load: %v", r.err)
		}
		return r.st
	case <-time.After(time.Minute):
		t.Fatal("Load hangs")
	}
	return nil
}

// rejectedFor returns the reasons the State gives for rejecting object (a file name or an object).
func rejectedFor(st *State, object string) []string {
	var out []string
	for _, r := range st.Rejected {
		if r.Object == object {
			out = append(out, r.Reason)
		}
	}
	return out
}

// TestFileSourceHostileFiles: FIFOs, devices, links to them, oversized files and objects are each
// refused alone, and the good Service still loads.
func TestFileSourceHostileFiles(t *testing.T) {
	dir := hostileDir(t)
	if err := syscall.Mkfifo(filepath.Join(dir, "a.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo2 := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo2, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fifo2, filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.yaml": "a FIFO", "b.yaml": "a FIFO"}
	if os.Geteuid() == 0 {
		// A character device (the same numbers as /dev/null): never opened.
		if err := syscall.Mknod(filepath.Join(dir, "c.yaml"), syscall.S_IFCHR|0o644, 1<<8|3); err == nil {
			want["c.yaml"] = "a character device"
		} else {
			t.Logf("mknod: %v (device case skipped)", err)
		}
	}
	// An EndpointSlice over the API's limit, and a 65,535-port Service.
	var eps strings.Builder
	for i := 0; i < 1100; i++ {
		fmt.Fprintf(&eps, "- addresses: [10.244.%d.%d]\n", 10+i/250, 1+i%250)
	}
	writeFile(t, dir, "d.yaml", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: big, namespace: demo, labels: {kubernetes.io/service-name: good}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n"+eps.String())
	var ports strings.Builder
	for i := 1; i <= 65535; i++ {
		fmt.Fprintf(&ports, "  - {name: p%d, port: %d}\n", i, i)
	}
	writeFile(t, dir, "e.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: manyports, namespace: demo}\nspec:\n  clusterIP: 10.96.0.51\n  ports:\n"+ports.String())

	st := loadWithin(t, NewFileSource(dir, nil))
	if st.Services[ServiceKey{"demo", "good"}] == nil || len(st.EndpointSlices[ServiceKey{"demo", "good"}]) != 1 {
		t.Errorf("the good Service or its slice is missing: %v", describeState(st))
	}
	for file, reason := range want {
		if got := rejectedFor(st, file); len(got) != 1 || !strings.Contains(got[0], reason) {
			t.Errorf("%s: rejections %q, want one naming %q", file, got, reason)
		}
	}
	if got := rejectedFor(st, "demo/big"); len(got) != 1 || !strings.Contains(got[0], "1100 endpoints") {
		t.Errorf("oversized slice: %q", got)
	}
	if got := rejectedFor(st, "demo/manyports"); len(got) != 1 || !strings.Contains(got[0], "65535 ports") {
		t.Errorf("65,535-port Service: %q", got)
	}
	if st.Services[ServiceKey{"demo", "manyports"}] != nil {
		t.Error("the 65,535-port Service is in the State")
	}
}

// TestFileSourceBudgets: a document over the API's request size is refused undecoded, a file that
// would take the directory over its budget is refused alone.
func TestFileSourceBudgets(t *testing.T) {
	defer func(d int, b int64) { maxDocumentSize, maxDirBytes = d, b }(maxDocumentSize, maxDirBytes)
	maxDocumentSize = 4096
	dir := hostileDir(t)
	writeFile(t, dir, "20-huge.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: huge, namespace: demo, annotations: {x: \""+strings.Repeat("x", 5000)+"\"}}\nspec: {clusterIP: 10.96.0.52, ports: [{port: 80}]}\n")
	st := loadWithin(t, NewFileSource(dir, nil))
	if len(st.Services) != 1 || len(st.Rejected) != 1 || !strings.Contains(st.Rejected[0].Reason, "not decoded") {
		t.Errorf("oversized document: services %v, rejected %v", describeState(st), st.Rejected)
	}

	maxDocumentSize = 3 << 20
	fi, err := os.Stat(filepath.Join(dir, "10-good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	maxDirBytes = fi.Size() + 100 // the good file fits, the huge one does not
	st = loadWithin(t, NewFileSource(dir, nil))
	if got := rejectedFor(st, "20-huge.yaml"); len(got) != 1 || !strings.Contains(got[0], "would hold more than") {
		t.Errorf("over the directory budget: %q", got)
	}
	if st.Services[ServiceKey{"demo", "good"}] == nil {
		t.Error("the good Service is missing")
	}
}

// TestConfigFileHostile: a FIFO, a link to one, a world-writable file: refused without blocking; an
// expanded value never appears in an error.
func TestConfigFileHostile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.yaml")
	if err := os.WriteFile(open, []byte(goodNodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{fifo, "a FIFO"},
		{link, "a FIFO"},
		{open, "world-writable"},
	} {
		done := make(chan error, 1)
		go func() { _, err := LoadConfig(tc.path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadConfig(%s): %v, want an error naming %q", filepath.Base(tc.path), err, tc.want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("LoadConfig(%s) hangs", filepath.Base(tc.path))
		}
	}

	// A secret in the environment, put where it makes the config invalid: the error names the
	// variable, never the value.
	t.Setenv("VG_TEST_SECRET", "S3cr3t_T0ken.Value")
	for i, body := range []string{
		"apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: ${VG_TEST_SECRET}\nnodeIPs: [192.0.2.11]\n",
		"apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: node-a\nnodeIPs: [\"${VG_TEST_SECRET}\"]\n",
		"apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: node-a\nnodeIPs: [192.0.2.11]\n${VG_TEST_SECRET}: 1\n",
		"apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: node-a\nnodeIPs: [192.0.2.11]\ntableName: \"${VG_TEST_SECRET}!\"\n",
	} {
		path := filepath.Join(dir, fmt.Sprintf("secret%d.yaml", i))
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadNodeConfig(path)
		if err == nil {
			t.Errorf("config %d loaded", i)
			continue
		}
		if strings.Contains(err.Error(), "S3cr3t") {
			t.Errorf("config %d: the error shows the expanded value: %v", i, err)
		}
		if !strings.Contains(err.Error(), "${VG_TEST_SECRET}") {
			t.Errorf("config %d: the error does not name the variable: %v", i, err)
		}
	}
}

// TestExternalIPPolicyConfig: the externalIPs option of a NodeConfig.
func TestExternalIPPolicyConfig(t *testing.T) {
	c, err := ParseNodeConfig([]byte(goodNodeConfig + "externalIPs:\n  allowedCIDRs: [203.0.113.0/24, \"2001:db8:ff::/64\"]\n  allowNodeIPs: true\n  allowClusterCIDRs: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ExternalIPs.AllowedCIDRs) != 2 || !c.ExternalIPs.AllowNodeIPs || !c.ExternalIPs.AllowClusterCIDRs {
		t.Errorf("ExternalIPs = %+v", c.ExternalIPs)
	}
	if c, err = ParseNodeConfig([]byte(goodNodeConfig)); err != nil || c.ExternalIPs.AllowedCIDRs != nil || c.ExternalIPs.AllowNodeIPs || c.ExternalIPs.AllowClusterCIDRs {
		t.Errorf("default ExternalIPs = %+v, %v", c.ExternalIPs, err)
	}
	if _, err := ParseNodeConfig([]byte(goodNodeConfig + "externalIPs: {allowedCIDRs: [203.0.113.0/33]}\n")); err == nil || !strings.Contains(err.Error(), "externalIPs.allowedCIDRs[0]") {
		t.Errorf("bad CIDR: %v", err)
	}
}

// TestServiceLimitsConfig: the serviceLimits option of a NodeConfig and a GatewayConfig (issue
// #27): values are kept, unset means the defaults, and a value out of range is an error naming
// the field.
func TestServiceLimitsConfig(t *testing.T) {
	c, err := ParseNodeConfig([]byte(goodNodeConfig + "serviceLimits: {maxEntries: 500, maxElements: 4096}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ServiceLimits != (ServiceLimits{MaxEntries: 500, MaxElements: 4096}) {
		t.Errorf("ServiceLimits = %+v", c.ServiceLimits)
	}
	if c, err = ParseNodeConfig([]byte(goodNodeConfig)); err != nil || c.ServiceLimits.WithDefaults() != (ServiceLimits{MaxEntries: DefaultMaxServiceEntries, MaxElements: DefaultMaxServiceElements}) {
		t.Errorf("default ServiceLimits = %+v, %v", c.ServiceLimits, err)
	}
	for _, bad := range []string{"{maxEntries: -1}", "{maxElements: 16777217}", "{maxelements: 5}"} {
		if _, err := ParseNodeConfig([]byte(goodNodeConfig + "serviceLimits: " + bad + "\n")); err == nil || !strings.Contains(strings.ToLower(err.Error()), "servicelimits.max") {
			t.Errorf("serviceLimits: %s: %v", bad, err)
		}
	}
	g, err := ParseGatewayConfig([]byte(goodGatewayConfig + "serviceLimits: {maxElements: 9000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g.ServiceLimits.WithDefaults() != (ServiceLimits{MaxEntries: DefaultMaxServiceEntries, MaxElements: 9000}) {
		t.Errorf("gateway ServiceLimits = %+v", g.ServiceLimits)
	}
	if _, err := ParseGatewayConfig([]byte(goodGatewayConfig + "serviceLimits: {maxEntries: -5}\n")); err == nil || !strings.Contains(err.Error(), "serviceLimits.maxEntries") {
		t.Errorf("gateway serviceLimits.maxEntries -5: %v", err)
	}
}
