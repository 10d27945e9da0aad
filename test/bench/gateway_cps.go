package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// The gateway connection-rate row (--only gateway-cps, issue #33): short TCP connections (one
// request each) through the gateway namespace of the small-packet row's lab (gateway.go), side by
// side in alternating rounds of one run:
//
//   - plain: the gateway namespace routing, no table (to the node's address);
//   - `vipgate gateway` in each mode of --gw-cps-modes with its NAT fast path (tc BPF, the default)
//     and without it (nftables only: conntrack's DNAT, and masquerade for nodePort), to the VIP;
//   - HAProxy 2.6 in TCP mode and nginx's stream proxy, each a process in the gateway namespace
//     (config files in the run's temp directory; never a system service), listening on
//     gwProxyVIP and connecting to the node's address, as nodePort forwarding does;
//   - the generator's ceiling: sender to server over one veth, no gateway.
//
// For each: new connections per second with --gw-cps-concurrency connections open at once over two
// generator threads (tcpgen.go: epoll, raw syscalls), the CPU time of the lab's processes per
// connection (generator, server, proxy: on veth the softirq that carries a packet through the
// gateway namespace runs on the sending process's thread and is charged to it, so this is the whole
// path's cost, and little moved by other load on the machine), the latency of a new connection
// (connect to answer, one at a time) and of a request/response on one open connection, p50/p99,
// and what the gateway adds to each over the plain hop (paired by round). Everything shares the
// machine's CPUs: the generator, the server and the gateway or proxy alike (HAProxy nbthread 2,
// nginx 2 workers, on the same 2 vCPUs). The ceiling row says how close the plain hop runs to what
// the generator and server can do with no gateway at all.

const (
	gwHAProxyPort = 30081
	gwNginxPort   = 30082
)

// gwProxyVIP is the proxies' listening address, on the gateway namespace's loopback.
var gwProxyVIP = netip.MustParseAddr("203.0.113.51")

// gwProxySource is the proxies' source address towards the node, a second address of the gateway
// namespace's node-side port. Not the gateway's own (192.0.2.100): the server closes first, so
// its TIME_WAIT sockets hold the tuples of recent connections, and a SYN that reuses one is
// accepted only with a newer TCP timestamp. The proxies' connections carry the gateway host's
// timestamp clock, nodePort's masqueraded ones the client's: sharing an address, a masqueraded
// SYN after a proxy run meets a TIME_WAIT whose timestamps run ahead, is dropped and retried
// after 1 s (what any NAT of several hosts onto one address does with a server that closes
// first; here it would charge the proxies' traffic to vipgate).
var gwProxySource = netip.MustParseAddr("192.0.2.101")

// gwCPSOptions bound the row.
type gwCPSOptions struct {
	rounds      int
	sampleTime  time.Duration // one connection-rate sample
	concurrency int           // connections open at once
	latConns    int           // new connections, one at a time, for their latency
	latRR       int           // requests on one connection, for their latency
	modes       []string      // vipgate's forwarding modes (nodePort, direct), each with its fast path on and off
	proxies     []string      // haproxy, nginx
}

// cpsSample is one round of one path.
type cpsSample struct {
	rate       float64 // connections per second
	conns      float64 // connections of the rate sample
	cpuPerConn float64 // ns of the lab's processes' CPU per connection
	errors     int
	connP50    float64 // ns: a new connection, connect to answer
	connP99    float64
	rrP50      float64 // ns: a request on an open connection
	rrP99      float64
	// The NAT fast path's counters over the rate sample (vipgate with natFastPath only): flows it
	// took, and new flows it left to the stack for want of a masquerade port or table room.
	fastNew, snatFull, tableFull float64
	fast                         bool
	// ctCount is the gateway namespace's conntrack entries after the rate sample.
	ctCount int
}

// cpsTarget is one measured path.
type cpsTarget struct {
	name  string // the row's name
	fwd   string // vipgate's forwarding mode ("" none)
	proxy string // haproxy, nginx ("" none)
	dst   netip.AddrPort
	snd   string // the sender's device whose rate is the ceiling ("": through the gateway)
}

// gwProxy is a proxy process in the gateway namespace.
type gwProxy struct {
	pid  int
	stop func()
}

