package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

const drainVIP = "203.0.113.91"

// frrPaths reads FRR's BGP paths to prefix: next hop -> its communities ("" when none).
func frrPaths(f *routers.FRR, prefix string) map[string]string {
	out, err := f.Vtysh("show bgp ipv4 unicast " + prefix + " json")
	if err != nil {
		return nil
	}
	var m struct {
		Paths []struct {
			Community struct {
				String string `json:"string"`
			} `json:"community"`
			Nexthops []struct {
				IP string `json:"ip"`
			} `json:"nexthops"`
		} `json:"paths"`
	}
	if json.Unmarshal([]byte(out), &m) != nil {
		return nil
	}
	got := map[string]string{}
	for _, p := range m.Paths {
		if len(p.Nexthops) > 0 {
			got[p.Nexthops[0].IP] = p.Community.String
		}
	}
	return got
}

// TestBGPDrainCordon: ordered drain over BGP (speaker/drain.go) with real FRR as the router, ECMP
// over two nodes. n1 is cordoned (the Node's spec.unschedulable, as kubectl drain sets it) while the
// client opens a new connection every 10 ms: FRR must see n1's route with GRACEFUL_SHUTDOWN first
// (and route to n2 alone: RFC 8326's local-pref 0), then see it withdrawn, with n1's session up all
// the while, and no new connection may be lost. Uncordoned, n1's route is back. Held connections
// through n1 are reported, not asserted: moving to n2 they meet a node without their conntrack
// entry.
func TestBGPDrainCordon(t *testing.T) {
	routers.RequireRoot(t, "/usr/lib/frr/bgpd", "/usr/lib/frr/zebra", "vtysh")
	b := newBGPLab(t, lab.NodeSpec{Name: "n1", Pods: []string{"a1"}}, lab.NodeSpec{Name: "n2", Pods: []string{"b1"}})
	l := b.l
	if out, err := l.Exec(lab.RoleRouter, "sysctl", "-w", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatalf("L4 multipath hashing in the router namespace: %v %s", err, out)
	}
	var peers []routers.FRRPeer
	for _, n := range l.Nodes() {
		peers = append(peers, routers.FRRPeer{Neighbor: n.IPv4, PeerASN: 64513})
	}
	n1, n2 := l.Node("n1").IPv4.String(), l.Node("n2").IPv4.String()
	bgpd := routers.FRRBGPConfig(netip.MustParseAddr("192.0.2.1"), 64512, peers...)
	bgpd = strings.Replace(bgpd, " address-family ipv4 unicast\n", " address-family ipv4 unicast\n  maximum-paths 8\n", 1)
	frr := routers.StartFRR(t, l.NS(lab.RoleRouter), routers.FRRConfig{BGPD: bgpd})

	write := func(cordonN1 bool) {
		var docs []string
		for _, n := range l.Nodes() {
			spec := ""
			if cordonN1 && n.Name == "n1" {
				spec = "spec: {unschedulable: true}\n"
			}
			docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n%sstatus:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, spec, n.IPv4))
		}
		b.w.write("metallb.yaml", append(docs, metallbDoc("IPAddressPool", "tor", `addresses: [203.0.113.64/26]`), metallbDoc("BGPPeer", "tor", `myASN: 64513
peerASN: 64512
peerAddress: 192.0.2.1
holdTime: 9s
connectTime: 1s`), metallbDoc("BGPAdvertisement", "tor", `ipAddressPools: [tor]`))...)
	}
	write(false)
	b.w.write("svc.yaml",
		ndService("drain", "LoadBalancer", "10.96.6.3", "Cluster", []ndPort{{"http", "TCP", 80, 30611, "http"}}, ndStatus(drainVIP)),
		ndSlice("drain", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(l.Pod("a1"), "n1"), ndEp(l.Pod("b1"), "n2")))
	for _, n := range l.Nodes() {
		b.start(n.Name, "--bgp-shutdown-drain=3s")
	}
	waitFor(t, "both next hops in FRR's FIB", 30*time.Second, func() bool {
		return slices.Equal(frrNextHops(frr, drainVIP+"/32"), []string{n1, n2})
	})
	waitFor(t, "kernel multipath route", 10*time.Second, func() bool { return len(kernelWeights(t, l, drainVIP)) == 2 })

	hold, err := l.StartHoldTimeout(lab.RoleClient, drainVIP+":80", 20, 9*time.Second, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.WaitOpened(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	type res struct {
		s   lab.ProbeSummary
		err error
	}
	done := make(chan res, 1)
	go func() {
		s, err := l.ProbeMany(lab.RoleClient, "tcp", drainVIP+":80", 700, 10*time.Millisecond)
		done <- res{s, err}
	}()
	time.Sleep(500 * time.Millisecond)
	cordoned := time.Now()
	write(true)
	// Seen at the router: GRACEFUL_SHUTDOWN on n1's path, then n1's path gone.
	var gshutAt, n2AloneAt, withdrawnAt time.Duration
	var gshutPaths map[string]string
	var gshutHops []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		p := frrPaths(frr, drainVIP+"/32")
		if gshutAt == 0 && strings.Contains(p[n1], "graceful-shutdown") {
			gshutAt, gshutPaths = time.Since(cordoned), p
		}
		if gshutAt != 0 && n2AloneAt == 0 {
			if hops := frrNextHops(frr, drainVIP+"/32"); slices.Equal(hops, []string{n2}) {
				n2AloneAt, gshutHops = time.Since(cordoned), hops
			}
		}
		if _, ok := p[n1]; p != nil && !ok {
			withdrawnAt = time.Since(cordoned)
			break
		}
	}
	up := frrEstablished(t, frr, n1)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	hr, err := hold.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for pod, c := range r.s.Pods {
		perNode[l.Pod(pod).Node.Name] += c
	}
	t.Logf("cordoned n1: FRR saw GRACEFUL_SHUTDOWN on n1's path after %v (paths %v), routed to %v alone after %v, n1's path withdrawn after %v, n1's session established after: %v",
		gshutAt.Round(time.Millisecond), gshutPaths, gshutHops, n2AloneAt.Round(time.Millisecond), withdrawnAt.Round(time.Millisecond), up)
	t.Logf("new connections: %d sent, %d ok, %d lost, longest gap %v, errors %v, answered per node %v; held connections: %d of %d broken %v",
		r.s.Sent, r.s.OK, r.s.Lost, r.s.MaxGap, r.s.Errors, perNode, hr.Broken, hr.Opened, hr.Errors)
	switch {
	case gshutAt == 0:
		t.Errorf("FRR never saw n1's route with GRACEFUL_SHUTDOWN")
	case withdrawnAt == 0:
		t.Errorf("n1's route not withdrawn")
	case withdrawnAt < gshutAt:
		t.Errorf("withdrawn (%v) before GRACEFUL_SHUTDOWN was seen (%v)", withdrawnAt, gshutAt)
	}
	if n2AloneAt == 0 {
		t.Errorf("FRR never routed to n2 alone while n1's route had GRACEFUL_SHUTDOWN")
	}
	if !up {
		t.Errorf("n1's session not established after the drain: the drain must keep it")
	}
	checkDrainLoss(t, "n1 drained", r.s.Sent, r.s.Lost, r.s.MaxGap, r.s.Errors)

	// Uncordoned: n1 announces again, without the community.
	write(false)
	waitFor(t, "both next hops again after the uncordon", 30*time.Second, func() bool {
		return slices.Equal(frrNextHops(frr, drainVIP+"/32"), []string{n1, n2})
	})
	if p := frrPaths(frr, drainVIP+"/32"); strings.Contains(p[n1], "graceful-shutdown") {
		t.Errorf("n1's path still has GRACEFUL_SHUTDOWN after the uncordon: %v", p)
	}
}

// frrEstablished says whether FRR's session with neighbor is established.
func frrEstablished(t *testing.T, f *routers.FRR, neighbor string) bool {
	t.Helper()
	out, err := f.Vtysh("show bgp neighbors " + neighbor + " json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]struct {
		State string `json:"bgpState"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("parsing neighbor JSON: %v: %s", err, out)
	}
	return m[neighbor].State == "Established"
}
