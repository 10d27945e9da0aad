package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The gateway small-packet row (--only gateway-pps): 64-byte frames (18 bytes of UDP payload) from a
// sender through a gateway namespace to a receiver, packets per second, with `vipgate gateway` in
// each forwarding mode against the same hop plainly routed (the gateway namespace forwarding with no
// nftables table at all), in alternating rounds of one run. Three namespaces of its own:
//
//	snd  eth0 198.51.100.10/25 (default via the gateway)       d0 198.51.100.130/25 ---+
//	 |                                                                                  | direct veth:
//	gw   s0 198.51.100.1/25, n0 192.0.2.100/24; forwarding on; vipgate gateway or nothing | the generator's
//	 |                                                                                  | own ceiling
//	node eth0 192.0.2.11/24; lo: the VIP 203.0.113.50 (route), the pod 10.244.1.11 (direct); d0 198.51.100.129/25
//
// One UDP Service, LoadBalancer 203.0.113.50, port = nodePort = targetPort = 30080, eTP=Cluster, one
// endpoint 10.244.1.11 on node1, so one receiver on the node (0.0.0.0:30080) takes every mode's
// packets: route (the packet unchanged to the node, dup in raw prerouting), nodePort (DNAT to
// 192.0.2.11:30080, masqueraded: snat auto), direct (DNAT to the pod address, routed via the node).
// The plainly routed reference sends to 192.0.2.11:30080 through the same gateway namespace. For
// nodePort and direct there is a second reference, "plain + NAT": the gateway namespace with a
// hand-written ruleset doing the least the kernel must do in that mode (conntrack, one DNAT rule,
// masquerade for nodePort; gwNATRef), so that the row tells vipgate's rules apart from the cost of
// stateful NAT itself. Each mode is measured with its fast path off (route: dup; nodePort and
// direct: conntrack) and on, the default (route+fastPath: the netdev table's fwd; nodePort+fastPath
// and direct+fastPath: the NAT fast path's BPF program). --gw-compare measures a second binary's
// route+fastPath in the same rounds, right after the first's (a change to the fast path's rules,
// before / after).
//
// The generator (`bench udpsend`, this binary in the sender namespace) writes batches with sendmmsg
// over 16 connected sockets (16 flows), for a fixed time and at most a fixed count. On veth the
// whole path (the syscall, both hops, the gateway's rules, the enqueue at the receiver's socket)
// runs on the sender's CPU in softirq, so the forwarding rate is the sender CPU's rate through that
// path. The gateway's forwarding rate is counted at its egress port (n0's tx packets over the
// sender's time); what the receiver's socket took is given too. The sender straight to the
// receiver over one veth (d0) is the generator's own ceiling, in the same rounds.
//
// The rate moves with whatever else runs on the machine (tens of percent on a shared 2-vCPU VM).
// The generator's own CPU time per packet does much less: the softirq that carries the packet
// through the gateway runs on the sender's thread and is charged to it, while time other processes
// take is not. So the row also gives the sender's CPU time per packet, plain vs each mode (same
// rounds): the cost of the gateway's path per packet, and the ratio the rate would have on an idle
// machine.

const (
	gwPPSPort    = 30080
	gwPPSPayload = 18 // + 8 UDP + 20 IPv4 + 14 Ethernet + 4 FCS = 64 bytes on the wire
	gwPPSFlows   = 16
)

var (
	gwPPSVIP    = netip.MustParseAddr("203.0.113.50")
	gwPPSPod    = netip.MustParseAddr("10.244.1.11")
	gwPPSNodeIP = netip.MustParseAddr("192.0.2.11")
	gwPPSGwIP   = netip.MustParseAddr("192.0.2.100")
	gwPPSDirect = netip.MustParseAddr("198.51.100.129") // the node's end of the direct veth
)

// gwPPSOptions bound the row.
type gwPPSOptions struct {
	rounds     int
	sampleTime time.Duration
	maxCount   int
	modes      []string
	// compare is a second vipgate binary whose route+fastPath is measured in the same rounds
	// (--gw-compare: a change to the fast path's rules, before / after), "" for none.
	compare string
}

