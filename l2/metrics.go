package l2

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Address family label values.
const (
	familyIPv4 = "ipv4"
	familyIPv6 = "ipv6"
)

// metrics are the Prometheus collectors of one Announcer. They are labelled
// by interface and family only: a label per VIP would grow without bound as
// Services come and go.
type metrics struct {
	requests   *prometheus.CounterVec // interface, family
	dropped    *prometheus.CounterVec // interface, family, reason
	replies    *prometheus.CounterVec // interface, family
	gratuitous *prometheus.CounterVec // interface, family
	sendErrors *prometheus.CounterVec // interface, family
	owned      *prometheus.GaugeVec   // interface, family
	periodic   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := []string{"interface", "family"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "requests_received_total",
			Help: "ARP requests and IPv6 neighbor solicitations received, for any target address.",
		}, labels),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "requests_dropped_total",
			Help: "Received ARP/NDP packets that were not answered, by reason.",
		}, append(labels, "reason")),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "replies_sent_total",
			Help: "ARP replies and solicited neighbor advertisements sent for owned VIPs.",
		}, labels),
		gratuitous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "gratuitous_sent_total",
			Help: "Gratuitous ARP packets and unsolicited neighbor advertisements sent.",
		}, labels),
		sendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "send_errors_total",
			Help: "Replies and announcements that could not be written to the socket.",
		}, labels),
		periodic: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "periodic_announcements_total",
			Help: "(VIP, interface) announcements sent by the periodic gratuitous ARP / unsolicited NA (speaker.gratuitousARPInterval); each is also counted in gratuitous_sent_total.",
		}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "vipgate", Subsystem: "l2", Name: "owned_ips",
			Help: "VIPs this host currently answers for.",
		}, labels),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.dropped, m.replies, m.gratuitous, m.sendErrors, m.owned, m.periodic} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering l2 metrics: %w", err)
		}
	}
	return m, nil
}
