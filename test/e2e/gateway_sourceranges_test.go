package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestGatewaySourceRanges: `vipgate gateway` with forwarding: direct and the NAT fast path on (the
// default) enforces a Service's loadBalancerSourceRanges with real packets (issue #27). The gateway
// DNATs the VIP straight to the pods, so no node ever sees the VIP: unless the gateway checks the
// ranges, a tenant who set them is open to everyone. The lab's one client (198.51.100.10) is inside
// the ranges, then outside (no answer), then the ranges go and the NAT fast path takes the VIP port
// again.
func TestGatewaySourceRanges(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	oldTimeout := lab.ProbeTimeout
	lab.ProbeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { lab.ProbeTimeout = oldTimeout })

	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := gwBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	a1, b1 := l.Pod("a1"), l.Pod("b1")
	node1, node2 := l.Node("node1"), l.Node("node2")
	gwIP := lab.LANClientv4
	gwSh(t, l, lab.RoleRouter, "ip", "route", "add", "203.0.113.0/24", "via", gwIP.String())
	gwSh(t, l, lab.RoleLANClient, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for _, n := range l.Nodes() {
		gwSh(t, l, lab.RoleLANClient, "ip", "route", "add", n.PodCIDRv4.String(), "via", n.IPv4.String())
		gwSh(t, l, n.Name, "ip", "route", "add", lab.ClientNetv4.String(), "via", gwIP.String())
	}

	const vip = "203.0.113.60:80"
	w := &gwWriter{t: t, dir: manifests}
	write := func(ranges ...string) {
		extra := []string{gwStatus("203.0.113.60")}
		if len(ranges) > 0 {
			extra = append(extra, fmt.Sprintf("  loadBalancerSourceRanges: [%s]\n", strings.Join(ranges, ", ")))
		}
		w.write("web.yaml",
			gwService("web", "LoadBalancer", "10.96.5.9", "Cluster", []gwPort{{"http", "TCP", 80, 30089, "http"}}, extra...),
			gwSlice("web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, gwEp(a1, "node1"), gwEp(b1, "node2")))
	}
	write("198.51.100.0/24")

	for _, n := range l.Nodes() {
		cfg := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(gwNodeConfig(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Start(n.Name, filepath.Join(dir, n.Name+".log"), bin, "node", "--config", cfg, "--manifests", manifests); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(gwConfig("direct", gwIP, node1, node2)), 0o644); err != nil {
		t.Fatal(err)
	}
	gw, err := l.Start(lab.RoleLANClient, filepath.Join(dir, "gateway.log"), bin, "gateway", "--config", cfg, "--manifests", manifests)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- vipgate gateway:\n%s", gw.Tail(40))
			out, _ := l.Exec(lab.RoleLANClient, "nft", "list", "table", "ip", "vipgate")
			t.Logf("--- gateway table:\n%s", out)
		}
	})
	answered := func(r lab.ProbeResult) bool { return r.OK() && (r.Pod == "a1" || r.Pod == "b1") }
	// natTaken says whether vipgate explain on the gateway finds the VIP port on the NAT fast path.
	natTaken := func() bool {
		t.Helper()
		out, err := l.Exec(lab.RoleLANClient, bin, "explain", "--from", lab.Clientv4.String()+":40000", "--to", vip, "--output", "json")
		var rep struct {
			NATFastPath *struct{ Taken bool } `json:"natFastPath"`
		}
		if err != nil || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("vipgate explain on the gateway: %v\n%s", err, out)
		}
		return rep.NATFastPath != nil && rep.NATFastPath.Taken
	}
	// held: what the client gets stays so for three more new connections.
	held := func(step string, ok func(lab.ProbeResult) bool) {
		t.Helper()
		for range 3 {
			r, err := l.Probe(lab.RoleClient, "tcp", vip)
			if err != nil {
				t.Fatal(err)
			}
			if !ok(r) {
				t.Errorf("%s: %v", step, r)
			}
		}
	}

	// Inside the range: answered, by the family's table (the NAT fast path does not know ranges).
	gwWait(t, l, lab.RoleClient, "tcp", vip, answered)
	held("client inside the range", answered)
	if natTaken() {
		t.Errorf("a VIP port with loadBalancerSourceRanges is on the NAT fast path, which does not check them")
	}

	// Outside the range: no answer (dropped before DNAT, not rejected).
	write("192.0.2.250/32")
	dropped := func(r lab.ProbeResult) bool { return r.Err == "timeout" }
	gwWait(t, l, lab.RoleClient, "tcp", vip, dropped)
	held("client outside the range: want no answer", dropped)
	if out, _ := l.Exec(lab.RoleLANClient, "nft", "list", "chain", "ip", "vipgate", "fw-e2e/web/tcp/80"); !strings.Contains(out, "192.0.2.250") {
		t.Errorf("the gateway's fw- chain does not hold the range:\n%s", out)
	}

	// No ranges: open again, and the NAT fast path takes the VIP port back.
	write()
	gwWait(t, l, lab.RoleClient, "tcp", vip, answered)
	held("no ranges", answered)
	deadline := time.Now().Add(10 * time.Second)
	for !natTaken() {
		if time.Now().After(deadline) {
			t.Fatalf("without ranges, the VIP port is not back on the NAT fast path")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// forwarding: nodePort masquerades (snat auto, eTP=Cluster). A VIP port with ranges stays with
	// the family's table, whose masquerade must keep out of the NAT fast path's ports (61000-65535
	// by default): neither knows the other's, so a shared port would hand one flow's replies to the
	// other. With fully random ports over 1024-65535, 7 % of the flows landed in that range (issue #27).
	write("198.51.100.0/24")
	if err := gw.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(gwConfig("nodePort", gwIP, node1, node2)), 0o644); err != nil {
		t.Fatal(err)
	}
	if gw, err = l.Start(lab.RoleLANClient, filepath.Join(dir, "gateway-nodeport.log"), bin, "gateway", "--config", cfg, "--manifests", manifests); err != nil {
		t.Fatal(err)
	}
	// The previous run's program stays attached with its VIP ports (this one was on it) until
	// this run's first sync: probes before that would be its flows, not conntrack's.
	deadline = time.Now().Add(30 * time.Second)
	for natTaken() {
		if time.Now().After(deadline) {
			t.Fatalf("with ranges, the VIP port is still on the NAT fast path after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The client's own ports in that range: masquerade keeps a client's port when it may, so
	// conntrack must move every one of these flows.
	gwSh(t, l, lab.RoleClient, "sysctl", "-qw", "net.ipv4.ip_local_port_range=61000 65535")
	gwWait(t, l, lab.RoleClient, "tcp", vip, answered)
	gwMany(t, l, lab.RoleClient, "tcp", vip, 100)
	out, err := l.Exec(lab.RoleLANClient, "conntrack", "-L", "-p", "tcp", "--orig-dst", "203.0.113.60")
	if err != nil {
		t.Fatalf("conntrack -L: %v\n%s", err, out)
	}
	n, inFast := 0, 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		var dports []string
		for _, w := range f {
			if p, ok := strings.CutPrefix(w, "dport="); ok {
				dports = append(dports, p)
			}
		}
		if len(dports) != 2 {
			continue
		}
		var port int
		fmt.Sscan(dports[1], &port) // the reply's destination: the masquerade port
		n++
		if port >= 61000 {
			inFast++
			t.Errorf("conntrack masqueraded to port %d, one of the NAT fast path's: %s", port, line)
		}
	}
	t.Logf("nodePort: %d masqueraded flows in conntrack, %d on a NAT fast path port", n, inFast)
	if n < 50 { // a client port used twice is one entry
		t.Errorf("conntrack holds %d flows to the VIP, want most of the 100 probes':\n%s", n, out)
	}
}