// gwLab is the three namespaces of the row.
type gwLab struct {
	snd, gw, node *netns
	self          string
	dir           string
	vipgate       string
	gwProc        *exec.Cmd
	stopGw        func()
	// lastCfg is the last gateway's config, for its --cleanup (stopGateway).
	lastCfg string
}

func newGwLab(vipgate string) (*gwLab, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-gw-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	atExit(func() { os.RemoveAll(dir) })
	g := &gwLab{self: self, dir: dir, vipgate: vipgate}
	for _, p := range []**netns{&g.snd, &g.gw, &g.node} {
		if *p, err = newNetns(); err != nil {
			return nil, err
		}
	}
	ip := func(ns *netns, args ...string) error {
		if out, err := exec.Command("ip", append([]string{"-n", ns.name}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("netns %s: ip %s: %v: %s", ns.name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	type cmd struct {
		ns   *netns
		args []string
	}
	// Every veth is created in a lab namespace with its peer put straight into another.
	cmds := []cmd{
		{g.snd, []string{"link", "add", "eth0", "type", "veth", "peer", "name", "s0", "netns", g.gw.name}},
		{g.gw, []string{"link", "add", "n0", "type", "veth", "peer", "name", "eth0", "netns", g.node.name}},
		{g.snd, []string{"link", "add", "d0", "type", "veth", "peer", "name", "d0", "netns", g.node.name}},
		{g.snd, []string{"addr", "add", "198.51.100.10/25", "dev", "eth0"}},
		{g.snd, []string{"addr", "add", "198.51.100.130/25", "dev", "d0"}},
		{g.gw, []string{"addr", "add", "198.51.100.1/25", "dev", "s0"}},
		{g.gw, []string{"addr", "add", gwPPSGwIP.String() + "/24", "dev", "n0"}},
		{g.node, []string{"addr", "add", gwPPSNodeIP.String() + "/24", "dev", "eth0"}},
		{g.node, []string{"addr", "add", gwPPSDirect.String() + "/25", "dev", "d0"}},
		{g.node, []string{"addr", "add", gwPPSVIP.String() + "/32", "dev", "lo"}},
		{g.node, []string{"addr", "add", gwPPSPod.String() + "/32", "dev", "lo"}},
	}
	for _, c := range cmds {
		if err := ip(c.ns, c.args...); err != nil {
			return nil, err
		}
	}
	for _, l := range []struct {
		ns   *netns
		devs []string
	}{{g.snd, []string{"eth0", "d0"}}, {g.gw, []string{"s0", "n0"}}, {g.node, []string{"eth0", "d0"}}} {
		for _, d := range l.devs {
			if err := ip(l.ns, "link", "set", d, "up"); err != nil {
				return nil, err
			}
		}
	}
	for _, c := range []cmd{
		{g.snd, []string{"route", "add", "default", "via", "198.51.100.1"}},
		{g.gw, []string{"route", "add", "10.244.1.0/24", "via", gwPPSNodeIP.String()}},
		{g.node, []string{"route", "add", "198.51.100.0/25", "via", gwPPSGwIP.String()}},
	} {
		if err := ip(c.ns, c.args...); err != nil {
			return nil, err
		}
	}
	// Inside the lab namespaces only: forwarding on the gateway, no reverse-path filter anywhere.
	for _, ns := range []*netns{g.snd, g.gw, g.node} {
		args := []string{"netns", "exec", ns.name, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"}
		if ns == g.gw {
			args = append(args, "net.ipv4.ip_forward=1")
		}
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("netns %s: sysctl: %v: %s", ns.name, err, out)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "manifests"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifests", "svc.yaml"), []byte(gwPPSManifest), 0o644); err != nil {
		return nil, err
	}
	return g, nil
}

// openGwLab builds the lab around the vipgate binary of the --vipgate flag (vipgateBinary); close
// stops its gateway and removes its namespaces.
func openGwLab(vipgateFlag string) (*gwLab, error) {
	bin, err := vipgateBinary(vipgateFlag)
	if err != nil {
		return nil, err
	}
	return newGwLab(bin)
}

func (g *gwLab) close() {
	g.stopGateway()
	for _, ns := range []*netns{g.node, g.gw, g.snd} {
		ns.close()
	}
}

const gwPPSManifest = `apiVersion: v1
kind: Service
metadata: {name: pps, namespace: bench}
spec:
  type: LoadBalancer
  clusterIP: 10.96.5.1
  clusterIPs: [10.96.5.1]
  externalTrafficPolicy: Cluster
  ports:
  - {name: udp, protocol: UDP, port: 30080, targetPort: 30080, nodePort: 30080}
  - {name: tcp, protocol: TCP, port: 30080, targetPort: 30080, nodePort: 30080}
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.50}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: pps-ipv4
  namespace: bench
  labels: {kubernetes.io/service-name: pps}
addressType: IPv4
ports: [{name: udp, protocol: UDP, port: 30080}, {name: tcp, protocol: TCP, port: 30080}]
endpoints:
- addresses: ["10.244.1.11"]
  nodeName: node1
  conditions: {ready: true, serving: true, terminating: false}
`

// gwPPSFastPath is the pseudo mode of route forwarding's netdev fast path (routeFastPath): measured
// next to route whenever route is, as nodePort+fastPath and direct+fastPath (natFastPath: the BPF
// program) are next to nodePort and direct. Each is its mode's default; the mode's own name is
// the mode with its fast path off (route: dup; nodePort and direct: conntrack).
const gwPPSFastPath = "route+fastPath"

// withFastPath is mode's pseudo mode with its fast path on.
func withFastPath(mode string) string { return mode + "+fastPath" }

// modeLabel names a measured mode in the rows: the default (its fast path on) or the fast path
// off, and what forwards then.
func modeLabel(m string) string {
	if base, ok := strings.CutSuffix(m, "+fastPath"); ok {
		return fmt.Sprintf("%s (the default: %s)", base, map[string]string{"route": "routeFastPath, netdev fwd", "nodePort": "natFastPath, BPF", "direct": "natFastPath, BPF"}[base])
	}
	if m == compareSuffix(m) {
		return m
	}
	return fmt.Sprintf("%s (fast path off: %s)", m, map[string]string{"route": "dup", "nodePort": "conntrack", "direct": "conntrack"}[m])
}

// compareSuffix is m itself for the --gw-compare pseudo mode, else "".
func compareSuffix(m string) string {
	if strings.HasSuffix(m, "(--gw-compare)") {
		return m
	}
	return ""
}

// modeTarget is the ratio target of a mode's row: the 0.9 of plain routing for each mode
// as configured by default (its fast path on); the fast path off is measured for comparison.
func modeTarget(m string) float64 {
	if strings.HasSuffix(m, "+fastPath") {
		return 0.9
	}
	return 0
}

func gwPPSConfig(forwarding string) string {
	section := map[string]string{"route": "routeFastPath", "nodePort": "natFastPath", "direct": "natFastPath"}
	on := false
	if m, ok := strings.CutSuffix(forwarding, "+fastPath"); ok {
		forwarding, on = m, true
	}
	extra := fmt.Sprintf("%s: {enabled: %v}\n", section[forwarding], on)
	return fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [%q]
forwarding: %s
snat: auto
clusterCIDRs: ["10.244.0.0/16"]
serviceCIDRs: ["10.96.0.0/16"]
nodes:
- {name: node1, addresses: [%q]}
`, gwPPSGwIP, forwarding, gwPPSNodeIP) + extra
}

// gwNATRef is the hand-written ruleset of the "plain + NAT" reference of a forwarding mode: the least
// the kernel must do for that mode's packets — conntrack, one DNAT rule (evaluated for a flow's first
// packet only: NAT rules see a connection once) and, for nodePort, masquerade — with nothing of
// vipgate's (no VIP sets, no dispatch maps, no Maglev). The mode's cost over it is vipgate's rules;
// its cost over plain routing is the kernel's stateful NAT, which any gateway of that mode pays.
func gwNATRef(mode string) string {
	switch mode {
	case "nodePort":
		return fmt.Sprintf(`table ip natref {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s meta l4proto { tcp, udp } th dport %d dnat to %s:%d; }
	chain post { type nat hook postrouting priority srcnat; ct status dnat masquerade; }
}
`, gwPPSVIP, gwPPSPort, gwPPSNodeIP, gwPPSPort)
	case "direct":
		return fmt.Sprintf(`table ip natref {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s meta l4proto { tcp, udp } th dport %d dnat to %s:%d; }
}
`, gwPPSVIP, gwPPSPort, gwPPSPod, gwPPSPort)
	}
	return ""
}

// loadNATRef replaces whatever runs in the gateway namespace with mode's "plain + NAT" ruleset,
// loaded with nft -f inside it.
func (g *gwLab) loadNATRef(mode string) error {
	g.stopGateway()
	cmd := exec.Command("ip", "netns", "exec", g.gw.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(gwNATRef(mode))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netns %s: nft -f (plain + NAT, %s): %v: %s", g.gw.name, mode, err, oneLine(string(out)))
	}
	return nil
}

// startGateway runs `vipgate gateway` (bin; "": the lab's) in the gateway namespace and waits for
// its first sync.
func (g *gwLab) startGateway(forwarding, bin string) error {
	return g.startGatewayConfig(forwarding, gwPPSConfig(forwarding), bin)
}

// startGatewayConfig runs `vipgate gateway` with the config text and waits for its first sync;
// forwarding names its files and messages.
func (g *gwLab) startGatewayConfig(forwarding, config, bin string) error {
	g.stopGateway()
	if bin == "" {
		bin = g.vipgate
	}
	cfg := filepath.Join(g.dir, "gateway-"+forwarding+".yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return err
	}
	g.lastCfg = cfg
	logFile := filepath.Join(g.dir, "gateway-"+forwarding+".log")
	log, err := os.Create(logFile)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", g.gw.name, bin, "gateway", "--config", cfg,
		"--manifests", filepath.Join(g.dir, "manifests"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	g.gwProc = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// `ip netns exec` execs vipgate: the PID is the gateway's.
	g.stopGw = atExit(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(logFile)
		if strings.Contains(string(b), "synced") {
			return nil
		}
		select {
		case <-exited:
			g.stopGateway()
			return fmt.Errorf("vipgate gateway (%s) exited: %s", forwarding, oneLine(tailFile(logFile, 5)))
		default:
		}
		if time.Now().After(deadline) {
			g.stopGateway()
			return fmt.Errorf("vipgate gateway (%s) did not sync within 20 s: %s", forwarding, oneLine(tailFile(logFile, 5)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopGateway stops the gateway and deletes every nftables table in the gateway namespace (the
// gateway leaves its rules in place when it stops): the plainly routed hop has none.
func (g *gwLab) stopGateway() {
	if g.stopGw != nil {
		g.stopGw()
		g.stopGw, g.gwProc = nil, nil
	}
	_ = exec.Command("ip", "netns", "exec", g.gw.name, "nft", "flush", "ruleset").Run()
	// The NAT fast path's program stays attached when its gateway ends (as a table would): the
	// next target (plain routing, a hand-written NAT floor) must not meet it.
	if g.lastCfg == "" {
		return
	}
	if out, err := exec.Command("ip", "netns", "exec", g.gw.name, g.vipgate, "gateway", "--cleanup", "--config", g.lastCfg).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: detaching the NAT fast path in %s: %v: %s\n", g.gw.name, err, oneLine(string(out)))
	}
}

// linkCounter reads a packet counter of a device in a namespace ("rx" or "tx").
func linkCounter(ns, dev, dir string) (uint64, error) {
	out, err := exec.Command("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev).Output()
	if err != nil {
		return 0, fmt.Errorf("ip -n %s -s link show %s: %w", ns, dev, err)
	}
	var links []struct {
		Stats64 map[string]struct {
			Packets uint64 `json:"packets"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) == 0 {
		return 0, fmt.Errorf("ip -s -j link show %s: %q", dev, firstLines(string(out), 2))
	}
	return links[0].Stats64[dir].Packets, nil
}

// udpDelivered is the namespace's UDP InDatagrams (what sockets took) and RcvbufErrors.
func udpDelivered(ns string) (in, dropped uint64, err error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return 0, 0, err
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i := 1; i < len(f) && i < len(names); i++ {
			v, _ := strconv.ParseUint(f[i], 10, 64)
			switch names[i] {
			case "InDatagrams":
				in = v
			case "RcvbufErrors":
				dropped = v
			}
		}
		return in, dropped, nil
	}
	return 0, 0, fmt.Errorf("no Udp line in /proc/net/snmp")
}

// ppsSample is one measurement: what the generator sent, what left the counted port, what the
// receiver's socket took, per second of the generator's sending time.
type ppsSample struct {
	sent, forwarded, delivered float64
	// cpuNS is the generator's CPU time per packet sent (ns; 0: not reported).
	cpuNS float64
}

// send runs the generator in the sender namespace to dst for d (at most count packets) and returns
// the packets sent, the time it sent for and the CPU time it used doing so.
func (g *gwLab) send(dst netip.AddrPort, d time.Duration, count int) (int, time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", g.snd.name, g.self, "udpsend", "--dst", dst.String(),
		"--duration", d.String(), "--count", strconv.Itoa(count), "--flows", strconv.Itoa(gwPPSFlows), "--size", strconv.Itoa(gwPPSPayload)).CombinedOutput()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("udpsend to %s: %v: %s", dst, err, oneLine(string(out)))
	}
	kv := lastKV(string(out))
	sent, err1 := strconv.Atoi(kv["sent"])
	ns, err2 := strconv.ParseInt(kv["elapsed_ns"], 10, 64)
	if err1 != nil || err2 != nil || ns <= 0 {
		return 0, 0, 0, fmt.Errorf("udpsend to %s printed %q", dst, oneLine(string(out)))
	}
	cpu, _ := strconv.ParseInt(kv["cpu_ns"], 10, 64)
	return sent, time.Duration(ns), time.Duration(cpu), nil
}

