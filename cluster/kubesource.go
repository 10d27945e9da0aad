package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Tunables of the Kubernetes source. They are variables so that tests can shorten them.
var (
	// kubeQuiet is how long the informers must have been quiet for a change to be taken at once
	// (leading edge, see coalescer): a lone EndpointSlice created reaches the kernel without waiting.
	kubeQuiet = 50 * time.Millisecond
	// kubeDebounce is how long a burst of changes (one within kubeQuiet of the one before) must
	// stay quiet before a new snapshot is built: a Service update typically comes with several
	// EndpointSlice updates right after it, a few milliseconds apart, and one snapshot for all of
	// them means one dataplane sync. It is short because every change of the burst waits for it.
	kubeDebounce = 10 * time.Millisecond
	// kubeMaxDelay bounds how long a continuous stream of events (a rolling update: informers never
	// quiet) can postpone a snapshot, so under a sustained stream a snapshot is taken about every
	// kubeMaxDelay. Issue #19's target is 50 ms from an EndpointSlice write to the kernel at p99 with
	// 1,000 changes/s at 10,000 Services: a change waits up to kubeMaxDelay here, then for the
	// snapshot (a patch of the previous State, about 1 ms at 10,000 Services: BenchmarkKubeBuilder),
	// for the sync that may be running (the sync loop takes the newest State after it) and for its own
	// sync (10-20 ms with a few dozen changes). 20 ms leaves room for both syncs; 500 ms (before the
	// churn row ran through this source) made the p99 about 600 ms. Shorter costs CPU for little:
	// each snapshot clones the State's maps and each sync has a fixed cost (test/bench churn
	// measures both).
	kubeMaxDelay = 20 * time.Millisecond
	// kubeFullAfter is how long snapshots may be patches of the previous State (only Services and
	// EndpointSlices changed) before one is a full listing again. A patch makes what a full listing
	// would (TestKubeBuilderPatch) and drops the conversions of deleted objects itself, so the full
	// listing is only a safety net. It counts time, not snapshots: under a sustained churn a
	// snapshot is taken every kubeMaxDelay, and a full listing every 100 of them (what this was)
	// came every 2 s, costing that snapshot 25-50 ms at 50,000 Services, past the 50 ms target.
	kubeFullAfter = 60 * time.Second
	// kubeCRDRecheck is how often the source looks again for MetalLB CRDs that were not installed.
	kubeCRDRecheck = 30 * time.Second
	// kubeDiscoveryRetry is how often discovery is retried while the API server cannot be reached
	// at start-up.
	kubeDiscoveryRetry = 2 * time.Second
)

// EventComponent is the component name on the Kubernetes Events vipgate's node agent records.
const EventComponent = "vipgate-node"

// EventReasonRejected is the reason of the Warning Event recorded on an object vipgate refuses.
const EventReasonRejected = "Rejected"

