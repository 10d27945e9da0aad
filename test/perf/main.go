// Command perf is `make bench`: it measures vipgate's dataplane in throwaway network namespaces and
// prints one table (and appends it to BENCH.md).
//
//	go run ./test/perf [--sizes 1000,10000,30000] [--changes 100] [--quick] [--out BENCH.md]
//
// It needs root, touches only namespaces it creates (vg<pid>-…, removed on exit) and bounds every
// traffic generator in time.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/test/lab"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "connloop" {
		os.Exit(connLoop(os.Args[2:]))
	}
	sizes := flag.String("sizes", "1000,10000,30000", "Service counts for the full-sync rows (x10 endpoints)")
	changes := flag.Int("changes", 100, "incremental changes per kind at 10,000 Services")
	quick := flag.Bool("quick", false, "1,000 Services only and fewer repetitions (about a minute)")
	out := flag.String("out", "BENCH.md", "append the results here (empty: don't)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "perf: needs root (it creates network namespaces)")
		os.Exit(2)
	}
	if *quick {
		*sizes, *changes = "1000", 20
	}
	var rows [][2]string
	add := func(k, v string) {
		rows = append(rows, [2]string{k, v})
		fmt.Printf("%-78s %s\n", k, v)
	}
	fmt.Println(machine())
	incrSize := 0
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n > 100000 {
			fatal(fmt.Errorf("bad size %q", s))
		}
		fullSync(n, add)
		if n <= 10000 {
			incrSize = max(incrSize, n) // the size: 10,000, or the largest below it
		}
	}
	if incrSize == 0 {
		incrSize = 1000
	}
	incremental(incrSize, *changes, add)
	if err := packets(*quick, add); err != nil {
		add("packet tests", "FAILED: "+err.Error())
	}
	table := renderTable(rows)
	fmt.Println()
	fmt.Println(table)
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fatal(err)
		}
		fmt.Fprintf(f, "\n## %s\n\n%s\n\n%s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine(), table)
		f.Close()
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "perf:", err)
	os.Exit(1)
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("machine: %s, %d CPUs, kernel %s, %s", cpu, runtime.NumCPU(), strings.TrimSpace(string(kernel)), runtime.Version())
}

func renderTable(rows [][2]string) string {
	var b strings.Builder
	b.WriteString("| measurement | result |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	return b.String()
}

// netns is a throwaway namespace with an open fd for the netlink edge.
type netns struct {
	name string
	f    *os.File
}

var nsSeq int

func newNetns() *netns {
	nsSeq++
	name := fmt.Sprintf("vg%d-perf%d", os.Getpid(), nsSeq)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		fatal(fmt.Errorf("ip netns add: %v: %s", err, out))
	}
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		fatal(err)
	}
	return &netns{name, f}
}

func (n *netns) close() {
	n.f.Close()
	exec.Command("ip", "netns", "del", n.name).Run()
}

func perfConfig() proxy.Config {
	return proxy.Config{
		NodeName:     "node1",
		NodeIPs:      []netipAddr{mustAddr("192.0.2.11")},
		ClusterCIDRs: []netipPrefix{mustPrefix("10.244.0.0/16")},
		ServiceCIDRs: []netipPrefix{mustPrefix("10.96.0.0/16")},
		NodePortIPs:  []netipAddr{mustAddr("192.0.2.11")},
		Families:     []cluster.Family{cluster.IPv4},
	}
}

