//go:build linux

// Command kubeproxy-bench is kube-proxy's column of `make bench`: it links the real nftables proxier
// of k8s.io/kubernetes (pkg/proxy/nftables; v1.37.2 from go.mod, v1.36.3 from go.136.mod with the
// tag kubeproxy136), builds its IPv4 Proxier the way cmd/kube-proxy does with the defaults of nftables
// mode, feeds it the Services and EndpointSlices that test/bench wrote (the very objects vipgate's rows
// program) and measures
//
//   - the first (full) sync: OnEndpointSlicesSynced runs syncProxyRules on the calling goroutine;
//   - one endpoint added to a Service, a few times, with the real sync loop running (each change waits
//     out minSyncPeriod first, so the sync's cost is measured, not the rate limit);
//   - the process's peak RSS during the full sync (VmHWM, reset before it) and its RSS after a GC;
//   - with --churn-rate: test/bench's churn row (churn.go), endpoint changes at a fixed rate against the
//     running sync loop, each timed to the end of the first sync that started after it.
//
// It prints one JSON line (result). test/bench runs it with `ip netns exec` in a namespace it
// created; the program refuses to run anywhere else (checkNetns), so it never programs the root
// namespace.
//
// Usage:
//
//	kubeproxy-bench --netns NAME --objects FILE [--changes 5] [--node-ip 192.0.2.11] [--churn-rate 1000 --churn-time 60s]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
	proxyconfigapi "k8s.io/kubernetes/pkg/proxy/apis/config"
	proxymetrics "k8s.io/kubernetes/pkg/proxy/metrics"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	"k8s.io/utils/ptr"
)

// result is what the driver prints, one JSON object; test/bench decodes the same fields.
type result struct {
	Version   string `json:"version"` // the k8s.io/kubernetes version linked in
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"` // in all EndpointSlices
	// FeedMs is the time of the OnServiceAdd / OnEndpointSliceAdd calls (the informers' part).
	FeedMs float64 `json:"feed_ms"`
	// FullSyncMs is the wall time of the first syncProxyRules (OnEndpointSlicesSynced);
	// FullSyncMetricMs the same sync as kube-proxy's own histogram recorded it.
	FullSyncMs       float64 `json:"full_sync_ms"`
	FullSyncMetricMs float64 `json:"full_sync_metric_ms"`
	// FullSyncCPUMs is the CPU time (user + system) the full sync took, the nft child processes
	// included: on a shared machine it is steadier than the wall time.
	FullSyncCPUMs float64 `json:"full_sync_cpu_ms"`
	// ChangeMs is, per endpoint added, the time from OnEndpointSliceUpdate to the sync's end (its
	// histogram sample appearing); ChangesPartial how many of those syncs were partial.
	ChangeMs       []float64 `json:"change_ms"`
	ChangesPartial int       `json:"changes_partial"`
	SyncFailures   float64   `json:"sync_failures"`
	// PeakKiB is VmHWM at the end of the full sync (reset before the feed); RSSAfterKiB the RSS
	// after the changes and a GC; NftChildKiB the largest peak RSS of an nft child process (knftables
	// runs `nft -f` for every transaction; not in the Go process's figures).
	PeakKiB     int `json:"peak_kib"`
	RSSAfterKiB int `json:"rss_after_kib"`
	NftChildKiB int `json:"nft_child_kib"`
	// RulesetLines is `nft list ruleset | wc -l` at the end; ServiceChains counts the per-Service-port
	// chains in it (service-…): one for each Service with endpoints, if kube-proxy took them all.
	RulesetLines  int `json:"ruleset_lines"`
	ServiceChains int `json:"service_chains"`
	// Churn is test/bench's churn row for kube-proxy (--churn-rate, after the changes above).
	Churn *churnResult `json:"churn,omitempty"`
}

// options of one run.
type options struct {
	netns, objects     string
	changes            int
	nodeName           string
	nodeIP             net.IP
	podCIDR, svcCIDR   string
	minSync, syncEvery time.Duration
	churnRate          int
	churnTime          time.Duration
}

