package mlbstatus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Options configure a Writer.
type Options struct {
	// Namespace is vipgate's namespace (POD_NAMESPACE), where the status objects live.
	Namespace string
	// Component is Speaker (a node: ServiceL2Status, ServiceBGPStatus, ConfigurationState
	// "speaker-<Node>") or Controller (ConfigurationState "controller", IPAddressPool status).
	Component Component
	// Node is this node's name (Speaker).
	Node string
	// PodSelector selects the node agent's pods (Speaker); PodName is the controller's pod
	// (Controller, POD_NAME). They find the owner of the objects; without one, none is set.
	PodSelector, PodName string
	// MinInterval is the least time between two passes (default 500ms); Resync how often the
	// objects are compared again without a change (default 2m: every node lists its objects then,
	// from the API server's watch cache; also the retry after an error is at most this).
	MinInterval, Resync time.Duration
}

// Writer keeps MetalLB's status objects equal to the last desired state it was given. Set* only
// records the state and wakes the writer: the API calls happen in Run, at most one pass per
// MinInterval, so a burst of changes is written once and a slow or failing API server never
// blocks the caller. Errors are logged (once per distinct message) and retried.
type Writer struct {
	opts Options
	log  hclog.Logger
	dyn  dynamic.Interface
	disc interface {
		ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error)
	}
	pods cache.SharedIndexInformer

	l2, bgp, state kindAPI
	poolStatus     func(context.Context, *unstructured.Unstructured) (*unstructured.Unstructured, error)

	wake chan struct{}

	mu       sync.Mutex
	services map[types.NamespacedName]ServiceStatus // Speaker: L2 and BGP, per Service
	problems []string
	pools    []*metallbv1beta1.IPAddressPool
	counts   map[string]PoolCounts // "namespace/name"
	ready    bool                  // a desired state was set

	// Run's own state.
	missing  map[string]bool // resources whose CRD is not installed (logged once)
	lastErrs map[string]string
	// poolWritten is the status last written per pool ("namespace/name") and the resourceVersion
	// it was written over: until a newer snapshot of the pool arrives, it is not written again.
	poolWritten map[string]poolWrite
}

// New returns a Writer for the cluster cfg points at; Run starts it.
func New(cfg *rest.Config, opts Options, log hclog.Logger) (*Writer, error) {
	if opts.Namespace == "" {
		return nil, errors.New("MetalLB status resources: no namespace (set POD_NAMESPACE)")
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("MetalLB status resources: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("MetalLB status resources: %w", err)
	}
	if opts.MinInterval <= 0 {
		opts.MinInterval = 500 * time.Millisecond
	}
	if opts.Resync <= 0 {
		opts.Resync = 2 * time.Minute
	}
	w := &Writer{opts: opts, log: log, dyn: dyn, disc: client.Discovery(), wake: make(chan struct{}, 1),
		missing: map[string]bool{}, lastErrs: map[string]string{}, poolWritten: map[string]poolWrite{}}
	w.state = configStateAPI(dyn, opts.Namespace)
	field := ""
	switch opts.Component {
	case Speaker:
		w.l2, w.bgp = l2API(dyn, opts.Namespace), bgpAPI(dyn, opts.Namespace)
		field = "spec.nodeName=" + opts.Node
	case Controller:
		w.poolStatus = poolStatusAPI(dyn)
		if opts.PodName != "" {
			field = "metadata.name=" + opts.PodName
		}
	default:
		return nil, fmt.Errorf("MetalLB status resources: unknown component %q", opts.Component)
	}
	if field != "" {
		w.pods = ownerPods(client, opts.Namespace, opts.PodSelector, field)
	}
	return w, nil
}

// SetSpeaker records what this node announces: per Service, the L2 interfaces and the BGP peers
// (a Service absent, or with neither, has no object of this node), and the configuration problems
// for its ConfigurationState.
func (w *Writer) SetSpeaker(services map[types.NamespacedName]ServiceStatus, problems []string) {
	w.mu.Lock()
	// The speaker hands its state over on every decision (every few seconds); only a change wakes
	// the writer, the resync catches changes made by others.
	same := w.ready && reflect.DeepEqual(services, w.services) && slices.Equal(problems, w.problems)
	w.services, w.problems, w.ready = services, problems, true
	w.mu.Unlock()
	if !same {
		w.poke()
	}
}

// SetController records the pools (as read from the API, with their resourceVersion), their
// counts ("namespace/name") and the controller's configuration problems.
func (w *Writer) SetController(pools []*metallbv1beta1.IPAddressPool, counts map[string]PoolCounts, problems []string) {
	w.mu.Lock()
	w.pools, w.counts, w.problems, w.ready = pools, counts, problems, true
	w.mu.Unlock()
	w.poke()
}

func (w *Writer) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run writes until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	if w.pods != nil {
		go w.pods.Run(ctx.Done())
	}
	resync := time.NewTicker(w.opts.Resync)
	defer resync.Stop()
	retry := time.Duration(0)
	for {
		var after <-chan time.Time
		if retry > 0 {
			after = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-resync.C:
			// A CRD installed later is picked up; installed ones are not asked about again.
			maps.DeleteFunc(w.missing, func(_ string, missing bool) bool { return missing })
		case <-after:
		}
		if err := w.pass(ctx); err != nil {
			retry = min(max(2*retry, time.Second), w.opts.Resync)
		} else {
			retry = 0
		}
		// Rate limit: changes arriving meanwhile are coalesced into the next pass.
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.opts.MinInterval):
		}
	}
}

