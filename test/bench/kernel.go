package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// kube-proxy's figures on this VM, recorded by kpbench (../shared/bench-kubeproxy/README.md: real
// k8s.io/kubernetes v1.36.3 nftables proxier, median of 3 runs). They are not re-measured here: a
// 10,000-Service kube-proxy run takes about 95 s and needs a separate module.
var kubeProxy = map[int]struct {
	full, oneEndpoint time.Duration
	nftLines          int
	hwmMiB            int
}{
	1000:  {365 * time.Millisecond, 302 * time.Millisecond, 7689, 65},
	5000:  {5430 * time.Millisecond, 2200 * time.Millisecond, 37969, 221},
	10000: {21100 * time.Millisecond, 7430 * time.Millisecond, 75819, 382},
}

const kubeProxyName = "kube-proxy v1.36.3 nftables (kpbench, this VM)"

// benchConfig is the dataplane configuration of the bench node (the lab's node1 addresses).
func benchConfig(nodeIP netip.Addr) dataplane.Config {
	return dataplane.Config{
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

func countFlat(p *dataplane.Proxier) counts {
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

// resetPeakRSS returns garbage to the OS and resets VmHWM (clear_refs 5), so the next VmHWM is the
// peak of what follows.
func resetPeakRSS() {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// fullSync measures the first sync of n Services x 10 endpoints into a fresh namespace (median of
// reps, each in its own namespace), what it programmed, the process's memory, and the same rules
// loaded with `nft -f` as the kernel's own reference.
func fullSync(t *table, n, reps int, withNft bool) {
	what := fmt.Sprintf("full sync into the kernel, %s Services x 10 endpoints (median of %d)", thousands(n), reps)
	st := synthState(n, 10)

	// The Go part alone: build, diff and bookkeeping, no kernel.
	goOnly := dataplane.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), discardProgrammer{})
	start := time.Now()
	if _, err := goOnly.Sync(st); err != nil {
		t.fail(what, err)
		return
	}
	goTime := time.Since(start)

	var (
		times, kernel []time.Duration
		p             *dataplane.Proxier
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
		prog := &timedProgrammer{inner: &dataplane.NetlinkProgrammer{NetNSFd: ns.fd()}}
		p = dataplane.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), prog)
		start := time.Now()
		rep, err := p.Sync(st)
		if err != nil {
			ns.close()
			t.fail(what, err)
			return
		}
		times = append(times, time.Since(start))
		kernel = append(kernel, prog.last)
		conflicts = len(rep.Conflicts)
		_, hwm := rssMiB()
		peak = max(peak, hwm)
	}
	defer ns.close()
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
		}
	}
	if kp, ok := kubeProxy[n]; ok {
		refs = append(refs, kubeProxyName+": "+fmtDuration(kp.full))
		ratios = append(ratios, faster(total, kp.full)+" than kube-proxy")
	}
	t.add(row{What: what, Vipgate: fmtDuration(total), Ref: strings.Join(refs, "; "), Ratio: strings.Join(ratios, "; ")})
	t.add(row{Sub: true, What: "of which Go (model, diff; no kernel) / netlink batch to kernel ack",
		Vipgate: fmtDuration(goTime) + " / " + fmtDuration(medianDuration(kernel))})

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
	if kp, ok := kubeProxy[n]; ok {
		r.Ref = fmt.Sprintf("kube-proxy: %s lines", thousands(kp.nftLines))
	}
	t.add(r)

	runtime.GC()
	debug.FreeOSMemory()
	rss, _ := rssMiB()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r = row{Sub: true, What: fmt.Sprintf("memory holding %s Services: RSS after GC / Go heap in use / peak RSS during the sync", thousands(n)),
		Vipgate: fmt.Sprintf("%.0f / %.0f / %.0f MiB", rss, float64(ms.HeapInuse)/(1<<20), peak)}
	if kp, ok := kubeProxy[n]; ok {
		r.Ref = fmt.Sprintf("kube-proxy peak (VmHWM): %d MiB", kp.hwmMiB)
		r.Ratio = fmt.Sprintf("%.2f of kube-proxy's peak", peak/float64(kp.hwmMiB))
	}
	t.add(r)
	runtime.KeepAlive(st)
	runtime.KeepAlive(p)
}

// nftLoad renders what p programmed in `nft -f` syntax and times nft loading it into a fresh namespace:
// the same rules through the kernel's own tool.
func nftLoad(p *dataplane.Proxier) (time.Duration, error) {
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
// share of it (the netlink Apply).
func incremental(t *table, n, changes int) {
	what := fmt.Sprintf("incremental changes at %s Services", thousands(n))
	ns, err := newNetns()
	if err != nil {
		t.fail(what, err)
		return
	}
	defer ns.close()
	st := synthState(n, 10)
	prog := &timedProgrammer{inner: &dataplane.NetlinkProgrammer{NetNSFd: ns.fd()}}
	p := dataplane.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), prog)
	if _, err := p.Sync(st); err != nil {
		t.fail(what, err)
		return
	}
	run := func(name string, kp time.Duration, change func(i int)) {
		what := fmt.Sprintf("%s at %s Services, model change to kernel ack, p50 / p99 of %d", name, thousands(n), changes)
		var total, kernel []time.Duration
		for i := 0; i < changes; i++ {
			change(i)
			prog.last = 0
			start := time.Now()
			rep, err := p.Sync(st)
			d := time.Since(start)
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
		r := row{What: what,
			Vipgate: fmtDuration(quantile(total, 0.5)) + " / " + fmtDuration(quantile(total, 0.99)),
			Ref:     "kernel (netlink batch to ack): " + fmtDuration(quantile(kernel, 0.5)) + " / " + fmtDuration(quantile(kernel, 0.99)),
			Ratio:   fmt.Sprintf("Go part p50 %s", fmtDuration(max(quantile(total, 0.5)-quantile(kernel, 0.5), 0)))}
		if kp > 0 {
			r.Ref += fmt.Sprintf("; %s, +1 endpoint: %s", kubeProxyName, fmtDuration(kp))
			r.Ratio += "; " + faster(quantile(total, 0.5), kp) + " than kube-proxy"
		}
		t.add(r)
	}
	// Spread the changes over the Services (every 7th: all kinds of Service get their turn).
	pick := func(i int) cluster.ServiceKey { return serviceKey(i * 7 % n) }
	saved := map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	run("one endpoint removed", 0, func(i int) {
		k := pick(i)
		saved[k] = st.EndpointSlices[k]
		es := *st.EndpointSlices[k][0]
		es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
		st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
	})
	run("one endpoint added", kubeProxy[n].oneEndpoint, func(i int) {
		k := pick(i)
		st.EndpointSlices[k] = saved[k]
	})
	run("one Service added", 0, func(i int) {
		svc, es := synthService(n+i, 10)
		st.Services[svc.Key] = svc
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{es}
	})
	run("one Service deleted", 0, func(i int) {
		k := serviceKey(n + i)
		delete(st.Services, k)
		delete(st.EndpointSlices, k)
	})
}
