package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// serviceCIDRGroupVersion and serviceCIDRResource name the ServiceCIDR API (GA in Kubernetes 1.33).
const (
	serviceCIDRGroupVersion = "networking.k8s.io/v1"
	serviceCIDRResource     = "servicecidrs"
)

// Tunables of the ServiceCIDR discovery retries; variables so that tests can shorten them.
var (
	// serviceCIDRRetryMin is the first delay before discovery is tried again after a transient
	// error; it doubles with each failure up to serviceCIDRRetryMax.
	serviceCIDRRetryMin = time.Second
	// serviceCIDRRetryMax bounds the delay between retries, and is the delay while the answer is
	// Forbidden (RBAC can be fixed without a restart, but not in a second).
	serviceCIDRRetryMax = 5 * time.Minute
	// serviceCIDRResources asks the API server for the resources of networking.k8s.io/v1 (tests
	// wrap it).
	serviceCIDRResources = discoverServiceCIDRs
)

// serviceCIDRWatch keeps the cluster's ServiceCIDR objects (networking.k8s.io/v1), the ranges the API
// server allocates ClusterIPs from. A cluster can add ranges at run time; without them, the ClusterIPs
// of a new range would be unknown addresses to the dataplane and traffic to its unallocated IPs would
// not be dropped (kube-proxy follows ServiceCIDRs the same way, OnServiceCIDRsChanged).
//
// A ServiceCIDR being deleted stays in the informer until its finalizer is removed, which the API
// server does only once no ClusterIP of the range is in use: it stays in State.ServiceCIDRs until
// then, because its IPs may still be allocated.
//
// synced and apply are used by Run's goroutine only; the informer may be set later by the retry
// goroutine (retry), hence the mutex.
type serviceCIDRWatch struct {
	factory informers.SharedInformerFactory
	client  kubernetes.Interface
	handler cache.ResourceEventHandler
	logger  hclog.Logger

	mu  sync.Mutex
	inf cache.SharedIndexInformer // nil until ServiceCIDRs are known to be served and allowed
	// logged remembers the rejections already logged (object -> reason), so each is logged once.
	logged map[string]string
}

// serviceCIDRAnswer is what discovery (and the RBAC probe) said about ServiceCIDRs.
type serviceCIDRAnswer int

const (
	serviceCIDRsServed    serviceCIDRAnswer = iota
	serviceCIDRsNotServed                   // the API server really has no such resource: final
	serviceCIDRsForbidden                   // RBAC says no: retried at serviceCIDRRetryMax
	serviceCIDRsUnknown                     // any other error (API server unreachable): retried with backoff
)

// watchServiceCIDRs registers a ServiceCIDR informer on factory (which the caller starts) if the API
// server serves the resource; an older API server (before 1.31's beta, or with the API off) has none,
// and then only the configured service CIDRs apply. If discovery fails (the API server briefly
// unavailable, RBAC refusing the list), it is retried in the background (1 s doubling to 5 min, with
// jitter; a Forbidden answer at the 5 min interval) and, once it succeeds, the informer is started
// there and notify called when it has synced, so that a new State carries the ranges. The
// goroutine is counted in wg and ends with ctx.
func watchServiceCIDRs(ctx context.Context, factory informers.SharedInformerFactory, client kubernetes.Interface, h cache.ResourceEventHandler,
	notify func(), wg *sync.WaitGroup, logger hclog.Logger) (*serviceCIDRWatch, error) {
	w := &serviceCIDRWatch{factory: factory, client: client, handler: h, logger: logger, logged: map[string]string{}}
	answer, err := w.probe(ctx)
	switch answer {
	case serviceCIDRsServed:
		inf, err := w.register()
		if err != nil {
			return nil, err
		}
		w.inf = inf
		return w, nil
	case serviceCIDRsNotServed:
		logger.Info("the API server does not serve ServiceCIDRs; using the configured service CIDRs only")
		return w, nil
	}
	// An informer of a resource that is not served, or not allowed, would never sync and hold up
	// the first snapshot: do without for now, and find out in the background.
	last := w.logAnswer(answer, err, "")
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.retry(ctx, answer, last, notify)
	}()
	return w, nil
}

