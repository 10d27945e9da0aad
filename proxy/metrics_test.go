package proxy

import (
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// mtProgrammer accepts every transaction unless fail is set.
type mtProgrammer struct{ fail bool }

func (p *mtProgrammer) Apply(*dataplane.Tx) error {
	if p.fail {
		return errors.New("refused")
	}
	return nil
}

// mtCheckCounts wants the counts kept from transactions to equal the proxier's whole model.
func mtCheckCounts(t *testing.T, m *Metrics, p *Proxier) {
	t.Helper()
	got := m.Programmed()
	if len(got) != 2 {
		t.Fatalf("Programmed() has %d families, want 2", len(got))
	}
	for _, c := range got {
		f := p.Flatten(c.Family)
		if c.Chains != len(f.Chains) || c.Sets != len(f.Sets) {
			t.Errorf("IPv%d: counted %d chains, %d sets; the model has %d, %d", c.Family, c.Chains, c.Sets, len(f.Chains), len(f.Sets))
		}
		for s, els := range f.Elements {
			if c.Elements[s] != len(els) {
				t.Errorf("IPv%d set %s: counted %d elements, the model has %d", c.Family, s, c.Elements[s], len(els))
			}
		}
		for s, n := range c.Elements {
			if len(f.Elements[s]) != n {
				t.Errorf("IPv%d set %s: counted %d elements, the model has %d", c.Family, s, n, len(f.Elements[s]))
			}
		}
	}
}

func TestMetricsFollowSyncs(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	prog := &mtProgrammer{}
	p := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	st := dcState()
	sync := func(st *cluster.State) {
		t.Helper()
		rep, err := p.Sync(st)
		m.ObserveSync(st, rep, err)
	}
	sync(st)
	mtCheckCounts(t, m, p)
	if got := mtValue(t, m.services); got != float64(len(st.Services)) {
		t.Errorf("services gauge = %v, want %d", got, len(st.Services))
	}
	if got, want := mtValue(t, m.endpoints), float64(CountEndpoints(st)); got != want || want == 0 {
		t.Errorf("endpoints gauge = %v, want %v", got, want)
	}

	// Incremental: a Service goes, another loses endpoints.
	st2 := *st
	st2.Services = map[cluster.ServiceKey]*cluster.Service{}
	st2.EndpointSlices = map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	for k, v := range st.Services {
		st2.Services[k] = v
		st2.EndpointSlices[k] = st.EndpointSlices[k]
	}
	delete(st2.Services, cluster.ServiceKey{Namespace: "ns1", Name: "affinity"})
	delete(st2.Services, cluster.ServiceKey{Namespace: "bench", Name: "svc-00010"})
	st2.EndpointSlices[cluster.ServiceKey{Namespace: "bench", Name: "svc-00004"}] = nil
	sync(&st2)
	mtCheckCounts(t, m, p)

	// A refused sync counts an error and leaves the counts; the next good (full) one resets them.
	prog.fail = true
	sync(st)
	prog.fail = false
	if got := mtValue(t, m.syncErrors); got != 1 {
		t.Errorf("sync errors = %v, want 1", got)
	}
	sync(st)
	mtCheckCounts(t, m, p)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	if series["vipgate_sync_duration_seconds"] != 2 {
		t.Errorf("sync duration series: %d, want full and partial", series["vipgate_sync_duration_seconds"])
	}
	if series["vipgate_nftables_chains"] != 2 || series["vipgate_nftables_elements"] == 0 {
		t.Errorf("series per metric: %v", series)
	}
}

// mtValue reads a gauge or counter.
func mtValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}