// sample measures one path: a short warm-up (ARP, conntrack, the gateway's first packets), then
// the counted run. counterNS/counterDev is the port whose tx packets count as forwarded.
func (g *gwLab) sample(dst netip.AddrPort, counterNS, counterDev string, o gwPPSOptions) (ppsSample, error) {
	if _, _, _, err := g.send(dst, 100*time.Millisecond, 2000); err != nil {
		return ppsSample{}, err
	}
	time.Sleep(100 * time.Millisecond)
	tx0, err := linkCounter(counterNS, counterDev, "tx")
	if err != nil {
		return ppsSample{}, err
	}
	in0, _, err := udpDelivered(g.node.name)
	if err != nil {
		return ppsSample{}, err
	}
	sent, el, cpu, err := g.send(dst, o.sampleTime, o.maxCount)
	if err != nil {
		return ppsSample{}, err
	}
	time.Sleep(50 * time.Millisecond) // the receiver drains its socket
	tx1, err := linkCounter(counterNS, counterDev, "tx")
	if err != nil {
		return ppsSample{}, err
	}
	in1, _, err := udpDelivered(g.node.name)
	if err != nil {
		return ppsSample{}, err
	}
	s := el.Seconds()
	smp := ppsSample{sent: float64(sent) / s, forwarded: float64(tx1-tx0) / s, delivered: float64(in1-in0) / s}
	if sent > 0 {
		smp.cpuNS = float64(cpu.Nanoseconds()) / float64(sent)
	}
	return smp, nil
}

