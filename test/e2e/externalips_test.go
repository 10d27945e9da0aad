package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestExternalIPsAllowList is the externalIPs opt-in (KEP-5707: externalIPs are deprecated, and a
// service proxy should not support them by default) in packets and Events, through a real
// kube-apiserver: one Service with three external IPs, `vipgate node --kubeconfig` on two nodes.
// node1 allows 203.0.113.0/25, node2 has the default policy (none). The router sends
// 203.0.113.0/24 to node1 and 203.0.113.21 to node2, so:
//   - 203.0.113.20 (inside node1's allow-list) answers, as kube-proxy would: the Service works;
//   - 203.0.113.200 (outside it) does not, and the Service has a Warning Event "Rejected" that
//     names the address and the allow-list;
//   - 203.0.113.21 (inside node1's list, but routed to node2) does not: externalIPs are off on
//     node2, whose Event says so.
func TestExternalIPsAllowList(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	oldTimeout := lab.ProbeTimeout
	lab.ProbeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { lab.ProbeTimeout = oldTimeout })

	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"srv1"}},
		{Name: "node2", Pods: []string{"srv2"}},
	}})
	for prefix, node := range map[string]string{"203.0.113.0/24": "node1", "203.0.113.21/32": "node2"} {
		if err := l.AddRoute(netip.MustParsePrefix(prefix), node); err != nil {
			t.Fatal(err)
		}
	}
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	bin := vipgateBinary(t)
	policy := map[string]string{"node1": "externalIPs: {allowedCIDRs: [\"203.0.113.0/25\"]}\n", "node2": ""}
	startKubeNodes(ctx, t, l, srv, bin, func(n *lab.Node) string { return policy[n.Name] })

	srv1, srv2 := l.Pod("srv1"), l.Pod("srv2")
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "ext-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "ext"}},
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
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ExternalIPs: []string{"203.0.113.20", "203.0.113.200", "203.0.113.21"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a Service with externalIPs (is DenyServiceExternalIPs on?): %v", err)
	}

	probe := func(to string) lab.ProbeResult {
		r, err := l.Probe(lab.RoleClient, "tcp", to)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	servers := dpNames(srv1, srv2)
	answered := func(to string) func() string {
		return func() string {
			if r := probe(to); !r.OK() || (r.Pod != servers[0] && r.Pod != servers[1]) {
				return fmt.Sprintf("%s: %v, want an answer from %v", to, r, servers)
			}
			return ""
		}
	}
	// Inside the allow-list: kube-proxy's behaviour.
	dpEventually(t, dpSettleTimeout, "externalIP inside the allow-list answers", answered("203.0.113.20:80"))
	// Outside it, and on the node with the default policy: no answer. The allowed address answering
	// proves node1 synced the Service; node2's Event (below) proves node2 did.
	for _, to := range []string{"203.0.113.200:80", "203.0.113.21:80"} {
		for range 3 {
			if r := probe(to); r.OK() {
				t.Errorf("%s answered by %s, want no answer (the external IP is refused)", to, r.Pod)
			}
		}
	}

	want := map[string]string{
		"node1 outside the allow-list": "spec.externalIPs 203.0.113.200 is not programmed: outside externalIPs.allowedCIDRs [203.0.113.0/25]",
		"node2 externalIPs off":        "spec.externalIPs 203.0.113.21 is not programmed: externalIPs are off on this node",
	}
	deadline := time.Now().Add(time.Minute)
	for len(want) > 0 {
		evs, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind != "Service" || e.InvolvedObject.Name != "ext" || e.Type != corev1.EventTypeWarning || e.Reason != cluster.EventReasonRejected {
				continue
			}
			for k, msg := range want {
				if strings.Contains(e.Message, msg) {
					t.Logf("Event %s %s: %s", e.Type, e.Reason, e.Message)
					delete(want, k)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("missing Warning Events on Service ext: %v", want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Still no answer, and the allowed address still answers: the refusals cost the Service nothing
	// else.
	if why := answered("203.0.113.20:80")(); why != "" {
		t.Error(why)
	}
	if r := probe("203.0.113.200:80"); r.OK() {
		t.Errorf("203.0.113.200:80 answered by %s after the Events, want no answer", r.Pod)
	}
}
