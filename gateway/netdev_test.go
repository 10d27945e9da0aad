package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestPlanNetdev: the fast path needs every node on-link through one device; its ingress devices
// are the configured ones, or every up interface (the nodes' one too: a one-armed gateway).
func TestPlanNetdev(t *testing.T) {
	n1, n2 := netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12")
	devs := map[netip.Addr]string{n1: "n0", n2: "n0"}
	fp := &FastPath{
		NodeDevice: func(a netip.Addr) (string, bool, error) {
			if d, ok := devs[a]; ok {
				return d, true, nil
			}
			return "", false, errors.New("no route")
		},
		Interfaces: func() ([]string, error) { return []string{"s1", "n0", "s0"}, nil },
	}
	if p := planNetdev(fp, []netip.Addr{n1, n2}); p.why != "" || p.nodeDev != "n0" || strings.Join(p.ingress, ",") != "n0,s0,s1" {
		t.Errorf("default devices: %+v, want ingress n0,s0,s1 and node device n0", p)
	}
	fp.Devices = []string{"s0"}
	if p := planNetdev(fp, []netip.Addr{n1}); p.why != "" || strings.Join(p.ingress, ",") != "s0" {
		t.Errorf("configured devices: %+v, want ingress s0", p)
	}
	devs[n2] = "n1"
	if p := planNetdev(fp, []netip.Addr{n1, n2}); !strings.Contains(p.why, "several devices") {
		t.Errorf("nodes on two devices: %+v, want no fast path", p)
	}
	if p := planNetdev(fp, []netip.Addr{netip.MustParseAddr("192.0.2.13")}); !strings.Contains(p.why, "no route") {
		t.Errorf("a node without a route: %+v, want no fast path", p)
	}
	if p := planNetdev(fp, nil); p.why == "" {
		t.Errorf("no nodes: %+v, want no fast path", p)
	}
}

// TestRenderNetdevChecks: ingress chains only in netdev tables, with devices, and fwd only there.
func TestRenderNetdevChecks(t *testing.T) {
	ing := &dataplane.Chain{Name: "in", Type: dataplane.FilterType, Hook: dataplane.HookIngress, Priority: 0}
	f := &dataplane.Flat{Family: dataplane.NetdevFamily(cluster.IPv4), Table: "t", Chains: map[string]*dataplane.Chain{"in": ing}}
	if err := dataplane.Render(io.Discard, f); err == nil || !strings.Contains(err.Error(), "without devices") {
		t.Errorf("an ingress chain without devices: %v", err)
	}
	ing.Devices = []string{"eth0"}
	f.Family = cluster.IPv4
	if err := dataplane.Render(io.Discard, f); err == nil || !strings.Contains(err.Error(), "hook ingress in a table of family ip") {
		t.Errorf("an ingress chain in an ip table: %v", err)
	}
	f.Family = dataplane.NetdevFamily(cluster.IPv4)
	if err := dataplane.Render(io.Discard, f); err != nil {
		t.Error(err)
	}
	ing.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActFwdJhashMap, Map: MapGatewayRoutes, Value: 7}}}
	f.Sets = map[string]*dataplane.Set{MapGatewayRoutes: {Name: MapGatewayRoutes, Kind: dataplane.KindTupleAddr}}
	if err := dataplane.Render(io.Discard, f); err == nil || !strings.Contains(err.Error(), "without a device") {
		t.Errorf("fwd without a device: %v", err)
	}
}

