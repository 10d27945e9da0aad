package membership

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers the membership gauges on reg (never the global registry):
// vipgate_speaker_members (the member count), vipgate_speaker_members_heard (members this node hears,
// itself included), vipgate_speaker_members_candidates (members that may announce, as this node sees
// it) and vipgate_speaker_ready (1 while this node may announce); and the heartbeat counters
// vipgate_speaker_heartbeats_received_total, vipgate_speaker_heartbeats_rejected_total{reason}
// (forged, replayed, from strangers...: see dropReason) and vipgate_speaker_heartbeat_send_errors_total.
func (m *Members) RegisterMetrics(reg prometheus.Registerer) error {
	for _, g := range []struct {
		name, help string
		f          func(View) float64
	}{
		{"vipgate_speaker_members", "Speakers in this one's L2 segments, this one included.", func(v View) float64 { return float64(v.Total) }},
		{"vipgate_speaker_members_heard", "Members whose heartbeats this speaker receives, itself included.", func(v View) float64 { return float64(v.Heard) }},
		{"vipgate_speaker_members_candidates", "Members that may announce LoadBalancer IPs, as this speaker sees it.", func(v View) float64 { return float64(len(v.Candidates)) }},
		{"vipgate_speaker_ready", "1 while this speaker hears a majority of the members and may announce.", func(v View) float64 {
			if v.Ready {
				return 1
			}
			return 0
		}},
	} {
		f := g.f
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help},
			func() float64 { return f(m.View()) })); err != nil {
			return fmt.Errorf("registering %s: %w", g.name, err)
		}
	}
	for _, c := range []prometheus.Collector{m.rejVec, m.received, m.sendErrs} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("registering the heartbeat counters: %w", err)
		}
	}
	return nil
}
