package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

// ctsyncSNAT are the SNAT addresses of gw1 and gw2 in the conntrack sync lab: spare LAN addresses.
var ctsyncSNAT = []string{"192.0.2.240", "192.0.2.241"}

// ctsyncScenario is one run of TestGatewayConntrackSync: what happens to the sync before the
// connections open (beforeOpen) and between their opening and the gateway's death (beforeKill).
type ctsyncScenario struct {
	name                   string
	beforeOpen, beforeKill func(t *testing.T, e *ctsyncEnv)
	// minSurvivors of 100 is asserted; below it the figure is only logged.
	minSurvivors int
}

// ctsyncEnv is what a scenario's hooks act on.
type ctsyncEnv struct {
	l         *lab.Lab
	gws       []*lab.Node
	stateDirs map[string]string
	pids      map[string]int
	procs     map[string]*lab.Proc
	// startGateway starts (again) the vipgate gateway of the named gateway.
	startGateway func(name string)
	// waitBoth waits until the router has both gateways as next hops of the VIP again.
	waitBoth func()
	// waitBFD waits until BIRD's BFD sessions to both gateways are Up: before a kill, or the dead
	// gateway's route stays until the BGP hold timer (9 s) and the connections through it stall.
	waitBFD func()
	// waitTakenOver waits until the named gateway's route has left the router and node1 sends
	// the replies to its SNAT address to the other gateway.
	waitTakenOver func(name string)
}

