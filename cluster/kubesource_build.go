package cluster

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strings"

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

	// What patch needs besides prev: the Service each EndpointSlice (by namespace and name) is
	// filed under, the UID of the object whose conversion is cached under each Service and
	// EndpointSlice name (so that patch can drop the conversion of an object deleted or replaced),
	// and the rejections the builder made (prev.Rejected also holds those the caller appends, such
	// as ServiceCIDRs').
	sliceSvc         map[ServiceKey]ServiceKey
	svcUID, sliceUID map[ServiceKey]types.UID
	rejected         []Rejection
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

// convertNode is convertCached for Nodes, with one more step: a Node at a new resourceVersion whose
// conversion comes out as before keeps its previous conversion (pointer, and a refusal is not
// reported again). kubelet writes every Node's status every few minutes (heartbeats, images,
// resources), which is about 17 writes a second at 5,000 nodes, and none of it is read (NodeFromAPI
// reads the name, labels, vipgate.io/ annotations, spec.unschedulable and the addresses): a new
// *Node for each would make every node of the cluster sync for nothing (sameState compares Node
// pointers). The informer drops most such updates before they cost a snapshot
// (nodeUnchangedForVipgate); this catches the rest, which the next full listing reads anyway.
func (b *kubeBuilder) convertNode(next convCache[*Node], o *corev1.Node) (*Node, error) {
	uid, ver := o.UID, versionOf(o, false)
	c, ok := b.nodes[uid]
	if ok && c.version.equal(ver) {
		next[uid] = c
		return c.val, c.err
	}
	n, err := NodeFromAPI(o)
	if ok && sameNodeConversion(c.val, c.err, n, err) {
		c.version = ver
		next[uid] = c
		return c.val, c.err
	}
	if err != nil {
		b.reject("Node")(o, err)
	}
	next[uid] = converted[*Node]{version: ver, val: n, err: err}
	return n, err
}

// sameNodeConversion says whether two conversions of a Node came out the same: equal Nodes (every
// field: reflect.DeepEqual, so that a field added to Node counts without a change here), or refusals
// for the same reason.
func sameNodeConversion(a *Node, aErr error, b *Node, bErr error) bool {
	if aErr != nil || bErr != nil {
		return aErr != nil && bErr != nil && aErr.Error() == bErr.Error()
	}
	return reflect.DeepEqual(a, b)
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
		st.Rejected = append(st.Rejected, Rejection{Kind: kind, Object: objectName(m), Source: kubeSourceName, Reason: err.Error(), Addr: ErrorAddr(err)})
	}

	services := make(convCache[*Service], len(objs.services))
	b.svcUID = make(map[ServiceKey]types.UID, len(objs.services))
	for _, o := range objs.services {
		// The informers' label selector already keeps these away; checked again so that the
		// builder means the same whoever lists for it.
		if b.proxyFilter.Ignores(o.Labels) {
			continue
		}
		b.svcUID[ServiceKey{Namespace: o.Namespace, Name: o.Name}] = o.UID
		svc, err := convertCached(b.services, services, o, ServiceFromAPI, b.reject("Service"))
		if err != nil {
			addRejection("Service", o, err)
			continue
		}
		st.Services[svc.Key] = svc
	}
	b.services = services

	sliceCache := make(convCache[*EndpointSlice], len(objs.slices))
	b.sliceSvc = make(map[ServiceKey]ServiceKey, len(objs.slices))
	b.sliceUID = make(map[ServiceKey]types.UID, len(objs.slices))
	for _, o := range objs.slices {
		if b.proxyFilter.Ignores(o.Labels) {
			continue
		}
		b.sliceUID[ServiceKey{Namespace: o.Namespace, Name: o.Name}] = o.UID
		es, err := convertCached(b.slices, sliceCache, o, EndpointSliceFromAPI, b.reject("EndpointSlice"))
		if err != nil {
			addRejection("EndpointSlice", o, err)
			continue
		}
		st.EndpointSlices[es.Service] = append(st.EndpointSlices[es.Service], es)
		b.sliceSvc[ServiceKey{Namespace: o.Namespace, Name: o.Name}] = es.Service
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
		n, err := b.convertNode(nodes, o)
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
	sortRejections(st.Rejected)
	b.prev, b.rejected = st, slices.Clone(st.Rejected)
	return st
}

// sortRejections sorts by kind and object, so that equal states compare equal.
func sortRejections(r []Rejection) {
	slices.SortFunc(r, func(x, y Rejection) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Object, y.Object))
	})
}