// TestGatewayFastPathPackets sends real UDP datagrams from a client through a gateway namespace to a
// node that holds the VIP, with the family's table alone (dup) and with the fast path (netdev
// ingress, fwd). The packets themselves write the connection table, so the table whose
// gateway-flows holds the flow is the one that forwarded it. (Both decrement the TTL: fwd does too,
// nft_fwd_neigh_eval, though it sends no ICMP error when it reaches 0.)
func TestGatewayFastPathPackets(t *testing.T) {
	cl, gw, node, fd, st := netdevUDPLab(t)
	vip := netdevVIP
	// A second port, for the datagram in fragments.
	svc := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "udp"}]
	svc.Ports = append(svc.Ports, cluster.ServicePort{Name: "big", Protocol: cluster.UDP, Port: 5001, NodePort: 30501})
	fast := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil }}
	for _, c := range []struct {
		name string
		fp   *FastPath
	}{
		{"dup", nil},
		{"fastPath", fast},
		{"dup again", nil}, // a gateway started without the fast path deletes its table
	} {
		prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
		p := routeGateway(cluster.IPv4, c.fp, prog)
		rep, err := p.Sync(st, nil)
		prog.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(rep.NoFastPath) > 0 {
			t.Fatalf("%s: no fast path: %v", c.name, rep.NoFastPath)
		}
		list := nftList(t, gw)
		if c.fp == nil {
			if strings.Contains(list, "table netdev") {
				t.Fatalf("%s: a netdev table is left without the fast path:\n%s", c.name, list)
			}
		} else if !strings.Contains(list, "fwd ip to") || !strings.Contains(list, `devices = { "s0" }`) && !strings.Contains(list, `device "s0"`) {
			t.Fatalf("%s: the kernel's ruleset has no fwd ingress chain:\n%s", c.name, list)
		}
		if ttl := udpTTL(t, cl, node, vip, 5000, 1); ttl != "63" {
			t.Errorf("%s: datagram arrived with TTL %s, want 63 (64, decremented once)", c.name, ttl)
		}
		ip, fwd := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4")
		want := [2]int{1, 0}
		if c.fp != nil {
			want = [2]int{0, 1}
		} else if c.name == "dup again" {
			// The fast path's flow too: copied into the IP table before the netdev table was
			// deleted (flowcopy.go); the new datagrams come from another port.
			want = [2]int{2, 0}
		}
		if got := [2]int{ip, fwd}; got != want {
			t.Errorf("%s: flows in the IP table %d, in the netdev table %d; want the flow in the %s table only\n%s",
				c.name, ip, fwd, map[bool]string{true: "netdev", false: "IP"}[c.fp != nil], lastLines(nftList(t, gw), 40))
		}
		// A datagram in fragments: the fast path leaves its first fragment, like the others, to
		// the IP stack (one taken by fwd would part it from the rest). So the family's table
		// remembers that flow, and the netdev table does not. (Whether it arrives is the IP
		// table's matter: the route shape loses a fragmented datagram to a VIP either way, as
		// nothing in that namespace reassembles it; see the report.)
		if c.fp != nil {
			udpSend(t, cl, vip, 5001, 4000)
			frag := func(family, table string) int {
				out, _ := exec.Command("ip", "netns", "exec", gw, "nft", "list", "map", family, table, MapGatewayFlows).CombinedOutput()
				return strings.Count(string(out), ". 5001 ")
			}
			if ip, fwd := frag("ip", "vipgate"), frag("netdev", "vipgate-fwd4"); ip != 1 || fwd != 0 {
				t.Errorf("%s: the fragmented datagram's flow is in the IP table %d times, in the netdev table %d times; want 1 and 0", c.name, ip, fwd)
			}
			// Traffic to no VIP (the node's own address, a VIP port's number) meets the ingress
			// chain's dispatch, which has no element for it: routed as by a plain router, and
			// remembered by neither table.
			ip0, fwd0 := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4")
			if ttl := udpTTL(t, cl, node, "192.0.2.11", 5000, 1); ttl != "63" {
				t.Errorf("%s: a datagram to the node's address arrived with TTL %s, want 63 (routed once)", c.name, ttl)
			}
			if ip, fwd := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4"); ip != ip0 || fwd != fwd0 {
				t.Errorf("%s: a datagram to no VIP changed the connection tables: IP %d -> %d, netdev %d -> %d", c.name, ip0, ip, fwd0, fwd)
			}
		}
	}
}

// netdevVIP is the VIP of netdevUDPLab's cluster, which netdevLab's node holds.
const netdevVIP = "203.0.113.50"

// netdevUDPLab opens the fast path's packet tests: it skips the test without the tools it needs,
// builds netdevLab's namespaces and returns them, a descriptor of the gateway's, and a cluster
// whose UDP VIP port (netdevVIP, 5000) leads to the node.
func netdevUDPLab(t *testing.T) (cl, gw, node string, fd int, st *cluster.State) {
	t.Helper()
	needNetnsTools(t, "ip", "python3", "nft")
	cl, gw, node = netdevLab(t)
	return cl, gw, node, nsFd(t, gw), gatewayUDPState(netdevVIP, "192.0.2.11")
}