// TestGatewayConntrackSync is TestGatewayPair's lab (two gateways under ECMP at BIRD with BFD 300 ms
// x 3, two nodes) with forwarding nodePort and SNAT (eTP=Cluster under snat: auto), each gateway SNATing to
// its own SNAT address and replicating its conntrack table to the other with conntrackd
// (conntrackSync). 100 long-lived connections are opened, one gateway dies (link down, then
// SIGKILL), and the connections that survive are counted: the survivor holds the dead gateway's NAT
// state (conntrackd put it in its kernel table) and answers ARP for the dead gateway's SNAT address,
// so the nodes' replies reach it. Without the sync about half are reset (TestGatewayPair/nodePort).
// The scenarios add the sync's own failures before the gateway dies.
func TestGatewayConntrackSync(t *testing.T) {
	block := func(on bool) func(t *testing.T, e *ctsyncEnv) {
		return func(t *testing.T, e *ctsyncEnv) {
			for _, g := range e.gws {
				if on {
					gwSh(t, e.l, g.Name, "nft", "add table inet ctsync-test")
					gwSh(t, e.l, g.Name, "nft", "add chain inet ctsync-test out { type filter hook output priority 0; }")
					gwSh(t, e.l, g.Name, "nft", "add rule inet ctsync-test out udp dport 3780 drop")
				} else {
					gwSh(t, e.l, g.Name, "nft", "delete table inet ctsync-test")
				}
			}
			t.Logf("sync messages between the gateways blocked: %v", on)
		}
	}
	for _, sc := range []ctsyncScenario{
		{name: "gateway-dies", minSurvivors: 99},
		{
			// gw1's conntrackd is killed just before the connections open: vipgate restarts it
			// (backoff 0.5 s); the new daemon's bulk send (conntrackd -B) brings the flows gw1
			// created meanwhile to gw2.
			name: "conntrackd-restarted",
			beforeOpen: func(t *testing.T, e *ctsyncEnv) {
				if err := syscall.Kill(e.pids["gw1"], syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				t.Logf("killed gw1's conntrackd (pid %d)", e.pids["gw1"])
			},
			beforeKill: func(t *testing.T, e *ctsyncEnv) {
				start := time.Now()
				for {
					if pid := ctsyncPID(e.stateDirs["gw1"]); pid > 0 && pid != e.pids["gw1"] && procAlive(pid) {
						e.pids["gw1"] = pid
						break
					}
					if time.Since(start) > 10*time.Second {
						t.Fatal("vipgate did not restart gw1's conntrackd")
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Logf("gw1's conntrackd restarted by vipgate (pid %d)", e.pids["gw1"])
				time.Sleep(2 * time.Second)
			},
			minSurvivors: 99,
		},
		{
			// The sync messages are lost while the connections open, then flow again: FTFW's
			// sequence numbers and resends (or the next state change) must recover what was lost.
			name:       "sync-interrupted",
			beforeOpen: block(true),
			beforeKill: func(t *testing.T, e *ctsyncEnv) {
				block(false)(t, e)
				time.Sleep(3 * time.Second)
			},
		},
		// The sync is down when the gateway dies: what it NATed since is lost (measured, not
		// asserted).
		{name: "sync-down", beforeOpen: block(true)},
		{
			// gw2 "reboots" with the connections open: its vipgate and conntrackd are killed, its
			// kernel's conntrack table and rules flushed; once gw1 carries every flow (gw2's route
			// gone, gw2's SNAT address answered by gw1) it starts again. Once gw2 is back (BGP up
			// again, conntrackd's StartupResync done), gw1 dies: gw2 must have got gw1's flows back.
			name: "peer-rebooted",
			beforeKill: func(t *testing.T, e *ctsyncEnv) {
				if err := e.procs["gw2"].Kill(); err != nil {
					t.Fatal(err)
				}
				<-e.procs["gw2"].Done()
				gwSh(t, e.l, "gw2", "conntrack", "-F")
				gwSh(t, e.l, "gw2", "nft", "flush ruleset")
				e.waitTakenOver("gw2")
				// Counted from gw2's start: what meets it without state since.
				ctsyncStatelessProbe(t, e.l, "gw2")
				start := time.Now()
				e.startGateway("gw2")
				e.waitBoth()
				// gw1 dies next: BIRD asks for gw2's new BFD session only once BGP is up again,
				// and a kill before it is Up would go unnoticed until the hold timer.
				e.waitBFD()
				atReturn, _ := ctsyncStatelessCounts(t, e.l, "gw2")
				// The route came back only once the resync was over (the announcement hold).
				if line := ctsyncResyncLine(e.procs["gw2"].Log()); line == "" {
					t.Errorf("gw2's route is back at the router, but its vipgate has not logged the end of the initial resync")
				}
				for i := 0; ; i++ {
					if pid := ctsyncPID(e.stateDirs["gw2"]); pid > 0 && pid != e.pids["gw2"] && procAlive(pid) {
						e.pids["gw2"] = pid
						break
					}
					if i > 500 {
						t.Fatal("gw2's conntrackd did not start again")
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Logf("gw2 rebooted: back as a next hop at BIRD %v after its start", time.Since(start).Round(time.Millisecond))
				time.Sleep(2 * time.Second)
				// What met gw2 without its state: the measure of announcing before the resync is
				// over (logged, not asserted: it depends on the machine's timing).
				replies, client := ctsyncStatelessCounts(t, e.l, "gw2")
				t.Logf("gw2 after its return: %d replies to the SNAT addresses (%d of them before its route was back) and %d mid-flow client packets met no conntrack state; %s",
					replies, atReturn, client, ctsyncResyncLine(e.procs["gw2"].Log()))
			},
			minSurvivors: 99,
		},
		{
			// Issue #27: gw2 goes down, and a host at its address (the attacker, in gw2's
			// namespace) runs its own conntrackd against gw1: it replicates a DNAT entry to an
			// inside service, pushes its table and asks 20 times for a resync. gw1's relay lets none
			// of it through (no key): nothing planted, no table sent. Then gw2 comes back and syncs,
			// and gw1 dies as in the other scenarios.
			name: "lan-attacker",
			beforeKill: func(t *testing.T, e *ctsyncEnv) {
				if err := e.procs["gw2"].Kill(); err != nil {
					t.Fatal(err)
				}
				<-e.procs["gw2"].Done()
				e.waitTakenOver("gw2")
				ctsyncAttack(t, e)
				e.startGateway("gw2")
				e.waitBoth()
				e.waitBFD()
				for i := 0; ; i++ {
					if pid := ctsyncPID(e.stateDirs["gw2"]); pid > 0 && pid != e.pids["gw2"] && procAlive(pid) {
						e.pids["gw2"] = pid
						break
					}
					if i > 500 {
						t.Fatal("gw2's conntrackd did not start again")
					}
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(2 * time.Second)
			},
			minSurvivors: 99,
		},
	} {
		t.Run(sc.name, func(t *testing.T) { testGatewayConntrackSync(t, sc) })
	}
}

func testGatewayConntrackSync(t *testing.T, sc ctsyncScenario) {
	routers.RequireRoot(t, "bird", "birdc", "conntrackd", "conntrack")
	// Registered first, so it runs last, after the lab ended every process: conntrackd dies with
	// its gateway (Pdeathsig); a leftover is an error, and is ended by its pid.
	stateDirs := map[string]string{}
	pids := map[string]int{} // conntrackd's pid per gateway, as last seen
	t.Cleanup(func() {
		for name, pid := range pids {
			for i := 0; i < 20 && pid > 0 && procAlive(pid); i++ {
				time.Sleep(100 * time.Millisecond)
			}
			if pid > 0 && procAlive(pid) {
				t.Errorf("conntrackd of %s (pid %d) still runs after its gateway ended", name, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// An L2 pool too: the gateways' membership (which decides who answers for a dead gateway's SNAT
	// address) runs for the segments of the L2 pools. BFD at 300 ms: at 100 ms the survivor's
	// session flapped under load (see below).
	x := newGatewayPairLab(t, gwPairOpts{BFDMs: 300, L2: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	l, bin, dir, gws, bird, w := x.l, x.bin, x.dir, x.gws, x.bird, x.w
	node1, node2 := l.Node("node1"), l.Node("node2")
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	eps := []string{gwEp(a1, "node1"), gwEp(a2, "node1"), gwEp(b1, "node2")}
	w.write("svc.yaml",
		gwService("web", "LoadBalancer", "10.96.7.1", "Cluster", []gwPort{{"http", "TCP", 80, 30080, "http"}}, gwStatus("203.0.113.10")),
		gwSlice("web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, eps...),
		gwService("l2web", "LoadBalancer", "10.96.7.2", "Cluster", []gwPort{{"http", "TCP", 80, 30081, "http"}}, gwStatus("192.0.2.200")),
		gwSlice("l2web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, eps...))

	procs := map[string]*lab.Proc{}
	for _, n := range []*lab.Node{node1, node2} {
		procs[n.Name] = x.start(t, n, "node", gwNodeConfig(n), filepath.Join(dir, n.Name+".log"))
	}
	startGateway := func(name string) {
		i := 0
		if name == gws[1].Name {
			i = 1
		}
		g, peer := gws[i], gws[1-i]
		stateDirs[g.Name] = filepath.Join(dir, "ctsync-"+g.Name)
		cfgText := gwPairConfig("nodePort", g, gws, node1, node2) + fmt.Sprintf(`snatAddresses:
- {gateway: gw1, addresses: [%q]}
- {gateway: gw2, addresses: [%q]}
conntrackSync:
  peer: %q
  interface: eth0
  stateDir: %s
`, ctsyncSNAT[0], ctsyncSNAT[1], peer.IPv4, stateDirs[g.Name])
		p := x.start(t, g, "gateway", cfgText, filepath.Join(dir, fmt.Sprintf("%s-%d.log", g.Name, time.Now().UnixNano())))
		procs[g.Name] = p
	}
	for _, g := range gws {
		startGateway(g.Name)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(40))
			}
			for name, d := range stateDirs {
				b, _ := os.ReadFile(filepath.Join(d, "conntrackd.log"))
				t.Logf("--- conntrackd on %s:\n%s", name, tailLines(string(b), 20))
			}
		}
	})

	waitHops := func(prefix string, want []string, timeout time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			got := bird.NextHops(prefix)
			if strings.Join(got, ",") == strings.Join(want, ",") {
				return time.Since(start)
			}
			if time.Since(start) > timeout {
				out, _ := bird.Birdc("show", "route", "all")
				t.Fatalf("%s: next hops %v, want %v\n%s", prefix, got, want, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitHops("203.0.113.10/32", []string{gws[0].IPv4.String(), gws[1].IPv4.String()}, 30*time.Second)
	s := gwMany(t, l, lab.RoleClient, "tcp", "203.0.113.10:80", 30)
	if s.OK != s.Sent {
		t.Errorf("client -> BGP VIP through the gateways: %d of %d answered: %v", s.OK, s.Sent, s.Errors)
	}
	// Every gateway runs conntrackd, and /status says so.
	for _, g := range gws {
		pid := ctsyncPID(stateDirs[g.Name])
		if pid <= 0 || !procAlive(pid) {
			t.Fatalf("no conntrackd running for %s", g.Name)
		}
		pids[g.Name] = pid
		out, err := l.Exec(g.Name, bin, "status", "--output", "json")
		if err != nil || !strings.Contains(out, "conntrack sync: conntrackd up") {
			t.Errorf("vipgate status on %s does not report conntrackd up: %v\n%s", g.Name, err, out)
		}
	}

	env := &ctsyncEnv{l: l, gws: gws, stateDirs: stateDirs, pids: pids, procs: procs, startGateway: startGateway,
		waitBoth: func() {
			waitHops("203.0.113.10/32", []string{gws[0].IPv4.String(), gws[1].IPv4.String()}, 30*time.Second)
		},
		waitTakenOver: func(name string) {
			gone, other, snat := gws[0], gws[1], ctsyncSNAT[0]
			if name == gws[1].Name {
				gone, other, snat = gws[1], gws[0], ctsyncSNAT[1]
			}
			waitHops("203.0.113.10/32", []string{other.IPv4.String()}, 15*time.Second)
			mac, _ := l.Exec(other.Name, "cat", "/sys/class/net/eth0/address")
			for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
				out, _ := l.Exec(node1.Name, "ip", "neigh", "show", snat)
				if strings.Contains(out, strings.TrimSpace(mac)) {
					t.Logf("%s gone: its route left the router and %s answers for its SNAT address %s after %v", gone.Name, other.Name, snat, time.Since(start).Round(time.Millisecond))
					return
				}
				if time.Since(start) > 10*time.Second {
					t.Fatalf("node1's ARP entry for %s never moved to %s: %s", snat, other.Name, out)
				}
			}
		},
		waitBFD: func() {
			d := waitBIRDBFDUp(t, bird, gws, 15*time.Second)
			t.Logf("BIRD's BFD sessions to both gateways Up (waited %v)", d.Round(time.Millisecond))
		}}
	// A gateway dies while the connections are held: BFD must be watching over both gateways, or
	// the dead one's route stays until the BGP hold timer. It is checked before the connections
	// open, so that a slow BFD handshake cannot make the kill land after their hold ended.
	env.waitBFD()
	if sc.beforeOpen != nil {
		sc.beforeOpen(t, env)
	}
	const conns = 100
	hold, err := l.StartHold(lab.RoleClient, "203.0.113.10:80", conns, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.WaitOpened(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Let the replication settle, then count what each gateway NATed and what its peer holds of it.
	time.Sleep(time.Second)
	if sc.beforeKill != nil {
		sc.beforeKill(t, env)
	}
	dead, survivor := gws[0], gws[1]
	ownFlows := ctsyncFlows(t, l, dead.Name, ctsyncSNAT[0])
	replicated := ctsyncFlows(t, l, survivor.Name, ctsyncSNAT[0])
	survivorOwn := ctsyncFlows(t, l, survivor.Name, ctsyncSNAT[1])
	t.Logf("before the failure: %s NATed %d flows to %s, %d of them replicated into %s's kernel table; %s NATed %d to %s",
		dead.Name, ownFlows, ctsyncSNAT[0], replicated, survivor.Name, survivor.Name, survivorOwn, ctsyncSNAT[1])
	if os.Getenv("VIPGATE_CTSYNC_DEBUG") != "" {
		for _, g := range gws {
			out, _ := l.Exec(g.Name, "conntrackd", "-C", filepath.Join(stateDirs[g.Name], "conntrackd.conf"), "-s")
			t.Logf("conntrackd -s on %s:\n%s", g.Name, out)
			out, _ = l.Exec(g.Name, "sh", "-c", "conntrack -L -p tcp 2>/dev/null | grep -v 'dport=8088\\|dport=179' | head -8")
			t.Logf("conntrack -L on %s:\n%s", g.Name, out)
		}
	}
	if ownFlows == 0 || survivorOwn == 0 {
		t.Errorf("ECMP did not spread the connections over both gateways (%d, %d): the test proves nothing", ownFlows, survivorOwn)
	}

	deadPID := pids[dead.Name]
	killed := time.Now()
	gwSh(t, l, dead.Name, "ip", "link", "set", "eth0", "down")
	if err := procs[dead.Name].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := waitHops("203.0.113.10/32", []string{survivor.IPv4.String()}, 15*time.Second)
	t.Logf("gateway %s dead -> its route gone at BIRD in %v", dead.Name, gone.Round(time.Millisecond))
	// The SNAT address moves: node1 learns the survivor's MAC for it (gratuitous ARP).
	mac, _ := l.Exec(survivor.Name, "cat", "/sys/class/net/eth0/address")
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		out, _ := l.Exec(node1.Name, "ip", "neigh", "show", ctsyncSNAT[0])
		if strings.Contains(out, strings.TrimSpace(mac)) {
			t.Logf("SNAT address %s answered by %s %v after the kill", ctsyncSNAT[0], survivor.Name, time.Since(killed).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("node1's ARP entry for %s never moved to %s: %s", ctsyncSNAT[0], survivor.Name, out)
			break
		}
	}
	// The survivor's own route must stay at the router while the connections are counted: on this
	// shared 2-vCPU VM a stalled BFD can take it out (seen under load average 7), which would
	// measure the machine, not the sync.
	flapped := make(chan bool, 1)
	stopWatch := make(chan struct{})
	go func() {
		lost := false
		for {
			select {
			case <-stopWatch:
				flapped <- lost
				return
			case <-time.After(50 * time.Millisecond):
			}
			if len(bird.NextHops("203.0.113.10/32")) == 0 {
				lost = true
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	res, err := hold.Wait(ctx)
	close(stopWatch)
	if err != nil {
		t.Fatal(err)
	}
	if <-flapped {
		out, _ := bird.Birdc("show", "protocols")
		load, _ := os.ReadFile("/proc/loadavg")
		t.Skipf("%s: the survivor's route left the router during the measurement (its BGP/BFD session flapped; load %s): %d of %d survived, not counted\n%s",
			sc.name, strings.TrimSpace(string(load)), res.Opened-res.Broken, res.Opened, out)
	}
	t.Logf("%s: %d long-lived connections (forwarding nodePort, SNAT, conntrackSync) across the death of %s: %d opened, %d survived, %d broken %v",
		sc.name, conns, dead.Name, res.Opened, res.Opened-res.Broken, res.Broken, res.Errors)
	if res.Opened != conns || res.Opened-res.Broken < sc.minSurvivors {
		t.Errorf("%d of %d connections survived, want at least %d of %d", res.Opened-res.Broken, res.Opened, sc.minSurvivors, conns)
	}
	s = gwMany(t, l, lab.RoleClient, "tcp", "203.0.113.10:80", 20)
	if s.OK != s.Sent {
		t.Errorf("after the failover, new connections through %s: %d of %d answered: %v", survivor.Name, s.OK, s.Sent, s.Errors)
	}
	if deadPID > 0 && procAlive(deadPID) {
		t.Errorf("the dead gateway's conntrackd (pid %d) outlived it", deadPID)
	}
}

// ctsyncFlows counts the established TCP conntrack entries in role's namespace whose replies go to snat.
func ctsyncFlows(t *testing.T, l *lab.Lab, role, snat string) int {
	t.Helper()
	out, err := l.Exec(role, "conntrack", "-L", "-p", "tcp", "--state", "ESTABLISHED", "--reply-dst", snat)
	if err != nil && !strings.Contains(out, "flow entries") {
		t.Fatalf("conntrack -L in %s: %v\n%s", role, err, out)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tcp ") {
			n++
		}
	}
	return n
}

// ctsyncPID is the pid of the conntrackd vipgate runs with state directory dir (0 if none).
func ctsyncPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "conntrackd.conf.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// procAlive says a process with this pid exists and is not a zombie.
func procAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctsyncStatelessProbe adds to role's namespace a table that counts, after conntrack and before
// vipgate's guard, the packets of established flows that meet no conntrack state there: replies to
// the SNAT addresses (the guard drops them) and the client's mid-flow TCP packets to the BGP VIP (no
// SYN: a flow the router moved to a gateway that lacks its state). It outlives vipgate's restarts
// (a table of its own) and goes with the lab's namespace.
func ctsyncStatelessProbe(t *testing.T, l *lab.Lab, role string) {
	t.Helper()
	for _, cmd := range []string{
		"add table inet ctsync-probe",
		"add chain inet ctsync-probe pre { type filter hook prerouting priority -160; }",
		fmt.Sprintf(`add rule inet ctsync-probe pre ip daddr %s ct state new,invalid counter comment "replies"`, ctsyncSNAT[0]),
		fmt.Sprintf(`add rule inet ctsync-probe pre ip daddr %s ct state new,invalid counter comment "replies"`, ctsyncSNAT[1]),
		`add rule inet ctsync-probe pre ip daddr 203.0.113.10 tcp flags & syn == 0 ct state new,invalid counter comment "client"`,
	} {
		gwSh(t, l, role, "nft", cmd)
	}
}

// ctsyncStatelessCounts reads the packet counters of ctsyncStatelessProbe.
func ctsyncStatelessCounts(t *testing.T, l *lab.Lab, role string) (replies, client int) {
	t.Helper()
	out, err := l.Exec(role, "nft", "list", "chain", "inet", "ctsync-probe", "pre")
	if err != nil {
		t.Fatalf("nft list chain inet ctsync-probe pre: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		n := -1
		for i := range f {
			if f[i] == "packets" && i+1 < len(f) {
				n, _ = strconv.Atoi(f[i+1])
			}
		}
		switch {
		case n < 0:
		case strings.Contains(line, `comment "replies"`):
			replies += n
		case strings.Contains(line, `comment "client"`):
			client = n
		}
	}
	return replies, client
}

// ctsyncResyncLine is vipgate's log line about the end of the initial resync ("" if it wrote none
// yet).
func ctsyncResyncLine(log string) string {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "initial resync over") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// ctsyncAttack is the attack of issue #27 on gw1 from gw2's namespace (gw2 down): a conntrackd of
// the attacker's own on the LAN at gw2's address, sending to gw1's sync port, without vipgate's
// relay and its key. It fails the test if the DNAT entry reaches gw1's kernel, if gw1's conntrackd
// takes a resync request, or if the attacker's conntrackd gets any entry from gw1.
func ctsyncAttack(t *testing.T, e *ctsyncEnv) {
	t.Helper()
	gw1, gw2 := e.gws[0], e.gws[1]
	dir, err := os.MkdirTemp("", "vgatk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	conf, err := ctsync.Render(ctsync.Config{Interface: "eth0", LocalAddress: gw2.IPv4, Peer: gw1.IPv4, Port: 3780, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	// conntrackd as it was before the relay: on the LAN; and replicating everything.
	conf = strings.Replace(conf, fmt.Sprintf("IPv4_address %s\n\t\tIPv4_Destination_Address %s\n", ctsync.DaemonAddress, ctsync.RelayAddress),
		fmt.Sprintf("IPv4_address %s\n\t\tIPv4_Destination_Address %s\n", gw2.IPv4, gw1.IPv4), 1)
	if i := strings.Index(conf, "\tFilter From Kernelspace {"); i >= 0 {
		conf = conf[:i] + "}\n"
	}
	paths := ctsync.PathsOf(dir)
	if err := os.WriteFile(paths.Config, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	gw1Log := filepath.Join(e.stateDirs[gw1.Name], "conntrackd.log")
	resyncs := func() int {
		b, _ := os.ReadFile(gw1Log)
		return strings.Count(string(b), "resync requested by other node")
	}
	before := resyncs()
	att, err := e.l.Start(gw2.Name, filepath.Join(dir, "attacker.log"), "conntrackd", "-C", paths.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = att.Kill(); <-att.Done() }()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(paths.Socket); err == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the attacker's conntrackd did not start:\n%s", att.Tail(20))
		}
	}
	gwSh(t, e.l, gw2.Name, "conntrack", "-I", "-p", "udp", "-s", "192.0.2.66", "-d", gw1.IPv4.String(), "--sport", "5555", "--dport", "53",
		"--dst-nat", "10.0.0.10:9999", "-t", "600")
	for _, flag := range []string{"-R", "-B"} {
		gwSh(t, e.l, gw2.Name, "conntrackd", "-C", paths.Config, flag)
	}
	for range 20 {
		gwSh(t, e.l, gw2.Name, "conntrackd", "-C", paths.Config, "-n")
	}
	// Without the relay the entry is in gw1's kernel within a second (gateway/ctsync,
	// TestSyncChannelAttack/on-LAN): this waits five times as long.
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(100 * time.Millisecond) {
		if out, _ := e.l.Exec(gw1.Name, "conntrack", "-L", "-s", "192.0.2.66"); strings.Contains(out, "src=192.0.2.66") {
			t.Fatalf("the attacker planted an entry in gw1's kernel:\n%s", out)
		}
	}
	if n := resyncs() - before; n > 0 {
		t.Errorf("gw1's conntrackd took %d of the attacker's resync requests", n)
	}
	stats, _ := e.l.Exec(gw2.Name, "conntrackd", "-C", paths.Config, "-s")
	if i := strings.Index(stats, "external inject:"); i < 0 || !strings.Contains(stats[i:], "connections created:\t\t           0") {
		t.Errorf("the attacker's conntrackd got entries from gw1:\n%s", stats)
	}
	t.Logf("the attacker's conntrackd at %s ran against %s: nothing planted, no resync request taken", gw2.IPv4, gw1.IPv4)
}
