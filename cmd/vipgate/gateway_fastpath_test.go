package main

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipgate/vipgate/cluster"
)

// TestFastPathStatusWarnings: /status lists a family without its route forwarding fast path among
// its warnings while the last sync says so, and no longer once a sync has it again; the family's
// vipgate_gateway_fast_path gauge says the same (0 before the first sync). A warning about a fast
// path that is on is listed too, and leaves the gauge at 1.
func TestFastPathStatusWarnings(t *testing.T) {
	a, err := newAdminServer(hclog.NewNullLogger(), netip.MustParseAddrPort("127.0.0.1:0"), prometheus.NewRegistry(), NodeStatus{Node: "gw1"})
	if err != nil {
		t.Fatal(err)
	}
	var s fastPathStatus
	a.addWarnings(s.warnings)
	g4, g6 := s.gauge(cluster.IPv4), s.gauge(cluster.IPv6)
	value := func(g prometheus.GaugeFunc) float64 {
		var m dto.Metric
		if err := g.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	gauges := func() [2]float64 { return [2]float64{value(g4), value(g6)} }
	if w := a.snapshot().Warnings; len(w) != 0 || gauges() != [2]float64{0, 0} {
		t.Errorf("before the first sync: warnings %q, gauges %v", w, gauges())
	}
	s.set([]string{"IPv4: programming netdev table vipgate-fwd4: no such device"}, nil)
	want := "route forwarding fast path off: IPv4: programming netdev table vipgate-fwd4: no such device"
	if w := a.snapshot().Warnings; !slices.Equal(w, []string{want}) || gauges() != [2]float64{0, 1} {
		t.Errorf("fast path off: warnings %q, want %q; gauges %v, want [0 1]", w, want, gauges())
	}
	s.set(nil, nil)
	if w := a.snapshot().Warnings; len(w) != 0 || gauges() != [2]float64{1, 1} {
		t.Errorf("fast path on again: warnings %q, gauges %v", w, gauges())
	}
	// A fast path that is on with a warning (a listed ingress device that does not exist): on
	// /status, and the gauge still 1.
	s.set(nil, []string{"IPv4: ingress devices that do not exist (no chain until they do): x0"})
	want = "route forwarding fast path: IPv4: ingress devices that do not exist (no chain until they do): x0"
	if w := a.snapshot().Warnings; !slices.Equal(w, []string{want}) || gauges() != [2]float64{1, 1} {
		t.Errorf("fast path on with a warning: warnings %q, want %q; gauges %v, want [1 1]", w, want, gauges())
	}
}
