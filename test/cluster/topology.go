package testcluster

import (
	"fmt"

	"github.com/vipgate/vipgate/test/lab"
)

// NodeZone is the topology.kubernetes.io/zone label of the lab node with index i (1-based): one zone
// per node, zone-a, zone-b, ..., so that the upstream Traffic Distribution and Topology Hints specs,
// which need endpoints in different zones, run (docs/cluster.md). The kubelet sets it at
// registration (--node-labels), as a cloud provider's does.
func NodeZone(i int) string {
	if i >= 1 && i <= 26 {
		return "zone-" + string(rune('a'+i-1))
	}
	return fmt.Sprintf("zone-%d", i)
}

// routerHashesL4 makes the router namespace hash its ECMP routes on the 5-tuple (L4) rather than
// on the addresses alone (Linux's default, policy 0), for IPv4 and IPv6, as top-of-rack routers do:
// with L3 hashing every connection of one client takes the same next hop, so a VIP routed to
// several nodes (BGP) lands on one node for that client, and the upstream LoadBalancers spec
// "should be able to switch session affinity for LoadBalancer service with Local traffic policy"
// fails for that reason alone (issue #31).
func (c *Cluster) routerHashesL4() error {
	for _, kv := range []string{"net.ipv4.fib_multipath_hash_policy=1", "net.ipv6.fib_multipath_hash_policy=1"} {
		if out, err := c.Lab.Exec(lab.RoleRouter, "sysctl", "-qw", kv); err != nil {
			return fmt.Errorf("testcluster: router %s: %w: %s", kv, err, out)
		}
	}
	return nil
}
