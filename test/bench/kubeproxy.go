package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipgate/vipgate/cluster"
)

// kube-proxy in the same run. The driver (test/bench/kubeproxy, its own module) links the real
// nftables proxier of one Kubernetes version; the bench writes the very Services and EndpointSlices
// vipgate's rows program as JSON lines, runs the driver with `ip netns exec` in a namespace of its
// own (lo and a stub NIC carrying the node IP, which kube-proxy's --nodeport-addresses=primary
// needs) and reads back one JSON line. Every kube-proxy figure in the table comes from that, never
// from a recording.

// kubeProxyBuild is how the driver module builds each supported version (go.mod: v1.37.2;
// go.136.mod with the kubeproxy136 tag: v1.36.3). The Makefile's bin/kube-proxy-bench-<version>
// rules use the same arguments.
var kubeProxyBuild = map[string][]string{
	"v1.37.2": {"build"},
	"v1.36.3": {"build", "-modfile=go.136.mod", "-tags", "kubeproxy136"},
}

// defaultKubeProxy is the version measured unless --kube-proxy says otherwise: the newest.
const defaultKubeProxy = "v1.37.2"

// kubeProxyOptions says which kube-proxy versions run beside vipgate and how.
type kubeProxyOptions struct {
	versions    []string // empty: kube-proxy is not measured
	binDir      string   // holds kube-proxy-bench-<version> (make bench builds them); built when missing
	changes     int      // endpoints added one at a time after each full sync
	maxServices int      // larger sizes are vipgate only
	reps        int      // full syncs per size (the median is reported)
	churn       bool     // run the churn row for kube-proxy too (--no-kube-proxy-churn: not)
}

// kubeProxyResult is the driver's JSON line (test/bench/kubeproxy/main.go, type result).
type kubeProxyResult struct {
	Version          string    `json:"version"`
	Services         int       `json:"services"`
	Endpoints        int       `json:"endpoints"`
	FeedMs           float64   `json:"feed_ms"`
	FullSyncMs       float64   `json:"full_sync_ms"`
	FullSyncMetricMs float64   `json:"full_sync_metric_ms"`
	FullSyncCPUMs    float64   `json:"full_sync_cpu_ms"`
	ChangeMs         []float64 `json:"change_ms"`
	ChangesPartial   int       `json:"changes_partial"`
	SyncFailures     float64   `json:"sync_failures"`
	PeakKiB          int       `json:"peak_kib"`
	RSSAfterKiB      int       `json:"rss_after_kib"`
	NftChildKiB      int       `json:"nft_child_kib"`
	RulesetLines     int       `json:"ruleset_lines"`
	ServiceChains    int       `json:"service_chains"`
	Churn            *struct {
		Changes     int     `json:"changes"`
		Carried     int     `json:"carried"`
		Syncs       int     `json:"syncs"`
		FullSyncs   int     `json:"full_syncs"`
		P50Ms       float64 `json:"p50_ms"`
		P99Ms       float64 `json:"p99_ms"`
		MaxMs       float64 `json:"max_ms"`
		LongestMs   float64 `json:"longest_ms"`
		Cores       float64 `json:"cores"`
		SyncFailed  float64 `json:"sync_failed"`
		PeakKiB     int     `json:"peak_kib"`
		RSSKiB      int     `json:"rss_kib"`
		NftChildKiB int     `json:"nft_child_kib"`
	} `json:"churn"`
}

// kubeProxyFigures summarizes the runs of one version at one size.
type kubeProxyFigures struct {
	version           string
	runs              int
	full              time.Duration // median of the runs' full syncs
	fullCPU           time.Duration // median of their CPU times (nft children included)
	changes           []time.Duration
	partial           int
	peakMiB, afterMiB float64 // medians
	nftChildMiB       float64 // the largest
	rulesetLines      int
	syncFailures      float64
}

