package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
)

const goodManifests = `# A Service with two slices, a node and the MetalLB kinds.
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    nodePort: 30080
status:
  loadBalancer:
    ingress:
    - ip: 203.0.113.10
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-b
  namespace: demo
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: [10.244.2.5]
  nodeName: node-b
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: demo
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-a
---
# only a comment: an empty document
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: z1
status:
  addresses:
  - type: InternalIP
    address: 192.0.2.11
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: pool-b
  namespace: metallb-system
spec:
  addresses: [203.0.113.0/28]
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: pool-a
  namespace: metallb-system
spec:
  addresses: [203.0.113.16/28]
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
spec:
  ipAddressPools: [pool-a]
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {name: bgp, namespace: metallb-system}
spec:
  communities: [no-export]
---
apiVersion: metallb.io/v1beta1
kind: Community
metadata: {name: communities, namespace: metallb-system}
spec:
  communities:
  - name: no-export
    value: "65535:65281"
---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {name: fast, namespace: metallb-system}
spec:
  receiveInterval: 300
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: router, namespace: metallb-system}
spec:
  myASN: 64512
  peerASN: 64513
  peerAddress: 198.51.100.1
`

const goodJSON = `{"apiVersion": "v1", "kind": "Service",
 "metadata": {"name": "dns"},
 "spec": {"clusterIP": "10.96.0.53", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}
`

const listManifest = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: listed, namespace: demo}
  spec:
    clusterIP: 10.96.0.20
    ports: [{port: 443}]
- apiVersion: v1
  kind: Service
  metadata: {name: listed-bad, namespace: demo}
  spec:
    clusterIP: 10.96.0.21
    ports: [{port: 443, protocol: HTTP}]
