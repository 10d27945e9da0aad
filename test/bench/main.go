// Command bench is `make bench`: one command, one table of vipgate's dataplane figures next to what
// the kernel does on its own (the same rules through `nft -f`, the netlink batch alone, the path to
// the pod without a Service) and next to the real kube-proxy nftables proxier measured in the same
// run on the same machine (test/bench/kubeproxy: v1.37.2, and v1.36.3 on request).
//
//	go run ./test/bench [--sizes 1000,3000,10000,30000] [--quick] [--out BENCH.md] [--plots docs/bench]
//	                    [--kube-proxy v1.37.2,v1.36.3 | --no-kube-proxy]
//
// It measures, in network namespaces it creates and deletes (vg<pid>-…; never the root namespace):
//
//  1. the first (full) sync of N Services x 10 endpoints into a fresh namespace, vipgate and
//     kube-proxy (up to --kube-proxy-max Services) with the same Services;
//  2. incremental changes at 10,000 Services (endpoint removed/added, Service added/deleted):
//     model change to kernel ack, p50/p99;
//  3. what was programmed (chains, rules, set elements) and the process's memory;
//  4. new TCP connections per second through a ClusterIP and a NodePort with 1 and with 10,000
//     Services programmed (netns lab: client -> router -> node1 -> pod1);
//  5. iperf3 throughput and connection rate through the ClusterIP vs to the pod directly;
//  6. control plane to data plane: `vipgate node --manifests DIR`, EndpointSlice file written ->
//     first connection through the new ClusterIP;
//  7. the gateway's small-packet rate (64-byte UDP) in each forwarding mode against the same hop
//     plainly routed and, for nodePort and direct, against a hand-written NAT ruleset (gateway.go);
//  8. the gateway's TCP throughput (one iperf3 stream) in route forwarding with and without its
//     fast path against the same hop plainly routed (gateway_tcp.go);
//  9. the gateway's new TCP connections per second and added latency, vipgate (NAT fast path and
//     nftables only) against the plain hop, HAProxy and nginx, side by side (gateway_cps.go);
//  10. the concurrent flows the gateway holds (100,000 and 1,000,000) and their memory, what new
//     flows get while its table is full, and whether the held ones still answer (gateway_flows.go).
//
// Results are printed and appended to BENCH.md with the date and the machine; --plots draws the
// scaling curves (full sync time and peak memory against the number of Services) as SVG. --quick
// (1,000 Services, fewer repetitions) finishes in about two minutes. It needs root.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// options of one run.
type options struct {
	sizes        []int
	reps         int // full syncs per size
	changes      int // incremental changes per kind
	nft          bool
	packets      packetOptions
	cpChanges    int
	cpBackground int
	sections     map[string]bool
	out          string
	plots        string
	kubeProxy    kubeProxyOptions
	labserver    string
	vipgate      string
	cpCompare    string
	churnRate    int
	churnTime    time.Duration
	gwPPS        gwPPSOptions
	gwTCP        gwTCPOptions
	gwCPS        gwCPSOptions
	gwFlows      gwFlowsOptions
	timeout      time.Duration
}

var allSections = []string{"sync", "incremental", "churn", "packets", "throughput", "controlplane", "gateway-pps", "gateway-tcp", "gateway-cps", "gateway-flows"}

