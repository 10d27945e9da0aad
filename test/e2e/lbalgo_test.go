package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/test/lab"
)

// TestLBAlgorithms proves the per-Service balancing algorithms (vipgate.io/lb-algorithm) with real
// connections through `vipgate node` in the netns lab, and checks the tracer against them on the
// table read back from the kernel:
//
//   - round-robin: 10,000 new connections from one client spread evenly over the 3 pods (within 1%);
//   - source-hash: every client address keeps one pod, the one the tracer names for it;
//   - maglev answers from every pod; a bad value keeps the default (random) and says why in the log.
func TestLBAlgorithms(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	l := lab.NewForTest(t, dpLabSpec)
	d := dpStartVIPGate(t, l, nil)
	for _, p := range dpRoutedViaNode1 {
		if err := l.AddRoute(netip.MustParsePrefix(p), "node1"); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	pods := []*lab.Pod{a1, a2, b1}
	all := dpNames(pods...)

	// Dual-stack Services: the IPv6 rules (the two-field flow hash among them) carry real packets too.
	algos := []struct {
		name, ip, ip6, alg string
	}{
		{"rr", "10.96.5.1", "2001:db8:96::5:1", string(cluster.LBRoundRobin)},
		{"sh", "10.96.5.2", "2001:db8:96::5:2", string(cluster.LBSourceHash)},
		{"mg", "10.96.5.3", "2001:db8:96::5:3", string(cluster.LBMaglev)},
		{"bad", "10.96.5.4", "2001:db8:96::5:4", "leastconn"},
	}
	var docs []any
	for _, a := range algos {
		spec := dpSvcSpec{Name: a.name, ClusterIPs: []string{a.ip, a.ip6}, Ports: []dpSvcPort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, Target: 8080}}}
		svc := dpService(spec)
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: a.alg}
		docs = append(docs, svc)
		for _, es := range dpEndpointSlices(spec, dpReady(a1, a2, b1)) {
			docs = append(docs, es)
		}
	}
	d.write(t, "10-lbalgo.yaml", dpYamlDocs(docs...))
	for _, a := range algos {
		dpEventually(t, dpSettleTimeout, a.name+" answers", d.expectAnswer(t, "client", "tcp", dpAP(a.ip, 80), all))
		dpEventually(t, dpSettleTimeout, a.name+" answers on IPv6", d.expectAnswer(t, "client", "tcp", dpAP(a.ip6, 80), all))
	}
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		t.Run(fmt.Sprintf("IPv%d", fam), func(t *testing.T) { lbAlgorithmChecks(t, l, d, fam, pods) })
	}
	t.Run("invalid value keeps the default", func(t *testing.T) {
		s, err := l.ProbeMany("client", "tcp", "10.96.5.4:80", 60, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK != 60 || len(s.Pods) < 2 {
			t.Errorf("bad annotation: %d of 60 answered by %v, want random over the pods", s.OK, s.Pods)
		}
		d.waitLog(t, "node1", `unknown algorithm \"leastconn\"`, dpSettleTimeout)
	})
}

