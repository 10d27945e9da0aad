package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestL2Gossip runs the L2 membership in gossip mode (speaker.directMembersLimit: 0, so even a
// three-node segment gossips instead of heartbeating all-to-all): owners are the hash owners, a
// rogue host on the LAN sends forged gossip (wrong key) and replays of genuine gossip captured on
// the nodes — no VIP moves, never a second owner —, a partitioned node stays silent while being
// fed forged and replayed majorities, the rejections are counted, and a killed node's VIPs move
// (the outage is logged, not asserted).
func TestL2Gossip(t *testing.T) {
	names := []string{"node1", "node2", "node3"}
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"w1"}}, {Name: "node2", Pods: []string{"w2"}}, {Name: "node3", Pods: []string{"w3"}},
	}})
	x := newL2Lab(t, l)
	x.scanARP()
	x.extraConfig = "speaker:\n  directMembersLimit: 0\n"
	x.w.write("nodes.yaml", nodesYAML(l)...)
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec:
  addresses: [192.0.2.180-192.0.2.209]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
`)
	http := []ndPort{{"http", "TCP", 80, 0, "http"}}
	eps := []string{ndEp(l.Pod("w1"), "node1"), ndEp(l.Pod("w2"), "node2"), ndEp(l.Pod("w3"), "node3")}
	ips := addrRange("192.0.2.180", 30)
	var docs []string
	for i, ip := range ips {
		name := fmt.Sprintf("g%02d", i)
		docs = append(docs, ndService(name, "LoadBalancer", fmt.Sprintf("10.96.7.%d", i+1), "Cluster", http, ndStatus(ip.String())),
			ndSlice(name, "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, eps...))
	}
	x.w.write("vips.yaml", docs...)

	caps := map[string]*udpCapture{}
	for _, n := range names {
		c, err := newUDPCapture(l.NS(n), l2MemberPort)
		if err != nil {
			t.Fatal(err)
		}
		caps[n] = c
		t.Cleanup(c.close)
	}
	started := time.Now()
	for _, n := range names {
		x.start(n)
	}
	all := func(ip netip.Addr) string { return hashOwner(ip, names...) }
	x.waitOwners(ips, all, 15*time.Second)
	t.Logf("owners: all %d VIPs answered by their hash owner alone %v after the start", len(ips), time.Since(started).Round(time.Millisecond))
	for _, n := range names {
		if !strings.Contains(x.procs[n].Log(), "L2 segment gossips") {
			t.Fatalf("%s: not in gossip mode (no \"L2 segment gossips\" logged)", n)
		}
	}
	time.Sleep(time.Second) // a second of genuine gossip captured
	for _, c := range caps {
		c.stop()
	}

	rogue, err := newRawSender(l.NS("lanclient"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rogue.close)
	addr := func(n string) netip.Addr { return l.Node(n).IPv4 }
	forged := func(from, to string, ready bool) []spoofed {
		return []spoofed{
			{addr(from), addr(to), forgedGossip(from, to, ready, uint64(time.Now().UnixNano())*2)},
			{addr(from), addr(to), forgedV3(from, to, ready, uint64(time.Now().UnixNano())*2)},
		}
	}
	replays := func(from, to string) []spoofed {
		var out []spoofed
		for _, p := range caps[to].from(addr(from)) {
			if len(p) >= 4 && string(p[:4]) == "VGG1" {
				out = append(out, spoofed{addr(from), addr(to), p})
			}
		}
		if len(out) == 0 {
			t.Fatalf("no gossip of %s to %s captured", from, to)
		}
		return out
	}

	t.Run("forged and replayed not-ready of a live owner", func(t *testing.T) {
		var pkts []spoofed
		for _, to := range []string{"node2", "node3"} {
			pkts = append(pkts, forged("node1", to, false)...)
			pkts = append(pkts, replays("node1", to)...)
		}
		stop := rogue.flood(pkts, 5*time.Millisecond)
		x.holdOwners(t, ips, all, 3*time.Second)
		stop()
	})

	t.Run("partitioned node stays silent", func(t *testing.T) {
		rules := fmt.Sprintf(`table inet vgtest_partition {
  chain in { type filter hook input priority -300; ether saddr { %s, %s } udp dport %d drop; }
  chain out { type filter hook output priority -300; udp dport %d drop; }
}
`, x.macs["node1"], x.macs["node2"], l2MemberPort, l2MemberPort)
		if out, err := l.Exec("node3", "sh", "-c", "printf '%s' '"+rules+"' | nft -f -"); err != nil {
			t.Fatalf("cutting node3 off: %v: %s", err, out)
		}
		cut := time.Now()
		var pkts []spoofed
		for _, from := range []string{"node1", "node2"} {
			pkts = append(pkts, forged(from, "node3", true)...)
			pkts = append(pkts, replays(from, "node3")...)
		}
		stop := rogue.flood(pkts, 5*time.Millisecond)
		majority := func(ip netip.Addr) string { return hashOwner(ip, "node1", "node2") }
		_, doubles := x.waitOwners(ips, majority, 10*time.Second)
		t.Logf("partition: the majority answers node3's VIPs alone %v after the cut (IP-scans answered by two nodes: %d)",
			time.Since(cut).Round(time.Millisecond), doubles)
		x.holdOwners(t, ips, majority, 3*time.Second)
		stop()
		if out, err := l.Exec("node3", "nft", "delete", "table", "inet", "vgtest_partition"); err != nil {
			t.Fatalf("healing: %v: %s", err, out)
		}
		healed := time.Now()
		x.waitOwners(ips, all, 10*time.Second)
		t.Logf("partition healed: node3's VIPs back %v later", time.Since(healed).Round(time.Millisecond))
	})

	t.Run("rejections counted", func(t *testing.T) {
		for _, n := range []string{"node2", "node3"} {
			got := rejectedCounts(t, l, n)
			if got["bad-mac"] == 0 || got["replay"]+got["not-fresh"] == 0 {
				t.Errorf("%s: rejected datagrams %v, want bad-mac and replay counted", n, got)
			} else {
				t.Logf("%s: rejected datagrams %v", n, got)
			}
		}
	})

	t.Run("killed node's VIPs move", func(t *testing.T) {
		victim := "node3"
		survivors := []string{"node1", "node2"}
		var mine []netip.Addr
		for _, ip := range ips {
			if all(ip) == victim {
				mine = append(mine, ip)
			}
		}
		killed := time.Now()
		x.procs[victim].Kill()
		if out, err := l.Exec(victim, "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatalf("taking %s's link down: %v: %s", victim, err, out)
		}
		_, doubles := x.waitOwners(mine, func(ip netip.Addr) string { return hashOwner(ip, survivors...) }, 10*time.Second)
		t.Logf("failover: all %d of %s's VIPs answered by the survivors %v after the kill (IP-scans answered by two nodes: %d)",
			len(mine), victim, time.Since(killed).Round(time.Millisecond), doubles)
		x.holdOwners(t, ips, func(ip netip.Addr) string { return hashOwner(ip, survivors...) }, 2*time.Second)
	})
}

// forgedGossip is a gossip datagram (VGG1) signed with a key the members do not have: node from
// says it is ready (or not) and that it hears everyone, freshly.
func forgedGossip(from, to string, ready bool, counter uint64) []byte {
	var flags byte
	e := byte(0)
	if ready {
		flags, e = 1, 0x80
	}
	b := append([]byte("VGG1"), flags, byte(len(from)))
	b = append(b, from...)
	b = binary.BigEndian.AppendUint64(b, counter)
	b = binary.BigEndian.AppendUint64(b, counter) // echo: anything
	b = binary.BigEndian.AppendUint64(b, 0)       // digest
	b = binary.BigEndian.AppendUint16(b, 10)      // unit: 1 ms
	b = binary.BigEndian.AppendUint16(b, 3)       // total
	b = binary.BigEndian.AppendUint16(b, 0)       // offset
	b = binary.BigEndian.AppendUint16(b, 3)       // count
	b = append(b, e, e, e)
	h := hmac.New(sha256.New, []byte("the attacker's guess at the key"))
	h.Write([]byte(to))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(b)
}
