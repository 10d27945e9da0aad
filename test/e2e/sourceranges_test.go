package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// The upstream [sig-network] LoadBalancers test "should only allow access from service
// loadbalancer source ranges" (test/e2e/network/loadbalancer.go, v1.36.3) in packets: an accept pod
// and a drop pod on two different nodes, the Service's endpoints on both, and the outside client;
// the Service's loadBalancerSourceRanges are rewritten step by step as the upstream test does while
// `vipgate node` runs on both nodes. Pods reach the LoadBalancer IP through their own node's rules,
// so a node whose table kept an older, wider chain would let them in while the outside client
// (through another node) is kept out.

// srAccess is what one client must get from the LoadBalancer IP after a step.
type srAccess int

const (
	srAnswered srAccess = iota
	srDropped
	srEither // not checked (the step is about the others)
)

// srStep is one update of the Service's source ranges and what the outside client, the accept
// pod and the drop pod get afterwards.
type srStep struct {
	name                 string
	ranges               []string
	client, accept, drop srAccess
}

// srUpstreamSteps are the upstream test's updates. acceptIP is the accept pod's address, nodeIP
// its node's.
func srUpstreamSteps(acceptIP, nodeIP netip.Addr) []srStep {
	return []srStep{
		{"unset", nil, srAnswered, srAnswered, srAnswered},
		{"the accept pod and its node", []string{acceptIP.String() + "/32", nodeIP.String() + "/32"}, srDropped, srAnswered, srDropped},
		{"allow all", []string{"0.0.0.0/1", "128.0.0.0/1"}, srAnswered, srAnswered, srAnswered},
		{"deny all, essentially", []string{"255.0.0.0/32"}, srDropped, srDropped, srDropped},
		{"cleared", nil, srAnswered, srAnswered, srAnswered},
	}
}

// srCheck waits until each client gets what step s says (answered by one of servers, or no answer
// at all), then checks that it holds for three more flows each: a verdict seen once could have
// caught a sync on its way.
func srCheck(t *testing.T, s srStep, vip netip.AddrPort, servers []string, probe func(from string) lab.ProbeResult) {
	t.Helper()
	clients := []struct {
		from string
		want srAccess
	}{{lab.RoleClient, s.client}, {"accept", s.accept}, {"drop", s.drop}}
	judge := func(r lab.ProbeResult, want srAccess) string {
		switch {
		case want == srAnswered && (!r.OK() || !slices.Contains(servers, r.Pod)):
			return fmt.Sprintf("%v, want an answer from %v", r, servers)
		case want == srDropped && r.OK():
			return fmt.Sprintf("answered by %s (source seen %s), want no answer", r.Pod, r.Src)
		}
		return ""
	}
	for _, c := range clients {
		if c.want == srEither {
			continue
		}
		dpEventually(t, dpSettleTimeout, fmt.Sprintf("%s: %s -> %s", s.name, c.from, vip), func() string { return judge(probe(c.from), c.want) })
	}
	for _, c := range clients {
		if c.want == srEither {
			continue
		}
		for range 3 {
			if why := judge(probe(c.from), c.want); why != "" {
				t.Errorf("%s: %s -> %s (held): %s", s.name, c.from, vip, why)
			}
		}
	}
}

// srLabSpec: the accept pod and the drop pod on two nodes, an endpoint on each.
var srLabSpec = lab.Spec{Nodes: []lab.NodeSpec{
	{Name: "node1", Pods: []string{"accept", "srv1"}},
	{Name: "node2", Pods: []string{"drop", "srv2"}},
}}

