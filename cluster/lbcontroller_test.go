package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/vipgate/vipgate/test/apiserver"
)

// TestLBControllerAgainstAPIServer runs the allocator controller against a real kube-apiserver:
// allocation into status with an Event, the failure cases (pending with a clear Event, nothing else
// changes), a rejected pool next to a good one, and a controller restart that moves nothing.
func TestLBControllerAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := srv.Client
	srv.CreateNamespaces(t, "vipgate-system", "metallb-system", "apps")
	pool := func(name string, addrs ...string) {
		t.Helper()
		list := make([]any, len(addrs))
		for i, a := range addrs {
			list[i] = a
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
			"metadata": map[string]any{"name": name, "namespace": "metallb-system"},
			"spec":     map[string]any{"addresses": list},
		}}
		if _, err := srv.Dynamic.Resource(metallbKinds[0].gvr).Namespace("metallb-system").Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pool("lan", "203.0.113.10-203.0.113.11")
	pool("overlap", "203.0.113.11/32")

	start := func(id string) context.CancelFunc {
		cctx, ccancel := context.WithCancel(ctx)
		ctrl, err := NewLBController(srv.RESTConfig(), LBControllerConfig{Identity: id}, hclog.New(&hclog.LoggerOptions{Name: id, Level: hclog.Warn}))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = ctrl.Run(cctx); close(done) }()
		return func() { ccancel(); <-done }
	}
	stop := start("ctrl-1")

	created := time.Now()
	svcA := lbAPIService("a", nil)
	lbMustCreate(t, c, svcA)
	ipA := lbWaitIngress(t, c, "a")
	t.Logf("first Service, controller just started (leader election, informer sync) -> IP %s in status after %v", ipA, time.Since(created).Round(time.Millisecond))
	if !strings.HasPrefix(ipA, "203.0.113.1") {
		t.Errorf("a got %s, want an IP of pool lan", ipA)
	}
	lbWaitEvent(t, c, "a", EventIPAllocated, "Assigned IP "+ipA)

	// Failure cases: each stays pending with a clear Event; nothing else changes.
	lbMustCreate(t, c, lbAPIService("outside", map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.99"}))
	lbWaitEvent(t, c, "outside", EventAllocationFailed, "in no address pool")
	lbMustCreate(t, c, lbAPIService("taken", map[string]string{"metallb.io/loadBalancerIPs": ipA}))
	lbWaitEvent(t, c, "taken", EventAllocationFailed, "does not share it")
	v6 := lbAPIService("v6", nil)
	fam := corev1.IPv6Protocol
	v6.Spec.IPFamilies = []corev1.IPFamily{fam}
	v6.Spec.ClusterIP, v6.Spec.ClusterIPs = "", nil
	if _, err := c.CoreV1().Services("apps").Create(ctx, v6, metav1.CreateOptions{}); err != nil {
		t.Logf("IPv6 Service not creatable on this single-stack apiserver (%v): skipping that case", err)
	} else {
		lbWaitEvent(t, c, "v6", EventAllocationFailed, "no IPv6")
	}
	created = time.Now()
	lbMustCreate(t, c, lbAPIService("b", nil))
	ipB := lbWaitIngress(t, c, "b")
	t.Logf("with the controller running: Service created -> IP %s in status after %v", ipB, time.Since(created).Round(time.Millisecond))
	lbMustCreate(t, c, lbAPIService("exhausted", nil))
	lbWaitEvent(t, c, "exhausted", EventAllocationFailed, "no free IPv4")
	for _, name := range []string{"outside", "taken", "exhausted"} {
		if s, _ := c.CoreV1().Services("apps").Get(ctx, name, metav1.GetOptions{}); len(s.Status.LoadBalancer.Ingress) != 0 {
			t.Errorf("%s got an IP although it must stay pending: %v", name, s.Status.LoadBalancer.Ingress)
		}
	}
	// The overlapping pool is rejected alone, with an Event on it.
	lbWaitEventFor(t, c, "metallb-system", "overlap", EventPoolRejected, "overlaps pool")

	// Restart (and a new leader): nothing moves, nothing is given twice.
	stop()
	stop = start("ctrl-2")
	defer stop()
	lbMustCreate(t, c, lbAPIService("late", map[string]string{"metallb.io/loadBalancerIPs": ipB}))
	lbWaitEvent(t, c, "late", EventAllocationFailed, "does not share it")
	if got := lbWaitIngress(t, c, "a"); got != ipA {
		t.Errorf("after the restart a has %s, had %s", got, ipA)
	}
	if got := lbWaitIngress(t, c, "b"); got != ipB {
		t.Errorf("after the restart b has %s, had %s", got, ipB)
	}
	// Deleting a frees its IP for the waiting Service.
	if err := c.CoreV1().Services("apps").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := lbWaitIngress(t, c, "exhausted"); got != ipA {
		t.Errorf("exhausted got %s after a was deleted, want the freed %s", got, ipA)
	}

	// The cleanup finalizer (what the upstream "load balancer cleanup finalizer" e2e test checks):
	// on every served LoadBalancer Service, off when it stops being one (its stale IP gone from the
	// status), back when it is one again; a deleted Service goes once the controller let go.
	lbWaitFinalizer(t, c, "b", true)
	svc, err := c.CoreV1().Services("apps").Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 0
	}
	svc.Spec.AllocateLoadBalancerNodePorts = nil
	svc.Spec.ExternalTrafficPolicy = ""
	if _, err := c.CoreV1().Services("apps").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbWaitFinalizer(t, c, "b", false)
	if s, _ := c.CoreV1().Services("apps").Get(ctx, "b", metav1.GetOptions{}); len(s.Status.LoadBalancer.Ingress) != 0 {
		t.Errorf("b is a ClusterIP Service now but its status still has %v", s.Status.LoadBalancer.Ingress)
	}
	svc, _ = c.CoreV1().Services("apps").Get(ctx, "b", metav1.GetOptions{})
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	if _, err := c.CoreV1().Services("apps").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbWaitFinalizer(t, c, "b", true)
	if err := c.CoreV1().Services("apps").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.CoreV1().Services("apps").Get(ctx, "b", metav1.GetOptions{}); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deleted Service b is still there: the controller did not remove its finalizer")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lbWaitFinalizer(t *testing.T, c kubernetes.Interface, name string, want bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := c.CoreV1().Services("apps").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && slices.Contains(s.Finalizers, LoadBalancerCleanupFinalizer) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Service %s: finalizer %s present = %v, want %v", name, LoadBalancerCleanupFinalizer, !want, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lbAPIService(name string, ann map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps", Annotations: ann},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
}

func lbMustCreate(t *testing.T, c kubernetes.Interface, s *corev1.Service) {
	t.Helper()
	if _, err := c.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func lbWaitIngress(t *testing.T, c kubernetes.Interface, name string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := c.CoreV1().Services("apps").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			return s.Status.LoadBalancer.Ingress[0].IP
		}
		if time.Now().After(deadline) {
			t.Fatalf("Service %s got no LoadBalancer IP", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lbWaitEvent(t *testing.T, c kubernetes.Interface, name, reason, contains string) {
	t.Helper()
	lbWaitEventFor(t, c, "apps", name, reason, contains)
}

func lbWaitEventFor(t *testing.T, c kubernetes.Interface, ns, name, reason, contains string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err == nil {
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == name && e.Reason == reason && strings.Contains(e.Message, contains) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, e := range evs.Items {
				seen = append(seen, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
			}
			t.Fatalf("no %s Event on %s/%s containing %q; events: %v", reason, ns, name, contains, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLBControllerScale5000 (VIPGATE_SCALE=1): 5,000 LoadBalancer Services from a /18; reports the
// time from the first creation until every one has an IP in its status.
func TestLBControllerScale5000(t *testing.T) {
	if os.Getenv("VIPGATE_SCALE") == "" {
		t.Skip("set VIPGATE_SCALE=1 (creates 5,000 Services)")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := srv.Client
	srv.CreateNamespaces(t, "vipgate-system", "metallb-system", "apps")
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
		"metadata": map[string]any{"name": "big", "namespace": "metallb-system"},
		"spec":     map[string]any{"addresses": []any{"10.200.0.0/18"}},
	}}
	if _, err := srv.Dynamic.Resource(metallbKinds[0].gvr).Namespace("metallb-system").Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctrl, err := NewLBController(srv.RESTConfig(), LBControllerConfig{Identity: "scale"}, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctrl.Run(ctx) }()
	const n = 5000
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			s := lbAPIService(fmt.Sprintf("s%04d", i), nil)
			no := false // 5,000 > the 2,768 NodePorts of the range
			s.Spec.AllocateLoadBalancerNodePorts = &no
			if _, err := c.CoreV1().Services("apps").Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	created := time.Since(start)
	for {
		list, err := c.CoreV1().Services("apps").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		seen := map[string]bool{}
		for _, s := range list.Items {
			if len(s.Status.LoadBalancer.Ingress) > 0 {
				ip := s.Status.LoadBalancer.Ingress[0].IP
				if seen[ip] {
					t.Fatalf("IP %s given twice", ip)
				}
				seen[ip] = true
				done++
			}
		}
		if done == n {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d allocated", done, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("5,000 LoadBalancer Services from a /18: created in %v, all allocated %v after the first creation (%s)",
		created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), vmRSS())
}

func vmRSS() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return "test process " + strings.Join(strings.Fields(l), " ")
		}
	}
	return ""
}
