package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/rest"
)

// TestCacheSyncWaitWarns: caches that do not sync are not waited for in silence: the wait warns in
// the log and in Warning while it lasts, ends when they sync, and then Warning is empty again.
func TestCacheSyncWaitWarns(t *testing.T) {
	prev := cacheSyncWarnEvery
	t.Cleanup(func() { cacheSyncWarnEvery = prev })
	cacheSyncWarnEvery = 20 * time.Millisecond

	var logs syncBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	var synced atomic.Bool
	var w cacheSyncWait
	done := make(chan bool)
	go func() {
		done <- w.wait(context.Background(), log, "the test caches", synced.Load, func() bool { return true })
	}()

	deadline := time.Now().Add(time.Minute)
	for w.Warning() == "" || !strings.Contains(logs.String(), "the test caches have not synced yet; still waiting") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning while the caches do not sync: status %q, log:\n%s", w.Warning(), logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := w.Warning(); !strings.HasPrefix(got, "the test caches have not synced after ") {
		t.Errorf("Warning() = %q", got)
	}
	synced.Store(true)
	if !<-done {
		t.Fatal("wait returned false once the caches synced")
	}
	if got := w.Warning(); got != "" {
		t.Errorf("Warning() after the sync = %q", got)
	}
}

// TestCacheSyncWaitCancel: a wait for caches that never sync ends with its context, false.
func TestCacheSyncWaitCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var w cacheSyncWait
	if w.wait(ctx, hclog.NewNullLogger(), "the test caches", func() bool { return false }) {
		t.Error("wait returned true for caches that never synced")
	}
	if got := w.Warning(); got != "" {
		t.Errorf("Warning() after the wait ended = %q", got)
	}
}

// TestKubeSourceWarnsWhileUnsynced: a Kubernetes source whose API server never answers usefully
// (503 to everything) emits nothing, and says so: a warning in the log and in Warnings (for
// /status) while it waits, none once Run has ended.
func TestKubeSourceWarnsWhileUnsynced(t *testing.T) {
	prevWarn, prevRetry := cacheSyncWarnEvery, kubeDiscoveryRetry
	t.Cleanup(func() { cacheSyncWarnEvery, kubeDiscoveryRetry = prevWarn, prevRetry })
	cacheSyncWarnEvery, kubeDiscoveryRetry = 20*time.Millisecond, 10*time.Millisecond

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var logs syncBuffer
	src := NewKubeSource(&rest.Config{Host: srv.URL}, "node1", hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(*State) { t.Error("a State without a complete listing") })
	}()
	deadline := time.Now().Add(time.Minute)
	for len(src.Warnings()) == 0 || !strings.Contains(logs.String(), "still cannot reach the Kubernetes API server") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no warning while unsynced: Warnings %q, log:\n%s", src.Warnings(), logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w := src.Warnings(); !strings.HasPrefix(w[0], "the Kubernetes API caches have not synced after ") {
		t.Errorf("Warnings() = %q", w)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if w := src.Warnings(); len(w) != 0 {
		t.Errorf("Warnings() after Run = %q", w)
	}
}