// extraSections are valid for --only but not run by default: parts of a default section.
var extraSections = []string{"controlplane-kube"} // the kube-apiserver row of controlplane alone

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	sizes := fs.String("sizes", "1000,3000,10000,30000", "Service counts (x10 endpoints) for the full-sync rows")
	quick := fs.Bool("quick", false, "1,000 Services and fewer repetitions (about two minutes; --no-kube-proxy: one)")
	out := fs.String("out", "BENCH.md", "append the results to this file (\"\": print only)")
	plots := fs.String("plots", "", "draw the scaling curves as SVG files into this directory (\"\": none)")
	kubeProxy := fs.String("kube-proxy", defaultKubeProxy, "kube-proxy versions measured in the same run, comma-separated (have "+strings.Join(kubeProxyVersions(), ", ")+"; \"0\" or \"\": none)")
	noKubeProxy := fs.Bool("no-kube-proxy", false, "do not measure kube-proxy (quick runs)")
	kubeProxyBin := fs.String("kube-proxy-bin", "bin", "directory with kube-proxy-bench-<version> (`make bench` builds them; missing ones are built)")
	kubeProxyMax := fs.Int("kube-proxy-max", 10000, "largest size kube-proxy is measured at (10,000: ~30 s per run for v1.37.2)")
	noKubeProxyChurn := fs.Bool("no-kube-proxy-churn", false, "do not run the churn row for kube-proxy (it adds a full sync and --churn-time per version)")
	kubeProxyChanges := fs.Int("kube-proxy-changes", 5, "endpoints added one at a time after each kube-proxy full sync (each waits out its 1 s minSyncPeriod)")
	only := fs.String("only", strings.Join(allSections, ","), "sections to run")
	reps := fs.Int("reps", 3, "full syncs per size (the median is reported)")
	changes := fs.Int("changes", 100, "incremental changes of each kind")
	rounds := fs.Int("rounds", 9, "alternating rounds of the connection-rate measurements (9: on a shared 2-vCPU VM rounds vary by +-20%, and the median of 5 ratios still moved by 0.05 between runs)")
	connTime := fs.Duration("conn-time", 2*time.Second, "duration of one connection-rate sample")
	workers := fs.Int("conn-workers", 4, "parallel connection loops of the connection-rate generator")
	iperfTime := fs.Int("iperf-time", 5, "seconds per iperf3 run")
	iperfRuns := fs.Int("iperf-runs", 2, "iperf3 runs per path (the median is reported)")
	cpChanges := fs.Int("cp-changes", 20, "EndpointSlice files written in the control-plane test")
	cpBackground := fs.Int("cp-services", 10000, "background Services in the control-plane test's manifest directory")
	noNft := fs.Bool("no-nft", false, "skip the `nft -f` reference loads")
	labserver := fs.String("labserver", os.Getenv(lab.LabServerEnv), "labserver binary (default: $VIPGATE_LABSERVER, else built)")
	vipgate := fs.String("vipgate", os.Getenv("VIPGATE_BIN"), "vipgate binary (default: $VIPGATE_BIN, else built)")
	churnRate := fs.Int("churn-rate", 1000, "endpoint changes per second of the churn row")
	churnTime := fs.Duration("churn-time", time.Minute, "duration of the churn row (shorter for a quick run)")
	gwRounds := fs.Int("gw-rounds", 5, "alternating rounds of the gateway packet-rate row")
	gwTime := fs.Duration("gw-time", 2*time.Second, "duration of one gateway packet-rate sample (the generator's time bound)")
	gwCount := fs.Int("gw-count", 20_000_000, "packets at most per gateway packet-rate sample (the generator's count bound)")
	gwModes := fs.String("gw-modes", "route,nodePort,direct", "forwarding modes of `vipgate gateway` in the packet-rate row")
	gwTCPRounds := fs.Int("gw-tcp-rounds", 4, "alternating rounds of the gateway TCP row (even: each path as often first as last)")
	gwTCPTime := fs.Int("gw-tcp-time", 3, "seconds of one iperf3 run of the gateway TCP row")
	gwCPSRounds := fs.Int("gw-cps-rounds", 3, "alternating rounds of the gateway connection-rate row")
	gwCPSTime := fs.Duration("gw-cps-time", 2*time.Second, "duration of one gateway connection-rate sample")
	gwCPSConc := fs.Int("gw-cps-concurrency", 64, "connections open at once in the gateway connection-rate row")
	gwCPSLat := fs.Int("gw-cps-latency", 2000, "new connections (one at a time) and requests on one connection timed per path and round")
	gwCPSModes := fs.String("gw-cps-modes", "nodePort,direct", "forwarding modes of `vipgate gateway` in the connection-rate row (each with its NAT fast path on and off)")
	gwCPSProxies := fs.String("gw-cps-proxies", "haproxy,nginx", "proxies measured in the connection-rate row (haproxy, nginx; \"\": none)")
	gwFlows := fs.String("gw-flows", "100000,1000000", "concurrent flows held in the gateway flow-table row, comma-separated")
	gwFlowsPPS := fs.Int("gw-flows-pps", 100000, "datagrams per second at most of the flow-table row's generator")
	gwFlowsOverflow := fs.Int("gw-flows-overflow", 10000, "flows opened while the gateway's flow table is full")
	gwFlowsProbe := fs.Int("gw-flows-probe", 10000, "held flows asked again after the flow-table row's fill")
	gwCompare := fs.String("gw-compare", "", "a second vipgate binary whose route+fastPath is measured in the same rounds of the gateway packet-rate row (before / after a change)")
	cpCompare := fs.String("cp-compare", "", "a second vipgate binary measured in the kube-apiserver control-plane row of the same run, in ABBA turns (before / after a change)")
	timeout := fs.Duration("timeout", 45*time.Minute, "give up (and clean up) after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o := &options{reps: *reps, changes: *changes, nft: !*noNft, cpChanges: *cpChanges, cpBackground: *cpBackground,
		out: *out, plots: *plots, labserver: *labserver, vipgate: *vipgate, cpCompare: *cpCompare, churnRate: *churnRate, churnTime: *churnTime, timeout: *timeout, sections: map[string]bool{},
		packets: packetOptions{rounds: *rounds, connTime: *connTime, workers: *workers, iperfTime: *iperfTime, iperfRuns: *iperfRuns}}
	if *quick {
		// Flags given explicitly still win over the quick defaults.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quickDefaults := map[string]func(){
			"sizes":              func() { *sizes = "1000" },
			"reps":               func() { o.reps = 3 },
			"changes":            func() { o.changes = 20 },
			"rounds":             func() { o.packets.rounds = 3 },
			"conn-time":          func() { o.packets.connTime = time.Second },
			"iperf-time":         func() { o.packets.iperfTime = 2 },
			"iperf-runs":         func() { o.packets.iperfRuns = 1 },
			"cp-changes":         func() { o.cpChanges = 10 },
			"churn-time":         func() { o.churnTime = 10 * time.Second },
			"cp-services":        func() { o.cpBackground = 1000 },
			"timeout":            func() { o.timeout = 5 * time.Minute },
			"kube-proxy-changes": func() { *kubeProxyChanges = 3 },
			"gw-rounds":          func() { *gwRounds = 2 },
			"gw-time":            func() { *gwTime = time.Second },
			"gw-tcp-rounds":      func() { *gwTCPRounds = 2 },
			"gw-tcp-time":        func() { *gwTCPTime = 2 },
			"gw-cps-rounds":      func() { *gwCPSRounds = 2 },
			"gw-cps-time":        func() { *gwCPSTime = time.Second },
			"gw-cps-latency":     func() { *gwCPSLat = 1000 },
			"gw-flows":           func() { *gwFlows = "100000" },
		}
		for name, f := range quickDefaults {
			if !set[name] {
				f()
			}
		}
	}
	o.gwTCP = gwTCPOptions{rounds: *gwTCPRounds, seconds: *gwTCPTime}
	o.gwCPS = gwCPSOptions{rounds: *gwCPSRounds, sampleTime: *gwCPSTime, concurrency: *gwCPSConc, latConns: *gwCPSLat, latRR: *gwCPSLat}
	o.gwFlows = gwFlowsOptions{pps: *gwFlowsPPS, overflow: *gwFlowsOverflow, probe: *gwFlowsProbe}
	for _, s := range strings.Split(*gwFlows, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1000 || n > 1_000_000 {
			return nil, fmt.Errorf("--gw-flows: %q is not a count between 1000 and 1000000", s)
		}
		o.gwFlows.sizes = append(o.gwFlows.sizes, n)
	}
	for _, m := range strings.Split(*gwCPSModes, ",") {
		if m = strings.TrimSpace(m); m != "nodePort" && m != "direct" {
			return nil, fmt.Errorf("--gw-cps-modes: %q is not nodePort or direct", m)
		}
		o.gwCPS.modes = append(o.gwCPS.modes, m)
	}
	for _, p := range strings.FieldsFunc(*gwCPSProxies, func(r rune) bool { return r == ',' || r == ' ' }) {
		if p != "haproxy" && p != "nginx" {
			return nil, fmt.Errorf("--gw-cps-proxies: %q is not haproxy or nginx", p)
		}
		o.gwCPS.proxies = append(o.gwCPS.proxies, p)
	}
	o.gwPPS = gwPPSOptions{rounds: *gwRounds, sampleTime: *gwTime, maxCount: *gwCount, compare: *gwCompare}
	if *gwCompare != "" {
		if fi, err := os.Stat(*gwCompare); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("--gw-compare: %q is not an executable file", *gwCompare)
		}
	}
	for _, m := range strings.Split(*gwModes, ",") {
		m = strings.TrimSpace(m)
		if m != "route" && m != "nodePort" && m != "direct" {
			return nil, fmt.Errorf("--gw-modes: %q is not route, nodePort or direct", m)
		}
		o.gwPPS.modes = append(o.gwPPS.modes, m)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > maxServices {
			return nil, fmt.Errorf("--sizes: %q is not a count between 1 and %d", s, maxServices)
		}
		o.sizes = append(o.sizes, n)
	}
	slices.Sort(o.sizes)
	if !*noKubeProxy && *kubeProxy != "0" {
		for _, v := range strings.FieldsFunc(*kubeProxy, func(r rune) bool { return r == ',' || r == ' ' }) {
			if _, ok := kubeProxyBuild[v]; !ok {
				return nil, fmt.Errorf("--kube-proxy: no driver for %q (have %s)", v, strings.Join(kubeProxyVersions(), ", "))
			}
			o.kubeProxy.versions = append(o.kubeProxy.versions, v)
		}
	}
	o.kubeProxy.binDir, o.kubeProxy.maxServices, o.kubeProxy.changes, o.kubeProxy.reps = *kubeProxyBin, *kubeProxyMax, *kubeProxyChanges, o.reps
	o.kubeProxy.churn = !*noKubeProxyChurn
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSections, s) && !slices.Contains(extraSections, s) {
			return nil, fmt.Errorf("--only: unknown section %q (have %s)", s, strings.Join(append(slices.Clone(allSections), extraSections...), ", "))
		}
		o.sections[s] = true
	}
	switch {
	case o.reps < 1 || o.reps > 20:
		return nil, fmt.Errorf("--reps must be 1-20")
	case o.changes < 1 || o.changes > 10000:
		return nil, fmt.Errorf("--changes must be 1-10000")
	case o.packets.rounds < 1 || o.packets.rounds > 20:
		return nil, fmt.Errorf("--rounds must be 1-20")
	case o.packets.connTime <= 0 || o.packets.connTime > maxGeneratorTime:
		return nil, fmt.Errorf("--conn-time must be positive and at most %s", maxGeneratorTime)
	case o.packets.workers < 1 || o.packets.workers > 64:
		return nil, fmt.Errorf("--conn-workers must be 1-64")
	case o.packets.iperfTime < 1 || o.packets.iperfTime > 30:
		return nil, fmt.Errorf("--iperf-time must be 1-30 seconds")
	case o.packets.iperfRuns < 1 || o.packets.iperfRuns > 10:
		return nil, fmt.Errorf("--iperf-runs must be 1-10")
	case o.kubeProxy.changes < 0 || o.kubeProxy.changes > 100:
		return nil, fmt.Errorf("--kube-proxy-changes must be 0-100")
	case o.churnRate < 1 || o.churnRate > 100000:
		return nil, fmt.Errorf("--churn-rate must be 1-100000")
	case o.churnTime <= 0 || o.churnTime > 30*time.Minute:
		return nil, fmt.Errorf("--churn-time must be positive and at most 30m")
	case o.gwCPS.rounds < 1 || o.gwCPS.rounds > 20:
		return nil, fmt.Errorf("--gw-cps-rounds must be 1-20")
	case o.gwCPS.sampleTime <= 0 || o.gwCPS.sampleTime > maxGeneratorTime:
		return nil, fmt.Errorf("--gw-cps-time must be positive and at most %s", maxGeneratorTime)
	case o.gwCPS.concurrency < 1 || o.gwCPS.concurrency > 4096:
		return nil, fmt.Errorf("--gw-cps-concurrency must be 1-4096")
	case o.gwCPS.latConns < 10 || o.gwCPS.latConns > 100000:
		return nil, fmt.Errorf("--gw-cps-latency must be 10-100000")
	case o.gwFlows.pps < 1000 || o.gwFlows.pps > 1_000_000:
		return nil, fmt.Errorf("--gw-flows-pps must be 1000-1000000")
	case o.gwFlows.overflow < 1 || o.gwFlows.overflow > 20000:
		// The flows after the largest size must still have a source port (16 x 64,512 flows).
		return nil, fmt.Errorf("--gw-flows-overflow must be 1-20000")
	case o.gwFlows.probe < 1 || o.gwFlows.probe > 100000:
		return nil, fmt.Errorf("--gw-flows-probe must be 1-100000")
	case o.gwTCP.rounds < 1 || o.gwTCP.rounds > 20:
		return nil, fmt.Errorf("--gw-tcp-rounds must be 1-20")
	case o.gwTCP.seconds < 1 || o.gwTCP.seconds > 60:
		return nil, fmt.Errorf("--gw-tcp-time must be 1-60 seconds")
	case o.gwPPS.rounds < 1 || o.gwPPS.rounds > 20:
		return nil, fmt.Errorf("--gw-rounds must be 1-20")
	case o.gwPPS.sampleTime <= 0 || o.gwPPS.sampleTime > maxGeneratorTime:
		return nil, fmt.Errorf("--gw-time must be positive and at most %s", maxGeneratorTime)
	case o.gwPPS.maxCount < 1 || o.gwPPS.maxCount > 100_000_000:
		return nil, fmt.Errorf("--gw-count must be 1-100000000")
	case o.cpChanges < 1 || o.cpChanges > 200:
		return nil, fmt.Errorf("--cp-changes must be 1-200")
	case o.cpBackground < 0 || o.cpBackground > 17000:
		// Beyond ~17,000 the synthetic NodePorts leave the range `vipgate node` accepts.
		return nil, fmt.Errorf("--cp-services must be 0-17000")
	}
	// The incremental and per-packet figures are taken at 10,000 Services, or at the largest size
	// below that when the run is smaller (--quick).
	o.packets.many = o.sizes[0]
	for _, n := range o.sizes {
		if n <= 10000 {
			o.packets.many = n
		}
	}
	return o, nil
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] { // the traffic generators, run inside the client namespace
		case "connrate":
			os.Exit(connRateMain(os.Args[2:]))
		case "waitconn":
			os.Exit(waitConnMain(os.Args[2:]))
		case "udpsend":
			os.Exit(udpSendMain(os.Args[2:]))
		case "udpsink":
			os.Exit(udpSinkMain(os.Args[2:]))
		case "tcpgen":
			os.Exit(tcpGenMain(os.Args[2:]))
		case "tcpserve":
			os.Exit(tcpServeMain(os.Args[2:]))
		case "flowgen":
			os.Exit(flowGenMain(os.Args[2:]))
		case "udpecho":
			os.Exit(udpEchoMain(os.Args[2:]))
		}
	}
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (it creates network namespaces and programs nftables in them)")
		os.Exit(2)
	}
	// Clean up on ^C, on SIGTERM and when the whole run takes too long.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "bench: %v: cleaning up\n", s)
		case <-time.After(o.timeout):
			fmt.Fprintf(os.Stderr, "bench: still running after --timeout %s: cleaning up\n", o.timeout)
		}
		runCleanups()
		os.Exit(1)
	}()
	code := run(o)
	runCleanups()
	os.Exit(code)
}

