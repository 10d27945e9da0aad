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
	"strconv"
	"strings"
	"sync/atomic"
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
	// killed is set before gw1 is killed: from then on its exit is expected, whether or not it
	// has been reaped yet.
	killed atomic.Bool
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
	// BFD at 200 ms x 3: a peer silent for 600 ms is down. The gateways' BFDProfile (the demo
	// manifests) asks for 100 ms and the slower side sets the pace (RFC 5880), so this line sets
	// both directions. At 100 ms x 3 a busy machine fails the demo: on a loaded 2-core VM BIRD once
	// sent nothing for 350 ms, and the surviving gateway, rightly by the protocol, declared the
	// router dead and withdrew the VIP's last route (all 40 held connections broke). 600 ms still
	// lets TCP's retransmissions through the surviving gateway within the hold's 2 s (see the gw1
	// scene); measured at load 6-13: gw1's route gone 0.43-0.67 s after the kill.
	var conf strings.Builder
	conf.WriteString("router id 192.0.2.1;\nprotocol device {}\nprotocol kernel { ipv4 { export all; }; merge paths on; }\n" +
		"protocol bfd { interface \"*\" { min rx interval 200 ms; min tx interval 200 ms; multiplier 3; }; }\n")
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
	fmt.Println("started on router: bird (BGP with gw1 and gw2, ECMP, BFD 200 ms x 3)")
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

// bfdStates reads the router's BFD sessions: state by neighbor address.
func (g *gateways) bfdStates() map[string]string {
	args := append(slices.Clone(g.birdc), "show", "bfd", "sessions")
	out, _ := g.l.Exec(lab.RoleRouter, args...)
	return parseBFDSessions(out)
}

// bfdSessionLine is a session line of birdc's "show bfd sessions": neighbor, interface, state, ...
var bfdSessionLine = regexp.MustCompile(`(?m)^([0-9a-fA-F.:]+)[ \t]+\S+[ \t]+(\S+)`)

// parseBFDSessions reads birdc's "show bfd sessions" output: state by neighbor address.
func parseBFDSessions(out string) map[string]string {
	states := map[string]string{}
	for _, m := range bfdSessionLine.FindAllStringSubmatch(out, -1) {
		if _, err := netip.ParseAddr(m[1]); err == nil {
			states[m[1]] = m[2]
		}
	}
	return states
}

// waitBFD waits until the router's BFD sessions to the given gateways are Up.
//
// BIRD asks for a gateway's BFD session only once its BGP session is established, so the ECMP route
// through a gateway exists before BFD watches over it: the session starts Down, both sides send at
// the idle rate of one packet a second until they hear each other, and it comes Up up to a second
// after BGP (0-1 s measured here). A gateway that dies in that window is not detected by BFD at all
// (a session that was never Up does not go Down): the router keeps its route until the BGP hold
// timer (9 s) expires, 7.6-8.7 s after the kill in the runs measured, and the connections hashed
// to it stall that long. Without this wait the gateway scenes, which start as soon as both routes
// are there, killed gw1 before its BFD session was Up in 7 of 17 runs on a loaded machine, and
// 1-7 of the 40 held connections broke. BIRD 2.14's "strict bfd" would hold BGP back until
// BFD is Up; BIRD 2.0 has no such option, so the scene waits for it.
func (g *gateways) waitBFD(ctx context.Context, names []string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		states := g.bfdStates()
		up := true
		for _, n := range names {
			up = up && states[g.l.Node(n).IPv4.String()] == "Up"
		}
		if up {
			return time.Since(start), nil
		}
		if err := checkAlive(g.alive()); err != nil {
			return 0, err
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("router: BFD sessions %v after %v, want Up for %s (logs: %s)", states, timeout,
				strings.Join(names, ", "), strings.Join(logPaths(g.procs), ", "))
		}
		select {
		case <-ctx.Done():
			return 0, errors.New("interrupted")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// tcpRetransSegs reads the client's count of retransmitted TCP segments (RetransSegs of
// /proc/net/snmp, which is per network namespace).
func (g *gateways) tcpRetransSegs() (int, error) {
	out, err := g.l.Exec(lab.RoleClient, "cat", "/proc/net/snmp")
	if err != nil {
		return 0, fmt.Errorf("client /proc/net/snmp: %v: %s", err, out)
	}
	return parseRetransSegs(out)
}

// parseRetransSegs reads Tcp RetransSegs from /proc/net/snmp: a line of names, then one of values.
func parseRetransSegs(out string) (int, error) {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RetransSegs" && i < len(f) {
				return strconv.Atoi(f[i])
			}
		}
		break
	}
	return 0, errors.New("/proc/net/snmp: no Tcp RetransSegs")
}

