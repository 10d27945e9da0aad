package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

// churnPipelineResult is what churnPipeline measured.
type churnPipelineResult struct {
	lat          []time.Duration // write -> kernel ack, one per change carried
	toState      []time.Duration // write -> the source's State that holds it, one per change carried
	total        int             // changes written
	syncs        int             // incremental syncs after the first (full) one
	states       int             // States the source emitted after the first
	maxSync      time.Duration
	writeLag     time.Duration // how far the writer fell behind its clock at worst
	cores        float64
	wall         time.Duration
	lost         int // Services whose endpoints in the last synced State differ from the API's
	last         *cluster.State
	prog         *dataplane.NetlinkProgrammer
	ns           *netns
	rss, hwm     float64
	writeCPUCost time.Duration // CPU of the fake API alone for the same writes (no informers)
}

// churnPipeline runs the churn through `vipgate node`'s own pipeline: client-go's fake clientset
// holds the n Services and their EndpointSlices; a cluster.KubeSource (NewKubeSourceForClients:
// its informers, coalescer, snapshot build and change check, as the node runs them) watches it and
// submits every new State to a dataplane.SyncRunner whose Sync is the proxier's, as cmd/vipgate's
// node wires them (without the post-sync steps: health checks, speakers, conntrack). The writer
// updates one EndpointSlice per change at rate (an endpoint removed, or the removed one added back,
// spread over the Services); each change is timed from the Update call to the kernel ack of the first
// sync whose State holds it. The CPU is the whole process's: the fake API server's work (deep copies
// and watch fan-out in client-go's object tracker) is included, as a real API server's would not be;
// writeCPUCost measures the writer against a fake clientset without informers, for reference.
func churnPipeline(n, rate int, dur time.Duration) (*churnPipelineResult, error) {
	total := max(1, int(float64(rate)*dur.Seconds()))
	res := &churnPipelineResult{total: total}
	tracing := os.Getenv("VIPGATE_BENCH_TRACE") != ""
	ns, err := newNetns()
	if err != nil {
		return nil, err
	}
	res.ns = ns
	res.prog = ns.programmer()

	svcs, slices := make([]runtime.Object, 0, n), make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		svc, es := synthService(i, 10)
		ks := kubeServiceOf(svc)
		ks.UID, ks.ResourceVersion = types.UID(fmt.Sprintf("svc-%d", i)), "1"
		svcs = append(svcs, ks)
		kes := kubeSlice(es)
		kes.UID, kes.ResourceVersion = types.UID(fmt.Sprintf("es-%d", i)), "1"
		slices[i] = kes
	}
	objs := svcs
	for _, es := range slices {
		objs = append(objs, es)
	}
	client := fake.NewSimpleClientset(objs...) //nolint:staticcheck // NewClientset needs the apply configurations' type converter: 20k objects in field-managed form cost seconds more, and nothing here applies.
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	// The fake's own watches panic when 100 events are queued (RaceFreeFakeWatcher): a writer
	// catching up after the process was descheduled for 100 ms overruns them. EndpointSlice
	// writes and watches go through a broadcaster instead that makes the writer wait, as a real
	// API server's flow control would.
	sliceGVR := discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	bc := watch.NewBroadcaster(1000, watch.WaitIfChannelFull)
	defer bc.Shutdown()
	client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		w, err := bc.Watch()
		return true, w, err
	})
	client.PrependReactor("update", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.UpdateAction).GetObject()
		if err := client.Tracker().Update(sliceGVR, obj, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, obj, bc.Action(watch.Modified, obj.DeepCopyObject())
	})
	if tracing {
		fmt.Fprintf(os.Stderr, "  churn: fake clientset of %d objects ready\n", len(objs))
	}

	// pending holds the changes written and not yet synced, by Service index. The writer touches
	// a Service again only after n/rate seconds (10 s at 10,000 and 1,000/s); a change still pending
	// then is carried by the sync that carries the newer one, and counted with its own write time.
	type write struct {
		at      []time.Time
		want    int       // endpoints in the slice after the newest write
		emitted time.Time // when the source emitted the first State that holds it
	}
	var (
		mu      sync.Mutex
		pending = map[int]*write{}
		want    = make([]int, n) // endpoints each slice has in the API after the writes so far
		cpu0    time.Duration
		start   time.Time
		first   = make(chan struct{})
	)
	for i := range want {
		want[i] = 10
	}
	p := proxy.NewProxier(nil, benchConfig(benchNodeIP), res.prog)
	runner := dataplane.NewSyncRunner(nil, dataplane.SyncRunnerOptions[*dataplane.SyncReport]{
		Name: "churn sync",
		Sync: func(_ context.Context, st *cluster.State) (*dataplane.SyncReport, error) {
			s0 := time.Now()
			rep, err := p.Sync(st)
			done := time.Now()
			if err != nil || rep.Full {
				return rep, err
			}
			res.syncs++
			res.maxSync = max(res.maxSync, done.Sub(s0))
			mu.Lock()
			for i, w := range pending {
				list := st.EndpointSlices[serviceKey(i)]
				if len(list) == 1 && len(list[0].Endpoints) == w.want {
					for _, at := range w.at {
						res.lat = append(res.lat, done.Sub(at))
						if !w.emitted.IsZero() {
							res.toState = append(res.toState, w.emitted.Sub(at))
						}
					}
					delete(pending, i)
				}
			}
			mu.Unlock()
			return rep, nil
		},
		AfterSync: []func(*cluster.State, *dataplane.SyncReport){func(st *cluster.State, rep *dataplane.SyncReport) {
			res.last = st
			if rep.Full {
				select {
				case <-first:
				default:
					close(first)
				}
			}
		}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Cancel before waiting: the runner and the source run until ctx ends, so a return on an error
	// must end them before it waits for them.
	defer func() { cancel(); wg.Wait() }()
	wg.Add(2)
	go func() { defer wg.Done(); _ = runner.Run(ctx) }()
	// srcErr holds the source's first failure; later ones (another rejected State, Run's own return)
	// are dropped rather than block the source's goroutine, which wg.Wait waits for.
	srcErr := make(chan error, 1)
	fail := func(err error) {
		select {
		case srcErr <- err:
		default:
		}
	}
	// states is written by the source's goroutine and read by this one while it runs.
	var states atomic.Int64
	go func() {
		defer wg.Done()
		src := cluster.NewKubeSourceForClients(client, dyn, "fake clientset", thisNode, nil)
		err := src.Run(ctx, func(st *cluster.State) {
			if len(st.Rejected) > 0 {
				fail(fmt.Errorf("the source rejected %s: %s", st.Rejected[0].Object, st.Rejected[0].Reason))
				cancel()
				return
			}
			states.Add(1)
			now := time.Now()
			mu.Lock()
			for i, w := range pending {
				if list := st.EndpointSlices[serviceKey(i)]; w.emitted.IsZero() && len(list) == 1 && len(list[0].Endpoints) == w.want {
					w.emitted = now
				}
			}
			mu.Unlock()
			runner.Submit(st)
		})
		if err == nil {
			err = errors.New("the source stopped")
		}
		fail(err)
	}()
	select {
	case <-first:
	case err := <-srcErr:
		return res, fmt.Errorf("the Kubernetes source: %v", err)
	case <-time.After(5 * time.Minute):
		return res, fmt.Errorf("no full sync within 5 minutes")
	}
	resetPeakRSS()
	if tracing {
		fmt.Fprintf(os.Stderr, "  churn: first full sync done\n")
	}

	// The writer: one EndpointSlice Update per change, on its own clock.
	toggle := func(i int) *discoveryv1.EndpointSlice {
		es := slices[i].DeepCopy()
		if want[i] == 10 {
			es.Endpoints = es.Endpoints[:9]
			want[i] = 9
		} else {
			want[i] = 10
		}
		rv, _ := strconv.Atoi(slices[i].ResourceVersion)
		slices[i].ResourceVersion = strconv.Itoa(rv + 1)
		es.ResourceVersion = slices[i].ResourceVersion
		return es
	}
	cpu0, start = cpuTime(), time.Now()
	states0 := states.Load()
	interval := time.Second / time.Duration(rate)
	for c := range total {
		// A failure of the source (a rejected State) ends the run: nothing would carry the changes.
		select {
		case err := <-srcErr:
			return res, fmt.Errorf("the Kubernetes source: %v", err)
		default:
		}
		at := start.Add(time.Duration(c) * interval)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		res.writeLag = max(res.writeLag, time.Since(at))
		i := c * 7919 % n
		es := toggle(i)
		now := time.Now()
		mu.Lock()
		w := pending[i]
		if w == nil {
			w = &write{}
			pending[i] = w
		}
		w.at, w.want = append(w.at, now), want[i]
		mu.Unlock()
		if _, err := client.DiscoveryV1().EndpointSlices(benchNamespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			return res, fmt.Errorf("updating EndpointSlice %s: %w", es.Name, err)
		}
		if c%1000 == 999 {
			// The fake records a copy of every action it served: 60,000 slices would be a few
			// hundred MiB of the process's heap, and its garbage collection, that vipgate does not have.
			client.ClearActions()
		}
	}
	if tracing {
		fmt.Fprintf(os.Stderr, "  churn: %d writes done in %v\n", total, time.Since(start))
	}
	// Wait for the last changes to reach the kernel (bounded: a lost change must not hang the run).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		left := len(pending)
		mu.Unlock()
		if left == 0 {
			break
		}
	}
	select {
	case err := <-srcErr:
		return res, fmt.Errorf("the Kubernetes source: %v", err)
	default:
	}
	res.wall = time.Since(start)
	res.cores = float64(cpuTime()-cpu0) / float64(res.wall)
	res.rss, res.hwm = rssMiB()
	cancel()
	wg.Wait()
	res.states = int(states.Load() - states0)
	if res.last == nil {
		return res, fmt.Errorf("no sync")
	}
	for i := range n {
		list := res.last.EndpointSlices[serviceKey(i)]
		if len(list) != 1 || len(list[0].Endpoints) != want[i] {
			res.lost++
		}
	}

	// The fake API alone: the same number of writes into a clientset nobody watches.
	alone := fake.NewSimpleClientset(objs...) //nolint:staticcheck // as above
	c0 := cpuTime()
	for c := range total {
		i := c * 7919 % n
		if _, err := alone.DiscoveryV1().EndpointSlices(benchNamespace).Update(context.Background(), toggle(i), metav1.UpdateOptions{}); err != nil {
			return res, err
		}
		if c%1000 == 999 {
			alone.ClearActions()
		}
	}
	res.writeCPUCost = cpuTime() - c0
	return res, nil
}