func run(o *options) int {
	started := time.Now()
	machine := machineInfo()
	fmt.Println("machine:", machine)
	t := &table{}
	m := mixOf(synthState(1000, 10))
	fmt.Println("Service mix:", m)
	kp := newKubeProxyBench(o.kubeProxy)

	if o.sections["sync"] {
		for _, n := range o.sizes {
			fullSync(t, n, o.reps, o.nft, kp.at(t, n))
		}
	}
	if o.sections["incremental"] {
		incremental(t, o.packets.many, o.changes, kp.at(t, o.packets.many))
	}
	if o.sections["churn"] {
		churn(t, o.packets.many, o.churnRate, o.churnTime, kp)
	}
	if o.sections["packets"] || o.sections["throughput"] || o.sections["controlplane"] || o.sections["controlplane-kube"] {
		labRows(t, o)
	}

	if o.sections["gateway-pps"] {
		gatewayPPS(t, o.vipgate, o.gwPPS)
	}
	if o.sections["gateway-tcp"] {
		gatewayTCP(t, o.vipgate, o.gwTCP)
	}
	if o.sections["gateway-cps"] {
		gatewayCPS(t, o.vipgate, o.gwCPS)
	}
	if o.sections["gateway-flows"] {
		gatewayFlows(t, o.vipgate, o.gwFlows)
	}

	md := t.markdown()
	fmt.Println()
	fmt.Println(md)
	var plots []string
	if o.plots != "" {
		var err error
		if plots, err = t.scaling.draw(o.plots, time.Now().UTC().Format("2006-01-02")); err != nil {
			fmt.Fprintln(os.Stderr, "bench: drawing the plots:", err)
			t.failed = true
		}
		if t.gwCPS != nil {
			if p, err := t.gwCPS.draw(o.plots, time.Now().UTC().Format("2006-01-02")); err != nil {
				fmt.Fprintln(os.Stderr, "bench: drawing the gateway plot:", err)
				t.failed = true
			} else if p != "" {
				plots = append(plots, p)
			}
		}
		for _, p := range plots {
			fmt.Println("drew", p)
		}
	}
	if o.out != "" {
		if err := appendResults(o, machine, m, md, plots, time.Since(started)); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		fmt.Println("appended to", o.out)
	}
	if t.failed {
		return 1
	}
	return 0
}

