package cluster

import (
	"cmp"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// kubeSourceName is Rejection.Source for objects from the API.
const kubeSourceName = "kubernetes"

// kubeObjects is one listing of the informer caches.
type kubeObjects struct {
	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
	nodes    []*corev1.Node
	metallb  []metallbItem
	secrets  []*corev1.Secret
}

// converted is the conversion of one API object at one version (see objectVersion): the model
// object, or why it was refused.
type converted[T any] struct {
	version objectVersion
	val     T
	err     error
}

// objectVersion is what says whether an object changed since it was last converted. Most kinds are
// read whole (a Service's status holds its LoadBalancer IPs), so any write counts: the
// resourceVersion. The MetalLB kinds are read for their spec and labels only (see kubeBuilder.bySpec).
type objectVersion struct {
	resourceVersion string
	// generation, when not 0, replaces resourceVersion: the API server bumps it on every change
	// but those of metadata and (for kinds with a status subresource, as all of MetalLB's are) of
	// the status, and on the start of a deletion. The metadata vipgate reads (labels: pool
	// selectors; annotations, kept for safety) is compared beside it.
	generation          int64
	labels, annotations map[string]string
}

// versionOf is obj's objectVersion: by generation when bySpec and the object has one (an object
// from an API server always has; hand-made test objects may not), else by resourceVersion.
func versionOf(obj metav1.Object, bySpec bool) objectVersion {
	if g := obj.GetGeneration(); bySpec && g != 0 {
		return objectVersion{generation: g, labels: obj.GetLabels(), annotations: obj.GetAnnotations()}
	}
	return objectVersion{resourceVersion: obj.GetResourceVersion()}
}

func (v objectVersion) equal(o objectVersion) bool {
	return v.resourceVersion == o.resourceVersion && v.generation == o.generation &&
		maps.Equal(v.labels, o.labels) && maps.Equal(v.annotations, o.annotations)
}

// convCache maps an object's UID to its last conversion.
type convCache[T any] map[types.UID]converted[T]

// kubeBuilder turns informer listings into States. It remembers the conversion of every object by
// UID and version (objectVersion), so an object that did not change is neither converted nor
// reported again, and keeps its pointer. Used by Run's goroutine only.
type kubeBuilder struct {
	logger      hclog.Logger
	recorder    record.EventRecorder
	proxyFilter ServiceProxyFilter
	// bySpec makes the MetalLB objects versioned by generation, labels and annotations rather than
	// resourceVersion: a write of their status alone (MetalLB's controller updates every
	// IPAddressPool's counters on allocations) then keeps the converted object and the State. For
	// the node agents, which never read a MetalLB status (their informers drop it, see
	// metallbStripStatus); the controller's pool status writer reads status and resourceVersion.
	bySpec bool

	services convCache[*Service]
	slices   convCache[*EndpointSlice]
	nodes    convCache[*Node]
	metallb  convCache[metav1.Object]
	prev     *State
}

func newKubeBuilder(logger hclog.Logger, recorder record.EventRecorder) *kubeBuilder {
	return &kubeBuilder{logger: logger, recorder: recorder}
}

// convertCached returns the conversion of obj from prev if its resourceVersion is unchanged, else
// converts it (reporting a failure through reject). Either way the result is stored in next.
func convertCached[O interface {
	metav1.Object
	runtime.Object
}, T any](prev, next convCache[T], obj O, conv func(O) (T, error), reject func(runtime.Object, error)) (T, error) {
	return convertCachedBy(prev, next, obj, false, conv, reject)
}

// convertCachedBy is convertCached, with the version by generation when bySpec (versionOf).
func convertCachedBy[O interface {
	metav1.Object
	runtime.Object
}, T any](prev, next convCache[T], obj O, bySpec bool, conv func(O) (T, error), reject func(runtime.Object, error)) (T, error) {
	uid, ver := obj.GetUID(), versionOf(obj, bySpec)
	if c, ok := prev[uid]; ok && c.version.equal(ver) {
		next[uid] = c
		return c.val, c.err
	}
	v, err := conv(obj)
	if err != nil {
		reject(obj, err)
	}
	next[uid] = converted[T]{version: ver, val: v, err: err}
	return v, err
}

// reject logs a refused object and records a Warning Event on it. It runs once per version of the
// object (objectVersion).
func (b *kubeBuilder) reject(kind string) func(runtime.Object, error) {
	return func(obj runtime.Object, err error) {
		m, _ := obj.(metav1.Object)
		b.logger.Warn("rejected Kubernetes object", "kind", kind, "object", objectName(m), "reason", err)
		if b.recorder != nil {
			b.recorder.Eventf(obj, corev1.EventTypeWarning, EventReasonRejected, "vipgate ignores this %s: %v", kind, err)
		}
	}
}

// objectName is "namespace/name", or "name" for cluster-scoped objects.
func objectName(m metav1.Object) string {
	if m == nil {
		return ""
	}
	if m.GetNamespace() == "" {
		return m.GetName()
	}
	return m.GetNamespace() + "/" + m.GetName()
}

// build converts a listing into a State, reusing the previous State's objects where nothing changed.
func (b *kubeBuilder) build(objs kubeObjects) *State {
	st := &State{
		Services:       make(map[ServiceKey]*Service, len(objs.services)),
		EndpointSlices: map[ServiceKey][]*EndpointSlice{},
		Nodes:          make(map[string]*Node, len(objs.nodes)),
	}
	addRejection := func(kind string, m metav1.Object, err error) {
		st.Rejected = append(st.Rejected, Rejection{Kind: kind, Object: objectName(m), Source: kubeSourceName, Reason: err.Error()})
	}

	services := make(convCache[*Service], len(objs.services))
	for _, o := range objs.services {
		// The informers' label selector already keeps these away; checked again so that the
		// builder means the same whoever lists for it.
		if b.proxyFilter.Ignores(o.Labels) {
			continue
		}
		svc, err := convertCached(b.services, services, o, ServiceFromAPI, b.reject("Service"))
		if err != nil {
			addRejection("Service", o, err)
			continue
		}
		st.Services[svc.Key] = svc
	}
	b.services = services

	sliceCache := make(convCache[*EndpointSlice], len(objs.slices))
	for _, o := range objs.slices {
		if b.proxyFilter.Ignores(o.Labels) {
			continue
		}
		es, err := convertCached(b.slices, sliceCache, o, EndpointSliceFromAPI, b.reject("EndpointSlice"))
		if err != nil {
			addRejection("EndpointSlice", o, err)
			continue
		}
		st.EndpointSlices[es.Service] = append(st.EndpointSlices[es.Service], es)
	}
	b.slices = sliceCache
	for key, list := range st.EndpointSlices {
		slices.SortFunc(list, func(a, b *EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		// Reuse the previous list when it holds exactly the same slices, so consumers can compare the
		// list header too.
		if b.prev != nil {
			if old, ok := b.prev.EndpointSlices[key]; ok && slices.Equal(old, list) {
				st.EndpointSlices[key] = old
			}
		}
	}

	nodes := make(convCache[*Node], len(objs.nodes))
	for _, o := range objs.nodes {
		n, err := convertCached(b.nodes, nodes, o, NodeFromAPI, b.reject("Node"))
		if err != nil {
			addRejection("Node", o, err)
			continue
		}
		st.Nodes[n.Name] = n
	}
	b.nodes = nodes

	mlbCache := make(convCache[metav1.Object], len(objs.metallb))
	var mlb MetalLBConfig
	for _, it := range objs.metallb {
		conv := func(u *unstructured.Unstructured) (metav1.Object, error) { return metallbFromUnstructured(it.kind, u) }
		obj, err := convertCachedBy(b.metallb, mlbCache, it.obj, b.bySpec, conv, b.reject(it.kind.kind))
		if err != nil {
			addRejection(it.kind.kind, it.obj, err)
			continue
		}
		mlb.add(obj)
	}
	for _, s := range objs.secrets {
		mlb.add(s)
	}
	b.metallb = mlbCache
	mlb.sort()
	st.MetalLB = &mlb
	if b.prev != nil && b.prev.MetalLB.equal(st.MetalLB) {
		st.MetalLB = b.prev.MetalLB
	}

	// Informer caches list in no particular order; sort so that equal states compare equal.
	slices.SortFunc(st.Rejected, func(x, y Rejection) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Object, y.Object))
	})
	b.prev = st
	return st
}
