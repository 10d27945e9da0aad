package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

// MetalLB v0.16.2's own example objects, read from the module (go.mod's version) and applied to a
// real kube-apiserver unchanged, with vipgate's controller and `vipgate node --kubeconfig` on the
// lab nodes instead of MetalLB. The examples come from where MetalLB's users copy them:
//
//   - website/content/configuration/_advanced_bgp_configuration.md: the IPAddressPool first-pool
//     (198.51.100.10/24, inside the lab's documentation ranges) and the v0.16 serviceSelectors
//     example (BGPAdvertisements production-services, localPref 200, and staging-services,
//     localPref 100);
//   - configsamples/bgppeer_simple.yaml: the BGPPeer (iBGP, AS 64512) — its peerAddress
//     172.30.0.3 is MetalLB's kind network, which the lab does not have: it is the one field
//     replaced, by the lab router's LAN address;
//   - configsamples/simple_pool_adv_l2.yaml: the L2Advertisement "empty" (no spec: every pool,
//     every node, every interface). Its IPAddressPool (192.168.10.0/24 and others) is outside the
//     lab ranges and is not applied; first-pool above serves the L2 test too.
//
// MetalLB's documentation range 198.51.100.0/24 is also the lab's client network behind the router
// (the router is .1 on it, the client .10): the BGP test probes from the LAN client instead, whose
// packets the router forwards by the /32 routes BIRD learnt, and the Service whose IP is the
// router's own .1 is the one no advertisement selects. Nothing of this leaves the lab's namespaces.
//
// "The same IPs as MetalLB": MetalLB gives a Service the first free address of its pool in address
// order; the CIDR 198.51.100.10/24 is the network 198.51.100.0/24 (Go's net.ParseCIDR, as MetalLB
// parses it), and MetalLB does not skip .0 unless avoidBuggyIPs is set. So the Services created one
// after the other get 198.51.100.0, .1 and .2.

