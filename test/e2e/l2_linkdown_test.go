package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// Link-aware ownership (issue #32 item 1; cilium#35507, metallb#2026) on real packets. The
// three-node lab of TestL2FailoverFast gets a second network: every node's eth1 on a bridge of its
// own (203.0.113.64/26), and the speakers' members (speaker.members) are those addresses, so the
// membership heartbeats flow on eth1 while the VIPs are announced on eth0 (the LAN). The owner of
// a VIP loses eth0's carrier (its peer port on the LAN bridge set down: a pulled cable); its
// heartbeats go on. Before, it kept the VIP — a black hole. Now it withdraws from the segment and
// the next owner answers; the LAN client probes the VIP every 10 ms and the test reports the
// longest gap. Carrier back, the owner takes its VIPs back only after the hold-down
// (--l2-link-hold-down 2s), once: the scans see no flap. Then the same with eth0 set down in the
// owner's namespace (IFF_UP cleared, its routes flushed and put back when it is up again).
func TestL2LinkDown(t *testing.T) {
	const holdDown = 2 * time.Second
	x := newFastLab(t)
	l := x.l
	mgmt := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, 113, byte(64 + i)}) }
	lanNS := l.NS(lab.RoleLAN)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// The membership network: a bridge in the LAN namespace (only a bridge there: no address),
	// eth1 in every node. Everything is inside the lab's namespaces and goes with them.
	ip("-n", lanNS, "link", "add", "mg0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
	ip("-n", lanNS, "link", "set", "mg0", "up")
	x.extraConfig = "speaker:\n  members:\n"
	for _, n := range l.Nodes() {
		port := fmt.Sprintf("m%d", n.Index)
		ip("-n", n.NS, "link", "add", "eth1", "type", "veth", "peer", "name", port, "netns", lanNS)
		ip("-n", lanNS, "link", "set", port, "master", "mg0")
		ip("-n", lanNS, "link", "set", port, "up")
		ip("-n", n.NS, "addr", "add", mgmt(n.Index).String()+"/26", "dev", "eth1")
		ip("-n", n.NS, "link", "set", "eth1", "up")
		x.extraConfig += fmt.Sprintf("  - {name: %s, address: %q}\n", n.Name, mgmt(n.Index))
	}
	x.keyFlags = append(x.keyFlags, "--l2-link-hold-down", holdDown.String())
	x.extraConfig += "  heartbeatInterval: 100ms\n  deadAfter: 400ms\n"
	for _, n := range x.names {
		x.start(n)
	}
	x.waitOwners(x.ips, func(ip netip.Addr) string { return hashOwner(ip, x.names...) }, 20*time.Second)
	x.waitNeigh(x.owner, 10*time.Second)

	owner, ownerNode := x.owner, l.Node(x.owner)
	peerPort := fmt.Sprintf("n%d", ownerNode.Index) // the owner's eth0 on the LAN bridge
	var mine []netip.Addr
	for _, v := range x.ips {
		if hashOwner(v, x.names...) == owner {
			mine = append(mine, v)
		}
	}
	survivorOwner := func(v netip.Addr) string { return hashOwner(v, x.survivors...) }
	rx := func(node string) int {
		out, err := l.Exec(node, "cat", "/sys/class/net/eth1/statistics/rx_packets")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	t.Logf("VIP %s: owner %s (%d of the %d VIPs), endpoints on %v; heartbeats on eth1 %v", x.vip, owner, len(mine), len(x.ips), x.survivors, mgmt(ownerNode.Index))

	// The two ways an announcing link goes: its carrier (the peer port on the LAN bridge set down,
	// a pulled cable: eth0 stays IFF_UP), and eth0 set down in the owner's namespace.
	routes4, _ := l.Exec(owner, "ip", "-4", "route", "show")
	for _, mode := range []string{"carrier", "admin"} {
		what, again := owner+"'s eth0 lost its carrier", "carrier back on "+owner+"'s eth0"
		if mode == "admin" {
			what, again = "eth0 set down on "+owner, "eth0 set up again on "+owner
		}
		linkDown := func() { ip("-n", lanNS, "link", "set", peerPort, "down") }
		linkUp := func() { ip("-n", lanNS, "link", "set", peerPort, "up") }
		if mode == "admin" {
			linkDown = func() { ip("-n", ownerNode.NS, "link", "set", "eth0", "down") }
			linkUp = func() {
				ip("-n", ownerNode.NS, "link", "set", "eth0", "up")
				// Setting eth0 down flushed the routes through it: put them back.
				for _, rt := range strings.Split(strings.TrimSpace(routes4), "\n") {
					if strings.Contains(rt, " via ") {
						_, _ = l.Exec(owner, append([]string{"ip", "-4", "route", "replace"}, strings.Fields(rt)...)...)
					}
				}
			}
			// The owner holds the VIP again and the LAN client knows it (the previous round).
			x.waitNeigh(owner, 10*time.Second)
		}
		func() {
			type res struct {
				s   lab.ProbeSummary
				err error
			}
			const probes, every = 500, 10 * time.Millisecond
			done := make(chan res, 1)
			go func() {
				s, err := l.ProbeMany("lanclient", "tcp", x.vip.String()+":80", probes, every)
				done <- res{s, err}
			}()
			time.Sleep(500 * time.Millisecond)
			rx0 := rx(x.survivors[0])
			down := time.Now()
			linkDown()
			// Until every VIP of the owner is answered by its next owner alone.
			var settled time.Duration
			doubles := 0
			for {
				at := time.Since(down)
				got := x.owners(mine, 15*time.Millisecond)
				ok := true
				for _, v := range mine {
					if len(got[v]) > 1 {
						doubles++
					}
					if len(got[v]) != 1 || got[v][0] != survivorOwner(v) {
						ok = false
					}
				}
				if ok {
					settled = at
					break
				}
				if at > 10*time.Second {
					t.Fatalf("%s's VIPs not taken over 10 s after %s (its heartbeats go on on eth1)", owner, what)
				}
			}
			pr := <-done
			if pr.err != nil {
				t.Fatal(pr.err)
			}
			if pr.s.OK == 0 || pr.s.MaxGap > 5*time.Second {
				t.Errorf("the VIP was not answered again after %s: %+v", what, pr.s)
			}
			heartbeats := rx(x.survivors[0]) - rx0
			if heartbeats == 0 {
				t.Errorf("no heartbeat on %s's eth1 during the outage: the membership did not run on eth1", x.survivors[0])
			}
			if !strings.Contains(x.procs[owner].Log(), "withdrawing from an L2 segment") {
				t.Errorf("%s did not log its withdrawal", owner)
			}
			t.Logf("%s: longest probe gap %v (%d of %d probes lost, every %v); all %d of its VIPs answered by the next owners %v after; %d double answers; %d packets on %s's eth1 meanwhile",
				what, pr.s.MaxGap, pr.s.Lost, pr.s.Sent, every, len(mine), settled.Round(time.Millisecond), doubles, heartbeats, x.survivors[0])

			// Carrier back: the owner must wait the hold-down, then take its VIPs back once.
			time.Sleep(time.Second)
			up := time.Now()
			linkUp()
			// A flap: once the owner answered all its VIPs alone, a scan in which another node answers
			// one of them (a missing answer is the scanner's lost request, not a flap).
			var back time.Duration
			flaps, scans := 0, 0
			tookBack := false
			for time.Since(up) < holdDown+6*time.Second {
				at := time.Since(up)
				got := x.owners(mine, 15*time.Millisecond)
				scans++
				all, other := true, false
				for _, v := range mine {
					if len(got[v]) > 1 {
						doubles++
					}
					if len(got[v]) != 1 || got[v][0] != owner {
						all = false
					}
					if slices.ContainsFunc(got[v], func(n string) bool { return n != owner }) {
						other = true
					}
					if back == 0 && slices.Contains(got[v], owner) {
						back = at
					}
				}
				if tookBack && other {
					flaps++
				}
				tookBack = tookBack || all
				time.Sleep(20 * time.Millisecond)
			}
			if back == 0 || !tookBack {
				t.Fatalf("%s never took all its VIPs back within %v after %s (first answer after %v)", owner, holdDown+6*time.Second, again, back)
			}
			// A lower bound only: load can delay the scans, never make the owner answer earlier.
			if back < holdDown*9/10 {
				t.Errorf("%s answered again %v after %s, before the %v hold-down", owner, back, again, holdDown)
			}
			if flaps > 0 {
				t.Errorf("%s's VIPs flapped after it took them back: another node answered in %d scans", owner, flaps)
			}
			t.Logf("%s: %s's VIPs answered by it again %v after (hold-down %v), %d scans over %v, %d flaps, %d double answers in all",
				again, owner, back.Round(time.Millisecond), holdDown, scans, holdDown+6*time.Second, flaps, doubles)
		}()
	}
}
