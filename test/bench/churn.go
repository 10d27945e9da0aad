package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

// churn is the rolling-update case: after a full sync of n Services, `rate` endpoint changes per
// second for `dur` (an endpoint of a Service removed, or the removed one added back, spread over the
// Services). The row is `vipgate node`'s whole pipeline (churnNode, churn_kube.go: the API writes,
// the Kubernetes source's informers, coalescing and snapshots, the sync loop), with a sub-row for the
// source's share. The next sub-row is the dataplane alone: the same changes produced on a clock of
// their own while one sync loop takes everything that is pending into each sync, with no source in
// front. Each change is timed from the moment it is produced to the kernel's ack of the sync that
// carried it (its wait for the sync before included). The process's CPU over the window is given in
// cores. At the end the kernel's table is read back with dataplane's decoder and compared with the
// desired state: a fresh proxier adopting it (SetTableReader) must find nothing to change; a lost
// change would show up as a difference.
//
// kube-proxy (each version of the run, unless --no-kube-proxy-churn) then gets the same changes at
// the same rate in its driver, against its real sync loop with its default minSyncPeriod (1 s): each
// change timed from OnEndpointSliceUpdate to the end of the first sync that started after it, the
// driver's CPU (its nft children included) over the window.
func churn(t *table, n, rate int, dur time.Duration, kp *kubeProxyBench) {
	p50, p99 := churnNode(t, n, rate, dur)
	total := max(1, int(float64(rate)*dur.Seconds()))
	what := "the dataplane alone: the same changes handed straight to proxier.Sync, change produced -> kernel ack"
	ns, err := newNetns()
	if err != nil {
		t.fail(what, err)
		return
	}
	defer ns.close()
	st := synthState(n, 10)
	prog := ns.programmer()
	p := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), prog)
	if _, err := p.Sync(st); err != nil {
		t.fail(what, err)
		return
	}
	resetPeakRSS()

	type change struct {
		at  time.Time
		key cluster.ServiceKey
	}
	changes := make(chan change, total) // never blocks the producer: its clock stays exact
	start := time.Now()
	go func() {
		interval := time.Second / time.Duration(rate)
		for i := range total {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			// A stride coprime with n: every Service gets its turn, neighbours far apart.
			changes <- change{at: time.Now(), key: serviceKey(i * 7919 % n)}
		}
		close(changes)
	}()

	tracing := os.Getenv("VIPGATE_BENCH_TRACE") != ""
	cpu0 := cpuTime()
	saved := map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	apply := func(k cluster.ServiceKey) {
		if old, ok := saved[k]; ok {
			st.EndpointSlices[k] = old
			delete(saved, k)
			return
		}
		saved[k] = st.EndpointSlices[k]
		es := *st.EndpointSlices[k][0]
		es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
		st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
	}
	var (
		lat     = make([]time.Duration, 0, total)
		syncs   int
		batch   []time.Time
		maxSync time.Duration
	)
	for c := range changes {
		batch = append(batch[:0], c.at)
		apply(c.key)
	drain:
		for {
			select {
			case c, ok := <-changes:
				if !ok {
					break drain
				}
				batch = append(batch, c.at)
				apply(c.key)
			default:
				break drain
			}
		}
		s0 := time.Now()
		rep, err := p.Sync(st)
		done := time.Now()
		if err != nil {
			t.fail(what, err)
			return
		}
		if rep.Full {
			t.fail(what, fmt.Errorf("sync %d was a full sync", syncs))
			return
		}
		syncs++
		maxSync = max(maxSync, done.Sub(s0))
		if tracing && done.Sub(s0) > 50*time.Millisecond {
			fmt.Fprintf(os.Stderr, "  churn: sync %d at %v took %v (%d changes; %s)\n", syncs, s0.Sub(start).Round(time.Millisecond), done.Sub(s0), len(batch), txSummary(rep))
		}
		for _, at := range batch {
			lat = append(lat, done.Sub(at))
		}
	}
	wall := time.Since(start)
	cores := float64(cpuTime()-cpu0) / float64(wall)
	rss, hwm := rssMiB()

	check, ok := readBack(prog, st)
	t.failed = t.failed || !ok
	t.add(row{Sub: true, What: what,
		Vipgate: fmt.Sprintf("p50 / p99 / max %s / %s / %s; CPU %.2f cores", fmtDuration(quantile(lat, 0.5)),
			fmtDuration(quantile(lat, 0.99)), fmtDuration(quantile(lat, 1)), cores),
		Ref: fmt.Sprintf("%s syncs (%.1f changes each), longest sync %s; %d of %d changes carried; %s; RSS at the end %.0f MiB, peak during the churn %.0f MiB",
			thousands(syncs), float64(len(lat))/float64(max(syncs, 1)), fmtDuration(maxSync), len(lat), total, check, rss, hwm),
		Ratio: "the dataplane's share of the target"})
	// Free the namespace and the state before kube-proxy's run: the machine has two cores.
	ns.close()
	lat, st = nil, nil
	kps := kp.churnAt(t, n, rate, dur)
	for _, v := range kp.versionsOf(kps) {
		c := kps[v].Churn
		ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
		t.add(row{Sub: true, What: fmt.Sprintf("the same churn, kube-proxy %s (OnEndpointSliceUpdate -> end of the first sync started after it; minSyncPeriod 1 s)", v),
			Vipgate: fmt.Sprintf("vipgate p50 / p99 %s / %s", fmtDuration(p50), fmtDuration(p99)),
			Ref: fmt.Sprintf("kube-proxy %s: p50 / p99 / max %s / %s / %s; CPU %.2f cores (with its nft processes); %s syncs (%d full), longest %s; %d of %d changes carried; %v sync failures; RSS at the end %.0f MiB, peak during the churn %.0f MiB (+ nft child %.0f MiB)",
				v, fmtDuration(ms(c.P50Ms)), fmtDuration(ms(c.P99Ms)), fmtDuration(ms(c.MaxMs)), c.Cores, thousands(c.Syncs), c.FullSyncs,
				fmtDuration(ms(c.LongestMs)), c.Carried, c.Changes, c.SyncFailed, float64(c.RSSKiB)/1024, float64(c.PeakKiB)/1024, float64(c.NftChildKiB)/1024),
			Ratio: fmt.Sprintf("p50 %s, p99 %s than kube-proxy %s", faster(p50, ms(c.P50Ms)), faster(p99, ms(c.P99Ms)), v)})
	}
}

