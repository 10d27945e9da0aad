package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
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

// The measured Service: a NodePort Service with one endpoint, the lab's pod1 (8080: the lab server,
// 5201: iperf3). Its addresses are outside everything the synthetic generator hands out.
var (
	measuredKey       = cluster.ServiceKey{Namespace: benchNamespace, Name: "measured"}
	measuredClusterIP = netip.MustParseAddr("10.96.255.250")
)

const (
	measuredNodePort  = 30000
	measuredIperfPort = 5201
	measuredIperfNP   = 30001 + 3*maxServices/20 + 1 // above every synthetic NodePort
)

// packetLab is a one-node lab (node1 with pod1, the client behind the router) whose node namespace
// the bench programs directly with the dataplane library.
type packetLab struct {
	l     *lab.Lab
	node  *lab.Node
	pod   *lab.Pod
	nodeF *os.File
	self  string // this binary, re-executed in the client namespace as the traffic generator
}

func newPacketLab(labserver string) (*packetLab, error) {
	l, err := lab.New(lab.Spec{IPv4Only: true, LabServer: labserver,
		Nodes: []lab.NodeSpec{{Name: thisNode, Pods: []string{"pod1"}}}}, nil)
	if err != nil {
		return nil, fmt.Errorf("building the lab: %w", err)
	}
	closeLab := atExit(func() { l.Close() })
	pl := &packetLab{l: l, node: l.Node(thisNode), pod: l.Pod("pod1")}
	fail := func(err error) (*packetLab, error) { closeLab(); return nil, err }
	// Tens of thousands of short connections from one client: let it reuse TIME_WAIT ports, or the
	// rate measures port exhaustion instead of the dataplane.
	if out, err := l.Exec(lab.RoleClient, "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000"); err != nil {
		return fail(fmt.Errorf("client sysctls: %v: %s", err, out))
	}
	// The client reaches cluster IPs through node1 (a static route to a node, as a bare-metal
	// router would have), and the pod directly for the reference path.
	for _, p := range []netip.Prefix{lab.ServiceCIDRv4, pl.node.PodCIDRv4} {
		if err := l.AddRoute(p, thisNode); err != nil {
			return fail(err)
		}
	}
	if pl.nodeF, err = os.Open("/run/netns/" + pl.node.NS); err != nil {
		return fail(err)
	}
	atExit(func() { pl.nodeF.Close() })
	if pl.self, err = os.Executable(); err != nil {
		return fail(err)
	}
	return pl, nil
}

// measuredState is the measured Service plus n synthetic ones.
func (pl *packetLab) measuredState(n int) *cluster.State {
	st := synthState(n, 10)
	st.Services[measuredKey] = &cluster.Service{Key: measuredKey, Type: cluster.TypeNodePort,
		IPFamilies: []cluster.Family{cluster.IPv4}, ClusterIPs: []netip.Addr{measuredClusterIP},
		Ports: []cluster.ServicePort{
			{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: measuredNodePort},
			{Name: "iperf", Protocol: cluster.TCP, Port: measuredIperfPort, NodePort: measuredIperfNP},
		}}
	st.EndpointSlices[measuredKey] = []*cluster.EndpointSlice{{Namespace: benchNamespace, Name: "measured-abcde",
		Service: measuredKey, Family: cluster.IPv4,
		Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}, {Name: "iperf", Protocol: cluster.TCP, Port: measuredIperfPort}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{pl.pod.IPv4}, Ready: true, Serving: true, NodeName: thisNode}}}}
	return st
}

// program replaces node1's table with n synthetic Services plus the measured one (a fresh proxier:
// one atomic full sync).
func (pl *packetLab) program(n int) error {
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(pl.nodeF.Fd())}
	defer prog.Close()
	p := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(pl.node.IPv4), prog)
	rep, err := p.Sync(pl.measuredState(n))
	if err != nil {
		return fmt.Errorf("programming node1 with %d Services: %w", n, err)
	}
	if len(rep.Conflicts) > 0 {
		return fmt.Errorf("programming node1 with %d Services: %d conflicts, first %v", n, len(rep.Conflicts), rep.Conflicts[0])
	}
	// Replacing the table leaves the kernel work to do after the ack (freeing the old table's
	// elements after an RCU grace period, growing the new hash tables): let it finish before packets
	// are timed, so that it is not charged to whichever configuration comes next.
	time.Sleep(settleTime)
	return nil
}

