package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestServiceCIDR: a ServiceCIDR (networking.k8s.io/v1) added through a real kube-apiserver extends
// the node's service CIDRs at run time. The node's config lists 10.96.0.0/16 only (the API server's
// own range); the test adds ServiceCIDR "extra" 203.0.113.64/26 and a Service with a ClusterIP from
// it. Checked on node1's nftables table and with packets from a pod on node1:
//
//   - before: the service-cidrs set lacks the range;
//   - after: it has it, the Service's ClusterIP answers (pod c1 -> 203.0.113.70:80 -> pod w1), and an
//     unallocated IP of the range (203.0.113.99) is dropped (timeout) as one of 10.96.0.0/16 is;
//   - the ServiceCIDR deleted while its IP is in use stays (terminating, finalizer) and so does the
//     range; once it is gone (the finalizer removed, as kube-controller-manager does when its last
//     IP is freed) the range leaves the set.
func TestServiceCIDR(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{{Name: "node1", Pods: []string{"w1", "c1"}}}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	n := l.Node("node1")
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := l.Start(n.Name, "", vipgateBinary(t), "node", "--config", cfg, "--kubeconfig", srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- vipgate on node1:\n%s", p.Tail(40))
		}
	})

	const extraCIDR, clusterIP, unallocated = "203.0.113.64/26", "203.0.113.70", "203.0.113.99"
	serviceCIDRs := func() string {
		out, _ := l.Exec("node1", "nft", "list", "set", "ip", "vipgate", "service-cidrs")
		return out
	}
	waitSet := func(what string, want bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for strings.Contains(serviceCIDRs(), extraCIDR) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: service-cidrs set on node1 after 30 s:\n%s", what, serviceCIDRs())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// vipgate has synced once the configured range is in the set.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(serviceCIDRs(), "10.96.0.0/16") {
		if time.Now().After(deadline) {
			t.Fatalf("vipgate never programmed its service CIDRs:\n%s", serviceCIDRs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(serviceCIDRs(), extraCIDR) {
		t.Fatalf("service-cidrs has %s before any ServiceCIDR said so:\n%s", extraCIDR, serviceCIDRs())
	}

	if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		// The finalizer kube-controller-manager's servicecidrs controller puts on every ServiceCIDR
		// (none runs here): the object stays, terminating, while an IP of its range is in use.
		ObjectMeta: metav1.ObjectMeta{Name: "extra", Finalizers: []string{"networking.k8s.io/service-cidr-finalizer"}},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{extraCIDR}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	waitSet("ServiceCIDR added", true)
	t.Logf("ServiceCIDR %s created -> in node1's service-cidrs set after %v", extraCIDR, time.Since(written).Round(time.Millisecond))

	// A Service from the new range (the API server allocates the ClusterIP from the ServiceCIDR;
	// it refuses one outside every ServiceCIDR) and its EndpointSlice.
	w1 := l.Pod("w1")
	var svc *corev1.Service
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// The API server's allocator learns the new range from its own informer: retry briefly.
		svc, err = c.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "extra-web", Namespace: "default"},
			Spec: corev1.ServiceSpec{
				ClusterIP: clusterIP,
				Ports:     []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		}, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("creating a Service with ClusterIP %s from ServiceCIDR %s: %v", clusterIP, extraCIDR, err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "extra-web-1", Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "vipgate-e2e",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{w1.IPv4.String()}, NodeName: new("node1")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("a Service from the new range is reachable", func(t *testing.T) {
		r := ndWait(t, l, "c1", "tcp", clusterIP+":80", func(r lab.ProbeResult) bool { return r.OK() })
		if r.Pod != "w1" {
			t.Errorf("c1 -> %s:80 answered by %v, want w1", clusterIP, r)
		}
		t.Logf("c1 -> %s:80: %v", clusterIP, r)
	})

	t.Run("an unallocated IP of the new range is dropped as in the first", func(t *testing.T) {
		for _, ip := range []string{unallocated, "10.96.99.99"} {
			r, err := l.Probe("c1", "tcp", ip+":80")
			if err != nil {
				t.Fatal(err)
			}
			if r.Err != "timeout" {
				t.Errorf("c1 -> %s:80 (no Service has this cluster IP): %v, want timeout (dropped)", ip, r)
			}
		}
	})

	t.Run("a terminating ServiceCIDR is kept until it is gone", func(t *testing.T) {
		if err := c.NetworkingV1().ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the ServiceCIDR went at once despite its finalizer: %v", err)
		}
		if got.DeletionTimestamp == nil {
			t.Fatalf("ServiceCIDR extra not terminating after delete: %+v", got.ObjectMeta)
		}
		// Let the deletion reach vipgate (debounce 50 ms): the range must stay, its IP is in use.
		time.Sleep(2 * time.Second)
		if !strings.Contains(serviceCIDRs(), extraCIDR) {
			t.Fatalf("the range left the set while its ServiceCIDR was terminating:\n%s", serviceCIDRs())
		}
		if r, err := l.Probe("c1", "tcp", clusterIP+":80"); err != nil || r.Pod != "w1" {
			t.Errorf("c1 -> %s:80 while its ServiceCIDR terminates: %v %v, want w1", clusterIP, r, err)
		}
		// The servicecidrs controller removes the finalizer once no IP of the range is allocated;
		// none runs here, so the test does it after deleting the Service.
		if err := c.CoreV1().Services("default").Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.NetworkingV1().ServiceCIDRs().Patch(ctx, "extra", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		gone := time.Now()
		waitSet("ServiceCIDR gone", false)
		t.Logf("ServiceCIDR gone -> range out of node1's set after %v", time.Since(gone).Round(time.Millisecond))
	})
}
