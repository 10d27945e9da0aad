package cluster

import (
	"fmt"
	"math/big"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolMetrics are the LoadBalancer IP controller's allocator metrics, as MetalLB's controller exports
// them (metallb_allocator_addresses_in_use_total, metallb_allocator_addresses_total), per pool and
// address family:
//
//   - vipgate_allocator_addresses{pool,family}: the addresses the pool can hand out (AvoidBuggyIPs'
//     .0 and .255 excluded);
//   - vipgate_allocator_addresses_in_use{pool,family}: the addresses of the pool that Services hold
//     (an IP shared by several Services counts once);
//   - vipgate_allocator_services_pending: LoadBalancer Services this controller serves that have no
//     IP, because no pool could give one (the reason is in the Service's AllocationFailed Event).
//
// Pools are a handful of objects, so the labels stay bounded. Values are the controller's state at its
// last reconcile; a pool that is deleted stops being exported. Registered on the caller's registry.
type PoolMetrics struct {
	mu      sync.Mutex
	pools   []PoolUsage
	pending int
	// leading is false on replicas that do not lead: they export nothing, so a sum over the
	// replicas counts each pool once.
	leading bool
}

// PoolUsage is the size and use of one family of one pool.
type PoolUsage struct {
	// Pool is "namespace/name".
	Pool   string
	Family Family
	Size   float64
	InUse  int
}

var (
	descPoolAddresses = prometheus.NewDesc("vipgate_allocator_addresses",
		"Addresses an IPAddressPool can hand out, by address family (MetalLB: metallb_allocator_addresses_total).", []string{"pool", "family"}, nil)
	descPoolInUse = prometheus.NewDesc("vipgate_allocator_addresses_in_use",
		"Addresses of an IPAddressPool that Services hold, by address family (MetalLB: metallb_allocator_addresses_in_use_total).", []string{"pool", "family"}, nil)
	descPending = prometheus.NewDesc("vipgate_allocator_services_pending",
		"LoadBalancer Services served by this controller that no pool could give an IP (see their AllocationFailed Events).", nil, nil)
)

// NewPoolMetrics creates the allocator metrics and registers them on reg.
func NewPoolMetrics(reg prometheus.Registerer) (*PoolMetrics, error) {
	m := &PoolMetrics{}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("registering the allocator metrics: %w", err)
	}
	return m, nil
}

// Observe records the allocator's state after a reconcile of the leader: pending is the number of
// Services left without an IP. A nil alloc (no longer leading) clears the metrics.
func (m *PoolMetrics) Observe(alloc *Allocator, pending int) {
	if m == nil {
		return
	}
	var usage []PoolUsage
	if alloc != nil {
		usage = alloc.PoolUsages()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pools, m.pending, m.leading = usage, pending, alloc != nil
}

// Describe implements prometheus.Collector.
func (m *PoolMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPoolAddresses
	ch <- descPoolInUse
	ch <- descPending
}

// Collect implements prometheus.Collector.
func (m *PoolMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.leading {
		return
	}
	for _, u := range m.pools {
		fam := fmt.Sprintf("ipv%d", u.Family)
		ch <- prometheus.MustNewConstMetric(descPoolAddresses, prometheus.GaugeValue, u.Size, u.Pool, fam)
		ch <- prometheus.MustNewConstMetric(descPoolInUse, prometheus.GaugeValue, float64(u.InUse), u.Pool, fam)
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(m.pending))
}

// PoolUsages returns the size and use of every pool, per address family, in pool order. An address in
// use is counted in the first pool that contains it (as PoolOf names it).
func (a *Allocator) PoolUsages() []PoolUsage {
	var out []PoolUsage
	index := map[string]int{}
	for _, p := range a.pools {
		name := p.Namespace + "/" + p.Name
		for _, r := range p.ranges {
			f := FamilyOf(r.first)
			key := fmt.Sprintf("%s %d", name, f)
			i, ok := index[key]
			if !ok {
				i = len(out)
				index[key] = i
				out = append(out, PoolUsage{Pool: name, Family: f})
			}
			out[i].Size += rangeSize(r, p.AvoidBuggyIPs)
		}
	}
	for ip := range a.used {
		for _, p := range a.pools {
			if p.contains(ip) {
				out[index[fmt.Sprintf("%s/%s %d", p.Namespace, p.Name, FamilyOf(ip))]].InUse++
				break
			}
		}
	}
	return out
}

// rangeSize counts the addresses of r, without the IPv4 addresses ending in .0 or .255 when
// avoidBuggy is set. A float64: an IPv6 pool can hold 2^64 addresses or more.
func rangeSize(r lbRange, avoidBuggy bool) float64 {
	first, last := addrInt(r.first), addrInt(r.last)
	n := new(big.Int).Sub(last, first)
	n.Add(n, big.NewInt(1))
	if avoidBuggy && r.first.Is4() {
		// Addresses x in [first, last] with x%256 == 0, and with x%256 == 255.
		n.Sub(n, big.NewInt(int64(countMod(first.Int64(), last.Int64(), 0)+countMod(first.Int64(), last.Int64(), 255))))
	}
	f, _ := new(big.Float).SetInt(n).Float64()
	return f
}

// countMod counts x in [first, last] with x % 256 == rem.
func countMod(first, last, rem int64) int64 {
	upTo := func(x int64) int64 { // x' in [0, x] with x' % 256 == rem
		if x < rem {
			return 0
		}
		return (x-rem)/256 + 1
	}
	return upTo(last) - upTo(first-1)
}

func addrInt(a netip.Addr) *big.Int {
	b := a.AsSlice()
	return new(big.Int).SetBytes(b)
}