func main() {
	var o options
	var nodeIP string
	flag.StringVar(&o.netns, "netns", "", "the network namespace (in /run/netns) this process runs in; required")
	flag.StringVar(&o.objects, "objects", "", "JSON lines of v1 Services and discovery/v1 EndpointSlices; required")
	flag.IntVar(&o.changes, "changes", 5, "endpoints added one at a time after the full sync")
	flag.StringVar(&o.nodeName, "node-name", "node1", "this node's name (endpoints on it are local)")
	flag.StringVar(&nodeIP, "node-ip", "192.0.2.11", "this node's IP (also --nodeport-addresses=primary)")
	flag.StringVar(&o.podCIDR, "cluster-cidr", "10.244.0.0/16", "--cluster-cidr (detect-local-mode ClusterCIDR)")
	flag.StringVar(&o.svcCIDR, "service-cidr", "10.96.0.0/16", "the ServiceCIDR the informer would report")
	flag.DurationVar(&o.minSync, "min-sync-period", time.Second, "--nftables-min-sync-period (kube-proxy's default: 1s)")
	flag.DurationVar(&o.syncEvery, "sync-period", 30*time.Second, "--nftables-sync-period (kube-proxy's default: 30s)")
	flag.IntVar(&o.churnRate, "churn-rate", 0, "after the changes: endpoint changes per second for --churn-time against the running sync loop (0: none)")
	flag.DurationVar(&o.churnTime, "churn-time", time.Minute, "duration of the churn")
	klog.InitFlags(nil)
	flag.Parse()
	if o.nodeIP = net.ParseIP(nodeIP); o.nodeIP == nil || o.nodeIP.To4() == nil {
		fatalf("--node-ip %q is not an IPv4 address", nodeIP)
	}
	if o.objects == "" || o.changes < 0 {
		fatalf("--objects is required and --changes must not be negative")
	}
	if o.churnRate < 0 || o.churnRate > 100000 || o.churnTime <= 0 || o.churnTime > 30*time.Minute {
		fatalf("--churn-rate must be 0-100000 and --churn-time positive, at most 30m")
	}
	if err := checkNetns(o.netns); err != nil {
		fatalf("%v", err)
	}
	res, err := run(o)
	if err != nil {
		fatalf("%v", err)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	os.Exit(0) // the sync loop never returns
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kubeproxy-bench: "+format+"\n", args...)
	os.Exit(1)
}

func run(o options) (*result, error) {
	svcs, slices, err := readObjects(o.objects)
	if err != nil {
		return nil, err
	}
	res := &result{Version: kubernetesVersion, Services: len(svcs)}
	for _, es := range slices {
		res.Endpoints += len(es.Endpoints)
	}

	proxymetrics.RegisterMetrics(proxyconfigapi.ProxyModeNFTables)
	// cmd/kube-proxy turns nftables mode's default --nodeport-addresses=primary into <nodeIP>/32.
	cfg := proxierConfig{syncPeriod: o.syncEvery, minSyncPeriod: o.minSync, masqueradeBit: 14,
		nodePortAddresses: []string{o.nodeIP.String() + "/32"}}
	p, err := newProxier(context.Background(), cfg, proxyutil.NewDetectLocalByCIDR(o.podCIDR), o.nodeName, o.nodeIP)
	if err != nil {
		return nil, fmt.Errorf("creating the nftables proxier: %w", err)
	}

	// The peak is taken from here: the objects are decoded, the garbage of decoding returned.
	resetPeakRSS()
	start := time.Now()
	p.OnServiceCIDRsChanged([]string{o.svcCIDR})
	for _, s := range svcs {
		p.OnServiceAdd(s)
	}
	for _, es := range slices {
		p.OnEndpointSliceAdd(es)
	}
	res.FeedMs = ms(time.Since(start))
	// OnServiceSynced's sync returns at once (EndpointSlices not synced yet); OnEndpointSlicesSynced
	// then runs the first, full, syncProxyRules on this goroutine.
	p.OnServiceSynced()
	before := histogram(metricFull)
	cpu := cpuTime()
	start = time.Now()
	p.OnEndpointSlicesSynced()
	res.FullSyncMs = ms(time.Since(start))
	res.FullSyncCPUMs = ms(cpuTime() - cpu)
	after := histogram(metricFull)
	if after.count != before.count+1 {
		return nil, fmt.Errorf("expected one full sync, kube-proxy recorded %d", after.count-before.count)
	}
	res.FullSyncMetricMs = (after.sum - before.sum) * 1000
	res.PeakKiB, _ = procMemKiB()

	// Steady state: kube-proxy's own sync loop (BoundedFrequencyRunner), one endpoint added at a
	// time to the Services vipgate's rows change (every 7th).
	go p.SyncLoop()
	for k := 0; k < o.changes && len(slices) > 0; k++ {
		time.Sleep(o.minSync + 500*time.Millisecond)
		i := k * 7 % len(slices)
		grown := slices[i].DeepCopy()
		grown.Endpoints = append(grown.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.%d.251", 2+k%250)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To("node2"),
		})
		all, partial := histogram(metricAny), histogram(metricPartial)
		start := time.Now()
		p.OnEndpointSliceUpdate(slices[i], grown)
		if _, err := waitForSync(all.count, 10*time.Minute); err != nil {
			return nil, fmt.Errorf("change %d: %w", k, err)
		}
		res.ChangeMs = append(res.ChangeMs, ms(time.Since(start)))
		if histogram(metricPartial).count > partial.count {
			res.ChangesPartial++
		}
		slices[i] = grown
	}
	if o.churnRate > 0 {
		if res.Churn, err = churn(p, slices, o.churnRate, o.churnTime); err != nil {
			return nil, fmt.Errorf("churn: %w", err)
		}
	}
	res.SyncFailures = counter(metricFailures)

	out, err := exec.Command("nft", "list", "ruleset").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list ruleset: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		res.RulesetLines++
		if strings.HasPrefix(strings.TrimSpace(l), "chain service-") {
			res.ServiceChains++
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	_, res.RSSAfterKiB = procMemKiB()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		res.NftChildKiB = int(ru.Maxrss)
	}
	runtime.KeepAlive(svcs)
	return res, nil
}

