package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
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
	// EndpointSlice updates right after it, and one snapshot for all of them means one dataplane sync.
	kubeDebounce = 50 * time.Millisecond
	// kubeMaxDelay bounds how long a continuous stream of events can postpone a snapshot.
	kubeMaxDelay = 500 * time.Millisecond
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
// (KeepMetalLBStatus turns this off).
//
// ServiceCIDRs extend the service CIDRs when the API server serves them; if that cannot be found
// out at start, the source asks again in the background and takes them in once it can.
//
// While the API server cannot be reached the informers keep their caches, so the source simply
// emits nothing new and the consumers keep their last State. When it comes back, client-go's watch
// backoff (0.8 s doubling up to 30 s, with jitter) decides how soon changes flow again: after a
// 10-15 s outage, typically 5-25 s. kube-proxy behaves the same; the backoff is what keeps thousands
// of nodes from hitting a recovering API server at once.
//
// With WatchSpeakerPods it also lists the node agent's own pods (State.SpeakerNodes).
//
// RBAC the node agent needs: get, list and watch on services, nodes, endpointslices
// (discovery.k8s.io), list and watch on servicecidrs (networking.k8s.io, when served) and, if
// MetalLB's CRDs are installed, on ipaddresspools, l2advertisements, bgpadvertisements,
// communities, bfdprofiles and bgppeers (metallb.io); create and patch on events (core); list and
// watch on secrets and pods in its own namespace (Roles there); and access to the discovery
// endpoints (granted to every authenticated user by default).
type KubeSource struct {
	cfg      *rest.Config
	nodeName string
	logger   hclog.Logger
	// proxyFilter says which Services and EndpointSlices are listed (SetServiceProxyName).
	proxyFilter ServiceProxyFilter
	// secretsNamespace, when set, is where the BGP password Secrets (BGPPeer passwordSecret) are
	// read from: the node agent's own namespace, the only one its RBAC lets it read Secrets in.
	secretsNamespace string
	// podsNamespace and podsSelector, when set, are where and which node agent pods are watched
	// (WatchSpeakerPods): State.SpeakerNodes.
	podsNamespace, podsSelector string

	// keepMetalLBStatus makes status-only changes of MetalLB objects count (KeepMetalLBStatus).
	keepMetalLBStatus bool

	recMu    sync.Mutex
	recorder record.EventRecorder

	// stats counts what Run does, for tests and figures.
	stats kubeSourceStats
}

// kubeSourceStats are counters of a KubeSource's work.
type kubeSourceStats struct {
	// snapshots counts the States built (each a full listing of the caches), emitted or not.
	snapshots atomic.Int64
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

// WatchBGPSecrets makes the source read the basic-auth Secrets of namespace ns (BGPPeer
// passwordSecret, as MetalLB's speaker does in its own namespace) into State.MetalLB.Secrets. Call it
// before Run.
func (k *KubeSource) WatchBGPSecrets(ns string) { k.secretsNamespace = ns }

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
	client, err := kubernetes.NewForConfig(typedCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes dynamic client: %w", err)
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
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
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
	for _, inf := range []cache.SharedIndexInformer{svcInf.Informer(), sliceInf.Informer(), nodeInf.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
	}
	synced := []cache.InformerSynced{svcInf.Informer().HasSynced, sliceInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	listSecrets := func() []*corev1.Secret { return nil }
	var secretsWG sync.WaitGroup
	defer secretsWG.Wait() // after the deferred cancel below has stopped the informer
	if ns := k.secretsNamespace; ns != "" {
		// Only basic-auth Secrets, only in this namespace: BGP passwords, nothing else is read.
		secretInf := newBGPSecretInformer(client, ns)
		if err := secretInf.SetTransform(stripManagedFields); err != nil {
			return fmt.Errorf("secret informer: %w", err)
		}
		if _, err := secretInf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("adding informer event handler: %w", err)
		}
		secretsWG.Add(1)
		go func() { defer secretsWG.Done(); secretInf.Run(ctx.Done()) }()
		synced = append(synced, secretInf.HasSynced)
		listSecrets = func() []*corev1.Secret { return listAll[*corev1.Secret](secretInf) }
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
		mlb.handler = metallbSpecHandler(handler, &k.stats.metallbIgnored)
		mlb.transform = metallbStripStatus
	}
	k.logger.Info("waiting for the Kubernetes API caches to sync", "server", k.cfg.Host)
	start := time.Now()
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
		// Warn once; the retries (every 2 s) would flood the log during a long outage.
		if failures == 0 {
			k.logger.Warn("cannot reach the Kubernetes API server; retrying", "server", k.cfg.Host, "err", err)
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
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	k.logger.Info("Kubernetes API caches synced", "duration", time.Since(start).Round(time.Millisecond))

	b := newKubeBuilder(k.logger, recorder)
	b.proxyFilter = k.proxyFilter
	b.bySpec = !k.keepMetalLBStatus
	snapshot := func() *State {
		k.stats.snapshots.Add(1)
		st := b.build(kubeObjects{
			services: listAll[*corev1.Service](svcInf.Informer()),
			slices:   listAll[*discoveryv1.EndpointSlice](sliceInf.Informer()),
			nodes:    listAll[*corev1.Node](nodeInf.Informer()),
			metallb:  mlb.list(),
			secrets:  listSecrets(),
		})
		st.SpeakerNodes = listSpeakerNodes()
		svcCIDRs.apply(st)
		return st
	}
	last := snapshot()
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
		st := snapshot()
		if !sameState(last, st) || !maps.Equal(last.SpeakerNodes, st.SpeakerNodes) ||
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
					if cache.WaitForCacheSync(ctx.Done(), started...) {
						notify()
					}
				}()
			}
		}
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
