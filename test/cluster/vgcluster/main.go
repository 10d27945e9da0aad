// Command vgcluster runs the real Kubernetes cluster of package testcluster (`make cluster`,
// `make cluster-down`).
//
//	vgcluster up [--dir DIR] [--nodes 2] [--proxy vipgate|kube-proxy|none] [--gateways N [--gateway-forwarding MODE]] [--foreground]
//	             [--kube-proxy-mode nftables|iptables] [--metallb l2|bgp]   (kube-proxy only: its mode, the real MetalLB)
//	             [--cni bridge|flannel]   (the pod network; flannel: VXLAN, test/cluster/flannel.go)
//	vgcluster down [--dir DIR]
//	vgcluster kubectl [--dir DIR] -- ARGS...   (kubectl inside the control plane's namespace)
//	vgcluster exec [--dir DIR] ROLE -- CMD...  (a command in a lab namespace: client, router, node1, ...)
//	vgcluster conformance [--focus RE] [--skip RE] [--proxies vipgate,kube-proxy] [--out FILE]
//
// `up` starts a supervisor in the background that builds the cluster, keeps it running and tears
// it down on SIGTERM (`down`); it returns once the cluster is ready (or failed), printing how to
// reach it. The supervisor's state (PID, namespaces, kubeconfig) is in DIR/state.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	testcluster "github.com/vipgate/vipgate/test/cluster"
	"github.com/vipgate/vipgate/test/lab"
)

// state is what a running supervisor leaves for `down`, `kubectl` and `exec`.
type state struct {
	PID        int               `json:"pid"`
	Prefix     string            `json:"prefix"`
	Kubeconfig string            `json:"kubeconfig"`
	Namespaces map[string]string `json:"namespaces"` // role -> netns
	Dir        string            `json:"dir"`
	Proxy      string            `json:"proxy"`
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "kubectl":
		err = kubectl(os.Args[2:])
	case "exec":
		err = execIn(os.Args[2:])
	case "conformance":
		err = conformance(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vgcluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: vgcluster up|down|kubectl|exec [--dir DIR] ...")
	os.Exit(2)
}

func defaultDir() string {
	if root, err := lab.ModuleRoot(); err == nil {
		return filepath.Join(root, "bin", "cluster")
	}
	return filepath.Join(os.TempDir(), "vipgate-cluster")
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", defaultDir(), "state and work directory")
	nodes := fs.Int("nodes", 2, "worker nodes")
	proxy := fs.String("proxy", testcluster.ProxyVipgate, "service proxy: vipgate, kube-proxy or none")
	bin := fs.String("bin", "", "directory of the binaries and images (default: the module's bin/)")
	values := fs.String("values", "", "extra values file for vipgate's chart")
	foreground := fs.Bool("foreground", false, "run the supervisor in this process")
	gateways := fs.Int("gateways", 0, "gateway hosts gw1..gwN in front of the cluster (vipgate gateway from bin/vipgate_*.deb)")
	gwForwarding := fs.String("gateway-forwarding", "nodePort", "the gateways' forwarding: nodePort, direct or route")
	kpMode := fs.String("kube-proxy-mode", "", "kube-proxy's mode with --proxy kube-proxy: nftables (default) or iptables")
	metalLB := fs.String("metallb", "", "with --proxy kube-proxy: the real MetalLB in mode l2 or bgp (default: none)")
	cni := fs.String("cni", "", "pod network: bridge (default) or flannel (VXLAN)")
	_ = fs.Parse(args)
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	*dir = abs
	if st, err := readState(*dir); err == nil && syscall.Kill(st.PID, 0) == nil {
		return fmt.Errorf("a cluster is already running (pid %d); `make cluster-down` first", st.PID)
	}
	if !*foreground {
		return detach(*dir, args)
	}
	if err := os.RemoveAll(filepath.Join(*dir, "work")); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(*dir, "ready"))
	_ = os.Remove(filepath.Join(*dir, "failed"))
	if err := os.MkdirAll(filepath.Join(*dir, "work"), 0o755); err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		fmt.Printf("%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	c, err := testcluster.Up(ctx, testcluster.Spec{
		Nodes: *nodes, Proxy: *proxy, BinDir: *bin, WorkDir: filepath.Join(*dir, "work"),
		Values: *values, Logf: logf, Gateways: testcluster.GatewaySpec{Count: *gateways, Forwarding: *gwForwarding},
		KubeProxyMode: *kpMode, MetalLB: *metalLB, CNI: *cni,
	})
	if err != nil {
		_ = os.WriteFile(filepath.Join(*dir, "failed"), []byte(err.Error()+"\n"), 0o644)
		return err
	}
	defer c.Close()
	st := state{PID: os.Getpid(), Prefix: c.Lab.Prefix(), Kubeconfig: c.Kubeconfig, Dir: *dir, Proxy: *proxy,
		Namespaces: map[string]string{}}
	for _, role := range []string{lab.RoleLAN, lab.RoleRouter, lab.RoleClient, lab.RoleLANClient} {
		st.Namespaces[role] = c.Lab.NS(role)
	}
	for _, n := range c.Nodes {
		st.Namespaces[n.Name] = n.Lab.NS
	}
	for _, g := range c.Gateways {
		st.Namespaces[g.Name] = g.Lab.NS
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(*dir, "state.json"), b, 0o644); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(*dir, "ready"), nil, 0o644)
	logf("ready; `make cluster-down` (or SIGTERM to pid %d) removes it", os.Getpid())
	<-ctx.Done()
	logf("stopping")
	if err := c.Close(); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(*dir, "state.json"))
	logf("removed")
	return nil
}