// pass compares every kind once; it returns the first error (all kinds are tried).
func (w *Writer) pass(ctx context.Context) error {
	w.mu.Lock()
	if !w.ready {
		w.mu.Unlock()
		return nil
	}
	services, problems, pools, counts := w.services, w.problems, w.pools, w.counts
	w.mu.Unlock()
	if w.pods != nil && !w.pods.HasSynced() {
		// The owner must be known before anything is created: an object without one is never
		// garbage-collected with the pod.
		return errors.New("waiting for the pod watch to sync")
	}
	owner := w.owner()
	var errs []error
	report := func(what string, err error) {
		if err == nil {
			if w.lastErrs[what] != "" {
				w.log.Info("MetalLB status resources written again", "resource", what)
			}
			delete(w.lastErrs, what)
			return
		}
		errs = append(errs, err)
		if w.lastErrs[what] != err.Error() {
			w.lastErrs[what] = err.Error()
			w.log.Warn("writing MetalLB status resources (will retry)", "resource", what, "err", err)
		}
	}
	now := metav1.Now()
	if w.installed(w.state.resource) {
		report(w.state.resource, w.syncConfigState(ctx, owner, problems, now))
	}
	switch w.opts.Component {
	case Speaker:
		l2 := map[types.NamespacedName]any{}
		bgp := map[types.NamespacedName]any{}
		l2Owners := map[types.NamespacedName][]string{}
		for k, s := range services {
			l2Owners[k] = s.L2Owners
			if len(s.Interfaces) > 0 {
				st := L2Status(w.opts.Node, k, s.Interfaces)
				l2[k] = &st
			}
			if len(s.Peers) > 0 {
				st := BGPStatus(w.opts.Node, k, s.Peers)
				bgp[k] = &st
			}
		}
		if w.installed(w.l2.resource) {
			// The announcing node removes other nodes' objects for the Service: the old owner
			// may be dead and cannot remove its own.
			report(w.l2.resource, w.syncServices(ctx, w.l2, "l2-", "", l2Owners, l2, owner))
		}
		if w.installed(w.bgp.resource) {
			report(w.bgp.resource, w.syncServices(ctx, w.bgp, "bgp-", LabelAnnounceNode+"="+w.opts.Node, nil, bgp, owner))
		}
	case Controller:
		if w.installed("ipaddresspools") {
			report("ipaddresspools/status", w.syncPools(ctx, pools, counts))
		}
	}
	if e := w.lastErrs["discovery"]; e != "" {
		errs = append(errs, errors.New(e)) // retried soon, not at the next resync
	}
	return errors.Join(errs...)
}

// installed says whether the API server serves resource in metallb.io/v1beta1; a missing CRD is
// logged once (clusters may have installed only part of MetalLB's CRDs) and checked again at the
// next resync.
func (w *Writer) installed(resource string) bool {
	if ok, seen := w.missing[resource]; seen {
		return !ok
	}
	list, err := w.disc.ServerResourcesForGroupVersion(metallbv1beta1.GroupVersion.String())
	if err != nil && !apierrors.IsNotFound(err) {
		// The API server did not answer: not a missing CRD; try again at the next pass.
		if w.lastErrs["discovery"] != err.Error() {
			w.lastErrs["discovery"] = err.Error()
			w.log.Warn("MetalLB status resources: discovery failed (will retry)", "err", err)
		}
		return false
	}
	delete(w.lastErrs, "discovery")
	found := false
	if err == nil {
		for _, r := range list.APIResources {
			found = found || r.Name == resource
		}
	}
	if !found {
		if !w.loggedMissing(resource) {
			w.log.Warn("MetalLB CRD not installed: not writing this status resource", "resource", resource+"."+metallbv1beta1.GroupVersion.Group)
		}
	}
	w.missing[resource] = !found
	return found
}