// netdevLab builds client -- gateway -- node namespaces (198.51.100.0/25 between client and
// gateway, 192.0.2.0/24 between gateway and node, 203.0.113.50 on the node's lo) and returns their
// names; they are deleted when the test ends.
func netdevLab(t *testing.T) (cl, gw, node string) {
	t.Helper()
	p := fmt.Sprintf("vgt%d-dp%d", os.Getpid(), time.Now().UnixNano()%100000)
	cl, gw, node = p+"c", p+"g", p+"n"
	for _, ns := range []string{cl, gw, node} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "-n", cl, "link", "add", "eth0", "type", "veth", "peer", "name", "s0", "netns", gw)
	run("ip", "-n", gw, "link", "add", "n0", "type", "veth", "peer", "name", "eth0", "netns", node)
	run("ip", "-n", cl, "addr", "add", "198.51.100.10/25", "dev", "eth0")
	run("ip", "-n", gw, "addr", "add", "198.51.100.1/25", "dev", "s0")
	run("ip", "-n", gw, "addr", "add", "192.0.2.100/24", "dev", "n0")
	run("ip", "-n", node, "addr", "add", "192.0.2.11/24", "dev", "eth0")
	run("ip", "-n", node, "addr", "add", "203.0.113.50/32", "dev", "lo")
	for _, l := range [][2]string{{cl, "lo"}, {cl, "eth0"}, {gw, "lo"}, {gw, "s0"}, {gw, "n0"}, {node, "lo"}, {node, "eth0"}} {
		run("ip", "-n", l[0], "link", "set", l[1], "up")
	}
	run("ip", "-n", cl, "route", "add", "default", "via", "198.51.100.1")
	run("ip", "-n", node, "route", "add", "198.51.100.0/25", "via", "192.0.2.100")
	for _, ns := range []string{cl, gw, node} {
		run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	}
	run("ip", "netns", "exec", gw, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return cl, gw, node
}

func nsFd(t *testing.T, ns string) int {
	t.Helper()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// udpTTL sends datagrams of size bytes from namespace cl to vip:port until namespace node receives
// one (at most 5 s) and returns the TTL it arrived with.
func udpTTL(t *testing.T, cl, node, vip string, port, size int) string {
	t.Helper()
	recv := fmt.Sprintf(`
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 12, 1)  # IP_RECVTTL
s.bind(("0.0.0.0", %d))
s.settimeout(5)
print("ready", flush=True)
_, anc, _, _ = s.recvmsg(65536, 64)
print(int.from_bytes(anc[0][2][:4], "little"), flush=True)
`, port)
	rc := exec.Command("ip", "netns", "exec", node, "python3", "-c", recv)
	rc.Stderr = os.Stderr
	out, err := rc.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { rc.Process.Kill(); rc.Wait() }()
	buf := make([]byte, 64)
	n, _ := out.Read(buf) // "ready"
	if !strings.HasPrefix(string(buf[:n]), "ready") {
		t.Fatalf("receiver: %q", buf[:n])
	}
	sc := exec.Command("ip", "netns", "exec", cl, "python3", "-c", udpSendScript(vip, port, size, 10, "0.3"))
	if err := sc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sc.Process.Kill(); sc.Wait() }()
	var got strings.Builder
	got.Write(buf[:n])
	var rerr error
	for !strings.Contains(strings.TrimPrefix(got.String(), "ready\n"), "\n") && rerr == nil {
		n, rerr = out.Read(buf)
		got.Write(buf[:n])
	}
	ttl := strings.TrimSpace(strings.TrimPrefix(got.String(), "ready\n"))
	if ttl == "" {
		t.Fatalf("no datagram reached the node (%v)", rerr)
	}
	return ttl
}

