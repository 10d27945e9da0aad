package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
)

// Roles of the fixed namespaces. Nodes and pods are addressed by their names.
const (
	RoleLAN       = "lan"
	RoleRouter    = "router"
	RoleClient    = "client"
	RoleLANClient = "lanclient"
)

// Default ports of the lab server that runs in every pod.
var (
	DefaultServerPorts = []int{8080, 8081}
	DefaultHTTPPort    = 8088
)

// Spec describes a lab.
type Spec struct {
	// Nodes in order; node i (1-based) gets the addresses of index i.
	Nodes []NodeSpec
	// IPv4Only leaves out every IPv6 address and route (the lab is dual-stack
	// by default).
	IPv4Only bool
	// Prefix overrides the namespace name prefix (default "vg<pid>-<n>-",
	// unique per lab in this process).
	Prefix string
	// WorkDir holds logs and the lab server binary. Default: a fresh temporary
	// directory that Close removes. A directory given here is kept.
	WorkDir string
	// NoServers leaves the pods empty; call StartServers to start them later.
	NoServers bool
	// ServerPorts are the TCP+UDP ports of the pod servers (default 8080, 8081).
	ServerPorts []int
	// HTTPPort is the pod servers' HTTP port (default 8088).
	HTTPPort int
	// LabServer is the path of a built labserver binary. Default: $VIPGATE_LABSERVER,
	// else the lab runs `go build` once for itself.
	LabServer string
}

// NodeSpec names a node and its pods.
type NodeSpec struct {
	Name string
	Pods []string
}

// Node is a node of a running lab.
type Node struct {
	Name  string
	Index int    // 1-based, selects the addresses
	NS    string // network namespace name
	// IPv4 and IPv6 are the LAN addresses on eth0 (IPv6 is invalid in an IPv4-only lab).
	IPv4, IPv6 netip.Addr
	// PodCIDRv4 and PodCIDRv6 are the node's pod networks on cbr0.
	PodCIDRv4, PodCIDRv6 netip.Prefix
	Pods                 []*Pod
}

// Pod is a pod of a running lab.
type Pod struct {
	Name  string
	Index int // 1-based within its node
	NS    string
	Node  *Node
	// IPv4 and IPv6 are the pod's addresses on its eth0.
	IPv4, IPv6 netip.Addr
}

// Lab is a running set of network namespaces. Its methods are safe for
// concurrent use.
type Lab struct {
	spec   Spec
	prefix string
	dir    string
	ownDir bool
	logf   func(string, ...any)

	nodes []*Node
	pods  map[string]*Pod
	byNS  map[string]string // role -> namespace name

	labserver string

	mu      sync.Mutex
	created []string // namespaces in creation order
	procs   []*Proc
	servers []*Proc
	closed  bool
}

var labSeq atomic.Int64

// sweepOnce removes the leftovers of killed processes before the first lab
// of this process is built.
var sweepOnce sync.Once