func summarize(version string, rs []kubeProxyResult) *kubeProxyFigures {
	f := &kubeProxyFigures{version: version, runs: len(rs)}
	var full, cpu, peak, after []float64
	for _, r := range rs {
		full = append(full, r.FullSyncMs)
		cpu = append(cpu, r.FullSyncCPUMs)
		peak = append(peak, float64(r.PeakKiB)/1024)
		after = append(after, float64(r.RSSAfterKiB)/1024)
		for _, c := range r.ChangeMs {
			f.changes = append(f.changes, time.Duration(c*float64(time.Millisecond)))
		}
		f.partial += r.ChangesPartial
		f.nftChildMiB = max(f.nftChildMiB, float64(r.NftChildKiB)/1024)
		f.rulesetLines = r.RulesetLines
		f.syncFailures += r.SyncFailures
	}
	f.full = time.Duration(median(full) * float64(time.Millisecond))
	f.fullCPU = time.Duration(median(cpu) * float64(time.Millisecond))
	f.peakMiB, f.afterMiB = median(peak), median(after)
	return f
}

// name is how the table calls this kube-proxy.
func (f *kubeProxyFigures) name() string { return "kube-proxy " + f.version }

// kubeProxyBench runs the driver and keeps what it measured, per version and size, so the full-sync
// rows and the incremental rows share the runs.
type kubeProxyBench struct {
	o       kubeProxyOptions
	bins    map[string]string
	figures map[string]map[int]*kubeProxyFigures
	failed  map[string]map[int]bool
}

func newKubeProxyBench(o kubeProxyOptions) *kubeProxyBench {
	if len(o.versions) == 0 {
		return nil
	}
	return &kubeProxyBench{o: o, bins: map[string]string{}, figures: map[string]map[int]*kubeProxyFigures{},
		failed: map[string]map[int]bool{}}
}

// at returns the figures of every version at n Services, measuring what is not measured yet; a
// version that fails adds a failed row (once) and is left out. Nil when n is beyond --kube-proxy-max.
func (k *kubeProxyBench) at(t *table, n int) []*kubeProxyFigures {
	if k == nil || n > k.o.maxServices {
		return nil
	}
	var out []*kubeProxyFigures
	for _, v := range k.o.versions {
		if k.figures[v] == nil {
			k.figures[v], k.failed[v] = map[int]*kubeProxyFigures{}, map[int]bool{}
		}
		if f := k.figures[v][n]; f != nil {
			out = append(out, f)
			continue
		}
		if k.failed[v][n] {
			continue
		}
		what := fmt.Sprintf("kube-proxy %s nftables proxier, %s Services x 10 endpoints (same run)", v, thousands(n))
		fmt.Fprintf(os.Stderr, "  (%s: %d full syncs, %d endpoints added after each)\n", what, k.o.reps, k.o.changes)
		f, err := k.measure(v, n)
		if err != nil {
			k.failed[v][n] = true
			t.fail(what, err)
			continue
		}
		k.figures[v][n] = f
		out = append(out, f)
	}
	return out
}

// measure runs the driver of one version reps times at n Services, each run in a fresh namespace.
func (k *kubeProxyBench) measure(version string, n int) (*kubeProxyFigures, error) {
	bin, err := k.binary(version)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-kp-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer atExit(func() { os.RemoveAll(dir) })()
	objects := filepath.Join(dir, "objects.json")
	if err := writeKubeObjects(objects, n, 10); err != nil {
		return nil, err
	}
	var rs []kubeProxyResult
	for r := 0; r < k.o.reps; r++ {
		res, err := runKubeProxy(bin, objects, filepath.Join(dir, fmt.Sprintf("stderr-%d", r)), "--changes", fmt.Sprint(k.o.changes))
		if err != nil {
			return nil, err
		}
		if res.Version != version || res.Services != n {
			return nil, fmt.Errorf("the driver measured %s at %d Services, not %s at %d", res.Version, res.Services, version, n)
		}
		// Every synthetic Service has endpoints, so kube-proxy must have a chain for each: fewer
		// means it ignored objects, and its figures would flatter it.
		if res.ServiceChains < n {
			return nil, fmt.Errorf("kube-proxy programmed %d Service chains for %d Services (objects ignored? see its log)", res.ServiceChains, n)
		}
		rs = append(rs, *res)
	}
	return summarize(version, rs), nil
}