// KubeSource builds State from the Kubernetes API with shared informers, as kube-proxy does: Services
// and discovery/v1 EndpointSlices (except those labelled service.kubernetes.io/service-proxy-name or
// service.kubernetes.io/headless, see ServiceProxyFilter), all Nodes, and MetalLB's IPAddressPool, L2Advertisement, BGPAdvertisement, Community, BFDProfile
// (metallb.io/v1beta1) and BGPPeer (metallb.io/v1beta2). A MetalLB kind whose CRD is not installed
// counts as empty; the source looks for it again every 30 s.
//
// Objects that fail conversion are left out of the snapshot, listed in State.Rejected, logged, and
// get a Warning Event with reason "Rejected", once per resourceVersion. Unchanged objects (same UID
// and resourceVersion) keep their pointers across snapshots. MetalLB objects are read without their
// status and count as changed only when their generation (spec), labels or annotations change: a
// status write (MetalLB's controller updates pool counters on every allocation) builds no new State
// (KeepMetalLBStatus turns this off). Likewise a Node update that changes nothing vipgate reads of a
// Node (kubelet's status writes, every few minutes per node: see nodeUnchangedForVipgate) builds no
// new State, and a Node at a new resourceVersion that converts as before keeps its pointer.
//
// ServiceCIDRs extend the service CIDRs when the API server serves them; if that cannot be found
// out at start, the source asks again in the background and takes them in once it can.
//
// While the API server cannot be reached the informers keep their caches, so the source simply
// emits nothing new and the consumers keep their last State. When it comes back, client-go's watch
// backoff (0.8 s doubling up to 30 s, with jitter) decides how soon changes flow again: after a
// 10-15 s outage, typically 5-25 s. kube-proxy behaves the same; the backoff is what keeps thousands
// of nodes from hitting a recovering API server at once. Before the first complete listing nothing
// is emitted; while that wait lasts (RBAC missing, the API server down) it is logged every 30 s and
// listed in Warnings (/status), as kube-proxy logs and keeps waiting.
//
// With WatchSpeakerPods it also lists the node agent's own pods (State.SpeakerNodes).
//
// RBAC the node agent needs: get, list and watch on services, nodes, endpointslices
// (discovery.k8s.io), list and watch on servicecidrs (networking.k8s.io, when served) and, if
// MetalLB's CRDs are installed, on ipaddresspools, l2advertisements, bgpadvertisements,
// communities, bfdprofiles and bgppeers (metallb.io); create and patch on events (core); list and
// watch on pods, and on the Secrets WatchBGPSecrets names (resourceNames), in its own namespace
// (Roles there); and access to the discovery endpoints (granted to every authenticated user by
// default).
type KubeSource struct {
	cfg      *rest.Config
	nodeName string
	logger   hclog.Logger
	// proxyFilter says which Services and EndpointSlices are listed (SetServiceProxyName).
	proxyFilter ServiceProxyFilter
	// secretsNamespace, when set, is where the BGP password Secrets (BGPPeer passwordSecret) are
	// read from: the node agent's own namespace, the only one its RBAC lets it read Secrets in;
	// secretNames are the only Secrets read there (bgpsecrets.go).
	secretsNamespace string
	secretNames      []string
	// podsNamespace and podsSelector, when set, are where and which node agent pods are watched
	// (WatchSpeakerPods): State.SpeakerNodes.
	podsNamespace, podsSelector string

	// keepMetalLBStatus makes status-only changes of MetalLB objects count (KeepMetalLBStatus).
	keepMetalLBStatus bool

	// client and dyn, when set (NewKubeSourceForClients), are used instead of clients built from cfg.
	client kubernetes.Interface
	dyn    dynamic.Interface

	recMu    sync.Mutex
	recorder record.EventRecorder

	// stats counts what Run does, for tests and figures.
	stats kubeSourceStats
	// syncWait is Run's wait for the first complete listing (Warnings).
	syncWait cacheSyncWait
}

// Warnings lists what /status should show about the source: caches that have not synced for a
// while (the node programs nothing until they have).
func (k *KubeSource) Warnings() []string {
	if w := k.syncWait.Warning(); w != "" {
		return []string{w}
	}
	return nil
}

// kubeSourceStats are counters of a KubeSource's work.
type kubeSourceStats struct {
	// snapshots counts the States built, emitted or not: full listings of the caches and patches.
	snapshots atomic.Int64
	// patches counts the snapshots that were patches (kubeBuilder.patch) rather than full listings.
	patches atomic.Int64
	// idle counts the wake-ups that found nothing left to read (an earlier snapshot had taken
	// their keys), and unchanged the patches that found every object read again as it was: neither
	// builds a State.
	idle, unchanged atomic.Int64
	// nodeIgnored counts the Node updates dropped for changing nothing vipgate reads (kubelet's
	// status writes: see nodeUnchangedForVipgate).
	nodeIgnored atomic.Int64
	// metallbIgnored counts the MetalLB updates dropped for changing nothing the node reads
	// (status writes: see metallbSpecUnchanged).
	metallbIgnored atomic.Int64
}

