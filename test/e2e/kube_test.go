package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// kubeOutage is how long TestKubeAPIOutage keeps the API server down while traffic must keep
// flowing. Ten seconds covers several client-go retry rounds and keeps CI short; the full
// minute is VIPGATE_API_OUTAGE=60s.
var kubeOutage = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("VIPGATE_API_OUTAGE")); err == nil && d > 0 && d <= 10*time.Minute {
		return d
	}
	return 10 * time.Second
}()

// kubeVIP is the LoadBalancer IP the test writes into the Service's status (the allocator is not
// part of this test) and routes from the router to node1.
var kubeVIP = netip.MustParseAddr("203.0.113.10")

// TestKubeAPIOutage runs the whole path with a real kube-apiserver: the API server runs in the lab's
// LAN client namespace (192.0.2.100), `vipgate node --kubeconfig` runs in both node namespaces and
// reaches it over the lab LAN, the test creates a LoadBalancer Service and its EndpointSlice through
// the API, and a client behind the router reaches the pods through the VIP. Then the API server is
// stopped: traffic keeps flowing on the rules in place. After it comes back, an endpoint change made
// through the API is applied.
func TestKubeAPIOutage(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"kweb-1"}},
		{Name: "node2", Pods: []string{"kweb-2"}},
	}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := vipgateBinary(t)
	nodes := map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		// The Node objects a kubelet would register; the speaker reads their labels.
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(t.TempDir(), n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, "", bin, "node", "--config", cfg, "--kubeconfig", srv.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range nodes {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
	if err := l.AddRoute(netip.PrefixFrom(kubeVIP, 32), "node1"); err != nil {
		t.Fatal(err)
	}
	vip := kubeVIP.String() + ":80"
	pod1, pod2 := l.Pod("kweb-1"), l.Pod("kweb-2")

	// The Service and its EndpointSlice, as the API server, the allocator and the EndpointSlice
	// controller would leave them.
	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "vipgate-e2e",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{pod1.IPv4.String()}, NodeName: new("node1")},
			{Addresses: []string{pod2.IPv4.String()}, NodeName: new("node2")},
		},
	}
	if slice, err = c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: kubeVIP.String()}}
	if _, err := c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	r := kubeWaitProbe(t, l, vip, func(r lab.ProbeResult) bool { return r.OK() })
	t.Logf("API write -> first successful probe through the VIP: %v (answered by %s)", time.Since(written).Round(time.Millisecond), r.Pod)

	t.Run("outage", func(t *testing.T) {
		srv.Stop()
		start := time.Now()
		interval := 200 * time.Millisecond
		s, err := l.ProbeMany(lab.RoleClient, "tcp", vip, int(kubeOutage/interval), interval)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("API server down: %d/%d probes answered in %v (%v)", s.OK, s.Sent, time.Since(start).Round(time.Millisecond), s.Pods)
		if s.OK != s.Sent || s.Pods[pod1.Name]+s.Pods[pod2.Name] != s.Sent {
			t.Errorf("traffic broke while the API server was down: %+v", s)
		}
		for name, p := range nodes {
			if exited, err := p.Exited(); exited {
				t.Errorf("vipgate on %s exited during the outage: %v\n%s", name, err, p.Tail(20))
			}
		}
	})

	t.Run("change after the outage", func(t *testing.T) {
		srv.Restart(t)
		// Drop kweb-1 from the slice: only kweb-2 may answer once the change is applied.
		slice.Endpoints = slice.Endpoints[1:]
		if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		deadline := written.Add(90 * time.Second)
		for {
			s, err := l.ProbeMany(lab.RoleClient, "tcp", vip, 10, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if s.Pods[pod2.Name] == s.Sent {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the endpoint change was not applied after the API server came back: %+v", s)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// client-go's watch reconnect backoff dominates this figure.
		t.Logf("API write after the restart -> change applied: %v", time.Since(written).Round(time.Millisecond))
	})
}

// kubeWaitProbe probes addr from the client until ok accepts a result (at most a minute).
func kubeWaitProbe(t *testing.T, l *lab.Lab, addr string, ok func(lab.ProbeResult) bool) lab.ProbeResult {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := l.Probe(lab.RoleClient, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s: %v", addr, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
