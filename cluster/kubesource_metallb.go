package cluster

import (
	"fmt"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// metallbKind is one MetalLB kind the Kubernetes source watches.
type metallbKind struct {
	kind   string
	gvr    schema.GroupVersionResource
	newObj func() metav1.Object
}

// metallbKinds lists the MetalLB kinds vipgate reads, with their resources (the same kinds and
// versions as the file source, decode.go).
var metallbKinds = []metallbKind{
	{"IPAddressPool", metallbv1beta1.GroupVersion.WithResource("ipaddresspools"), metallbV1beta1Kinds["IPAddressPool"]},
	{"L2Advertisement", metallbv1beta1.GroupVersion.WithResource("l2advertisements"), metallbV1beta1Kinds["L2Advertisement"]},
	{"BGPAdvertisement", metallbv1beta1.GroupVersion.WithResource("bgpadvertisements"), metallbV1beta1Kinds["BGPAdvertisement"]},
	{"Community", metallbv1beta1.GroupVersion.WithResource("communities"), metallbV1beta1Kinds["Community"]},
	{"BFDProfile", metallbv1beta1.GroupVersion.WithResource("bfdprofiles"), metallbV1beta1Kinds["BFDProfile"]},
	{"BGPPeer", metallbv1beta2.GroupVersion.WithResource("bgppeers"), metallbV1beta2Kinds["BGPPeer"]},
}

// metallbItem is one MetalLB object from an informer cache.
type metallbItem struct {
	kind *metallbKind
	obj  *unstructured.Unstructured
}

// metalLBInformers starts a dynamic informer for each MetalLB kind whose CRD the API server serves.
// A kind without its CRD cannot be listed (the informer would never sync and hold up the first
// snapshot), so it counts as empty until a later recheck finds it. Used by Run's goroutine only.
type metalLBInformers struct {
	factory   dynamicinformer.DynamicSharedInformerFactory
	discovery discovery.DiscoveryInterface
	handler   cache.ResourceEventHandler
	logger    hclog.Logger
	// transform is the informers' transform: stripManagedFields, or metallbStripStatus on the node
	// agents.
	transform cache.TransformFunc
	// informers holds the started informer of each kind, by index into metallbKinds.
	informers []cache.SharedIndexInformer
}

func newMetalLBInformers(f dynamicinformer.DynamicSharedInformerFactory, d discovery.DiscoveryInterface,
	h cache.ResourceEventHandler, logger hclog.Logger) *metalLBInformers {
	return &metalLBInformers{factory: f, discovery: d, handler: h, logger: logger, transform: stripManagedFields,
		informers: make([]cache.SharedIndexInformer, len(metallbKinds))}
}

// served asks discovery which of the MetalLB resources the API server serves.
func (m *metalLBInformers) served() (map[schema.GroupVersionResource]bool, error) {
	out := map[schema.GroupVersionResource]bool{}
	var gvs []schema.GroupVersion
	for _, k := range metallbKinds {
		if gv := k.gvr.GroupVersion(); !slices.Contains(gvs, gv) {
			gvs = append(gvs, gv)
		}
	}
	for _, gv := range gvs {
		list, err := m.discovery.ServerResourcesForGroupVersion(gv.String())
		if apierrors.IsNotFound(err) {
			continue // no CRD of this group version installed
		}
		if err != nil {
			return nil, fmt.Errorf("discovering %s: %w", gv, err)
		}
		for _, r := range list.APIResources {
			out[gv.WithResource(r.Name)] = true
		}
	}
	return out, nil
}

// discover starts the informers of the kinds that are served and logs the missing ones once.
func (m *metalLBInformers) discover() error {
	served, err := m.served()
	if err != nil {
		return err
	}
	var missing []string
	for i, k := range metallbKinds {
		if served[k.gvr] {
			m.start(i)
		} else {
			missing = append(missing, k.kind)
		}
	}
	if len(missing) > 0 {
		m.logger.Warn("MetalLB CRDs not installed; treating these kinds as empty and checking again periodically",
			"kinds", missing, "interval", kubeCRDRecheck)
	}
	return nil
}

// recheck starts informers for kinds whose CRDs appeared since and returns their HasSynced
// functions (the caller starts the factory again).
func (m *metalLBInformers) recheck() []cache.InformerSynced {
	if !slices.Contains(m.informers, nil) {
		return nil
	}
	served, err := m.served()
	if err != nil {
		m.logger.Debug("rechecking MetalLB CRDs", "err", err)
		return nil
	}
	var started []cache.InformerSynced
	for i, k := range metallbKinds {
		if m.informers[i] == nil && served[k.gvr] {
			m.logger.Info("MetalLB CRD installed; watching it now", "kind", k.kind)
			started = append(started, m.start(i).HasSynced)
		}
	}
	return started
}

func (m *metalLBInformers) start(i int) cache.SharedIndexInformer {
	inf := m.factory.ForResource(metallbKinds[i].gvr).Informer()
	// SetTransform only fails once the informer runs; these are fresh.
	_ = inf.SetTransform(m.transform)
	if _, err := inf.AddEventHandler(m.handler); err != nil {
		m.logger.Error("adding MetalLB informer event handler", "kind", metallbKinds[i].kind, "err", err)
	}
	m.informers[i] = inf
	return inf
}

// synced returns the HasSynced functions of the started informers.
func (m *metalLBInformers) synced() []cache.InformerSynced {
	var out []cache.InformerSynced
	for _, inf := range m.informers {
		if inf != nil {
			out = append(out, inf.HasSynced)
		}
	}
	return out
}

// list returns the objects of every synced informer. A kind whose informer has not synced yet (its
// CRD appeared moments ago) is left out rather than shown half-listed.
func (m *metalLBInformers) list() []metallbItem {
	var out []metallbItem
	for i, inf := range m.informers {
		if inf == nil || !inf.HasSynced() {
			continue
		}
		for _, o := range listAll[*unstructured.Unstructured](inf) {
			out = append(out, metallbItem{kind: &metallbKinds[i], obj: o})
		}
	}
	return out
}

// metallbFromUnstructured converts a MetalLB object from the dynamic client into MetalLB's typed API
// object.
func metallbFromUnstructured(k *metallbKind, u *unstructured.Unstructured) (metav1.Object, error) {
	obj := k.newObj()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), obj); err != nil {
		return nil, fmt.Errorf("converting %s: %w", k.kind, err)
	}
	if err := checkMeta(obj.GetNamespace(), obj.GetName(), dns1123Subdomain); err != nil {
		return nil, err
	}
	if err := validateMetalLB(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// metallbStripStatus is the MetalLB informers' transform on the node agents: the managed fields go,
// and so does the status, which they never read. MetalLB's controller rewrites an IPAddressPool's
// status on every allocation; without it in the cache, the objects a node holds are what it reads.
func metallbStripStatus(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		delete(u.Object, "status")
	}
	return stripManagedFields(obj)
}

// metallbSpecUnchanged reports whether an update of a MetalLB object leaves what the node agents
// read as it was: same UID and generation (the API server bumps the generation on every change of
// the spec, and when a deletion starts; not on status writes, all MetalLB kinds having a status
// subresource, nor on metadata changes), same labels (BGPAdvertisements and L2Advertisements
// select pools by label) and annotations. Such an update (typically a status write) does not call
// for a new State. An object without a generation counts as changed.
func metallbSpecUnchanged(oldObj, newObj any) bool {
	o, ok1 := oldObj.(metav1.Object)
	n, ok2 := newObj.(metav1.Object)
	if !ok1 || !ok2 {
		return false
	}
	return n.GetGeneration() != 0 && o.GetUID() == n.GetUID() && o.GetGeneration() == n.GetGeneration() &&
		maps.Equal(o.GetLabels(), n.GetLabels()) && maps.Equal(o.GetAnnotations(), n.GetAnnotations())
}
