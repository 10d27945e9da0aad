// Package apiserver runs a real kube-apiserver on Debian's etcd for vipgate's Kubernetes tests: no
// controllers, no kubelets, just the API. Tests create the objects a cluster would have (Services,
// EndpointSlices, Nodes, MetalLB resources) themselves.
//
// The server uses token authentication (Server.Token, a system:masters user, and one token per
// Options.Users) and AlwaysAllow authorization (RBAC with Options.RBAC), serves with a throwaway CA (in the kubeconfig), allocates cluster IPs from
// 10.96.0.0/16, and keeps its etcd data in a fresh temporary directory per Start.
//
// With Options.Netns set, etcd and kube-apiserver run inside that network namespace (for example a
// lab's LAN client, so that vipgate in the node namespaces reaches it over the lab LAN). The test
// process itself stays in the root namespace; Server.Client, Server.Dynamic and RESTConfig dial
// through DialerInNetns, which creates their sockets inside the namespace.
//
// Binaries: $VIPGATE_KUBE_APISERVER, else bin/kube-apiserver of the module (`make apiserver`), and
// etcd from $PATH or /usr/bin/etcd (Debian's etcd-server).
package apiserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Environment variables that point at the binaries.
const (
	EnvKubeAPIServer = "VIPGATE_KUBE_APISERVER"
	EnvEtcd          = "VIPGATE_ETCD"
)

// ServiceCIDR is the cluster IP range of the test API server.
const ServiceCIDR = "10.96.0.0/16"

// readyTimeout bounds how long Start and Restart wait for /readyz (the server needs 2-10 s).
const readyTimeout = 90 * time.Second

// Options select where the server runs.
type Options struct {
	// Netns is the network namespace to run etcd and kube-apiserver in ("" = the root namespace,
	// listening on 127.0.0.1 only).
	Netns string
	// Addr is the address kube-apiserver listens on inside Netns (required with Netns; ignored
	// without).
	Addr netip.Addr
	// RBAC runs the server with RBAC authorization instead of AlwaysAllow (Server.Token stays a
	// system:masters user, which RBAC lets do anything), for tests of what a Role grants.
	RBAC bool
	// Users get a bearer token each (Server.RESTConfigAs), with no group but
	// system:authenticated: "system:serviceaccount:NS:NAME" is that ServiceAccount to RBAC.
	Users []string
}

// Server is a running kube-apiserver with its etcd.
type Server struct {
	// URL is the API server's https URL.
	URL string
	// Kubeconfig is the path of a kubeconfig file for the server (token auth, CA included). Programs
	// that run inside Options.Netns can use it as is.
	Kubeconfig string
	// Token is the bearer token of a system:masters user.
	Token string
	// Client and Dynamic talk to the server from the test process.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	opts     Options
	dir      string
	addr     netip.Addr
	port     int
	etcdURL  string
	pki      *PKI
	apiBin   string
	restCfg  *rest.Config
	logf     func(string, ...any)
	mu       sync.Mutex
	etcd     *proc
	api      *proc
	starts   int
	stopOnce sync.Once
}

// Start runs etcd and kube-apiserver, waits until the API server is ready and returns it. The test
// is skipped when not run as root (the netns variant needs it, and CI runs these tests as root); it
// fails when a binary is missing. t.Cleanup stops both processes.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (runs kube-apiserver and etcd, possibly in a network namespace)")
	}
	s, err := start(t, opts)
	if err != nil {
		t.Fatalf("starting kube-apiserver: %v", err)
	}
	return s
}

func start(t testing.TB, opts Options) (*Server, error) {
	s, err := Launch(opts, t.TempDir(), t.Logf)
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() || err != nil {
				s.dumpLogs()
			}
			s.Shutdown()
		})
	}
	return s, err
}

