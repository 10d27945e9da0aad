package testcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// Gateway hosts in front of the cluster (Spec.Gateways): VMs running `vipgate gateway` as its
// users run it, each a lab host (network namespace on the LAN) with a mount and UTS namespace of its
// own whose root is the gateway package unpacked (dpkg-deb -x), never the machine's:
//
//	client ── router (BIRD: ECMP + BFD over gw1, gw2) ── LAN ──┬── gw1 192.0.2.13, gw2 192.0.2.14
//	                                                             └── node1, node2 (kubelet, vipgate node)
//
// The gateways read the cluster's API (Services, EndpointSlices, Nodes, MetalLB objects) with the
// least-privilege kubeconfig an operator makes (deploy/manifests/12-rbac-gateway.yaml, `vipgate
// gateway kubeconfig`), announce the pools whose advertisements select vipgate.io/role: gateway (BGP to the
// router as AS 64514; L2 on the LAN) and forward into the cluster as GatewaySpec.Forwarding says.
// Services reach them through those pools (metallb.io/address-pool: gateway or gateway-lan); the
// nodes keep announcing the cluster's own pools (their BGPPeer and advertisements select the hosts
// without the role label).

// GatewayASN is the gateways' autonomous system.
const GatewayASN = 64514

// The gateways' pools.
var (
	GatewayPool    = netip.MustParsePrefix("203.0.113.96/27")
	GatewayLANPool = "192.0.2.230-192.0.2.239"
)

// GatewayFlowTimeout is the gateways' flowTimeout (default 1h): route forwarding daisy-chains a
// connection it does not know (one a dead peer carried) to its slot's previous node for that long
// after a backend change, which is wrong for connections that started after the change; the
// tests wait this long after the last change before they kill a gateway.
const GatewayFlowTimeout = 15 * time.Second

// SNATAddress is gateway i's (0-based) own SNAT address with forwarding "<mode>+sync".
func SNATAddress(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(240 + i)}) }

// GatewaySpec describes the gateway hosts.
type GatewaySpec struct {
	// Count is the number of gateway hosts, gw1..gwN (0: none).
	Count int
	// Forwarding is the gateways' forwarding mode: nodePort (default), direct or route; with
	// "+sync" (nodePort+sync, direct+sync) an SNAT pair with conntrack sync.
	Forwarding string
	// Deb is the gateway package installed into each host's root. Default: bin/vipgate_*_<arch>.deb
	// when `make deb` built one, else the binary and unit laid out as the package installs them.
	Deb string
	// Kubeconfig is what the gateways read the API with (default: the ServiceAccount
	// vipgate-gateway's of deploy/manifests/12-rbac-gateway.yaml, made by `vipgate gateway kubeconfig`).
	Kubeconfig string
	// Default makes the gateways' pool the one LoadBalancer Services get without asking (the
	// nodes' bgp pool then only by annotation): the upstream e2e suite's Services go through them.
	Default bool
}

// Gateway is a running gateway host.
type Gateway struct {
	Name string
	Lab  *lab.Node
	// Root holds the host's own files: the package unpacked, /etc/vipgate written (StartGateway
	// lays them over the machine's /usr and /etc, read-only); Dir is its work directory.
	Root, Dir string
	proc      *lab.Proc
}

// Log is the gateway's output so far.
func (g *Gateway) Log() string { return g.proc.Log() }

// Stop ends the gateway process (SIGTERM, as systemctl stop).
func (g *Gateway) Stop() error { return g.proc.Stop() }

// Kill ends it at once (a crashed box).
func (g *Gateway) Kill() error { return g.proc.Kill() }

// isGatewayName says whether a lab host is one of the gateways (gw1, gw2, ...), not a Kubernetes node.
func isGatewayName(name string) bool { return strings.HasPrefix(name, "gw") }

// kubeLabNodes are the lab hosts that are Kubernetes nodes.
func (c *Cluster) kubeLabNodes() []*lab.Node {
	return slices.DeleteFunc(c.Lab.Nodes(), func(n *lab.Node) bool { return isGatewayName(n.Name) })
}

