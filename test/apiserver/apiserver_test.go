package apiserver

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestServer starts the server in the root namespace, allocates a cluster IP, installs the MetalLB
// CRDs, creates a pool, and checks that objects survive a restart.
func TestServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	s := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	svc, err := s.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster IP %s", svc.Spec.ClusterIP)

	s.InstallMetalLBCRDs(t)
	pools := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "ipaddresspools"}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1",
		"kind":       "IPAddressPool",
		"metadata":   map[string]any{"name": "lan", "namespace": "default"},
		"spec":       map[string]any{"addresses": []any{"203.0.113.0/28"}},
	}}
	if _, err := s.Dynamic.Resource(pools).Namespace("default").Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// BGPPeer's ASN fields need the schema fix of InstallMetalLBCRDs.
	peers := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta2", Resource: "bgppeers"}
	peer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta2",
		"kind":       "BGPPeer",
		"metadata":   map[string]any{"name": "router", "namespace": "default"},
		"spec":       map[string]any{"myASN": int64(4200000000), "peerASN": int64(64501), "peerAddress": "192.0.2.1"},
	}}
	if _, err := s.Dynamic.Resource(peers).Namespace("default").Create(ctx, peer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	peer.Object["spec"].(map[string]any)["myASN"] = int64(1) << 32
	peer.SetName("too-big")
	if _, err := s.Dynamic.Resource(peers).Namespace("default").Create(ctx, peer, metav1.CreateOptions{}); err == nil {
		t.Errorf("a BGPPeer with myASN 2^32 was accepted")
	}

	s.Stop()
	if _, err := s.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); err == nil {
		t.Fatal("the API answers while stopped")
	}
	s.Restart(t)
	got, err := s.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil || got.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Fatalf("after restart: %v, %v", got, err)
	}
	if _, err := s.Dynamic.Resource(pools).Namespace("default").Get(ctx, "lan", metav1.GetOptions{}); err != nil {
		t.Fatalf("pool after restart: %v", err)
	}
}

// TestServerInNetns runs the server inside a fresh network namespace and reaches it through
// DialerInNetns.
func TestServerInNetns(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ns := fmt.Sprintf("vgt%d-apiserver", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		// A stub NIC for the listen address: an empty bridge (the kernel has no dummy links).
		{"-n", ns, "link", "add", "stub0", "type", "bridge"},
		{"-n", ns, "addr", "add", "192.0.2.200/24", "dev", "stub0"},
		{"-n", ns, "link", "set", "stub0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	s := Start(t, Options{Netns: ns, Addr: netip.MustParseAddr("192.0.2.200")})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.URL, "https://192.0.2.200:") {
		t.Errorf("URL %s, want one on 192.0.2.200", s.URL)
	}
}
