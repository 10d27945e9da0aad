package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// The gateway scenes: two `vipgate gateway`s (lab hosts gw1 and gw2, no pods) announce 203.0.113.20
// to the router by BGP, the router (BIRD) spreads flows over both (ECMP), and the gateways steer each
// flow, unchanged, to the node its Maglev slot names (forwarding: route); the node answers the client
// directly. Then gw1 dies: gw2 carries on, and the connections gw1 carried survive.
var gatewayVIPv4 = netip.MustParseAddr("203.0.113.20")

// gatewayNames are the lab hosts that run `vipgate gateway` rather than `vipgate node`.
var gatewayNames = []string{"gw1", "gw2"}

func isGateway(name string) bool { return slices.Contains(gatewayNames, name) }

// gateways is the running gateway part of the demo.
type gateways struct {
	l      *lab.Lab
	procs  map[string]*lab.Proc
	birdc  []string
	router *lab.Proc
}

// startGateways starts BIRD in the router (ECMP, BFD) and `vipgate gateway` on gw1 and gw2.
func startGateways(l *lab.Lab, dir, vipgate, manifests string) (*gateways, error) {
	if _, err := exec.LookPath("bird"); err != nil {
		return nil, errors.New("the gateway scenes need BIRD 2 (apt-get install bird2; `make demo` installs it)")
	}
	g := &gateways{l: l, procs: map[string]*lab.Proc{}}
	// Spread flows by ports too, not only addresses: one client's connections then use both gateways.
	if out, err := l.Exec(lab.RoleRouter, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		return nil, fmt.Errorf("router sysctl: %v: %s", err, out)
	}
	var conf strings.Builder
	conf.WriteString("router id 192.0.2.1;\nprotocol device {}\nprotocol kernel { ipv4 { export all; }; merge paths on; }\n" +
		"protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n")
	for _, name := range gatewayNames {
		fmt.Fprintf(&conf, "protocol bgp %s {\n  local 192.0.2.1 as 64512;\n  neighbor %s as 64512;\n  direct;\n  hold time 9;\n  connect retry time 1;\n  bfd on;\n  ipv4 { import all; export none; };\n}\n",
			name, l.Node(name).IPv4)
	}
	confPath := filepath.Join(dir, "bird.conf")
	sock := filepath.Join(dir, "bird.ctl")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		return nil, err
	}
	bird, err := l.Start(lab.RoleRouter, filepath.Join(dir, "bird.log"), "bird", "-f", "-c", confPath, "-s", sock, "-P", filepath.Join(dir, "bird.pid"))
	if err != nil {
		return nil, err
	}
	g.router = bird
	g.birdc = []string{"birdc", "-s", sock}
	for _, name := range gatewayNames {
		gw := l.Node(name)
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(gatewayConfig(l, gw)), 0o644); err != nil {
			return nil, err
		}
		args := []string{vipgate, "gateway", "--config", cfg, "--manifests", manifests}
		p, err := l.Start(name, filepath.Join(dir, "vipgate-"+name+".log"), args...)
		if err != nil {
			return nil, err
		}
		g.procs[name] = p
		fmt.Printf("started on %s: %s\n", name, strings.Join(args, " "))
	}
	fmt.Println("started on router: bird (BGP with gw1 and gw2, ECMP, BFD 100 ms x 3)")
	return g, nil
}

