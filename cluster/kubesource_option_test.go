package cluster

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestKubeSourceForClients runs the source on client-go's fake clientset (as the churn bench does):
// the first State, an EndpointSlice update reaching onChange through a patch, then a Node through a
// full listing.
func TestKubeSourceForClients(t *testing.T) {
	client, src, rec := runFakeKubeSource(t, apiService("web", "s1", "1", "10.96.0.10"), apiSlice("web-a", "web", "e1", "1"))
	ctx := t.Context()
	if got := src.String(); got != "kubernetes fake" {
		t.Errorf("String() = %q", got)
	}
	endpoints := func(n int) func(*State) bool {
		return func(st *State) bool {
			list := st.EndpointSlices[ServiceKey{Namespace: "default", Name: "web"}]
			return len(list) == 1 && len(list[0].Endpoints) == n
		}
	}
	rec.wait(t, "the first State", endpoints(1))
	es := kubeTestSlice("web-a", "web", "10.244.1.11", "10.244.1.12")
	es.UID, es.ResourceVersion = "e1", "2"
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "the updated EndpointSlice", endpoints(2))
	// Only an EndpointSlice changed: the State was a patch of the first, not a new listing.
	if n := src.stats.patches.Load(); n == 0 {
		t.Error("the EndpointSlice update was taken by a full listing, not a patch")
	}
	// A change of another kind is a full listing again: a Node.
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "the Node", func(st *State) bool { return st.Nodes["node1"] != nil && endpoints(2)(st) })
}

// runFakeKubeSource runs a KubeSource for node1 on client-go's fake clientset holding objs (as the
// churn bench does), its States recorded in rec, until the test ends; the end checks that Run
// returned no error.
func runFakeKubeSource(t *testing.T, objs ...runtime.Object) (client *fake.Clientset, src *KubeSource, rec *stateRecorder) {
	client = fake.NewSimpleClientset(objs...) //nolint:staticcheck // NewClientset's field management is not needed here.
	src = NewKubeSourceForClients(client, dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), "fake", "node1", nil)
	rec = newStateRecorder()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, rec.onChange) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return client, src, rec
}

// waitUntil polls cond until it holds, failing the test with failure after a minute: for what a
// source does without emitting a State.
func waitUntil(t *testing.T, failure string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(failure)
		}
	}
}

// BenchmarkKubeBuilder measures one snapshot at 10,000 Services with one EndpointSlice each, one
// slice changed since the last (the churn case): a full build from the listing (build) and a patch of
// the changed key (patch), each with the change check Run's take makes (sameState after a build; a
// patch says itself). The listing of the informer caches, which only build needs, is not included.
func BenchmarkKubeBuilder(b *testing.B) {
	const n = 10000
	var (
		svcs   []*corev1.Service
		slices []*discoveryv1.EndpointSlice
	)
	for i := range n {
		svcs = append(svcs, apiService(fmt.Sprintf("svc-%d", i), fmt.Sprintf("s%d", i), "1", fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)))
		slices = append(slices, apiSlice(fmt.Sprintf("svc-%d-a", i), fmt.Sprintf("svc-%d", i), fmt.Sprintf("e%d", i), "1"))
	}
	rv := 1 // shared: a resourceVersion used again would hit the conversion cache
	for _, mode := range []string{"build", "patch"} {
		b.Run(mode, func(b *testing.B) {
			bld := newKubeBuilder(nil, nil)
			last := bld.build(kubeObjects{services: svcs, slices: slices})
			if len(last.Services) != n || len(last.Rejected) > 0 {
				b.Fatalf("%d Services, rejected %v", len(last.Services), last.Rejected)
			}
			getSvc := func(key string) *corev1.Service { b.Fatal("no Service changed"); return nil }
			for b.Loop() {
				rv++
				i := rv * 7919 % n
				es := slices[i].DeepCopy()
				es.ResourceVersion = fmt.Sprint(rv)
				slices[i] = es
				var (
					st      *State
					changed bool
				)
				if mode == "build" {
					st = bld.build(kubeObjects{services: svcs, slices: slices})
					changed = !sameState(last, st)
				} else {
					st, changed = bld.patch(nil, []string{"default/" + es.Name}, getSvc, func(string) *discoveryv1.EndpointSlice { return es })
				}
				if !changed {
					b.Fatal("a changed slice left the State the same")
				}
				last = st
			}
		})
	}
}

