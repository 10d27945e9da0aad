package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/vipgate/vipgate/test/lab"
)

// nodeConfig is the NodeConfig of one lab node, with the two defaults the demo shows spelled out.
func nodeConfig(n *lab.Node) string {
	return lab.NodeConfig(n) + "nodePortAddresses: []   # default: node IPs\nmasqueradeAll: false\n"
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
