package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

// benchConfig is the dataplane configuration of the bench node (the lab's node1 addresses).
func benchConfig(nodeIP netip.Addr) proxy.Config {
	return proxy.Config{
		Table:        "vipgate",
		NodeName:     thisNode,
		NodeIPs:      []netip.Addr{nodeIP},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		NodePortIPs:  []netip.Addr{nodeIP},
		Families:     []cluster.Family{cluster.IPv4},
	}
}

var benchNodeIP = netip.MustParseAddr("192.0.2.11")

// timedProgrammer wraps the netlink edge and keeps the time of the last Apply: the kernel's part of
// a sync (encoding the batch, the kernel's work, the ack), as opposed to vipgate's Go part.
type timedProgrammer struct {
	inner dataplane.Programmer
	last  time.Duration
}

func (p *timedProgrammer) Apply(tx *dataplane.Tx) error {
	if os.Getenv("VIPGATE_BENCH_TRACE") != "" && tx.Full {
		// Where the memory is when the batch is about to be encoded (the peak comes during it).
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		rss, _ := rssMiB()
		fmt.Fprintf(os.Stderr, "  before the full sync's Apply: RSS %.0f MiB, heap in use %.1f MiB (objects %.1f MiB), %d collections so far\n",
			rss, float64(ms.HeapInuse)/(1<<20), float64(ms.HeapAlloc)/(1<<20), ms.NumGC)
	}
	start := time.Now()
	err := p.inner.Apply(tx)
	p.last += time.Since(start)
	return err
}

// discardProgrammer applies nothing: the Go part of a sync alone.
type discardProgrammer struct{}

func (discardProgrammer) Apply(*dataplane.Tx) error { return nil }

// counts of what a proxier programmed, from its model.
type counts struct{ chains, rules, elements int }

func countFlat(p *proxy.Proxier) counts {
	flat := p.Flatten(cluster.IPv4)
	c := counts{chains: len(flat.Chains)}
	for _, ch := range flat.Chains {
		c.rules += len(ch.Rules)
	}
	for _, els := range flat.Elements {
		c.elements += len(els)
	}
	return c
}

// memory figures of this process, in MiB.
func rssMiB() (rss, hwm float64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = float64(kb) / 1024
		case "VmHWM:":
			hwm = float64(kb) / 1024
		}
	}
	return rss, hwm
}

// cpuTime is the user and system time this process has used (all threads: the Go runtime's GC
// workers are part of a sync's cost).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sysTime is the system (kernel) time this process has used.
func sysTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Stime.Nano())
}