// settleTime is the pause after a table replacement before packets are timed.
const settleTime = 500 * time.Millisecond

// flushConntrack empties node1's conntrack table, so every measurement starts from the same state.
func (pl *packetLab) flushConntrack() {
	_, _ = pl.l.Exec(thisNode, "conntrack", "-F")
}

// connRate runs the connection generator in the client namespace: `workers` loops of connect, read
// the lab server's line, close, for d. It returns connections per second.
func (pl *packetLab) connRate(addr string, d time.Duration, workers int) (float64, error) {
	pl.flushConntrack()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	out, err := pl.l.ExecContext(ctx, lab.RoleClient, pl.self, "connrate", "--addr", addr,
		"--duration", d.String(), "--workers", strconv.Itoa(workers))
	if err != nil {
		return 0, fmt.Errorf("connection generator to %s: %w", addr, err)
	}
	kv := lastKV(out)
	rate, err := strconv.ParseFloat(kv["rate"], 64)
	if err != nil {
		return 0, fmt.Errorf("connection generator to %s: no rate in %q", addr, out)
	}
	if e, _ := strconv.Atoi(kv["errors"]); e > 0 {
		return 0, fmt.Errorf("connection generator to %s: %d failed connections (%s)", addr, e, kv["first_error"])
	}
	return rate, nil
}

// lastKV parses the last line of the form "k=v k=v ..." in out.
func lastKV(out string) map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	m := map[string]string{}
	for _, f := range strings.Fields(lines[len(lines)-1]) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// packetOptions bound the packet measurements.
type packetOptions struct {
	many      int           // Services in the "many" configuration
	rounds    int           // alternating rounds of few/many; the median is reported
	connTime  time.Duration // per connection-rate sample
	workers   int           // parallel connection loops
	iperfTime int           // seconds per iperf3 run
	iperfRuns int
}

// perPacket measures new TCP connections per second through the ClusterIP and the NodePort with the
// measured Service alone and with `many` Services, and the direct path to the pod; then throughput.
func perPacket(t *table, pl *packetLab, o packetOptions) {
	what := "per-packet cost"
	clusterIP := netip.AddrPortFrom(measuredClusterIP, 80).String()
	nodePort := netip.AddrPortFrom(pl.node.IPv4, measuredNodePort).String()
	direct := netip.AddrPortFrom(pl.pod.IPv4, 8080).String()
	samples := map[string][]float64{}
	// Few and many alternate round by round in ABBA order (few, many, many, few, ...), and the ratio
	// reported is the median of the per-round ratios: connection rates on a shared 2-CPU VM move by
	// 10-20% from one second to the next, and a slow spell then hits both configurations alike.
	for r := 0; r < o.rounds; r++ {
		order := []int{0, o.many}
		if r%2 == 1 {
			order = []int{o.many, 0}
		}
		for _, n := range order {
			if err := pl.program(n); err != nil {
				t.fail(what, err)
				return
			}
			for _, target := range []struct{ name, addr string }{{"ClusterIP", clusterIP}, {"NodePort", nodePort}, {"direct", direct}} {
				rate, err := pl.connRate(target.addr, o.connTime, o.workers)
				if err != nil {
					t.fail(what, err)
					return
				}
				k := fmt.Sprintf("%s/%d", target.name, n)
				samples[k] = append(samples[k], rate)
			}
		}
	}
	note := fmt.Sprintf("median of %d x %s, %d parallel loops", o.rounds, o.connTime, o.workers)
	for _, name := range []string{"ClusterIP", "NodePort"} {
		one, many := samples[name+"/0"], samples[fmt.Sprintf("%s/%d", name, o.many)]
		t.add(row{What: fmt.Sprintf("new TCP connections/s through a %s, %s Services present (%s)", name, thousands(o.many+1), note),
			Vipgate: rateText(many), Ref: "1 Service present: " + rateText(one), Ratio: pairedRatio(many, one, 0.95)})
	}
	viaVIP, dir := samples[fmt.Sprintf("ClusterIP/%d", o.many)], samples[fmt.Sprintf("direct/%d", o.many)]
	t.add(row{What: fmt.Sprintf("new TCP connections/s client -> ClusterIP -> pod, %s Services (%s)", thousands(o.many+1), note),
		Vipgate: rateText(viaVIP), Ref: "client -> pod directly: " + rateText(dir), Ratio: pairedRatio(viaVIP, dir, 0)})
}