`

// badDocs are the malformations, one per document of bad.yaml, with a word the rejection reason must
// contain.
var badDocs = []struct{ name, doc, reason string }{
	{"malformed YAML", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n", "malformed YAML"},
	{"not a mapping", "just a string\n", "not a YAML mapping"},
	{"no apiVersion/kind", "metadata: {name: x}\n", "apiVersion and kind are required"},
	{"unknown kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", "unsupported kind"},
	{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: typo}\nspec: {clusterIp: 10.96.0.30, ports: [{port: 80}]}\n", "clusterIp"},
	{"duplicate key", "apiVersion: v1\nkind: Service\nmetadata: {name: dupkey}\nspec:\n  clusterIP: 10.96.0.31\n  clusterIP: 10.96.0.32\n  ports: [{port: 80}]\n", "clusterIP"},
	{"nodePort out of range", "apiVersion: v1\nkind: Service\nmetadata: {name: np}\nspec: {type: NodePort, clusterIP: 10.96.0.33, ports: [{port: 80, nodePort: 80}]}\n", "nodePort"},
	{"unknown protocol", "apiVersion: v1\nkind: Service\nmetadata: {name: proto}\nspec: {clusterIP: 10.96.0.34, ports: [{port: 80, protocol: HTTP}]}\n", "protocol"},
	{"duplicate port", "apiVersion: v1\nkind: Service\nmetadata: {name: dupport}\nspec: {clusterIP: 10.96.0.35, ports: [{name: a, port: 80}, {name: b, port: 80}]}\n", "duplicates"},
	{"unparsable IP", "apiVersion: v1\nkind: Service\nmetadata: {name: badip}\nspec: {clusterIP: 10.96.0.999, ports: [{port: 80}]}\n", "spec.clusterIP"},
	{"affinity timeout", "apiVersion: v1\nkind: Service\nmetadata: {name: aff}\nspec: {clusterIP: 10.96.0.36, ports: [{port: 80}], sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 100000}}}\n", "timeoutSeconds"},
	{"missing name", "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo}\nspec: {clusterIP: 10.96.0.37, ports: [{port: 80}]}\n", "metadata.name"},
	{"duplicate Service", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec: {clusterIP: 10.96.0.38, ports: [{port: 80}]}\n", "already defined in file 10-good.yaml document 1"},
	{"cluster IP taken", "apiVersion: v1\nkind: Service\nmetadata: {name: sameip}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n", "cluster IP 10.96.0.10 is already used by Service demo/web"},
	{"nodePort taken", "apiVersion: v1\nkind: Service\nmetadata: {name: sameport}\nspec: {type: NodePort, clusterIP: 10.96.0.39, ports: [{port: 80, nodePort: 30080}]}\n", "nodePort TCP/30080 is already used"},
	{"slice without service-name", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.9]}]\n", "kubernetes.io/service-name"},
	{"FQDN slice", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: fqdn, labels: {kubernetes.io/service-name: web}}\naddressType: FQDN\nendpoints: [{addresses: [db.example.com]}]\n", "FQDN"},
	{"wrong-family endpoint", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: fam, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [\"2001:db8::5\"]}]\n", "addressType"},
	{"endpoint without addresses", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: empty, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{nodeName: node-a}]\n", "endpoints[0].addresses"},
	{"MetalLB unknown field", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {address: [203.0.113.0/28]}\n", "address"},
	{"MetalLB unknown kind", "apiVersion: metallb.io/v1beta1\nkind: BGPPeerX\nmetadata: {name: p}\n", "unsupported MetalLB kind"},
	{"List in List", "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: List, items: []}]\n", "List inside a List"},
}

func writeFile(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// manifestDir builds the test directory: good documents, bad documents, and files to ignore.
func manifestDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "10-good.yaml", goodManifests)
	writeFile(t, dir, "20-dns.json", goodJSON)
	writeFile(t, dir, "30-list.yml", listManifest)
	var docs []string
	for _, b := range badDocs {
		docs = append(docs, b.doc)
	}
	writeFile(t, dir, "40-bad.yaml", strings.Join(docs, "---\n"))
	writeFile(t, dir, "README.txt", "not a manifest")
	writeFile(t, dir, ".web.yaml.swp", "garbage")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFileSourceLoad(t *testing.T) {
	dir := manifestDir(t)
	st, err := NewFileSource(dir, hclog.NewNullLogger()).Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}

	var gotServices []string
	for k := range st.Services {
		gotServices = append(gotServices, k.String())
	}
	slices.Sort(gotServices)
	if diff := cmp.Diff([]string{"default/dns", "demo/listed", "demo/web"}, gotServices); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	web := st.Services[ServiceKey{"demo", "web"}]
	if web == nil || web.Type != TypeLoadBalancer || len(web.LoadBalancerIPs) != 1 {
		t.Errorf("web = %+v", web)
	}
	var sliceNames []string
	for _, es := range st.EndpointSlices[ServiceKey{"demo", "web"}] {
		sliceNames = append(sliceNames, es.Name)
	}
	if diff := cmp.Diff([]string{"web-a", "web-b"}, sliceNames); diff != "" {
		t.Errorf("web's slices, sorted by name (-want +got):\n%s", diff)
	}
	if n := st.Nodes["node-a"]; n == nil || n.Zone != "z1" {
		t.Errorf("node-a = %+v", n)
	}
	m := st.MetalLB
	if len(m.IPAddressPools) != 2 || m.IPAddressPools[0].Name != "pool-a" || len(m.L2Advertisements) != 1 ||
		len(m.BGPAdvertisements) != 1 || len(m.Communities) != 1 || len(m.BFDProfiles) != 1 || len(m.BGPPeers) != 1 {
		t.Errorf("MetalLB = %+v", m)
	}
	if m.BGPPeers[0].Spec.MyASN != 64512 {
		t.Errorf("BGPPeer not decoded: %+v", m.BGPPeers[0].Spec)
	}

	// Every bad document is rejected, once, with its file and document index.
	bySource := map[string]Rejection{}
	for _, r := range st.Rejected {
		if _, dup := bySource[r.Source]; dup {
			t.Errorf("two rejections for %s", r.Source)
		}
		bySource[r.Source] = r
	}
	for i, b := range badDocs {
		src := "file 40-bad.yaml document " + strconv.Itoa(i+1)
		r, ok := bySource[src]
		if !ok { // a bad item of a List
			src += " item 1"
			r, ok = bySource[src]
		}
		if !ok {
			t.Errorf("%s: not rejected (want a rejection from %s)", b.name, src)
			continue
		}
		if !strings.Contains(r.Reason, b.reason) {
			t.Errorf("%s: reason %q does not mention %q", b.name, r.Reason, b.reason)
		}
		delete(bySource, src)
	}
	if r, ok := bySource["file 30-list.yml document 1 item 2"]; !ok || r.Object != "demo/listed-bad" || r.Kind != "Service" {
		t.Errorf("bad List item: got %+v", r)
	} else {
		delete(bySource, "file 30-list.yml document 1 item 2")
	}
	for _, r := range bySource {
		t.Errorf("unexpected rejection: %s", r)
	}
	if len(badDocs) < 12 {
		t.Errorf("only %d malformations tested", len(badDocs))
	}
}

func TestFileSourcePointerStability(t *testing.T) {
	dir := manifestDir(t)
	writeFile(t, dir, "50-other.yaml", `apiVersion: v1