// resetPeakRSS returns garbage to the OS and resets VmHWM (clear_refs 5), so the next VmHWM is the
// peak of what follows.
func resetPeakRSS() {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// fullSync measures the first sync of n Services x 10 endpoints into a fresh namespace (median of
// reps, each in its own namespace), what it programmed, the process's memory, and the same rules
// loaded with `nft -f` as the kernel's own reference; kps are kube-proxy's figures of this run at n
// (none beyond --kube-proxy-max or with --no-kube-proxy).
func fullSync(t *table, n, reps int, withNft bool, kps []*kubeProxyFigures) {
	what := fmt.Sprintf("full sync into the kernel, %s Services x 10 endpoints (median of %d)", thousands(n), reps)
	st := synthState(n, 10)

	// The Go part alone: build, diff and bookkeeping, no kernel.
	goOnly := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), discardProgrammer{})
	start := time.Now()
	if _, err := goOnly.Sync(st); err != nil {
		t.fail(what, err)
		return
	}
	goTime := time.Since(start)

	var (
		times, kernel []time.Duration
		cpus          []time.Duration
		p             *proxy.Proxier
		ns            *netns
		peak          float64
		conflicts     int
	)
	for r := 0; r < reps; r++ {
		if ns != nil {
			ns.close()
		}
		p = nil
		resetPeakRSS()
		var err error
		if ns, err = newNetns(); err != nil {
			t.fail(what, err)
			return
		}
		prog := &timedProgrammer{inner: ns.programmer()}
		p = proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), prog)
		// VIPGATE_BENCH_TRACE=1 prints each sync's allocations and peak, and the memory map after.
		var ms0 runtime.MemStats
		trace := os.Getenv("VIPGATE_BENCH_TRACE") != ""
		if trace {
			runtime.ReadMemStats(&ms0)
		}
		cpu := cpuTime()
		start := time.Now()
		rep, err := p.Sync(st)
		if err != nil {
			ns.close()
			t.fail(what, err)
			return
		}
		times = append(times, time.Since(start))
		cpus = append(cpus, cpuTime()-cpu)
		kernel = append(kernel, prog.last)
		conflicts = len(rep.Conflicts)
		_, hwm := rssMiB()
		peak = max(peak, hwm)
		if trace {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(os.Stderr, "  full sync %d: %v (kernel %v, CPU %v), allocated %.1f MiB in %d objects, %d collections, peak RSS %.0f MiB\n",
				r, times[r], prog.last, cpus[r], float64(ms.TotalAlloc-ms0.TotalAlloc)/(1<<20), ms.Mallocs-ms0.Mallocs, ms.NumGC-ms0.NumGC, hwm)
		}
	}
	defer ns.close()
	// The memory holding the Services, taken now: what follows is the bench's own work (the counts'
	// Flatten, the ruleset rendered for nft, nft's listing read back), whose garbage can leave holes
	// in the heap and collector metadata behind that a `vipgate node` process does not have (10,000
	// Services: up to 3 MiB of the RSS after, more than the difference between runs). A node holds
	// the State and the Proxier after its sync, and that is what is measured.
	runtime.GC()
	debug.FreeOSMemory()
	writeHeapProfile(n)
	printMemoryMap(n)
	rss, _ := rssMiB()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	total := medianDuration(times)
	refs, ratios := []string{}, []string{}
	var nftTime time.Duration
	if withNft {
		var err error
		if nftTime, err = nftLoad(p); err != nil {
			refs = append(refs, "nft -f of the same rules: failed: "+oneLine(err.Error()))
		} else {
			refs = append(refs, "`nft -f` of the same rules: "+fmtDuration(nftTime))
			ratios = append(ratios, faster(total, nftTime)+" than nft")
			t.scaling.add(plotSync, "nft -f of vipgate's rules (kernel floor)", n, nftTime.Seconds())
		}
	}
	t.scaling.add(plotSync, "vipgate", n, total.Seconds())
	for _, kp := range kps {
		refs = append(refs, fmt.Sprintf("%s (median of %d): %s", kp.name(), kp.runs, fmtDuration(kp.full)))
		ratios = append(ratios, faster(total, kp.full)+" than "+kp.name())
		t.scaling.add(plotSync, kp.name(), n, kp.full.Seconds())
	}
	t.add(row{What: what, Vipgate: fmtDuration(total), Ref: strings.Join(refs, "; "), Ratio: strings.Join(ratios, "; ")})
	t.add(row{Sub: true, What: "of which Go (model, diff; no kernel) / netlink batch to kernel ack",
		Vipgate: fmtDuration(goTime) + " / " + fmtDuration(medianDuration(kernel))})
	// CPU time: steadier than the wall time when the machine is shared.
	cpu := medianDuration(cpus)
	refs, ratios = nil, nil
	for _, kp := range kps {
		refs = append(refs, fmt.Sprintf("%s (with its nft processes): %s", kp.name(), fmtDuration(kp.fullCPU)))
		ratios = append(ratios, faster(cpu, kp.fullCPU)+" than "+kp.name())
	}
	t.add(row{Sub: true, What: "CPU time of the full sync (user + system, the kernel's work in the syscalls included)",
		Vipgate: fmtDuration(cpu), Ref: strings.Join(refs, "; "), Ratio: strings.Join(ratios, "; ")})

	c := countFlat(p)
	lines, err := nftListLines(ns.name)
	listed := fmt.Sprintf("%s chains, %s rules, %s set elements", thousands(c.chains), thousands(c.rules), thousands(c.elements))
	if err == nil {
		listed += fmt.Sprintf("; `nft list ruleset`: %s lines", thousands(lines))
	}
	if conflicts > 0 {
		listed += fmt.Sprintf(" (%d entries refused as conflicts!)", conflicts)
	}
	r := row{Sub: true, What: fmt.Sprintf("programmed at %s Services", thousands(n)), Vipgate: listed}
	refs = nil
	for _, kp := range kps {
		refs = append(refs, fmt.Sprintf("%s: `nft list ruleset`: %s lines", kp.name(), thousands(kp.rulesetLines)))
	}
	r.Ref = strings.Join(refs, "; ")
	t.add(r)

	r = row{Sub: true, What: fmt.Sprintf("memory holding %s Services: RSS after GC / Go heap in use / peak RSS during the sync", thousands(n)),
		Vipgate: fmt.Sprintf("%.0f / %.0f / %.0f MiB", rss, float64(ms.HeapInuse)/(1<<20), peak)}
	t.scaling.add(plotPeak, "vipgate, peak during the sync", n, peak)
	t.scaling.add(plotPeak, "vipgate, RSS after", n, rss)
	refs, ratios = nil, nil
	for _, kp := range kps {
		// The driver's process only, like vipgate's figure; knftables' nft child processes come on top.
		refs = append(refs, fmt.Sprintf("%s: RSS after GC %.0f MiB, peak (VmHWM) %.0f MiB (+ its nft child: %.0f MiB)",
			kp.name(), kp.afterMiB, kp.peakMiB, kp.nftChildMiB))
		ratios = append(ratios, fmt.Sprintf("peak %.2f of %s's", peak/kp.peakMiB, kp.name()))
		t.scaling.add(plotPeak, kp.name()+", peak during the sync", n, kp.peakMiB)
		t.scaling.add(plotPeak, kp.name()+", RSS after", n, kp.afterMiB)
	}
	r.Ref, r.Ratio = strings.Join(refs, "; "), strings.Join(ratios, "; ")
	t.add(r)
	runtime.KeepAlive(st)
	runtime.KeepAlive(p)
}