// TestSourceRangesSequence: the upstream steps through the manifest source, then a rejected update:
// a source range list with an invalid entry must not leave the wider rules of the step before in
// place (the Service is refused as a whole, so its LoadBalancer IP answers nobody).
func TestSourceRangesSequence(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	oldTimeout := lab.ProbeTimeout
	lab.ProbeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { lab.ProbeTimeout = oldTimeout })

	l := lab.NewForTest(t, srLabSpec)
	d := dpStartVIPGate(t, l, nil)
	for _, p := range dpRoutedViaNode1 {
		if err := l.AddRoute(netip.MustParsePrefix(p), "node1"); err != nil {
			t.Fatal(err)
		}
	}
	accept, srv1, srv2 := l.Pod("accept"), l.Pod("srv1"), l.Pod("srv2")
	const lbIP = "203.0.113.15"
	vip := dpAP(lbIP, 80)
	spec := dpSvcSpec{Name: "lb-sourcerange", Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.13.1"},
		Ports: dpTcpUDP("web", 80, 8080, 0), LoadBalancerIPs: []string{lbIP}}
	steps := srUpstreamSteps(accept.IPv4, lab.NodeIPv4(1))
	steps = append(steps,
		srStep{"allow all again", []string{"0.0.0.0/1", "128.0.0.0/1"}, srAnswered, srAnswered, srAnswered},
		// kube-proxy ignores an invalid entry (and with none valid left, allows everyone); vipgate
		// refuses the Service: the pods, outside every valid range, must be kept out either way.
		srStep{"an invalid entry", []string{"198.51.100.0/24", "not-a-cidr"}, srEither, srDropped, srDropped},
		srStep{"valid again", []string{"198.51.100.0/24"}, srAnswered, srDropped, srDropped},
	)
	probe := func(from string) lab.ProbeResult { return d.probe(t, from, "tcp", vip) }
	for _, s := range steps {
		spec.SourceRanges = s.ranges
		d.write(t, "13-lb-sourcerange.yaml", dpManifest(spec, dpReady(srv1, srv2)))
		srCheck(t, s, vip, dpNames(srv1, srv2), probe)
	}
}

// TestSourceRangesSequenceThroughTheAPI: the upstream steps through a real kube-apiserver, as the
// upstream test makes them: `vipgate controller` allocates the LoadBalancer IP (an L2 pool on the
// LAN), `vipgate node --kubeconfig` on both nodes reads the updates from its informers.
func TestSourceRangesSequenceThroughTheAPI(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	oldTimeout := lab.ProbeTimeout
	lab.ProbeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { lab.ProbeTimeout = oldTimeout })

	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: srLabSpec.Nodes})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	srv.InstallMetalLBCRDs(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, ns := range []string{"vipgate-system", "metallb-system"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, obj := range []map[string]any{
		{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": map[string]any{"name": "lan", "namespace": "metallb-system"},
			"spec": map[string]any{"addresses": []any{"192.0.2.200-192.0.2.210"}}},
		{"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": map[string]any{"name": "lan", "namespace": "metallb-system"},
			"spec": map[string]any{"ipAddressPools": []any{"lan"}}},
	} {
		res := "ipaddresspools"
		if obj["kind"] == "L2Advertisement" {
			res = "l2advertisements"
		}
		gvr := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: res}
		if _, err := srv.Dynamic.Resource(gvr).Namespace("metallb-system").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctrl, err := cluster.NewLBController(srv.RESTConfig(), cluster.LBControllerConfig{Identity: "e2e"}, hclog.New(&hclog.LoggerOptions{Name: "controller", Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = ctrl.Run(cctx); close(done) }()
	defer func() { ccancel(); <-done }()

	bin := vipgateBinary(t)
	procs := startKubeNodes(ctx, t, l, srv, bin, nil)
	t.Cleanup(func() {
		if t.Failed() {
			for name := range procs {
				out, _ := l.Exec(name, "nft", "list", "table", "ip", "vipgate")
				t.Logf("--- table ip vipgate on %s:\n%s", name, out)
			}
		}
	})

	accept, srv1, srv2 := l.Pod("accept"), l.Pod("srv1"), l.Pod("srv2")
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "lb-sourcerange-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "lb-sourcerange"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{srv1.IPv4.String()}, NodeName: new("node1")},
			{Addresses: []string{srv2.IPv4.String()}, NodeName: new("node2")},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-sourcerange", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip netip.Addr
	for deadline := time.Now().Add(time.Minute); !ip.IsValid(); time.Sleep(20 * time.Millisecond) {
		s, err := c.CoreV1().Services("default").Get(ctx, "lb-sourcerange", metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			ip, _ = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		}
		if time.Now().After(deadline) {
			t.Fatal("no LoadBalancer IP allocated")
		}
	}
	vip := netip.AddrPortFrom(ip, 80)
	probe := func(from string) lab.ProbeResult {
		r, err := l.Probe(from, "tcp", vip.String())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, s := range srUpstreamSteps(accept.IPv4, lab.NodeIPv4(1)) {
		svc, err := c.CoreV1().Services("default").Get(ctx, "lb-sourcerange", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Spec.LoadBalancerSourceRanges = s.ranges
		if _, err := c.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		srCheck(t, s, vip, dpNames(srv1, srv2), probe)
		if t.Failed() {
			return
		}
	}
}