kind: Service
metadata: {name: other, namespace: demo}
spec: {clusterIP: 10.96.0.40, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: demo, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{port: 80}]
endpoints: [{addresses: [10.244.3.3]}]
`)
	fs := NewFileSource(dir, nil)
	first, err := fs.Load()
	if err != nil {
		t.Fatal(err)
	}
	second, err := fs.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(first, second) {
		t.Error("two loads of an unchanged directory differ")
	}
	web, other := ServiceKey{"demo", "web"}, ServiceKey{"demo", "other"}

	// Change one endpoint of web-b (by rewriting the whole file, as an editor does).
	writeFile(t, dir, "10-good.yaml", strings.Replace(goodManifests, "10.244.2.5", "10.244.2.6", 1))
	third, err := fs.Load()
	if err != nil {
		t.Fatal(err)
	}
	if third.Services[web] != first.Services[web] {
		t.Error("unchanged Service web got a new pointer")
	}
	a1, a3 := first.EndpointSlices[web], third.EndpointSlices[web]
	if a3[0] != a1[0] {
		t.Error("unchanged slice web-a got a new pointer")
	}
	if a3[1] == a1[1] || a3[1].Endpoints[0].Addresses[0].String() != "10.244.2.6" {
		t.Error("changed slice web-b kept its old value")
	}
	o1, o3 := first.EndpointSlices[other], third.EndpointSlices[other]
	if &o1[0] != &o3[0] {
		t.Error("the slice list of Service other, which did not change, was not reused")
	}
	if third.MetalLB != first.MetalLB {
		t.Error("unchanged MetalLB config got a new pointer")
	}
	if third.Nodes["node-a"] != first.Nodes["node-a"] {
		t.Error("unchanged Node got a new pointer")
	}
}

func TestFileSourceDirectoryChecks(t *testing.T) {
	if _, err := NewFileSource(filepath.Join(t.TempDir(), "missing"), nil).Load(); err == nil {
		t.Error("Load of a missing directory succeeded")
	}
	dir := t.TempDir()
	writeFile(t, dir, "svc.yaml", goodJSON)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := NewFileSource(dir, nil).Load()
	if err == nil || !strings.Contains(err.Error(), "world-writable") || !strings.Contains(err.Error(), "chmod o-w") {
		t.Errorf("world-writable directory: err = %v", err)
	}
	fs := NewFileSource(dir, nil)
	fs.AllowWorldWritable = true
	if st, err := fs.Load(); err != nil || len(st.Services) != 1 {
		t.Errorf("world-writable directory with AllowWorldWritable: %v", err)
	}

	// A world-writable file in a safe directory is refused alone.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "open.yaml", strings.Replace(goodJSON, "dns", "open", 2))
	if err := os.Chmod(filepath.Join(dir, "open.yaml"), 0o666); err != nil {
		t.Fatal(err)
	}
	st, err := NewFileSource(dir, nil).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 1 || len(st.Rejected) != 1 || !strings.Contains(st.Rejected[0].Reason, "world-writable") {
		t.Errorf("world-writable file: services %v, rejected %v", st.Services, st.Rejected)
	}
}

func TestFileSourceRun(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", svcYAML("a", "10.96.0.1"))
	states := make(chan *State, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	fs := NewFileSource(dir, hclog.NewNullLogger())
	go func() { done <- fs.Run(ctx, func(st *State) { states <- st }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	var last *State
	// waitFor polls the callback until the State satisfies want, within a generous deadline.
	waitFor := func(what string, want func(*State) bool) {
		t.Helper()
		start := time.Now()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case st := <-states:
				last = st
				if want(st) {
					t.Logf("%s: seen after %v", what, time.Since(start).Round(time.Millisecond))
					return
				}
			case <-deadline:
				t.Fatalf("%s: not seen within 5s (last state: %v services)", what, keys(last))
			}
		}
	}
	has := func(names ...string) func(*State) bool {
		return func(st *State) bool { return slices.Equal(keys(st), names) }
	}

	waitFor("first state", has("a"))
	writeFile(t, dir, "b.yaml", svcYAML("b", "10.96.0.2"))
	waitFor("new file", has("a", "b"))
	writeFile(t, dir, "b.yaml", svcYAML("b2", "10.96.0.2"))
	waitFor("rewrite", has("a", "b2"))
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor("delete", has("b2"))
	// An editor saving by rename: write a temporary file, rename it over the original.
	writeFile(t, dir, ".b.yaml.tmp", svcYAML("b3", "10.96.0.3"))
	if err := os.Rename(filepath.Join(dir, ".b.yaml.tmp"), filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor("save by rename", has("b3"))
	// Renaming a manifest to a name the source does not read removes it, and back adds it again.
	if err := os.Rename(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "b.yaml.disabled")); err != nil {
		t.Fatal(err)
	}
	waitFor("rename away", has())
	if err := os.Rename(filepath.Join(dir, "b.yaml.disabled"), filepath.Join(dir, "c.yml")); err != nil {
		t.Fatal(err)
	}
	waitFor("rename in", has("b3"))

	// The whole directory removed and recreated (a new watch is needed).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	// Let the source notice the directory is gone before it comes back (not a timing assertion).
	time.Sleep(300 * time.Millisecond)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "d.yaml", svcYAML("d", "10.96.0.4"))
	waitFor("directory recreated", has("d"))
}

func svcYAML(name, ip string) string {
	return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {clusterIP: " + ip + ", ports: [{port: 80}]}\n"
}

// keys lists a State's Service names, sorted.
func keys(st *State) []string {
	if st == nil {
		return nil
	}
	out := []string{}
	for k := range st.Services {
		out = append(out, k.Name)
	}
	slices.Sort(out)
	return out
}

// TestFileSourceSkipsUnchangedFiles: a load does not read again a file whose identity (inode, size,
// times, mode) did not change, unless it was modified within the last second; a rewrite of the same
// size at once, or a symlink pointed elsewhere (a ConfigMap volume update), is seen.
func TestFileSourceSkipsUnchangedFiles(t *testing.T) {
	dir := manifestDir(t)
	svc := func(port int) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: probe, namespace: demo}\nspec: {clusterIP: 10.96.0.99, ports: [{port: %d}]}\n", port)
	}
	port := func(fs *FileSource) uint16 {
		t.Helper()
		st, err := fs.Load()
		if err != nil {
			t.Fatal(err)
		}
		s := st.Services[ServiceKey{"demo", "probe"}]
		if s == nil {
			t.Fatalf("no Service demo/probe: %v", st.Rejected)
		}
		return s.Ports[0].Port
	}
	fs := NewFileSource(dir, nil)
	writeFile(t, dir, "probe.yaml", svc(81))
	if got := port(fs); got != 81 {
		t.Fatalf("port %d, want 81", got)
	}
	// Rewritten at once, same size: within the racy window it is read again.
	writeFile(t, dir, "probe.yaml", svc(82))
	if got := port(fs); got != 82 {
		t.Errorf("a same-size rewrite right after a load was missed: port %d, want 82", got)
	}
	// Older than the window, unchanged: not read again (a changed byte behind the times' back
	// shows it, which a real write never does).
	old := time.Now().Add(-time.Hour)
	path := filepath.Join(dir, "probe.yaml")
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if got := port(fs); got != 82 {
		t.Fatalf("port %d, want 82", got)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(svc(83)), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, old, old); err != nil { // mtime back; ctime moved, so it is seen
		t.Fatal(err)
	}
	if got := port(fs); got != 83 {
		t.Errorf("a change with the mtime restored was missed (ctime moved): port %d, want 83", got)
	}
	// A ConfigMap-style symlink swap.
	for i, p := range []int{84, 85} {
		sub := filepath.Join(dir, fmt.Sprintf(".data-%d", i))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, sub, "cm.yaml", strings.ReplaceAll(svc(p), "name: probe", "name: cm"))
		os.Remove(filepath.Join(dir, "cm.yaml"))
		if err := os.Symlink(filepath.Join(sub, "cm.yaml"), filepath.Join(dir, "cm.yaml")); err != nil {
			t.Fatal(err)
		}
		st, err := fs.Load()
		if err != nil {
			t.Fatal(err)
		}
		if s := st.Services[ServiceKey{"demo", "cm"}]; s == nil || int(s.Ports[0].Port) != p {
			t.Errorf("symlink swap %d: Service demo/cm %v, want port %d", i, s, p)
		}
	}
}

// TestFileSourceIgnoresProxyLabels checks that the file source leaves alone, silently, the Services and
// EndpointSlices kube-proxy ignores (service.kubernetes.io/headless, service-proxy-name), as the
// Kubernetes source does with its label selector.
func TestFileSourceIgnoresProxyLabels(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "10-svc.yaml", `apiVersion: v1
kind: Service
metadata: {name: plain, namespace: demo}
spec: {clusterIP: 10.96.0.30, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless-label, namespace: demo, labels: {service.kubernetes.io/headless: ""}}
spec: {clusterIP: 10.96.0.31, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other-proxy, namespace: demo, labels: {service.kubernetes.io/service-proxy-name: other}}
spec: {clusterIP: 10.96.0.32, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: broken-but-ignored, namespace: demo, labels: {service.kubernetes.io/headless: ""}}
spec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: headless-label-abc
  namespace: demo
  labels: {kubernetes.io/service-name: headless-label, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.31]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: plain-abc
  namespace: demo
  labels: {kubernetes.io/service-name: plain}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.30]}]
`)
	st, err := NewFileSource(dir, hclog.NewNullLogger()).Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if diff := cmp.Diff([]string{"plain"}, keys(st)); diff != "" {
		t.Errorf("Services (-want +got):\n%s", diff)
	}
	if _, ok := st.EndpointSlices[ServiceKey{"demo", "headless-label"}]; ok || len(st.EndpointSlices) != 1 {
		t.Errorf("slices of ignored Services are in the State: %v", st.EndpointSlices)
	}
	if len(st.Rejected) != 0 {
		t.Errorf("ignored objects are reported as rejected: %v", st.Rejected)
	}

	// serviceProxyName "other": only the Services labelled for it (never the headless-labelled).
	fs := NewFileSource(dir, hclog.NewNullLogger())
	fs.SetServiceProxyName("other")
	if st, err = fs.Load(); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if diff := cmp.Diff([]string{"other-proxy"}, keys(st)); diff != "" {
		t.Errorf("Services with serviceProxyName other (-want +got):\n%s", diff)
	}
	if len(st.EndpointSlices) != 0 || len(st.Rejected) != 0 {
		t.Errorf("slices %v, rejected %v", st.EndpointSlices, st.Rejected)
	}
}