// runKubeProxy runs the driver once in a fresh namespace: lo up, a stub NIC (an empty bridge: this
// kernel has no dummy module) with the bench node's IP.
func runKubeProxy(bin, objects, stderrFile string, extra ...string) (*kubeProxyResult, error) {
	ns, err := newNetns()
	if err != nil {
		return nil, err
	}
	defer ns.close()
	for _, args := range [][]string{
		{"link", "add", "kpb0", "type", "bridge"},
		{"addr", "add", benchNodeIP.String() + "/24", "dev", "kpb0"},
		{"link", "set", "kpb0", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns.name}, args...)...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("netns %s: ip %s: %v: %s", ns.name, strings.Join(args, " "), err, out)
		}
	}
	stderr, err := os.Create(stderrFile)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.name, bin, "--netns", ns.name, "--objects", objects,
		"--node-name", thisNode, "--node-ip", benchNodeIP.String()}, extra...)...)
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	// `ip netns exec` execs the driver, so this kills the driver itself if the bench is stopped.
	defer atExit(func() { _ = cmd.Process.Kill() })()
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", filepath.Base(bin), err, oneLine(tailFile(stderrFile, 5)))
	}
	var res kubeProxyResult
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &res); err != nil {
		return nil, fmt.Errorf("%s printed %q: %w", filepath.Base(bin), firstLines(stdout.String(), 2), err)
	}
	return &res, nil
}

// churnAt runs the churn row's changes (rate per second for dur, at n Services) against each
// version's sync loop, one run each after its full sync, and returns the results by version; a
// version that fails adds a failed row. Nil when kube-proxy or its churn is off, or n is beyond
// --kube-proxy-max.
func (k *kubeProxyBench) churnAt(t *table, n, rate int, dur time.Duration) map[string]*kubeProxyResult {
	if k == nil || !k.o.churn || n > k.o.maxServices {
		return nil
	}
	out := map[string]*kubeProxyResult{}
	for _, v := range k.o.versions {
		what := fmt.Sprintf("churn: kube-proxy %s nftables proxier, %s Services (same run)", v, thousands(n))
		fmt.Fprintf(os.Stderr, "  (%s: full sync, then %d changes/s for %v)\n", what, rate, dur)
		res, err := k.churnRun(v, n, rate, dur)
		if err != nil {
			t.fail(what, err)
			continue
		}
		out[v] = res
	}
	return out
}

func (k *kubeProxyBench) churnRun(version string, n, rate int, dur time.Duration) (*kubeProxyResult, error) {
	bin, err := k.binary(version)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-kp-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer atExit(func() { os.RemoveAll(dir) })()
	objects := filepath.Join(dir, "objects.json")
	if err := writeKubeObjects(objects, n, 10); err != nil {
		return nil, err
	}
	res, err := runKubeProxy(bin, objects, filepath.Join(dir, "stderr-churn"), "--changes", "0",
		"--churn-rate", fmt.Sprint(rate), "--churn-time", dur.String())
	if err != nil {
		return nil, err
	}
	if res.Churn == nil {
		return nil, fmt.Errorf("the %s driver printed no churn result (an older binary? rebuild bin/kube-proxy-bench-%s)", version, version)
	}
	if res.ServiceChains < n {
		return nil, fmt.Errorf("kube-proxy programmed %d Service chains for %d Services (objects ignored? see its log)", res.ServiceChains, n)
	}
	return res, nil
}