// nftLoad renders what p programmed in `nft -f` syntax and times nft loading it into a fresh namespace:
// the same rules through the kernel's own tool.
func nftLoad(p *proxy.Proxier) (time.Duration, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return 0, fmt.Errorf("nft not installed")
	}
	text := dataplane.RenderString(p.Flatten(cluster.IPv4))
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-", os.Getpid()))
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "ruleset.nft")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		return 0, err
	}
	ns, err := newNetns()
	if err != nil {
		return 0, err
	}
	defer ns.close()
	start := time.Now()
	if out, err := exec.Command("ip", "netns", "exec", ns.name, "nft", "-f", file).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("nft -f: %v: %s", err, firstLines(string(out), 3))
	}
	return time.Since(start), nil
}

func nftListLines(ns string) (int, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").Output()
	if err != nil {
		return 0, err
	}
	return strings.Count(string(out), "\n"), nil
}

func firstLines(s string, n int) string {
	ls := strings.SplitN(s, "\n", n+1)
	return strings.Join(ls[:min(n, len(ls))], " ")
}

// incremental measures the time from a model change (Sync called with the new State) to the
// kernel's ack, at n Services, for changes of four kinds, each `changes` times; and the kernel's
// share of it (the netlink Apply). kps are kube-proxy's figures of this run at n: its endpoint
// additions go beside vipgate's.
func incremental(t *table, n, changes int, kps []*kubeProxyFigures) {
	what := fmt.Sprintf("incremental changes at %s Services", thousands(n))
	ns, err := newNetns()
	if err != nil {
		t.fail(what, err)
		return
	}
	defer ns.close()
	st := synthState(n, 10)
	prog := &timedProgrammer{inner: ns.programmer()}
	p := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), prog)
	// VIPGATE_BENCH_TRACE=1 prints the full sync and the first changes of each kind one by one
	// (wall, kernel, process CPU): the first change after a full sync is the one to watch.
	fullStart, fullCPU := time.Now(), cpuTime()
	if _, err := p.Sync(st); err != nil {
		t.fail(what, err)
		return
	}
	if os.Getenv("VIPGATE_BENCH_TRACE") != "" {
		fmt.Fprintf(os.Stderr, "  full sync: %v (process CPU user+sys %v)\n", time.Since(fullStart), cpuTime()-fullCPU)
	}
	run := func(name string, kps []*kubeProxyFigures, change func(i int)) {
		what := fmt.Sprintf("%s at %s Services, model change to kernel ack, p50 / p99 of %d", name, thousands(n), changes)
		var total, kernel, cpu, sys []time.Duration
		for i := 0; i < changes; i++ {
			change(i)
			prog.last = 0
			cpu0, sys0 := cpuTime(), sysTime()
			start := time.Now()
			rep, err := p.Sync(st)
			d := time.Since(start)
			cpu, sys = append(cpu, cpuTime()-cpu0), append(sys, sysTime()-sys0)
			if err != nil {
				t.fail(what, err)
				return
			}
			if rep.Full {
				t.fail(what, fmt.Errorf("change %d was synced as a full sync", i))
				return
			}
			total, kernel = append(total, d), append(kernel, prog.last)
		}
		if os.Getenv("VIPGATE_BENCH_TRACE") != "" {
			for i := range min(5, len(total)) {
				fmt.Fprintf(os.Stderr, "  %s: change %d: %v (kernel %v, process CPU user+sys %v, sys %v)\n", name, i, total[i], kernel[i], cpu[i], sys[i])
			}
		}
		r := row{What: what,
			Vipgate: fmtDuration(quantile(total, 0.5)) + " / " + fmtDuration(quantile(total, 0.99)),
			Ref:     "kernel (netlink batch to ack): " + fmtDuration(quantile(kernel, 0.5)) + " / " + fmtDuration(quantile(kernel, 0.99)),
			Ratio:   fmt.Sprintf("Go part p50 %s", fmtDuration(max(quantile(total, 0.5)-quantile(kernel, 0.5), 0)))}
		for _, kp := range kps {
			if len(kp.changes) == 0 {
				continue
			}
			// kube-proxy's p99 of a handful of changes is their maximum: say so.
			r.Ref += fmt.Sprintf("; %s, +1 endpoint (OnEndpointSliceUpdate to its sync's end, %d of %d partial syncs), p50 / max of %d: %s / %s",
				kp.name(), kp.partial, len(kp.changes), len(kp.changes), fmtDuration(quantile(kp.changes, 0.5)), fmtDuration(quantile(kp.changes, 1)))
			r.Ratio += "; p50 " + faster(quantile(total, 0.5), quantile(kp.changes, 0.5)) + " than " + kp.name()
		}
		t.add(r)
	}
	// Spread the changes over the Services (every 7th: all kinds of Service get their turn).
	pick := func(i int) cluster.ServiceKey { return serviceKey(i * 7 % n) }
	saved := map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	run("one endpoint removed", nil, func(i int) {
		k := pick(i)
		saved[k] = st.EndpointSlices[k]
		es := *st.EndpointSlices[k][0]
		es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
		st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
	})
	run("one endpoint added", kps, func(i int) {
		k := pick(i)
		st.EndpointSlices[k] = saved[k]
	})
	run("one Service added", nil, func(i int) {
		svc, es := synthService(n+i, 10)
		st.Services[svc.Key] = svc
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{es}
	})
	run("one Service deleted", nil, func(i int) {
		k := serviceKey(n + i)
		delete(st.Services, k)
		delete(st.EndpointSlices, k)
	})
}

