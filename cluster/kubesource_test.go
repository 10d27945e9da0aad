package cluster

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/vipgate/vipgate/test/apiserver"
)

// stateRecorder collects the States a source emits.
type stateRecorder struct {
	mu     sync.Mutex
	states []*State
	kick   chan struct{}
}

func newStateRecorder() *stateRecorder { return &stateRecorder{kick: make(chan struct{}, 1)} }

func (r *stateRecorder) onChange(st *State) {
	r.mu.Lock()
	r.states = append(r.states, st)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *stateRecorder) latest() (*State, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.states) == 0 {
		return nil, 0
	}
	return r.states[len(r.states)-1], len(r.states)
}

// wait returns the first State (the latest one, checked after every emission) that satisfies ok.
func (r *stateRecorder) wait(t *testing.T, what string, ok func(*State) bool) *State {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if st, _ := r.latest(); st != nil && ok(st) {
			return st
		}
		select {
		case <-r.kick:
		case <-deadline:
			st, n := r.latest()
			t.Fatalf("timed out waiting for %s; %d states, latest %s", what, n, describeState(st))
		}
	}
}

func describeState(st *State) string {
	if st == nil {
		return "none"
	}
	var keys []string
	for k := range st.Services {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	var rej []string
	for _, r := range st.Rejected {
		rej = append(rej, r.String())
	}
	return "services " + strings.Join(keys, ",") + "; rejected " + strings.Join(rej, "; ")
}

func kubeTestService(name string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

func kubeTestSlice(name, service string, addrs ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	if service != "" {
		es.Labels[discoveryv1.LabelServiceName] = service
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return es
}

// TestKubeSource runs the Kubernetes source against a real kube-apiserver: the first snapshot, a bad
// object (Rejected plus an Event), pointer stability, MetalLB CRDs installed while the source runs,
// LoadBalancer status, and an API server restart.
func TestKubeSource(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	defer func(d time.Duration) { kubeCRDRecheck = d }(kubeCRDRecheck)
	kubeCRDRecheck = 500 * time.Millisecond // the CRDs are installed while the source runs

	srv := apiserver.Start(t, apiserver.Options{})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustFor(t)

	must(c.CoreV1().Services("default").Create(ctx, kubeTestService("web", nil), metav1.CreateOptions{}))
	must(c.CoreV1().Services("default").Create(ctx,
		kubeTestService("elsewhere", map[string]string{LabelServiceProxyName: "other-proxy"}), metav1.CreateOptions{}))
	must(c.DiscoveryV1().EndpointSlices("default").Create(ctx, kubeTestSlice("web-a", "web", "10.244.1.11"), metav1.CreateOptions{}))
	// Labelled headless: kube-proxy ignores the Service and its slices, whatever their spec says.
	must(c.CoreV1().Services("default").Create(ctx,
		kubeTestService("marked-headless", map[string]string{LabelHeadless: ""}), metav1.CreateOptions{}))
	markedSlice := kubeTestSlice("marked-headless-a", "marked-headless", "10.244.1.13")
	markedSlice.Labels[LabelHeadless] = ""
	must(c.DiscoveryV1().EndpointSlices("default").Create(ctx, markedSlice, metav1.CreateOptions{}))
	// No kubernetes.io/service-name label: nobody can tell which Service it belongs to.
	must(c.DiscoveryV1().EndpointSlices("default").Create(ctx, kubeTestSlice("orphan", "", "10.244.1.12"), metav1.CreateOptions{}))
	srv.CreateNode(t, "node1", map[string]string{ZoneLabel: "zone-a"}, netip.MustParseAddr("192.0.2.11"))

	// The API server creates its own "kubernetes" Service shortly after it is ready; the first
	// snapshot is checked for it below, so wait for it here.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the API server did not create default/kubernetes: %v", err)
		}
	}

	src := NewKubeSource(srv.RESTConfig(), "node1", hclog.New(&hclog.LoggerOptions{Name: "kube", Level: hclog.Debug, Output: testWriter{t}}))
	if got := src.String(); got != "kubernetes "+srv.URL {
		t.Errorf("String() = %q", got)
	}
	rec := runTestSource(t, ctx, src)

	first := rec.wait(t, "the first snapshot", func(*State) bool { return true })
	t.Run("first snapshot", func(t *testing.T) {
		web := first.Services[ServiceKey{"default", "web"}]
		if web == nil || len(web.ClusterIPs) != 1 || !netip.MustParsePrefix(apiserver.ServiceCIDR).Contains(web.ClusterIPs[0]) {
			t.Fatalf("web = %+v", web)
		}
		if _, ok := first.Services[ServiceKey{"default", "elsewhere"}]; ok {
			t.Errorf("a Service with %s is in the snapshot", LabelServiceProxyName)
		}
		if _, ok := first.Services[ServiceKey{"default", "marked-headless"}]; ok {
			t.Errorf("a Service with %s is in the snapshot", LabelHeadless)
		}
		if sl, ok := first.EndpointSlices[ServiceKey{"default", "marked-headless"}]; ok {
			t.Errorf("an EndpointSlice with %s is in the snapshot: %+v", LabelHeadless, sl)
		}
		// The API server's own "kubernetes" Service is there too.
		if _, ok := first.Services[ServiceKey{"default", "kubernetes"}]; !ok {
			t.Errorf("default/kubernetes missing: %s", describeState(first))
		}
		if sl := first.EndpointSlices[ServiceKey{"default", "web"}]; len(sl) != 1 || sl[0].Endpoints[0].Addresses[0] != netip.MustParseAddr("10.244.1.11") {
			t.Errorf("web slices = %+v", sl)
		}
		if n := first.Nodes["node1"]; n == nil || n.Zone != "zone-a" || len(n.Addresses) != 1 {
			t.Errorf("node1 = %+v", n)
		}
		if len(first.Rejected) != 1 || first.Rejected[0].Kind != "EndpointSlice" || first.Rejected[0].Object != "default/orphan" ||
			!strings.Contains(first.Rejected[0].Reason, ServiceNameLabel) {
			t.Errorf("Rejected = %v", first.Rejected)
		}
		if !first.MetalLB.IsEmpty() {
			t.Errorf("MetalLB = %+v without CRDs", first.MetalLB)
		}
	})

	t.Run("serviceProxyName", func(t *testing.T) {
		// A second source, named like the proxy "elsewhere" is handed to: it lists that Service only.
		rec2 := newStateRecorder()
		src2 := NewKubeSource(srv.RESTConfig(), "node1", hclog.NewNullLogger())
		src2.SetServiceProxyName("other-proxy")
		ctx2, stop2 := context.WithCancel(ctx)
		done2 := make(chan error, 1)
		go func() { done2 <- src2.Run(ctx2, rec2.onChange) }()
		defer func() { stop2(); <-done2 }()
		st := rec2.wait(t, "the first snapshot of the named source", func(*State) bool { return true })
		var got []string
		for k := range st.Services {
			got = append(got, k.String())
		}
		if len(got) != 1 || got[0] != "default/elsewhere" {
			t.Errorf("Services %v, want only default/elsewhere", got)
		}
	})

	t.Run("event on the rejected slice", func(t *testing.T) {
		ev := waitEvent(t, ctx, c, "orphan")
		if ev.Type != corev1.EventTypeWarning || ev.Source.Component != EventComponent || ev.Source.Host != "node1" ||
			ev.InvolvedObject.Kind != "EndpointSlice" || !strings.Contains(ev.Message, ServiceNameLabel) {
			t.Errorf("event %+v", ev)
		}
	})

	t.Run("pointer stability", func(t *testing.T) {
		must := mustFor(t)
		must(c.CoreV1().Services("default").Create(ctx, kubeTestService("api", nil), metav1.CreateOptions{}))
		st := rec.wait(t, "Service api", func(st *State) bool { return st.Services[ServiceKey{"default", "api"}] != nil })
		webKey := ServiceKey{"default", "web"}
		if st.Services[webKey] != first.Services[webKey] {
			t.Errorf("web's *Service changed although web did not")
		}
		if a, b := st.EndpointSlices[webKey], first.EndpointSlices[webKey]; &a[0] != &b[0] {
			t.Errorf("web's slice list changed although its slices did not")
		}
		if st.Nodes["node1"] != first.Nodes["node1"] {
			t.Errorf("node1's *Node changed")
		}
		if st.MetalLB != first.MetalLB {
			t.Errorf("the MetalLB config changed")
		}
	})

	t.Run("load balancer status", func(t *testing.T) {
		must := mustFor(t)
		svc, err := c.CoreV1().Services("default").Get(ctx, "api", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		if svc, err = c.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
		must(c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}))
		rec.wait(t, "api's LoadBalancer IP", func(st *State) bool {
			s := st.Services[ServiceKey{"default", "api"}]
			return s != nil && s.Type == TypeLoadBalancer && slices.Equal(s.LoadBalancerIPs, []netip.Addr{netip.MustParseAddr("203.0.113.10")})
		})
	})

	// The API server does not check status.loadBalancer.ingress beyond "an IP": whoever may write a
	// Service's status can name the node's loopback or the metadata address. vipgate rejects the
	// Service (alone), with an Event saying why, and reads its creationTimestamp and uid for claims.
	t.Run("hostile load balancer status", func(t *testing.T) {
		must := mustFor(t)
		svc := kubeTestService("grabber", nil)
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc, err := c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := rec.wait(t, "Service grabber", func(st *State) bool { return st.Services[ServiceKey{"default", "grabber"}] != nil })
		if g := st.Services[ServiceKey{"default", "grabber"}]; g.UID != string(svc.UID) || !g.Created.Equal(svc.CreationTimestamp.Time) {
			t.Errorf("uid %q created %v, want %q %v", g.UID, g.Created, svc.UID, svc.CreationTimestamp)
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "127.0.0.1", IPMode: new(corev1.LoadBalancerIPModeVIP)},
			{IP: "169.254.169.254", IPMode: new(corev1.LoadBalancerIPModeVIP)},
		}
		must(c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}))
		st = rec.wait(t, "grabber rejected", func(st *State) bool { return st.Services[ServiceKey{"default", "grabber"}] == nil })
		found := false
		for _, r := range st.Rejected {
			if r.Object == "default/grabber" && strings.Contains(r.Reason, "status.loadBalancer.ingress[0].ip: 127.0.0.1") && strings.Contains(r.Reason, "loopback") {
				found = true
			}
		}
		if !found || st.Services[ServiceKey{"default", "web"}] == nil {
			t.Errorf("rejected %v; web still there: %v", st.Rejected, st.Services[ServiceKey{"default", "web"}] != nil)
		}
		ev := waitEvent(t, ctx, c, "grabber")
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "Service" || !strings.Contains(ev.Message, "loopback") {
			t.Errorf("event %+v", ev)
		}
	})

	t.Run("MetalLB CRDs installed later", func(t *testing.T) {
		must := mustFor(t)
		srv.InstallMetalLBCRDs(t)
		pool := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
			"metadata": map[string]any{"name": "lan", "namespace": "default"},
			"spec":     map[string]any{"addresses": []any{"203.0.113.0/28"}},
		}}
		must(srv.Dynamic.Resource(metallbKinds[0].gvr).Namespace("default").Create(ctx, pool, metav1.CreateOptions{}))
		adv := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
			"metadata": map[string]any{"name": "lan", "namespace": "default"},
			"spec":     map[string]any{"ipAddressPools": []any{"lan"}, "interfaces": []any{"eth0"}},
		}}
		must(srv.Dynamic.Resource(metallbKinds[1].gvr).Namespace("default").Create(ctx, adv, metav1.CreateOptions{}))
		peer := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer",
			"metadata": map[string]any{"name": "router", "namespace": "default"},
			"spec":     map[string]any{"myASN": int64(4200000000), "peerASN": int64(64501), "peerAddress": "192.0.2.1"},
		}}
		must(srv.Dynamic.Resource(metallbKinds[5].gvr).Namespace("default").Create(ctx, peer, metav1.CreateOptions{}))
		st := rec.wait(t, "the pool, the advertisement and the peer", func(st *State) bool {
			return len(st.MetalLB.IPAddressPools) == 1 && len(st.MetalLB.L2Advertisements) == 1 && len(st.MetalLB.BGPPeers) == 1
		})
		if p := st.MetalLB.BGPPeers[0]; p.Spec.MyASN != 4200000000 || p.Spec.ASN != 64501 || p.Spec.Address != "192.0.2.1" {
			t.Errorf("peer %+v", p.Spec)
		}
		if p := st.MetalLB.IPAddressPools[0]; p.Name != "lan" || !slices.Equal(p.Spec.Addresses, []string{"203.0.113.0/28"}) {
			t.Errorf("pool %+v", p)
		}
		if a := st.MetalLB.L2Advertisements[0]; !slices.Equal(a.Spec.IPAddressPools, []string{"lan"}) || !slices.Equal(a.Spec.Interfaces, []string{"eth0"}) {
			t.Errorf("L2Advertisement %+v", a.Spec)
		}
	})

	t.Run("API server restart", func(t *testing.T) {
		must := mustFor(t)
		before, _ := rec.latest()
		srv.Stop()
		// Nothing can change while the API is down; the source keeps quiet and keeps its state.
		time.Sleep(2 * time.Second)
		if st, _ := rec.latest(); st != before {
			t.Errorf("a new snapshot while the API server was down: %s", describeState(st))
		}
		srv.Restart(t)
		start := time.Now()
		must(c.CoreV1().Services("default").Create(ctx, kubeTestService("late", nil), metav1.CreateOptions{}))
		must(c.DiscoveryV1().EndpointSlices("default").Create(ctx, kubeTestSlice("late-a", "late", "10.244.2.11"), metav1.CreateOptions{}))
		st := rec.wait(t, "Service late after the restart", func(st *State) bool {
			return st.Services[ServiceKey{"default", "late"}] != nil && len(st.EndpointSlices[ServiceKey{"default", "late"}]) == 1
		})
		t.Logf("a change made right after the restart reached the source in %v", time.Since(start).Round(time.Millisecond))
		webKey := ServiceKey{"default", "web"}
		if st.Services[webKey] != first.Services[webKey] {
			t.Errorf("web's *Service changed across the restart (relisted objects must keep their pointers)")
		}
	})
}

// mustFor returns a function that fails t on err; its first argument takes a client call's other
// result.
func mustFor(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitEvent waits for a "Rejected" Event on the named object.
func waitEvent(t *testing.T, ctx context.Context, c kubernetes.Interface, name string) corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.name": name, "reason": EventReasonRejected}.AsSelector().String()
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(list.Items) > 0 {
			return list.Items[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Rejected event on %s (%v)", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
