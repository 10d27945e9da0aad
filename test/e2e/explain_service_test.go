package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/test/lab"
)

// TestExplainServiceLive: `vipgate explain --service` on a running node joins both halves live.
// Two speakers announce one L2 VIP; on node1, explain (the agent's /explain and the kernel's
// table) names the owner that answers ARP on the LAN, both nodes as candidates, and the two
// endpoints half each; the pods that answer real connections are among them. node2 dies: explain
// on node1 then says node1 owns the VIP and that node2 is not a candidate in its membership view.
func TestExplainServiceLive(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"w1"}}, {Name: "node2", Pods: []string{"w2"}},
	}})
	x := newL2Lab(t, l)
	x.scanARP()
	x.extraConfig = "speaker:\n  members:\n"
	for _, n := range l.Nodes() {
		x.extraConfig += fmt.Sprintf("  - {name: %s, address: %q}\n", n.Name, n.IPv4)
	}
	var nodes []string
	for _, n := range l.Nodes() {
		nodes = append(nodes, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {kubernetes.io/hostname: %s}\n"+
			"status:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, n.Name, n.IPv4))
	}
	x.w.write("nodes.yaml", nodes...)
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec:
  addresses: [192.0.2.101/32]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
spec:
  ipAddressPools: [lan]
`)
	vip := netip.MustParseAddr("192.0.2.101")
	w1, w2 := l.Pod("w1"), l.Pod("w2")
	x.w.write("web.yaml", ndService("web", "LoadBalancer", "10.96.7.1", "Cluster", []ndPort{{"http", "TCP", 80, 0, "http"}}, ndStatus(vip.String())),
		ndSlice("web", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(w1, "node1"), ndEp(w2, "node2")))
	owner := hashOwner(vip, "node1", "node2")
	for _, n := range []string{"node1", "node2"} {
		x.start(n)
	}
	x.waitOwners([]netip.Addr{vip}, func(netip.Addr) string { return owner }, 15*time.Second)

	explainOn := func(node string) *explain.ServiceReport {
		t.Helper()
		out, err := l.Exec(node, x.bin, "explain", "--service", "e2e/web", "--output", "json")
		if err != nil {
			t.Fatalf("vipgate explain on %s: %v\n%s", node, err, out)
		}
		var rep explain.ServiceReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("decoding explain's JSON: %v\n%s", err, out)
		}
		if rep.Mode != "live" || rep.Node != node || len(rep.VIPs) != 1 || rep.VIPs[0].L2 == nil || len(rep.VIPs[0].Ports) != 1 {
			t.Fatalf("explain on %s: %s", node, out)
		}
		return &rep
	}
	podOf := map[string]string{w1.IPv4.String() + ":8080": "w1", w2.IPv4.String() + ":8080": "w2"}

	t.Run("both alive", func(t *testing.T) {
		v := explainOn("node1").VIPs[0]
		if v.L2.Owner != owner {
			t.Errorf("explain's owner %q, the LAN sees %s", v.L2.Owner, owner)
		}
		for _, n := range v.L2.Nodes {
			if !n.Candidate || n.Owner != (n.Node == owner) {
				t.Errorf("node %+v: want a candidate, owner iff %s", n, owner)
			}
		}
		p := v.Ports[0]
		var pods []string
		for _, b := range p.Backends {
			pods = append(pods, podOf[b.Endpoint])
			if b.Probability != 0.5 || !b.Masquerade {
				t.Errorf("backend %+v: want half the connections, masqueraded (eTP=Cluster)", b)
			}
		}
		slices.Sort(pods)
		if p.Outcome != "DNAT" || p.Trace.Ruleset != "kernel" || !slices.Equal(pods, []string{"w1", "w2"}) || len(p.Trace.Steps) == 0 {
			t.Errorf("port trace %s %s backends %v: want DNAT to w1 and w2 from the kernel's table", p.Outcome, p.Trace.Ruleset, pods)
		}
		// Real connections land on those backends only.
		for range 6 {
			r, err := l.Probe("lanclient", "tcp", netip.AddrPortFrom(vip, 80).String())
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK() || !slices.Contains(pods, r.Pod) {
				t.Errorf("probe of %s:80: %+v, want one of %v", vip, r, pods)
			}
		}
	})

	t.Run("node2 dead", func(t *testing.T) {
		x.procs["node2"].Kill()
		if out, err := l.Exec("node2", "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatalf("taking node2's link down: %v: %s", err, out)
		}
		x.waitOwners([]netip.Addr{vip}, func(netip.Addr) string { return "node1" }, 10*time.Second)
		v := explainOn("node1").VIPs[0]
		if v.L2.Owner != "node1" || !slices.Contains(v.L2.Interfaces, "eth0") {
			t.Errorf("owner %q on %v: want node1 on eth0", v.L2.Owner, v.L2.Interfaces)
		}
		for _, n := range v.L2.Nodes {
			if n.Node == "node2" && (n.Candidate || !strings.Contains(n.Reason, "not a candidate in node1's view")) {
				t.Errorf("node2: %+v", n)
			}
		}
		out, err := l.Exec("node1", x.bin, "explain", "--vip", vip.String())
		if err != nil || !strings.Contains(out, "L2:  owner node1") || !strings.Contains(out, "(live, as node node1 sees it)") {
			t.Errorf("vipgate explain --vip: %v\n%s", err, out)
		}
		t.Logf("vipgate explain --vip %s on node1:\n%s", vip, out)
	})
}