// Event records an Event on the object ref points at, through the source's recorder (a no-op before
// Run has started or after it ended). Other components of the node (the speakers) use it, so the node
// has one Event sink and the RBAC one place to look.
func (k *KubeSource) Event(ref *corev1.ObjectReference, eventType, reason, message string) {
	k.recMu.Lock()
	r := k.recorder
	k.recMu.Unlock()
	if r != nil {
		r.Event(ref, eventType, reason, message)
	}
}

// NewKubeSource returns a source for the cluster cfg points at. nodeName names this node on the
// Events it records (it may be empty). A nil logger discards log lines.
func NewKubeSource(cfg *rest.Config, nodeName string, logger hclog.Logger) *KubeSource {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &KubeSource{cfg: rest.CopyConfig(cfg), nodeName: nodeName, logger: logger}
}

// KeepMetalLBStatus makes the source deliver every change of a MetalLB object, its status included,
// as the LoadBalancer controller's IPAddressPool status writer needs (it compares and writes the
// status at the resourceVersion it read). By default the MetalLB objects are read without their
// status, and a change of nothing but the status (MetalLB's controller updates every pool's
// counters on each allocation) neither builds a new State nor emits one: on a cluster of thousands
// of nodes, each status write would otherwise cost every node a rebuild. Call it before Run.
func (k *KubeSource) KeepMetalLBStatus() { k.keepMetalLBStatus = true }

// SetServiceProxyName makes the source list only the Services and EndpointSlices labelled
// service.kubernetes.io/service-proxy-name=name (NodeConfig serviceProxyName), as Cilium's
// k8s-service-proxy-name does. The default, "", is kube-proxy's choice: only those without that
// label. Objects labelled service.kubernetes.io/headless are never listed. Call it before Run.
func (k *KubeSource) SetServiceProxyName(name string) { k.proxyFilter = ServiceProxyFilter{Name: name} }

// WatchBGPSecrets makes the source read the named basic-auth Secrets of namespace ns (BGPPeer
// passwordSecret, as MetalLB's speaker does in its own namespace) into State.MetalLB.Secrets: those
// names only, each by name, so that a Role can grant them by resourceNames (bgpsecrets.go). No
// names: no Secret is read. Call it before Run.
func (k *KubeSource) WatchBGPSecrets(ns string, names []string) {
	k.secretsNamespace, k.secretNames = ns, slices.Clone(names)
}

// String names the source for logs: "kubernetes <API server URL>".
func (k *KubeSource) String() string { return "kubernetes " + k.cfg.Host }