// detach starts `up --foreground` in a new session, its output in DIR/cluster.log, and waits until
// it reports ready or failed.
func detach(dir string, args []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "ready"))
	_ = os.Remove(filepath.Join(dir, "failed"))
	logPath := filepath.Join(dir, "cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{"up", "--foreground", "--dir", dir}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	fmt.Printf("vgcluster: building the cluster (supervisor pid %d, log %s)\n", cmd.Process.Pid, logPath)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			msg, _ := os.ReadFile(filepath.Join(dir, "failed"))
			return fmt.Errorf("the supervisor exited (%v): %s (see %s)", err, strings.TrimSpace(string(msg)), logPath)
		case <-tick.C:
		}
		if msg, err := os.ReadFile(filepath.Join(dir, "failed")); err == nil {
			return fmt.Errorf("cluster failed: %s (see %s)", strings.TrimSpace(string(msg)), logPath)
		}
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			st, err := readState(dir)
			if err != nil {
				return err
			}
			fmt.Printf(`vgcluster: ready (%s as the service proxy)
  kubectl:        bin/vgcluster kubectl -- get pods -A
  kubeconfig:     %s (use it inside the control plane's namespace: ip netns exec %s kubectl ...)
  outside client: bin/vgcluster exec client -- curl http://<LoadBalancer IP>/
  remove it:      make cluster-down
`, st.Proxy, st.Kubeconfig, st.Namespaces[lab.RoleLANClient])
			return nil
		}
	}
}

func readState(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", defaultDir(), "state and work directory")
	_ = fs.Parse(args)
	st, err := readState(*dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Println("vgcluster: no cluster running")
	} else if err != nil {
		return err
	} else if syscall.Kill(st.PID, syscall.SIGTERM) == nil {
		fmt.Printf("vgcluster: stopping the supervisor (pid %d)\n", st.PID)
		deadline := time.Now().Add(2 * time.Minute)
		for syscall.Kill(st.PID, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if syscall.Kill(st.PID, 0) == nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			time.Sleep(time.Second)
		}
	}
	// Whatever a killed supervisor left: namespaces, processes in them, cgroups.
	testcluster.SweepStale(func(format string, a ...any) { fmt.Printf("vgcluster: "+format+"\n", a...) })
	_ = os.Remove(filepath.Join(*dir, "state.json"))
	_ = os.RemoveAll(filepath.Join(*dir, "work"))
	fmt.Println("vgcluster: removed")
	return nil
}

func kubectl(args []string) error {
	fs := flag.NewFlagSet("kubectl", flag.ExitOnError)
	dir := fs.String("dir", defaultDir(), "state and work directory")
	_ = fs.Parse(args)
	st, err := readState(*dir)
	if err != nil {
		return fmt.Errorf("no cluster running (%w)", err)
	}
	kubectlBin := filepath.Join(filepath.Dir(*dir), "kubectl")
	if root, err := lab.ModuleRoot(); err == nil {
		kubectlBin = filepath.Join(root, "bin", "kubectl")
	}
	full := append([]string{"netns", "exec", st.Namespaces[lab.RoleLANClient], kubectlBin, "--kubeconfig", st.Kubeconfig}, fs.Args()...)
	return run("ip", full...)
}

func execIn(args []string) error {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	dir := fs.String("dir", defaultDir(), "state and work directory")
	_ = fs.Parse(args)
	rest := fs.Args()
	if len(rest) < 2 {
		return errors.New("usage: vgcluster exec [--dir DIR] ROLE -- CMD [ARG...]")
	}
	st, err := readState(*dir)
	if err != nil {
		return fmt.Errorf("no cluster running (%w)", err)
	}
	cmdArgs := rest[1:]
	if cmdArgs[0] == "--" {
		cmdArgs = cmdArgs[1:]
	}
	ns, ok := st.Namespaces[rest[0]]
	if !ok {
		return fmt.Errorf("no namespace for %q (have %v)", rest[0], st.Namespaces)
	}
	return run("ip", append([]string{"netns", "exec", ns}, cmdArgs...)...)
}

func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd.Run()
}
