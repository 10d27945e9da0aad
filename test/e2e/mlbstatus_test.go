package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

func mlbGVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: resource}
}

// TestMetalLBStatusResources: vipgate writes MetalLB v0.16.2's status resources through a real
// kube-apiserver, with three `vipgate node` processes in network namespaces and the controller:
// ServiceL2Status (one, on the node that answers ARP for the VIP), ConfigurationState per node and
// for the controller, IPAddressPool status counters; the ServiceL2Status moves to the new owner when
// the announcing node is killed and when an externalTrafficPolicy=Local endpoint moves, it is gone
// with the Service, and `kubectl get servicel2statuses -A` shows MetalLB's columns.
// ServiceBGPStatus: one per node advertising a Service to a BGPPeer, gone with the peer.
func TestMetalLBStatusResources(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"st-1"}},
		{Name: "node2", Pods: []string{"st-2"}},
		{Name: "node3", Pods: []string{"st-3"}},
	}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4})
	srv.InstallMetalLBCRDs(t)
	c, dyn := srv.Client, srv.Dynamic
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const vns = "vipgate-system"
	for _, ns := range []string{vns, "metallb-system"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No controller-manager: the default ServiceAccount the pods' admission needs is made by hand.
	if _, err := c.CoreV1().ServiceAccounts(vns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for res, obj := range map[string]map[string]any{
		"ipaddresspools": {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": map[string]any{"name": "lan", "namespace": "metallb-system"},
			"spec": map[string]any{"addresses": []any{"192.0.2.200-192.0.2.210"}}},
		"l2advertisements": {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": map[string]any{"name": "lan", "namespace": "metallb-system"},
			"spec": map[string]any{"ipAddressPools": []any{"lan"}}},
	} {
		if _, err := dyn.Resource(mlbGVR(res)).Namespace("metallb-system").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctrl, err := cluster.NewLBController(srv.RESTConfig(), cluster.LBControllerConfig{Identity: "e2e", LeaseNamespace: vns, StatusNamespace: vns},
		hclog.New(&hclog.LoggerOptions{Name: "controller", Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = ctrl.Run(cctx); close(done) }()
	defer func() { ccancel(); <-done }()

	bin := vipgateBinary(t)
	procs := map[string]*lab.Proc{}
	pods := map[string]*corev1.Pod{}
	for _, n := range l.Nodes() {
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The node agent's pod (the DaemonSet's): the L2 members, and the owner of the node's objects.
		p, err := c.CoreV1().Pods(vns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node-" + n.Name, Labels: map[string]string{"app.kubernetes.io/name": "vipgate", "app.kubernetes.io/component": "node"}},
			Spec:       corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "vipgate", Image: "vipgate"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		if p, err = c.CoreV1().Pods(vns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[n.Name] = p
		cfg := filepath.Join(t.TempDir(), n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		proc, err := l.Start(n.Name, "", append([]string{"env", "POD_NAMESPACE=" + vns, bin, "node", "--config", cfg, "--kubeconfig", srv.Kubeconfig}, memberKeyArgs(t)...)...)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = proc
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})

	slice := func(nodes ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		}
		for i, n := range []string{"node1", "node2", "node3"} {
			if slices.Contains(nodes, n) {
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{l.Pod(fmt.Sprintf("st-%d", i+1)).IPv4.String()}, NodeName: new(n)})
			}
		}
		return s
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("node1", "node2", "node3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually := func(what string, f func() error) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			err := f()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var ip netip.Addr
	eventually("IP allocated", func() error {
		s, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return fmt.Errorf("no IP yet (%v)", err)
		}
		ip = netip.MustParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return nil
	})
	// l2Status waits for exactly one ServiceL2Status for default/web, written by node and owned by
	// its pod.
	l2Status := func(node string) {
		t.Helper()
		eventually("ServiceL2Status on "+node, func() error {
			list, err := dyn.Resource(mlbGVR("servicel2statuses")).Namespace(vns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var got []string
			for _, u := range list.Items {
				n, _, _ := unstructured.NestedString(u.Object, "status", "node")
				svc, _, _ := unstructured.NestedString(u.Object, "status", "serviceName")
				svcNS, _, _ := unstructured.NestedString(u.Object, "status", "serviceNamespace")
				ifs, _, _ := unstructured.NestedSlice(u.Object, "status", "interfaces")
				refs := u.GetOwnerReferences()
				owner := ""
				if len(refs) == 1 {
					owner = refs[0].Kind + "/" + refs[0].Name
				}
				got = append(got, fmt.Sprintf("%s… node=%s svc=%s/%s interfaces=%v label=%s owner=%s", u.GetGenerateName(), n, svcNS, svc, len(ifs) > 0,
					u.GetLabels()["metallb.io/node"], owner))
			}
			want := fmt.Sprintf("l2-… node=%s svc=default/web interfaces=true label=%s owner=Pod/vipgate-node-%s", node, node, node)
			if len(got) != 1 || got[0] != want {
				return fmt.Errorf("got %q, want [%q]", got, want)
			}
			return nil
		})
	}
	owner := hashOwner(ip, "node1", "node2", "node3")
	l2Status(owner)
	r := kubeWaitProbe(t, l, ip.String()+":80", func(r lab.ProbeResult) bool { return r.OK() })
	t.Logf("%s answered (from %s); ServiceL2Status names %s, its hash owner", ip, r.Pod, owner)

	for _, name := range []string{"speaker-node1", "speaker-node2", "speaker-node3", "controller"} {
		eventually("ConfigurationState "+name, func() error {
			u, err := dyn.Resource(mlbGVR("configurationstates")).Namespace(vns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if res, _, _ := unstructured.NestedString(u.Object, "status", "result"); res != "Valid" {
				return fmt.Errorf("result %q", res)
			}
			return nil
		})
	}
	eventually("IPAddressPool status", func() error {
		u, err := dyn.Resource(mlbGVR("ipaddresspools")).Namespace("metallb-system").Get(ctx, "lan", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status")
		if fmt.Sprint(st) != "map[assignedIPv4:1 assignedIPv6:0 availableIPv4:10 availableIPv6:0]" {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})

	// What a MetalLB user types: the CRD's printer columns, as under MetalLB.
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if root, rerr := lab.ModuleRoot(); rerr == nil {
			kubectl = filepath.Join(root, "bin", "kubectl")
		}
	}
	if _, serr := os.Stat(kubectl); serr == nil {
		out, err := l.Exec(lab.RoleLANClient, kubectl, "--kubeconfig", srv.Kubeconfig, "get", "servicel2statuses", "-A")
		if err != nil {
			t.Fatalf("kubectl: %v\n%s", err, out)
		}
		t.Logf("kubectl get servicel2statuses -A:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAMESPACE NAME ALLOCATED NODE SERVICE NAME SERVICE NAMESPACE" {
			t.Errorf("kubectl output differs from MetalLB's columns:\n%s", out)
		} else if f := strings.Fields(lines[1]); len(f) != 5 || f[0] != vns || !strings.HasPrefix(f[1], "l2-") || f[2] != owner || f[3] != "web" || f[4] != "default" {
			t.Errorf("kubectl row %q, want %s l2-… %s web default", lines[1], vns, owner)
		}
	} else {
		t.Logf("no kubectl: printer columns not checked")
	}

	// The announcing node dies: the new owner writes its own object and removes the dead node's.
	if err := procs[owner].Kill(); err != nil {
		t.Logf("kill %s: %v", owner, err)
	}
	var alive []string
	for _, n := range []string{"node1", "node2", "node3"} {
		if n != owner {
			alive = append(alive, n)
		}
	}
	next := hashOwner(ip, alive...)
	l2Status(next)
	t.Logf("%s killed: ServiceL2Status moved to %s", owner, next)

	// externalTrafficPolicy Local with the only endpoint on the other survivor: the VIP and its
	// ServiceL2Status move there.
	other := alive[0]
	if other == next {
		other = alive[1]
	}
	svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if _, err := c.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	es, err := c.DiscoveryV1().EndpointSlices("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = slice(other).Endpoints
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l2Status(other)
	t.Logf("externalTrafficPolicy Local, endpoint on %s only: ServiceL2Status moved to %s", other, other)

	// BGP: every surviving node advertises Service api to BGPPeer tor and says so in its
	// ServiceBGPStatus. As in MetalLB, peers are those the Service is configured to be advertised
	// to, whether or not the session is up (nothing answers BGP at the lab router here).
	for gvr, obj := range map[schema.GroupVersionResource]map[string]any{
		mlbGVR("ipaddresspools"): {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": map[string]any{"name": "bgp", "namespace": "metallb-system"},
			"spec": map[string]any{"addresses": []any{"203.0.113.0/28"}}},
		mlbGVR("bgpadvertisements"): {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": map[string]any{"name": "bgp", "namespace": "metallb-system"},
			"spec": map[string]any{"ipAddressPools": []any{"bgp"}}},
		{Group: "metallb.io", Version: "v1beta2", Resource: "bgppeers"}: {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": map[string]any{"name": "tor", "namespace": "metallb-system"},
			"spec": map[string]any{"myASN": int64(64512), "peerASN": int64(64513), "peerAddress": lab.RouterLANv4.String()}},
	} {
		if _, err := dyn.Resource(gvr).Namespace("metallb-system").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "default", Annotations: map[string]string{"metallb.io/address-pool": "bgp"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiEPs := slice(alive...)
	apiEPs.Name, apiEPs.Labels = "api-1", map[string]string{discoveryv1.LabelServiceName: "api"}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, apiEPs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bgpStatuses := func() ([]string, error) {
		list, err := dyn.Resource(mlbGVR("servicebgpstatuses")).Namespace(vns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var got []string
		for _, u := range list.Items {
			n, _, _ := unstructured.NestedString(u.Object, "status", "node")
			svc, _, _ := unstructured.NestedString(u.Object, "status", "serviceName")
			peers, _, _ := unstructured.NestedStringSlice(u.Object, "status", "peers")
			got = append(got, fmt.Sprintf("%s… %s %s %v", u.GetGenerateName(), n, svc, peers))
		}
		slices.Sort(got)
		return got, nil
	}
	eventually("ServiceBGPStatus of each surviving node", func() error {
		got, err := bgpStatuses()
		if err != nil {
			return err
		}
		want := []string{"bgp-… " + alive[0] + " api [tor]", "bgp-… " + alive[1] + " api [tor]"}
		if !slices.Equal(got, want) {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	})
	t.Logf("ServiceBGPStatus: Service api advertised to BGPPeer tor by %v", alive)
	// The peer goes: no node advertises api any more, the objects go.
	if err := dyn.Resource(schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta2", Resource: "bgppeers"}).Namespace("metallb-system").Delete(ctx, "tor", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("ServiceBGPStatus removed with the peer", func() error {
		got, err := bgpStatuses()
		if err != nil {
			return err
		}
		if len(got) > 0 {
			return fmt.Errorf("left: %q", got)
		}
		return nil
	})

	// The Service goes: so does its ServiceL2Status.
	if err := c.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("ServiceL2Status removed with the Service", func() error {
		list, err := dyn.Resource(mlbGVR("servicel2statuses")).Namespace(vns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d left", len(list.Items))
		}
		return nil
	})
}
