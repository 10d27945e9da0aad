package gateway

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/gateway/natpath"
)

// The gateway's own metrics, next to the node's (the admin endpoint's registry): the route
// forwarding fast path per family, the connection table copies it makes, and the NAT fast path.

// fastPathStatus is why the last sync had no route forwarding fast path, per family
// (SyncReport.NoFastPath), and what is wrong with one that is on (FastPathWarnings), for
// /status's warnings: the sync loop writes it, the admin endpoint reads it.
type fastPathStatus struct {
	why  atomic.Pointer[[]string]
	warn atomic.Pointer[[]string]
}

func (s *fastPathStatus) set(why, warn []string) {
	s.warn.Store(&warn)
	s.why.Store(&why)
}

// gauge is vipgate_gateway_fast_path of family f: 0 before the first sync and while the last sync
// reported the family without its fast path, else 1 (a family without nodes too: nothing to
// forward).
func (s *fastPathStatus) gauge(f cluster.Family) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "vipgate", Name: "gateway_fast_path",
		Help:        "0 while the family's route forwarding fast path (netdev fwd) is off and its table forwards alone (dup; /status says why), else 1.",
		ConstLabels: prometheus.Labels{"family": fmt.Sprintf("ipv%d", f)},
	}, func() float64 {
		p := s.why.Load()
		if p == nil || slices.ContainsFunc(*p, func(why string) bool { return strings.HasPrefix(why, fmt.Sprintf("IPv%d:", f)) }) {
			return 0
		}
		return 1
	})
}

func (s *fastPathStatus) warnings() []string {
	p := s.why.Load()
	if p == nil {
		return nil
	}
	out := make([]string, 0, len(*p))
	for _, why := range *p {
		out = append(out, "route forwarding fast path off: "+why)
	}
	if w := s.warn.Load(); w != nil {
		for _, what := range *w {
			out = append(out, "route forwarding fast path: "+what)
		}
	}
	return out
}

// flowCopyMetrics count the connection table copies of the fast path's transitions (the
// dataplane logs each one): entries copied, and copies by result, for an alert on those that did
// not end ("truncated": the sync's budget or the cap of refused transactions; "full": the
// destination map is full).
type flowCopyMetrics struct {
	copies *prometheus.CounterVec
	copied prometheus.Counter
}

func newFlowCopyMetrics() flowCopyMetrics {
	return flowCopyMetrics{
		copies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Name: "gateway_flow_copies_total",
			Help: "Copies of a route forwarding connection table (gateway-flows) into the other table when the fast path goes off or comes on, by result (done, truncated, full, failed).",
		}, []string{"result"}),
		copied: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vipgate", Name: "gateway_flows_copied_total",
			Help: "Connection table entries copied between the fast path's netdev table and the family's table.",
		}),
	}
}

func (m flowCopyMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.copies, m.copied}
}

// record counts a sync's copies.
func (m flowCopyMetrics) record(copies []FlowCopy) {
	for _, c := range copies {
		m.copied.Add(float64(c.Copied))
		m.copies.WithLabelValues(c.Result()).Inc()
	}
}

// collectors are the NAT fast path's metrics: on or off, and its packet counters.
func (s *natPathStatus) collectors() []prometheus.Collector {
	on := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "vipgate", Name: "gateway_nat_fast_path",
		Help: "1 while the NAT fast path (forwarding direct and nodePort: a tc BPF program) is loaded, else 0 (/status says why).",
	}, func() float64 {
		if s.path == nil {
			return 0
		}
		return 1
	})
	if s.path == nil {
		return []prometheus.Collector{on}
	}
	return []prometheus.Collector{on, natPathCounters{s.path}}
}

// natPathCounters exports the program's counters.
type natPathCounters struct{ p *natpath.Path }

var natPathPacketsDesc = prometheus.NewDesc("vipgate_gateway_nat_fast_path_packets_total",
	"Packets the NAT fast path took (new, forwarded, reply; icmp: ICMP errors about its flows, translated; frag: later fragments of IPv4 UDP datagrams, following their first) or left to the IP stack (no_backend, no_route: MTU or no usable next hop, snat_full: no free masquerade port, no_syn: a TCP packet of no flow it holds that opens none, full: the established flow table was full); clash: a new flow whose reply tuple a live flow holds, taken with another client port; neigh: forwarded through the neighbour layer; martian: dropped, from a source no client can have (loopback, multicast, the pod networks...); window: a TCP RST or FIN outside the window, forwarded without ending its flow.",
	[]string{"what"}, nil)

func (c natPathCounters) Describe(ch chan<- *prometheus.Desc) { ch <- natPathPacketsDesc }

func (c natPathCounters) Collect(ch chan<- prometheus.Metric) {
	n, err := c.p.Counters()
	if err != nil {
		return
	}
	for what, v := range map[string]uint64{"new": n.New, "forwarded": n.Forwarded, "reply": n.Replies,
		"no_backend": n.NoBackend, "no_route": n.NoRoute, "snat_full": n.SNATFull, "neigh": n.Neigh, "no_syn": n.NoSYN, "clash": n.Clash,
		"icmp": n.ICMP, "frag": n.Frag, "martian": n.Martian, "full": n.Full, "window": n.Window} {
		ch <- prometheus.MustNewConstMetric(natPathPacketsDesc, prometheus.CounterValue, float64(v), what)
	}
}