// writeHeapProfile writes the heap profile of the process holding n Services to
// $VIPGATE_BENCH_HEAP_PROFILE.<n> when that variable is set: where the memory of the row above goes
// (`go tool pprof -sample_index=inuse_space FILE`).
func writeHeapProfile(n int) {
	base := os.Getenv("VIPGATE_BENCH_HEAP_PROFILE")
	if base == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", base, n))
	if err != nil {
		fmt.Fprintf(os.Stderr, "heap profile: %v\n", err)
		return
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "heap profile: %v\n", err)
	}
}

// printMemoryMap prints, when VIPGATE_BENCH_TRACE is set, where the process's resident memory is
// after the full sync of n Services: the Go runtime's own accounts, and the resident size of each
// kind of mapping (the binary's text and data, anonymous memory).
func printMemoryMap(n int) {
	if os.Getenv("VIPGATE_BENCH_TRACE") == "" {
		return
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mib := func(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	fmt.Fprintf(os.Stderr, "  memory at %d Services (MiB): heap in use %s (objects %s), heap released %s, heap idle %s, stacks %s, "+
		"spans %s, GC metadata %s, other runtime %s, total from the OS %s\n", n, mib(ms.HeapInuse), mib(ms.HeapAlloc),
		mib(ms.HeapReleased), mib(ms.HeapIdle), mib(ms.StackSys), mib(ms.MSpanSys), mib(ms.GCSys), mib(ms.OtherSys), mib(ms.Sys))
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return
	}
	byName := map[string]int{}
	name := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-"):
			name = "[anonymous]"
			if len(f) >= 6 {
				name = f[5] + " " + f[1]
			}
		case len(f) >= 2 && f[0] == "Rss:":
			kb, _ := strconv.Atoi(f[1])
			byName[name] += kb
		}
	}
	for name, kb := range byName {
		if kb >= 512 {
			fmt.Fprintf(os.Stderr, "    resident %6.1f MiB  %s\n", float64(kb)/1024, name)
		}
	}
}
