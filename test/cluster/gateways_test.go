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
	c := ownClusterSpec(t, Spec{Nodes: 2, Gateways: GatewaySpec{Count: 2, Forwarding: mode}})
	t.Cleanup(func() {
		if t.Failed() {
			for _, g := range c.Gateways {
				t.Logf("--- %s:\n%s", g.Name, g.proc.Tail(40))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
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
	if err := poll(ctx, 2*time.Minute, func(context.Context) error {
		if hops := routerNextHops(c, vip); !slices.Equal(hops, gws) {
			return fmt.Errorf("router's next hops for %s: %v, want the gateways %v", vip, hops, gws)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s announced by both gateways %.1f s after the Service had its IP", mode, vip, time.Since(start).Seconds())

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

	// A gateway dies under 200 held connections: its link goes down, BFD at the router drops it.
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
	var gone time.Duration
	if err := poll(ctx, 30*time.Second, func(context.Context) error {
		if hops := routerNextHops(c, vip); !slices.Equal(hops, gws[1:]) {
			return fmt.Errorf("next hops %v", hops)
		}
		gone = time.Since(killed)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err := hold.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: gateway %s died: the router dropped it after %.0f ms; held connections %d opened, %d broken (%v)",
		mode, dead.Name, float64(gone.Microseconds())/1000, res.Opened, res.Broken, res.Errors)
	if mode == "route" && res.Broken != 0 {
		t.Errorf("route forwarding: %d of %d held connections broke when a gateway died; the nodes hold their state, want 0", res.Broken, res.Opened)
	}
	// The survivor still answers new connections.
	for _, src := range srcs {
		if r := probeOnceFrom(c.Lab.NS(lab.RoleClient), src, vip+":8080"); r.pod == "" {
			t.Errorf("%s: after %s died, from %s: %s", mode, dead.Name, src, r.err)
		}
	}
}

// EnvGatewayE2E enables TestGatewaysUpstreamLoadBalancers (long: `make test-cluster-gateways`).
const EnvGatewayE2E = "VIPGATE_GATEWAY_E2E"

// TestGatewaysUpstreamLoadBalancers runs the upstream `[sig-network] LoadBalancers` specs with the
// gateways as the load balancer (their pool is the default one, GatewaySpec.Default), in the
// forwarding mode of $VIPGATE_GATEWAY_E2E (nodePort, direct or route), and logs every result; the
// same specs with vipgate's node speaker are TestConformanceSubset's and `make conformance`'s.
func TestGatewaysUpstreamLoadBalancers(t *testing.T) {
	mode := os.Getenv(EnvGatewayE2E)
	if mode == "" {
		t.Skipf("set %s=route|nodePort|direct to run the upstream LoadBalancers specs through the gateways", EnvGatewayE2E)
	}
	c := ownClusterSpec(t, Spec{Nodes: 2, Gateways: GatewaySpec{Count: 2, Forwarding: mode, Default: true}})
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
	res, err := c.RunE2E(ctx, E2EOptions{Focus: `\[sig-network\] LoadBalancers`, Skip: `\[Disruptive\]|\[Serial\]`, ReportDir: dir, Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upstream [sig-network] LoadBalancers through the gateways (%s) in %.0f s: %s", mode, time.Since(start).Seconds(), Totals(res))
	for _, r := range res {
		t.Logf("%s: %s %s", r.State, r.Name, firstLine(r.Message))
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