// validName is what node and pod names may look like: they become parts of
// namespace and file names.
var validName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?$`)

// New builds the lab described by spec. logf (may be nil) receives progress
// lines. On error everything created so far is removed again. The first call
// in a process also sweeps the leftovers of dead processes (SweepStale).
func New(spec Spec, logf func(string, ...any)) (*Lab, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := validate(spec); err != nil {
		return nil, err
	}
	sweepOnce.Do(func() {
		if gone, err := SweepStale(); err != nil {
			logf("sweeping stale lab namespaces: %v", err)
		} else if len(gone) > 0 {
			logf("swept %d namespaces of dead labs", len(gone))
		}
	})
	if len(spec.ServerPorts) == 0 {
		spec.ServerPorts = DefaultServerPorts
	}
	if spec.HTTPPort == 0 {
		spec.HTTPPort = DefaultHTTPPort
	}
	l := &Lab{
		spec:   spec,
		prefix: spec.Prefix,
		logf:   logf,
		pods:   map[string]*Pod{},
		byNS:   map[string]string{},
	}
	if l.prefix == "" {
		l.prefix = fmt.Sprintf("vg%d-%d-", os.Getpid(), labSeq.Add(1)-1)
	}
	l.plan()

	if spec.WorkDir != "" {
		if err := os.MkdirAll(spec.WorkDir, 0o755); err != nil {
			return nil, fmt.Errorf("creating lab work dir: %w", err)
		}
		l.dir = spec.WorkDir
	} else {
		// The pid in the name lets SweepStale find the directory of a killed process.
		dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", workDirPrefix, os.Getpid()))
		if err != nil {
			return nil, fmt.Errorf("creating lab work dir: %w", err)
		}
		l.dir, l.ownDir = dir, true
	}

	start := time.Now()
	if err := l.build(); err != nil {
		l.Close()
		return nil, err
	}
	logf("lab %s: %d namespaces up in %v (work dir %s)", l.prefix, len(l.created), time.Since(start).Round(time.Millisecond), l.dir)
	if !spec.NoServers && len(l.pods) > 0 {
		if err := l.StartServers(); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

func validate(spec Spec) error {
	if len(spec.Nodes) > MaxNodes {
		return fmt.Errorf("lab spec: %d nodes, at most %d", len(spec.Nodes), MaxNodes)
	}
	seen := map[string]bool{RoleLAN: true, RoleRouter: true, RoleClient: true, RoleLANClient: true}
	check := func(kind, name string) error {
		if !validName.MatchString(name) {
			return fmt.Errorf("lab spec: %s name %q: want lower-case letters, digits, '-' and '.'", kind, name)
		}
		if seen[name] {
			return fmt.Errorf("lab spec: %s name %q is used twice or is a reserved role", kind, name)
		}
		seen[name] = true
		return nil
	}
	for _, n := range spec.Nodes {
		if err := check("node", n.Name); err != nil {
			return err
		}
		if len(n.Pods) > MaxPodsPerNode {
			return fmt.Errorf("lab spec: node %s has %d pods, at most %d", n.Name, len(n.Pods), MaxPodsPerNode)
		}
		for _, p := range n.Pods {
			if err := check("pod", p); err != nil {
				return err
			}
		}
	}
	return nil
}

// plan fills in nodes, pods and namespace names from the spec (no side effects).
func (l *Lab) plan() {
	for _, role := range []string{RoleLAN, RoleRouter, RoleClient, RoleLANClient} {
		l.byNS[role] = l.prefix + role
	}
	for i, ns := range l.spec.Nodes {
		n := &Node{
			Name:      ns.Name,
			Index:     i + 1,
			NS:        l.prefix + ns.Name,
			IPv4:      NodeIPv4(i + 1),
			PodCIDRv4: PodCIDRv4(i + 1),
		}
		if !l.spec.IPv4Only {
			n.IPv6, n.PodCIDRv6 = NodeIPv6(i+1), PodCIDRv6(i+1)
		}
		l.byNS[n.Name] = n.NS
		for j, pn := range ns.Pods {
			p := &Pod{
				Name:  pn,
				Index: j + 1,
				NS:    l.prefix + pn,
				Node:  n,
				IPv4:  PodIPv4(i+1, j+1),
			}
			if !l.spec.IPv4Only {
				p.IPv6 = PodIPv6(i+1, j+1)
			}
			n.Pods = append(n.Pods, p)
			l.pods[pn] = p
			l.byNS[pn] = p.NS
		}
		l.nodes = append(l.nodes, n)
	}
}

// Prefix is the namespace name prefix of this lab (for Sweep).
func (l *Lab) Prefix() string { return l.prefix }

// Dir is the lab's work directory (logs, binaries).
func (l *Lab) Dir() string { return l.dir }

// IPv6 reports whether the lab has IPv6 addresses.
func (l *Lab) IPv6() bool { return !l.spec.IPv4Only }

// NS returns the network namespace name of a role: "lan", "router", "client",
// "lanclient", a node name or a pod name. It returns "" for an unknown role.
func (l *Lab) NS(role string) string { return l.byNS[role] }

// Node returns the node with that name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Nodes returns all nodes in index order.
func (l *Lab) Nodes() []*Node { return append([]*Node(nil), l.nodes...) }

// Pod returns the pod with that name, or nil.
func (l *Lab) Pod(name string) *Pod { return l.pods[name] }

// Pods returns all pods, node by node.
func (l *Lab) Pods() []*Pod {
	var out []*Pod
	for _, n := range l.nodes {
		out = append(out, n.Pods...)
	}
	return out
}

// Exec runs args in the role's namespace (ip netns exec) and returns the
// combined output. It gives up after a minute.
func (l *Lab) Exec(role string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return l.ExecContext(ctx, role, args...)
}

// ExecContext is Exec with a caller's context.
func (l *Lab) ExecContext(ctx context.Context, role string, args ...string) (string, error) {
	ns := l.NS(role)
	if ns == "" {
		return "", fmt.Errorf("lab: unknown role %q", role)
	}
	if len(args) == 0 {
		return "", errors.New("lab: exec needs a command")
	}
	return run(ctx, nil, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

// AddRoute routes prefix in the router to the LAN addresses of the given
// nodes (ECMP when there are several), replacing an existing route. Use it to
// send a VIP or the service CIDR to nodes.
func (l *Lab) AddRoute(prefix netip.Prefix, viaNodes ...string) error {
	if len(viaNodes) == 0 {
		return errors.New("lab: AddRoute needs at least one node")
	}
	args := []string{"route", "replace", prefix.Masked().String()}
	for _, name := range viaNodes {
		n := l.Node(name)
		if n == nil {
			return fmt.Errorf("lab: AddRoute %s: unknown node %q", prefix, name)
		}
		gw := n.IPv4
		if prefix.Addr().Is6() {
			if !n.IPv6.IsValid() {
				return fmt.Errorf("lab: AddRoute %s: the lab has no IPv6", prefix)
			}
			gw = n.IPv6
		}
		if len(viaNodes) == 1 {
			args = append(args, "via", gw.String())
		} else {
			args = append(args, "nexthop", "via", gw.String())
		}
	}
	if _, err := run(context.Background(), nil, "ip", append([]string{"-n", l.NS(RoleRouter)}, args...)...); err != nil {
		return fmt.Errorf("lab: routing %s via %v: %w", prefix, viaNodes, err)
	}
	l.logf("router: %s via %v", prefix, viaNodes)
	return nil
}

// DelRoute removes a route added with AddRoute.
func (l *Lab) DelRoute(prefix netip.Prefix) error {
	if _, err := run(context.Background(), nil, "ip", "-n", l.NS(RoleRouter), "route", "del", prefix.Masked().String()); err != nil {
		return fmt.Errorf("lab: deleting route %s: %w", prefix, err)
	}
	l.logf("router: %s removed", prefix)
	return nil
}

// Close stops every process the lab started, kills anything else still in
// its namespaces, deletes the namespaces and (if the lab made it) the work
// directory. It is safe to call more than once.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	procs := append([]*Proc(nil), l.procs...)
	created := append([]string(nil), l.created...)
	l.mu.Unlock()

	var errs []error
	// Stop processes in parallel: each gets a short grace period, and the
	// namespaces go away right after anyway.
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(2 * time.Second)
		}()
	}
	wg.Wait()
	// Delete in reverse order, so pods go before their nodes and the LAN last.
	for i := len(created) - 1; i >= 0; i-- {
		if err := deleteNS(created[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if l.ownDir {
		if err := os.RemoveAll(l.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing lab work dir: %w", err))
		}
	}
	l.logf("lab %s: closed", l.prefix)
	return errors.Join(errs...)
}