// alive are the gateways still expected to run. It goes by killed, not by whether gw1 has exited:
// gw1 may exit between the two looks, which made a check report the killed gw1 as "exited early".
func (g *gateways) alive() map[string]*lab.Proc {
	out := map[string]*lab.Proc{}
	for n, p := range g.procs {
		if n != "gw1" || !g.killed.Load() {
			out[n] = p
		}
	}
	return out
}

// killGW1 makes gw1 die as a machine does: its link goes down, then its process is killed.
func (g *gateways) killGW1() error {
	g.killed.Store(true)
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
				// The scene shows BFD taking a dead gateway out within its 600 ms: that needs the
				// router's BFD sessions Up, not only the routes (see waitBFD).
				if _, err := g.waitBFD(ctx, gatewayNames, 15*time.Second); err != nil {
					return "", err
				}
				// 40 connections held open (pinged) across the failure: the router spread them over
				// both gateways; gw2 must take gw1's to the same nodes.
				//
				// Every connection must answer each ping within the hold's 2 s, which leaves TCP its
				// normal recovery and no more: a ping the router sent to gw1 before BFD took gw1's
				// route out is lost, and the client sends it again about 0.2, 0.4, 0.8 and 1.6 s later
				// (a tail loss probe, then the retransmission timer: 200 ms at least, doubling). With
				// BFD's 600 ms detection gw1's route is gone within 0.7 s, so the resend at 0.8 s (at
				// the latest the one at 1.6 s) gets through gw2: measured, the longest pause of a held
				// connection was 1.1 s, ping interval included. A connection that misses the 2 s
				// stalled longer than BFD allows. (In this lab the router's ECMP hash for a flow is the
				// client socket's hash, carried over the veth, which TCP draws anew at every
				// retransmission timeout: a stalled connection may also move to gw2 by chance before
				// the route goes, which hides a slow takeover from all but a few connections.)
				hold, err := g.l.StartHold(lab.RoleClient, netip.AddrPortFrom(gatewayVIPv4, servicePort).String(), 40, 4*time.Second)
				if err != nil {
					return "", err
				}
				if _, err := hold.WaitOpened(10 * time.Second); err != nil {
					return "", err
				}
				retrans, err := g.tcpRetransSegs()
				if err != nil {
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
				after, err := g.tcpRetransSegs()
				if err != nil {
					return "", err
				}
				if res.Broken > 0 {
					// The router's view now tells a slow takeover from a surviving gateway that
					// lost its BGP session (BFD down) while the connections were held.
					return "", fmt.Errorf("%d of %d connections held across gw1's death broke (%v; gw1's route gone %v after it died, "+
						"the client retransmitted %d segments; now the router's next hops are %v, its BFD sessions %v; hold log %s)",
						res.Broken, res.Opened, res.Errors, d.Round(time.Millisecond), after-retrans, g.nextHops(), g.bfdStates(),
						hold.Proc.LogPath)
				}
				return fmt.Sprintf("router: gw1's route gone %v after it died (BFD); %s/32 via %s\n"+
					"   connections open through both gateways while gw1 died: %d of %d survived (the client retransmitted %d segments)",
					d.Round(time.Millisecond), gatewayVIPv4, strings.Join(g.nextHops(), " "), res.Opened-res.Broken, res.Opened, after-retrans), nil
			},
		},
	}
}