// Run starts the informers, waits until every one of them has synced (a partial first snapshot would
// make the dataplane delete rules of Services it has not seen yet), calls onChange with the first
// State, and then with a new State after every change (at once after a quiet period, bursts
// coalesced: see coalescer). onChange is called from Run's goroutine only, one call at a time, and
// not for changes that leave the State as it was.
//
// Run returns nil when ctx is cancelled, or an error if the clients cannot be built.
func (k *KubeSource) Run(ctx context.Context, onChange func(*State)) error {
	typedCfg := rest.CopyConfig(k.cfg)
	if typedCfg.UserAgent == "" {
		typedCfg.UserAgent = EventComponent
	}
	dynCfg := rest.CopyConfig(typedCfg)
	// Protobuf is cheaper to decode for the built-in kinds (kube-proxy does the same); custom
	// resources only speak JSON, so the dynamic client keeps the default.
	typedCfg.ContentType = "application/vnd.kubernetes.protobuf"
	typedCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	var (
		client kubernetes.Interface = k.client
		dyn    dynamic.Interface    = k.dyn
		err    error
	)
	if client == nil {
		if client, err = kubernetes.NewForConfig(typedCfg); err != nil {
			return fmt.Errorf("creating Kubernetes client: %w", err)
		}
	}
	if dyn == nil {
		if dyn, err = dynamic.NewForConfig(dynCfg); err != nil {
			return fmt.Errorf("creating Kubernetes dynamic client: %w", err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent, Host: k.nodeName})
	k.recMu.Lock()
	k.recorder = recorder
	k.recMu.Unlock()
	defer func() {
		k.recMu.Lock()
		k.recorder = nil
		k.recMu.Unlock()
	}()

	changed := make(chan struct{}, 1)
	// What changed since the last snapshot (kubeDirty). notify is the "anything else" that makes
	// the next snapshot a full listing: every handler but the two key handlers below, and whoever
	// adds a cache later (MetalLB CRDs, ServiceCIDRs). The first snapshot is a full listing.
	dirty := newKubeDirty()
	dirty.markAll()
	wake := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	notify := func() {
		dirty.markAll()
		wake()
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	keyHandler := func(slice bool) cache.ResourceEventHandler {
		mark := func(obj any) {
			dirty.mark(slice, obj)
			wake()
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: mark, UpdateFunc: func(_, obj any) { mark(obj) }, DeleteFunc: mark}
	}

	// As kube-proxy: Services handed to another proxy (service-proxy-name) or marked headless are
	// not even listed. Their EndpointSlices carry the same labels (the EndpointSlice controller
	// copies Service labels), so the same filter applies to slices.
	selector := k.proxyFilter.Selector().String()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
		informers.WithTransform(stripManagedFields))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields))
	svcInf := factory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	nodeInf := nodeFactory.Core().V1().Nodes()
	// kubelet writes each Node's status every few minutes (17 writes a second at 5,000 nodes) and
	// none of it is read: those updates are dropped before they cost every node a full listing.
	nodeH := dropUnchanged(handler, nodeUnchangedForVipgate, &k.stats.nodeIgnored)
	for inf, h := range map[cache.SharedIndexInformer]cache.ResourceEventHandler{svcInf.Informer(): keyHandler(false),
		sliceInf.Informer(): keyHandler(true), nodeInf.Informer(): nodeH} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
	}
	synced := []cache.InformerSynced{svcInf.Informer().HasSynced, sliceInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	listSecrets := func() []*corev1.Secret { return nil }
	var secretsWG sync.WaitGroup
	defer secretsWG.Wait() // after the deferred cancel below has stopped the informer
	if ns := k.secretsNamespace; ns != "" && len(k.secretNames) > 0 {
		// Only the named basic-auth Secrets, only in this namespace: BGP passwords, nothing else is read.
		secrets, err := newBGPSecrets(client, ns, k.secretNames, k.logger)
		if err != nil {
			return fmt.Errorf("secret informers: %w", err)
		}
		if err := secrets.start(ctx, handler, &secretsWG); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
		synced = append(synced, secrets.hasSynced)
		listSecrets = secrets.list
	}
	listSpeakerNodes := func() map[string]bool { return nil }
	if ns := k.podsNamespace; ns != "" {
		// Only the node agent's pods, only in its own namespace: which nodes run a speaker.
		podInf := newSpeakerPodInformer(client, ns, k.podsSelector)
		if _, err := podInf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
		secretsWG.Add(1)
		go func() { defer secretsWG.Done(); podInf.Run(ctx.Done()) }()
		synced = append(synced, podInf.HasSynced)
		listSpeakerNodes = func() map[string]bool { return SpeakerNodes(listAll[*corev1.Pod](podInf)) }
	}
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	var wg sync.WaitGroup
	defer func() {
		// Informers stop with ctx; wait for them so that Run leaves nothing running behind.
		cancel()
		factory.Shutdown()
		nodeFactory.Shutdown()
		dynFactory.Shutdown()
		wg.Wait()
	}()
	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())

	mlb := newMetalLBInformers(dynFactory, client.Discovery(), handler, k.logger)
	if !k.keepMetalLBStatus {
		// Status writes change nothing a node reads: keep them out of the caches, and drop the
		// updates that carry nothing else before they cost a snapshot.
		mlb.handler = dropUnchanged(handler, metallbSpecUnchanged, &k.stats.metallbIgnored)
		mlb.transform = metallbStripStatus
	}
	k.logger.Info("waiting for the Kubernetes API caches to sync", "server", k.cfg.Host)
	start := time.Now()
	// The wait for the first complete listing counts from here, discovery included (Warnings).
	k.syncWait.begin("the Kubernetes API caches")
	defer k.syncWait.end()
	// Discovery needs the API server; until it answers, keep retrying (the informers retry on their
	// own meanwhile).
	for failures := 0; ; failures++ {
		err := mlb.discover()
		if err == nil {
			if failures > 0 {
				k.logger.Info("reached the Kubernetes API server", "server", k.cfg.Host)
			}
			break
		}
		// Warn at once, then every cacheSyncWarnEvery: the retries (every 2 s) would flood the
		// log during a long outage, and silence would hide it.
		if failures == 0 {
			k.logger.Warn("cannot reach the Kubernetes API server; retrying", "server", k.cfg.Host, "err", err)
		} else if waited, ok := k.syncWait.overdue(); ok {
			k.logger.Warn("still cannot reach the Kubernetes API server; retrying", "server", k.cfg.Host, "waited", waited, "err", err)
		} else {
			k.logger.Debug("Kubernetes API server still unreachable", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(kubeDiscoveryRetry):
		}
	}
	dynFactory.Start(ctx.Done())
	synced = append(synced, mlb.synced()...)
	// ServiceCIDR objects extend the service CIDRs (kubesource_servicecidr.go).
	svcCIDRs, err := watchServiceCIDRs(ctx, nodeFactory, client, handler, notify, &wg, k.logger)
	if err != nil {
		return err
	}
	nodeFactory.Start(ctx.Done())
	synced = append(synced, svcCIDRs.synced()...)
	if !k.syncWait.wait(ctx, k.logger, "the Kubernetes API caches", synced...) {
		return nil // ctx ended
	}
	k.logger.Info("Kubernetes API caches synced", "duration", time.Since(start).Round(time.Millisecond))

	b := newKubeBuilder(k.logger, recorder)
	b.proxyFilter = k.proxyFilter
	b.bySpec = !k.keepMetalLBStatus
	// snapshot builds the next State: a patch of the previous one when only Services and
	// EndpointSlices changed (a rolling update: cheap enough to take every kubeMaxDelay), else a full
	// listing of the caches, which is also taken when kubeFullAfter has passed since the last one (a
	// safety net: see kubeFullAfter). The dirty sets are taken before the caches are read: a change
	// that arrives meanwhile is read again by the next snapshot.
	//
	// It returns nil when nothing can have changed: no key left to read (a wake-up whose keys an
	// earlier snapshot took: the wake channel holds one, whatever arrives after it), or a patch
	// that found every object as it was. Every other change marks all (the handler and notify above:
	// Nodes, MetalLB, Secrets, speaker pods, ServiceCIDRs and their late start, CRDs installed
	// later), so the speaker nodes and the ServiceCIDRs, read by full listings alone, cannot have
	// changed then either. patched says the State is a patch that changed something: it differs
	// from the last one (kubeBuilder.patch), so that take need not compare them.
	lastFull := time.Now()
	snapshot := func() (st *State, patched bool) {
		all, svcKeys, sliceKeys := dirty.take()
		if !all && len(svcKeys) == 0 && len(sliceKeys) == 0 {
			k.stats.idle.Add(1)
			return nil, false
		}
		k.stats.snapshots.Add(1)
		if all || time.Since(lastFull) >= kubeFullAfter {
			lastFull = time.Now()
			st = b.build(kubeObjects{
				services: listAll[*corev1.Service](svcInf.Informer()),
				slices:   listAll[*discoveryv1.EndpointSlice](sliceInf.Informer()),
				nodes:    listAll[*corev1.Node](nodeInf.Informer()),
				metallb:  mlb.list(),
				secrets:  listSecrets(),
			})
		} else {
			k.stats.patches.Add(1)
			var changed bool
			st, changed = b.patch(svcKeys, sliceKeys, cachedObject[*corev1.Service](svcInf.Informer()),
				cachedObject[*discoveryv1.EndpointSlice](sliceInf.Informer()))
			if !changed {
				k.stats.unchanged.Add(1)
				return nil, false // st is the previous State: not to be modified
			}
			patched = true
		}
		st.SpeakerNodes = listSpeakerNodes()
		svcCIDRs.apply(st)
		return st, patched
	}
	last, _ := snapshot()
	onChange(last)

	// A nil channel blocks forever: the debounce timer is armed only while a burst is pending.
	var (
		debounce  = time.NewTimer(time.Hour)
		debounceC <-chan time.Time
		co        = coalescer{quiet: kubeQuiet, debounce: kubeDebounce, maxDelay: kubeMaxDelay}
	)
	debounce.Stop()
	take := func() {
		co.taken()
		st, patched := snapshot()
		if st == nil {
			return
		}
		if patched || !sameState(last, st) || !maps.Equal(last.SpeakerNodes, st.SpeakerNodes) ||
			!slices.Equal(last.ServiceCIDRs, st.ServiceCIDRs) {
			last = st
			onChange(st)
		}
	}
	recheck := time.NewTicker(kubeCRDRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			if d := co.event(time.Now()); d > 0 {
				debounce.Reset(d)
				debounceC = debounce.C
			} else {
				debounce.Stop()
				debounceC = nil
				take()
			}
		case <-debounceC:
			debounceC = nil
			take()
		case <-recheck.C:
			if started := mlb.recheck(); len(started) > 0 {
				dynFactory.Start(ctx.Done())
				// Take the new kinds into the snapshot once their caches are complete.
				wg.Add(1)
				go func() {
					defer wg.Done()
					var w cacheSyncWait
					if w.wait(ctx, k.logger, "the caches of the MetalLB kinds installed since", started...) {
						notify()
					}
				}()
			}
		}
	}
}

