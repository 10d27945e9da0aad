package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vipgate/vipgate/test/lab"
)

// nodeConfig renders the NodeConfig of one lab node in vipgate's fixed
// format. Addresses are quoted where YAML would otherwise trip over colons.
func nodeConfig(n *lab.Node) string {
	ips := []string{n.IPv4.String()}
	clusterCIDRs := []string{lab.ClusterCIDRv4.String()}
	serviceCIDRs := []string{lab.ServiceCIDRv4.String()}
	if n.IPv6.IsValid() {
		ips = append(ips, n.IPv6.String())
		clusterCIDRs = append(clusterCIDRs, lab.ClusterCIDRv6.String())
		serviceCIDRs = append(serviceCIDRs, lab.ServiceCIDRv6.String())
	}
	list := func(items []string) string {
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
nodePortAddresses: []   # default: node IPs
masqueradeAll: false
`, n.Name, list(ips), list(clusterCIDRs), list(serviceCIDRs))
}

// writeNodeConfigs writes <dir>/<node>.yaml for every node and returns the paths by node name.
func writeNodeConfigs(l *lab.Lab, dir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, n := range l.Nodes() {
		if isGateway(n.Name) {
			continue
		}
		p := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(p, []byte(nodeConfig(n)), 0o644); err != nil {
			return nil, fmt.Errorf("writing node config for %s: %w", n.Name, err)
		}
		paths[n.Name] = p
	}
	return paths, nil
}
