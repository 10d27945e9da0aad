package testcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/test/lab"
)

// TestIngress: an Ingress controller (Traefik, manifests/ingress.yaml) gets its LoadBalancer IP
// from vipgate and the client outside the cluster reaches two backends through it, routed by host
// and by path: client -> LoadBalancer IP (vipgate, BGP) -> Traefik -> backend's cluster IP
// (vipgate) -> agnhost pod. An unknown host gets Traefik's 404.
func TestIngress(t *testing.T) {
	c := shared(t)
	// Without the image the pod would wait for a registry the lab cannot reach.
	if tar := filepath.Join(c.Spec.BinDir, "images", "traefik.tar"); !fileExists(tar) {
		t.Fatalf("%s is missing: build bin/traefik (test/ingress/go.mod) and run `make test-images`", tar)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	b, err := manifests.ReadFile("manifests/ingress.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifest := string(b)
	defer func() {
		if t.Failed() {
			ingressDiagnostics(t, c)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if out, err := c.Kubectl(dctx, manifest, "delete", "-f", "-", "--ignore-not-found", "--wait=false"); err != nil {
			t.Logf("deleting the ingress objects: %v\n%s", err, out)
		}
	}()

	created := time.Now()
	if _, err := c.Kubectl(ctx, manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}

	ip := waitService(t, ctx, c, "traefik", "traefik").Status.LoadBalancer.Ingress[0].IP
	assigned := time.Since(created)
	if !LoadBalancerPool.Contains(mustAddr(t, ip)) {
		t.Errorf("LoadBalancer IP %s is not from the pool %s", ip, LoadBalancerPool)
	}
	for _, d := range []struct{ ns, name string }{{"traefik", "traefik"}, {"ingress-demo", "app-a"}, {"ingress-demo", "app-b"}} {
		if _, err := c.Kubectl(ctx, "", "-n", d.ns, "rollout", "status", "deployment/"+d.name, "--timeout=3m"); err != nil {
			t.Fatal(err)
		}
	}
	ready := time.Since(created)

	// The first request through the whole chain. Traefik may still be loading the Ingresses, and
	// the route to the LoadBalancer IP may not be at the router yet.
	var first time.Duration
	if err := poll(ctx, 3*time.Minute, func(ctx context.Context) error {
		code, body, err := ingressGet(ctx, c, ip, "a.example.test", "/hostname")
		if err != nil {
			return err
		}
		if code != 200 || !strings.HasPrefix(body, "app-a-") {
			return fmt.Errorf("a.example.test/hostname: %d %q", code, body)
		}
		first = time.Since(created)
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		host, path string
		code       int
		// body is the expected answer's prefix (agnhost's /hostname answers the pod name).
		body string
	}{
		{"a.example.test", "/hostname", 200, "app-a-"},
		{"a.example.test", "/echo?msg=through-ingress", 200, "through-ingress"},
		{"b.example.test", "/b/hostname", 200, "app-b-"},
		{"b.example.test", "/b/echo?msg=stripped", 200, "stripped"},
		{"b.example.test", "/hostname", 200, "app-a-"},
		// Prefix /b matches per path element: /becho is app-a's (its catch-all "/" answers
		// "NOW: <time>"), not app-b's /echo after stripping /b.
		{"b.example.test", "/becho?msg=not-stripped", 200, "NOW: "},
		{"c.example.test", "/hostname", 404, ""},
		{"", "/hostname", 404, ""}, // Host: the IP itself
	}
	for _, tc := range cases {
		host := tc.host
		if host == "" {
			host = ip
		}
		// Bounded retries: Traefik applies the second Ingress (demo-b) on its own schedule.
		var code int
		var body string
		err := poll(ctx, time.Minute, func(ctx context.Context) error {
			var err error
			code, body, err = ingressGet(ctx, c, ip, host, tc.path)
			if err != nil {
				return err
			}
			if code != tc.code || !strings.HasPrefix(body, tc.body) {
				return fmt.Errorf("answer %d %q", code, body)
			}
			return nil
		})
		if err != nil {
			t.Errorf("Host %s, GET %s: want %d %q...: %v", host, tc.path, tc.code, tc.body, err)
			continue
		}
		t.Logf("Host %-15s GET %-28s -> %d %s", host, tc.path, code, strings.TrimSpace(body))
	}

	// publishedService: Traefik copies its LoadBalancer IP into the Ingresses' status.
	if err := poll(ctx, time.Minute, func(ctx context.Context) error {
		for _, name := range []string{"demo", "demo-b"} {
			ing, err := c.Client.NetworkingV1().Ingresses("ingress-demo").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if st := ing.Status.LoadBalancer.Ingress; len(st) == 0 || st[0].IP != ip {
				return fmt.Errorf("ingress %s status %+v, want IP %s", name, st, ip)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	t.Logf("Ingress via LoadBalancer %s: Service created -> IP assigned %.1f s, pods ready %.1f s, first answer from outside %.1f s",
		ip, assigned.Seconds(), ready.Seconds(), first.Seconds())
}

// ingressGet sends GET http://ip<path> with the given Host header from the client outside the
// cluster and returns the status code and the body.
func ingressGet(ctx context.Context, c *Cluster, ip, host, path string) (int, string, error) {
	out, err := c.Lab.ExecContext(ctx, lab.RoleClient, "curl", "-sS", "-m", "3",
		"-H", "Host: "+host, "-w", "\n%{http_code}", "http://"+ip+path)
	if err != nil {
		return 0, "", err
	}
	i := strings.LastIndexByte(out, '\n')
	code, err := strconv.Atoi(strings.TrimSpace(out[i+1:]))
	if i < 0 || err != nil {
		return 0, "", fmt.Errorf("curl output %q: no status code", out)
	}
	return code, out[:i], nil
}

// ingressDiagnostics logs what helps to tell a routing problem from a proxy problem.
func ingressDiagnostics(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods,svc,endpointslices", "-n", "traefik", "-o", "wide"},
		{"get", "pods,svc,endpointslices,ingress", "-n", "ingress-demo", "-o", "wide"},
		{"-n", "traefik", "logs", "deployment/traefik", "--tail=60"},
	} {
		out, err := c.Kubectl(ctx, "", args...)
		t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
	}
}