// gatewayLabNodes are the lab hosts that are gateways.
func (c *Cluster) gatewayLabNodes() []*lab.Node {
	return slices.DeleteFunc(c.Lab.Nodes(), func(n *lab.Node) bool { return !isGatewayName(n.Name) })
}

// gatewayMetalLB are the MetalLB objects of the gateways, applied over manifests/metallb.yaml: the
// gateways' pools, advertisements and BGPPeer select vipgate.io/role: gateway; the cluster's own
// BGPPeer and advertisements are narrowed to the hosts without that label (the nodes).
func gatewayMetalLB(byDefault bool) string {
	notGateways := "  nodeSelectors:\n    - matchExpressions:\n        - {key: vipgate.io/role, operator: DoesNotExist}\n"
	gateways := "  nodeSelectors:\n    - matchLabels: {vipgate.io/role: gateway}\n"
	docs := []string{
		"apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: router, namespace: metallb-system}\nspec:\n" +
			"  myASN: 64513\n  peerASN: 64512\n  peerAddress: 192.0.2.1\n  holdTime: 9s\n  enableGracefulRestart: true\n  bfdProfile: fast\n" + notGateways,
		"apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {name: bgp, namespace: metallb-system}\nspec:\n  ipAddressPools: [bgp]\n" + notGateways,
		"apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: lan, namespace: metallb-system}\nspec:\n  ipAddressPools: [lan]\n" + notGateways,
		fmt.Sprintf("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: gateway, namespace: metallb-system}\nspec:\n  addresses: [%s]\n  autoAssign: %t\n", GatewayPool, byDefault),
		fmt.Sprintf("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: gateway-lan, namespace: metallb-system}\nspec:\n  addresses: [%s]\n  autoAssign: false\n", GatewayLANPool),
		fmt.Sprintf("apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: gateways, namespace: metallb-system}\nspec:\n"+
			"  myASN: %d\n  peerASN: 64512\n  peerAddress: 192.0.2.1\n  holdTime: 9s\n  connectTime: 1s\n  bfdProfile: fast\n", GatewayASN) + gateways,
		"apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {name: gateway, namespace: metallb-system}\nspec:\n  ipAddressPools: [gateway]\n" + gateways,
		"apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: gateway-lan, namespace: metallb-system}\nspec:\n  ipAddressPools: [gateway-lan]\n" + gateways,
	}
	if byDefault {
		docs = append(docs, fmt.Sprintf("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: bgp, namespace: metallb-system}\nspec:\n  addresses: [%s]\n  autoAssign: false\n", LoadBalancerPool))
	}
	return strings.Join(docs, "---\n")
}

