package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// Proxies a cluster can run.
const (
	ProxyVipgate   = "vipgate"
	ProxyKubeProxy = "kube-proxy"
	ProxyNone      = "none"
)

// Fixed addresses and ranges of the cluster (see doc.go).
var (
	// APIServerAddr is where kube-apiserver listens (the lab's lanclient).
	APIServerAddr = lab.LANClientv4
	// ServiceCIDR is the cluster-IP range; DNSServiceIP is CoreDNS's Service.
	ServiceCIDR  = netip.MustParsePrefix("10.96.0.0/16")
	DNSServiceIP = netip.MustParseAddr("10.96.0.10")
	// LoadBalancerPool is the MetalLB IPAddressPool the cluster's LoadBalancer Services draw from.
	LoadBalancerPool = netip.MustParsePrefix("203.0.113.64/27")
)

// APIServerPort is kube-apiserver's secure port.
const APIServerPort = 6443

// Spec describes a cluster.
type Spec struct {
	// Nodes is the number of worker nodes (default 2), named node1, node2, ...
	Nodes int
	// Spare is the number of hosts made ready to join later (AddNode), named after the nodes: the
	// lab, the router's BGP neighbours and the node credentials exist, the kubelet does not run.
	Spare int
	// Proxy is the service proxy: ProxyVipgate (default), ProxyKubeProxy or ProxyNone.
	Proxy string
	// KubeProxyMode is kube-proxy's mode with ProxyKubeProxy: KubeProxyNFTables (default, "") or
	// KubeProxyIPTables.
	KubeProxyMode string
	// MetalLB installs the real MetalLB (metallb.go; ProxyKubeProxy only): "" none, MetalLBL2 or
	// MetalLBBGP (the lab router's BIRD peers with MetalLB's speakers; Cluster.BIRD is set).
	MetalLB string
	// CNI is the pod network: CNIBridge (default, "") or CNIFlannel (flannel.go).
	CNI string
	// BinDir holds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
	// helmrender and the image tarballs (vipgate-image.tar, images/*.tar). Default: the module's bin/.
	BinDir string
	// WorkDir holds configuration, logs and the nodes' containerd roots. Default: a fresh directory
	// under the system temp dir, removed by Close unless KeepWorkDir.
	WorkDir     string
	KeepWorkDir bool
	// Values is an extra values file for vipgate's chart (optional).
	Values string
	// Gateways are gateway hosts in front of the cluster (gateways.go; vipgate proxy only).
	Gateways GatewaySpec
	// Logf receives progress lines (default: discarded).
	Logf func(string, ...any)
}

// Cluster is a running cluster.
type Cluster struct {
	Spec Spec
	Lab  *lab.Lab
	// Dir is the work directory.
	Dir string
	// Kubeconfig is an admin kubeconfig; it works inside CPNS (kubectl, e2e.test).
	Kubeconfig string
	// CPNS is the control plane's network namespace (the lab's lanclient).
	CPNS string
	// Client and Dynamic talk to the API server from this process (their sockets are made in CPNS).
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	REST    *rest.Config
	// Nodes are the worker nodes in order.
	Nodes []*Node
	// BIRD is the router's BGP daemon (nil with ProxyNone, and with ProxyKubeProxy unless
	// Spec.MetalLB is MetalLBBGP).
	BIRD *lab.Proc
	// Gateways are the gateway hosts (Spec.Gateways), in order.
	Gateways []*Gateway

	pki    *apiserver.PKI
	tokens map[string]string // user -> token
	logf   func(string, ...any)

	closeOnce sync.Once
}

// Node is a worker node.
type Node struct {
	Name string
	Lab  *lab.Node
	// Dir is the node's work directory: containerd's root and state, the kubelet's root, logs.
	Dir string
	// CgroupRoot is the kubelet's cgroup root (the same path in every v1 hierarchy).
	CgroupRoot string
	proc       *lab.Proc
}