// labRows runs the measurements that need the netns lab.
func labRows(t *table, o *options) {
	pl, err := newPacketLab(o.labserver)
	if err != nil {
		t.fail("netns lab", err)
		return
	}
	if o.sections["packets"] {
		perPacket(t, pl, o.packets)
	}
	if o.sections["throughput"] {
		throughput(t, pl, o.packets)
	}
	if o.sections["controlplane"] || o.sections["controlplane-kube"] {
		bin, err := vipgateBinary(o.vipgate)
		if err != nil {
			t.fail("control plane to data plane", err)
		} else {
			if o.sections["controlplane"] {
				controlPlane(t, pl, bin, o.cpBackground, o.cpChanges)
			}
			controlPlaneKube(t, pl, bin, o.cpCompare, o.cpBackground, o.cpChanges)
		}
	}
}

// vipgateBinary returns the given binary, or builds cmd/vipgate.
func vipgateBinary(path string) (string, error) {
	if path != "" {
		return filepath.Abs(path)
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-bin-", os.Getpid()))
	if err != nil {
		return "", err
	}
	atExit(func() { os.RemoveAll(dir) })
	out := filepath.Join(dir, "vipgate")
	fmt.Println("building cmd/vipgate (set VIPGATE_BIN to skip)")
	if err := lab.BuildBinary("github.com/vipgate/vipgate/cmd/vipgate", out); err != nil {
		return "", err
	}
	return out, nil
}

// appendResults appends a dated section to the results file.
func appendResults(o *options, machine string, m mix, md string, plots []string, took time.Duration) error {
	f, err := os.OpenFile(o.out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s: %w", o.out, err)
	}
	defer f.Close()
	sizes := make([]string, len(o.sizes))
	for i, n := range o.sizes {
		sizes[i] = strconv.Itoa(n)
	}
	kubeProxy := "not measured (--no-kube-proxy)"
	if len(o.kubeProxy.versions) > 0 {
		kubeProxy = fmt.Sprintf("nftables proxier %s, measured in this run up to %s Services (test/bench/kubeproxy)",
			strings.Join(o.kubeProxy.versions, ", "), thousands(o.kubeProxy.maxServices))
	}
	links := ""
	if len(plots) > 0 {
		base := filepath.Dir(o.out)
		var ls []string
		for _, p := range plots {
			rel, err := filepath.Rel(base, p)
			if err != nil {
				rel = p
			}
			ls = append(ls, fmt.Sprintf("[%s](%s)", strings.TrimSuffix(filepath.Base(p), ".svg"), filepath.ToSlash(rel)))
		}
		links = "Plots: " + strings.Join(ls, ", ") + ".  \n"
	}
	_, err = fmt.Fprintf(f, "\n## %s\n\nMachine: %s.  \nCommand: `go run ./test/bench %s` (took %s).  \nService mix: %s.  \nkube-proxy: %s.  \n%s\n%s",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine, strings.Join(os.Args[1:], " "), took.Round(time.Second), m, kubeProxy, links, md)
	if err != nil {
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	return nil
}
