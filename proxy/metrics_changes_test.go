package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

func TestChangeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewChangeMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	key := func(n string) cluster.ServiceKey { return cluster.ServiceKey{Namespace: "demo", Name: n} }
	svc := func(n string) *cluster.Service {
		return &cluster.Service{Key: key(n), Type: cluster.TypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}
	}
	es := func(n string) []*cluster.EndpointSlice {
		return []*cluster.EndpointSlice{{Service: key(n), Family: cluster.IPv4}}
	}
	st1 := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{key("a"): svc("a"), key("b"): svc("b")},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key("a"): es("a")},
		Rejected:       []cluster.Rejection{{Kind: "Service", Object: "demo/bad", Reason: "no ports"}, {Kind: "EndpointSlice", Object: "demo/x", Reason: "no service"}},
	}
	m.ObserveSync(st1, &dataplane.SyncReport{Conflicts: []cluster.Rejection{{Kind: "Service", Object: "demo/b", Reason: "port held by demo/a"}}}, nil)
	// b's object changes, a's slices change, c arrives, and the next sync fails: nothing counted.
	st2 := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{key("a"): st1.Services[key("a")], key("b"): svc("b"), key("c"): svc("c")},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key("a"): es("a")},
	}
	m.ObserveSync(st2, nil, errors.New("refused"))
	if diff := cmp.Diff(map[string]string{
		"vipgate_sync_service_changes_total":  "2",
		"vipgate_sync_endpoint_changes_total": "1",
		"vipgate_rejected_services":           `{namespace="demo",reason="conflict",service="b"} 1, {namespace="demo",reason="invalid",service="bad"} 1`,
	}, gatherText(t, reg)); diff != "" {
		t.Errorf("after the first sync (-want +got):\n%s", diff)
	}
	m.ObserveSync(st2, &dataplane.SyncReport{}, nil)
	if diff := cmp.Diff(map[string]string{
		"vipgate_sync_service_changes_total":  "4",
		"vipgate_sync_endpoint_changes_total": "2",
	}, gatherText(t, reg)); diff != "" {
		t.Errorf("after the second sync (-want +got):\n%s", diff)
	}
}

func TestRejectedServicesBounded(t *testing.T) {
	var rs []cluster.Rejection
	for i := range 5 * MaxRejectedServiceSeries {
		rs = append(rs, cluster.Rejection{Kind: "Service", Object: fmt.Sprintf("ns/s%04d", i), Reason: "invalid"})
	}
	got := rejectedServices(rs, rs)
	if len(got) != MaxRejectedServiceSeries || got[0] != (rejectedService{"ns", "s0000", RejectedConflict}) {
		t.Errorf("got %d series starting with %v, want %d from ns/s0000", len(got), got[0], MaxRejectedServiceSeries)
	}
}

// gatherText renders each family of reg as "value" or "{labels} value, ..." (sorted).
func gatherText(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		var vals []string
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(ls) == 0 {
				vals = append(vals, fmt.Sprint(v))
			} else {
				vals = append(vals, fmt.Sprintf("{%s} %v", strings.Join(ls, ","), v))
			}
		}
		sort.Strings(vals)
		out[mf.GetName()] = strings.Join(vals, ", ")
	}
	return out
}