// cachedObject returns a lookup of an informer's cache by key ("namespace/name"): the object, or
// nil if the cache has none of that type under the key.
func cachedObject[T any](inf cache.SharedIndexInformer) func(key string) T {
	return func(key string) T {
		o, _, _ := inf.GetStore().GetByKey(key)
		t, _ := o.(T)
		return t
	}
}

// listAll returns every object of an informer's cache with the given type.
func listAll[T any](inf cache.SharedIndexInformer) []T {
	items := inf.GetStore().List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// stripManagedFields drops metadata.managedFields before an object enters an informer cache:
// vipgate never reads them, and on a big cluster they are a large part of the memory.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		if meta := m.GetObjectMeta(); meta != nil {
			meta.SetManagedFields(nil)
		}
	} else if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// kubeDirty is what changed since the last snapshot, filled by the informers' handlers and taken by
// Run's snapshot: the informer keys ("namespace/name") of the Services and EndpointSlices, which the
// next snapshot patches (kubeBuilder.patch), or anything else (all), which makes it a full listing.
type kubeDirty struct {
	mu               sync.Mutex
	all              bool
	services, slices map[string]bool
}

func newKubeDirty() *kubeDirty {
	return &kubeDirty{services: map[string]bool{}, slices: map[string]bool{}}
}