// startGateways installs and starts every gateway host.
func (c *Cluster) startGateways(ctx context.Context) error {
	spec := c.Spec.Gateways
	if spec.Count == 0 {
		return nil
	}
	if _, err := c.Kubectl(ctx, gatewayMetalLB(spec.Default), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("the gateways' MetalLB objects: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	hosts := c.gatewayLabNodes()
	var gws []*Gateway
	for _, ln := range hosts {
		g := &Gateway{Name: ln.Name, Lab: ln, Dir: filepath.Join(c.Dir, ln.Name)}
		g.Root = filepath.Join(g.Dir, "root")
		if err := c.installGateway(g); err != nil {
			return fmt.Errorf("gateway %s: %w", g.Name, err)
		}
		gws = append(gws, g)
	}
	kubeconfig := spec.Kubeconfig
	if kubeconfig == "admin" {
		kubeconfig = c.Kubeconfig
	}
	if kubeconfig == "" {
		var err error
		if kubeconfig, err = c.gatewayKubeconfig(ctx, gws[0]); err != nil {
			return err
		}
	}
	for _, g := range gws {
		if err := c.configureGateway(g, hosts, hex.EncodeToString(key), kubeconfig); err != nil {
			return fmt.Errorf("gateway %s: %w", g.Name, err)
		}
		if err := c.StartGateway(g); err != nil {
			return fmt.Errorf("gateway %s: %w", g.Name, err)
		}
		c.Gateways = append(c.Gateways, g)
	}
	return nil
}

// gatewayKubeconfig makes the gateways' kubeconfig as docs/gateway.md tells an operator: the RBAC
// manifest (ServiceAccount vipgate-gateway, read-only but Events) applied by the admin, then
// `vipgate gateway kubeconfig` (the installed binary) asks for its token.
func (c *Cluster) gatewayKubeconfig(ctx context.Context, g *Gateway) (string, error) {
	root, err := lab.ModuleRoot()
	if err != nil {
		return "", err
	}
	rbac, err := os.ReadFile(filepath.Join(root, "deploy", "manifests", "12-rbac-gateway.yaml"))
	if err != nil {
		return "", err
	}
	if _, err := c.Kubectl(ctx, string(rbac), "apply", "-f", "-"); err != nil {
		return "", fmt.Errorf("the gateways' RBAC: %w", err)
	}
	argv, err := g.execStart()
	if err != nil {
		return "", err
	}
	out := filepath.Join(c.Dir, "gateway.kubeconfig")
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.CPNS, filepath.Join(g.Root, argv[0]), "gateway", "kubeconfig",
		"--server", APIServerURL(), "--kubeconfig", c.Kubeconfig, "--output", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("vipgate gateway kubeconfig: %w: %s", err, b)
	}
	return out, nil
}

// execStart is the command line of the installed unit's ExecStart=.
func (g *Gateway) execStart() ([]string, error) {
	for _, p := range unitPaths {
		if b, err := os.ReadFile(filepath.Join(g.Root, p)); err == nil {
			return execStart(string(b))
		}
	}
	return nil, fmt.Errorf("no vipgate-gateway.service in %s", g.Root)
}

// gatewayDeb is the package to install: spec.Deb, else the newest bin/vipgate_*_<arch>.deb.
func (c *Cluster) gatewayDeb() string {
	if c.Spec.Gateways.Deb != "" {
		return c.Spec.Gateways.Deb
	}
	debs, _ := filepath.Glob(filepath.Join(c.Spec.BinDir, "vipgate_*_"+runtime.GOARCH+".deb"))
	if len(debs) == 0 {
		return ""
	}
	slices.Sort(debs)
	return debs[len(debs)-1]
}

// unitPaths are where the package puts the gateway's systemd unit.
var unitPaths = []string{"usr/lib/systemd/system/vipgate-gateway.service", "lib/systemd/system/vipgate-gateway.service"}

// installGateway fills the host's root: the package unpacked (dpkg-deb -x, as dpkg lays out its
// files; maintainer scripts are the package's own test's business), or without a package the
// binary and the unit where the unit's ExecStart says.
func (c *Cluster) installGateway(g *Gateway) error {
	if err := os.MkdirAll(g.Root, 0o755); err != nil {
		return err
	}
	if deb := c.gatewayDeb(); deb != "" {
		if err := g.unpack(deb); err != nil {
			return err
		}
		c.logf("%s: installed %s into %s", g.Name, filepath.Base(deb), g.Root)
		return nil
	}
	root, err := lab.ModuleRoot()
	if err != nil {
		return err
	}
	unit, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "vipgate-gateway.service"))
	if err != nil {
		return err
	}
	argv, err := execStart(string(unit))
	if err != nil {
		return err
	}
	// A static binary, as the package's: the host's root has no C library.
	static := filepath.Join(c.Dir, "vipgate-static")
	if !fileExists(static) {
		cmd := exec.Command("go", "build", "-trimpath", "-o", static, "./cmd/vipgate")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building a static vipgate: %w: %s", err, out)
		}
	}
	for path, src := range map[string]string{
		unitPaths[0]:                     filepath.Join(root, "deploy", "systemd", "vipgate-gateway.service"),
		strings.TrimPrefix(argv[0], "/"): static,
	} {
		dst := filepath.Join(g.Root, path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
			return fmt.Errorf("cp %s: %w: %s", src, err, out)
		}
	}
	c.logf("%s: no package (make deb); binary and unit copied into %s", g.Name, g.Root)
	return nil
}

