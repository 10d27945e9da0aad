package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/vipgate/vipgate/test/apiserver"
)

// runTestSource runs src until the test ends and returns the recorder of its States.
func runTestSource(t *testing.T, ctx context.Context, src *KubeSource) *stateRecorder {
	t.Helper()
	rec := newStateRecorder()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, rec.onChange) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return rec
}

// findTestPool returns the pool named name of st, or nil.
func findTestPool(st *State, name string) *metallbv1beta1.IPAddressPool {
	if st == nil || st.MetalLB == nil {
		return nil
	}
	for _, p := range st.MetalLB.IPAddressPools {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// TestKubeSourceMetalLBStatus runs a node's source and a controller's (KeepMetalLBStatus) against a
// real kube-apiserver with MetalLB's CRDs, and writes an IPAddressPool's status N times as MetalLB's
// controller does on allocations: the node builds no State for any of them (the updates are dropped
// before a snapshot is even built, and its pool keeps its pointer), while the controller sees each
// status. A change of the pool's spec, labels or annotations still reaches the node.
func TestKubeSourceMetalLBStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	const n = 20 // status writes

	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustFor(t)
	pools := srv.Dynamic.Resource(metallbKinds[0].gvr).Namespace("default")
	newPool := func(name, cidr string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
			"metadata": map[string]any{"name": name, "namespace": "default", "labels": map[string]any{"tier": "front"}},
			"spec":     map[string]any{"addresses": []any{cidr}},
		}}
	}
	must(pools.Create(ctx, newPool("lan", "203.0.113.0/28"), metav1.CreateOptions{}))
	must(pools.Create(ctx, newPool("barrier", "198.51.100.0/28"), metav1.CreateOptions{}))
	adv := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement",
		"metadata": map[string]any{"name": "front", "namespace": "default"},
		"spec": map[string]any{"ipAddressPoolSelectors": []any{
			map[string]any{"matchLabels": map[string]any{"tier": "front"}}}},
	}}
	must(srv.Dynamic.Resource(metallbKinds[2].gvr).Namespace("default").Create(ctx, adv, metav1.CreateOptions{}))

	logger := hclog.New(&hclog.LoggerOptions{Name: "kube", Level: hclog.Info, Output: testWriter{t}})
	node := NewKubeSource(srv.RESTConfig(), "node1", logger.Named("node"))
	ctrl := NewKubeSource(srv.RESTConfig(), "controller", logger.Named("controller"))
	ctrl.KeepMetalLBStatus()
	nodeRec, ctrlRec := runTestSource(t, ctx, node), runTestSource(t, ctx, ctrl)
	bothPools := func(st *State) bool { return findTestPool(st, "lan") != nil && findTestPool(st, "barrier") != nil }
	first := nodeRec.wait(t, "the node's pools", bothPools)
	ctrlRec.wait(t, "the controller's pools", bothPools)
	lan := findTestPool(first, "lan")

	// Each status write is waited for on the controller's side, as allocations come one by one:
	// without the fix, each cost the node a snapshot and a new State too.
	nodeSnaps, nodeIgnored := node.stats.snapshots.Load(), node.stats.metallbIgnored.Load()
	_, nodeStates := nodeRec.latest()
	ctrlSnaps := ctrl.stats.snapshots.Load()
	_, ctrlStates := ctrlRec.latest()
	for i := 1; i <= n; i++ {
		writePoolStatus(t, ctx, pools, "lan", int64(i))
		ctrlRec.wait(t, "the status write in the controller's State", func(st *State) bool {
			p := findTestPool(st, "lan")
			return p != nil && p.Status.AssignedIPv4 == int64(i)
		})
	}
	// A barrier: a spec change of another pool, on the same watch, after the status writes. Once
	// the node has it, its informer has delivered every status update before it.
	barrier, err := pools.Get(ctx, "barrier", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	must(nil, unstructured.SetNestedStringSlice(barrier.Object, []string{"198.51.100.16/28"}, "spec", "addresses"))
	must(pools.Update(ctx, barrier, metav1.UpdateOptions{}))
	st := nodeRec.wait(t, "the barrier's new spec", func(st *State) bool {
		p := findTestPool(st, "barrier")
		return p != nil && slices.Equal(p.Spec.Addresses, []string{"198.51.100.16/28"})
	})
	_, nodeStatesAfter := nodeRec.latest()
	_, ctrlStatesAfter := ctrlRec.latest()
	snaps, ignored, states := node.stats.snapshots.Load()-nodeSnaps, node.stats.metallbIgnored.Load()-nodeIgnored, nodeStatesAfter-nodeStates
	t.Logf("%d pool status writes and 1 spec change: node %d snapshots, %d States, %d updates ignored; controller (KeepMetalLBStatus) %d snapshots, %d States",
		n, snaps, states, ignored, ctrl.stats.snapshots.Load()-ctrlSnaps, ctrlStatesAfter-ctrlStates)
	if ignored != n {
		t.Errorf("the node ignored %d MetalLB updates, want the %d status writes", ignored, n)
	}
	// The barrier's change is the one State with new MetalLB objects (a State for anything else the
	// API server changed meanwhile would keep them).
	if c := metallbChanges(nodeRec, nodeStates, nodeStatesAfter); c != 1 {
		t.Errorf("the node emitted %d States with new MetalLB objects for %d status writes and one spec change, want 1", c, n)
	}
	if snaps > n/4 {
		t.Errorf("the node built %d snapshots for %d status writes and one spec change", snaps, n)
	}
	if p := findTestPool(st, "lan"); p != lan {
		t.Errorf("the node's lan pool changed pointer (reconverted) on status writes")
	} else if p.Status != (metallbv1beta1.IPAddressPoolStatus{}) {
		t.Errorf("the node's pool carries a status: %+v", p.Status)
	}

	// What the node reads still counts: the spec, the labels (advertisements select pools by label),
	// the annotations.
	update := func(what string, change func(u *unstructured.Unstructured), ok func(p *metallbv1beta1.IPAddressPool) bool) {
		t.Helper()
		u, err := pools.Get(ctx, "lan", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(u)
		must(pools.Update(ctx, u, metav1.UpdateOptions{}))
		nodeRec.wait(t, what, func(st *State) bool { p := findTestPool(st, "lan"); return p != nil && ok(p) })
	}
	update("lan's new addresses", func(u *unstructured.Unstructured) {
		must(nil, unstructured.SetNestedStringSlice(u.Object, []string{"203.0.113.32/28"}, "spec", "addresses"))
	}, func(p *metallbv1beta1.IPAddressPool) bool {
		return slices.Equal(p.Spec.Addresses, []string{"203.0.113.32/28"})
	})
	update("lan's new label", func(u *unstructured.Unstructured) {
		u.SetLabels(map[string]string{"tier": "back"})
	}, func(p *metallbv1beta1.IPAddressPool) bool { return p.Labels["tier"] == "back" })
	update("lan's new annotation", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{"example.com/note": "x"})
	}, func(p *metallbv1beta1.IPAddressPool) bool { return p.Annotations["example.com/note"] == "x" })

	// And a status write after those is still ignored.
	before := node.stats.metallbIgnored.Load()
	writePoolStatus(t, ctx, pools, "lan", n+1)
	ctrlRec.wait(t, "the last status write", func(st *State) bool {
		p := findTestPool(st, "lan")
		return p != nil && p.Status.AssignedIPv4 == n+1
	})
	for deadline := time.Now().Add(60 * time.Second); node.stats.metallbIgnored.Load() == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the node never saw the last status write")
		}
	}
}