// onlyUnusedPickers says whether txs only delete shared picker chains.
func onlyUnusedPickers(txs []*dataplane.Tx) bool {
	for _, tx := range txs {
		if len(tx.DelChains) == 0 || tx.Full || len(tx.AddSets) > 0 || len(tx.AddChains) > 0 || len(tx.FlushChains) > 0 ||
			len(tx.DelElements) > 0 || len(tx.AddElements) > 0 || len(tx.DelSets) > 0 {
			return false
		}
		for _, c := range tx.DelChains {
			if proxy.SharedChain(c) == nil {
				return false
			}
		}
	}
	return true
}

func txSummary(rep *dataplane.SyncReport) string {
	var out []string
	for _, tx := range rep.Txs {
		out = append(out, tx.String())
	}
	return strings.Join(out, "; ")
}

// churnNode runs churnPipeline and adds its row; it returns the latency quantiles for the kube-proxy
// comparison.
func churnNode(t *table, n, rate int, dur time.Duration) (p50, p99 time.Duration) {
	total := max(1, int(float64(rate)*dur.Seconds()))
	what := fmt.Sprintf("churn: %s endpoint changes/s for %v at %s Services (%s changes), vipgate node's pipeline: EndpointSlice Update (fake clientset) -> informers -> coalescer -> snapshot -> SyncRunner -> kernel ack",
		thousands(rate), dur, thousands(n), thousands(total))
	res, err := churnPipeline(n, rate, dur)
	if res != nil && res.ns != nil {
		defer res.ns.close()
	}
	if err != nil {
		t.fail(what, err)
		return 0, 0
	}
	check, ok := readBack(res.prog, res.last)
	t.failed = t.failed || !ok
	if res.lost > 0 || len(res.lat) != total {
		check = fmt.Sprintf("%d Services differ from the API in the last synced State, %d of %d changes carried; ", res.lost, len(res.lat), total) + check
		t.failed = true
	}
	lat := res.lat
	alone := float64(res.writeCPUCost) / float64(res.wall)
	t.add(row{What: what,
		Vipgate: fmt.Sprintf("p50 / p99 / max %s / %s / %s; CPU %.2f cores (%.2f without the fake API's own %.2f)", fmtDuration(quantile(lat, 0.5)),
			fmtDuration(quantile(lat, 0.99)), fmtDuration(quantile(lat, 1)), res.cores, res.cores-alone, alone),
		Ref: fmt.Sprintf("%s States emitted, %s syncs (%.1f changes each), longest sync %s; writer behind its clock at most %s; %d of %d changes carried; %s; RSS at the end %.0f MiB, peak during the churn %.0f MiB",
			thousands(res.states), thousands(res.syncs), float64(len(lat))/float64(max(res.syncs, 1)), fmtDuration(res.maxSync), fmtDuration(res.writeLag),
			len(lat), total, check, res.rss, res.hwm),
		Ratio: "target p99 <= 50 ms, CPU <= 1 core"})
	t.add(row{Sub: true, What: "the source's share: EndpointSlice Update -> the State that holds it handed to the sync loop (informers, coalescer, snapshot)",
		Vipgate: fmt.Sprintf("p50 / p99 / max %s / %s / %s", fmtDuration(quantile(res.toState, 0.5)), fmtDuration(quantile(res.toState, 0.99)), fmtDuration(quantile(res.toState, 1))),
		Ref:     "the rest is the sync loop: a sync still running, then the one carrying the change", Ratio: ""})
	return quantile(lat, 0.5), quantile(lat, 0.99)
}

// readBack compares the kernel with the desired state st: a fresh proxier reads the table back
// (decode.go) and adopts it; any element, chain or rule that differs would be in its transaction.
func readBack(prog *dataplane.NetlinkProgrammer, st *cluster.State) (string, bool) {
	q := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), discardProgrammer{})
	q.SetTableReader(prog)
	rep, err := q.Sync(st)
	check := "kernel table read back = desired state"
	switch {
	case err != nil:
		return "reading the kernel table back: " + err.Error(), false
	case !rep.Adopted:
		return "the kernel table could not be adopted (differs in its structure)", false
	case len(rep.Txs) > 0 && !onlyUnusedPickers(rep.Txs):
		return "kernel table DIFFERS from the desired state: " + rep.Txs[0].String(), false
	case len(rep.Txs) > 0:
		// Pickers that fell out of use stay in the kernel on purpose until the next full sync
		// (diff.go, finish); the desired state lists only the chains in use.
		check += fmt.Sprintf(" (apart from %d shared picker chains out of use, kept on purpose)", len(rep.Txs[0].DelChains))
	}
	return check, true
}
