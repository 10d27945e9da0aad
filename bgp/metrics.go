package bgp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/bgp/bfd"
)

// Metric descriptions. Values are read from GoBGP and the BFD server at scrape time, so they can
// never drift from what those report and no goroutine polls in the background.
var (
	descSessionUp = prometheus.NewDesc("vipgate_bgp_session_up",
		"1 when the BGP session with the peer is established, else 0.", []string{"peer"}, nil)
	descSessionState = prometheus.NewDesc("vipgate_bgp_session_state",
		"BGP FSM state of the peer: 1 for the current state, 0 for the others.", []string{"peer", "state"}, nil)
	descRoutes = prometheus.NewDesc("vipgate_bgp_routes_advertised",
		"Routes currently advertised to the peer.", []string{"peer"}, nil)
	descBFDUp = prometheus.NewDesc("vipgate_bgp_bfd_up",
		"1 when the peer's BFD session is up, else 0; absent when BFD is not configured.", []string{"peer"}, nil)
	descUpdates = prometheus.NewDesc("vipgate_bgp_updates_sent_total",
		"UPDATE messages sent to the peer (restarts from 0 when the peer is reconfigured).", []string{"peer"}, nil)
	descBFDTransitions = prometheus.NewDesc("vipgate_bgp_bfd_transitions_total",
		"Times the peer's BFD session entered each state (restarts from 0 when the BFD session is re-created).", []string{"peer", "state"}, nil)
	descBFDFailures = prometheus.NewDesc("vipgate_bgp_bfd_failures_total",
		"BFD failures reported to BGP for the peer: detection time expired, the router signalled down, or its replacement session did not come up. Each resets an established BGP session.", []string{"peer"}, nil)
	descBFDDropped = prometheus.NewDesc("vipgate_bgp_bfd_dropped_packets_total",
		"Received BFD datagrams dropped, by reason (ttl, unknown_peer, stale_remote_session, ...).", []string{"reason"}, nil)
)

var allStates = []SessionState{StateIdle, StateConnect, StateActive, StateOpenSent, StateOpenConfirm, StateEstablished}

// collector exports a Speaker's per-peer state as Prometheus metrics.
type collector struct{ s *Speaker }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessionUp, descSessionState, descRoutes, descBFDUp, descUpdates, descBFDTransitions, descBFDFailures, descBFDDropped} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.Status() {
		ch <- prometheus.MustNewConstMetric(descSessionUp, prometheus.GaugeValue, boolValue(st.State == StateEstablished), st.Name)
		for _, state := range allStates {
			ch <- prometheus.MustNewConstMetric(descSessionState, prometheus.GaugeValue, boolValue(st.State == state), st.Name, string(state))
		}
		ch <- prometheus.MustNewConstMetric(descRoutes, prometheus.GaugeValue, float64(st.Advertised), st.Name)
		if st.BFD != BFDDisabled {
			ch <- prometheus.MustNewConstMetric(descBFDUp, prometheus.GaugeValue, boolValue(st.BFD == BFDUp), st.Name)
		}
		ch <- prometheus.MustNewConstMetric(descUpdates, prometheus.CounterValue, float64(st.UpdatesSent), st.Name)
	}
	names := *c.s.bfdNames.Load()
	for _, b := range c.s.bfd.Status() {
		name, ok := names[b.Peer]
		if !ok {
			continue // being removed
		}
		for _, state := range []bfd.State{bfd.StateAdminDown, bfd.StateDown, bfd.StateInit, bfd.StateUp} {
			ch <- prometheus.MustNewConstMetric(descBFDTransitions, prometheus.CounterValue, float64(b.Transitions[state]), name, string(bfdStateOf(state)))
		}
		ch <- prometheus.MustNewConstMetric(descBFDFailures, prometheus.CounterValue, float64(b.Failures), name)
	}
	if len(names) > 0 {
		for reason, n := range c.s.bfd.Drops() {
			ch <- prometheus.MustNewConstMetric(descBFDDropped, prometheus.CounterValue, float64(n), reason.String())
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
