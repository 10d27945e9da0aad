package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipgate/vipgate/test/lab"
)

// cgroupV1 is where the machine's cgroup v1 hierarchies are mounted.
const cgroupV1 = "/sys/fs/cgroup"

// standInSysctls are the files under /proc/sys that the kubelet may write (its kernel tunables) and
// that are not per network namespace: inside a node's mount namespace each is covered by a copy,
// so the machine's values never change.
var standInSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func (c *Cluster) startNodes(ctx context.Context) error {
	// The control plane reaches pods (and pods the control plane, e.g. CoreDNS through the
	// kubernetes Service's endpoint) on the flat pod network: a route to every node's pod CIDR via
	// that node, as a bare-metal network that learns pod CIDRs would have. The router learns none,
	// so outside clients still reach pods only through what vipgate publishes.
	var routes []string
	for _, ln := range c.kubeLabNodes() {
		routes = append(routes, fmt.Sprintf("route add %s via %s", ln.PodCIDRv4, ln.IPv4))
	}
	if err := lab.IPBatch(c.CPNS, routes); err != nil {
		return err
	}
	if c.Spec.CNI == CNIFlannel {
		if err := c.prepareFlannelHosts(); err != nil {
			return err
		}
	}
	for _, ln := range c.kubeLabNodes()[:c.Spec.Nodes] {
		if _, err := c.startNode(ln); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := c.registerNode(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts the node's containerd and kubelet in its own mount and UTS namespace.
func (c *Cluster) startNode(ln *lab.Node) (*Node, error) {
	n := &Node{Name: ln.Name, Lab: ln, Dir: filepath.Join(c.Dir, ln.Name), CgroupRoot: "/" + c.Lab.Prefix() + ln.Name}
	c.Nodes = append(c.Nodes, n)
	if err := makeCgroupRoot(n.CgroupRoot); err != nil {
		return nil, err
	}
	script, err := c.writeNodeFiles(n, imageTarballs(c.Spec))
	if err != nil {
		return nil, err
	}
	unshare, err := lookPath("unshare")
	if err != nil {
		return nil, err
	}
	// exec chain without forks (ip netns exec -> unshare -> sh -> kubelet): the lab's
	// parent-death signal reaches the kubelet.
	n.proc, err = c.Lab.Start(ln.Name, filepath.Join(n.Dir, "node.log"),
		unshare, "--mount", "--uts", "--propagation", "private", "/bin/sh", script)
	return n, err
}

// registerNode waits until the node registered itself and gives it its pod CIDR: the lab's (the CNI
// configuration uses it), set once by the admin as kube-controller-manager would with
// --allocate-node-cidrs.
func (c *Cluster) registerNode(ctx context.Context, n *Node) error {
	err := poll(ctx, readyTimeout, func(ctx context.Context) error {
		if exited, err := n.proc.Exited(); exited {
			return errStop{fmt.Errorf("node %s exited: %v", n.Name, err)}
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Spec.PodCIDR != "" {
			return nil
		}
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.Lab.PodCIDRv4, n.Lab.PodCIDRv4)
		_, err = c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: %w (log %s)", n.Name, err, filepath.Join(n.Dir, "kubelet.log"))
	}
	return nil
}

// AddNode joins the next spare host (Spec.Spare) to the running cluster, as an operator adds a
// machine: its kubelet starts and registers, and AddNode returns once the node is Ready and every
// pod the DaemonSets put on it (vipgate's node agent, the CNI) is ready.
func (c *Cluster) AddNode(ctx context.Context) (*Node, error) {
	kube := c.kubeLabNodes()
	if len(c.Nodes) >= len(kube) {
		return nil, errors.New("testcluster: no spare host left (Spec.Spare)")
	}
	n, err := c.startNode(kube[len(c.Nodes)])
	if err != nil {
		return nil, err
	}
	if err := c.registerNode(ctx, n); err != nil {
		return nil, err
	}
	return n, c.waitSystemReady(ctx)
}

// errStop ends poll early.
type errStop struct{ error }

// writeNodeFiles writes the node's containerd, CNI and kubelet configuration and the script that
// starts them inside the node's own mount and UTS namespace; it returns the script's path.
func (c *Cluster) writeNodeFiles(n *Node, tars []string) (string, error) {
	for _, d := range []string{"cni/net.d", "sysctl", "pod-logs", "volume-plugins", "kubelet", "kubelet-pki"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return "", err
		}
	}
	user := "system:node:" + n.Name
	kubeconfig, err := os.ReadFile(c.kubeconfigPath(user))
	if err != nil {
		return "", err
	}
	cgroups, err := cgroupMounts()
	if err != nil {
		return "", err
	}
	var cgroupLines []string
	for _, m := range cgroups {
		cgroupLines = append(cgroupLines, fmt.Sprintf("mkdir -p %s && mount -t cgroup -o %s cgroup %s", m.dir, m.opts, m.dir))
	}
	cniBin, cniConf, cniSetup, bridgeConf := c.nodeCNI(n)
	data := map[string]any{
		"CNIBinDir":   cniBin,
		"CNIConfDir":  cniConf,
		"CNISetup":    cniSetup,
		"Cgroups":     cgroupLines,
		"CgroupFS":    cgroupV1,
		"Name":        n.Name,
		"Dir":         n.Dir,
		"NodeIP":      n.Lab.IPv4.String(),
		"Zone":        NodeZone(n.Lab.Index),
		"PodCIDR":     n.Lab.PodCIDRv4.String(),
		"PodGateway":  lab.PodGatewayv4(n.Lab.Index).String(),
		"RangeStart":  lab.PodIPv4(n.Lab.Index, 1).String(),
		"Bridge":      lab.NodePodBridge,
		"CgroupRoot":  n.CgroupRoot,
		"DNS":         DNSServiceIP.String(),
		"Router":      lab.RouterLANv4.String(),
		"Images":      tars,
		"Sysctls":     standInSysctls,
		"Kubelet":     c.bin("kubelet"),
		"PauseImage":  pauseImage,
		"ContainerdS": filepath.Join(n.Dir, "containerd.sock"),
	}
	files := map[string]string{
		"containerd.toml":                   containerdConfig,
		"cni/net.d/10-vipgate-lab.conflist": cniConfig,
		"kubelet.yaml":                      kubeletConfig,
		"resolv.conf":                       "nameserver {{.Router}}\n",
		"node.sh":                           nodeScript,
	}
	if !bridgeConf {
		delete(files, "cni/net.d/10-vipgate-lab.conflist")
	}
	for name, text := range files {
		var buf bytes.Buffer
		if err := template.Must(template.New(name).Parse(text)).Execute(&buf, data); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(n.Dir, name), buf.Bytes(), 0o644); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "kubeconfig"), kubeconfig, 0o600); err != nil {
		return "", err
	}
	return filepath.Join(n.Dir, "node.sh"), nil
}

// pauseImage is the sandbox image (kubelet v1.36's default, built by `make test-images`).
const pauseImage = "registry.k8s.io/pause:3.10.2"

const containerdConfig = `# containerd for {{.Name}}: its own root, state and sockets; runc with cgroupfs.
version = 2
root = "{{.Dir}}/containerd/root"
state = "{{.Dir}}/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{{.ContainerdS}}"

[ttrpc]
  address = "{{.ContainerdS}}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{.PauseImage}}"
  # runc fails ("can't get final child's PID") without it when oom_score_adj cannot be lowered.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{.CNIBinDir}}"
    conf_dir = "{{.CNIConfDir}}"
`

const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "vipgate-lab",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "{{.Bridge}}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "{{.PodCIDR}}", "rangeStart": "{{.RangeStart}}", "gateway": "{{.PodGateway}}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`

const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {{.CgroupRoot}}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
containerRuntimeEndpoint: unix://{{.ContainerdS}}
address: {{.NodeIP}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDomain: cluster.local
clusterDNS: [{{.DNS}}]
resolvConf: {{.Dir}}/resolv.conf
podLogsDir: {{.Dir}}/pod-logs
volumePluginDir: {{.Dir}}/volume-plugins
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
nodeStatusUpdateFrequency: 4s
shutdownGracePeriod: 0s
`

// nodeScript runs as `unshare --mount --uts --propagation private /bin/sh node.sh` in the node's
// network namespace: private tmpfs over /run, /var/lib and /var/log, the node's host name,
// stand-ins for the kubelet's kernel tunables, then containerd (with the images imported) and the
// kubelet, which replaces the shell.
const nodeScript = `set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
D={{.Dir}}
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /var/log
mount --make-rshared /
# ip netns exec mounted a fresh /sys (for the namespace's devices), which hides the cgroup
# hierarchies: mount them again (the same hierarchies; cgroup v1 only, as on the machine).
mount -t tmpfs -o mode=0755 cgroup "{{.CgroupFS}}"
{{range .Cgroups}}{{.}}
{{end}}hostname {{.Name}}
{{range .Sysctls}}if [ -e /proc/sys/{{.}} ]; then f=$D/sysctl/$(echo {{.}} | tr / .); cat /proc/sys/{{.}} > $f; mount --bind $f /proc/sys/{{.}}; fi
{{end}}{{range .CNISetup}}{{.}}
{{end}}
containerd --config $D/containerd.toml >> $D/containerd.log 2>&1 &
n=0
until ctr --address {{.ContainerdS}} version > /dev/null 2>&1; do
  n=$((n+1)); if [ $n -gt 600 ]; then echo "containerd did not start (see $D/containerd.log)"; exit 1; fi
  sleep 0.1
done
{{range .Images}}ctr --address {{$.ContainerdS}} -n k8s.io images import {{.}} > /dev/null
{{end}}echo "images imported"
exec {{.Kubelet}} --config $D/kubelet.yaml --kubeconfig $D/kubeconfig --root-dir $D/kubelet \
  --cert-dir $D/kubelet-pki --hostname-override {{.Name}} --node-ip {{.NodeIP}} \
  --node-labels topology.kubernetes.io/zone={{.Zone}} --v=1 >> $D/kubelet.log 2>&1
`

// cgroupHierarchies lists the mounted cgroup v1 hierarchies (cpu, memory, name=systemd, ...).
func cgroupHierarchies() ([]string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	dirs := make([]string, len(mounts))
	for i, m := range mounts {
		dirs[i] = m.dir
	}
	return dirs, nil
}

// cgroupMount is a mounted cgroup v1 hierarchy: its directory and the options that select it
// ("cpu", "cpuset", "none,name=systemd").
type cgroupMount struct{ dir, opts string }

func cgroupMounts() ([]cgroupMount, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var out []cgroupMount
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[2] != "cgroup" || !strings.HasPrefix(f[1], cgroupV1+"/") {
			continue
		}
		var opts []string
		named := false
		for _, o := range strings.Split(f[3], ",") {
			switch {
			case o == "rw" || o == "ro" || o == "relatime" || o == "nosuid" || o == "nodev" || o == "noexec":
			case strings.HasPrefix(o, "name="):
				named = true
				opts = append(opts, o)
			default:
				opts = append(opts, o)
			}
		}
		if named && len(opts) == 1 {
			opts = append([]string{"none"}, opts...)
		}
		out = append(out, cgroupMount{dir: f[1], opts: strings.Join(opts, ",")})
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup v1 hierarchies mounted under " + cgroupV1)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dir < out[j].dir })
	return out, nil
}

// makeCgroupRoot creates root in every hierarchy; cpuset needs its cpus and mems before any task
// can join, copied from the top.
func makeCgroupRoot(root string) error {
	dirs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range dirs {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" || strings.Contains(filepath.Base(h), "cpuset") {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills every process in root's subtree (in every hierarchy), then removes its
// cgroups, deepest first.
func removeCgroupRoot(root string) error {
	if root == "" || root == "/" {
		return nil
	}
	dirs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for attempt := 0; attempt < 50; attempt++ {
		alive := 0
		for _, h := range dirs {
			_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, s := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(s); err == nil && pid > 1 && pid != os.Getpid() {
						alive++
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if alive == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, h := range dirs {
		top := filepath.Join(h, root)
		var all []string
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		// Deepest first.
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, d := range all {
			var e error
			for range 20 {
				if e = syscall.Rmdir(d); e == nil || errors.Is(e, syscall.ENOENT) {
					e = nil
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if e != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, e))
			}
		}
	}
	return errors.Join(errs...)
}

// staleCgroup matches the cgroup roots of this package: /vg<pid>-<seq>-node<N>.
var staleCgroup = regexp.MustCompile(`^vg([0-9]+)-[0-9]+-node[0-9]+$`)

// SweepStale removes what clusters of dead processes left: their lab namespaces (and with them the
// processes in them) and their cgroup roots.
func SweepStale(logf func(string, ...any)) {
	if gone, err := lab.SweepStale(); len(gone) > 0 || err != nil {
		logf("swept stale namespaces %v (%v)", gone, err)
	}
	dirs, err := cgroupHierarchies()
	if err != nil || len(dirs) == 0 {
		return
	}
	entries, _ := os.ReadDir(dirs[0])
	for _, e := range entries {
		m := staleCgroup.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid > 0 && pid != os.Getpid() && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			err := removeCgroupRoot("/" + e.Name())
			logf("swept stale cgroup root /%s (%v)", e.Name(), err)
		}
	}
}