// lastLines is the end of a listing, for failure messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestGatewayNetdevDecodeRoundTrip: the fast path's netdev tables, both families, programmed into a
// throwaway namespace and read back: the decoder proves the fwd rules (with their device) and the
// ingress chains (with theirs) against the encoder and returns exactly the model that was programmed.
func TestGatewayNetdevDecodeRoundTrip(t *testing.T) {
	ns, fd := testNetns(t)
	for _, pair := range [][2]string{{"s0", "s1"}, {"n0", "n1"}} {
		if out, err := exec.Command("ip", "-n", ns, "link", "add", pair[0], "type", "veth", "peer", "name", pair[1]).CombinedOutput(); err != nil {
			t.Fatalf("ip link add %s: %v: %s", pair[0], err, out)
		}
	}
	st := gwDualState()
	fp := &FastPath{Devices: []string{"s0", "s1"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil }}
	cfg := Config{Forwarding: cluster.ForwardRoute, FastPath: fp}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	defer prog.Close()
	p := NewProxier(hclog.NewNullLogger(), cfg, prog)
	if _, err := p.Sync(st, Health{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		want := p.Flatten(dataplane.NetdevFamily(f))
		if want == nil || len(want.Chains) == 0 {
			t.Fatalf("IPv%d: no fast path table", f)
		}
		got, err := prog.ReadTable(dataplane.NetdevFamily(f), dataplane.NetdevTableName("vipgate", f))
		if err != nil {
			t.Fatalf("IPv%d: reading the netdev table back: %v", f, err)
		}
		if ok, diff := dataplane.FlatEqual(want, got); !ok {
			t.Errorf("IPv%d: the kernel's netdev table decodes to something else: %s", f, diff)
		}
		if c := got.Chains[PrefixGatewayIngress+"s1"]; c == nil || !slices.Equal(c.Devices, []string{"s1"}) || c.Hook != dataplane.HookIngress {
			t.Errorf("IPv%d: ingress chain of s1 read back as %+v", f, c)
		} else if !slices.ContainsFunc(c.Rules, func(r dataplane.Rule) bool {
			return len(r.Matches) > 0 && r.Matches[0].Kind == dataplane.MatchPktTypeHost
		}) {
			t.Errorf("IPv%d: ingress chain of s1 read back without its pkttype match: %+v", f, c.Rules)
		}
		if ip, err := prog.ReadTable(f, "vipgate"); err != nil {
			t.Errorf("IPv%d: reading the family's table back: %v", f, err)
		} else if ok, diff := dataplane.FlatEqual(p.Flatten(f), ip); !ok {
			t.Errorf("IPv%d: the family's table decodes to something else: %s", f, diff)
		}
	}
}

// TestTraceNetdev: the tracer walks a fast path table from its ingress chains: a new flow to a VIP
// port goes by fwd to one of its nodes through the nodes' device, a packet to no VIP goes on to the
// IP stack, and a packet from the host is not seen.
func TestTraceNetdev(t *testing.T) {
	cfg := Config{Forwarding: cluster.ForwardRoute}.withDefaults()
	grs, err := BuildRuleset(cfg, cluster.IPv4, gwState(), Health{})
	if err != nil {
		t.Fatal(err)
	}
	f := gatewayNetdevRuleset(cfg, cluster.IPv4, grs, netdevPlan{ingress: []string{"eth0"}, nodeDev: "eth1"}).Flatten()
	res := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80})
	if res.Outcome != dataplane.OutcomeRoute || len(res.Candidates) != 2 {
		t.Fatalf("to the VIP: %s\n%s", res, res.Explain())
	}
	if ex := res.Explain(); !strings.Contains(ex, "fwd unchanged by device eth1") {
		t.Errorf("the trace does not name the device:\n%s", ex)
	}
	res = dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.99"), Proto: dataplane.ProtoTCP, Port: 80})
	if res.Outcome != dataplane.OutcomeAccept {
		t.Errorf("to no VIP: %s, want ACCEPT (on to the IP stack)", res)
	}
	res = dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80, FromHost: true})
	if res.Outcome != dataplane.OutcomeAccept {
		t.Errorf("from the host: %s, want ACCEPT (not seen)", res)
	}
}

