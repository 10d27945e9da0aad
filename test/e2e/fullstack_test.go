package e2e

import (
	"context"
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

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestFullStackThroughTheAPI: everything a bare-metal cluster needs, through a real kube-apiserver.
// The test creates a MetalLB IPAddressPool (on the LAN subnet) and L2Advertisement, Node objects, and a
// LoadBalancer Service with an EndpointSlice — nothing else. `vipgate controller` allocates the IP
// into status, `vipgate node --kubeconfig` on both nodes programs the dataplane and answers ARP for
// it from one node, and the client behind the router reaches a pod with no route configured by hand.
func TestFullStackThroughTheAPI(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"fs-1"}},
		{Name: "node2", Pods: []string{"fs-2"}},
	}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	srv.InstallMetalLBCRDs(t)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	startKubeNodes(ctx, t, l, srv, bin, nil)

	pod1, pod2 := l.Pod("fs-1"), l.Pod("fs-2")
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{pod1.IPv4.String()}, NodeName: new("node1")},
			{Addresses: []string{pod2.IPv4.String()}, NodeName: new("node2")},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip string
	for ip == "" {
		s, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			ip = s.Status.LoadBalancer.Ingress[0].IP
		}
		if time.Since(created) > time.Minute {
			t.Fatal("no IP allocated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	allocated := time.Since(created)
	r := kubeWaitProbe(t, l, ip+":80", func(r lab.ProbeResult) bool { return r.OK() })
	t.Logf("Service created -> IP %s in status after %v -> first answer through it (ARP-announced, client behind the router) after %v, from %s",
		ip, allocated.Round(time.Millisecond), time.Since(created).Round(time.Millisecond), r.Pod)

	// The Service's Events tell where its IP came from and which node announces it.
	want := map[string]string{cluster.EventIPAllocated: "Assigned IP " + ip, "nodeAssigned": "announcing " + ip + " from node"}
	deadline := time.Now().Add(30 * time.Second)
	for len(want) > 0 {
		evs, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "web" && strings.Contains(e.Message, want[e.Reason]) && want[e.Reason] != "" {
				t.Logf("Event %s: %s", e.Reason, e.Message)
				delete(want, e.Reason)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("missing Events on Service web: %v", want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