func rssMiB() float64 {
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

func fullSync(n int, add func(k, v string)) {
	ns := newNetns()
	defer ns.close()
	st := proxy.SyntheticState(n, 10)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(ns.f.Fd())}
	defer prog.Close() // its kept socket holds the netns
	p := proxy.NewProxier(hclog.NewNullLogger(), perfConfig(), prog)
	start := time.Now()
	if _, err := p.Sync(st); err != nil {
		fatal(err)
	}
	d := time.Since(start)
	flat := p.Flatten(cluster.IPv4)
	elements, rules := 0, 0
	for _, els := range flat.Elements {
		elements += len(els)
	}
	for _, c := range flat.Chains {
		rules += len(c.Rules)
	}
	add(fmt.Sprintf("full sync into the kernel, %d Services x 10 endpoints", n), fmt.Sprintf("%.0f ms", ms(d)))
	add(fmt.Sprintf("  programmed at %d Services: chains / rules / set elements", n), fmt.Sprintf("%d / %d / %d", len(flat.Chains), rules, elements))
	add(fmt.Sprintf("  process RSS holding %d Services x 10 endpoints (after GC)", n), fmt.Sprintf("%.0f MiB", rssMiB()))
	runtime.KeepAlive(p)
	runtime.KeepAlive(st)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// incremental measures the time from a model change to the kernel's ack, at n Services.
func incremental(n, changes int, add func(k, v string)) {
	ns := newNetns()
	defer ns.close()
	st := proxy.SyntheticState(n, 10)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(ns.f.Fd())}
	defer prog.Close() // its kept socket holds the netns
	p := proxy.NewProxier(hclog.NewNullLogger(), perfConfig(), prog)
	if _, err := p.Sync(st); err != nil {
		fatal(err)
	}
	run := func(name string, change func(i int)) {
		var ds []time.Duration
		for i := 0; i < changes; i++ {
			change(i)
			start := time.Now()
			if _, err := p.Sync(st); err != nil {
				fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		add(fmt.Sprintf("%s at %d Services, model change to kernel ack (p50 / p99 of %d)", name, n, changes),
			fmt.Sprintf("%.1f / %.1f ms", ms(pct(ds, 0.5)), ms(pct(ds, 0.99))))
	}
	key := func(i int) cluster.ServiceKey {
		return cluster.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i%n)}
	}
	// Remove the last endpoint of a Service, then add it back (each is one change).
	saved := map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	run("one endpoint removed", func(i int) {
		k := key(i * 7)
		saved[k] = st.EndpointSlices[k]
		es := *st.EndpointSlices[k][0]
		es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
		st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
	})
	run("one endpoint added", func(i int) {
		k := key(i * 7)
		st.EndpointSlices[k] = saved[k]
	})
	extra := proxy.SyntheticState(n+changes, 10)
	run("one Service added", func(i int) {
		k := cluster.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", n+i)}
		st.Services[k] = extra.Services[k]
		st.EndpointSlices[k] = extra.EndpointSlices[k]
	})
	run("one Service deleted", func(i int) {
		k := cluster.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", n+i)}
		delete(st.Services, k)
		delete(st.EndpointSlices, k)
	})
}