// Launch is Start for programs that are not tests (the benchmark): the server's files go to dir,
// its messages to logf, and the caller stops it with Shutdown (also after an error, when the
// returned Server is not nil).
func Launch(opts Options, dir string, logf func(string, ...any)) (*Server, error) {
	apiBin, err := apiserverBinary()
	if err != nil {
		return nil, err
	}
	etcdBin, err := etcdBinary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, dir: dir, apiBin: apiBin, logf: logf}

	s.addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if opts.Netns != "" {
		if !opts.Addr.IsValid() {
			return s, errors.New("Options.Addr is required with Options.Netns")
		}
		s.addr = opts.Addr
	}
	ports, err := freePorts(opts.Netns, s.addr, 1)
	if err != nil {
		return s, err
	}
	// etcd listens on the loopback of the namespace: only kube-apiserver talks to it.
	loop := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	etcdPorts, err := freePorts(opts.Netns, loop, 2)
	if err != nil {
		return s, err
	}
	s.port = ports[0]
	s.URL = "https://" + net.JoinHostPort(s.addr.String(), strconv.Itoa(s.port))
	s.etcdURL = "http://" + net.JoinHostPort(loop.String(), strconv.Itoa(etcdPorts[0]))
	peerURL := "http://" + net.JoinHostPort(loop.String(), strconv.Itoa(etcdPorts[1]))

	if s.pki, err = MakePKI(s.dir, s.addr); err != nil {
		return s, err
	}
	s.Token = "vipgate-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	tokens := s.Token + ",vipgate-test-admin,vipgate-test-admin,system:masters\n"
	for i, u := range opts.Users {
		tokens += fmt.Sprintf("%s,%s,vipgate-test-user-%d\n", s.userToken(u), u, i)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return s, fmt.Errorf("writing token file: %w", err)
	}
	if err := s.writeKubeconfig(); err != nil {
		return s, err
	}
	if err := s.makeClients(); err != nil {
		return s, err
	}

	s.etcd, err = s.spawn("etcd", etcdBin,
		"--name", "vipgate-test",
		"--data-dir", filepath.Join(s.dir, "etcd"),
		"--listen-client-urls", s.etcdURL,
		"--advertise-client-urls", s.etcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "vipgate-test="+peerURL,
		"--logger", "zap",
		"--log-level", "warn",
	)
	if err != nil {
		return s, err
	}
	startAt := time.Now()
	if err := s.startAPIServer(); err != nil {
		return s, err
	}
	// The bootstrap controller creates the "default" namespace shortly after /readyz turns green;
	// tests put their objects there.
	if err := s.waitFor(func(ctx context.Context) error {
		_, err := s.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	}); err != nil {
		return s, fmt.Errorf("waiting for the default namespace: %w", err)
	}
	logf("kube-apiserver ready at %s (netns %q) in %v", s.URL, opts.Netns, time.Since(startAt).Round(time.Millisecond))
	return s, nil
}

// apiserverBinary finds kube-apiserver.
func apiserverBinary() (string, error) {
	if p := os.Getenv(EnvKubeAPIServer); p != "" {
		return p, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if ok {
		p := filepath.Join(filepath.Dir(file), "..", "..", "bin", "kube-apiserver")
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("kube-apiserver not found: set %s or run `make apiserver` (builds bin/kube-apiserver)", EnvKubeAPIServer)
}

// etcdBinary finds etcd.
func etcdBinary() (string, error) {
	if p := os.Getenv(EnvEtcd); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", fmt.Errorf("etcd not found: install Debian's etcd-server or set %s", EnvEtcd)
}

// freePorts asks the kernel for n free TCP ports on addr inside ns. The listeners are closed again
// before the server binds, which leaves a small window for a race with another process; the ports are
// ephemeral ones nobody else asks for by number.
func freePorts(ns string, addr netip.Addr, n int) ([]int, error) {
	var ports []int
	err := InNetns(ns, func() error {
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for range n {
			l, err := net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
			if err != nil {
				return fmt.Errorf("finding a free port on %s: %w", addr, err)
			}
			ls = append(ls, l)
			ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		}
		return nil
	})
	return ports, err
}

// writeKubeconfig writes the kubeconfig file for the server.
func (s *Server) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.pki.CAPEM}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: s.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test", Namespace: metav1.NamespaceDefault}
	cfg.CurrentContext = "test"
	s.Kubeconfig = filepath.Join(s.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, s.Kubeconfig); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}

// makeClients builds the clients of the test process from the kubeconfig.
func (s *Server) makeClients() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.Dial = DialerInNetns(s.opts.Netns)
	cfg.UserAgent = "vipgate-test"
	// Tests create objects in bursts; the default 5 QPS would make them slow for no reason.
	cfg.QPS, cfg.Burst = 200, 400
	s.restCfg = cfg
	if s.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	if s.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	return nil
}

// RESTConfig returns a copy of the test process's client configuration (it dials into
// Options.Netns), for building other clients or a vipgate Kubernetes source.
func (s *Server) RESTConfig() *rest.Config { return rest.CopyConfig(s.restCfg) }

