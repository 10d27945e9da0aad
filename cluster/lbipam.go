package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LoadBalancer IP allocation with MetalLB's semantics (see ALLOCATION.md): pools, requests by
// annotation or spec.loadBalancerIP, sharing, dual-stack, classes. This file is pure: the controller
// (lbcontroller.go) feeds it Services and writes the results to the API.

// MetalLB annotations, current and older spellings.
var (
	annLoadBalancerIPs = []string{"metallb.io/loadBalancerIPs", "metallb.universe.tf/loadBalancerIPs"}
	annAddressPool     = []string{"metallb.io/address-pool", "metallb.universe.tf/address-pool"}
	annAllowShared     = []string{"metallb.io/allow-shared-ip", "metallb.universe.tf/allow-shared-ip"}
)

func annotation(svc *Service, names []string) string {
	for _, n := range names {
		if v, ok := svc.Annotations[n]; ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// lbRange is one addresses entry of a pool (mlbpool.go parses it; metrics_pools.go sizes it).
type lbRange = AddressRange

// LBPool is a validated IPAddressPool.
type LBPool struct {
	Name, Namespace    string
	ranges             []lbRange
	AutoAssign         bool
	AvoidBuggyIPs      bool
	Priority           int
	Namespaces         []string
	NamespaceSelectors []metav1.LabelSelector
	ServiceSelectors   []metav1.LabelSelector
	hasAllocation      bool
}

func (p *LBPool) contains(a netip.Addr) bool {
	for _, r := range p.ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

func (p *LBPool) families() map[Family]bool {
	out := map[Family]bool{}
	for _, r := range p.ranges {
		out[FamilyOf(r.first)] = true
	}
	return out
}

// ParseLBPools validates IPAddressPools. A bad pool (unparsable addresses, a range that starts after
// it ends, addresses that overlap an earlier pool) is rejected alone; the others are returned. The
// pools are read by parsePools (mlbpool.go), as the speaker's cluster.PoolIndex reads them.
func ParseLBPools(objs []*metallbv1beta1.IPAddressPool) ([]*LBPool, []Rejection) {
	var pools []*LBPool
	var rejected []Rejection
	for _, pp := range parsePools(objs) {
		o := pp.obj
		if len(pp.errs) > 0 {
			rejected = append(rejected, Rejection{Kind: "IPAddressPool", Object: o.Namespace + "/" + o.Name, Source: "kubernetes", Reason: strings.Join(pp.errs, "; ")})
			continue
		}
		p := &LBPool{Name: o.Name, Namespace: o.Namespace, ranges: pp.ranges, AutoAssign: o.Spec.AutoAssign == nil || *o.Spec.AutoAssign, AvoidBuggyIPs: o.Spec.AvoidBuggyIPs}
		if a := o.Spec.AllocateTo; a != nil {
			p.hasAllocation = true
			p.Priority, p.Namespaces, p.NamespaceSelectors, p.ServiceSelectors = a.Priority, a.Namespaces, a.NamespaceSelectors, a.ServiceSelectors
		}
		pools = append(pools, p)
	}
	return pools, rejected
}

// LBRequest is what a Service asks of the allocator.
type LBRequest struct {
	Service *Service
	// NamespaceLabels are the labels of the Service's namespace (for namespaceSelectors).
	NamespaceLabels map[string]string
	// Current holds the IPs the Service has in its status (kept when still valid).
	Current []netip.Addr
}

// ErrPending marks allocation failures that leave the Service pending (with the reason): Assign
// returns them as a *PendingError.
var ErrPending = errors.New("pending")

// PendingError is an allocation failure that leaves a Service pending: Reason says why, in words
// for the Service's events. It is ErrPending (errors.Is) and reads as "pending: <reason>".
type PendingError struct {
	Reason string
}

func (e *PendingError) Error() string { return ErrPending.Error() + ": " + e.Reason }

// Is makes a PendingError match ErrPending.
func (e *PendingError) Is(target error) bool { return target == ErrPending }

// lbUse records who uses an IP.
type lbUse struct {
	services map[ServiceKey]*Service
}

// Allocator hands out LoadBalancer IPs. It is not safe for concurrent use; the controller owns it.
type Allocator struct {
	pools []*LBPool
	used  map[netip.Addr]*lbUse
	byKey map[ServiceKey][]netip.Addr
}

// NewAllocator returns an allocator over pools.
func NewAllocator(pools []*LBPool) *Allocator {
	return &Allocator{pools: pools, used: map[netip.Addr]*lbUse{}, byKey: map[ServiceKey][]netip.Addr{}}
}

// SetPools replaces the pools; existing assignments stay recorded (the controller re-checks them).
func (a *Allocator) SetPools(pools []*LBPool) { a.pools = pools }

// Assigned returns the IPs the allocator holds for key.
func (a *Allocator) Assigned(key ServiceKey) []netip.Addr { return a.byKey[key] }

// PoolOf names the pool an IP belongs to ("" if none).
func (a *Allocator) PoolOf(ip netip.Addr) string {
	for _, p := range a.pools {
		if p.contains(ip) {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// Release forgets key's IPs.
func (a *Allocator) Release(key ServiceKey) {
	for _, ip := range a.byKey[key] {
		if u := a.used[ip]; u != nil {
			delete(u.services, key)
			if len(u.services) == 0 {
				delete(a.used, ip)
			}
		}
	}
	delete(a.byKey, key)
}

func (a *Allocator) take(svc *Service, ips []netip.Addr) {
	a.Release(svc.Key)
	for _, ip := range ips {
		u := a.used[ip]
		if u == nil {
			u = &lbUse{services: map[ServiceKey]*Service{}}
			a.used[ip] = u
		}
		u.services[svc.Key] = svc
	}
	a.byKey[svc.Key] = slices.Clone(ips)
}

// canUse says whether svc may have ip given who else holds it: sharing needs the same
// allow-shared-ip key on both, no port clash (same protocol and port), and the same
// externalTrafficPolicy (one node set must suit both).
func (a *Allocator) canUse(svc *Service, ip netip.Addr) error {
	u := a.used[ip]
	if u == nil {
		return nil
	}
	key := annotation(svc, annAllowShared)
	for k, other := range u.services {
		if k == svc.Key {
			continue
		}
		okey := annotation(other, annAllowShared)
		if key == "" || okey != key {
			return fmt.Errorf("%s is used by Service %s, which does not share it with this one (metallb.io/allow-shared-ip keys %q and %q)", ip, k, okey, key)
		}
		if svc.ExternalPolicyLocal != other.ExternalPolicyLocal {
			return fmt.Errorf("%s is shared with Service %s, whose externalTrafficPolicy differs", ip, k)
		}
		for _, p := range svc.Ports {
			for _, q := range other.Ports {
				if p.Protocol == q.Protocol && p.Port == q.Port {
					return fmt.Errorf("%s is shared with Service %s, which already uses %s port %d", ip, k, p.Protocol, p.Port)
				}
			}
		}
	}
	return nil
}

// allowed says whether pool may serve svc (serviceAllocation: namespaces, selectors).
func (p *LBPool) allowed(svc *Service, nsLabels map[string]string) bool {
	if !p.hasAllocation {
		return true
	}
	if len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, svc.Key.Namespace) {
		return false
	}
	if !MatchesAny(p.NamespaceSelectors, nsLabels) || !MatchesAny(p.ServiceSelectors, svc.Labels) {
		return false
	}
	return true
}

// families returns the families the Service needs (all required) and may have (wanted).
func wantFamilies(svc *Service) (required, wanted []Family) {
	fams := svc.IPFamilies
	if len(fams) == 0 {
		fams = []Family{IPv4}
	}
	switch svc.IPFamilyPolicy {
	case "RequireDualStack":
		return fams, fams
	case "PreferDualStack":
		return fams[:1], fams
	}
	return fams[:1], fams[:1]
}

// Assign decides the IPs of a LoadBalancer Service and records them. A failure (a *PendingError,
// which is ErrPending, with the reason) changes nothing.
func (a *Allocator) Assign(req LBRequest) ([]netip.Addr, string, error) {
	svc := req.Service
	required, wanted := wantFamilies(svc)
	pending := func(format string, args ...any) ([]netip.Addr, string, error) {
		return nil, "", &PendingError{Reason: fmt.Sprintf(format, args...)}
	}
	poolName := annotation(svc, annAddressPool)
	var requested []netip.Addr
	if v := annotation(svc, annLoadBalancerIPs); v != "" {
		for _, s := range strings.Split(v, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return pending("annotation metallb.io/loadBalancerIPs: %q is not an IP address", s)
			}
			requested = append(requested, ip.Unmap())
		}
	} else if svc.RequestedLoadBalancerIP.IsValid() {
		requested = []netip.Addr{svc.RequestedLoadBalancerIP}
	}

	candidates := a.candidatePools(svc, req.NamespaceLabels, poolName)
	if poolName != "" && len(candidates) == 0 {
		return pending("address pool %q (annotation metallb.io/address-pool) does not exist or may not serve this Service", poolName)
	}

	if len(requested) > 0 {
		got := map[Family]bool{}
		var pool string
		for _, ip := range requested {
			var p *LBPool
			for _, c := range a.allowedPools(svc, req.NamespaceLabels, poolName) {
				if c.contains(ip) {
					p = c
					break
				}
			}
			if p == nil {
				return pending("requested IP %s is in no address pool that may serve this Service", ip)
			}
			if got[FamilyOf(ip)] {
				return pending("more than one requested IP of family IPv%d", FamilyOf(ip))
			}
			got[FamilyOf(ip)] = true
			if err := a.canUse(svc, ip); err != nil {
				return pending("%v", err)
			}
			pool = p.Namespace + "/" + p.Name
		}
		for _, f := range required {
			if !got[f] {
				return pending("requested IPs include no IPv%d address, which ipFamilyPolicy requires", f)
			}
		}
		a.take(svc, requested)
		return requested, pool, nil
	}

	// Keep what the Service already has if it is still valid (restarts and leader changes must not
	// move IPs).
	if len(req.Current) > 0 {
		ok := true
		var pool string
		for _, ip := range req.Current {
			p := a.poolFor(candidates, ip)
			if p == nil || a.canUse(svc, ip) != nil {
				ok = false
				break
			}
			pool = p.Namespace + "/" + p.Name
		}
		if ok {
			a.take(svc, req.Current)
			return req.Current, pool, nil
		}
	}

	if len(candidates) == 0 {
		return pending("no address pool may serve this Service (autoAssign, serviceAllocation)")
	}
	var reasons []string
	for _, p := range candidates {
		fams := p.families()
		var ips []netip.Addr
		complete := true
		for _, f := range wanted {
			if !fams[f] {
				if slices.Contains(required, f) {
					complete = false
					reasons = append(reasons, fmt.Sprintf("pool %s/%s has no IPv%d addresses", p.Namespace, p.Name, f))
					break
				}
				continue
			}
			ip, ok := a.free(p, f, svc)
			if !ok {
				if slices.Contains(required, f) {
					complete = false
					reasons = append(reasons, fmt.Sprintf("pool %s/%s has no free IPv%d address", p.Namespace, p.Name, f))
					break
				}
				continue
			}
			ips = append(ips, ip)
		}
		if complete && len(ips) > 0 {
			a.take(svc, ips)
			return ips, p.Namespace + "/" + p.Name, nil
		}
	}
	return pending("%s", strings.Join(reasons, "; "))
}

func (a *Allocator) poolFor(pools []*LBPool, ip netip.Addr) *LBPool {
	for _, p := range pools {
		if p.contains(ip) {
			return p
		}
	}
	return nil
}

func (a *Allocator) allowedPools(svc *Service, nsLabels map[string]string, poolName string) []*LBPool {
	var out []*LBPool
	for _, p := range a.pools {
		if (poolName == "" || p.Name == poolName) && p.allowed(svc, nsLabels) {
			out = append(out, p)
		}
	}
	return out
}

// candidatePools are the pools automatic allocation may use, best first: the named pool, else the
// auto-assign pools the Service may use, by priority (lower first; pools without serviceAllocation
// last) and name.
func (a *Allocator) candidatePools(svc *Service, nsLabels map[string]string, poolName string) []*LBPool {
	var out []*LBPool
	for _, p := range a.allowedPools(svc, nsLabels, poolName) {
		if poolName != "" || p.AutoAssign {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		pi, pj := out[i], out[j]
		if pi.hasAllocation != pj.hasAllocation {
			return pi.hasAllocation
		}
		if pi.Priority != pj.Priority {
			if pi.Priority == 0 || pj.Priority == 0 {
				return pj.Priority == 0
			}
			return pi.Priority < pj.Priority
		}
		return pi.Namespace+"/"+pi.Name < pj.Namespace+"/"+pj.Name
	})
	return out
}

// free finds the first usable address of family f in pool p: unused, or shareable with svc.
func (a *Allocator) free(p *LBPool, f Family, svc *Service) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if FamilyOf(r.first) != f {
			continue
		}
		for ip := r.first; ip.IsValid() && ip.Compare(r.last) <= 0; ip = ip.Next() {
			if p.AvoidBuggyIPs && avoidedIP(ip) {
				continue
			}
			if u := a.used[ip]; u == nil || (annotation(svc, annAllowShared) != "" && a.canUse(svc, ip) == nil) {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}