// packets measures per-packet cost (new TCP connections per second through a ClusterIP and a
// NodePort with 1 and with 10,000 Services) and throughput VIP vs direct, in a netns lab.
func packets(quick bool, add func(k, v string)) error {
	l, err := lab.New(lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{{Name: "node1", Pods: []string{"pod1"}}}}, func(string, ...any) {})
	if err != nil {
		return err
	}
	defer l.Close()
	node, pod := l.Node("node1"), l.Pod("pod1")
	// Tens of thousands of short connections to one address: let the client reuse TIME_WAIT ports,
	// or it runs out of them and the rate measures port exhaustion instead of the dataplane.
	if out, err := l.Exec("client", "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000"); err != nil {
		return fmt.Errorf("client sysctls: %v: %s", err, out)
	}
	fd, err := os.Open("/run/netns/" + node.NS)
	if err != nil {
		return err
	}
	defer fd.Close()
	cfg := perfConfig()
	cfg.NodeIPs, cfg.NodePortIPs = []netipAddr{node.IPv4}, []netipAddr{node.IPv4}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(fd.Fd())}
	defer prog.Close() // its kept socket holds the netns
	for _, p := range []string{"10.96.0.0/16", "203.0.113.0/24"} {
		if err := l.AddRoute(mustPrefix(p), "node1"); err != nil {
			return err
		}
	}
	if err := l.AddRoute(node.PodCIDRv4, "node1"); err != nil {
		return err
	}
	// The measured Service is svc-00005 (a NodePort one): ClusterIP 10.96.0.5, NodePort 30005,
	// endpoint pod1:8080. The other Services point at pods that do not exist: they only fill maps.
	state := func(n int) *cluster.State {
		st := proxy.SyntheticState(n, 10)
		k := cluster.ServiceKey{Namespace: "bench", Name: "svc-00005"}
		es := *st.EndpointSlices[k][0]
		es.Endpoints = []cluster.Endpoint{{Addresses: []netipAddr{pod.IPv4}, Ready: true, Serving: true, NodeName: "node1"}}
		st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
		return st
	}
	dur := 2 * time.Second
	if quick {
		dur = time.Second
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	rate := func(addr string) (float64, error) {
		out, err := l.Exec("client", self, "connloop", "--addr", addr, "--duration", dur.String())
		if err != nil {
			return 0, fmt.Errorf("connloop %s: %v: %s", addr, err, out)
		}
		return strconv.ParseFloat(strings.TrimSpace(out), 64)
	}
	// Three rounds, alternating few and many Services, median per configuration: connection rates
	// on a shared 2-CPU VM move by 10-20% from one second to the next.
	samples := map[string][]float64{}
	for round := 0; round < 3; round++ {
		for _, n := range []int{6, 10000} {
			p := proxy.NewProxier(hclog.NewNullLogger(), cfg, prog)
			if _, err := p.Sync(state(n)); err != nil {
				return err
			}
			for _, t := range []struct{ name, addr string }{{"ClusterIP", "10.96.0.5:80"}, {"NodePort", node.IPv4.String() + ":30005"}} {
				r, err := rate(t.addr)
				if err != nil {
					return err
				}
				k := fmt.Sprintf("%s/%d", t.name, n)
				samples[k] = append(samples[k], r)
			}
		}
	}
	results := map[string]float64{}
	for k, v := range samples {
		slices.Sort(v)
		results[k] = v[len(v)/2]
	}
	for _, name := range []string{"ClusterIP", "NodePort"} {
		small, big := results[name+"/6"], results[name+"/10000"]
		add(fmt.Sprintf("new TCP connections/s through a %s: few Services / 10,000 Services (ratio, target >= 0.95)", name),
			fmt.Sprintf("%.0f / %.0f (%.2f)", small, big, big/small))
	}
	direct, err := rate(pod.IPv4.String() + ":8080")
	if err != nil {
		return err
	}
	viaVIP := results["ClusterIP/10000"]
	add("new TCP connections/s client -> ClusterIP -> pod vs client -> pod directly (ratio)", fmt.Sprintf("%.0f / %.0f (%.2f)", viaVIP, direct, viaVIP/direct))

	// Throughput with iperf3 (bounded: -t seconds), through the ClusterIP (a DNAT to pod:5201) and
	// directly to the pod.
	if _, err := exec.LookPath("iperf3"); err != nil {
		add("throughput", "skipped: iperf3 not installed")
		return nil
	}
	srv, err := l.Start("pod1", filepath.Join(l.Dir(), "iperf3.log"), "iperf3", "-s", "-p", "5201")
	if err != nil {
		return err
	}
	defer srv.Stop()
	st := state(10000)
	k := cluster.ServiceKey{Namespace: "bench", Name: "svc-00005"}
	svc := *st.Services[k]
	svc.Ports = []cluster.ServicePort{{Protocol: cluster.TCP, Port: 5201, NodePort: 30005}}
	st.Services[k] = &svc
	es := *st.EndpointSlices[k][0]
	es.Ports = []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 5201}}
	st.EndpointSlices[k] = []*cluster.EndpointSlice{&es}
	p := proxy.NewProxier(hclog.NewNullLogger(), cfg, prog)
	if _, err := p.Sync(st); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	secs := "5"
	if quick {
		secs = "2"
	}
	bw := func(host string) (float64, error) {
		out, err := l.Exec("client", "iperf3", "-c", host, "-p", "5201", "-t", secs, "-f", "g")
		if err != nil {
			return 0, fmt.Errorf("iperf3 to %s: %v: %s", host, err, out)
		}
		return parseIperf(out)
	}
	vip, err := bw("10.96.0.5")
	if err != nil {
		return err
	}
	dir, err := bw(pod.IPv4.String())
	if err != nil {
		return err
	}
	add("throughput client -> ClusterIP -> pod vs client -> pod directly, iperf3 (ratio, target >= 0.95)", fmt.Sprintf("%.1f / %.1f Gbit/s (%.2f)", vip, dir, vip/dir))
	return nil
}

func parseIperf(out string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "receiver") {
			f := strings.Fields(l)
			for i, w := range f {
				if w == "Gbits/sec" && i > 0 {
					return strconv.ParseFloat(f[i-1], 64)
				}
			}
		}
	}
	return 0, fmt.Errorf("no receiver line in iperf3 output:\n%s", out)
}

// connLoop opens TCP connections one after another for a while (reading the lab server's reply
// line each time) and prints the rate. It runs inside the client namespace.
func connLoop(args []string) int {
	fs := flag.NewFlagSet("connloop", flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port")
	d := fs.Duration("duration", 3*time.Second, "how long (at most 30s)")
	if err := fs.Parse(args); err != nil || *addr == "" || *d <= 0 || *d > 30*time.Second {
		return 2
	}
	n := 0
	end := time.Now().Add(*d)
	start := time.Now()
	for time.Now().Before(end) {
		c, err := net.DialTimeout("tcp", *addr, time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, "connloop:", err)
			return 1
		}
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil && err != io.EOF {
			c.Close()
			fmt.Fprintln(os.Stderr, "connloop:", err)
			return 1
		}
		c.Close()
		n++
	}
	fmt.Printf("%.1f\n", float64(n)/time.Since(start).Seconds())
	return 0
}