// TestGatewayTraceModulusZero: a gateway rule whose flow hash has a modulus of 0 (no slots) is an
// error in a trace, not a packet that silently vanishes: the tracer spells each rule before it runs
// it, and the text of these kinds refuses the modulus (their trace hooks do not check it again).
func TestGatewayTraceModulusZero(t *testing.T) {
	for _, c := range []struct {
		fwd  cluster.Forwarding
		kind dataplane.ActionKind
	}{
		{cluster.ForwardNodePort, dataplane.ActDNATJhashMap},
		{cluster.ForwardRoute, dataplane.ActFlowPick},
	} {
		cfg := Config{Forwarding: c.fwd}.withDefaults()
		grs, err := BuildRuleset(cfg, cluster.IPv4, gwState(), Health{})
		if err != nil {
			t.Fatal(err)
		}
		f := grs.Ruleset.Flatten()
		zeroed := 0
		for _, ch := range f.Chains {
			for i, r := range ch.Rules {
				if r.Action.Kind == c.kind {
					ch.Rules[i].Action.Value = 0
					zeroed++
				}
			}
		}
		if zeroed == 0 {
			t.Fatalf("action kind %d: no rule of that kind in the %s gateway's table", c.kind, c.fwd)
		}
		res := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80})
		if res.Outcome != dataplane.OutcomeError || !strings.Contains(res.Reason, "jhash modulus 0") {
			t.Errorf("action kind %d: %s (%s), want an error for the modulus 0\n%s", c.kind, res.Outcome, res.Reason, res.Explain())
		}
	}
}

// udpSend sends three datagrams of size bytes from namespace cl to vip:port.
func udpSend(t *testing.T, cl, vip string, port, size int) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", cl, "python3", "-c", udpSendScript(vip, port, size, 3, "0.1")).CombinedOutput(); err != nil {
		t.Fatalf("sending: %v: %s", err, out)
	}
}

// udpSendScript is a Python program that sends count datagrams of size bytes to vip:port, gap
// seconds apart.
func udpSendScript(vip string, port, size, count int, gap string) string {
	return fmt.Sprintf(`
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(%d):
    s.sendto(b"x" * %d, (%q, %d))
    time.sleep(%s)
`, count, size, vip, port, gap)
}

// nsGatewayFlows counts the flows in the gateway-flows map of table (of family, "ip" or "netdev") in
// namespace ns.
func nsGatewayFlows(ns, family, table string) int {
	out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", family, table, MapGatewayFlows).CombinedOutput()
	return strings.Count(string(out), " expires ")
}

// netdevFailer is a Programmer whose netdev transactions fail while fail is set (all of them, the
// deletion too when failDelete is).
type netdevFailer struct {
	txs              []*dataplane.Tx
	fail, failDelete bool
}

func (r *netdevFailer) Apply(tx *dataplane.Tx) error {
	r.txs = append(r.txs, tx)
	if dataplane.IsNetdev(tx.Family) && r.fail && (r.failDelete || len(tx.AddChains) > 0 || !tx.Full) {
		return errors.New("no such file or directory")
	}
	return nil
}