// startSink runs the receiver in the node namespace for at most maxTime.
func (g *gwLab) startSink(maxTime time.Duration) (func(), error) {
	_, stop, err := startReady(exec.Command("ip", "netns", "exec", g.node.name, g.self, "udpsink", "--port", strconv.Itoa(gwPPSPort), "--max-time", maxTime.String()), "udpsink")
	return stop, err
}

// startReady starts cmd (one of the bench's own subcommands, named name) and waits up to 10 s for
// the "ready" line it prints first; the rest of its output is discarded. It returns the process's
// PID and its stop function.
func startReady(cmd *exec.Cmd, name string) (int, func(), error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	stop := atExit(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "ready") {
			err = fmt.Errorf("%s said %q", name, line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return 0, nil, err
		}
	case <-time.After(10 * time.Second):
		stop()
		return 0, nil, fmt.Errorf("%s did not start", name)
	}
	return cmd.Process.Pid, stop, nil
}

// gatewayPPS is the row.
func gatewayPPS(t *table, vipgateFlag string, o gwPPSOptions) {
	what := fmt.Sprintf("gateway small-packet rate: 64-byte UDP frames, %d flows, packets/s forwarded by the gateway namespace (median of %d rounds x %v, alternating)", gwPPSFlows, o.rounds, o.sampleTime)
	g, err := openGwLab(vipgateFlag)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer g.close()
	// Each mode with its fast path off and on (the default): route by dup and by the netdev
	// fast path, nodePort and direct by conntrack and by the NAT fast path (BPF).
	var modes []string
	for _, m := range o.modes {
		modes = append(modes, m, withFastPath(m))
	}
	// The "plain + NAT" references of the NAT modes, and the compared binary's fast path.
	var natRefs []string
	for _, m := range modes {
		if gwNATRef(m) != "" {
			natRefs = append(natRefs, m)
		}
	}
	nRefs := len(natRefs)
	compare := ""
	if o.compare != "" && slices.Contains(modes, gwPPSFastPath) {
		compare = gwPPSFastPath + " (--gw-compare)"
	}
	budget := time.Duration(o.rounds*(len(modes)+nRefs+3))*(o.sampleTime+5*time.Second) + time.Minute
	stopSink, err := g.startSink(budget)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer stopSink()

	type target struct {
		name, fwd string // fwd: "" plainly routed, else the gateway's forwarding mode; "ceiling": direct veth
		bin       string // the vipgate binary ("": the lab's)
		natRef    string // the mode whose "plain + NAT" ruleset the gateway namespace holds instead
		dst       netip.AddrPort
	}
	vip := netip.AddrPortFrom(gwPPSVIP, gwPPSPort)
	targets := []target{{name: "plain", dst: netip.AddrPortFrom(gwPPSNodeIP, gwPPSPort)}}
	for _, m := range modes {
		targets = append(targets, target{name: m, fwd: m, dst: vip})
	}
	// The compared binary next to the fast path (the last mode): the pair is measured back to back.
	if compare != "" {
		targets = append(targets, target{name: compare, fwd: gwPPSFastPath, bin: o.compare, dst: vip})
	}
	for _, m := range natRefs {
		targets = append(targets, target{name: natRefName(m), natRef: m, dst: vip})
	}
	samples := map[string][]ppsSample{}
	for r := 0; r < o.rounds; r++ {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		// The generator's own ceiling, once per round: sender -> receiver over one veth.
		c, err := g.sample(netip.AddrPortFrom(gwPPSDirect, gwPPSPort), g.snd.name, "d0", o)
		if err != nil {
			t.fail(what, err)
			return
		}
		samples["ceiling"] = append(samples["ceiling"], c)
		for _, tg := range order {
			var err error
			switch {
			case tg.natRef != "":
				err = g.loadNATRef(tg.natRef)
			case tg.fwd == "":
				g.stopGateway()
			default:
				err = g.startGateway(tg.fwd, tg.bin)
			}
			if err != nil {
				t.fail(what, err)
				return
			}
			s, err := g.sample(tg.dst, g.gw.name, "n0", o)
			if err != nil {
				t.fail(what+" ("+tg.name+")", err)
				return
			}
			if s.forwarded < 0.5*s.sent {
				t.fail(what+" ("+tg.name+")", fmt.Errorf("only %.0f of %.0f packets/s left the gateway: the path is broken (see %s)", s.forwarded, s.sent, g.dir))
				return
			}
			samples[tg.name] = append(samples[tg.name], s)
		}
		g.stopGateway()
	}
	pick := func(name string, f func(ppsSample) float64) []float64 { return pickSamples(samples[name], f) }
	fwd := func(s ppsSample) float64 { return s.forwarded }
	sent := func(s ppsSample) float64 { return s.sent }
	dlv := func(s ppsSample) float64 { return s.delivered }
	kpps := func(xs []float64) string {
		return fmt.Sprintf("%.0f kpps (%.0f-%.0f)", median(xs)/1e3, slices.Min(xs)/1e3, slices.Max(xs)/1e3)
	}
	plain := pick("plain", fwd)
	t.add(row{What: what, Vipgate: "", Ref: fmt.Sprintf("plainly routed (gateway namespace forwarding, no nftables table): %s; receiver took %s",
		kpps(plain), kpps(pick("plain", dlv)))})
	for _, m := range modes {
		got := pick(m, fwd)
		t.add(row{Sub: true, What: fmt.Sprintf("through `vipgate gateway`, forwarding: %s", modeLabel(m)),
			Vipgate: kpps(got) + "; receiver took " + kpps(pick(m, dlv)), Ref: "plainly routed: " + kpps(plain),
			Ratio: pairedRatio(got, plain, modeTarget(m))})
	}
	for _, m := range natRefs {
		ref := pick(natRefName(m), fwd)
		t.add(row{Sub: true, What: fmt.Sprintf("the NAT floor of %s: %s (hand-written: conntrack, one DNAT rule%s; no vipgate)", m, natRefName(m), map[bool]string{true: ", masquerade"}[m == "nodePort"]),
			Vipgate: "", Ref: kpps(ref) + "; plainly routed: " + kpps(plain), Ratio: "floor/plain " + pairedRatio(ref, plain, 0)})
		t.add(row{Sub: true, What: fmt.Sprintf("through `vipgate gateway`, forwarding: %s, against its NAT floor", m),
			Vipgate: kpps(pick(m, fwd)), Ref: natRefName(m) + ": " + kpps(ref), Ratio: pairedRatio(pick(m, fwd), ref, 0)})
	}
	// The sender's CPU time per packet: the path's cost, little moved by other load. The ratio is
	// plain's cost over the mode's (as a rate ratio: higher is better).
	cpu := func(s ppsSample) float64 { return s.cpuNS }
	ns := func(xs []float64) string {
		return fmt.Sprintf("%.0f ns (%.0f-%.0f)", median(xs), slices.Min(xs), slices.Max(xs))
	}
	if pc := pick("plain", cpu); slices.Min(pc) > 0 {
		for _, m := range append(slices.Clone(modes), compare) {
			if m == "" {
				continue
			}
			mc := pick(m, cpu)
			if slices.Min(mc) <= 0 {
				continue
			}
			t.add(row{Sub: true, What: fmt.Sprintf("sender CPU per packet (the path's cost, less moved by other load), forwarding: %s", modeLabel(m)),
				Vipgate: ns(mc), Ref: "plainly routed: " + ns(pc), Ratio: "plain/mode " + pairedRatio(pc, mc, modeTarget(m))})
			if m == compare {
				fc := pick(gwPPSFastPath, cpu)
				t.add(row{Sub: true, What: "sender CPU per packet, " + gwPPSFastPath + " of --vipgate against that of --gw-compare (same rounds)",
					Vipgate: ns(fc), Ref: "--gw-compare: " + ns(mc), Ratio: "compare/this " + pairedRatio(mc, fc, 0)})
			}
			if !slices.Contains(natRefs, m) {
				continue
			}
			rc := pick(natRefName(m), cpu)
			if slices.Min(rc) <= 0 {
				continue
			}
			t.add(row{Sub: true, What: fmt.Sprintf("sender CPU per packet, the NAT floor of %s (%s)", m, natRefName(m)),
				Vipgate: "", Ref: ns(rc) + "; plainly routed: " + ns(pc), Ratio: "plain/floor " + pairedRatio(pc, rc, 0)})
			t.add(row{Sub: true, What: fmt.Sprintf("sender CPU per packet, forwarding: %s, against its NAT floor", m),
				Vipgate: ns(mc), Ref: natRefName(m) + ": " + ns(rc), Ratio: "floor/mode " + pairedRatio(rc, mc, 0)})
		}
	}
	c := pick("ceiling", sent)
	t.add(row{Sub: true, What: "the generator's own ceiling: sender -> receiver over one veth (no gateway), sendmmsg, one sender thread",
		Vipgate: "", Ref: fmt.Sprintf("sent %s; receiver took %s", kpps(c), kpps(pick("ceiling", dlv))),
		Ratio: fmt.Sprintf("plainly routed = %.2f of it", median(plain)/median(c))})
}

