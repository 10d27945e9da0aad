package proxy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// ChangeMetrics are the per-sync change counters kube-proxy users watch
// (sync_proxy_rules_service_changes_total, sync_proxy_rules_endpoint_changes_total) and the Services
// a node refuses, one series each, so a dashboard can list them:
//
//   - vipgate_sync_service_changes_total: Services added, changed or removed between two successfully
//     programmed snapshots;
//   - vipgate_sync_endpoint_changes_total: Services whose EndpointSlices changed between them;
//   - vipgate_rejected_services{namespace,service,reason}: 1 for each Service of the last programmed
//     snapshot that is refused in whole or in part. reason is "invalid" (the source refused the
//     object) or "conflict" (an entry another Service holds, or an address the node's policy refuses;
//     `vipgate status` and Events give the text). Only refused Services get a series, and at most
//     MaxRejectedServiceSeries of them, so a cluster of 10,000 Services costs nothing here; the total
//     stays in vipgate_rejected_objects.
//
// Like Metrics, they go on a registry the caller owns.
type ChangeMetrics struct {
	serviceChanges  prometheus.Counter
	endpointChanges prometheus.Counter

	// prevSvc and prevSlices are the last programmed snapshot, compared by pointer as the proxier
	// does (the sources replace an object's pointer when it changes).
	prevSvc    map[cluster.ServiceKey]*cluster.Service
	prevSlices map[cluster.ServiceKey][]*cluster.EndpointSlice

	mu       sync.Mutex
	rejected []rejectedService
}

// MaxRejectedServiceSeries bounds vipgate_rejected_services: past it, the Services after the first
// ones in namespace/name order are counted only in vipgate_rejected_objects.
const MaxRejectedServiceSeries = 100

// Values of vipgate_rejected_services' reason label.
const (
	RejectedInvalid  = "invalid"
	RejectedConflict = "conflict"
)

type rejectedService struct {
	namespace, name, reason string
}

var descRejectedServices = prometheus.NewDesc("vipgate_rejected_services",
	"1 for each Service of the last programmed snapshot that is refused in whole or in part (reason: invalid, conflict); at most 100 series.",
	[]string{"namespace", "service", "reason"}, nil)

// NewChangeMetrics creates the change counters and the rejected-Services gauge on reg.
func NewChangeMetrics(reg prometheus.Registerer) (*ChangeMetrics, error) {
	m := &ChangeMetrics{
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vipgate", Name: "sync_service_changes_total",
			Help: "Services added, changed or removed between two successfully programmed snapshots (kube-proxy: sync_proxy_rules_service_changes_total).",
		}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vipgate", Name: "sync_endpoint_changes_total",
			Help: "Services whose EndpointSlices changed between two successfully programmed snapshots (kube-proxy: sync_proxy_rules_endpoint_changes_total).",
		}),
	}
	for _, c := range []prometheus.Collector{m.serviceChanges, m.endpointChanges, (*rejectedCollector)(m)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering dataplane change metrics: %w", err)
		}
	}
	return m, nil
}

// ObserveSync records one sync: rep and err are what Proxier.Sync returned for st. A failed sync
// changes nothing here (the next one programs its changes). Called from the sync loop only.
func (m *ChangeMetrics) ObserveSync(st *cluster.State, rep *dataplane.SyncReport, err error) {
	if err != nil || st == nil || rep == nil {
		return
	}
	svcs, eps := countChanges(m.prevSvc, m.prevSlices, st)
	m.serviceChanges.Add(float64(svcs))
	m.endpointChanges.Add(float64(eps))
	m.prevSvc = make(map[cluster.ServiceKey]*cluster.Service, len(st.Services))
	m.prevSlices = make(map[cluster.ServiceKey][]*cluster.EndpointSlice, len(st.EndpointSlices))
	for k, v := range st.Services {
		m.prevSvc[k] = v
	}
	for k, v := range st.EndpointSlices {
		m.prevSlices[k] = v
	}

	rej := rejectedServices(st.Rejected, rep.Conflicts)
	m.mu.Lock()
	m.rejected = rej
	m.mu.Unlock()
}

// countChanges counts the Services whose object changed (added, changed, removed) and those whose
// EndpointSlices changed between prev and st.
func countChanges(prevSvc map[cluster.ServiceKey]*cluster.Service, prevSlices map[cluster.ServiceKey][]*cluster.EndpointSlice, st *cluster.State) (services, endpoints int) {
	for k, svc := range st.Services {
		if prevSvc[k] != svc {
			services++
		}
	}
	for k := range prevSvc {
		if _, ok := st.Services[k]; !ok {
			services++
		}
	}
	for k, sl := range st.EndpointSlices {
		if !slices.Equal(prevSlices[k], sl) {
			endpoints++
		}
	}
	for k, sl := range prevSlices {
		if _, ok := st.EndpointSlices[k]; !ok && len(sl) > 0 {
			endpoints++
		}
	}
	return services, endpoints
}

// rejectedServices lists the refused Services, one entry per Service and reason, sorted and capped
// at MaxRejectedServiceSeries. Objects of other kinds (EndpointSlices, pools, files) are left to
// vipgate_rejected_objects: their names are not Services a user looks for.
func rejectedServices(invalid, conflicts []cluster.Rejection) []rejectedService {
	seen := map[rejectedService]bool{}
	var out []rejectedService
	add := func(rs []cluster.Rejection, reason string) {
		for _, r := range rs {
			if r.Kind != "Service" {
				continue
			}
			ns, name, ok := strings.Cut(r.Object, "/")
			if !ok {
				continue
			}
			e := rejectedService{namespace: ns, name: name, reason: reason}
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	add(invalid, RejectedInvalid)
	add(conflicts, RejectedConflict)
	slices.SortFunc(out, func(a, b rejectedService) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.name, b.name), strings.Compare(a.reason, b.reason))
	})
	if len(out) > MaxRejectedServiceSeries {
		out = out[:MaxRejectedServiceSeries]
	}
	return out
}

// rejectedCollector exports the last snapshot's refused Services; a Service that is fixed or
// deleted stops being exported at the next sync.
type rejectedCollector ChangeMetrics

func (c *rejectedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descRejectedServices }

func (c *rejectedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	rej := c.rejected
	c.mu.Unlock()
	for _, r := range rej {
		ch <- prometheus.MustNewConstMetric(descRejectedServices, prometheus.GaugeValue, 1, r.namespace, r.name, r.reason)
	}
}