// probe asks discovery whether ServiceCIDRs are served and, if so, whether the RBAC allows listing
// them.
func (w *serviceCIDRWatch) probe(ctx context.Context) (serviceCIDRAnswer, error) {
	list, err := serviceCIDRResources(ctx, w.client)
	switch {
	case apierrors.IsNotFound(err):
		return serviceCIDRsNotServed, nil
	case apierrors.IsForbidden(err):
		return serviceCIDRsForbidden, fmt.Errorf("discovering %s: %w", serviceCIDRGroupVersion, err)
	case err != nil:
		return serviceCIDRsUnknown, fmt.Errorf("discovering %s: %w", serviceCIDRGroupVersion, err)
	}
	if list == nil || !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == serviceCIDRResource }) {
		return serviceCIDRsNotServed, nil
	}
	// An informer the RBAC does not allow would never sync and hold up the first snapshot for good
	// (an upgrade that kept an older ClusterRole): probe once. Other errors are left to the
	// informer, which retries on its own.
	if _, err := w.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsForbidden(err) {
		return serviceCIDRsForbidden, err
	}
	return serviceCIDRsServed, nil
}

// discoverServiceCIDRs is discovery's ServerResourcesForGroupVersion for networking.k8s.io/v1 with
// ctx: discovery's own method does not take one, and a probe of an API server that does not answer
// would hold up shutdown until the client's timeout (none by default).
func discoverServiceCIDRs(ctx context.Context, c kubernetes.Interface) (*metav1.APIResourceList, error) {
	rc := c.Discovery().RESTClient()
	if rc == nil {
		// A fake clientset's discovery has no REST client; it answers at once.
		return c.Discovery().ServerResourcesForGroupVersion(serviceCIDRGroupVersion)
	}
	list := &metav1.APIResourceList{GroupVersion: serviceCIDRGroupVersion}
	if err := rc.Get().AbsPath("/apis/" + serviceCIDRGroupVersion).Do(ctx).Into(list); err != nil {
		return nil, err
	}
	return list, nil
}

// logAnswer logs a failed probe when it differs from the last one logged (last, returned updated):
// a long outage or a RBAC left unfixed logs once, not at every retry.
func (w *serviceCIDRWatch) logAnswer(answer serviceCIDRAnswer, err error, last string) string {
	msg := fmt.Sprint(answer, err)
	if msg == last {
		w.logger.Debug("ServiceCIDR discovery still failing", "err", err)
		return last
	}
	switch answer {
	case serviceCIDRsForbidden:
		w.logger.Error("not allowed to list ServiceCIDRs (the ClusterRole lacks networking.k8s.io servicecidrs list, watch); using the configured service CIDRs only, checking again every "+serviceCIDRRetryMax.String(), "err", err)
	default:
		w.logger.Warn("cannot discover ServiceCIDRs; using the configured service CIDRs only meanwhile, retrying in the background", "err", err)
	}
	return msg
}

// retry probes again until ServiceCIDRs are found served (then starts their informer, waits for it
// to sync, and calls notify) or not served, or ctx ends.
func (w *serviceCIDRWatch) retry(ctx context.Context, answer serviceCIDRAnswer, last string, notify func()) {
	backoff, prev := serviceCIDRRetryMin, answer
	for {
		d := min(backoff, serviceCIDRRetryMax)
		if answer == serviceCIDRsForbidden {
			d = serviceCIDRRetryMax
		} else {
			backoff *= 2
		}
		// Up to 20 % more, so that the nodes of a cluster do not all ask at the same moment.
		t := time.NewTimer(wait.Jitter(d, 0.2))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var err error
		answer, err = w.probe(ctx)
		if ctx.Err() != nil {
			return
		}
		switch answer {
		case serviceCIDRsNotServed:
			w.logger.Info("the API server does not serve ServiceCIDRs; using the configured service CIDRs only")
			return
		case serviceCIDRsServed:
			inf, err := w.register()
			if err != nil {
				w.logger.Error("watching ServiceCIDRs", "err", err)
				return
			}
			w.factory.Start(ctx.Done())
			var sw cacheSyncWait
			if !sw.wait(ctx, w.logger, "the ServiceCIDR caches", inf.HasSynced) {
				return // ctx ended
			}
			w.mu.Lock()
			w.inf = inf
			w.mu.Unlock()
			w.logger.Info("ServiceCIDRs discovered; watching them now")
			notify()
			return
		}
		if answer == serviceCIDRsUnknown && prev == serviceCIDRsForbidden {
			backoff = serviceCIDRRetryMin // from Forbidden to an outage: the backoff starts again
		}
		prev, last = answer, w.logAnswer(answer, err, last)
	}
}

