package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestL2Segments: L2 membership per segment, with real vipgate processes in the netns lab. Four
// nodes on one LAN; two L2Advertisements select rack a = {node1, node2, node3} for pool "a" and
// {node3, node4} (rack b, plus node3 by name) for pool "b". A fifth Node object, node5 in rack a,
// runs no vipgate: with the file source that is expressed by speaker.members, which lists the four
// speakers only (the Kubernetes source counts a node only while a vipgate pod is scheduled on it,
// cluster.TestKubeSourceSpeakerPods).
//
//   - Each segment decides its own owners: pool a's VIPs over node1-3, pool b's over node3-4.
//   - Killing node4 does not change who answers segment a's VIPs (no scan sees a change), and b's
//     VIPs go to node3 (a two-member segment: the lower name keeps announcing).
//   - Killing node3 as well leaves segment a with 2 of its 3 members — a majority of the segment,
//     although only 2 of the 4 speakers (and 2 of the 5 Nodes) are alive: node1 and node2 take
//     node3's VIPs of pool a. Pool b has no live member left: nobody answers it.
func TestL2Segments(t *testing.T) {
	names := []string{"node1", "node2", "node3", "node4"}
	segA, segB := []string{"node1", "node2", "node3"}, []string{"node3", "node4"}
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"w1"}}, {Name: "node2", Pods: []string{"w2"}},
		{Name: "node3", Pods: []string{"w3"}}, {Name: "node4", Pods: []string{"w4"}},
	}})
	x := newL2Lab(t, l)
	x.scanARP()

	x.extraConfig = "speaker:\n  members:\n"
	for _, n := range l.Nodes() {
		x.extraConfig += fmt.Sprintf("  - {name: %s, address: %q}\n", n.Name, n.IPv4)
	}
	var nodes []string
	rack := map[string]string{"node1": "a", "node2": "a", "node3": "a", "node4": "b", "node5": "a"}
	for _, n := range []string{"node1", "node2", "node3", "node4", "node5"} {
		addr := lab.NodeIPv4(5).String()
		if n != "node5" {
			addr = l.Node(n).IPv4.String()
		}
		nodes = append(nodes, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {kubernetes.io/hostname: %s, rack: %s}\n"+
			"status:\n  addresses: [{type: InternalIP, address: %q}]\n", n, n, rack[n], addr))
	}
	x.w.write("nodes.yaml", nodes...)
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: a, namespace: metallb-system}
spec:
  addresses: [192.0.2.101-192.0.2.130]
`, `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: b, namespace: metallb-system}
spec:
  addresses: [192.0.2.151-192.0.2.170]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: rack-a, namespace: metallb-system}
spec:
  ipAddressPools: [a]
  nodeSelectors: [{matchLabels: {rack: a}}]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: rack-b, namespace: metallb-system}
spec:
  ipAddressPools: [b]
  nodeSelectors: [{matchLabels: {rack: b}}, {matchLabels: {kubernetes.io/hostname: node3}}]