func tailFile(file string, n int) string {
	b, _ := os.ReadFile(file)
	ls := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// binary returns the driver of one version: bin/kube-proxy-bench-<version> when make built it,
// else built here from test/bench/kubeproxy (seconds with a warm build cache, minutes cold).
func (k *kubeProxyBench) binary(version string) (string, error) {
	if b := k.bins[version]; b != "" {
		return b, nil
	}
	args, ok := kubeProxyBuild[version]
	if !ok {
		return "", fmt.Errorf("no kube-proxy driver for %s (have %s)", version, strings.Join(kubeProxyVersions(), ", "))
	}
	name := "kube-proxy-bench-" + version
	if k.o.binDir != "" {
		if p, err := filepath.Abs(filepath.Join(k.o.binDir, name)); err == nil {
			if _, err := os.Stat(p); err == nil {
				k.bins[version] = p
				return p, nil
			}
		}
	}
	src, err := kubeProxyModule()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-bin-", os.Getpid()))
	if err != nil {
		return "", err
	}
	atExit(func() { os.RemoveAll(dir) })
	out := filepath.Join(dir, name)
	fmt.Fprintf(os.Stderr, "building the kube-proxy %s driver (test/bench/kubeproxy; `make bench` keeps it in bin/)\n", version)
	cmd := exec.Command("go", append(slices.Clone(args), "-o", out, ".")...)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the kube-proxy %s driver: %v: %s", version, err, firstLines(string(b), 5))
	}
	k.bins[version] = out
	return out, nil
}

// kubeProxyModule finds test/bench/kubeproxy from the main module's go.mod.
func kubeProxyModule() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("run the bench from the vipgate module (no go.mod found)")
	}
	return filepath.Join(filepath.Dir(gomod), "test", "bench", "kubeproxy"), nil
}

func kubeProxyVersions() []string {
	var vs []string
	for v := range kubeProxyBuild {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// writeKubeObjects writes synthetic Services 0..n-1 with m endpoints as the driver reads them: JSON
// lines, the Services first, then their EndpointSlices (the order the informers deliver them).
func writeKubeObjects(file string, n, m int) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := 0; i < n && err == nil; i++ {
		svc, _ := synthService(i, m)
		err = enc.Encode(kubeServiceOf(svc))
	}
	for i := 0; i < n && err == nil; i++ {
		_, es := synthService(i, m)
		ks := kubeSlice(es)
		ks.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		// The API server defaults an unnamed port's name to ""; kube-proxy ignores a port whose
		// name is nil.
		for i := range ks.Ports {
			if ks.Ports[i].Name == nil {
				ks.Ports[i].Name = new(string)
			}
		}
		err = enc.Encode(ks)
	}
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the kube-proxy objects: %w", err)
	}
	return nil
}

// kubeServiceOf is a synthetic Service as the v1 object kube-proxy gets: every field of the mix
// (type, NodePort, externalTrafficPolicy, healthCheckNodePort, session affinity, LoadBalancer
// ingress), target port 8080.
func kubeServiceOf(svc *cluster.Service) *corev1.Service {
	out := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: svc.Key.Name, Namespace: svc.Key.Namespace},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceType(svc.Type),
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		},
	}
	for _, ip := range svc.ClusterIPs {
		out.Spec.ClusterIPs = append(out.Spec.ClusterIPs, ip.String())
	}
	out.Spec.ClusterIP = out.Spec.ClusterIPs[0]
	for _, p := range svc.Ports {
		out.Spec.Ports = append(out.Spec.Ports, corev1.ServicePort{Protocol: corev1.Protocol(p.Protocol), Port: int32(p.Port),
			TargetPort: intstr.FromInt32(8080), NodePort: int32(p.NodePort)})
	}
	if svc.Type != cluster.TypeClusterIP {
		out.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if svc.ExternalPolicyLocal {
			out.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
	}
	out.Spec.HealthCheckNodePort = int32(svc.HealthCheckNodePort)
	if svc.AffinityTimeout > 0 {
		timeout := int32(svc.AffinityTimeout.Seconds())
		out.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		out.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
	for _, ip := range svc.LoadBalancerIPs {
		out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	return out
}

// versionsOf lists the versions of m in the run's order.
func (k *kubeProxyBench) versionsOf(m map[string]*kubeProxyResult) []string {
	if k == nil {
		return nil
	}
	var vs []string
	for _, v := range k.o.versions {
		if m[v] != nil {
			vs = append(vs, v)
		}
	}
	return vs
}