// loggedMissing remembers which missing CRDs were already logged (lastErrs doubles as the memory).
func (w *Writer) loggedMissing(resource string) bool {
	k := "missing " + resource
	seen := w.lastErrs[k] != ""
	w.lastErrs[k] = "logged"
	return seen
}

// owner is the reference to this component's pod, nil if it is not known (yet).
func (w *Writer) owner() []metav1.OwnerReference {
	if w.pods == nil {
		return nil
	}
	for _, o := range w.pods.GetStore().List() {
		p, ok := o.(*corev1.Pod)
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		// MetalLB: controllerutil.SetOwnerReference (not a controller reference).
		return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID}}
	}
	return nil
}

// syncServices makes the objects of one per-Service kind equal to desired (status values keyed by
// Service), MetalLB's Layer2StatusReconciler / ServiceBGPStatusReconciler: this node's object for
// each desired Service (created with generateName, then its status written), no object of this
// node for other Services, and with keep (L2) no other node's object for a desired Service unless
// keep names that node too (it owns another IP of the Service). An object of this node without the
// current owner reference (created before the pod was known, or by the pod before a rollout) gets it.
func (w *Writer) syncServices(ctx context.Context, api kindAPI, generateName, selector string, keep map[types.NamespacedName][]string,
	desired map[types.NamespacedName]any, owner []metav1.OwnerReference) error {
	// From the API server's watch cache (resourceVersion 0): every node lists at each resync.
	list, err := api.list(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("listing %s: %w", api.resource, err)
	}
	var errs []error
	del := func(u *unstructured.Unstructured) {
		if err := api.delete(ctx, u.GetName()); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", api.resource, u.GetName(), err))
		}
	}
	mine := map[types.NamespacedName]*unstructured.Unstructured{}
	for i := range list.Items {
		u := &list.Items[i]
		l := u.GetLabels()
		key := types.NamespacedName{Namespace: l[LabelServiceNamespace], Name: l[LabelServiceName]}
		if key.Name == "" || key.Namespace == "" || l[LabelAnnounceNode] == "" {
			continue // not MetalLB's (nor ours): leave it alone
		}
		_, want := desired[key]
		switch {
		case l[LabelAnnounceNode] != w.opts.Node:
			if want && keep != nil && !slices.Contains(keep[key], l[LabelAnnounceNode]) {
				del(u)
			}
		case !want || mine[key] != nil:
			del(u) // no longer announced here, or a duplicate
		default:
			mine[key] = u
		}
	}
	for _, key := range sortedKeys(desired) {
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired[key])
		if err != nil {
			return err
		}
		u := mine[key]
		if u == nil {
			u = &unstructured.Unstructured{}
			u.SetAPIVersion(metallbv1beta1.GroupVersion.String())
			u.SetKind(kindOf(api.resource))
			u.SetGenerateName(generateName)
			u.SetNamespace(w.opts.Namespace)
			u.SetLabels(ServiceLabels(w.opts.Node, key))
			u.SetOwnerReferences(owner)
			if u, err = api.create(ctx, u); err != nil {
				errs = append(errs, fmt.Errorf("creating %s for Service %s: %w", api.resource, key, err))
				continue
			}
		} else {
			if u, err = w.adopt(ctx, api, u, owner); err != nil {
				errs = append(errs, fmt.Errorf("setting the owner of %s for Service %s: %w", api.resource, key, err))
				continue
			}
			cur, _, _ := unstructured.NestedMap(u.Object, "status")
			if equality.Semantic.DeepEqual(cur, status) {
				continue
			}
		}
		// The CRDs have a status subresource: create ignores status, so it is written apart.
		u.Object["status"] = status
		if _, err := api.updateStatus(ctx, u); err != nil {
			errs = append(errs, fmt.Errorf("writing %s status for Service %s: %w", api.resource, key, err))
		}
	}
	return errors.Join(errs...)
}