// metallbModuleDir is the directory of go.mod's MetalLB module in the module cache.
func metallbModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.universe.tf/metallb").Output()
	if err != nil {
		t.Skipf("MetalLB module not in the module cache (go mod download go.universe.tf/metallb): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// fencedYAML matches the ```yaml blocks of a Markdown page.
var fencedYAML = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// metallbExampleObjects decodes every Kubernetes object of a MetalLB example file (a YAML file of
// several documents, or the ```yaml blocks of a Markdown page) as it is written.
func metallbExampleObjects(t *testing.T, rel string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(metallbModuleDir(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	var sources [][]byte
	if strings.HasSuffix(rel, ".md") {
		for _, m := range fencedYAML.FindAllSubmatch(data, -1) {
			sources = append(sources, m[1])
		}
	} else {
		sources = [][]byte{data}
	}
	var out []*unstructured.Unstructured
	for _, src := range sources {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src)))
		for {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				continue // prose-like snippets in the docs (not objects)
			}
			if obj["apiVersion"] == nil || obj["kind"] == nil {
				continue
			}
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
	return out
}

// metallbExample returns the one object of that kind and name in the example file; the test fails
// if MetalLB's file has none or several (the example changed under us).
func metallbExample(t *testing.T, rel, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range metallbExampleObjects(t, rel) {
		if o.GetKind() == kind && o.GetName() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d objects %s %q, want exactly one", rel, len(found), kind, name)
	}
	return found[0]
}

const (
	metallbBGPDoc  = "website/content/configuration/_advanced_bgp_configuration.md"
	metallbPeerDoc = "configsamples/bgppeer_simple.yaml"
	metallbL2Doc   = "configsamples/simple_pool_adv_l2.yaml"
)

// metallbExamplesLab is a lab with a kube-apiserver (MetalLB v0.16.2's CRDs), vipgate's controller
// and `vipgate node --kubeconfig` on every node.
type metallbExamplesLab struct {
	t   *testing.T
	l   *lab.Lab
	srv *apiserver.Server
	ctx context.Context
}

func newMetalLBExamplesLab(t *testing.T, l *lab.Lab) *metallbExamplesLab {
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	srv.InstallMetalLBCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	x := &metallbExamplesLab{t: t, l: l, srv: srv, ctx: ctx}
	for _, ns := range []string{"vipgate-system", "metallb-system"} {
		if _, err := srv.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// apply creates MetalLB objects through the API as they are.
func (x *metallbExamplesLab) apply(objs ...*unstructured.Unstructured) {
	x.t.Helper()
	resources := map[string]string{"IPAddressPool": "ipaddresspools", "L2Advertisement": "l2advertisements",
		"BGPAdvertisement": "bgpadvertisements", "BGPPeer": "bgppeers", "Community": "communities", "BFDProfile": "bfdprofiles"}
	for _, o := range objs {
		gv, err := schema.ParseGroupVersion(o.GetAPIVersion())
		if err != nil || resources[o.GetKind()] == "" {
			x.t.Fatalf("%s %s: not a MetalLB kind this test applies", o.GetAPIVersion(), o.GetKind())
		}
		gvr := gv.WithResource(resources[o.GetKind()])
		if _, err := x.srv.Dynamic.Resource(gvr).Namespace(o.GetNamespace()).Create(x.ctx, o, metav1.CreateOptions{}); err != nil {
			x.t.Fatalf("applying %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		x.t.Logf("applied %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
	}
}

// start runs vipgate's controller in the test and `vipgate node --kubeconfig` on every node.
func (x *metallbExamplesLab) start() {
	t, c := x.t, x.srv.Client
	ctrl, err := cluster.NewLBController(x.srv.RESTConfig(), cluster.LBControllerConfig{Identity: "e2e"},
		hclog.New(&hclog.LoggerOptions{Name: "controller", Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(x.ctx)
	done := make(chan struct{})
	go func() { _ = ctrl.Run(cctx); close(done) }()
	t.Cleanup(func() { ccancel(); <-done })

	bin := vipgateBinary(t)
	procs := map[string]*lab.Proc{}
	for _, n := range x.l.Nodes() {
		if _, err := c.CoreV1().Nodes().Create(x.ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{corev1.LabelHostname: n.Name}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(t.TempDir(), n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := x.l.Start(n.Name, "", append([]string{bin, "node", "--config", cfg, "--kubeconfig", x.srv.Kubeconfig}, memberKeyArgs(t)...)...)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
}

// service creates a LoadBalancer Service with these labels and an EndpointSlice on the given pods,
// and returns the IP the controller writes into its status.
func (x *metallbExamplesLab) service(name string, labels map[string]string, pods ...string) string {
	x.t.Helper()
	c := x.srv.Client
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		pod := x.l.Pod(p)
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{pod.IPv4.String()}, NodeName: new(pod.Node.Name)})
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(x.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("default").Create(x.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
	for {
		s, err := c.CoreV1().Services("default").Get(x.ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			return s.Status.LoadBalancer.Ingress[0].IP
		}
		if x.ctx.Err() != nil {
			x.t.Fatalf("Service %s: no IP allocated", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetalLBExamplesBGP: the BGP examples (first-pool, the serviceSelectors pair, the simple
// BGPPeer) → the Services get MetalLB's IPs; BIRD (iBGP, AS 64512, as the example peer expects)
// receives the production Service's /32 with localPref 200 and the staging one's with localPref 100
// from both nodes, never the unlabelled Service's (no advertisement selects it), and the LAN client
// reaches the production Service through the router.
func TestMetalLBExamplesBGP(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "n1", Pods: []string{"mx1"}},
		{Name: "n2", Pods: []string{"mx2"}},
	}})
	var conf strings.Builder
	fmt.Fprintf(&conf, "router id %s;\nlog stderr all;\nprotocol device {}\nprotocol kernel { ipv4 { export all; }; merge paths on; }\n", lab.RouterLANv4)
	for _, n := range l.Nodes() {
		fmt.Fprintf(&conf, "protocol bgp %s {\n  local %s as 64512;\n  neighbor %s as 64512;\n  direct;\n  connect retry time 1;\n  ipv4 { import all; export none; };\n}\n",
			n.Name, lab.RouterLANv4, n.IPv4)
	}
	bird := routers.StartBIRD(t, l.NS(lab.RoleRouter), conf.String())

	x := newMetalLBExamplesLab(t, l)
	peer := metallbExample(t, metallbPeerDoc, "BGPPeer", "peer")
	if got := peer.Object["spec"].(map[string]any)["peerAddress"]; got != "172.30.0.3" {
		t.Fatalf("%s: peerAddress %v, the test expects MetalLB's 172.30.0.3 to replace", metallbPeerDoc, got)
	}
	// The one substitution: the example's router address is the lab router's.
	if err := unstructured.SetNestedField(peer.Object, lab.RouterLANv4.String(), "spec", "peerAddress"); err != nil {
		t.Fatal(err)
	}
	// Not an example: a v0.15 field vipgate does not implement, on a peer of its own (an address
	// nobody has), to see it accepted and reported rather than silently ignored.
	dual := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer",
		"metadata": map[string]any{"name": "dual", "namespace": "metallb-system"},
		"spec":     map[string]any{"myASN": int64(64512), "peerASN": int64(64512), "peerAddress": "192.0.2.99", "dualStackAddressFamily": true}}}
	x.apply(metallbExample(t, metallbBGPDoc, "IPAddressPool", "first-pool"),
		metallbExample(t, metallbBGPDoc, "BGPAdvertisement", "production-services"),
		metallbExample(t, metallbBGPDoc, "BGPAdvertisement", "staging-services"),
		peer, dual)
	x.start()

	// Created one after the other, so each status is written before the next Service exists: a
	// node state that holds a later Service also holds the earlier ones with their IPs.
	ips := map[string]string{}
	ips["prod"] = x.service("prod", map[string]string{"environment": "production"}, "mx1", "mx2")
	ips["other"] = x.service("other", nil, "mx1", "mx2")
	ips["staging"] = x.service("staging", map[string]string{"environment": "staging"}, "mx1", "mx2")
	want := map[string]string{"prod": "198.51.100.0", "other": "198.51.100.1", "staging": "198.51.100.2"}
	for svc, ip := range want {
		if ips[svc] != ip {
			t.Errorf("Service %s got %s, MetalLB would give %s (first free address of first-pool)", svc, ips[svc], ip)
		}
	}
	t.Logf("allocated as MetalLB does: %v", ips)

	all := []string{l.Node("n1").IPv4.String(), l.Node("n2").IPv4.String()}
	for _, c := range []struct{ svc, localPref string }{{"prod", "200"}, {"staging", "100"}} {
		prefix := ips[c.svc] + "/32"
		waitFor(t, "route "+prefix+" from both nodes", time.Minute, func() bool { return slices.Equal(bird.NextHops(prefix), all) })
		out, _ := bird.Birdc("show", "route", "for", prefix, "all")
		if !strings.Contains(out, "BGP.local_pref: "+c.localPref) {
			t.Errorf("%s (%s): want local_pref %s from its BGPAdvertisement's serviceSelectors:\n%s", prefix, c.svc, c.localPref, out)
		}
	}
	// staging's route left the nodes in a sync whose state already held "other" with its IP.
	if hops := bird.NextHops(ips["other"] + "/32"); len(hops) > 0 {
		out, _ := bird.Birdc("show", "route", "all")
		t.Errorf("%s (Service other, selected by no serviceSelectors) is advertised via %v:\n%s", ips["other"], hops, out)
	}
	r := x.probeOK(lab.RoleLANClient, ips["prod"]+":80")
	t.Logf("LAN client -> router -> %s:80 (BGP route, ECMP over both nodes): answered by %s", ips["prod"], r.Pod)

	ev := x.waitEvent("BGPPeer", "dual", "spec.dualStackAddressFamily is not supported by vipgate")
	t.Logf("Event on BGPPeer dual: %s %s: %s", ev.Type, ev.Reason, ev.Message)
}

// waitEvent waits for a Warning Event on the metallb-system object whose message contains msg.
func (x *metallbExamplesLab) waitEvent(kind, name, msg string) corev1.Event {
	x.t.Helper()
	for {
		evs, err := x.srv.Client.CoreV1().Events("metallb-system").List(x.ctx, metav1.ListOptions{})
		if err != nil {
			x.t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, msg) {
				return e
			}
		}
		if x.ctx.Err() != nil {
			x.t.Fatalf("no Warning Event on %s %s saying %q; Events: %+v", kind, name, msg, evs.Items)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeOK probes hostport from role until a pod answers (at most a minute).
func (x *metallbExamplesLab) probeOK(role, hostport string) lab.ProbeResult {
	x.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := x.l.Probe(role, "tcp", hostport)
		if err != nil {
			x.t.Fatal(err)
		}
		if r.OK() {
			return r
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("probe %s from %s: %v", hostport, role, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMetalLBExamplesL2: the L2 example (the L2Advertisement "empty": every pool, node and
// interface) with first-pool → the Service gets 198.51.100.0 and one node answers ARP for it on
// the LAN although no node address is in 198.51.100.0/24 (MetalLB answers on every interface; the
// LAN client routes 198.51.100.0/24 on-link, inside its own lab namespace), so the LAN client
// reaches it.
func TestMetalLBExamplesL2(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "n1", Pods: []string{"ml1"}},
		{Name: "n2", Pods: []string{"ml2"}},
	}})
	x := newMetalLBExamplesLab(t, l)
	x.apply(metallbExample(t, metallbBGPDoc, "IPAddressPool", "first-pool"),
		metallbExample(t, metallbL2Doc, "L2Advertisement", "empty"))
	x.start()
	ip := x.service("web", nil, "ml1", "ml2")
	if ip != "198.51.100.0" {
		t.Errorf("Service web got %s, MetalLB would give 198.51.100.0 (first free address of first-pool)", ip)
	}
	if _, err := l.Exec(lab.RoleLANClient, "ip", "route", "add", "198.51.100.0/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := l.Probe(lab.RoleLANClient, "tcp", ip+":80")
		if err != nil {
			t.Fatal(err)
		}
		if r.OK() {
			t.Logf("LAN client -> %s:80 (ARP-announced, on-link from another prefix): answered by %s", ip, r.Pod)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s:80 from the LAN client: %v", ip, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