// rateText is the median rate and the range of the samples.
func rateText(xs []float64) string {
	return fmt.Sprintf("%.0f/s (%.0f-%.0f)", median(xs), slices.Min(xs), slices.Max(xs))
}

// pairedRatio is the median of the per-round ratios got[i]/ref[i], against target if it is positive.
func pairedRatio(got, ref []float64, target float64) string {
	var rs []float64
	for i := range min(len(got), len(ref)) {
		if ref[i] > 0 {
			rs = append(rs, got[i]/ref[i])
		}
	}
	if len(rs) == 0 {
		return "n/a"
	}
	text := fmt.Sprintf("%.2f (rounds %.2f-%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
	if target > 0 {
		verdict := "meets"
		if median(rs) < target {
			verdict = "BELOW"
		}
		text += fmt.Sprintf(", target >= %.2f: %s", target, verdict)
	}
	return text
}

// throughput compares iperf3 through the ClusterIP (DNAT to pod1) with iperf3 to pod1 directly,
// with `many` Services programmed.
func throughput(t *table, pl *packetLab, o packetOptions) {
	what := fmt.Sprintf("TCP throughput client -> ClusterIP -> pod, %s Services (iperf3 -t %d, median of %d)", thousands(o.many+1), o.iperfTime, o.iperfRuns)
	if err := pl.program(o.many); err != nil {
		t.fail(what, err)
		return
	}
	srv, err := pl.l.Start("pod1", filepath.Join(pl.l.Dir(), "iperf3.log"), "iperf3", "-s", "-p", strconv.Itoa(measuredIperfPort))
	if err != nil {
		t.fail(what, err)
		return
	}
	defer srv.Stop()
	bw := func(host string) (float64, error) {
		var lastErr error
		for attempt := 0; attempt < 10; attempt++ { // the server may still be starting
			pl.flushConntrack()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.iperfTime+20)*time.Second)
			out, err := pl.l.ExecContext(ctx, lab.RoleClient, "iperf3", "-c", host, "-p", strconv.Itoa(measuredIperfPort),
				"-t", strconv.Itoa(o.iperfTime), "-J")
			cancel()
			if err == nil {
				return parseIperf(out)
			}
			lastErr = err
			time.Sleep(200 * time.Millisecond)
		}
		return 0, fmt.Errorf("iperf3 to %s: %w", host, lastErr)
	}
	var vip, dir []float64
	for r := 0; r < o.iperfRuns; r++ {
		v, err := bw(measuredClusterIP.String())
		if err != nil {
			t.fail(what, err)
			return
		}
		d, err := bw(pl.pod.IPv4.String())
		if err != nil {
			t.fail(what, err)
			return
		}
		vip, dir = append(vip, v), append(dir, d)
	}
	v, d := median(vip), median(dir)
	t.add(row{What: what, Vipgate: fmt.Sprintf("%.2f Gbit/s", v), Ref: fmt.Sprintf("client -> pod directly: %.2f Gbit/s", d), Ratio: ratioTarget(v, d, 0.95)})
}

// parseIperf returns the receiver's throughput in Gbit/s from iperf3 -J output.
func parseIperf(out string) (float64, error) {
	_, bps, err := iperfSent(out)
	return bps / 1e9, err
}