// gatewayConfig is the GatewayConfig of one demo gateway.
func gatewayConfig(l *lab.Lab, gw *lab.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: %s
gatewayIPs: [%q]
forwarding: route
snat: auto
healthCheckInterval: 250ms
clusterCIDRs: [%q]
serviceCIDRs: [%q]
speaker:
  members:
`, gw.Name, gw.IPv4, lab.ClusterCIDRv4, lab.ServiceCIDRv4)
	for _, name := range gatewayNames {
		fmt.Fprintf(&b, "  - {name: %s, address: %q}\n", name, l.Node(name).IPv4)
	}
	b.WriteString("nodes:\n")
	for _, n := range l.Nodes() {
		if !isGateway(n.Name) {
			fmt.Fprintf(&b, "  - {name: %s, addresses: [%q]}\n", n.Name, n.IPv4)
		}
	}
	return b.String()
}

// nextHops lists the router's next hops for the gateway VIP.
func (g *gateways) nextHops() []string {
	args := append(slices.Clone(g.birdc), "show", "route", "for", gatewayVIPv4.String()+"/32", "all")
	out, _ := g.l.Exec(lab.RoleRouter, args...)
	var hops []string
	for _, m := range regexp.MustCompile(`via (192\.0\.2\.\d+)`).FindAllStringSubmatch(out, -1) {
		hops = append(hops, m[1])
	}
	slices.Sort(hops)
	return slices.Compact(hops)
}

// waitHops waits until the router's next hops for the VIP are the given gateways.
func (g *gateways) waitHops(ctx context.Context, names []string, timeout time.Duration) (time.Duration, error) {
	var want []string
	for _, n := range names {
		want = append(want, g.l.Node(n).IPv4.String())
	}
	slices.Sort(want)
	start := time.Now()
	for {
		got := g.nextHops()
		if slices.Equal(got, want) {
			return time.Since(start), nil
		}
		if err := checkAlive(g.alive()); err != nil {
			return 0, err
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("router: next hops for %s are %v after %v, want %v (logs: %s)", gatewayVIPv4, got, timeout, want,
				strings.Join(logPaths(g.procs), ", "))
		}
		select {
		case <-ctx.Done():
			return 0, errors.New("interrupted")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// alive are the gateways still expected to run.
func (g *gateways) alive() map[string]*lab.Proc {
	out := map[string]*lab.Proc{}
	for n, p := range g.procs {
		if n != "gw1" || !g.gw1Dead() {
			out[n] = p
		}
	}
	return out
}

func (g *gateways) gw1Dead() bool {
	exited, _ := g.procs["gw1"].Exited()
	return exited
}

// killGW1 makes gw1 die as a machine does: its link goes down, then its process is killed.
func (g *gateways) killGW1() error {
	if out, err := g.l.Exec("gw1", "ip", "link", "set", "eth0", "down"); err != nil {
		return fmt.Errorf("gw1 link down: %v: %s", err, out)
	}
	return g.procs["gw1"].Signal(syscall.SIGKILL)
}

// gatewayScenes are the two gateway scenes; the second starts by killing gw1.
func gatewayScenes(ctx context.Context, g *gateways) []scene {
	allPods := []string{"web-1", "web-2", "web-3"}
	target := []netip.AddrPort{netip.AddrPortFrom(gatewayVIPv4, servicePort)}
	return []scene{
		{
			title:   "LoadBalancer through two gateways (BGP + ECMP at the router, Maglev at the gateways)",
			from:    "client",
			expect:  "any pod answers through gw1 or gw2 and a node; the pods see a node address (eTP=Cluster: the node SNATs)",
			targets: target,
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn(allPods...)),
			before: func() (string, error) {
				d, err := g.waitHops(ctx, gatewayNames, 30*time.Second)
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("router: %s/32 via %s (both gateways announce it; ready %v after the check started)",
					gatewayVIPv4, strings.Join(g.nextHops(), " and "), d.Round(time.Millisecond)), nil
			},
		},
		{
			title:   "gw1 dies (link down, process killed): BFD takes it out of the router, gw2 carries on",
			from:    "client",
			expect:  "every probe still answered, now all through gw2; the connections open across the failure survive",
			targets: target,
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn(allPods...)),
			before: func() (string, error) {
				// 40 connections held open (pinged) across the failure: the router spread them over
				// both gateways; gw2 must take gw1's to the same nodes.
				hold, err := g.l.StartHold(lab.RoleClient, netip.AddrPortFrom(gatewayVIPv4, servicePort).String(), 40, 4*time.Second)
				if err != nil {
					return "", err
				}
				if _, err := hold.WaitOpened(10 * time.Second); err != nil {
					return "", err
				}
				if err := g.killGW1(); err != nil {
					return "", err
				}
				d, err := g.waitHops(ctx, []string{"gw2"}, 15*time.Second)
				if err != nil {
					return "", err
				}
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				res, err := hold.Wait(wctx)
				if err != nil {
					return "", err
				}
				if res.Broken > 0 {
					return "", fmt.Errorf("%d of %d connections held across gw1's death broke: %v", res.Broken, res.Opened, res.Errors)
				}
				return fmt.Sprintf("router: gw1's route gone %v after it died; %s/32 via %s\n   connections open through both gateways while gw1 died: %d of %d survived",
					d.Round(time.Millisecond), gatewayVIPv4, strings.Join(g.nextHops(), " "), res.Opened-res.Broken, res.Opened), nil
			},
		},
	}
}