// patch is build for a change of only some Services and EndpointSlices: the previous State with
// the objects under the given informer keys ("namespace/name") read again (get returns nil for an
// object no longer in the cache), everything else shared with it. It costs in proportion to the keys,
// where build lists and looks up every object: under a rolling update at 10,000 Services a build
// takes milliseconds, a patch microseconds. The result is the State build would make from the same
// caches (TestKubeBuilderPatch checks it on random changes), provided every change of another kind
// (Nodes, MetalLB, Secrets) goes through build. The conversions of objects deleted, left out or
// replaced (a new UID under the same name) are dropped as their keys are read again, so that the
// caches hold what a build would leave. It needs a previous build.
//
// changed says whether the State differs from the previous one, exactly as !sameState would (the
// test checks that too), so that the caller need not compare 10,000 Services to find out: it is
// false when every object read again came out as before (the same pointers: a resourceVersion
// already converted, or an object left out before and still) with the same rejections. The State
// returned is then the previous one itself, which the caller must not modify.
func (b *kubeBuilder) patch(svcKeys, sliceKeys []string, getService func(key string) *corev1.Service,
	getSlice func(key string) *discoveryv1.EndpointSlice) (st *State, changed bool) {
	prev := b.prev
	st = &State{Services: maps.Clone(prev.Services), EndpointSlices: maps.Clone(prev.EndpointSlices), Nodes: prev.Nodes,
		MetalLB: prev.MetalLB}
	// The rejections of the objects read again are dropped and made anew.
	redo := map[[2]string]bool{}
	var rejected []Rejection
	addRejection := func(kind string, m metav1.Object, err error) {
		rejected = append(rejected, Rejection{Kind: kind, Object: objectName(m), Source: kubeSourceName, Reason: err.Error(), Addr: ErrorAddr(err)})
	}

	for _, key := range svcKeys {
		if redo[[2]string{"Service", key}] {
			continue // listed twice
		}
		redo[[2]string{"Service", key}] = true
		ns, name, _ := strings.Cut(key, "/")
		sk := ServiceKey{Namespace: ns, Name: name}
		old, had := prev.Services[sk]
		delete(st.Services, sk)
		o := getService(key)
		if o != nil && b.proxyFilter.Ignores(o.Labels) {
			o = nil
		}
		if o == nil {
			rekey(b.services, b.svcUID, sk, "", false)
		} else {
			rekey(b.services, b.svcUID, sk, o.UID, true)
			if svc, err := convertCached(b.services, b.services, o, ServiceFromAPI, b.reject("Service")); err != nil {
				addRejection("Service", o, err)
			} else {
				st.Services[svc.Key] = svc
			}
		}
		if now, ok := st.Services[sk]; ok != had || now != old {
			changed = true
		}
	}

	// The slices read again leave the lists of the Services they were filed under and join those
	// of the Services they name now.
	var (
		touched = map[ServiceKey]bool{}
		reread  = map[ServiceKey]bool{} // the slices read again, by namespace and name
		added   = map[ServiceKey][]*EndpointSlice{}
	)
	for _, key := range sliceKeys {
		ns, name, _ := strings.Cut(key, "/")
		sk := ServiceKey{Namespace: ns, Name: name}
		if reread[sk] {
			continue
		}
		reread[sk] = true
		redo[[2]string{"EndpointSlice", key}] = true
		if old, ok := b.sliceSvc[sk]; ok {
			delete(b.sliceSvc, sk)
			touched[old] = true
		}
		o := getSlice(key)
		if o == nil || b.proxyFilter.Ignores(o.Labels) {
			rekey(b.slices, b.sliceUID, sk, "", false)
			continue
		}
		rekey(b.slices, b.sliceUID, sk, o.UID, true)
		es, err := convertCached(b.slices, b.slices, o, EndpointSliceFromAPI, b.reject("EndpointSlice"))
		if err != nil {
			addRejection("EndpointSlice", o, err)
			continue
		}
		b.sliceSvc[sk] = es.Service
		added[es.Service] = append(added[es.Service], es)
		touched[es.Service] = true
	}
	for key := range touched {
		var list []*EndpointSlice
		for _, es := range prev.EndpointSlices[key] {
			if !reread[ServiceKey{Namespace: es.Namespace, Name: es.Name}] {
				list = append(list, es)
			}
		}
		list = append(list, added[key]...)
		old, had := prev.EndpointSlices[key]
		if len(list) == 0 {
			// build files no empty lists, so had means the Service had slices until now.
			changed = changed || had
			delete(st.EndpointSlices, key)
			continue
		}
		slices.SortFunc(list, func(a, b *EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		if had && slices.Equal(old, list) {
			list = old
		} else {
			changed = true
		}
		st.EndpointSlices[key] = list
	}

	for _, r := range b.rejected {
		if !redo[[2]string{r.Kind, r.Object}] {
			st.Rejected = append(st.Rejected, r)
		}
	}
	st.Rejected = append(st.Rejected, rejected...)
	sortRejections(st.Rejected)
	if !changed && slices.Equal(st.Rejected, b.rejected) {
		return prev, false
	}
	b.prev, b.rejected = st, slices.Clone(st.Rejected)
	return st, true
}

// rekey keeps a conversion cache and its name index (kubeBuilder.svcUID, sliceUID) in step when
// the object under name is read again: the conversion of the object that was there is dropped when
// there is none now (present false: deleted, or left out) or another one (a new UID: deleted and
// created again), and the name is given the UID of the one there now.
func rekey[T any](cache convCache[T], uids map[ServiceKey]types.UID, name ServiceKey, uid types.UID, present bool) {
	if old, ok := uids[name]; ok && (!present || old != uid) {
		delete(cache, old)
		delete(uids, name)
	}
	if present {
		uids[name] = uid
	}
}