`)
	http := []ndPort{{"http", "TCP", 80, 0, "http"}}
	slicePorts := []ndSlicePort{{"http", "TCP", 8080}}
	var eps []string
	for i, n := range names {
		eps = append(eps, ndEp(l.Pod(fmt.Sprintf("w%d", i+1)), n))
	}
	ipsA, ipsB := addrRange("192.0.2.101", 30), addrRange("192.0.2.151", 20)
	var docs []string
	for i, ip := range append(append([]netip.Addr{}, ipsA...), ipsB...) {
		name := fmt.Sprintf("seg%02d", i)
		docs = append(docs, ndService(name, "LoadBalancer", fmt.Sprintf("10.96.6.%d", i+1), "Cluster", http, ndStatus(ip.String())),
			ndSlice(name, "IPv4", slicePorts, eps...))
	}
	x.w.write("services.yaml", docs...)
	ownerIn := func(seg []string) func(netip.Addr) string {
		return func(ip netip.Addr) string { return hashOwner(ip, seg...) }
	}

	started := time.Now()
	for _, n := range names {
		x.start(n)
	}
	d, _ := x.waitOwners(ipsA, ownerIn(segA), 15*time.Second)
	x.waitOwners(ipsB, ownerIn(segB), 5*time.Second)
	t.Logf("owners per segment after %v (pool a over %v, pool b over %v); %v after the VIPs of a settled",
		time.Since(started).Round(time.Millisecond), segA, segB, d.Round(time.Millisecond))

	t.Run("metrics: the segment's members only", func(t *testing.T) {
		for node, want := range map[string]string{"node1": "vipgate_speaker_members 3", "node4": "vipgate_speaker_members 2",
			"node3": "vipgate_speaker_members 4"} {
			code, body := ndHTTP(t, l, node, "http://127.0.0.1:10249/metrics")
			if code != 200 || !strings.Contains(body, want+"\n") {
				t.Errorf("%s /metrics (HTTP %d) lacks %q", node, code, want)
			}
		}
	})

	kill := func(node string) {
		t.Helper()
		x.procs[node].Kill()
		if out, err := l.Exec(node, "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatalf("taking %s's link down: %v: %s", node, err, out)
		}
	}

	t.Run("node4 dies: segment a unchanged, node3 takes pool b", func(t *testing.T) {
		killed := time.Now()
		kill("node4")
		// A wrong or second owner fails at once; an IP unanswered within one scan is only counted,
		// per owner (a lost request or a late reply on a loaded machine looks the same, and is
		// spread over the owners), unless it stays unanswered for ten scans in a row (0.5 s or
		// more: a takeover-sized gap).
		scans, changed, silent, longest := 0, 0, 0, 0
		silentBy := map[string]int{}
		run := map[netip.Addr]int{}
		var example string
		converged := time.Duration(0)
		for time.Since(killed) < 3*time.Second {
			got := x.owners(append(append([]netip.Addr{}, ipsA...), ipsB...), 50*time.Millisecond)
			scans++
			for _, ip := range ipsA {
				want := ownerIn(segA)(ip)
				switch {
				case len(got[ip]) == 0:
					silent++
					silentBy[want]++
					run[ip]++
					longest = max(longest, run[ip])
				case len(got[ip]) != 1 || got[ip][0] != want:
					changed++
					if example == "" {
						example = fmt.Sprintf("%s answered by %v, want %s", ip, got[ip], want)
					}
					run[ip] = 0
				default:
					run[ip] = 0
				}
			}
			done := true
			for _, ip := range ipsB {
				done = done && len(got[ip]) == 1 && got[ip][0] == "node3"
			}
			if done && converged == 0 {
				converged = time.Since(killed)
			}
		}
		if changed > 0 {
			t.Errorf("segment a's VIPs changed hands while node4 died: %d of %d IP-scans wrong, e.g. %s", changed, scans*len(ipsA), example)
		}
		if longest >= 10 {
			t.Errorf("a VIP of segment a went unanswered for %d scans in a row while node4 died", longest)
		}
		if converged == 0 {
			t.Fatalf("pool b's VIPs not all answered by node3 within 3 s of node4's death")
		}
		t.Logf("node4 killed: %d scans of segment a's %d VIPs over 3 s: none answered by another node or by two, %d unanswered within one scan "+
			"(by owner %v, longest run %d scans); pool b's %d VIPs all on node3 %v after the kill",
			scans, len(ipsA), silent, silentBy, longest, len(ipsB), converged.Round(time.Millisecond))
	})

	t.Run("node3 dies too: segment a keeps its majority (2 of 3), node5 does not count", func(t *testing.T) {
		killed := time.Now()
		kill("node3")
		d, doubles := x.waitOwners(ipsA, ownerIn([]string{"node1", "node2"}), 10*time.Second)
		t.Logf("node3 killed: all %d VIPs of segment a on node1/node2 %v later (2 of 4 speakers and 2 of 5 Nodes alive; IP-scans answered by two nodes: %d)",
			len(ipsA), time.Since(killed).Round(time.Millisecond), doubles)
		_ = d
		deadline := time.Now().Add(5 * time.Second)
		for {
			got := x.owners(ipsB, 50*time.Millisecond)
			if len(got) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool b (no live member) still answered: %v", got)
			}
		}
	})
}