// TestKubeBuilderPatch checks kubeBuilder.patch against build on random changes of Services and
// EndpointSlices (created, updated, moved to another Service, made invalid, labelled headless,
// deleted and created again with a new UID): after each step the patched State must hold what a full
// build of the same caches holds, rejections included, the sync loop's change check must agree, the
// change patch reports must be exactly !sameState, and the conversion caches must hold what a full
// build leaves in them (no conversion of a deleted or replaced object).
func TestKubeBuilderPatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 19))
	var (
		services = map[string]*corev1.Service{}
		slices   = map[string]*discoveryv1.EndpointSlice{}
		seq      int
	)
	next := func() string { seq++; return strconv.Itoa(seq) }
	randService := func(name string) *corev1.Service {
		svc := apiService(name, "", "", fmt.Sprintf("10.96.0.%d", 1+rng.IntN(200)))
		switch rng.IntN(8) {
		case 0:
			svc.Spec.ClusterIP = "bogus"
		case 1:
			svc.Labels = map[string]string{"service.kubernetes.io/headless": ""}
		}
		return svc
	}
	randSlice := func(name string) *discoveryv1.EndpointSlice {
		addrs := []string{}
		for range rng.IntN(4) {
			addrs = append(addrs, fmt.Sprintf("10.244.1.%d", 1+rng.IntN(200)))
		}
		if rng.IntN(8) == 0 {
			addrs = append(addrs, "bogus")
		}
		es := kubeTestSlice(name, fmt.Sprintf("svc-%d", rng.IntN(6)), addrs...)
		if rng.IntN(10) == 0 {
			es.Labels["service.kubernetes.io/headless"] = ""
		}
		return es
	}
	full, inc := newKubeBuilder(hclog.NewNullLogger(), nil), newKubeBuilder(hclog.NewNullLogger(), nil)
	listing := func() kubeObjects {
		var o kubeObjects
		for _, s := range services {
			o.services = append(o.services, s)
		}
		for _, s := range slices {
			o.slices = append(o.slices, s)
		}
		return o
	}
	last := inc.build(listing())
	lastFull := full.build(listing())
	unchanged := 0
	defer func() {
		// The random changes include some that change nothing (a headless Service updated): the
		// unchanged answer is exercised too.
		if unchanged == 0 && !t.Failed() {
			t.Error("no step left the State unchanged")
		}
	}()
	for step := range 2000 {
		var svcKeys, sliceKeys []string
		for range 1 + rng.IntN(3) {
			if rng.IntN(2) == 0 {
				svcKeys = append(svcKeys, randChange(rng, services, fmt.Sprintf("svc-%d", rng.IntN(6)), "s", randService, next))
			} else {
				sliceKeys = append(sliceKeys, randChange(rng, slices, fmt.Sprintf("es-%d", rng.IntN(10)), "e", randSlice, next))
			}
		}
		want := full.build(listing())
		got, patchChanged := inc.patch(svcKeys, sliceKeys,
			func(k string) *corev1.Service { return services[k] }, func(k string) *discoveryv1.EndpointSlice { return slices[k] })
		if !reflect.DeepEqual(got.Services, want.Services) || !reflect.DeepEqual(got.EndpointSlices, want.EndpointSlices) ||
			!reflect.DeepEqual(got.Rejected, want.Rejected) {
			t.Fatalf("step %d (Services %v, EndpointSlices %v): patched State differs from the full build:\npatched %s %v\nbuilt   %s %v",
				step, svcKeys, sliceKeys, describeState(got), got.EndpointSlices, describeState(want), want.EndpointSlices)
		}
		// The change check never misses a change, and says what it says of the full builds (an
		// object written again unchanged has a new resourceVersion, so both count it as changed).
		changed := !reflect.DeepEqual(last.Services, got.Services) || !reflect.DeepEqual(last.EndpointSlices, got.EndpointSlices) ||
			!reflect.DeepEqual(last.Rejected, got.Rejected)
		if same := sameState(last, got); same && changed {
			t.Fatalf("step %d: sameState missed a change", step)
		} else if fullSame := sameState(lastFull, want); same != fullSame {
			t.Fatalf("step %d: sameState says %v of the patched States, %v of the built ones", step, same, fullSame)
		} else if patchChanged == same {
			t.Fatalf("step %d: patch says changed %v, sameState says same %v", step, patchChanged, same)
		}
		if !patchChanged {
			unchanged++
			if got != last {
				t.Fatalf("step %d: an unchanged patch returned a new State", step)
			}
		}
		if !sameUIDs(inc.services, full.services) || !sameUIDs(inc.slices, full.slices) {
			t.Fatalf("step %d: the patched builder caches conversions of Services %v and EndpointSlices %v, a full build %v and %v",
				step, sortedKeys(inc.services), sortedKeys(inc.slices), sortedKeys(full.services), sortedKeys(full.slices))
		}
		last, lastFull = got, want
	}
}

