package main

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// Addresses of the demo manifests (deploy/examples/demo).
var (
	clusterIPv4 = netip.MustParseAddr("10.96.0.10")
	clusterIPv6 = netip.MustParseAddr("2001:db8:96::10")
	localVIPv4  = netip.MustParseAddr("203.0.113.10")
	localVIPv6  = netip.MustParseAddr("2001:db8:ff::10")
	globalVIPv4 = netip.MustParseAddr("203.0.113.11")
	globalVIPv6 = netip.MustParseAddr("2001:db8:ff::11")
)

const (
	servicePort = 80
	nodePort    = 30080
)

// scene is one stop of the tour: who asks whom, and what should be seen.
type scene struct {
	title  string
	from   string // lab role the probes start in
	expect string // in words
	// targets are the addresses probed, v4 first; v6 ones are skipped in an
	// IPv4-only lab.
	targets []netip.AddrPort
	protos  []string
	// check judges one probe summary; "" means as expected, else why not.
	check func(s lab.ProbeSummary) string
	// before, if set, runs first (the scene's action) and returns a line to show.
	before func() (string, error)
}

// row is one line of a scene's table.
type row struct {
	proto   string
	target  netip.AddrPort
	sum     lab.ProbeSummary
	err     error
	verdict string
}

// scenes builds the tour for a lab with the demo topology.
func scenes(l *lab.Lab) []scene {
	web3, node1 := l.Pod("web-3"), l.Node("node1")
	allPods := []string{"web-1", "web-2", "web-3"}
	ap := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

	// Where a masqueraded packet may come from: a node's LAN address, or its
	// pod bridge address when the chosen pod is local to the node.
	var nodeSources []string
	for _, n := range l.Nodes() {
		nodeSources = append(nodeSources, n.IPv4.String(), lab.PodGatewayv4(n.Index).String())
		if n.IPv6.IsValid() {
			nodeSources = append(nodeSources, n.IPv6.String(), lab.PodGatewayv6(n.Index).String())
		}
	}
	clients := []string{lab.Clientv4.String(), lab.Clientv6.String()}
	// web-3's own address, or its node's pod gateway when the Service sends
	// web-3 to itself: that hairpin is masqueraded, or the reply would skip
	// the un-DNAT.
	web3IPs := []string{web3.IPv4.String(), lab.PodGatewayv4(web3.Node.Index).String()}
	if web3.IPv6.IsValid() {
		web3IPs = append(web3IPs, web3.IPv6.String(), lab.PodGatewayv6(web3.Node.Index).String())
	}

	return []scene{
		{
			title:   "ClusterIP from a pod",
			from:    "web-3",
			expect:  "any of the three pods answers and sees web-3's own address (no SNAT inside the cluster; only web-3 reaching itself is masqueraded)",
			targets: []netip.AddrPort{ap(clusterIPv4, servicePort), ap(clusterIPv6, servicePort)},
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn(allPods...), sourcesIn(web3IPs...)),
		},
		{
			title:   "NodePort from the client",
			from:    "client",
			expect:  "any pod answers; the client's address is masqueraded to the node's",
			targets: []netip.AddrPort{ap(node1.IPv4, nodePort), ap(node1.IPv6, nodePort)},
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn(allPods...), sourcesIn(nodeSources...)),
		},
		{
			title:   "LoadBalancer, externalTrafficPolicy=Local, from the client (VIP routed to node1)",
			from:    "client",
			expect:  "only node1's pods (web-1, web-2) answer, and they see the client's real address",
			targets: []netip.AddrPort{ap(localVIPv4, servicePort), ap(localVIPv6, servicePort)},
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn("web-1", "web-2"), sourcesIn(clients...)),
		},
		{
			title:   "LoadBalancer, externalTrafficPolicy=Cluster, from the client (VIP routed to node1)",
			from:    "client",
			expect:  "any pod answers; the source is NATed to a node address",
			targets: []netip.AddrPort{ap(globalVIPv4, servicePort), ap(globalVIPv6, servicePort)},
			protos:  []string{"tcp", "udp"},
			check:   all(answered, podsIn(allPods...), sourcesIn(nodeSources...)),
		},
	}
}