// lbAlgorithmChecks runs the round-robin, source-hash and maglev checks of TestLBAlgorithms in family
// fam.
func lbAlgorithmChecks(t *testing.T, l *lab.Lab, d *dpLab, fam cluster.Family, pods []*lab.Pod) {
	all := dpNames(pods...)
	podAddr := func(p *lab.Pod) netip.Addr {
		if fam == cluster.IPv6 {
			return p.IPv6
		}
		return p.IPv4
	}
	podByName := map[string]*lab.Pod{}
	for _, p := range pods {
		podByName[p.Name] = p
	}
	vip := func(v4, v6 string) string {
		if fam == cluster.IPv6 {
			return v6
		}
		return v4
	}
	hostport := func(ip string) string { return netip.AddrPortFrom(netip.MustParseAddr(ip), 80).String() }
	clientAddr := lab.Clientv4
	if fam == cluster.IPv6 {
		clientAddr = lab.Clientv6
	}
	a1, a2, b1 := pods[0], pods[1], pods[2]

	// The kernel's table of the node the client's traffic enters, read back and traced.
	node1Table := func(t *testing.T) *dataplane.Flat {
		t.Helper()
		fd, err := os.Open("/run/netns/" + l.NS("node1"))
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		f, err := (&dataplane.NetlinkProgrammer{NetNSFd: int(fd.Fd())}).ReadTable(fam, "vipgate")
		if err != nil {
			t.Fatalf("reading node1's table: %v", err)
		}
		return f
	}
	trace := func(f *dataplane.Flat, src netip.Addr, dst string) dataplane.Result {
		return dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: src, Dst: netip.MustParseAddr(dst), Proto: dataplane.ProtoTCP, Port: 80})
	}

	t.Run("round-robin", func(t *testing.T) {
		const n = 10000
		s, err := l.ProbeMany("client", "tcp", hostport(vip("10.96.5.1", "2001:db8:96::5:1")), n, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK != n {
			t.Fatalf("%d of %d connections answered: %v", s.OK, n, s.Errors)
		}
		even := float64(n) / float64(len(pods))
		worst := 0.0
		for _, p := range all {
			dev := (float64(s.Pods[p]) - even) / even
			worst = max(worst, dev, -dev)
		}
		t.Logf("round-robin IPv%d, %d new connections from one client: %v (largest deviation from even %.2f%%)", fam, n, s.Pods, 100*worst)
		if worst > 0.01 {
			t.Errorf("round-robin spread %v: %.2f%% from even, want within 1%%", s.Pods, 100*worst)
		}
		r := trace(node1Table(t), clientAddr, vip("10.96.5.1", "2001:db8:96::5:1"))
		if r.Outcome != dataplane.OutcomeDNAT || len(r.Candidates) != 3 {
			t.Errorf("tracer: %s, want DNAT to any of the 3 pods in turn\n%s", r, r.Explain())
		}
	})

	t.Run("source-hash", func(t *testing.T) {
		f := node1Table(t)
		const n = 200
		// The client behind the router enters node1; the pods a1 and a2 enter node1 too, b1 enters
		// node2 (whose table holds the same endpoints in the same order, so the same hash picks the
		// same pod).
		clients := []struct {
			role string
			addr netip.Addr
		}{{"client", clientAddr}, {"a1", podAddr(a1)}, {"a2", podAddr(a2)}, {"b1", podAddr(b1)}}
		seen := map[string]bool{}
		for _, c := range clients {
			s, err := l.ProbeMany(c.role, "tcp", hostport(vip("10.96.5.2", "2001:db8:96::5:2")), n, time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if s.OK != n || len(s.Pods) != 1 {
				t.Errorf("%s (%s): %d of %d answered by %v: want every connection on one pod", c.role, c.addr, s.OK, n, s.Pods)
				continue
			}
			var got string
			for p := range s.Pods {
				got = p
			}
			seen[got] = true
			r := trace(f, c.addr, vip("10.96.5.2", "2001:db8:96::5:2"))
			if r.Outcome != dataplane.OutcomeDNAT || len(r.Candidates) != 1 || r.Candidates[0].Endpoint.Addr() != podAddr(podByName[got]) {
				t.Errorf("%s (%s): every connection went to %s (%s); the tracer says %s\n%s", c.role, c.addr, got, podAddr(podByName[got]), r, r.Explain())
				continue
			}
			t.Logf("source-hash: %s (%s) -> %d of %d connections to %s; the tracer names %s", c.role, c.addr, n, n, got, r.Candidates[0].Endpoint)
		}
		t.Logf("source-hash: %d clients on %d distinct pods", len(clients), len(seen))
	})

	t.Run("maglev", func(t *testing.T) {
		s, err := l.ProbeMany("client", "tcp", hostport(vip("10.96.5.3", "2001:db8:96::5:3")), 300, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK != 300 || len(s.Pods) != 3 {
			t.Errorf("maglev: %d of 300 answered by %v, want every pod (the client's port changes per connection)", s.OK, s.Pods)
		}
		t.Logf("maglev IPv%d, 300 new connections: %v", fam, s.Pods)
		r := trace(node1Table(t), clientAddr, vip("10.96.5.3", "2001:db8:96::5:3"))
		if r.Outcome != dataplane.OutcomeDNAT || len(r.Candidates) != 3 || !strings.Contains(r.Candidates[0].Why, "jhash slots") {
			t.Errorf("tracer: %s, want the 3 pods by jhash slots\n%s", r, r.Explain())
		}
	})
}
