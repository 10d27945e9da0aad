// Command demo runs vipgate in the netns lab and takes a person on a short
// tour: a ClusterIP from a pod, a NodePort from a client, and LoadBalancer
// VIPs with externalTrafficPolicy Local and Cluster. For every scene it
// prints who answered and which source address the pod saw, and checks it
// against what Kubernetes promises. `sudo make demo` runs it:
//
//	go run ./test/demo --vipgate bin/vipgate
//
// --only gateway runs only the two gateway scenes (BGP and ECMP, then gw1's death).
//
// It needs root, creates only lab namespaces (vg<pid>-...) and removes them
// on exit, on failure and on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

type options struct {
	vipgate     string
	vipgateArgs string
	labserver   string
	manifests   string
	probes      int
	timeout     time.Duration
	keep        bool
	verbose     bool
	only        string
}

func main() {
	var o options
	flag.StringVar(&o.vipgate, "vipgate", "", "vipgate binary (default: go build ./cmd/vipgate)")
	flag.StringVar(&o.vipgateArgs, "vipgate-args", "", "extra arguments for `vipgate node`, space separated")
	flag.StringVar(&o.labserver, "labserver", "", "labserver binary (default: $"+lab.LabServerEnv+", else go build ./test/labserver)")
	flag.StringVar(&o.manifests, "manifests", "", "manifest directory (default: deploy/examples/demo of the module)")
	flag.IntVar(&o.probes, "probes", 6, "probes per protocol and address in each scene (1..1000)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for vipgate to serve the ClusterIP")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, configs) after a successful run")
	flag.BoolVar(&o.verbose, "v", false, "log lab set-up steps")
	flag.StringVar(&o.only, "only", "", "run only these scenes: gateway (the two gateway scenes, ending with gw1's death)")
	flag.Parse()
	if o.probes < 1 || o.probes > 1000 {
		fmt.Fprintln(os.Stderr, "demo: --probes must be 1..1000")
		os.Exit(2)
	}
	if o.only != "" && o.only != "gateway" {
		fmt.Fprintf(os.Stderr, "demo: --only %q: the only scene group is gateway\n", o.only)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces and needs root: run it with sudo")
	}
	if gone, err := lab.SweepStale(); err == nil && len(gone) > 0 {
		fmt.Printf("removed %d namespaces left over by earlier runs\n", len(gone))
	}
	root, rootErr := lab.ModuleRoot()
	if o.manifests == "" {
		if rootErr != nil {
			return fmt.Errorf("finding the manifests: %w (pass --manifests)", rootErr)
		}
		o.manifests = filepath.Join(root, "deploy", "examples", "demo")
	}
	if o.manifests, err = filepath.Abs(o.manifests); err != nil {
		return err
	}
	if _, err := os.Stat(o.manifests); err != nil {
		return fmt.Errorf("manifests: %w", err)
	}

	dir, err := os.MkdirTemp("", "vipgate-demo-")
	if err != nil {
		return fmt.Errorf("creating work dir: %w", err)
	}
	defer func() {
		if err != nil || o.keep {
			fmt.Printf("\nlogs and configs kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()

	if o.vipgate == "" {
		if rootErr != nil {
			return fmt.Errorf("no --vipgate given and cannot build it: %w", rootErr)
		}
		fmt.Println("building vipgate (go build ./cmd/vipgate) ...")
		o.vipgate = filepath.Join(dir, "vipgate")
		if err := lab.BuildBinary("github.com/vipgate/vipgate/cmd/vipgate", o.vipgate); err != nil {
			return fmt.Errorf("building vipgate (or pass --vipgate): %w", err)
		}
	}
	if o.vipgate, err = filepath.Abs(o.vipgate); err != nil {
		return err
	}
	if _, err := os.Stat(o.vipgate); err != nil {
		return fmt.Errorf("vipgate binary: %w", err)
	}

	// A labserver built into the work dir goes away with it.
	labserver := o.labserver
	if labserver == "" {
		labserver = os.Getenv(lab.LabServerEnv)
	}
	if labserver == "" {
		labserver = filepath.Join(dir, "labserver")
		if err := lab.BuildBinary(lab.LabServerPackage, labserver); err != nil {
			return fmt.Errorf("building the lab server (or set %s): %w", lab.LabServerEnv, err)
		}
	}

	logf := func(string, ...any) {}
	if o.verbose {
		logf = func(f string, a ...any) { fmt.Printf("  lab: "+f+"\n", a...) }
	}
	fmt.Println("building the lab: router, client, lanclient, node1 (web-1, web-2), node2 (web-3), gateways gw1 and gw2 ...")
	l, err := lab.New(lab.Spec{
		Nodes: []lab.NodeSpec{
			{Name: "node1", Pods: []string{"web-1", "web-2"}},
			{Name: "node2", Pods: []string{"web-3"}},
			{Name: "gw1"}, {Name: "gw2"},
		},
		WorkDir:   dir,
		LabServer: labserver,
	}, logf)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("\ncleaning up the lab ...")
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
	}()
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	printTopology(l)

	configs, err := writeNodeConfigs(l, dir)
	if err != nil {
		return err
	}
	nodes := map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		if isGateway(n.Name) {
			continue
		}
		args := []string{o.vipgate, "node", "--config", configs[n.Name], "--manifests", o.manifests}
		args = append(args, strings.Fields(o.vipgateArgs)...)
		p, err := l.Start(n.Name, filepath.Join(dir, "vipgate-"+n.Name+".log"), args...)
		if err != nil {
			return err
		}
		nodes[n.Name] = p
		fmt.Printf("started on %s: %s\n", n.Name, strings.Join(args, " "))
	}
	// The router stands in for the upstream network: it sends both VIPs to
	// node1, as a BGP or L2 announcement would.
	for _, vip := range []netip.Addr{localVIPv4, globalVIPv4, localVIPv6, globalVIPv6} {
		if err := l.AddRoute(netip.PrefixFrom(vip, vip.BitLen()), "node1"); err != nil {
			return err
		}
	}
	fmt.Printf("router: 203.0.113.10, 203.0.113.11, 2001:db8:ff::10, 2001:db8:ff::11 routed to node1\n")

	gws, err := startGateways(l, dir, o.vipgate, o.manifests)
	if err != nil {
		return err
	}

	if err := waitReady(ctx, l, nodes, o.timeout); err != nil {
		return err
	}

	// --only gateway leaves out the node scenes: the gateway scenes need every node (the gateways
	// steer flows to them) but none of the earlier scenes' state.
	var tour []scene
	if o.only == "" {
		tour = scenes(l)
	}
	tour = append(tour, gatewayScenes(ctx, gws)...)
	failed := 0
	for i, sc := range tour {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		note := ""
		if sc.before != nil {
			if note, err = sc.before(); err != nil {
				return err
			}
		}
		rows := sc.run(l, o.probes)
		failed += sc.print(os.Stdout, i+1, rows, note)
		if err := checkAlive(nodes); err != nil {
			return err
		}
		if err := checkAlive(gws.alive()); err != nil {
			return err
		}
	}
	if failed > 0 {
		fmt.Printf("\nlogs: %s\n", strings.Join(append(logPaths(nodes), logPaths(gws.procs)...), ", "))
		return fmt.Errorf("%d probe rows did not match what Kubernetes promises", failed)
	}
	fmt.Println("\nevery scene behaved as Kubernetes promises ✓")
	return nil
}

