package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// serviceCIDRGroupVersion and serviceCIDRResource name the ServiceCIDR API (GA in Kubernetes 1.33).
const (
	serviceCIDRGroupVersion = "networking.k8s.io/v1"
	serviceCIDRResource     = "servicecidrs"
)

// serviceCIDRWatch keeps the cluster's ServiceCIDR objects (networking.k8s.io/v1), the ranges the API
// server allocates ClusterIPs from. A cluster can add ranges at run time; without them, the ClusterIPs
// of a new range would be unknown addresses to the dataplane and traffic to its unallocated IPs would
// not be dropped (kube-proxy follows ServiceCIDRs the same way, OnServiceCIDRsChanged).
//
// A ServiceCIDR being deleted stays in the informer until its finalizer is removed, which the API
// server does only once no ClusterIP of the range is in use: it stays in State.ServiceCIDRs until
// then, because its IPs may still be allocated. Used by Run's goroutine only.
type serviceCIDRWatch struct {
	inf    cache.SharedIndexInformer // nil when the API server does not serve ServiceCIDRs
	logger hclog.Logger
	// logged remembers the rejections already logged (object -> reason), so each is logged once.
	logged map[string]string
}

// watchServiceCIDRs registers a ServiceCIDR informer on factory (which the caller starts) if the API
// server serves the resource; an older API server (before 1.31's beta, or with the API off) has none,
// and then only the configured service CIDRs apply.
func watchServiceCIDRs(ctx context.Context, factory informers.SharedInformerFactory, client kubernetes.Interface, h cache.ResourceEventHandler,
	logger hclog.Logger) (*serviceCIDRWatch, error) {
	d := client.Discovery()
	w := &serviceCIDRWatch{logger: logger, logged: map[string]string{}}
	list, err := d.ServerResourcesForGroupVersion(serviceCIDRGroupVersion)
	switch {
	case apierrors.IsNotFound(err):
		logger.Info("the API server does not serve ServiceCIDRs; using the configured service CIDRs only")
		return w, nil
	case err != nil:
		// Discovery answered for MetalLB's groups a moment ago; an informer of a resource that is
		// not served would never sync and hold up the first snapshot, so do without rather than wait.
		logger.Warn("cannot discover ServiceCIDRs; using the configured service CIDRs only until restart",
			"err", fmt.Errorf("discovering %s: %w", serviceCIDRGroupVersion, err))
		return w, nil
	}
	if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == serviceCIDRResource }) {
		logger.Info("the API server does not serve ServiceCIDRs; using the configured service CIDRs only")
		return w, nil
	}
	// An informer the RBAC does not allow would never sync and hold up the first snapshot for good
	// (an upgrade that kept an older ClusterRole): probe once, and do without if forbidden.
	if _, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsForbidden(err) {
		logger.Error("not allowed to list ServiceCIDRs (the ClusterRole lacks networking.k8s.io servicecidrs list, watch); using the configured service CIDRs only until restart", "err", err)
		return w, nil
	}
	w.inf = factory.Networking().V1().ServiceCIDRs().Informer()
	if _, err := w.inf.AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("adding ServiceCIDR event handler: %w", err)
	}
	return w, nil
}

// synced is what the first snapshot waits for: as kube-proxy, the ranges must be known before the
// first sync, or it would program a cluster-IPs check without them.
func (w *serviceCIDRWatch) synced() []cache.InformerSynced {
	if w == nil || w.inf == nil {
		return nil
	}
	return []cache.InformerSynced{w.inf.HasSynced}
}

// apply sets st.ServiceCIDRs from the informer's cache and appends the objects it refuses to
// st.Rejected (each logged once).
func (w *serviceCIDRWatch) apply(st *State) {
	if w == nil || w.inf == nil {
		return
	}
	prefixes, rejected := ServiceCIDRPrefixes(listAll[*networkingv1.ServiceCIDR](w.inf))
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
