package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// restarts is how many times TestRestartKeepsFlows restarts vipgate node.
const restarts = 10

// TestRestartKeepsFlows: stopping and starting `vipgate node` must not break traffic. The first sync
// of a restarted vipgate adopts the table the previous run left and reconciles it in place, so 100
// long-lived TCP connections through a ClusterIP, a NodePort and a LoadBalancer IP (held by the client
// and a pod) survive 10 restarts, and a steady stream of new connections keeps being answered.
func TestRestartKeepsFlows(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"r1", "r2"}},
		{Name: "node2", Pods: []string{"r3"}},
	}})
	bin := vipgateBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	r1, r2, r3 := l.Pod("r1"), l.Pod("r2"), l.Pod("r3")
	w := &ndWriter{t: t, dir: manifests}
	w.write("svc.yaml",
		ndService("rs", "LoadBalancer", "10.96.2.1", "Cluster", []ndPort{{"http", "TCP", 80, 30100, "http"}}, ndStatus("203.0.113.30")),
		ndSlice("rs", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(r1, "node1"), ndEp(r2, "node1"), ndEp(r3, "node2")))
	node1 := l.Node("node1")
	cfg := filepath.Join(dir, "node1.yaml")
	if err := os.WriteFile(cfg, []byte(ndNodeConfig(node1, "zone-a")), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(i int) *lab.Proc {
		p, err := l.Start("node1", filepath.Join(dir, "vipgate-"+itoa(i)+".log"), bin, "node", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	proc := start(0)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- vipgate on node1:\n%s", proc.Tail(30))
		}
	})
	for _, p := range []string{"10.96.0.0/16", "203.0.113.0/24"} {
		if err := l.AddRoute(netip.MustParsePrefix(p), "node1"); err != nil {
			t.Fatal(err)
		}
	}
	targets := []struct{ from, addr string }{
		{"client", "10.96.2.1:80"},
		{"client", node1.IPv4.String() + ":30100"},
		{"client", "203.0.113.30:80"},
		{"r2", "10.96.2.1:80"}, // a pod on node1, the node that runs vipgate here
	}
	for _, tg := range targets {
		ndWait(t, l, tg.from, "tcp", tg.addr, func(r lab.ProbeResult) bool { return r.OK() })
	}

	// 100 long-lived connections, 25 per target, held for the whole test.
	holdFor := 35 * time.Second
	var holds []*lab.Hold
	for _, tg := range targets {
		h, err := l.StartHold(tg.from, tg.addr, 25, holdFor)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.WaitOpened(10 * time.Second); err != nil {
			t.Fatalf("opening held connections to %s: %v\n%s", tg.addr, err, h.Proc.Log())
		}
		holds = append(holds, h)
	}

	// A steady stream of new connections while vipgate restarts.
	var wg sync.WaitGroup
	streams := make([]lab.ProbeSummary, len(targets))
	for i, tg := range targets {
		wg.Add(1)
		go func(i int, from, addr string) {
			defer wg.Done()
			s, err := l.ProbeMany(from, "tcp", addr, 400, 50*time.Millisecond)
			if err != nil {
				t.Error(err)
			}
			streams[i] = s
		}(i, tg.from, tg.addr)
	}

	for i := 1; i <= restarts; i++ {
		time.Sleep(1500 * time.Millisecond)
		if err := proc.Stop(); err != nil {
			t.Logf("stopping vipgate (restart %d): %v", i, err)
		}
		proc = start(i)
		// Wait until the new process has synced (it logs the adoption or the replacement).
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(proc.Log(), "synced") {
			if time.Now().After(deadline) {
				t.Fatalf("restart %d never synced:\n%s", i, proc.Tail(20))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(proc.Log(), "adopted=true") {
			t.Errorf("restart %d did not adopt the live table:\n%s", i, proc.Tail(10))
		}
	}
	wg.Wait()

	newFailed, newSent := 0, 0
	for i, s := range streams {
		newFailed += s.Lost
		newSent += s.Sent
		t.Logf("new connections to %s from %s during %d restarts: %d sent, %d answered", targets[i].addr, targets[i].from, restarts, s.Sent, s.OK)
	}
	ctx, cancel := context.WithTimeout(context.Background(), holdFor+30*time.Second)
	defer cancel()
	broken, opened := 0, 0
	for i, h := range holds {
		r, err := h.Wait(ctx)
		if err != nil {
			t.Fatalf("held connections to %s: %v", targets[i].addr, err)
		}
		opened += r.Opened
		broken += r.Broken
	}
	t.Logf("restart safety: %d restarts; %d of %d established connections broken; %d of %d new connections failed",
		restarts, broken, opened, newFailed, newSent)
	if broken != 0 {
		t.Errorf("%d established connections broke while vipgate restarted", broken)
	}
	if newFailed != 0 {
		t.Errorf("%d new connections failed while vipgate restarted (target 0)", newFailed)
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
