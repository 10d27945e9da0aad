package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vipgate/vipgate/test/lab"
)

// CNIs a cluster can run (Spec.CNI).
const (
	// CNIBridge is the lab's own pod network: Debian's bridge plugin on each node's cbr0 with the
	// node's pod CIDR, and a static route on every node to every other node's pod CIDR.
	CNIBridge = "bridge"
	// CNIFlannel is Flannel v0.28.11 with its VXLAN backend (the k3s default), installed as
	// upstream's kube-flannel DaemonSet (manifests/flannel.yaml): the nodes' hosts have no route to
	// each other's pods, flanneld gives each node a flannel.1 VXLAN device and the routes over it,
	// and the flannel CNI plugin puts pods on the bridge cni0.
	CNIFlannel = "flannel"
)

// FlannelNamespace is where flannel's DaemonSet runs.
const FlannelNamespace = "kube-flannel"

// FlannelImage is flannel's image (TestImages in deploy/image/images.go, bin/images/flannel.tar).
const FlannelImage = "ghcr.io/flannel-io/flannel:v0.28.11"

// flannelHostDirs are where, with CNIFlannel, containerd takes its CNI plugins and configuration
// from: under /run, which is a tmpfs of the node's own (node.sh), because kube-flannel installs
// both with hostPath volumes and containerd creates a missing hostPath directory (upstream's
// /opt/cni/bin and /etc/cni/net.d would be the machine's).
const (
	flannelCNIBinDir  = "/run/cni/bin"
	flannelCNIConfDir = "/run/cni/net.d"
)

// EnvClusterCNI, if set, is the Spec.CNI of the clusters the package's tests build (the shared
// cluster and the disruption tests' own), e.g. VIPGATE_CLUSTER_CNI=flannel.
const EnvClusterCNI = "VIPGATE_CLUSTER_CNI"

// checkCNISpec validates and completes Spec.CNI.
func checkCNISpec(spec *Spec) error {
	switch spec.CNI {
	case "":
		spec.CNI = CNIBridge
	case CNIBridge:
	case CNIFlannel:
		if spec.Proxy == ProxyNone {
			// flanneld reaches the API server as every pod does, through the kubernetes Service.
			return fmt.Errorf("testcluster: CNI %s needs a service proxy (flanneld reaches the API through the kubernetes Service)", CNIFlannel)
		}
		if spec.Gateways.Count > 0 {
			return fmt.Errorf("testcluster: gateways in front are tested on the %s CNI only", CNIBridge)
		}
		if tar := filepath.Join(spec.BinDir, "images", "flannel.tar"); !fileExists(tar) {
			return fmt.Errorf("testcluster: %s missing (build bin/flanneld and bin/flannel-cni, then `make test-images`)", tar)
		}
	default:
		return fmt.Errorf("testcluster: unknown CNI %q (want %s or %s)", spec.CNI, CNIBridge, CNIFlannel)
	}
	return nil
}

// prepareFlannelHosts makes every node host (spares included) a plain host on the LAN before its
// kubelet starts: the lab's pod bridge cbr0 and the static routes to the other nodes' pod CIDRs go,
// so pods reach other nodes' pods over flannel's VXLAN or not at all. The control plane's routes
// to the pod CIDRs stay (startNodes): they reach a node over the LAN, as before.
func (c *Cluster) prepareFlannelHosts() error {
	kube := c.kubeLabNodes()
	for _, n := range kube {
		cmds := []string{"link del " + lab.NodePodBridge}
		for _, o := range kube {
			if o != n {
				cmds = append(cmds, "route del "+o.PodCIDRv4.String())
			}
		}
		if err := lab.IPBatch(n.NS, cmds); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// nodeCNI is the CNI part of a node's files: containerd's plugin and configuration directories,
// the lines node.sh runs before containerd starts, and the bridge configuration to write
// ("" with flannel, whose DaemonSet writes its own).
func (c *Cluster) nodeCNI(n *Node) (binDir, confDir string, setup []string, bridgeConf bool) {
	if c.Spec.CNI != CNIFlannel {
		return "/usr/lib/cni", filepath.Join(n.Dir, "cni", "net.d"), nil, true
	}
	// The Debian plugins (bridge, host-local, portmap, loopback, ...) as links; kube-flannel's
	// init containers add the flannel plugin and 10-flannel.conflist.
	return flannelCNIBinDir, flannelCNIConfDir, []string{
		"mkdir -p " + flannelCNIBinDir + " " + flannelCNIConfDir,
		"for p in /usr/lib/cni/*; do ln -s $p " + flannelCNIBinDir + "/; done",
	}, false
}

// installFlannel applies kube-flannel (manifests/flannel.yaml).
func (c *Cluster) installFlannel(ctx context.Context) error {
	return c.applyManifest(ctx, "flannel.yaml", map[string]string{
		"CLUSTER_CIDR":  lab.ClusterCIDRv4.String(),
		"CNI_BIN_DIR":   flannelCNIBinDir,
		"CNI_CONF_DIR":  flannelCNIConfDir,
		"FLANNEL_IMAGE": FlannelImage,
	})
}

// FlannelState is what flannel set up on one node, read from the node's network namespace.
type FlannelState struct {
	// Routes are the node's routes over flannel.1 (`ip -4 route show dev flannel.1`).
	Routes string
	// Link is flannel.1's details (`ip -d link show flannel.1`): VXLAN id, port, MTU.
	Link string
	// SubnetEnv is flanneld's /run/flannel/subnet.env.
	SubnetEnv string
	// NFT is flannel's nftables tables (`nft list table ip flannel-ipv4`).
	NFT string
}

// Flannel reads FlannelState on node n.
func (c *Cluster) Flannel(ctx context.Context, n *Node) (FlannelState, error) {
	var s FlannelState
	var err error
	if s.Routes, err = c.Lab.ExecContext(ctx, n.Name, "ip", "-4", "route", "show", "dev", "flannel.1"); err != nil {
		return s, fmt.Errorf("%s: %w", n.Name, err)
	}
	if s.Link, err = c.Lab.ExecContext(ctx, n.Name, "ip", "-d", "link", "show", "flannel.1"); err != nil {
		return s, fmt.Errorf("%s: %w", n.Name, err)
	}
	// /run/flannel is in the node's mount namespace: read it through kubelet's process.
	if pid := n.proc.Pid(); pid > 0 {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/root/run/flannel/subnet.env", pid))
		s.SubnetEnv = strings.TrimSpace(string(b))
	}
	s.NFT, _ = c.Lab.ExecContext(ctx, n.Name, "nft", "list", "table", "ip", "flannel-ipv4")
	return s, nil
}
