package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// EnvGatewayModes selects the forwarding modes of TestGatewaysInFront (comma-separated; default
// route, the CI's short version). `make test-cluster-gateways` runs all three.
const EnvGatewayModes = "VIPGATE_GATEWAY_MODES"

// TestGatewaysInFront: two gateway VMs (gateways.go: own network, mount and UTS namespaces, vipgate
// installed from the package into their own root, started as the systemd unit says) in front of a
// real cluster (issue #28). A LoadBalancer Service created with kubectl in the gateways' pool
// answers a client outside the cluster through both gateways (BGP, ECMP at the router, BFD), with
// the client's address seen by the pod where the mode keeps it (route, eTP=Local); a Service in the
// gateways' L2 pool answers on the LAN. Then one gateway dies (its link goes down: BFD) under 200
// held connections: route forwarding keeps them all (the nodes hold the state; the survivor's
// Maglev picks the same node), the SNAT modes lose the dead gateway's share.
func TestGatewaysInFront(t *testing.T) {
	modes := []string{"route"}
	if v := os.Getenv(EnvGatewayModes); v != "" {
		modes = strings.Split(v, ",")
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { testGatewaysInFront(t, mode) })
	}
}

func testGatewaysInFront(t *testing.T, mode string) {
	spare := 0
	if os.Getenv(EnvGatewayDisruptions) != "" {
		spare = 1 // node3 joins in the long version
	}
	c := ownClusterSpec(t, Spec{Nodes: 2, Spare: spare, Gateways: GatewaySpec{Count: 2, Forwarding: mode, Deb: os.Getenv(EnvGatewayDeb), Kubeconfig: os.Getenv("VIPGATE_GATEWAY_KUBECONFIG")}})
	t.Cleanup(func() {
		if t.Failed() {
			for _, g := range c.Gateways {
				t.Logf("--- %s:\n%s", g.Name, g.proc.Tail(40))
			}
		}
	})
	budget := 8 * time.Minute
	if spare > 0 {
		budget = 14 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	// The router spreads one client's connections over both gateways by their ports too.
	if out, err := c.Lab.Exec(lab.RoleRouter, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	const ns = "gateways"
	kubectl(t, ctx, c, "create", "namespace", ns)
	// Route forwarding hands the client's packets to the nodes unchanged: with
	// externalTrafficPolicy Local the pods see the client (the gateways send only to nodes with a
	// ready pod, by their healthCheckNodePort). The SNAT modes masquerade (nodePort: at the gateway
	// and the node; direct: snat always, see gateways.go).
	keeps := mode == "route"
	etp := "Cluster"
	if keeps {
		etp = "Local"
	}
	apply(t, ctx, c, labServerDeployment(ns, "web", 4),
		lbService(ns, "web", "web", "gateway", etp),
		strings.Replace(lbService(ns, "web-lan", "web", "gateway-lan", "Cluster"), "name: tcp, port: 8080", "name: tcp, port: 8081", 1))
	kubectl(t, ctx, c, "-n", ns, "rollout", "status", "deployment/web", "--timeout=3m")
	vip := waitService(t, ctx, c, ns, "web").Status.LoadBalancer.Ingress[0].IP
	if !GatewayPool.Contains(mustAddr(t, vip)) {
		t.Fatalf("LoadBalancer IP %s is not from the gateways' pool %s", vip, GatewayPool)
	}
	lanVIP := waitService(t, ctx, c, ns, "web-lan").Status.LoadBalancer.Ingress[0].IP

	// BGP: both gateways are the router's next hops for the VIP, and no node announces it.
	gws := []string{c.Gateways[0].Lab.IPv4.String(), c.Gateways[1].Lab.IPv4.String()}
	start := time.Now()
	announced := waitNextHops(t, ctx, c, vip, gws, 2*time.Minute)
	t.Logf("%s: %s announced by both gateways %.1f s after the Service had its IP", mode, vip, announced.Sub(start).Seconds())

	// Answered from outside through the gateways, spread over pods; the pod sees the client where
	// the mode keeps its address.
	srcs := clientSources(t, c, 4)
	pods := map[string]bool{}
	if err := poll(ctx, time.Minute, func(context.Context) error {
		for _, src := range srcs {
			r := probeOnceFrom(c.Lab.NS(lab.RoleClient), src, vip+":8080")
			if r.pod == "" {
				return fmt.Errorf("from %s: %s", src, r.err)
			}
			pods[r.pod] = true
			seen, _, _ := strings.Cut(r.seen, ":")
			if keeps && seen != src.String() {
				t.Errorf("%s: the pod saw %s, want the client %s", mode, r.seen, src)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: the outside client reaches %s through the gateways; pods %d", mode, vip, len(pods))

	// L2: the LAN's router finds the L2 VIP at one gateway (ARP) and the client reaches it.
	if err := poll(ctx, time.Minute, func(context.Context) error {
		r := probeOnceFrom(c.Lab.NS(lab.RoleClient), lab.Clientv4, lanVIP+":8081")
		if r.pod == "" {
			return fmt.Errorf("L2 VIP %s: %s", lanVIP, r.err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: L2 VIP %s answers (router's neighbour entry: %s)", mode, lanVIP, neighMAC(c, lanVIP))

	// The gateways run with the ServiceAccount of deploy/manifests/12-rbac-gateway.yaml: it reads
	// Services, it cannot delete one.
	kc := filepath.Join(c.Dir, "gateway.kubeconfig")
	if _, err := c.Kubectl(ctx, "", "--kubeconfig", kc, "-n", ns, "get", "services"); err != nil {
		t.Errorf("the gateways' kubeconfig cannot list Services: %v", err)
	}
	if out, err := c.Kubectl(ctx, "", "--kubeconfig", kc, "-n", ns, "delete", "service", "web"); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("the gateways' kubeconfig deleted a Service (err %v): %s", err, out)
	}

	// A gateway dies under 200 held connections: its link goes down, BFD at the router drops it.
	// First both gateways deal the same backends (their health checks agree): a connection a
	// gateway pinned to a backend through a change (its connection table) is not known to the other.
	waitSameBackends(t, ctx, c, vip+":8080")
	if mode == "route" {
		// The pods became ready a node at a time: the change before the last is daisy-chained
		// for GatewayFlowTimeout, which would send the connections that start now, moved to the
		// survivor, to the previous node (docs/gateway.md, "Drain, node changes...").
		time.Sleep(GatewayFlowTimeout + time.Second)
	}
	hold, err := c.Lab.StartHold(lab.RoleClient, vip+":8080", 200, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.WaitOpened(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	dead := c.Gateways[0]
	killed := time.Now()
	if out, err := c.Lab.Exec(dead.Name, "ip", "link", "set", "eth0", "down"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	gone := waitNextHops(t, ctx, c, vip, gws[1:], 30*time.Second).Sub(killed)
	res, err := hold.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: gateway %s died: the router dropped it after %.0f ms; held connections %d opened, %d broken (%v)",
		mode, dead.Name, float64(gone.Microseconds())/1000, res.Opened, res.Broken, res.Errors)
	if mode == "route" && res.Broken != 0 {
		t.Errorf("route forwarding: %d of %d held connections broke when a gateway died; the nodes hold their state, want 0", res.Broken, res.Opened)
	}
	if strings.HasSuffix(mode, "+sync") && res.Broken > res.Opened/100 {
		t.Errorf("%s: %d of %d held connections broke when a gateway died; conntrack sync should keep 99 %%", mode, res.Broken, res.Opened)
	}
	// The survivor still answers new connections.
	for _, src := range srcs {
		if r := probeOnceFrom(c.Lab.NS(lab.RoleClient), src, vip+":8080"); r.pod == "" {
			t.Errorf("%s: after %s died, from %s: %s", mode, dead.Name, src, r.err)
		}
	}
	if os.Getenv(EnvGatewayDisruptions) == "" {
		return
	}

	// The long version (make test-cluster-gateways): the dead gateway comes back, then 1,000 held
	// connections through each of: a gateway package upgraded and restarted, a node drained.
	if out, err := c.Lab.Exec(dead.Name, "ip", "link", "set", "eth0", "up"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The kernel dropped the routes through eth0 with the link; a host's network manager puts them
	// back (without its default route an SNAT gateway cannot send the clients their replies).
	routes := []string{"route replace default via " + lab.RouterLANv4.String()}
	for _, n := range c.kubeLabNodes() {
		routes = append(routes, fmt.Sprintf("route replace %s via %s", n.PodCIDRv4, n.IPv4))
	}
	if err := lab.IPBatch(dead.Lab.NS, routes); err != nil {
		t.Fatal(err)
	}
	waitNextHops(t, ctx, c, vip, gws, time.Minute)
	held := func(what string, d, echo time.Duration, do func()) {
		t.Helper()
		waitSameBackends(t, ctx, c, vip+":8080")
		hold, err := c.Lab.StartHoldTimeout(lab.RoleClient, vip+":8080", 1000, d, echo)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hold.WaitOpened(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		start := time.Now()
		do()
		took := time.Since(start)
		res, err := hold.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s (%.1f s): held connections %d opened, %d broken (%v)", mode, what, took.Seconds(), res.Opened, res.Broken, res.Errors)
		if mode == "route" && what == "gateway package upgraded and restarted" && res.Broken != 0 {
			t.Errorf("route forwarding: %d of %d held connections broke when a gateway restarted, want 0", res.Broken, res.Opened)
		}
	}
	deb := c.gatewayDeb()
	if deb == "" {
		t.Logf("no package (make deb): the upgrade step reinstalls the binary")
	}
	held("gateway package upgraded and restarted", 25*time.Second, 0, func() {
		g := c.Gateways[1]
		if deb == "" {
			if err := g.Stop(); err != nil {
				t.Logf("stop: %v", err)
			}
			if err := c.StartGateway(g); err != nil {
				t.Fatal(err)
			}
		} else if err := c.UpgradeGateway(g, deb); err != nil {
			t.Fatal(err)
		}
		// Back in the router's ECMP set (BGP up again, its VIPs announced).
		waitNextHops(t, ctx, c, vip, gws, time.Minute)
	})
	held("node2 drained", 25*time.Second, 0, func() {
		kubectl(t, ctx, c, "drain", "node2", "--pod-selector=app=web", "--delete-emptydir-data", "--timeout=2m")
		kubectl(t, ctx, c, "-n", ns, "rollout", "status", "deployment/web", "--timeout=2m")
	})
	kubectl(t, ctx, c, "uncordon", "node2")
	// The pods spread over both nodes again (route forwarding deals to nodes with a ready pod).
	kubectl(t, ctx, c, "-n", ns, "rollout", "restart", "deployment/web")
	kubectl(t, ctx, c, "-n", ns, "rollout", "status", "deployment/web", "--timeout=2m")
	// A machine joins: its kubelet registers, the DaemonSets start vipgate and the CNI on it, and
	// the gateways take the new Node in (a backend of nodePort and direct forwarding at once; in
	// route forwarding it serves once pods run there). The hold outlasts the join. The joining
	// host's containerd imports its images on the same two CPUs as everything else, which delays
	// echoes by seconds (measured: 277 of 1,000 over the 2 s default, none reset): an echo may
	// take 10 s here, so only black-holed or reset connections count.
	held("node3 added", 90*time.Second, 10*time.Second, func() {
		n, err := c.AddNode(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s joined and is ready", mode, n.Name)
	})
}

// EnvGatewayDeb is the package the gateway hosts install (default: bin/vipgate_*_<arch>.deb).
const EnvGatewayDeb = "VIPGATE_GATEWAY_DEB"

// EnvGatewayDisruptions adds the long disruptions to TestGatewaysInFront (make test-cluster-gateways).
const EnvGatewayDisruptions = "VIPGATE_GATEWAY_DISRUPTIONS"

// EnvGatewayE2E enables TestGatewaysUpstreamLoadBalancers (long: `make test-cluster-gateways`).
const EnvGatewayE2E = "VIPGATE_GATEWAY_E2E"

// TestGatewaysUpstreamLoadBalancers runs the upstream `[sig-network] LoadBalancers` specs with the
// gateways as the load balancer (their pool is the default one, GatewaySpec.Default), in the
// forwarding mode of $VIPGATE_GATEWAY_E2E (nodePort, direct or route), and logs every result; the
// same specs with vipgate's node speaker are TestConformanceSubset's and `make conformance`'s.
func TestGatewaysUpstreamLoadBalancers(t *testing.T) {
	mode := os.Getenv(EnvGatewayE2E)
	if mode == "" {
		t.Skipf("set %s=route|nodePort|direct to run the upstream LoadBalancers specs through the gateways (speaker: the same specs with vipgate's node speaker, the baseline)", EnvGatewayE2E)
	}
	spec := Spec{Nodes: 2, Gateways: GatewaySpec{Count: 2, Forwarding: mode, Default: true, Deb: os.Getenv(EnvGatewayDeb)}}
	if mode == "speaker" {
		spec.Gateways = GatewaySpec{} // the nodes announce the cluster's pool by BGP
	}
	c := ownClusterSpec(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	if out, err := c.Lab.Exec(lab.RoleRouter, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	dir := filepath.Join(c.Dir, "e2e-gateways")
	logFile, err := os.Create(filepath.Join(c.Dir, "e2e-gateways.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	start := time.Now()
	focus := `\[sig-network\] LoadBalancers`
	if f := os.Getenv("VIPGATE_GATEWAY_E2E_FOCUS"); f != "" {
		focus += ".*" + f // e.g. "affinity"
	}
	res, err := c.RunE2E(ctx, E2EOptions{Focus: focus, Skip: `\[Disruptive\]|\[Serial\]`, ReportDir: dir, Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upstream %s through the gateways (%s) in %.0f s: %s", focus, mode, time.Since(start).Seconds(), Totals(res))
	for _, r := range res {
		t.Logf("%s: %s %s", r.State, r.Name, firstLine(r.Message))
		if r.State == E2EFailed {
			t.Errorf("FAILED through the gateways: %s", r.Name)
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// waitSameBackends waits until every gateway's last sync dealt vipPort to the same two or more
// backends (the "synced" log line's backends).
func waitSameBackends(t *testing.T, ctx context.Context, c *Cluster, vipPort string) {
	t.Helper()
	backends := func(g *Gateway) string {
		lines := strings.Split(g.Log(), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			_, b, ok := strings.Cut(lines[i], "backends=\"")
			if !ok {
				continue
			}
			for _, part := range strings.Split(strings.TrimSuffix(strings.TrimSpace(b), "\""), "; ") {
				if v, ok := strings.CutPrefix(part, vipPort+"="); ok {
					return v
				}
			}
			return ""
		}
		return ""
	}
	if err := poll(ctx, time.Minute, func(context.Context) error {
		first := backends(c.Gateways[0])
		for _, g := range c.Gateways {
			if b := backends(g); b != first || !strings.Contains(b, ",") {
				return fmt.Errorf("%s deals %s to %q, %s to %q", c.Gateways[0].Name, vipPort, first, g.Name, b)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitNextHops waits until the router's ECMP next hops for vip are want (sorted) and returns when
// it saw them.
func waitNextHops(t *testing.T, ctx context.Context, c *Cluster, vip string, want []string, timeout time.Duration) time.Time {
	t.Helper()
	if err := poll(ctx, timeout, func(context.Context) error {
		if hops := routerNextHops(c, vip); !slices.Equal(hops, want) {
			return fmt.Errorf("router's next hops for %s: %v, want %v", vip, hops, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}
