package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run executes a command and returns its combined output; a failure carries
// the command line and the output, which is usually all one needs to debug.
func run(ctx context.Context, stdin io.Reader, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// ipBatch runs several ip commands in one namespace with one fork: the lab
// creates a few hundred objects and exec'ing ip for each one is the slow part.
func ipBatch(ns string, cmds []string) error {
	if len(cmds) == 0 {
		return nil
	}
	_, err := run(context.Background(), strings.NewReader(strings.Join(cmds, "\n")+"\n"), "ip", "-n", ns, "-batch", "-")
	return err
}

// IPBatch runs ip commands in one lab (or other) namespace with one fork, for packages that add to a
// lab (the test cluster's control-plane routes).
func IPBatch(ns string, cmds []string) error { return ipBatch(ns, cmds) }

// sysctl sets kernel parameters inside a namespace (ip netns exec gives the
// command a /proc/sys/net of that namespace).
func sysctl(ns string, kv ...string) error {
	_, err := run(context.Background(), nil, "ip", append([]string{"netns", "exec", ns, "sysctl", "-q", "-w"}, kv...)...)
	return err
}

// build creates the namespaces, links, addresses and routes. It records
// every namespace before configuring it, so Close can undo a half-built lab.
func (l *Lab) build() error {
	v6 := !l.spec.IPv4Only
	lan, router, client, lanclient := l.NS(RoleLAN), l.NS(RoleRouter), l.NS(RoleClient), l.NS(RoleLANClient)

	// Phase 1: namespaces and their sysctls. The sysctls come first because
	// "default" values only apply to interfaces created afterwards.
	base := []string{
		// Addresses are usable at once; duplicate address detection only adds
		// a second of flakiness to every test.
		"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
		// Router advertisements are nobody's business in the lab.
		"net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0",
		// Asymmetric paths (DSR, VIPs routed to one node answered by another)
		// are normal here; reverse path filtering would drop them.
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
	}
	forwarding := []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.forwarding=1"}
	type nsSetup struct {
		name    string
		sysctls []string
	}
	all := []nsSetup{
		// The LAN namespace only bridges; no IPv6 on its own ports keeps it
		// silent (the bridge still forwards IPv6 frames).
		{lan, append(append([]string{}, base...), "net.ipv6.conf.default.disable_ipv6=1")},
		{router, append(append([]string{}, base...), forwarding...)},
		{client, base},
		{lanclient, base},
	}
	for _, n := range l.nodes {
		all = append(all, nsSetup{n.NS, append(append([]string{}, base...), forwarding...)})
		for _, p := range n.Pods {
			all = append(all, nsSetup{p.NS, base})
		}
	}
	for _, s := range all {
		if _, err := run(context.Background(), nil, "ip", "netns", "add", s.name); err != nil {
			return fmt.Errorf("creating namespace: %w", err)
		}
		l.mu.Lock()
		l.created = append(l.created, s.name)
		l.mu.Unlock()
		if err := ipBatch(s.name, []string{"link set lo up"}); err != nil {
			return fmt.Errorf("namespace %s: %w", s.name, err)
		}
		if err := sysctl(s.name, s.sysctls...); err != nil {
			return fmt.Errorf("namespace %s: %w", s.name, err)
		}
	}

	// Phase 2: bridges. Multicast snooping is off so NDP to solicited-node
	// groups is flooded whether or not anybody sent an MLD report.
	bridge := func(name string) []string {
		return []string{
			"link add " + name + " type bridge stp_state 0 forward_delay 0 mcast_snooping 0",
			"link set " + name + " up",
		}
	}
	if err := ipBatch(lan, bridge(LANBridge)); err != nil {
		return fmt.Errorf("lan bridge: %w", err)
	}
	for _, n := range l.nodes {
		if err := ipBatch(n.NS, bridge(NodePodBridge)); err != nil {
			return fmt.Errorf("node %s pod bridge: %w", n.Name, err)
		}
	}

	// Phase 3: veth pairs, created from the leaf namespace with the peer
	// placed straight into the other namespace: nothing ever appears in the
	// root namespace. Peer names are short and index based (IFNAMSIZ is 16).
	type link struct {
		ns, name         string
		peerNS, peerName string
		bridge           string // bridge in peerNS to plug the peer into, if any
	}
	links := []link{
		{router, RouterLANLink, lan, "r0", LANBridge},
		{client, NodeUplink, router, RouterClientLink, ""},
		{lanclient, NodeUplink, lan, "lc0", LANBridge},
	}
	for _, n := range l.nodes {
		links = append(links, link{n.NS, NodeUplink, lan, fmt.Sprintf("n%d", n.Index), LANBridge})
		for _, p := range n.Pods {
			links = append(links, link{p.NS, NodeUplink, n.NS, fmt.Sprintf("p%d", p.Index), NodePodBridge})
		}
	}
	peerCmds := map[string][]string{}
	var peerOrder []string
	for _, lk := range links {
		err := ipBatch(lk.ns, []string{
			fmt.Sprintf("link add %s type veth peer name %s netns %s", lk.name, lk.peerName, lk.peerNS),
			"link set " + lk.name + " up",
		})
		if err != nil {
			return fmt.Errorf("veth %s/%s - %s/%s: %w", lk.ns, lk.name, lk.peerNS, lk.peerName, err)
		}
		if _, ok := peerCmds[lk.peerNS]; !ok {
			peerOrder = append(peerOrder, lk.peerNS)
		}
		if lk.bridge != "" {
			peerCmds[lk.peerNS] = append(peerCmds[lk.peerNS], fmt.Sprintf("link set %s master %s", lk.peerName, lk.bridge))
			if lk.bridge == NodePodBridge {
				// kubelet's hairpin-veth mode: with br_netfilter on (as on real nodes), a pod that
				// reaches itself through a Service is DNATed while its frame is still in the bridge
				// and must be allowed back out of the port it came in on.
				peerCmds[lk.peerNS] = append(peerCmds[lk.peerNS], fmt.Sprintf("link set %s type bridge_slave hairpin on", lk.peerName))
			}
		}
		peerCmds[lk.peerNS] = append(peerCmds[lk.peerNS], fmt.Sprintf("link set %s up", lk.peerName))
	}
	for _, ns := range peerOrder {
		if err := ipBatch(ns, peerCmds[ns]); err != nil {
			return fmt.Errorf("plugging veths in %s: %w", ns, err)
		}
	}

	// Phase 4: addresses and routes, per namespace in one batch.
	cfg := map[string][]string{}
	addr := func(ns, dev string, v4, v6addr string) {
		cfg[ns] = append(cfg[ns], fmt.Sprintf("addr add %s dev %s", v4, dev))
		if v6 {
			cfg[ns] = append(cfg[ns], fmt.Sprintf("addr add %s dev %s nodad", v6addr, dev))
		}
	}
	route := func(ns, dst4, via4, dst6, via6 string) {
		cfg[ns] = append(cfg[ns], fmt.Sprintf("route add %s via %s", dst4, via4))
		if v6 {
			cfg[ns] = append(cfg[ns], fmt.Sprintf("route add %s via %s", dst6, via6))
		}
	}
	addr(router, RouterLANLink, RouterLANv4.String()+"/24", RouterLANv6.String()+"/64")
	addr(router, RouterClientLink, RouterClientv4.String()+"/24", RouterClientv6.String()+"/64")
	addr(client, NodeUplink, Clientv4.String()+"/24", Clientv6.String()+"/64")
	route(client, "default", RouterClientv4.String(), "::/0", RouterClientv6.String())
	addr(lanclient, NodeUplink, LANClientv4.String()+"/24", LANClientv6.String()+"/64")
	route(lanclient, "default", RouterLANv4.String(), "::/0", RouterLANv6.String())
	for _, n := range l.nodes {
		addr(n.NS, NodeUplink, n.IPv4.String()+"/24", NodeIPv6(n.Index).String()+"/64")
		route(n.NS, "default", RouterLANv4.String(), "::/0", RouterLANv6.String())
		addr(n.NS, NodePodBridge, PodGatewayv4(n.Index).String()+"/24", PodGatewayv6(n.Index).String()+"/64")
		// Pod CIDRs of the other nodes: the "flat" pod network of a simple CNI.
		for _, o := range l.nodes {
			if o != n {
				route(n.NS, o.PodCIDRv4.String(), o.IPv4.String(), PodCIDRv6(o.Index).String(), NodeIPv6(o.Index).String())
			}
		}
		for _, p := range n.Pods {
			addr(p.NS, NodeUplink, p.IPv4.String()+"/24", PodIPv6(n.Index, p.Index).String()+"/64")
			route(p.NS, "default", PodGatewayv4(n.Index).String(), "::/0", PodGatewayv6(n.Index).String())
		}
	}
	// The router learns no pod routes: clients outside the cluster cannot
	// reach pods, only what tests route with AddRoute.
	for _, s := range all {
		if err := ipBatch(s.name, cfg[s.name]); err != nil {
			return fmt.Errorf("configuring %s: %w", s.name, err)
		}
	}
	return nil
}

// deleteNS kills every process left in a namespace and deletes it. The kill
// matters: a live process keeps the namespace, and its veths, alive after
// the name is gone.
func deleteNS(ns string) error {
	killNSProcs(ns)
	if _, err := run(context.Background(), nil, "ip", "netns", "del", ns); err != nil {
		if !nsExists(ns) {
			return nil
		}
		return fmt.Errorf("deleting namespace %s: %w", ns, err)
	}
	return nil
}

func killNSProcs(ns string) {
	for range 3 {
		out, err := run(context.Background(), nil, "ip", "netns", "pids", ns)
		if err != nil {
			return
		}
		pids := strings.Fields(out)
		if len(pids) == 0 {
			return
		}
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Namespaces lists the names of all named network namespaces.
func Namespaces() ([]string, error) {
	out, err := run(context.Background(), nil, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		// Lines look like "name (id: 3)" or just "name".
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

func nsExists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

// Sweep deletes every namespace whose name starts with prefix (after
// killing its processes) and returns the names it deleted. The prefix must
// start with "vg" and be at least 4 characters long, so a typo cannot sweep
// unrelated namespaces.
func Sweep(prefix string) ([]string, error) {
	if len(prefix) < 4 || !strings.HasPrefix(prefix, "vg") {
		return nil, fmt.Errorf("lab: refusing to sweep prefix %q", prefix)
	}
	return sweepMatching(func(name string) bool { return strings.HasPrefix(name, prefix) })
}

// labNSName matches the default names of this package: vg<pid>-<seq>-<role>.
var labNSName = regexp.MustCompile(`^vg([0-9]+)-[0-9]+-`)

// workDirPrefix starts the names of the lab's own temporary directories:
// vipgate-lab-<pid>-<random>.
const workDirPrefix = "vipgate-lab-"

// SweepStale deletes the namespaces (and temporary work directories) of labs
// whose process is gone: a test binary killed by a timeout runs no cleanup.
// Labs of live processes are left alone.
func SweepStale() ([]string, error) {
	gone, err := sweepMatching(func(name string) bool {
		m := labNSName.FindStringSubmatch(name)
		return m != nil && deadPid(m[1])
	})
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), workDirPrefix+"*"))
	for _, dir := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), workDirPrefix), "-")
		if ok && deadPid(pid) {
			_ = os.RemoveAll(dir)
		}
	}
	return gone, err
}

// deadPid reports whether the process with that (decimal) id is gone.
func deadPid(s string) bool {
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	// Signal 0 checks existence; ESRCH means the process is gone.
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func sweepMatching(match func(string) bool) ([]string, error) {
	names, err := Namespaces()
	if err != nil {
		return nil, fmt.Errorf("lab: listing namespaces: %w", err)
	}
	var deleted []string
	var errs []error
	for _, name := range names {
		if !match(name) {
			continue
		}
		if err := deleteNS(name); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, name)
	}
	return deleted, errors.Join(errs...)
}
