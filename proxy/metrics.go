package proxy

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Metrics are the dataplane's Prometheus metrics. They are registered on a registry the caller owns
// (never the global one), so tests and several proxiers in one process do not collide.
//
// The programmed-object gauges are kept from the transactions themselves (a full transaction resets a
// family, an incremental one adds and removes), so they cost nothing per sync beyond the change and
// say what the kernel holds, not what a model would hold.
type Metrics struct {
	syncDuration *prometheus.HistogramVec
	syncErrors   prometheus.Counter
	elements     *prometheus.GaugeVec
	chains       *prometheus.GaugeVec
	services     prometheus.Gauge
	endpoints    prometheus.Gauge
	lastSync     prometheus.Gauge
	rejected     prometheus.Gauge

	mu     sync.Mutex
	counts map[cluster.Family]*ProgrammedCounts
}

// ProgrammedCounts is what one family's table holds, as vipgate programmed it.
type ProgrammedCounts struct {
	Family cluster.Family `json:"family"`
	Chains int            `json:"chains"`
	Sets   int            `json:"sets"`
	// Elements counts model elements per set (a CIDR is one element, though the kernel stores an
	// interval as two).
	Elements map[string]int `json:"elements"`
}

// Sync kinds, the values of the "kind" label.
const (
	SyncKindFull    = "full"
	SyncKindPartial = "partial"
)

// NewMetrics creates the dataplane metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "vipgate", Name: "sync_duration_seconds",
			Help: "Time to bring the kernel to the desired state: build, diff and one netlink batch per family (kind: full or partial).",
			// 1 ms to 16 s: an incremental sync is a few ms, a full sync of 10,000 Services a few s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"kind"}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vipgate", Name: "sync_errors_total",
			Help: "Syncs the kernel refused; the previous ruleset stays and the next sync replaces the table.",
		}),
		elements: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "nftables_elements",
			Help: "Set and map elements programmed, by table family and set.",
		}, []string{"family", "set"}),
		chains: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "nftables_chains",
			Help: "Chains programmed, by table family.",
		}, []string{"family"}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "services",
			Help: "Services in the last successfully programmed snapshot.",
		}),
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "endpoints",
			Help: "Endpoint addresses (over all EndpointSlices) in the last successfully programmed snapshot.",
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "last_sync_timestamp_seconds",
			Help: "Unix time of the last successful sync.",
		}),
		rejected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "vipgate", Name: "rejected_objects",
			Help: "Objects of the last snapshot that were refused (invalid, or an entry another Service owns).",
		}),
		counts: map[cluster.Family]*ProgrammedCounts{},
	}
	for _, c := range []prometheus.Collector{m.syncDuration, m.syncErrors, m.elements, m.chains, m.services, m.endpoints, m.lastSync, m.rejected} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering dataplane metrics: %w", err)
		}
	}
	return m, nil
}

// ObserveSync records one sync: rep and err are what Proxier.Sync returned for st.
func (m *Metrics) ObserveSync(st *cluster.State, rep *dataplane.SyncReport, err error) {
	if err != nil {
		// The transactions before the failing one did apply, but the next sync is a full one and
		// resets every family; until then the counts describe the last good state.
		m.syncErrors.Inc()
		return
	}
	kind := SyncKindPartial
	if rep.Full {
		kind = SyncKindFull
	}
	m.syncDuration.WithLabelValues(kind).Observe(rep.Duration.Seconds())
	m.lastSync.Set(float64(time.Now().UnixNano()) / 1e9)
	if st != nil {
		m.services.Set(float64(len(st.Services)))
		m.endpoints.Set(float64(CountEndpoints(st)))
		m.rejected.Set(float64(len(st.Rejected) + len(rep.Conflicts)))
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	for _, tx := range rep.Txs {
		c := m.counts[tx.Family]
		if c == nil || tx.Full {
			c = &ProgrammedCounts{Family: tx.Family, Elements: map[string]int{}}
			m.counts[tx.Family] = c
		}
		c.Chains += len(tx.AddChains) - len(tx.DelChains)
		c.Sets += len(tx.AddSets) - len(tx.DelSets)
		for e := range tx.AddedElements() {
			c.Elements[e.Set]++
		}
		for _, e := range tx.DelElements {
			c.Elements[e.Set]--
		}
		for _, s := range tx.DelSets {
			delete(c.Elements, s)
		}
		fam := fmt.Sprintf("ipv%d", tx.Family)
		m.chains.WithLabelValues(fam).Set(float64(c.Chains))
		if tx.Full {
			// Sets that are gone must not keep reporting their last value.
			m.elements.DeletePartialMatch(prometheus.Labels{"family": fam})
		}
		for s, n := range c.Elements {
			if n == 0 {
				delete(c.Elements, s)
				m.elements.DeleteLabelValues(fam, s)
				continue
			}
			m.elements.WithLabelValues(fam, s).Set(float64(n))
		}
	}
}

// Programmed returns what each family's table holds, as of the last successful sync.
func (m *Metrics) Programmed() []ProgrammedCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ProgrammedCounts, 0, len(m.counts))
	for _, c := range m.counts {
		cc := *c
		cc.Elements = make(map[string]int, len(c.Elements))
		for k, v := range c.Elements {
			cc.Elements[k] = v
		}
		out = append(out, cc)
	}
	slices.SortFunc(out, func(a, b ProgrammedCounts) int { return int(a.Family) - int(b.Family) })
	return out
}

// CountEndpoints counts endpoint addresses over all EndpointSlices of st.
func CountEndpoints(st *cluster.State) int {
	n := 0
	for _, sl := range st.EndpointSlices {
		for _, es := range sl {
			for _, e := range es.Endpoints {
				n += len(e.Addresses)
			}
		}
	}
	return n
}