// register adds the ServiceCIDR informer to the factory, with the handler.
func (w *serviceCIDRWatch) register() (cache.SharedIndexInformer, error) {
	inf := w.factory.Networking().V1().ServiceCIDRs().Informer()
	if _, err := inf.AddEventHandler(w.handler); err != nil {
		return nil, fmt.Errorf("adding ServiceCIDR event handler: %w", err)
	}
	return inf, nil
}

// synced is what the first snapshot waits for: as kube-proxy, the ranges must be known before the
// first sync, or it would program a cluster-IPs check without them. An informer started later by
// the retries is not waited for (it notifies once synced).
func (w *serviceCIDRWatch) synced() []cache.InformerSynced {
	inf := w.informer()
	if inf == nil {
		return nil
	}
	return []cache.InformerSynced{inf.HasSynced}
}

func (w *serviceCIDRWatch) informer() cache.SharedIndexInformer {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inf
}

// apply sets st.ServiceCIDRs from the informer's cache and appends the objects it refuses to
// st.Rejected (each logged once).
func (w *serviceCIDRWatch) apply(st *State) {
	inf := w.informer()
	if inf == nil {
		return
	}
	prefixes, rejected := ServiceCIDRPrefixes(listAll[*networkingv1.ServiceCIDR](inf))
	st.ServiceCIDRs = prefixes
	st.Rejected = append(st.Rejected, rejected...)
	now := map[string]string{}
	for _, r := range rejected {
		now[r.Object] = r.Reason
		if w.logged[r.Object] != r.Reason {
			w.logger.Warn("rejected", "kind", r.Kind, "object", r.Object, "reason", r.Reason)
		}
	}
	w.logged = now
}

// ServiceCIDRPrefixes returns the ranges of ServiceCIDR objects, masked, sorted and without
// duplicates (nil for none), and a Rejection for each object with a range it cannot parse. A bad
// range is refused alone: the object's other range and every other object still count. Objects being
// deleted count until they are gone (their IPs may still be in use).
func ServiceCIDRPrefixes(objs []*networkingv1.ServiceCIDR) ([]netip.Prefix, []Rejection) {
	var out []netip.Prefix
	var rejected []Rejection
	for _, o := range objs {
		if o == nil {
			continue
		}
		var bad []string
		for _, s := range o.Spec.CIDRs {
			p, err := netip.ParsePrefix(strings.TrimSpace(s))
			// The API server refuses zones and IPv4-mapped IPv6 ranges; so does vipgate, whatever
			// reaches it.
			if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				bad = append(bad, fmt.Sprintf("%q", s))
				continue
			}
			out = append(out, p.Masked())
		}
		if len(bad) > 0 {
			rejected = append(rejected, Rejection{Kind: "ServiceCIDR", Object: o.Name, Source: "kubernetes",
				Reason: "spec.cidrs: not a CIDR: " + strings.Join(bad, ", ")})
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out), rejected
}

// comparePrefix orders prefixes by address, then by length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// ServiceCIDRs returns the service CIDRs in effect: the configured ones (the base, and all there is
// with the file source) and those of the State (ServiceCIDR objects), masked, sorted, once each.
func ServiceCIDRs(configured []netip.Prefix, st *State) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(configured))
	for _, p := range configured {
		out = append(out, p.Masked())
	}
	if st != nil {
		out = append(out, st.ServiceCIDRs...)
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}