// randChange makes one random change of the object name in objs (the cache TestKubeBuilderPatch
// lists, by namespace/name key) and returns its key: an object there is deleted (one time in four)
// or replaced by fresh(name) under its UID (an update), an object not there is created from
// fresh(name) with a new UID (uidPrefix and next()); either write takes the resourceVersion next().
func randChange[T metav1.Object](rng *rand.Rand, objs map[string]T, name, uidPrefix string, fresh func(string) T, next func() string) string {
	key := "default/" + name
	old, ok := objs[key]
	if ok && rng.IntN(4) == 0 {
		delete(objs, key)
		return key
	}
	obj := fresh(name)
	if ok {
		obj.SetUID(old.GetUID())
	} else {
		obj.SetUID(types.UID(uidPrefix + next()))
	}
	obj.SetResourceVersion(next())
	objs[key] = obj
	return key
}

// sortedKeys lists a conversion cache's UIDs, sorted.
func sortedKeys[T any](c convCache[T]) []types.UID {
	return slices.Sorted(maps.Keys(c))
}

// sameUIDs says whether two conversion caches hold conversions of the same objects.
func sameUIDs[T any](a, b convCache[T]) bool { return slices.Equal(sortedKeys(a), sortedKeys(b)) }

// TestKubeDirty checks the change sets Run's snapshot takes: keys by kind, a tombstone's key, an
// object without one marking all, and take handing the sets over (a second take finds nothing: the
// wake-up that follows a taken change builds nothing) with new maps for what comes after.
func TestKubeDirty(t *testing.T) {
	d := newKubeDirty()
	if all, s, e := d.take(); all || s != nil || e != nil {
		t.Fatalf("a new set holds %v %v %v", all, s, e)
	}
	d.mark(false, apiService("web", "s1", "1", "10.96.0.10"))
	d.mark(true, cache.DeletedFinalStateUnknown{Key: "default/web-a", Obj: apiSlice("web-a", "web", "e1", "1")})
	d.mark(true, apiSlice("web-b", "web", "e2", "1"))
	svcMap := d.services
	all, svcs, sls := d.take()
	slices.Sort(sls)
	if all || !slices.Equal(svcs, []string{"default/web"}) || !slices.Equal(sls, []string{"default/web-a", "default/web-b"}) {
		t.Fatalf("took %v %v %v", all, svcs, sls)
	}
	if all, s, e := d.take(); all || s != nil || e != nil {
		t.Errorf("a second take found %v %v %v", all, s, e)
	}
	d.mark(false, apiService("api", "s2", "1", "10.96.0.11"))
	if len(svcMap) != 1 || svcMap["default/api"] {
		t.Errorf("take kept the map it handed over: %v", svcMap)
	}
	d.mark(false, "not an object")
	if all, s, _ := d.take(); !all || !slices.Equal(s, []string{"default/api"}) {
		t.Errorf("took %v %v, want all and default/api", all, s)
	}
	d.markAll()
	if all, _, _ := d.take(); !all {
		t.Error("markAll was not taken")
	}
}

// TestKubeSourceUnchangedPatch runs the source on the fake clientset: an EndpointSlice written again
// as it was (the same resourceVersion: its conversion is reused) is read by a patch that finds
// nothing changed, which emits no State; with kubeFullAfter at 0 every snapshot is a full listing.
func TestKubeSourceUnchangedPatch(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "patches", true: "full listings"}[full], func(t *testing.T) {
			if full {
				defer func(d time.Duration) { kubeFullAfter = d }(kubeFullAfter)
				kubeFullAfter = 0
			}
			client, src, rec := runFakeKubeSource(t, apiService("web", "s1", "1", "10.96.0.10"), apiSlice("web-a", "web", "e1", "1"))
			ctx := t.Context()
			rec.wait(t, "the first State", func(st *State) bool { return len(st.EndpointSlices) == 1 })
			_, states := rec.latest()
			snaps := src.stats.snapshots.Load()

			if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, apiSlice("web-a", "web", "e1", "1"), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the unchanged EndpointSlice update built no snapshot", func() bool { return src.stats.snapshots.Load() != snaps })
			es := kubeTestSlice("web-a", "web", "10.244.1.11", "10.244.1.12")
			es.UID, es.ResourceVersion = "e1", "2"
			if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, "the updated EndpointSlice", func(st *State) bool {
				l := st.EndpointSlices[ServiceKey{"default", "web"}]
				return len(l) == 1 && len(l[0].Endpoints) == 2
			})
			if _, n := rec.latest(); n-states != 1 {
				t.Errorf("%d States for an unchanged and a changed EndpointSlice update, want 1", n-states)
			}
			patches, unchanged := src.stats.patches.Load(), src.stats.unchanged.Load()
			if full && patches != 0 {
				t.Errorf("%d patches with kubeFullAfter 0", patches)
			} else if !full && (patches != 2 || unchanged != 1) {
				t.Errorf("%d patches, %d unchanged; want 2 and 1", patches, unchanged)
			}
		})
	}
}