// TestGatewayNetdevFailureDomain: a failing netdev transaction turns the fast path off (reported,
// the table deleted) but the sync succeeds, the family's table is never re-created for it, and a
// later sync writes the netdev table from scratch: not before the backoff (1 s, doubling) unless
// the plan changed, and the report asks for that retry (RetryAt). A lookup that fails (a link flap)
// keeps the previous plan rather than deleting the netdev table and its flows. A listed ingress
// device that does not exist is left out with a warning; none existing turns the fast path off.
func TestGatewayNetdevFailureDomain(t *testing.T) {
	st := gatewayUDPState("203.0.113.50", "192.0.2.11")
	var lookupErr error
	index := map[string]int{"s0": 2, "n0": 3}
	fp := &FastPath{Devices: []string{"s0"}, OmitMissing: true,
		NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", lookupErr == nil, lookupErr },
		Index:      func(d string) int { return index[d] }}
	prog := &netdevFailer{fail: true}
	p := routeGateway(cluster.IPv4, fp, prog)
	clock := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return clock }
	kinds := func() string {
		var out []string
		for _, tx := range prog.txs {
			out = append(out, fmt.Sprintf("%s/full=%v/chains=%d", dataplane.TableString(tx.Family, tx.Table), tx.Full, len(tx.AddChains)))
		}
		prog.txs = nil
		return strings.Join(out, " ")
	}
	// sync checks the transactions, the reason for no fast path, and the retry asked for: retry is
	// how long after the clock (0: none).
	sync := func(step, wantTxs, wantWhy string, retry time.Duration) *SyncReport {
		t.Helper()
		rep, err := p.Sync(st, nil)
		if err != nil {
			t.Fatalf("%s: the sync failed: %v", step, err)
		}
		why := strings.Join(rep.NoFastPath, "; ")
		if got := kinds(); got != wantTxs {
			t.Errorf("%s: transactions\n  %s\nwant\n  %s", step, got, wantTxs)
		}
		if wantWhy == "" && why != "" || !strings.Contains(why, wantWhy) {
			t.Errorf("%s: no fast path %q, want %q", step, why, wantWhy)
		}
		var want time.Time
		if retry > 0 {
			want = clock.Add(retry)
		}
		if !rep.RetryAt.Equal(want) {
			t.Errorf("%s: retry at %v, want %v", step, rep.RetryAt, want)
		}
		return rep
	}
	const write, del = "netdev table vipgate-fwd4/full=true/chains=2", "netdev table vipgate-fwd4/full=true/chains=0"
	sync("failing", "IPv4 table vipgate/full=true/chains=5 "+write+" "+del,
		"IPv4: programming netdev table vipgate-fwd4: no such file or directory", time.Second)
	clock = clock.Add(500 * time.Millisecond)
	sync("within the backoff: not sent again", "", "no such file", 500*time.Millisecond)
	clock = clock.Add(500 * time.Millisecond)
	sync("failing again, after the backoff", write+" "+del, "no such file", 2*time.Second)
	clock = clock.Add(time.Second)
	index["s0"] = 4 // a new plan may fix it: tried at once
	sync("a new plan within the backoff", write+" "+del, "no such file", 4*time.Second)
	prog.fail = false
	sync("fixed, still in the backoff", "", "no such file", 4*time.Second)
	clock = clock.Add(4 * time.Second)
	sync("fixed", write, "", 0)
	sync("unchanged", "", "", 0)
	lookupErr = errors.New("route get 192.0.2.11: network is down")
	sync("a lookup fails", "", "", 0)
	lookupErr = nil
	index["s0"] = 7 // s0 deleted and created again: its chain is gone with the old one
	sync("ingress device re-created", write, "", 0)

	// A listed device that does not exist gets no chain (older kernels refuse the whole table
	// for it): a warning, and the fast path on for the others.
	fp.Devices = []string{"s0", "x0"}
	rep := sync("x0 missing", "", "", 0)
	if w := strings.Join(rep.FastPathWarnings, "; "); w != "IPv4: ingress devices that do not exist (no chain until they do): x0" {
		t.Errorf("x0 missing: warnings %q", w)
	}
	index["x0"] = 9
	if rep := sync("x0 created", "netdev table vipgate-fwd4/full=true/chains=3", "", 0); len(rep.FastPathWarnings) != 0 {
		t.Errorf("x0 created: warnings %q", rep.FastPathWarnings)
	}
	index["s0"], index["x0"] = 0, 0
	sync("no listed device exists", del, "IPv4: no ingress device exists: s0, x0", 0)
	fp.Devices = []string{"s0"}
	index["s0"] = 7
	sync("s0 back", write, "", 0)

	prog.fail, prog.failDelete = true, true
	index["s0"] = 8
	sync("ingress device re-created, deletion fails too", write+" "+del, "deleting the table", time.Second)
	fp.Devices = nil
	fp.Interfaces = func() ([]string, error) { return nil, nil }
	sync("no devices, the stale table waits for the backoff", "", "no ingress devices", time.Second)
	clock = clock.Add(time.Second)
	sync("no devices, deletion fails", del, "no such file", 2*time.Second)
	prog.fail = false
	clock = clock.Add(2 * time.Second)
	sync("the stale table is deleted", del, "no ingress devices", 0)
	sync("gone", "", "no ingress devices", 0)
}