// run probes every target of the scene and judges the results.
func (sc scene) run(l *lab.Lab, probes int) []row {
	var rows []row
	for _, t := range sc.targets {
		if !t.Addr().IsValid() || (t.Addr().Is6() && !l.IPv6()) {
			continue
		}
		for _, proto := range sc.protos {
			hostport := net.JoinHostPort(t.Addr().String(), strconv.Itoa(int(t.Port())))
			s, err := l.ProbeMany(sc.from, proto, hostport, probes, 20*time.Millisecond)
			r := row{proto: proto, target: t, sum: s, err: err}
			switch {
			case err != nil:
				r.verdict = "probe failed: " + err.Error()
			default:
				r.verdict = sc.check(s)
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// print writes the scene as a small table.
func (sc scene) print(w io.Writer, n int, rows []row, note string) (failed int) {
	fmt.Fprintf(w, "\n── Scene %d: %s\n", n, sc.title)
	var targets []string
	for _, r := range rows {
		if !slices.Contains(targets, r.target.String()) {
			targets = append(targets, r.target.String())
		}
	}
	probes := 0
	if len(rows) > 0 {
		probes = rows[0].sum.Sent
	}
	fmt.Fprintf(w, "   %s$ labserver probe --%s %s --count %d   (each)\n",
		sc.from, strings.Join(sc.protos, "|--"), strings.Join(targets, " | "), probes)
	if note != "" {
		fmt.Fprintf(w, "   %s\n", note)
	}
	fmt.Fprintf(w, "   expect: %s\n\n", sc.expect)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   \tPROBE\tANSWERED BY\tSOURCE SEEN BY THE POD\tLOST\t")
	for _, r := range rows {
		mark := "✓"
		if r.verdict != "" {
			mark = "✗"
			failed++
		}
		lost := strconv.Itoa(r.sum.Lost)
		if len(r.sum.Errors) > 0 {
			lost += " (" + tally(r.sum.Errors) + ")"
		}
		fmt.Fprintf(tw, "   %s\t%s %s\t%s\t%s\t%s\t\n", mark, r.proto, r.target, tally(r.sum.Pods), tally(r.sum.Sources), lost)
	}
	tw.Flush()
	for _, r := range rows {
		if r.verdict != "" {
			fmt.Fprintf(w, "   ✗ %s %s: %s\n", r.proto, r.target, r.verdict)
		}
	}
	return failed
}

// tally renders counts as "web-1×3 web-2×1", or "-".
func tally(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// Checks. Each returns "" when the summary is as expected.

func all(checks ...func(lab.ProbeSummary) string) func(lab.ProbeSummary) string {
	return func(s lab.ProbeSummary) string {
		for _, c := range checks {
			if why := c(s); why != "" {
				return why
			}
		}
		return ""
	}
}

func answered(s lab.ProbeSummary) string {
	if s.OK != s.Sent {
		return fmt.Sprintf("%d of %d probes got no answer (%s)", s.Lost, s.Sent, tally(s.Errors))
	}
	return ""
}

func podsIn(pods ...string) func(lab.ProbeSummary) string {
	return func(s lab.ProbeSummary) string {
		for p := range s.Pods {
			if !slices.Contains(pods, p) {
				return fmt.Sprintf("answered by %s, want only %s", p, strings.Join(pods, ", "))
			}
		}
		return ""
	}
}

func sourcesIn(srcs ...string) func(lab.ProbeSummary) string {
	return func(s lab.ProbeSummary) string {
		for src := range s.Sources {
			if !slices.Contains(srcs, src) {
				return fmt.Sprintf("the pod saw source %s, want one of %s", src, strings.Join(srcs, ", "))
			}
		}
		return ""
	}
}
