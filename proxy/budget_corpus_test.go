package proxy

import (
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// The hostile corpus of issue #27: Services a namespace tenant can write whose cost to the node
// (nftables elements and rules, and the time to build them) is not O(the object's size), built
// here by shape (ports x addresses x endpoints x algorithm) so the tests and the benchmark share
// them.

// hostileNodeInfo is the node the corpus is built for.
func hostileNodeInfo() NodeInfo {
	return NodeInfo{Family: cluster.IPv4, NodeName: "node1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, PodTrafficKnown: true}
}

// partCost is what a Service's part costs the kernel, in set elements and rules.
func partCost(p *dataplane.Part) (elements, rules int) {
	for _, c := range p.Chains {
		rules += len(c.Rules)
	}
	return p.NumElements(), rules
}