// natRefName is the row name of mode's "plain + NAT" reference.
func natRefName(mode string) string { return "plain + NAT (" + mode + ")" }

// udpSendMain is the generator (`bench udpsend`), run in the sender namespace: batches of 64
// packets with sendmmsg, round-robin over --flows connected sockets, for --duration or --count
// packets, whichever ends first. It prints "sent=N elapsed_ns=T cpu_ns=C" (C: its CPU time).
func udpSendMain(args []string) int {
	fs := flag.NewFlagSet("udpsend", flag.ContinueOnError)
	dst := fs.String("dst", "", "ip:port")
	d := fs.Duration("duration", 2*time.Second, "how long to send")
	count := fs.Int("count", 10_000_000, "send at most this many packets")
	flows := fs.Int("flows", 16, "sockets (source ports)")
	size := fs.Int("size", 18, "UDP payload bytes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*dst)
	if err != nil || !ap.Addr().Is4() || *d <= 0 || *d > maxGeneratorTime || *count < 1 || *count > 100_000_000 || *flows < 1 || *flows > 256 || *size < 1 || *size > 1400 {
		fmt.Fprintln(os.Stderr, "udpsend: bad arguments (an IPv4 --dst, --duration up to", maxGeneratorTime, ", --count up to 1e8)")
		return 2
	}
	const batch = 64
	var fds []int
	for range *flows {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udpsend:", err)
			return 1
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
			fmt.Fprintln(os.Stderr, "udpsend: connect:", err)
			return 1
		}
		fds = append(fds, fd)
	}
	payload := make([]byte, *size)
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	msgs := make([]mmsghdr, batch)
	for i := range msgs {
		msgs[i].hdr.Iov = &iov
		msgs[i].hdr.SetIovlen(1)
	}
	sent := 0
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	deadline := start.Add(*d)
	for i := 0; sent < *count; i++ {
		if i%16 == 0 && time.Now().After(deadline) {
			break
		}
		n := min(batch, *count-sent)
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fds[i%len(fds)]), uintptr(unsafe.Pointer(&msgs[0])), uintptr(n), 0, 0, 0)
		if errno != 0 {
			if errno == unix.ENOBUFS || errno == unix.EAGAIN || errno == unix.ECONNREFUSED {
				continue // a full queue, or an ICMP error queued on the socket: go on
			}
			fmt.Fprintln(os.Stderr, "udpsend: sendmmsg:", errno)
			return 1
		}
		sent += int(r)
	}
	elapsed := time.Since(start)
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	// The process's CPU time while sending (user + system: the system part includes the softirq
	// that carries each packet through the namespaces on this thread).
	cpu := ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	fmt.Printf("sent=%d elapsed_ns=%d cpu_ns=%d\n", sent, elapsed.Nanoseconds(), cpu)
	return 0
}

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// udpSinkMain is the receiver (`bench udpsink`), run in the node namespace: it drains UDP port
// --port with recvmmsg until --max-time; the bench counts what it took from the namespace's UDP
// counters. It prints "ready" once bound.
func udpSinkMain(args []string) int {
	fs := flag.NewFlagSet("udpsink", flag.ContinueOnError)
	port := fs.Int("port", gwPPSPort, "UDP port")
	maxTime := fs.Duration("max-time", time.Minute, "exit after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *maxTime <= 0 || *maxTime > time.Hour {
		fmt.Fprintln(os.Stderr, "udpsink: --max-time must be positive and at most 1h")
		return 2
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpsink:", err)
		return 1
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: *port}); err != nil {
		fmt.Fprintln(os.Stderr, "udpsink: bind:", err)
		return 1
	}
	fmt.Println("ready")
	const batch = 64
	bufs := make([][2048]byte, batch)
	iovs := make([]unix.Iovec, batch)
	msgs := make([]mmsghdr, batch)
	for i := range msgs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
	}
	end := time.Now().Add(*maxTime)
	for time.Now().Before(end) {
		_, _, _ = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), batch, unix.MSG_WAITFORONE, 0, 0)
	}
	return 0
}

// pickSamples is one figure (f) of every sample of a path, in round order.
func pickSamples[S any](samples []S, f func(S) float64) []float64 {
	xs := make([]float64, 0, len(samples))
	for _, s := range samples {
		xs = append(xs, f(s))
	}
	return xs
}