// haproxyConfig is HAProxy's config: TCP mode, one backend (the node's address), two threads,
// nothing logged.
func haproxyConfig(listen, backend netip.AddrPort, source netip.Addr) string {
	return fmt.Sprintf(`global
	nbthread 2
	maxconn 5000

defaults
	mode tcp
	timeout connect 5s
	timeout client 30s
	timeout server 30s

frontend vip
	bind %s
	default_backend nodes

backend nodes
	server node1 %s source %s
`, listen, backend, source)
}

// nginxConfig is nginx's config: the stream module, one upstream, two workers, files in dir.
func nginxConfig(dir string, listen, backend netip.AddrPort, source netip.Addr) string {
	return fmt.Sprintf(`daemon off;
master_process on;
worker_processes 2;
worker_rlimit_nofile 16000;
pid %s;
error_log %s warn;
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
events {
	worker_connections 8000;
}
stream {
	server {
		listen %s;
		proxy_pass %s;
		proxy_bind %s;
	}
}
`, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "nginx-error.log"), listen, backend, source)
}

// startProxy runs HAProxy or nginx in the gateway namespace and waits until it listens.
func (g *gwLab) startProxy(kind string) (*gwProxy, error) {
	backend := netip.AddrPortFrom(gwPPSNodeIP, gwPPSPort)
	var args []string
	var port uint16
	switch kind {
	case "haproxy":
		port = gwHAProxyPort
		cfg := filepath.Join(g.dir, "haproxy.cfg")
		if err := os.WriteFile(cfg, []byte(haproxyConfig(netip.AddrPortFrom(gwProxyVIP, port), backend, gwProxySource)), 0o644); err != nil {
			return nil, err
		}
		args = []string{"haproxy", "-db", "-f", cfg}
	case "nginx":
		port = gwNginxPort
		cfg := filepath.Join(g.dir, "nginx.conf")
		if err := os.WriteFile(cfg, []byte(nginxConfig(g.dir, netip.AddrPortFrom(gwProxyVIP, port), backend, gwProxySource)), 0o644); err != nil {
			return nil, err
		}
		args = []string{"nginx", "-c", cfg, "-p", g.dir, "-e", filepath.Join(g.dir, "nginx-error.log")}
	default:
		return nil, fmt.Errorf("no proxy %q", kind)
	}
	if _, err := exec.LookPath(args[0]); err != nil {
		return nil, fmt.Errorf("%s is not installed (`make deps` installs it): %w", args[0], err)
	}
	logFile := filepath.Join(g.dir, kind+".log")
	log, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", g.gw.name}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// `ip netns exec` execs the proxy: the PID is HAProxy's, or nginx's master.
	stop := atExit(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
	})
	want := netip.AddrPortFrom(gwProxyVIP, port).String()
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := exec.Command("ip", "netns", "exec", g.gw.name, "ss", "-Hltn").Output()
		if strings.Contains(string(out), want) {
			return &gwProxy{pid: cmd.Process.Pid, stop: stop}, nil
		}
		select {
		case <-exited:
			stop()
			return nil, fmt.Errorf("%s exited: %s", kind, oneLine(tailFile(logFile, 5)))
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("%s does not listen on %s after 10 s: %s", kind, want, oneLine(tailFile(logFile, 5)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startTCPServer runs `bench tcpserve` in the node namespace for at most maxTime; it returns its
// PID (for its CPU time) and its stop function.
func (g *gwLab) startTCPServer(maxTime time.Duration) (int, func(), error) {
	return startReady(exec.Command("ip", "netns", "exec", g.node.name, g.self, "tcpserve", "--port", strconv.Itoa(gwPPSPort),
		"--threads", "2", "--max-time", maxTime.String()), "tcpserve")
}

// tcpgen runs the generator in the sender namespace.
func (g *gwLab) tcpgen(dst netip.AddrPort, args ...string) (tcpGenResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), maxGeneratorTime+20*time.Second)
	defer cancel()
	full := append([]string{"netns", "exec", g.snd.name, g.self, "tcpgen", "--dst", dst.String()}, args...)
	out, err := exec.CommandContext(ctx, "ip", full...).CombinedOutput()
	if err != nil {
		return tcpGenResult{}, fmt.Errorf("tcpgen %s to %s: %v: %s", strings.Join(args, " "), dst, err, oneLine(string(out)))
	}
	return parseTCPGen(string(out))
}

// metrics fetches the gateway's /metrics inside its namespace (cluster.DefaultMetricsBindAddress).
// The connection is made on a thread in the namespace and read outside it.
func (g *gwLab) metrics() (string, error) {
	var c net.Conn
	err := lab.InNetns(g.gw.name, func() error {
		var err error
		c, err = net.DialTimeout("tcp", "127.0.0.1:10249", 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 16<<20))
	return string(b), err
}

// natCounters reads the NAT fast path's packet counters from the gateway's /metrics.
func (g *gwLab) natCounters() (map[string]float64, error) {
	text, err := g.metrics()
	if err != nil {
		return nil, err
	}
	return parseCounters(text, "vipgate_gateway_nat_fast_path_packets_total", "what"), nil
}

// conntrackCount is the number of conntrack entries in a namespace.
func conntrackCount(ns string) int {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/netfilter/nf_conntrack_count").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// cpsSampleOf measures one path: a warm-up, the rate (with the CPU of the lab's processes), then
// the two latencies.
func (g *gwLab) cpsSampleOf(tg cpsTarget, o gwCPSOptions, serverPID int, proxy *gwProxy) (cpsSample, error) {
	var s cpsSample
	if _, err := g.tcpgen(tg.dst, "--mode", "conns", "--duration", "200ms", "--concurrency", "8", "--threads", "1"); err != nil {
		return s, err
	}
	cpuOf := func() time.Duration {
		total, _ := procTreeCPU(serverPID)
		if proxy != nil {
			c, _ := procTreeCPU(proxy.pid)
			total += c
		}
		return total
	}
	var c0 map[string]float64
	if tg.fwd != "" && strings.HasSuffix(tg.fwd, "+fastPath") {
		s.fast = true
		var err error
		if c0, err = g.natCounters(); err != nil {
			return s, fmt.Errorf("the gateway's counters: %w", err)
		}
	}
	cpu0 := cpuOf()
	r, err := g.tcpgen(tg.dst, "--mode", "conns", "--duration", o.sampleTime.String(),
		"--concurrency", strconv.Itoa(o.concurrency), "--threads", "2")
	if err != nil {
		return s, err
	}
	cpu := cpuOf() - cpu0 + r.cpu
	if r.done == 0 {
		return s, fmt.Errorf("no connection completed (%d errors: %s)", r.errors, r.firstError)
	}
	s.rate, s.conns = float64(r.done)/r.elapsed.Seconds(), float64(r.done)
	s.cpuPerConn = float64(cpu.Nanoseconds()) / float64(r.done)
	s.errors = r.errors
	if s.fast {
		c1, err := g.natCounters()
		if err != nil {
			return s, fmt.Errorf("the gateway's counters: %w", err)
		}
		s.fastNew, s.snatFull, s.tableFull = c1["new"]-c0["new"], c1["snat_full"]-c0["snat_full"], c1["full"]-c0["full"]
	}
	if tg.snd == "" {
		s.ctCount = conntrackCount(g.gw.name)
	}
	lc, err := g.tcpgen(tg.dst, "--mode", "conns", "--duration", "5s", "--count", strconv.Itoa(o.latConns), "--concurrency", "1", "--threads", "1")
	if err != nil {
		return s, err
	}
	rr, err := g.tcpgen(tg.dst, "--mode", "rr", "--duration", "5s", "--count", strconv.Itoa(o.latRR))
	if err != nil {
		return s, err
	}
	if lc.done == 0 || rr.done == 0 {
		return s, fmt.Errorf("latency runs: %d connections (%s), %d requests (%s)", lc.done, lc.firstError, rr.done, rr.firstError)
	}
	s.connP50, s.connP99 = float64(lc.p50), float64(lc.p99)
	s.rrP50, s.rrP99 = float64(rr.p50), float64(rr.p99)
	return s, nil
}

// cpsTargets lists the row's paths in measuring order.
func cpsTargets(o gwCPSOptions) []cpsTarget {
	vip := netip.AddrPortFrom(gwPPSVIP, gwPPSPort)
	ts := []cpsTarget{{name: "plain", dst: netip.AddrPortFrom(gwPPSNodeIP, gwPPSPort)}}
	for _, m := range o.modes {
		ts = append(ts, cpsTarget{name: withFastPath(m), fwd: withFastPath(m), dst: vip}, cpsTarget{name: m, fwd: m, dst: vip})
	}
	for _, p := range o.proxies {
		port := map[string]uint16{"haproxy": gwHAProxyPort, "nginx": gwNginxPort}[p]
		ts = append(ts, cpsTarget{name: p, proxy: p, dst: netip.AddrPortFrom(gwProxyVIP, port)})
	}
	return ts
}

// cpsLabel names a path in the rows.
func cpsLabel(name string) string {
	switch {
	case name == "plain":
		return "plainly routed (no table)"
	case name == "ceiling":
		return "no gateway (sender -> server over one veth)"
	case name == "haproxy":
		return "HAProxy 2.6, mode tcp (nbthread 2)"
	case name == "nginx":
		return "nginx 1.22 stream proxy (2 workers)"
	case strings.HasSuffix(name, "+fastPath"):
		return "vipgate " + strings.TrimSuffix(name, "+fastPath") + ", NAT fast path (tc BPF; the default)"
	}
	return "vipgate " + name + ", nftables only (conntrack)"
}

// gatewayCPS is the row.
func gatewayCPS(t *table, vipgateFlag string, o gwCPSOptions) {
	what := fmt.Sprintf("gateway connection rate: new TCP connections, one request each (%d-byte request, %d-byte answer, the server closes), %d open at once, through the gateway namespace (median of %d rounds x %v, alternating)",
		tcpReqSize, tcpRespSize, o.concurrency, o.rounds, o.sampleTime)
	g, err := openGwLab(vipgateFlag)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer g.close()
	// Inside the lab's namespaces: the whole port range for the client and the proxies' backend
	// connections, TIME_WAIT ports reusable; the proxies' address on the gateway's loopback.
	for _, ns := range []string{g.snd.name, g.gw.name} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1").CombinedOutput(); err != nil {
			t.fail(what, fmt.Errorf("netns %s: sysctl: %v: %s", ns, err, out))
			return
		}
	}
	for _, a := range [][]string{{gwProxyVIP.String() + "/32", "lo"}, {gwProxySource.String() + "/24", "n0"}} {
		if out, err := exec.Command("ip", "-n", g.gw.name, "addr", "add", a[0], "dev", a[1]).CombinedOutput(); err != nil {
			t.fail(what, fmt.Errorf("netns %s: the proxies' addresses: %v: %s", g.gw.name, err, out))
			return
		}
	}
	targets := cpsTargets(o)
	perSample := o.sampleTime + 15*time.Second
	budget := time.Duration(o.rounds*(len(targets)+1))*perSample + time.Minute
	serverPID, stopServer, err := g.startTCPServer(budget)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer stopServer()
	proxies := map[string]*gwProxy{}
	for _, p := range o.proxies {
		px, err := g.startProxy(p)
		if err != nil {
			t.fail(what+" ("+p+")", err)
			return
		}
		defer px.stop()
		proxies[p] = px
	}
	samples := map[string][]cpsSample{}
	for r := 0; r < o.rounds; r++ {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		// The generator and server with no gateway, once per round.
		order = append([]cpsTarget{{name: "ceiling", dst: netip.AddrPortFrom(gwPPSDirect, gwPPSPort), snd: "d0"}}, order...)
		for _, tg := range order {
			if tg.fwd != "" {
				err = g.startGateway(tg.fwd, "")
			} else {
				g.stopGateway()
			}
			if err != nil {
				t.fail(what, err)
				return
			}
			s, err := g.cpsSampleOf(tg, o, serverPID, proxies[tg.proxy])
			if err != nil {
				t.fail(what+" ("+tg.name+")", err)
				return
			}
			fmt.Printf("      round %d %s: %.0f conn/s, %.1f µs CPU/conn, conn p50/p99 %.1f/%.1f µs, rr p50/p99 %.1f/%.1f µs\n",
				r+1, tg.name, s.rate, s.cpuPerConn/1e3, s.connP50/1e3, s.connP99/1e3, s.rrP50/1e3, s.rrP99/1e3)
			samples[tg.name] = append(samples[tg.name], s)
		}
		g.stopGateway()
	}
	names := []string{"ceiling"}
	for _, tg := range targets {
		names = append(names, tg.name)
	}
	cpsRows(t, what, names, samples)
	t.extra = append(t.extra, cpsSummary(names, samples, time.Now().UTC()))
	t.gwCPS = cpsPlotData(names, samples)
}

// cpsRows adds the row's figures to the table: the rate of each path with its ratio to the plain
// hop and to HAProxy (the targets: >= 0.9 and >= 5 for vipgate's defaults), the CPU per
// connection, and the latency each adds over the plain hop.
func cpsRows(t *table, what string, names []string, samples map[string][]cpsSample) {
	pick := func(name string, f func(cpsSample) float64) []float64 { return pickSamples(samples[name], f) }
	rate := func(s cpsSample) float64 { return s.rate }
	cpu := func(s cpsSample) float64 { return s.cpuPerConn }
	plain := pick("plain", rate)
	conns := func(xs []float64) string {
		return fmt.Sprintf("%s conn/s (%s-%s)", thousands(int(median(xs))), thousands(int(slices.Min(xs))), thousands(int(slices.Max(xs))))
	}
	us := func(xs []float64) string { return fmt.Sprintf("%.1f µs", median(xs)/1e3) }
	t.add(row{What: what, Ref: "plainly routed (gateway namespace forwarding, no table): " + conns(plain) + ", " + us(pick("plain", cpu)) + " CPU/conn"})
	haproxy := pick("haproxy", rate)
	for _, n := range names {
		if n == "plain" {
			continue
		}
		got := pick(n, rate)
		if len(got) == 0 {
			continue
		}
		fast := strings.HasSuffix(n, "+fastPath")
		target := 0.0
		if fast {
			target = 0.9
		}
		ratio := "/plain " + pairedRatio(got, plain, target)
		if len(haproxy) > 0 && n != "haproxy" && n != "ceiling" {
			ht := 0.0
			if fast {
				ht = 5
			}
			ratio += "; /HAProxy " + pairedRatio(got, haproxy, ht)
		}
		v := conns(got) + ", " + us(pick(n, cpu)) + " CPU/conn"
		if errs := pickSamples(samples[n], func(s cpsSample) float64 { return float64(s.errors) }); slices.Max(errs) > 0 {
			v += fmt.Sprintf(", %.0f failed connections in the worst round", slices.Max(errs))
		}
		if n != "ceiling" {
			v += fmt.Sprintf(" (%+.1f µs over plain)", addedCPU(samples, n)/1e3)
		}
		if fast {
			v += fmt.Sprintf("; flows the fast path took: %s", fastShare(samples[n]))
			// On cores of its own a box's connection rate is the inverse of its cost per
			// connection: HAProxy's added CPU over this path's is the rate ratio there.
			if hc, c := addedCPU(samples, "haproxy"), addedCPU(samples, n); len(haproxy) > 0 && c > 0 {
				ratio += fmt.Sprintf("; HAProxy's added CPU / this one's: %.1f (target >= 5: %s)", hc/c, map[bool]string{true: "meets", false: "BELOW"}[hc/c >= 5])
			}
		}
		t.add(row{Sub: true, What: "new connections through " + cpsLabel(n), Vipgate: v, Ref: "plainly routed: " + conns(plain), Ratio: ratio})
	}
	for _, lat := range []struct {
		what     string
		p50, p99 func(cpsSample) float64
	}{
		{"a new connection (connect to answer, one at a time)", func(s cpsSample) float64 { return s.connP50 }, func(s cpsSample) float64 { return s.connP99 }},
		{"a request on an open connection (ping-pong)", func(s cpsSample) float64 { return s.rrP50 }, func(s cpsSample) float64 { return s.rrP99 }},
	} {
		p50, p99 := pick("plain", lat.p50), pick("plain", lat.p99)
		t.add(row{Sub: true, What: "latency of " + lat.what + ", plainly routed", Ref: fmt.Sprintf("p50 %s, p99 %s", us(p50), us(p99))})
		for _, n := range names {
			if n == "plain" || n == "ceiling" || len(samples[n]) == 0 {
				continue
			}
			a50, a99 := addedLatency(pick(n, lat.p50), p50), addedLatency(pick(n, lat.p99), p99)
			verdict := ""
			if strings.HasSuffix(n, "+fastPath") {
				verdict = "; p99 added target <= 20 µs: " + map[bool]string{true: "meets", false: "ABOVE"}[a99 <= 20e3]
			}
			t.add(row{Sub: true, What: "latency of " + lat.what + " through " + cpsLabel(n),
				Vipgate: fmt.Sprintf("p50 %s, p99 %s", us(pick(n, lat.p50)), us(pick(n, lat.p99))),
				Ref:     fmt.Sprintf("plain p50 %s, p99 %s", us(p50), us(p99)),
				Ratio:   fmt.Sprintf("added p50 %+.1f µs, p99 %+.1f µs%s", a50/1e3, a99/1e3, verdict)})
		}
	}
}

// addedCPU is the median over rounds of a path's CPU per connection over the plain hop's (ns):
// what the gateway or proxy costs per connection on top of routing it.
func addedCPU(samples map[string][]cpsSample, name string) float64 {
	cpu := func(s cpsSample) float64 { return s.cpuPerConn }
	return addedLatency(pickSamples(samples[name], cpu), pickSamples(samples["plain"], cpu))
}

// addedLatency is the median over rounds of got - ref, paired by round (ns).
func addedLatency(got, ref []float64) float64 {
	var d []float64
	for i := range min(len(got), len(ref)) {
		d = append(d, got[i]-ref[i])
	}
	return median(d)
}

// fastShare says which share of the rate samples' connections the NAT fast path took as its own
// flows (the rest went to conntrack), and why it left some to conntrack.
func fastShare(ss []cpsSample) string {
	var shares []float64
	var snat, full float64
	for _, s := range ss {
		if s.conns > 0 {
			shares = append(shares, min(s.fastNew/s.conns, 1))
		}
		snat += s.snatFull
		full += s.tableFull
	}
	out := fmt.Sprintf("%.0f%% of the connections (median)", 100*median(shares))
	if snat > 0 {
		out += fmt.Sprintf("; %s packets left to conntrack for want of a masquerade port", thousands(int(snat)))
	}
	if full > 0 {
		out += fmt.Sprintf("; %s left to conntrack by a full flow table", thousands(int(full)))
	}
	return out
}

// cpsSummary is the side-by-side table of the row (BENCH.md's "Gateway vs HAProxy"): one line per
// path, medians over rounds, ratios and added latency paired by round.
func cpsSummary(names []string, samples map[string][]cpsSample, date time.Time) string {
	pick := func(name string, f func(cpsSample) float64) []float64 { return pickSamples(samples[name], f) }
	rate := func(s cpsSample) float64 { return s.rate }
	plain, haproxy := pick("plain", rate), pick("haproxy", rate)
	var b strings.Builder
	fmt.Fprintf(&b, "Gateway vs HAProxy, %s (medians of %d alternating rounds; ratios and added latency paired by round):\n\n",
		date.Format("2006-01-02 15:04 UTC"), len(plain))
	b.WriteString("| path | conn/s | / plain | / HAProxy | CPU µs/conn (over plain) | new conn p50 / p99 µs (added) | request p50 / p99 µs (added) |\n|---|---|---|---|---|---|---|\n")
	for _, n := range names {
		ss := samples[n]
		if len(ss) == 0 {
			continue
		}
		got := pick(n, rate)
		ratio := func(ref []float64) string {
			if len(ref) == 0 {
				return ""
			}
			rs := make([]float64, 0, len(got))
			for i := range min(len(got), len(ref)) {
				rs = append(rs, got[i]/ref[i])
			}
			return fmt.Sprintf("%.2f", median(rs))
		}
		lat := func(p50, p99 func(cpsSample) float64) string {
			if n == "ceiling" {
				return fmt.Sprintf("%.1f / %.1f", median(pick(n, p50))/1e3, median(pick(n, p99))/1e3)
			}
			s := fmt.Sprintf("%.1f / %.1f", median(pick(n, p50))/1e3, median(pick(n, p99))/1e3)
			if n != "plain" {
				s += fmt.Sprintf(" (%+.1f / %+.1f)", addedLatency(pick(n, p50), pick("plain", p50))/1e3, addedLatency(pick(n, p99), pick("plain", p99))/1e3)
			}
			return s
		}
		cpu := fmt.Sprintf("%.1f", median(pick(n, func(s cpsSample) float64 { return s.cpuPerConn }))/1e3)
		if n != "plain" && n != "ceiling" {
			cpu += fmt.Sprintf(" (%+.1f)", addedCPU(samples, n)/1e3)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", cpsLabel(n), thousands(int(median(got))), ratio(plain), ratio(haproxy), cpu,
			lat(func(s cpsSample) float64 { return s.connP50 }, func(s cpsSample) float64 { return s.connP99 }),
			lat(func(s cpsSample) float64 { return s.rrP50 }, func(s cpsSample) float64 { return s.rrP99 }))
	}
	return b.String()
}
