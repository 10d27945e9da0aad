//go:build linux

package main

import (
	"fmt"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/legacyregistry"
)

// kube-proxy's own sync metrics (pkg/proxy/metrics), read back from the legacy registry it
// registers them in: the driver times syncs by their samples, as an operator would.
const (
	metricAny      = "kubeproxy_sync_proxy_rules_duration_seconds"
	metricFull     = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	metricPartial  = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	metricFailures = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
)

// sample is a histogram's sum and count.
type sample struct {
	sum   float64
	count uint64
}

func family(name string) *dto.MetricFamily {
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// histogram reads the IPv4 series of a sync histogram.
func histogram(name string) sample {
	mf := family(name)
	if mf == nil {
		return sample{}
	}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "ip_family" && l.GetValue() == string(v1.IPv4Protocol) {
				h := m.GetHistogram()
				return sample{sum: h.GetSampleSum(), count: h.GetSampleCount()}
			}
		}
	}
	return sample{}
}

func counter(name string) float64 {
	mf := family(name)
	if mf == nil {
		return 0
	}
	v := 0.0
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue()
	}
	return v
}

// waitForSync polls (every millisecond) until a sync after prev has been recorded. kube-proxy
// observes the histogram in syncProxyRules' deferred function, right after the sync's nft
// transaction, health-check and conntrack work.
func waitForSync(prev uint64, timeout time.Duration) (sample, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if s := histogram(metricAny); s.count > prev {
			return s, nil
		}
		time.Sleep(time.Millisecond)
	}
	return sample{}, fmt.Errorf("no sync recorded within %s", timeout)
}
