package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/test/lab"
)

// TestGatewayConnTable holds 1,000 long-lived TCP connections (500 on each of two VIPs) through two
// `vipgate gateway`s behind BIRD's ECMP (BFD) while the cluster changes, and counts the broken ones:
//
//   - a node added and then removed again (no connection may break: established flows keep their
//     node through the gateways' connection table, whatever the Maglev slots say since);
//   - the same without the connection table (route forwarding only: a stateless rule in front of it,
//     the shape before the table), for comparison;
//   - a node drained (label vipgate.io/drain): it gets no new flows, its connections go on;
//   - a gateway killed while a node is added: reported per forwarding mode, not asserted (the flows
//     the dead gateway carried reach the survivor without a table entry there; in route forwarding
//     the survivor daisy-chains them to their slot's previous node).
//
// And, in route forwarding, iperf3 through the VIP with and without the connection table (the
// per-packet cost of conntrack and the ct mark lookups). Figures are logged, timings never asserted.
func TestGatewayConnTable(t *testing.T) {
	for _, fwd := range []string{"route", "route+fastPath", "nodePort"} {
		t.Run(fwd, func(t *testing.T) { testGatewayConnTable(t, fwd) })
	}
}

// routeFastPathConfig turns on route forwarding's netdev fast path ("route+fastPath", the default);
// routeDupConfig turns it off ("route": the dup shape).
const (
	routeFastPathConfig = "routeFastPath: {enabled: true}\n"
	routeDupConfig      = "routeFastPath: {enabled: false}\n"
)

// routeVariant is the forwarding mode and the config lines of a test variant: "route" is the dup
// shape, "route+fastPath" the netdev fast path.
func routeVariant(variant string) (forwarding, extra string) {
	switch variant {
	case "route":
		return "route", routeDupConfig
	case "route+fastPath":
		return "route", routeFastPathConfig
	}
	return variant, ""
}