// Up builds the cluster and waits until every node is Ready and every system pod (CoreDNS, the
// proxy) is running and ready. On error everything built so far is removed again.
func Up(ctx context.Context, spec Spec) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testcluster: needs root (network namespaces, mounts, cgroups)")
	}
	if spec.Nodes == 0 {
		spec.Nodes = 2
	}
	if spec.Proxy == "" {
		spec.Proxy = ProxyVipgate
	}
	if spec.Logf == nil {
		spec.Logf = func(string, ...any) {}
	}
	if spec.BinDir == "" {
		root, err := lab.ModuleRoot()
		if err != nil {
			return nil, err
		}
		spec.BinDir = filepath.Join(root, "bin")
	}
	if err := checkBinaries(spec); err != nil {
		return nil, err
	}
	SweepStale(spec.Logf)
	nodes := make([]lab.NodeSpec, spec.Nodes+spec.Spare)
	for i := range nodes {
		nodes[i] = lab.NodeSpec{Name: fmt.Sprintf("node%d", i+1)}
	}
	if err := checkProxySpec(&spec); err != nil {
		return nil, err
	}
	if err := checkCNISpec(&spec); err != nil {
		return nil, err
	}
	if spec.Gateways.Count > 0 && spec.Proxy != ProxyVipgate {
		return nil, errors.New("testcluster: gateways need vipgate as the service proxy (its MetalLB objects)")
	}
	for i := range spec.Gateways.Count {
		nodes = append(nodes, lab.NodeSpec{Name: fmt.Sprintf("gw%d", i+1)})
	}
	l, err := lab.New(lab.Spec{Nodes: nodes, IPv4Only: true, NoServers: true, WorkDir: spec.WorkDir}, spec.Logf)
	if err != nil {
		return nil, fmt.Errorf("testcluster: lab: %w", err)
	}
	c := &Cluster{Spec: spec, Lab: l, Dir: l.Dir(), CPNS: l.NS(lab.RoleLANClient), logf: spec.Logf}
	if err := c.up(ctx); err != nil {
		c.dumpLogs()
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	start := time.Now()
	if err := c.routerHashesL4(); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	c.logf("control plane ready (%.1f s)", time.Since(start).Seconds())
	if err := c.startNodes(ctx); err != nil {
		return err
	}
	c.logf("nodes registered (%.1f s)", time.Since(start).Seconds())
	if err := c.installAddons(ctx); err != nil {
		return err
	}
	if err := c.waitSystemReady(ctx); err != nil {
		return err
	}
	if err := c.startGateways(ctx); err != nil {
		return err
	}
	c.logf("cluster ready: %d nodes, proxy %s, CNI %s (%.1f s)", len(c.Nodes), c.Spec.Proxy, c.Spec.CNI, time.Since(start).Seconds())
	return nil
}

// checkBinaries fails early, naming what is missing and how to build it.
func checkBinaries(spec Spec) error {
	var missing []string
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "helmrender"} {
		if _, err := os.Stat(filepath.Join(spec.BinDir, b)); err != nil {
			missing = append(missing, filepath.Join(spec.BinDir, b))
		}
	}
	for _, b := range []string{"etcd", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "bird", "unshare"} {
		if _, err := lookPath(b); err != nil {
			missing = append(missing, b+" (Debian package)")
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		missing = append(missing, "/usr/lib/cni/bridge (containernetworking-plugins)")
	}
	if len(imageTarballs(spec)) == 0 {
		missing = append(missing, filepath.Join(spec.BinDir, "images/*.tar (make test-images)"))
	}
	if len(missing) > 0 {
		return fmt.Errorf("testcluster: missing %s (run `make cluster-deps`)", strings.Join(missing, ", "))
	}
	return nil
}