// waitReady waits until the ClusterIP answers from a pod, failing fast (with
// the log) when a vipgate process exits.
func waitReady(ctx context.Context, l *lab.Lab, nodes map[string]*lab.Proc, timeout time.Duration) error {
	target := netip.AddrPortFrom(clusterIPv4, servicePort).String()
	fmt.Printf("waiting for vipgate to serve %s (up to %v) ...\n", target, timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		if err := checkAlive(nodes); err != nil {
			return err
		}
		r, err := l.Probe("web-3", "tcp", target)
		if err != nil {
			return err
		}
		if r.OK() {
			fmt.Printf("ClusterIP answered after %v\n", time.Since(start).Round(10*time.Millisecond))
			return nil
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for name, p := range nodes {
				fmt.Fprintf(&b, "\n--- last lines of vipgate on %s (%s):\n%s", name, p.LogPath, p.Tail(20))
			}
			return fmt.Errorf("the ClusterIP %s did not answer within %v (last probe: %s)%s", target, timeout, r, b.String())
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted")
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// checkAlive reports a vipgate that exited, with the tail of its log.
func checkAlive(nodes map[string]*lab.Proc) error {
	for name, p := range nodes {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("vipgate on %s exited early (%v); last lines of %s:\n%s", name, err, p.LogPath, p.Tail(20))
		}
	}
	return nil
}

func logPaths(nodes map[string]*lab.Proc) []string {
	var out []string
	for _, p := range nodes {
		out = append(out, p.LogPath)
	}
	return out
}

func printTopology(l *lab.Lab) {
	fmt.Println(`
  client 198.51.100.10 ── router ── LAN 192.0.2.0/24 ──┬── node1 192.0.2.11 ── web-1 10.244.1.11, web-2 10.244.1.12
                                                       ├── node2 192.0.2.12 ── web-3 10.244.2.11
                                                       ├── gw1 192.0.2.13, gw2 192.0.2.14 (vipgate gateway: BGP to the router, forwarding: route)
                                                       └── lanclient 192.0.2.100`)
	if l.IPv6() {
		fmt.Println("  (IPv6 alike: client 2001:db8:2::10, nodes 2001:db8:1::11/12, pods 2001:db8:244:<node>::<10+i>)")
	}
	fmt.Println(`  services (deploy/examples/demo): web ClusterIP 10.96.0.10:80, web-np NodePort 30080,
  web-local LoadBalancer 203.0.113.10 (eTP=Local), web-cluster LoadBalancer 203.0.113.11 (eTP=Cluster),
  web-gw LoadBalancer 203.0.113.20 (announced by the gateways)`)
	fmt.Println()
}