// execStart is the command line of a unit's ExecStart= (no quoting in vipgate's unit).
func execStart(unit string) ([]string, error) {
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart="); ok {
			if f := strings.Fields(strings.TrimLeft(v, "-@:+!")); len(f) > 0 {
				return f, nil
			}
		}
	}
	return nil, errors.New("the unit has no ExecStart=")
}

// configureGateway writes what an operator puts into /etc/vipgate: the GatewayConfig, the
// kubeconfig, the membership key shared by the gateways (0400); and the forwarding sysctls of the
// package's drop-in (or the same two without one) in the host's network namespace.
func (c *Cluster) configureGateway(g *Gateway, group []*lab.Node, key, kubeconfig string) error {
	etc := filepath.Join(g.Root, "etc", "vipgate")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	fwd := c.Spec.Gateways.Forwarding
	if fwd == "" {
		fwd = "nodePort"
	}
	// Direct forwarding DNATs to the pods, whose replies would leave by the nodes' default route
	// (the router) straight to the client: the gateway must see them, so it source-NATs all.
	snat := "auto"
	if fwd == "direct" {
		snat = "always"
	}
	// "+sync": an SNAT pair, each gateway masquerading to an address of its own that the survivor
	// takes over, conntrackd copying the NAT state to the peer (keyed with the membership key).
	fwd, sync := strings.CutSuffix(fwd, "+sync")
	var b strings.Builder
	fmt.Fprintf(&b, `# written by test/cluster (gateways in front of the cluster)
apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: %s
gatewayIPs: [%q]
forwarding: %s
snat: %s
healthCheckInterval: 500ms
flowTimeout: %s
clusterCIDRs: [%q]
serviceCIDRs: [%q]
logFormat: text
speaker:
  memberKeyFile: /etc/vipgate/member.key
  members:
`, g.Name, g.Lab.IPv4, fwd, snat, GatewayFlowTimeout, lab.ClusterCIDRv4, ServiceCIDR)
	for _, m := range group {
		fmt.Fprintf(&b, "    - {name: %s, address: %q}\n", m.Name, m.IPv4)
	}
	if sync {
		b.WriteString("snatAddresses:\n")
		var peer netip.Addr
		for i, m := range group {
			fmt.Fprintf(&b, "  - {gateway: %s, addresses: [%q]}\n", m.Name, SNATAddress(i))
			if m.Name != g.Name {
				peer = m.IPv4
			}
		}
		fmt.Fprintf(&b, "conntrackSync: {peer: %q, stateDir: /var/lib/vipgate/ctsync}\n", peer)
	}
	kc, err := os.ReadFile(kubeconfig)
	if err != nil {
		return err
	}
	for name, f := range map[string]struct {
		data []byte
		mode os.FileMode
	}{
		"gateway.yaml": {[]byte(b.String()), 0o600},
		"kubeconfig":   {kc, 0o600},
		"member.key":   {[]byte(key + "\n"), 0o400},
	} {
		p := filepath.Join(etc, name)
		_ = os.Remove(p) // a 0400 file from an earlier start
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return err
		}
	}
	ns := g.Lab.NS
	sysctls := []string{"net.ipv4.ip_forward=1"}
	if drop, _ := filepath.Glob(filepath.Join(g.Root, "usr", "lib", "sysctl.d", "*vipgate*.conf")); len(drop) > 0 {
		text, err := os.ReadFile(drop[0])
		if err != nil {
			return err
		}
		sysctls = nil
		for _, line := range strings.Split(string(text), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
				continue
			}
			sysctls = append(sysctls, strings.ReplaceAll(line, " ", ""))
		}
	}
	for _, kv := range sysctls {
		if strings.HasPrefix(kv, "net.ipv6.") {
			continue // the cluster's lab is IPv4 only
		}
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("sysctl %s: %w: %s", kv, err, out)
		}
	}
	if fwd == "direct" {
		// Direct forwarding reaches the pods: the routes a network that learns pod CIDRs would have.
		var routes []string
		for _, n := range c.kubeLabNodes() {
			routes = append(routes, fmt.Sprintf("route replace %s via %s", n.PodCIDRv4, n.IPv4))
		}
		if err := lab.IPBatch(ns, routes); err != nil {
			return err
		}
	}
	return nil
}