// markAll makes the next snapshot a full listing.
func (d *kubeDirty) markAll() {
	d.mu.Lock()
	d.all = true
	d.mu.Unlock()
}

// mark adds the key of obj (an object or a tombstone from an informer) to the Services, or to the
// EndpointSlices when slice is set. An object without a key (never from an informer) marks all.
func (d *kubeDirty) mark(slice bool, obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err != nil:
		d.all = true
	case slice:
		d.slices[key] = true
	default:
		d.services[key] = true
	}
}

// take returns what changed and starts again from nothing. The key sets are handed over and new
// ones made, rather than cleared: a cleared map keeps the buckets of the largest burst it ever held
// (every key after an informer's relist, 50,000 and more) for the life of the process.
func (d *kubeDirty) take() (all bool, svcKeys, sliceKeys []string) {
	d.mu.Lock()
	all = d.all
	d.all = false
	// An empty set stays (nothing to hand over); it must then not be read after the unlock.
	var svcs, sls map[string]bool
	if len(d.services) > 0 {
		svcs, d.services = d.services, map[string]bool{}
	}
	if len(d.slices) > 0 {
		sls, d.slices = d.slices, map[string]bool{}
	}
	d.mu.Unlock()
	if svcs != nil {
		svcKeys = slices.Collect(maps.Keys(svcs))
	}
	if sls != nil {
		sliceKeys = slices.Collect(maps.Keys(sls))
	}
	return all, svcKeys, sliceKeys
}