// readObjects decodes the JSON lines test/bench wrote: each a v1 Service or a discovery/v1
// EndpointSlice with apiVersion and kind set.
func readObjects(file string) ([]*v1.Service, []*discovery.EndpointSlice, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the objects: %w", err)
	}
	defer f.Close()
	var (
		svcs   []*v1.Service
		slices []*discovery.EndpointSlice
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		var kind struct{ Kind string }
		if err := json.Unmarshal(sc.Bytes(), &kind); err != nil {
			return nil, nil, fmt.Errorf("%s:%d: %w", file, line, err)
		}
		switch kind.Kind {
		case "Service":
			s := &v1.Service{}
			err = json.Unmarshal(sc.Bytes(), s)
			svcs = append(svcs, s)
		case "EndpointSlice":
			es := &discovery.EndpointSlice{}
			err = json.Unmarshal(sc.Bytes(), es)
			slices = append(slices, es)
		default:
			err = fmt.Errorf("unexpected kind %q", kind.Kind)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s:%d: %w", file, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return svcs, slices, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cpuTime is the user and system time of this process and of its children waited for.
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

// resetPeakRSS returns garbage to the OS and resets VmHWM (clear_refs 5), as test/bench does before
// vipgate's full sync.
func resetPeakRSS() {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// procMemKiB returns VmHWM and VmRSS of this process.
func procMemKiB() (hwm, rss int) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		var n int
		switch {
		case strings.HasPrefix(l, "VmHWM:"):
			fmt.Sscan(strings.TrimPrefix(l, "VmHWM:"), &n)
			hwm = n
		case strings.HasPrefix(l, "VmRSS:"):
			fmt.Sscan(strings.TrimPrefix(l, "VmRSS:"), &n)
			rss = n
		}
	}
	return hwm, rss
}

// checkNetns makes sure this process runs in the named namespace test/bench created (a vg<pid>-
// name in /run/netns) and not in the root namespace: the proxier programs whatever namespace it
// runs in.
func checkNetns(name string) error {
	if name == "" || !strings.HasPrefix(name, "vg") || strings.Contains(name, "/") {
		return fmt.Errorf("--netns must name the vg<pid>-… namespace test/bench created (got %q)", name)
	}
	var self, want, init syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return fmt.Errorf("checking the network namespace: %w", err)
	}
	if err := syscall.Stat("/run/netns/"+name, &want); err != nil {
		return fmt.Errorf("checking the network namespace: %w", err)
	}
	if self.Ino != want.Ino || self.Dev != want.Dev {
		return fmt.Errorf("not running in network namespace %s (run me with `ip netns exec %s`)", name, name)
	}
	if err := syscall.Stat("/proc/1/ns/net", &init); err == nil && init.Ino == self.Ino && init.Dev == self.Dev {
		return fmt.Errorf("refusing to run in the root network namespace")
	}
	return nil
}
