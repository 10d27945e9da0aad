package cluster

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
)

func TestPoolMetrics(t *testing.T) {
	buggy := lbPool("buggy", true, "192.0.2.0/24", "198.51.100.250-198.51.101.5")
	buggy.Spec.AvoidBuggyIPs = true
	pools, rej := ParseLBPools([]*metallbv1beta1.IPAddressPool{
		lbPool("small", true, "203.0.113.0/30", "2001:db8::/64"),
		buggy,
	})
	if len(rej) != 0 {
		t.Fatal(rej)
	}
	a := NewAllocator(pools)
	for _, name := range []string{"a", "b"} {
		if _, _, err := a.Assign(LBRequest{Service: lbSvc(name, map[string]string{"metallb.io/address-pool": "small"}, 80)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("c", map[string]string{"metallb.io/address-pool": "buggy"}, 80)}); err != nil {
		t.Fatal(err)
	}
	got := a.PoolUsages()
	want := []PoolUsage{
		{Pool: "metallb-system/small", Family: IPv4, Size: 4, InUse: 2},
		{Pool: "metallb-system/small", Family: IPv6, Size: math.Pow(2, 64)},
		// 256 - 2, and 12 addresses across a /24 boundary without .255 and .0.
		{Pool: "metallb-system/buggy", Family: IPv4, Size: 254 + 10, InUse: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PoolUsages (-want +got):\n%s", diff)
	}

	reg := prometheus.NewRegistry()
	m, err := NewPoolMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(gatherPool(t, reg)); n != 0 {
		t.Errorf("%d families before the first reconcile, want none", n)
	}
	m.Observe(a, 3)
	if diff := cmp.Diff(map[string]string{
		"vipgate_allocator_addresses": `{family="ipv4",pool="metallb-system/buggy"} 264, {family="ipv4",pool="metallb-system/small"} 4, ` +
			`{family="ipv6",pool="metallb-system/small"} 1.8446744073709552e+19`,
		"vipgate_allocator_addresses_in_use": `{family="ipv4",pool="metallb-system/buggy"} 1, {family="ipv4",pool="metallb-system/small"} 2, ` +
			`{family="ipv6",pool="metallb-system/small"} 0`,
		"vipgate_allocator_services_pending": "3",
	}, gatherPool(t, reg)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	m.Observe(nil, 0) // no longer leading
	if n := len(gatherPool(t, reg)); n != 0 {
		t.Errorf("%d families after leading stopped, want none", n)
	}
}

func gatherPool(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		var vals []string
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(ls) == 0 {
				vals = append(vals, fmt.Sprint(m.GetGauge().GetValue()))
			} else {
				vals = append(vals, fmt.Sprintf("{%s} %v", strings.Join(ls, ","), m.GetGauge().GetValue()))
			}
		}
		sort.Strings(vals)
		out[mf.GetName()] = strings.Join(vals, ", ")
	}
	return out
}
