package lab

import (
	"fmt"
	"strings"
)

// NodeConfig is the plain vipgate NodeConfig of a lab node: its LAN addresses (IPv4, and IPv6 in a
// dual-stack lab) and the lab's pod and service CIDRs of the same families.
func NodeConfig(n *Node) string {
	ips, cidrs, svcs := []string{n.IPv4.String()}, []string{ClusterCIDRv4.String()}, []string{ServiceCIDRv4.String()}
	if n.IPv6.IsValid() {
		ips = append(ips, n.IPv6.String())
		cidrs = append(cidrs, ClusterCIDRv6.String())
		svcs = append(svcs, ServiceCIDRv6.String())
	}
	quote := func(items []string) string {
		q := make([]string, len(items))
		for i, s := range items {
			q[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: %s
nodeIPs: %s
clusterCIDRs: %s
serviceCIDRs: %s
`, n.Name, quote(ips), quote(cidrs), quote(svcs))
}
