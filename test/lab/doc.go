// Package lab builds a small bare-metal "cluster" out of Linux network
// namespaces for vipgate's end-to-end tests and demo. It shells out to
// iproute2 (ip, ip netns exec) and sysctl; it needs root and never touches
// the root network namespace: every veth is created with its peer placed
// straight into another lab namespace.
//
// # Topology
//
//	                client 198.51.100.10/24, 2001:db8:2::10/64
//	                  | eth0                 (default via the router)
//	                  | cli0 198.51.100.1/24, 2001:db8:2::1/64
//	                router  (forwarding on; no routes to pods; AddRoute adds VIP routes)
//	                  | lan0 192.0.2.1/24, 2001:db8:1::1/64
//	                  | r0
//	lan ============ br0 ============================================ (one L2 segment)
//	  | lc0                  | n1                         | n2
//	  | eth0                 | eth0 192.0.2.11/24        | eth0 192.0.2.12/24
//	lanclient                node1   2001:db8:1::11/64  node2   2001:db8:1::12/64
//	192.0.2.100/24           cbr0 10.244.1.1/24         cbr0 10.244.2.1/24
//	2001:db8:1::100/64            2001:db8:244:1::1/64       2001:db8:244:2::1/64
//	                         | p1          | p2           | p1
//	                         | eth0        | eth0         | eth0
//	                         pod 1         pod 2          pod 1
//	                         10.244.1.11   10.244.1.12    10.244.2.11
//	                         2001:db8:244:1::11 ...::12   2001:db8:244:2::11
//
// The address plan, for node i (1-based, in Spec order) and its pod j
// (1-based, in NodeSpec order):
//
//	node i LAN (eth0)         192.0.2.(10+i)/24     2001:db8:1::(10+i)/64
//	node i pod bridge (cbr0)  10.244.i.1/24         2001:db8:244:i::1/64
//	pod j on node i (eth0)    10.244.i.(10+j)/24    2001:db8:244:i::(10+j)/64
//	router on the LAN (lan0)  192.0.2.1/24          2001:db8:1::1/64
//	router on clients (cli0)  198.51.100.1/24       2001:db8:2::1/64
//	client (eth0)             198.51.100.10/24      2001:db8:2::10/64
//	lanclient (eth0)          192.0.2.100/24        2001:db8:1::100/64
//	cluster CIDRs             10.244.0.0/16         2001:db8:244::/48
//	service CIDRs             10.96.0.0/16          2001:db8:96::/108   (nothing routes there by default)
//
// IPv6 addresses are written with the decimal numbers in the text, as
// people type them: node 1 is "2001:db8:1::11", pod 2 on node 3 is
// "2001:db8:244:3::12".
//
// Routes: client and lanclient default via the router; nodes default via the
// router (192.0.2.1 / 2001:db8:1::1) and reach every other node's pod CIDRs
// via that node's LAN address; pods default via their node's cbr0 address.
// The router knows no pod routes: outside clients reach pods only through
// what vipgate publishes, or prefixes a test routes with AddRoute.
//
// Kernel settings: IPv6 DAD off (addresses are added nodad, too), router
// advertisements ignored, rp_filter=0 everywhere (asymmetric paths are normal
// in these tests), IPv4 and IPv6 forwarding on in the router and the nodes,
// net.ipv4.conf.all.route_localnet left off. The lan namespace has IPv6
// disabled on its own ports; it only bridges. Bridges run without STP and
// without multicast snooping.
//
// # Names
//
// Namespaces are called <prefix><role>, with the prefix "vg<pid>-<n>-" unique
// to the lab: "vg4242-0-router", "vg4242-0-node1", "vg4242-0-web-1". Roles are
// "lan", "router", "client", "lanclient", the node names and the pod names.
// Interface names do not depend on namespace names (IFNAMSIZ is 16): eth0
// everywhere a namespace has an uplink; br0 and its ports r0, lc0, n<i> in
// lan; cbr0 and its ports p<j> on node i; lan0 and cli0 in the router.
//
// # Lab servers
//
// Unless Spec.NoServers is set, every pod runs `labserver serve` (package
// test/labserver) on TCP and UDP ports 8080 and 8081 and HTTP port 8088, v4
// and v6. Every answer is the line "name=<pod> src=<ip:port> dst=<ip:port>",
// telling which pod answered and which addresses it saw. Probe, ProbeMany and
// StartHold run the labserver's client modes in any namespace.
//
// # Cleaning up
//
// Close stops every process the lab started, kills whatever else runs in its
// namespaces and deletes them. NewForTest wires Close into t.Cleanup; lab
// processes get SIGKILL if the process that started them dies. Sweep(prefix)
// removes leftovers by prefix, SweepStale those of dead processes.
package lab
