package mlbstatus

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipgate/vipgate/test/apiserver"
)

// syncBuffer is a log sink safe for the writers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls f until it returns nil (the writers work in the background).
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
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

// TestWriterAgainstAPIServer drives node and controller Writers against a real kube-apiserver with
// MetalLB v0.16.2's CRDs: missing CRDs are tolerated, then every status resource appears with
// MetalLB's names, labels and owner, an L2 status moves to the new owner when the old one is gone,
// BGP peers change, problems make the ConfigurationState Invalid, and objects go with the Service.
func TestWriterAgainstAPIServer(t *testing.T) {
	srv := apiserver.Start(t, apiserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "vipgate-system"
	srv.CreateNamespaces(t, ns, "metallb-system")
	pod, err := srv.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node-abcde", Labels: map[string]string{"app": "vipgate-node"}},
		Spec:       corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "vipgate", Image: "vipgate"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("writer logs:\n%s", logs)
		}
	})
	newWriter := func(o Options) (*Writer, context.CancelFunc) {
		o.Namespace, o.MinInterval, o.Resync = ns, 20*time.Millisecond, 500*time.Millisecond
		w, err := New(srv.RESTConfig(), o, hclog.New(&hclog.LoggerOptions{Name: string(o.Component) + "-" + o.Node, Output: logs}))
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		go w.Run(wctx)
		return w, wcancel
	}
	web := types.NamespacedName{Namespace: "demo", Name: "web"}
	n1, stop1 := newWriter(Options{Component: Speaker, Node: "node1", PodSelector: "app=vipgate-node"})
	n1.SetSpeaker(map[types.NamespacedName]ServiceStatus{web: {Interfaces: []string{"eth0"}, Peers: []string{"tor1"}}}, nil)

	// No CRDs yet: logged once per resource, nothing fails.
	eventually(t, "missing CRDs logged", func() error {
		if n := strings.Count(logs.String(), "MetalLB CRD not installed"); n < 3 {
			return fmt.Errorf("%d log lines", n)
		}
		return nil
	})
	time.Sleep(time.Second) // two resyncs: still once each
	if n := strings.Count(logs.String(), "MetalLB CRD not installed"); n != 3 {
		t.Errorf("missing CRDs logged %d times, want 3 (once per resource):\n%s", n, logs)
	}
	srv.InstallMetalLBCRDs(t)

	list := func(resource string) []unstructured.Unstructured {
		l, err := srv.Dynamic.Resource(metallbv1beta1.GroupVersion.WithResource(resource)).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	// statusOf returns "name-prefix node status-json" for each object, to compare as a whole.
	statusOf := func(resource string) []string {
		var out []string
		for _, u := range list(resource) {
			st, _, _ := unstructured.NestedMap(u.Object, "status")
			out = append(out, fmt.Sprintf("%s %v %v", u.GetGenerateName(), u.GetLabels(), st))
		}
		return out
	}
	want := func(resource string, w ...string) func() error {
		return func() error {
			if d := cmp.Diff(w, statusOf(resource)); d != "" {
				return fmt.Errorf("%s (-want +got):\n%s", resource, d)
			}
			return nil
		}
	}
	eventually(t, "ServiceL2Status of node1", want("servicel2statuses",
		"l2- map[metallb.io/node:node1 metallb.io/service-name:web metallb.io/service-namespace:demo] map[interfaces:[map[name:eth0]] node:node1 serviceName:web serviceNamespace:demo]"))
	eventually(t, "ServiceBGPStatus of node1", want("servicebgpstatuses",
		"bgp- map[metallb.io/node:node1 metallb.io/service-name:web metallb.io/service-namespace:demo] map[node:node1 peers:[tor1] serviceName:web serviceNamespace:demo]"))
	eventually(t, "ConfigurationState of node1", func() error {
		u, err := srv.Dynamic.Resource(gvrConfigurationStates).Namespace(ns).Get(ctx, "speaker-node1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cs metallbv1beta1.ConfigurationState
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cs); err != nil {
			return err
		}
		if cs.Status.Result != "Valid" || cs.Labels[LabelComponentType] != "speaker" || cs.Labels[LabelNodeName] != "node1" {
			return fmt.Errorf("got %+v %v", cs.Status, cs.Labels)
		}
		return nil
	})
	// Owned by the node's pod, as MetalLB's are owned by the speaker pod.
	for _, u := range list("servicel2statuses") {
		refs := u.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].Name != pod.Name || refs[0].UID != pod.UID {
			t.Errorf("owner references %+v, want the pod %s", refs, pod.Name)
		}
	}

	// node1 dies without cleaning up; node2 becomes the L2 owner and removes node1's object.
	stop1()
	n2, stop2 := newWriter(Options{Component: Speaker, Node: "node2"})
	defer stop2()
	n2.SetSpeaker(map[types.NamespacedName]ServiceStatus{web: {Interfaces: []string{"eth1"}, Peers: []string{"tor1", "tor2"}}}, nil)
	eventually(t, "ServiceL2Status moved to node2", want("servicel2statuses",
		"l2- map[metallb.io/node:node2 metallb.io/service-name:web metallb.io/service-namespace:demo] map[interfaces:[map[name:eth1]] node:node2 serviceName:web serviceNamespace:demo]"))
	// BGP statuses are per node: node1's stays until node1 (or the garbage collector, with its pod) removes it.
	eventually(t, "ServiceBGPStatus of both nodes", func() error {
		if n := len(list("servicebgpstatuses")); n != 2 {
			return fmt.Errorf("%d objects", n)
		}
		return nil
	})
	// A peer goes away from node2's configuration; then a problem makes the configuration Invalid.
	n2.SetSpeaker(map[types.NamespacedName]ServiceStatus{web: {Interfaces: []string{"eth1"}, Peers: []string{"tor2"}}},
		[]string{"BGPPeer metallb-system/tor1: peerAddress \"x\": need an address"})
	eventually(t, "node2 BGP peers", func() error {
		for _, u := range list("servicebgpstatuses") {
			if u.GetLabels()[LabelAnnounceNode] == "node2" {
				peers, _, _ := unstructured.NestedStringSlice(u.Object, "status", "peers")
				if !cmp.Equal(peers, []string{"tor2"}) {
					return fmt.Errorf("peers %v", peers)
				}
				return nil
			}
		}
		return fmt.Errorf("no object of node2")
	})
	eventually(t, "ConfigurationState of node2 Invalid", func() error {
		u, err := srv.Dynamic.Resource(gvrConfigurationStates).Namespace(ns).Get(ctx, "speaker-node2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		res, _, _ := unstructured.NestedString(u.Object, "status", "result")
		sum, _, _ := unstructured.NestedString(u.Object, "status", "errorSummary")
		if res != "Invalid" || !strings.Contains(sum, "BGPPeer metallb-system/tor1") {
			return fmt.Errorf("result %q, errorSummary %q", res, sum)
		}
		return nil
	})
	// The Service goes: node2's objects go.
	n2.SetSpeaker(nil, nil)
	eventually(t, "node2's objects removed", func() error {
		for _, u := range append(list("servicel2statuses"), list("servicebgpstatuses")...) {
			if u.GetLabels()[LabelAnnounceNode] == "node2" {
				return fmt.Errorf("%s still there", u.GetName())
			}
		}
		return nil
	})

	// The controller: pool counters and its ConfigurationState.
	poolU, err := srv.Dynamic.Resource(metallbv1beta1.GroupVersion.WithResource("ipaddresspools")).Namespace("metallb-system").Create(ctx,
		&unstructured.Unstructured{Object: map[string]any{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
			"metadata": map[string]any{"name": "lan"}, "spec": map[string]any{"addresses": []any{"192.0.2.200-192.0.2.210"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pool metallbv1beta1.IPAddressPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(poolU.Object, &pool); err != nil {
		t.Fatal(err)
	}
	c, stopC := newWriter(Options{Component: Controller})
	defer stopC()
	c.SetController([]*metallbv1beta1.IPAddressPool{&pool}, map[string]PoolCounts{"metallb-system/lan": {SizeIPv4: 11, AssignedIPv4: 1}}, nil)
	eventually(t, "IPAddressPool status", func() error {
		u, err := srv.Dynamic.Resource(metallbv1beta1.GroupVersion.WithResource("ipaddresspools")).Namespace("metallb-system").Get(ctx, "lan", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status")
		if d := cmp.Diff(map[string]any{"assignedIPv4": int64(1), "assignedIPv6": int64(0), "availableIPv4": int64(10), "availableIPv6": int64(0)}, st); d != "" {
			return fmt.Errorf("(-want +got):\n%s", d)
		}
		return nil
	})
	eventually(t, "ConfigurationState controller", func() error {
		u, err := srv.Dynamic.Resource(gvrConfigurationStates).Namespace(ns).Get(ctx, "controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		res, _, _ := unstructured.NestedString(u.Object, "status", "result")
		if res != "Valid" || u.GetLabels()[LabelComponentType] != "controller" {
			return fmt.Errorf("result %q labels %v", res, u.GetLabels())
		}
		return nil
	})
	if strings.Contains(logs.String(), "will retry") {
		t.Logf("writer errors (retried):\n%s", logs)
	}
}