// userToken is the bearer token of user (one of Options.Users).
func (s *Server) userToken(user string) string {
	return s.Token + "-" + strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(user))), 36)
}

// RESTConfigAs is RESTConfig authenticated as user, one of Options.Users.
func (s *Server) RESTConfigAs(user string) *rest.Config {
	cfg := rest.CopyConfig(s.restCfg)
	cfg.BearerToken, cfg.BearerTokenFile = s.userToken(user), ""
	return cfg
}

// authorizationMode is AlwaysAllow, or RBAC with Options.RBAC.
func (s *Server) authorizationMode() string {
	if s.opts.RBAC {
		return "RBAC"
	}
	return "AlwaysAllow"
}

// startAPIServer starts kube-apiserver and waits for /readyz.
func (s *Server) startAPIServer() error {
	s.mu.Lock()
	s.starts++
	n := s.starts
	s.mu.Unlock()
	p, err := s.spawn(fmt.Sprintf("kube-apiserver-%d", n), s.apiBin,
		"--etcd-servers", s.etcdURL,
		"--bind-address", s.addr.String(),
		"--advertise-address", s.addr.String(),
		"--secure-port", strconv.Itoa(s.port),
		"--tls-cert-file", s.pki.ServingCert,
		"--tls-private-key-file", s.pki.ServingKey,
		"--cert-dir", filepath.Join(s.dir, "certs"),
		"--token-auth-file", filepath.Join(s.dir, "tokens.csv"),
		"--authorization-mode", s.authorizationMode(),
		"--service-cluster-ip-range", ServiceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", s.pki.ServiceAccountKey,
		"--service-account-signing-key-file", s.pki.ServiceAccountKey,
		// Two cores shared with the tests: skip what a test cluster does not need.
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// No controller would serve the "kubernetes" Service's endpoints, and in the root namespace
		// the advertise address is loopback, which the Endpoints validation refuses (noisy logs).
		"--endpoint-reconciler-type=none",
		"--v=1",
	)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.api = p
	s.mu.Unlock()
	err = s.waitFor(func(ctx context.Context) error {
		select {
		case <-p.done:
			return errStop{fmt.Errorf("kube-apiserver exited: %v", p.err)}
		default:
		}
		body, err := s.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, bytes.TrimSpace(body))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver: %w (log: %s)", err, p.logPath)
	}
	return nil
}

// errStop ends waitFor early.
type errStop struct{ error }

// waitFor retries f until it succeeds, returns errStop, or readyTimeout passes.
func (s *Server) waitFor(f func(ctx context.Context) error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) {
			return stop.error
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop stops kube-apiserver (not etcd, so the data stays): an API outage as clients see it. The
// server gets a second to go on its own; a graceful kube-apiserver shutdown waits for long-running
// watches and would take ten seconds or more for no benefit to the tests.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.api
	s.api = nil
	s.mu.Unlock()
	if p != nil {
		p.stop(time.Second)
	}
}

// Restart stops kube-apiserver if it runs and starts it again on the same address, port,
// certificates and etcd data; it returns once the server is ready.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	start := time.Now()
	if err := s.startAPIServer(); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
}

// Shutdown stops kube-apiserver and etcd (Start's t.Cleanup does it for tests).
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() {
		s.Stop()
		if s.etcd != nil {
			s.etcd.stop(10 * time.Second)
		}
	})
}

// dumpLogs prints the end of both logs, for a failed test.
func (s *Server) dumpLogs() {
	for _, name := range []string{"etcd.log", fmt.Sprintf("kube-apiserver-%d.log", s.starts)} {
		b, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		s.logf("--- last lines of %s:\n%s", name, strings.Join(lines, "\n"))
	}
}

// proc is one background process.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// spawner forks every child from one OS thread that never exits. Pdeathsig fires when the thread
// that forked the child dies, not the process, and the Go runtime may retire threads.
var spawner = sync.OnceValue(func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked
		for f := range ch {
			f()
		}
	}()
	return ch
})

// spawn starts bin with args (inside the server's namespace, if any), logging to <dir>/<name>.log.
// The process gets SIGKILL if the test process dies.
func (s *Server) spawn(name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(s.dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log for %s: %w", name, err)
	}
	defer logFile.Close()
	argv := append([]string{bin}, args...)
	if s.opts.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", s.opts.Netns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	spawner() <- func() { started <- cmd.Start() }
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM to the process group, waits up to grace, then kills it.
func (p *proc) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}
