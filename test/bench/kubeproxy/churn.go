//go:build linux

package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	proxymetrics "k8s.io/kubernetes/pkg/proxy/metrics"
)

// churnResult is the churn part of the driver's JSON line (--churn-rate): test/bench's churn row
// with kube-proxy's own sync loop. Latencies are from OnEndpointSliceUpdate to the end of the first
// sync that started after it (a sync reads the change tracker after its start, so that sync carries
// the change: kube-proxy's change-to-kernel time).
type churnResult struct {
	Changes     int     `json:"changes"`       // produced
	Carried     int     `json:"carried"`       // followed by a sync that started after them
	Syncs       int     `json:"syncs"`         // syncs that ended in the window (and after it, until the last change was carried)
	FullSyncs   int     `json:"full_syncs"`    // of them full (a failed partial sync makes the next one full)
	P50Ms       float64 `json:"p50_ms"`        // nearest rank
	P99Ms       float64 `json:"p99_ms"`        //
	MaxMs       float64 `json:"max_ms"`        //
	LongestMs   float64 `json:"longest_ms"`    // the longest sync
	Cores       float64 `json:"cores"`         // CPU (this process and its nft children) over the window, in cores
	WallMs      float64 `json:"wall_ms"`       // from the first change to the end of the sync that carried the last
	SyncFailed  float64 `json:"sync_failed"`   // kube-proxy's nftables sync failure counter at the end
	PeakKiB     int     `json:"peak_kib"`      // VmHWM over the window (reset before it)
	RSSKiB      int     `json:"rss_kib"`       // VmRSS at the end
	NftChildKiB int     `json:"nft_child_kib"` // the largest nft child's peak RSS (the whole run)
}

// sliceUpdater is the proxier's EndpointSlice handler.
type sliceUpdater interface {
	OnEndpointSliceUpdate(oldSlice, newSlice *discovery.EndpointSlice)
}

// syncSeen is one sync of kube-proxy's loop as its duration histogram recorded it.
type syncSeen struct{ start, end time.Time }

// histogramReader reads one series of a kube-proxy histogram without gathering the whole registry
// (cheap enough to poll every millisecond beside a loop doing 1,000 changes/s).
type histogramReader struct {
	m interface{ Write(*dto.Metric) error }
}

func newHistogramReader() (*histogramReader, error) {
	m, ok := proxymetrics.SyncProxyRulesLatency.WithLabelValues(string(v1.IPv4Protocol)).(interface{ Write(*dto.Metric) error })
	if !ok {
		return nil, fmt.Errorf("kube-proxy's sync histogram cannot be read directly")
	}
	return &histogramReader{m: m}, nil
}

func (h *histogramReader) read() sample {
	var d dto.Metric
	if h.m.Write(&d) != nil || d.Histogram == nil {
		return sample{}
	}
	return sample{sum: d.Histogram.GetSampleSum(), count: d.Histogram.GetSampleCount()}
}

// churn runs `rate` endpoint changes per second for dur against the proxier's running sync loop: an
// endpoint of a Service removed, or the removed one added back, spread over the Services with the
// stride test/bench uses for vipgate (i*7919 mod n), on a clock of their own. A monitor polls the
// sync histogram every millisecond; a new sample of duration d seen at time t is a sync that ran
// from t-d to t.
func churn(p sliceUpdater, eps []*discovery.EndpointSlice, rate int, dur time.Duration) (*churnResult, error) {
	n := len(eps)
	if n == 0 || rate <= 0 || dur <= 0 {
		return nil, fmt.Errorf("churn needs EndpointSlices, a rate and a duration")
	}
	h, err := newHistogramReader()
	if err != nil {
		return nil, err
	}
	total := max(1, int(float64(rate)*dur.Seconds()))
	res := &churnResult{Changes: total}

	var (
		mu    sync.Mutex
		syncs []syncSeen
	)
	stop := make(chan struct{})
	monitorDone := make(chan struct{})
	prev := h.read()
	go func() {
		defer close(monitorDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			s := h.read()
			if s.count == prev.count {
				continue
			}
			now := time.Now()
			// One sync per poll (syncs are at least minSyncPeriod apart); should two have ended
			// within a millisecond, both are dated by their summed duration, which only makes
			// the later one look earlier-started (its changes then look later: conservative).
			d := time.Duration((s.sum - prev.sum) * float64(time.Second))
			mu.Lock()
			for range s.count - prev.count {
				syncs = append(syncs, syncSeen{start: now.Add(-d), end: now})
			}
			mu.Unlock()
			prev = s
		}
	}()

	resetPeakRSS()
	fullBefore := histogram(metricFull).count
	cpu0 := cpuTime()
	at := make([]time.Time, 0, total)
	saved := map[int]*discovery.EndpointSlice{}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		k := i * 7919 % n
		cur := eps[k]
		var next *discovery.EndpointSlice
		if old, ok := saved[k]; ok {
			next = old
			delete(saved, k)
		} else {
			saved[k] = cur
			next = cur.DeepCopy()
			next.Endpoints = next.Endpoints[:len(next.Endpoints)-1]
		}
		at = append(at, time.Now())
		p.OnEndpointSliceUpdate(cur, next)
		eps[k] = next
	}
	// Wait until a sync has started after the last change and ended (the next sync comes within
	// minSyncPeriod plus the running sync; 5 minutes is far beyond that).
	last := at[len(at)-1]
	deadline := time.Now().Add(5 * time.Minute)
	for {
		mu.Lock()
		done := len(syncs) > 0 && syncs[len(syncs)-1].start.After(last)
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			<-monitorDone
			return nil, fmt.Errorf("no sync started after the last change within 5 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-monitorDone
	wall := time.Since(start)
	res.Cores = float64(cpuTime()-cpu0) / float64(wall)
	res.WallMs = ms(wall)
	res.PeakKiB, res.RSSKiB = procMemKiB()
	res.FullSyncs = int(histogram(metricFull).count - fullBefore)
	res.SyncFailed = counter(metricFailures)

	// Each change: the first sync that started after it.
	lat := make([]float64, 0, total)
	j := 0
	for _, t := range at {
		for j < len(syncs) && !syncs[j].start.After(t) {
			j++
		}
		if j == len(syncs) {
			break
		}
		lat = append(lat, ms(syncs[j].end.Sub(t)))
	}
	res.Carried = len(lat)
	for _, s := range syncs {
		if s.end.After(start) {
			res.Syncs++
			res.LongestMs = max(res.LongestMs, ms(s.end.Sub(s.start)))
		}
	}
	slices.Sort(lat)
	res.P50Ms, res.P99Ms, res.MaxMs = rank(lat, 0.5), rank(lat, 0.99), rank(lat, 1)
	return res, nil
}

// rank is the nearest-rank quantile of sorted xs.
func rank(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.999999) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