// metallbChanges counts the States rec received after its from-th and up to its to-th whose MetalLB
// objects differ from the State before.
func metallbChanges(rec *stateRecorder, from, to int) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	c := 0
	for i := max(from, 1); i < to; i++ {
		if rec.states[i].MetalLB != rec.states[i-1].MetalLB {
			c++
		}
	}
	return c
}

// writePoolStatus writes a pool's status as MetalLB's controller does (the status subresource).
func writePoolStatus(t *testing.T, ctx context.Context, pools dynamic.ResourceInterface, name string, assigned int64) {
	t.Helper()
	u, err := pools.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = map[string]any{"assignedIPv4": assigned, "availableIPv4": 16 - assigned, "assignedIPv6": int64(0), "availableIPv6": int64(0)}
	if _, err := pools.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestKubeBuilderMetalLBBySpec checks, without an API server, how the builder versions MetalLB
// objects: by generation, labels and annotations on the nodes (bySpec), by resourceVersion for the
// controller; and the node informers' update filter and transform.
func TestKubeBuilderMetalLBBySpec(t *testing.T) {
	pool := func(rv string, gen int64, labels map[string]any) *unstructured.Unstructured {
		meta := map[string]any{"name": "lan", "namespace": "default", "uid": "p1", "resourceVersion": rv, "generation": gen}
		if labels != nil {
			meta["labels"] = labels
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": meta,
			"spec":   map[string]any{"addresses": []any{"203.0.113.0/28"}},
			"status": map[string]any{"assignedIPv4": int64(1)},
		}}
	}
	listing := func(u *unstructured.Unstructured) kubeObjects {
		return kubeObjects{metallb: []metallbItem{{kind: &metallbKinds[0], obj: u}}}
	}
	for _, tc := range []struct {
		name   string
		bySpec bool
		next   *unstructured.Unstructured
		same   bool
	}{
		{"node: status write", true, pool("2", 1, nil), true},
		{"node: spec change", true, pool("2", 2, nil), false},
		{"node: label change", true, pool("2", 1, map[string]any{"tier": "front"}), false},
		{"controller: status write", false, pool("2", 1, nil), false},
		{"controller: nothing", false, pool("1", 1, nil), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newKubeBuilder(hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}), nil)
			b.bySpec = tc.bySpec
			first := b.build(listing(pool("1", 1, nil)))
			second := b.build(listing(tc.next))
			if got := first.MetalLB == second.MetalLB; got != tc.same {
				t.Errorf("same MetalLB config: %v, want %v", got, tc.same)
			}
			if got := metallbSpecUnchanged(pool("1", 1, nil), tc.next); tc.bySpec && got != tc.same {
				t.Errorf("metallbSpecUnchanged = %v, want %v", got, tc.same)
			}
		})
	}
	if metallbSpecUnchanged(pool("1", 0, nil), pool("2", 0, nil)) {
		t.Errorf("an object without a generation counts as unchanged")
	}
	u := pool("1", 1, nil)
	u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "x"}})
	if _, err := metallbStripStatus(u); err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Object["status"]; ok || len(u.GetManagedFields()) != 0 {
		t.Errorf("status or managed fields left: %v", u.Object)
	}
}