// StartGateway starts (again) the gateway as its unit says: ExecStart of the installed unit, run in
// the host's own mount and UTS namespace with its root as /, with /proc, /sys, /dev and tmpfs /run,
// /tmp, /var/lib/vipgate (the unit's StateDirectory) mounted there.
func (c *Cluster) StartGateway(g *Gateway) error {
	argv, err := g.execStart()
	if err != nil {
		return err
	}
	// The host's / is a tmpfs of its own with the Debian system under it read-only (/usr and /etc
	// of the machine as overlay lower layers: conntrackd, nft and the C library, as on a VM with
	// the package's Recommends installed) and the host's own files as the upper layers: the
	// package's, /etc/vipgate. Nothing the host writes reaches the machine's files.
	script := fmt.Sprintf(`set -e
r=%[1]q/merged up=%[2]q wk=%[1]q/work
mkdir -p "$r" "$wk/usr" "$wk/etc" "$up/usr" "$up/etc"
mount -t tmpfs -o mode=0755 tmpfs "$r"
for d in usr etc proc sys dev run tmp var/lib/vipgate var/log; do mkdir -p "$r/$d"; done
for l in bin sbin lib lib64; do ln -s "usr/$l" "$r/$l"; done
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$up/usr,workdir=$wk/usr" "$r/usr"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$up/etc,workdir=$wk/etc" "$r/etc"
mount -t proc proc "$r/proc"
mount -t sysfs sysfs "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
mount -t tmpfs -o mode=0700 tmpfs "$r/var/lib/vipgate"
hostname %[3]s
exec chroot "$r" %[4]s
`, g.Dir, g.Root, g.Name, strings.Join(argv, " "))
	path := filepath.Join(g.Dir, "start.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		return err
	}
	unshare, err := lookPath("unshare")
	if err != nil {
		return err
	}
	g.proc, err = c.Lab.Start(g.Name, filepath.Join(g.Dir, "gateway.log"), unshare, "--mount", "--uts", "--propagation", "private", "/bin/sh", path)
	return err
}

// UpgradeGateway upgrades g to the package deb and restarts it, as `dpkg -i` of a newer version and
// the maintainer script's `systemctl try-restart` do: the gateway stops (SIGTERM), the package's
// files are replaced in the host's root, the operator's /etc/vipgate stays as it was (an edited
// conffile is kept), and the gateway starts again.
func (c *Cluster) UpgradeGateway(g *Gateway, deb string) error {
	etc := filepath.Join(g.Root, "etc", "vipgate")
	saved := map[string][]byte{}
	modes := map[string]os.FileMode{}
	ents, err := os.ReadDir(etc)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(etc, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		saved[e.Name()], modes[e.Name()] = b, fi.Mode().Perm()
	}
	if err := g.Stop(); err != nil {
		c.logf("%s: stop: %v", g.Name, err)
	}
	if err := g.unpack(deb); err != nil {
		return err
	}
	for name, b := range saved {
		p := filepath.Join(etc, name)
		_ = os.Remove(p)
		if err := os.WriteFile(p, b, modes[name]); err != nil {
			return err
		}
	}
	c.logf("%s: upgraded to %s", g.Name, filepath.Base(deb))
	return c.StartGateway(g)
}

// unpack lays the package's files into g's root as dpkg does (dpkg-deb -x; its maintainer scripts
// are tested by `make test-deb`).
func (g *Gateway) unpack(deb string) error {
	if out, err := exec.Command("dpkg-deb", "-x", deb, g.Root).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %w: %s", deb, err, out)
	}
	return nil
}
