package testcluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// EnvClusterTests enables the tests that build a real cluster (make test sets it; they need root,
// the binaries of `make cluster-deps`, and a few minutes).
const EnvClusterTests = "VIPGATE_CLUSTER_TESTS"

// CIFocus is the upstream e2e selection `make test` runs: every [Conformance] Services test plus
// the Services tests of LoadBalancer, externalTrafficPolicy, internalTrafficPolicy, session
// affinity, terminating endpoints and the three that found vipgate bugs. `make conformance` runs
// them all, and against kube-proxy too.
const CIFocus = `\[sig-network\] Services .*(\[Conformance\]|LoadBalancer|[Ee]xternal[Tt]raffic[Pp]olicy|` +
	`internalTrafficPolicy|[Aa]ffinity|terminating|headless|service-proxy-name|named targetPorts|health check node port)`

// CISkip leaves out what this cluster cannot do or what tests another proxy ([Disruptive]: the
// kube-proxy restart test restarts kube-proxy pods; the API server here is not a pod).
const CISkip = `\[Disruptive\]`

var (
	sharedOnce    sync.Once
	sharedCluster *Cluster
	sharedErr     error
)

// shared returns the package's cluster, built on first use and closed by TestMain. Tests that
// break it (node death) build their own.
func shared(t *testing.T) *Cluster {
	t.Helper()
	if os.Getenv(EnvClusterTests) == "" {
		t.Skipf("set %s=1 to build a real cluster (make test does)", EnvClusterTests)
	}
	lab.SkipUnlessRoot(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		sharedCluster, sharedErr = Up(ctx, Spec{Nodes: 2, CNI: specCNI(), Logf: logf})
	})
	if sharedErr != nil {
		t.Fatalf("cluster: %v", sharedErr)
	}
	return sharedCluster
}

func logf(format string, a ...any) {
	fmt.Printf("%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedCluster != nil {
		if err := sharedCluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the cluster:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestLoadBalancerFromOutside: a LoadBalancer Service created with kubectl, the real controllers'
// EndpointSlices, vipgate's IP from the MetalLB pool, BGP to the router, answered for a client
// outside the cluster.
func TestLoadBalancerFromOutside(t *testing.T) {
	c := shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := "lb-outside"
	if _, err := c.Kubectl(ctx, "", "create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	defer c.Kubectl(context.Background(), "", "delete", "namespace", ns, "--wait=false")
	if _, err := c.Kubectl(ctx, "", "-n", ns, "create", "deployment", "web", "--replicas=2",
		"--image=registry.k8s.io/e2e-test-images/agnhost:2.63.0", "--", "/agnhost", "netexec", "--http-port=8080"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl(ctx, "", "-n", ns, "rollout", "status", "deployment/web", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if _, err := c.Kubectl(ctx, "", "-n", ns, "expose", "deployment", "web", "--type=LoadBalancer", "--port=80", "--target-port=8080"); err != nil {
		t.Fatal(err)
	}
	ip := waitService(t, ctx, c, ns, "web").Status.LoadBalancer.Ingress[0].IP
	if !LoadBalancerPool.Contains(mustAddr(t, ip)) {
		t.Errorf("LoadBalancer IP %s is not from the pool %s", ip, LoadBalancerPool)
	}
	pods := map[string]bool{}
	var first time.Duration
	if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		out, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "2", "http://"+ip+"/hostname")
		if err != nil {
			return err
		}
		if first == 0 {
			first = time.Since(created)
		}
		pods[strings.TrimSpace(out)] = true
		if len(pods) < 2 {
			return fmt.Errorf("answered by %v so far", pods)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("LoadBalancer %s answered the outside client %.2f s after kubectl expose; both pods answer: %v", ip, first.Seconds(), pods)
}

// TestConformanceSubset runs CIFocus of the upstream e2e suite against vipgate: every selected test
// must pass (they all pass with kube-proxy in the same cluster; see docs/conformance.md).
func TestConformanceSubset(t *testing.T) {
	c := shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	dir := filepath.Join(c.Dir, "e2e-ci")
	logFile, err := os.Create(filepath.Join(c.Dir, "e2e-ci.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	start := time.Now()
	res, err := c.RunE2E(ctx, E2EOptions{Focus: CIFocus, Skip: CISkip, ReportDir: dir, Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	tot := Totals(res)
	t.Logf("upstream e2e (%s) in %.0f s: %s", CIFocus, time.Since(start).Seconds(), tot)
	for _, r := range res {
		if r.State == E2EFailed {
			t.Errorf("FAILED %s: %s", r.Name, r.Message)
		}
	}
	if tot.Passed == 0 {
		b, _ := os.ReadFile(logFile.Name())
		t.Errorf("no test passed; e2e.test output:\n%s", tail(string(b), 60))
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("bad address %q: %v", s, err)
	}
	return a
}