// TestGatewayNetdevDeviceChurn, in namespaces with real packets: an ingress device that does not
// exist (a misspelt routeFastPath.devices entry) either turns the fast path off without failing the
// sync, the family's table forwarding (older kernels: ENOENT), or gets a chain that waits for the
// device (6.18 hooks a device by name when it appears). A name the kernel refuses always fails.
// Either way the datagrams arrive, and the family's table is never re-created (it keeps its flows).
// A device that goes and comes back under its name gets its chain back.
func TestGatewayNetdevDeviceChurn(t *testing.T) {
	cl, gw, node, fd, st := netdevUDPLab(t)
	vip := netdevVIP
	lookup := dataplane.InterfaceIndexIn(fd)
	fp := &FastPath{Devices: []string{"s0", "x0"},
		NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil },
		Index: func(d string) int {
			i, _ := lookup(d)
			return i
		}}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	defer prog.Close()
	p := routeGateway(cluster.IPv4, fp, prog)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", gw}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	first := true
	// step syncs, checks that the report and the kernel agree on the fast path and that a datagram
	// arrives, and says whether the fast path is on.
	step := func(name string) bool {
		t.Helper()
		rep, err := p.Sync(st, nil)
		if err != nil {
			t.Fatalf("%s: the sync failed: %v", name, err)
		}
		for _, tx := range rep.Txs {
			if tx.Family == cluster.IPv4 && tx.Full && !first {
				t.Errorf("%s: the IPv4 table was re-created (its flows with it)", name)
			}
		}
		first = false
		rs := nftList(t, gw)
		fast := len(rep.NoFastPath) == 0
		if fast != strings.Contains(rs, "table netdev vipgate-fwd4") {
			t.Fatalf("%s: no fast path %v, but the kernel's ruleset:\n%s", name, rep.NoFastPath, lastLines(rs, 30))
		}
		if !fast && !strings.Contains(strings.Join(rep.NoFastPath, ""), "vipgate-fwd4") {
			t.Errorf("%s: the reason %v does not name the table", name, rep.NoFastPath)
		}
		if ttl := udpTTL(t, cl, node, vip, 5000, 1); ttl != "63" {
			t.Errorf("%s: datagram arrived with TTL %s, want 63", name, ttl)
		}
		t.Logf("%s: fast path %v %v", name, fast, rep.NoFastPath)
		return fast
	}
	// A device name the kernel refuses (longer than IFNAMSIZ-1): whatever the kernel, the netdev
	// transaction fails, and the family's table forwards alone.
	fp.Devices = []string{"s0", "a-sixteen-bytes!"}
	if step("a name the kernel refuses") {
		t.Fatalf("a name the kernel refuses: the fast path is on")
	}
	if n := nsGatewayFlows(gw, "ip", "vipgate"); n != 1 {
		t.Fatalf("a name the kernel refuses: %d flows in the IPv4 table, want the datagram's", n)
	}
	fp.Devices = []string{"s0", "x0"}
	if !step("x0 missing") && nsGatewayFlows(gw, "ip", "vipgate") != 1 {
		t.Fatalf("x0 missing, no fast path: %d flows in the IPv4 table, want the datagram's", nsGatewayFlows(gw, "ip", "vipgate"))
	}
	before := nsGatewayFlows(gw, "ip", "vipgate")
	ip("link", "add", "x0", "type", "veth", "peer", "name", "x0p")
	ip("link", "set", "x0", "up")
	if !step("x0 created") {
		t.Fatalf("x0 created: no fast path")
	}
	// The rewritten netdev table's flows were copied into the IPv4 table, and the new table seeded
	// from it (flowcopy.go): it holds them all and the new datagram's.
	if n, m := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4"); n < before || m != n+1 {
		t.Errorf("x0 created: flows in the IPv4 table %d, in the netdev table %d; want at least %d (kept) and one more", n, m, before)
	}
	ip("link", "del", "x0")
	step("x0 gone")
	ip("link", "add", "x0", "type", "veth", "peer", "name", "x0p")
	if !step("x0 back") || !strings.Contains(nftList(t, gw), "chain gateway-ingress-x0") {
		t.Errorf("x0 back: no fast path or no ingress chain for it")
	}
	ip("link", "del", "x0")
	ip("link", "add", "x0", "type", "veth", "peer", "name", "x0p")
	if !step("x0 re-created between syncs") || !strings.Contains(nftList(t, gw), "chain gateway-ingress-x0") {
		t.Errorf("x0 re-created: no fast path or no ingress chain for it")
	}
	// As the running gateway plans (OmitMissing): a listed device that does not exist gets no
	// chain, whatever the kernel would do with one, and the fast path stays on for the others.
	fp.OmitMissing = true
	fp.Devices = []string{"s0", "x0", "y0"}
	if !step("y0 missing, left out") {
		t.Errorf("y0 missing, left out: no fast path")
	}
	if rs := nftList(t, gw); strings.Contains(rs, "gateway-ingress-y0") || !strings.Contains(rs, "chain gateway-ingress-x0") {
		t.Errorf("y0 missing, left out: want chains of s0 and x0 alone:\n%s", lastLines(rs, 30))
	}
}