// adopt makes owner (this component's pod) the owner of u if it is not already, as MetalLB's
// SetOwnerReference on every reconcile: after a rollout the objects belong to the new pod, not to
// the old one whose deletion would take them along. Without a known owner it changes nothing.
func (w *Writer) adopt(ctx context.Context, api kindAPI, u *unstructured.Unstructured, owner []metav1.OwnerReference) (*unstructured.Unstructured, error) {
	if len(owner) == 0 || slices.ContainsFunc(u.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return o.UID == owner[0].UID }) {
		return u, nil
	}
	u = u.DeepCopy()
	u.SetOwnerReferences(owner)
	return api.update(ctx, u)
}

func kindOf(resource string) string {
	switch resource {
	case gvrServiceL2Statuses.Resource:
		return "ServiceL2Status"
	case gvrServiceBGPStatuses.Resource:
		return "ServiceBGPStatus"
	}
	return "ConfigurationState"
}

// syncConfigState keeps this component's ConfigurationState.
func (w *Writer) syncConfigState(ctx context.Context, owner []metav1.OwnerReference, problems []string, now metav1.Time) error {
	name := ConfigStateName(w.opts.Component, w.opts.Node)
	list, err := w.state.list(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("listing configurationstates: %w", err)
	}
	var u *unstructured.Unstructured
	var prev *metallbv1beta1.ConfigurationStateStatus
	if len(list.Items) > 0 {
		u = &list.Items[0]
		var cs metallbv1beta1.ConfigurationState
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cs); err == nil {
			prev = &cs.Status
		}
	}
	desired := ConfigState(w.opts.Component, problems, prev, now)
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&desired)
	if err != nil {
		return err
	}
	if u == nil {
		u = &unstructured.Unstructured{}
		u.SetAPIVersion(metallbv1beta1.GroupVersion.String())
		u.SetKind("ConfigurationState")
		u.SetName(name)
		u.SetNamespace(w.opts.Namespace)
		u.SetLabels(ConfigStateLabels(w.opts.Component, w.opts.Node))
		u.SetOwnerReferences(owner)
		if u, err = w.state.create(ctx, u); err != nil {
			return fmt.Errorf("creating configurationstate %s: %w", name, err)
		}
	} else {
		if u, err = w.adopt(ctx, w.state, u, owner); err != nil {
			return fmt.Errorf("setting the owner of configurationstate %s: %w", name, err)
		}
		cur, _, _ := unstructured.NestedMap(u.Object, "status")
		if equality.Semantic.DeepEqual(cur, status) {
			return nil
		}
	}
	u.Object["status"] = status
	if _, err := w.state.updateStatus(ctx, u); err != nil {
		return fmt.Errorf("writing configurationstate %s status: %w", name, err)
	}
	return nil
}

type poolWrite struct {
	overVersion string
	status      metallbv1beta1.IPAddressPoolStatus
}

// syncPools writes each pool's counters where they differ. A conflict (the pool changed since it
// was read) is left to the next State, which carries the new resourceVersion.
func (w *Writer) syncPools(ctx context.Context, pools []*metallbv1beta1.IPAddressPool, counts map[string]PoolCounts) error {
	var errs []error
	for _, p := range pools {
		key := p.Namespace + "/" + p.Name
		c, ok := counts[key]
		if !ok {
			// A pool the controller rejected: its Services keep their IPs, and MetalLB leaves the
			// status of an invalid configuration alone; zeros would be wrong.
			continue
		}
		want := PoolStatus(c)
		if p.Status == want || w.poolWritten[key] == (poolWrite{p.ResourceVersion, want}) {
			continue
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion(metallbv1beta1.GroupVersion.String())
		u.SetKind("IPAddressPool")
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
		if err != nil {
			return err
		}
		u.Object["status"] = st
		_, err = w.poolStatus(ctx, u)
		switch {
		case err == nil:
			w.poolWritten[key] = poolWrite{p.ResourceVersion, want}
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Gone, or changed since this snapshot: the next State says what to do.
		default:
			errs = append(errs, fmt.Errorf("writing IPAddressPool %s/%s status: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// ProblemLines formats (object, reason) pairs as ConfigurationState error lines, sorted.
func ProblemLines(problems map[string]string) []string {
	out := make([]string, 0, len(problems))
	for o, r := range problems {
		out = append(out, strings.TrimSpace(o+": "+r))
	}
	slices.Sort(out)
	return out
}