// lookPath finds a program on PATH or in the sbin directories sudo and CI shells may leave out.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// imageTarballs are the OCI tarballs every node imports.
func imageTarballs(spec Spec) []string {
	tars, _ := filepath.Glob(filepath.Join(spec.BinDir, "images", "*.tar"))
	if v := filepath.Join(spec.BinDir, "vipgate-image.tar"); fileExists(v) {
		tars = append(tars, v)
	}
	return tars
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// makeClients builds the API clients of this process from the admin kubeconfig.
func (c *Cluster) makeClients() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.Dial = apiserver.DialerInNetns(c.CPNS)
	cfg.QPS, cfg.Burst = 50, 100
	c.REST = cfg
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	c.Dynamic, err = dynamic.NewForConfig(cfg)
	return err
}

// waitSystemReady waits until every node is Ready and every pod in kube-system and vipgate-system
// is running and ready.
func (c *Cluster) waitSystemReady(ctx context.Context) error {
	return poll(ctx, 4*time.Minute, func(ctx context.Context) error {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) < len(c.Nodes) {
			return fmt.Errorf("%d of %d nodes registered", len(nodes.Items), len(c.Nodes))
		}
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
				return fmt.Errorf("node %s not ready", n.Name)
			}
		}
		for _, ns := range []string{"kube-system", "vipgate-system", FlannelNamespace} {
			pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if !podReady(&p) {
					return fmt.Errorf("pod %s/%s not ready (%s)", ns, p.Name, p.Status.Phase)
				}
			}
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poll retries f every 500 ms until it succeeds or timeout passes; the error says what was last
// wrong.
func poll(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
		last = f(callCtx)
		callCancel()
		if last == nil {
			return nil
		}
		var stop errStop
		if errors.As(last, &stop) {
			return stop.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Kubectl runs kubectl (the cluster's version) with the admin kubeconfig inside CPNS.
func (c *Cluster) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	full := append([]string{"netns", "exec", c.CPNS, filepath.Join(c.Spec.BinDir, "kubectl"), "--kubeconfig", c.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "ip", full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Close tears everything down: kubelets and containerd first, then every process left in the
// nodes' cgroups and namespaces, the cgroups, and the lab. Safe to call more than once.
func (c *Cluster) Close() error {
	var err error
	c.closeOnce.Do(func() {
		var errs []error
		var wg sync.WaitGroup
		for _, n := range c.Nodes {
			if n.proc != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = n.proc.Stop()
				}()
			}
		}
		wg.Wait()
		for _, n := range c.Nodes {
			if e := removeCgroupRoot(n.CgroupRoot); e != nil {
				errs = append(errs, e)
			}
		}
		if e := c.Lab.Close(); e != nil {
			errs = append(errs, e)
		}
		// The lab removed its own work dir unless it was given one; the nodes' dirs may hold
		// read-only or busy files of containerd, so try once more after the processes are gone.
		if c.Spec.WorkDir == "" && !c.Spec.KeepWorkDir {
			_ = os.RemoveAll(c.Dir)
		}
		err = errors.Join(errs...)
	})
	return err
}

// dumpLogs prints the tails of the component logs after a failure.
func (c *Cluster) dumpLogs() {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(c.Dir, "node*", "*.log"))
	for _, f := range append(logs, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		c.logf("--- %s (last %d lines)\n%s", f, len(lines), strings.Join(lines, "\n"))
	}
}

// RunE2E runs e2e.test against the cluster from the lab's client namespace (outside the cluster,
// behind the router: the address of a real user, in no node's /16), with the cluster's kubeconfig,
// kubectl and node count filled in.
func (c *Cluster) RunE2E(ctx context.Context, opt E2EOptions) ([]E2EResult, error) {
	if opt.Binary == "" {
		opt.Binary = c.bin("e2e.test")
	}
	if opt.Netns == "" {
		opt.Netns = c.Lab.NS(lab.RoleClient)
	}
	if opt.Kubectl == "" {
		opt.Kubectl = c.bin("kubectl")
	}
	opt.Kubeconfig = c.Kubeconfig
	opt.NumNodes = len(c.Nodes)
	return RunE2E(ctx, opt)
}