// dropUnchanged returns h with a filtered UpdateFunc: an update that unchanged says carries nothing
// vipgate reads is dropped and counted in ignored. It serves the Node informer
// (nodeUnchangedForVipgate) and the node agents' MetalLB informers (metallbSpecUnchanged).
func dropUnchanged(h cache.ResourceEventHandlerFuncs, unchanged func(oldObj, newObj any) bool, ignored *atomic.Int64) cache.ResourceEventHandlerFuncs {
	update := h.UpdateFunc
	h.UpdateFunc = func(oldObj, newObj any) {
		if unchanged(oldObj, newObj) {
			ignored.Add(1)
			return
		}
		update(oldObj, newObj)
	}
	return h
}

// nodeUnchangedForVipgate says whether an update of a Node leaves everything NodeFromAPI reads as
// it was: the UID and name, the labels (the zone, the speakers' exclusion label, node selectors),
// the vipgate.io/ annotations, spec.unschedulable, whether it is to be deleted (deletionTimestamp,
// the autoscaler's taint: nodeToBeDeleted) and status.addresses (compared whole, hostnames
// included: they rarely change, and a change costs one snapshot). Nothing else of a Node is read,
// by the proxier or the speakers: not the conditions, not the other taints. kubelet writes the rest of the
// status (condition heartbeats, images, allocatable) every few minutes per node; at 5,000 nodes that
// is 17 writes a second, each of which would otherwise cost every node a full listing.
// TestNodeUnchangedForVipgate checks it against NodeFromAPI.
func nodeUnchangedForVipgate(oldObj, newObj any) bool {
	o, ok := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok || !ok2 || o == nil || n == nil {
		return false
	}
	return o.UID == n.UID && o.Name == n.Name && o.Spec.Unschedulable == n.Spec.Unschedulable &&
		nodeToBeDeleted(o) == nodeToBeDeleted(n) && maps.Equal(o.Labels, n.Labels) && slices.Equal(o.Status.Addresses, n.Status.Addresses) &&
		vipgateAnnotationsEqual(o.Annotations, n.Annotations)
}

// vipgateAnnotationsEqual says whether a and b hold the same annotations under vipgate.io/ (the
// others are not read: Nodes carry large ones that change, e.g. CNI and CSI state).
func vipgateAnnotationsEqual(a, b map[string]string) bool {
	count := func(m map[string]string) int {
		n := 0
		for k := range m {
			if strings.HasPrefix(k, "vipgate.io/") {
				n++
			}
		}
		return n
	}
	for k, v := range a {
		if strings.HasPrefix(k, "vipgate.io/") {
			if w, ok := b[k]; !ok || w != v {
				return false
			}
		}
	}
	return count(a) == count(b)
}