// TestGatewayNetdevOtherHost, with real frames: a frame to a VIP but to another host's MAC address
// (PACKET_OTHERHOST: a promiscuous device, or a frame a switch floods to both gateways of a LAN)
// is not the fast path's: the IP stack would drop it, and fwd would send it to a node, a duplicate
// of what the other gateway sends. Neither table takes it; the same datagram to the gateway's own
// address is forwarded by the fast path.
func TestGatewayNetdevOtherHost(t *testing.T) {
	cl, gw, node, fd, st := netdevUDPLab(t)
	vip := netdevVIP
	fp := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil }}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	defer prog.Close()
	p := routeGateway(cluster.IPv4, fp, prog)
	if rep, err := p.Sync(st, nil); err != nil || len(rep.NoFastPath) > 0 {
		t.Fatalf("sync: %v, no fast path %v", err, rep.NoFastPath)
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// The client sends the gateway's frames to another MAC address; s0 passes them up (promiscuous).
	run("ip", "-n", gw, "link", "set", "s0", "promisc", "on")
	run("ip", "-n", cl, "neigh", "replace", "198.51.100.1", "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "permanent")
	udpSend(t, cl, vip, 5000, 1)
	if ip, fwd := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4"); ip != 0 || fwd != 0 {
		t.Errorf("frames to another host: flows in the IPv4 table %d, in the netdev table %d; want none", ip, fwd)
	}
	run("ip", "-n", cl, "neigh", "del", "198.51.100.1", "dev", "eth0")
	if ttl := udpTTL(t, cl, node, vip, 5000, 1); ttl != "63" {
		t.Errorf("frames to the gateway: datagram arrived with TTL %s, want 63", ttl)
	}
	if ip, fwd := nsGatewayFlows(gw, "ip", "vipgate"), nsGatewayFlows(gw, "netdev", "vipgate-fwd4"); ip != 0 || fwd != 1 {
		t.Errorf("frames to the gateway: flows in the IPv4 table %d, in the netdev table %d; want 0 and 1", ip, fwd)
	}
}

// TestPlanNetdevNamesAndMTU: two devices whose names map to one chain name turn the fast path off
// with a reason naming both; an ingress device with a larger MTU than the nodes' device is named
// in a warning (fwd sends no ICMP fragmentation needed), and devices of equal or smaller MTU are not.
func TestPlanNetdevNamesAndMTU(t *testing.T) {
	n1 := netip.MustParseAddr("192.0.2.11")
	mtus := map[string]int{"n0": 1500, "s0": 9000, "s1": 1500, "s2": 1400}
	fp := &FastPath{
		Devices:    []string{"a+b", "a#b"},
		NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil },
		Index:      func(string) int { return 0 },
		MTU:        func(d string) int { return mtus[d] },
	}
	if p := planNetdev(fp, []netip.Addr{n1}); !strings.Contains(p.why, `"a#b" and "a+b" would share the chain gateway-ingress-a_b`) {
		t.Errorf("colliding names: %+v", p)
	}
	fp.Devices = []string{"s0", "s1", "s2", "n0"}
	p := planNetdev(fp, []netip.Addr{n1})
	if p.why != "" || !strings.Contains(p.bigMTU, "larger than n0's (1500): s0 (9000);") || strings.Contains(p.bigMTU, "s1") || strings.Contains(p.bigMTU, "s2") {
		t.Errorf("MTUs: why %q, warning %q; want s0 named alone", p.why, p.bigMTU)
	}
	fp.Devices = []string{"s1", "s2"}
	if p := planNetdev(fp, []netip.Addr{n1}); p.bigMTU != "" {
		t.Errorf("MTUs not larger: warning %q", p.bigMTU)
	}
}