func testGatewayConnTable(t *testing.T, forwarding string) {
	forwarding, extra := routeVariant(forwarding)
	fast := extra == routeFastPathConfig
	x := newGatewayPairLab(t, gwPairOpts{BFDMs: 100, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
		{Name: "node3", Pods: []string{"c1"}},
	}})
	l, dir, gws, bird, w := x.l, x.dir, x.gws, x.bird, x.w
	node1, node2, node3 := l.Node("node1"), l.Node("node2"), l.Node("node3")
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	eps := []string{gwEp(a1, "node1"), gwEp(a2, "node1"), gwEp(b1, "node2")}
	w.write("svc.yaml",
		gwService("web", "LoadBalancer", "10.96.7.1", "Cluster", []gwPort{{"http", "TCP", 80, 30080, "http"}}, gwStatus("203.0.113.10")),
		gwSlice("web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, eps...),
		gwService("web2", "LoadBalancer", "10.96.7.2", "Cluster", []gwPort{{"http", "TCP", 80, 30081, "http"}}, gwStatus("203.0.113.12")),
		gwSlice("web2", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, eps...),
		gwService("perf", "LoadBalancer", "10.96.7.3", "Cluster", []gwPort{{"iperf", "TCP", 5201, 30520, "iperf"}}, gwStatus("203.0.113.11")),
		gwSlice("perf", "IPv4", []gwSlicePort{{"iperf", "TCP", 5201}}, gwEp(a1, "node1")))
	// The gateways take the nodes from Node objects: adding, removing and draining a node is an
	// edit of this file.
	nodeDoc := func(n *lab.Node, drain bool) string {
		labels := "kubernetes.io/hostname: " + n.Name
		if drain {
			labels += ", " + gateway.DrainLabel + `: "true"`
		}
		return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {%s}\nstatus:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, labels, n.IPv4)
	}
	setNodes := func(drain1 bool, ns ...*lab.Node) {
		var docs []string
		for _, n := range ns {
			docs = append(docs, nodeDoc(n, drain1 && n == node1))
		}
		w.write("nodes.yaml", docs...)
	}
	setNodes(false, node1, node2)

	procs := map[string]*lab.Proc{}
	for _, n := range []*lab.Node{node1, node2, node3} {
		procs[n.Name] = x.start(t, n, "node", gwNodeConfig(n), filepath.Join(dir, n.Name+".log"))
	}
	for _, g := range gws {
		procs[g.Name] = x.start(t, g, "gateway", gwPairConfig(forwarding, g, gws, node1, node2)+"drainTimeout: 60s\n"+extra, filepath.Join(dir, g.Name+".log"))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
	both := []string{gws[0].IPv4.String(), gws[1].IPv4.String()}
	waitHops := func(prefix string, want []string, timeout time.Duration) {
		t.Helper()
		start := time.Now()
		for !slices.Equal(bird.NextHops(prefix), want) {
			if time.Since(start) > timeout {
				t.Fatalf("%s: next hops %v, want %v", prefix, bird.NextHops(prefix), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range []string{"203.0.113.10/32", "203.0.113.11/32", "203.0.113.12/32"} {
		waitHops(p, both, 30*time.Second)
	}
	if s := gwMany(t, l, lab.RoleClient, "tcp", "203.0.113.10:80", 20); s.OK != s.Sent {
		t.Fatalf("client -> VIP through the gateways: %d of %d answered: %v", s.OK, s.Sent, s.Errors)
	}
	if fast {
		// The fast path carried those connections: the packets themselves write the connection
		// table, so its entries are in the netdev table's gateway-flows, none in the IP table's.
		flows := 0
		for _, g := range gws {
			out, err := l.Exec(g.Name, "nft", "list", "table", "netdev", "vipgate-fwd4")
			if err != nil || !strings.Contains(out, "fwd ip to") {
				t.Fatalf("%s: no fast path table (err %v):\n%s", g.Name, err, out)
			}
			fastList, _ := l.Exec(g.Name, "nft", "list", "map", "netdev", "vipgate-fwd4", gateway.MapGatewayFlows)
			slow, _ := l.Exec(g.Name, "nft", "list", "map", "ip", "vipgate", gateway.MapGatewayFlows)
			flows += strings.Count(fastList, " expires ")
			if n := strings.Count(slow, " expires "); n > 0 {
				t.Errorf("%s: %d flows went through the IP stack's table, not the fast path:\n%s", g.Name, n, slow)
			}
		}
		if flows == 0 {
			t.Errorf("no flow in the fast path's connection table")
		}
		t.Logf("fast path: %d flows in the netdev tables' connection table", flows)
	}

	// The Maglev map of the mode: a node is a backend for new flows while it is in there.
	maglevMap := gateway.MapGatewayBackends
	if forwarding == "route" {
		maglevMap = gateway.MapGatewayRoutes
	}
	waitMaglev := func(alive []*lab.Node, n *lab.Node, present bool) {
		t.Helper()
		re := regexp.MustCompile(`: ` + regexp.QuoteMeta(n.IPv4.String()) + `\b`)
		for _, g := range alive {
			start := time.Now()
			for {
				out, err := l.Exec(g.Name, "nft", "list", "map", "ip", "vipgate", maglevMap)
				if err == nil && re.MatchString(out) == present {
					break
				}
				if time.Since(start) > 15*time.Second {
					t.Fatalf("%s: node %s present=%v in @%s not reached after 15s (err %v)", g.Name, n.Name, present, maglevMap, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	// hold opens 500 connections to each VIP and returns a function that waits for their verdict.
	hold := func(d time.Duration) func() (opened, broken int, errs map[string]int) {
		t.Helper()
		var hs []*lab.Hold
		for _, vip := range []string{"203.0.113.10:80", "203.0.113.12:80"} {
			h, err := l.StartHold(lab.RoleClient, vip, 500, d)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		for _, h := range hs {
			if _, err := h.WaitOpened(20 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		return func() (int, int, map[string]int) {
			ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
			defer cancel()
			opened, broken, errs := 0, 0, map[string]int{}
			for _, h := range hs {
				res, err := h.Wait(ctx)
				if err != nil {
					t.Fatal(err)
				}
				opened += res.Opened
				broken += res.Broken
				for k, v := range res.Errors {
					errs[k] += v
				}
			}
			return opened, broken, errs
		}
	}
	// stateless puts the shape before the connection table in front of it on both gateways (every
	// packet routed by Maglev alone) and returns its undo.
	stateless := func() func() {
		t.Helper()
		var undo []func()
		for _, g := range gws {
			// The kernel's gateway-routes is keyed by a mark (vipgate's netlink types), so nft wants
			// the slot in the packet mark first.
			gwSh(t, l, g.Name, "nft", "insert", "rule", "ip", "vipgate", gateway.ChainGatewayRoute,
				"meta", "mark", "set", "jhash", "ip", "saddr", ".", "th", "sport", ".", "ip", "daddr", ".", "th", "dport", "mod", "1021", "seed", "0x76697067",
				"dup", "to", "ip", "daddr", ".", "meta", "l4proto", ".", "th", "dport", ".", "meta", "mark", "map", "@"+gateway.MapGatewayRoutes, "drop",
				"comment", `"stateless"`)
			out, err := l.Exec(g.Name, "nft", "-a", "list", "chain", "ip", "vipgate", gateway.ChainGatewayRoute)
			m := regexp.MustCompile(`"stateless" # handle (\d+)`).FindStringSubmatch(out)
			if err != nil || m == nil {
				t.Fatalf("%s: finding the stateless rule: %v\n%s", g.Name, err, out)
			}
			name, handle := g.Name, m[1]
			undo = append(undo, func() {
				gwSh(t, l, name, "nft", "delete", "rule", "ip", "vipgate", gateway.ChainGatewayRoute, "handle", handle)
			})
		}
		return func() {
			for _, u := range undo {
				u()
			}
		}
	}
	// addRemove adds node3 and removes it again while 1,000 connections are held.
	addRemove := func(label string) {
		t.Helper()
		wait := hold(12 * time.Second)
		time.Sleep(time.Second)
		setNodes(false, node1, node2, node3)
		waitMaglev(gws, node3, true)
		time.Sleep(2 * time.Second)
		setNodes(false, node1, node2)
		waitMaglev(gws, node3, false)
		opened, broken, errs := wait()
		t.Logf("forwarding %s, %s: a node added, then removed, under %d long-lived connections: %d broken %v", forwarding, label, opened, broken, errs)
		if label == "connection table" && broken > 0 {
			t.Errorf("forwarding %s: %d of %d connections broke when a node was added and removed; the connection table must keep them", forwarding, broken, opened)
		}
	}
	addRemove("connection table")
	if forwarding == "route" && !fast { // stateless edits the IP table, which the fast path bypasses
		undo := stateless()
		addRemove("without the connection table")
		undo()
	}

	// Drain node1: out of the Maglev tables, its connections go on.
	wait := hold(10 * time.Second)
	time.Sleep(time.Second)
	setNodes(true, node1, node2)
	waitMaglev(gws, node1, false)
	opened, broken, errs := wait()
	t.Logf("forwarding %s: node1 drained (label %s) under %d long-lived connections: %d broken %v", forwarding, gateway.DrainLabel, opened, broken, errs)
	if broken > 0 {
		t.Errorf("forwarding %s: %d of %d connections broke when node1 was drained", forwarding, broken, opened)
	}
	if s := gwMany(t, l, lab.RoleClient, "tcp", "203.0.113.10:80", 20); s.OK != s.Sent {
		t.Errorf("new connections while node1 drains: %d of %d answered: %v", s.OK, s.Sent, s.Errors)
	}
	setNodes(false, node1, node2)
	waitMaglev(gws, node1, true)

	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("VIPGATE_IPERF_ROUNDS")); err == nil && n > 0 && n <= 20 {
		rounds = n
	}
	if fast {
		var fastRates []float64
		for range rounds {
			fastRates = append(fastRates, iperf(t, l, "a1", "203.0.113.11"))
		}
		t.Logf("iperf3 through the VIP on the fast path (netdev fwd), median of %d: %.2f Gbit/s", rounds, median(fastRates)/1e9)
	} else if forwarding == "route" {
		// The per-packet cost of the table: iperf3 through the VIP with it and without it
		// (alternating; VIPGATE_IPERF_ROUNDS rounds, default 1).
		var with, without []float64
		for range rounds {
			with = append(with, iperf(t, l, "a1", "203.0.113.11"))
			undo := stateless()
			without = append(without, iperf(t, l, "a1", "203.0.113.11"))
			undo()
		}
		tw, to := median(with), median(without)
		t.Logf("iperf3 through the VIP, median of %d: with the connection table %.2f Gbit/s, without (stateless Maglev) %.2f Gbit/s: %.3fx",
			rounds, tw/1e9, to/1e9, tw/to)
	}

	// A gateway dies while a node is added: the flows it carried reach the survivor, which has no
	// table entry for them: route forwarding sends a TCP packet without SYN to its slot's previous
	// node (daisy chaining); nodePort's SNAT state is lost with the gateway. BFD must be watching
	// over both gateways, or the dead one's route stays until the BGP hold timer (9 s) and its
	// connections stall; it is checked before the connections open, so that a slow BFD handshake
	// cannot make the kill land after their hold ended.
	d := waitBIRDBFDUp(t, bird, gws, 15*time.Second)
	t.Logf("BIRD's BFD sessions to both gateways Up (waited %v)", d.Round(time.Millisecond))
	wait = hold(14 * time.Second)
	time.Sleep(time.Second)
	setNodes(false, node1, node2, node3)
	waitMaglev(gws, node3, true)
	victim, survivor := gws[0], gws[1]
	gwSh(t, l, victim.Name, "ip", "link", "set", "eth0", "down")
	if err := procs[victim.Name].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitHops("203.0.113.10/32", []string{survivor.IPv4.String()}, 15*time.Second)
	opened, broken, errs = wait()
	t.Logf("forwarding %s: gateway %s killed while node3 was added, %d long-lived connections: %d survived, %d broken %v",
		forwarding, victim.Name, opened, opened-broken, broken, errs)
	if broken == opened {
		t.Errorf("forwarding %s: no connection survived the gateway's death", forwarding)
	}
}
