package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/tools/cache"
)

// cacheSyncWarnEvery is how often a wait for informer caches warns while they have not synced; a
// variable so that tests can shorten it.
var cacheSyncWarnEvery = 30 * time.Second

// cacheSyncPoll is how often the caches are asked whether they have synced (cache.WaitForCacheSync
// asks as often).
const cacheSyncPoll = 100 * time.Millisecond

// cacheSyncWait is a wait for informer caches to sync that is not silent. Caches that never sync
// (the RBAC does not allow listing a kind, the API server cannot be reached) would otherwise leave a
// node that waits forever without a word: as kube-proxy does, it warns every cacheSyncWarnEvery and
// keeps waiting, and Warning says so for /status. The zero value is ready to use.
type cacheSyncWait struct {
	mu sync.Mutex
	// since is when the wait began (zero: none under way), lastWarn when it last warned (or began);
	// warned says it has lasted long enough to warn about.
	since, lastWarn time.Time
	warned          bool
	what            string
}

// begin starts a wait for what ("the Kubernetes API caches") now, unless one is under way: a caller
// with work before the caches (discovery) begins early, so that the wait counts from there.
func (w *cacheSyncWait) begin(what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since.IsZero() {
		now := time.Now()
		w.since, w.lastWarn, w.warned, w.what = now, now, false, what
	}
}

// end ends the wait under way, if any.
func (w *cacheSyncWait) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since, w.warned = time.Time{}, false
}

// overdue says whether the wait under way is due a warning (cacheSyncWarnEvery since it began or
// last warned), and how long it has lasted; a true answer counts as the warning.
func (w *cacheSyncWait) overdue() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.since.IsZero() || now.Sub(w.lastWarn) < cacheSyncWarnEvery {
		return 0, false
	}
	w.lastWarn, w.warned = now, true
	return now.Sub(w.since).Round(time.Second), true
}

// wait waits until every synced reports true (true) or ctx ends (false), warning in log while it
// lasts. It begins the wait (named what) unless one is under way, and ends it.
func (w *cacheSyncWait) wait(ctx context.Context, log hclog.Logger, what string, synced ...cache.InformerSynced) bool {
	w.begin(what)
	defer w.end()
	poll := time.NewTicker(cacheSyncPoll)
	defer poll.Stop()
	for {
		if allSynced(synced) {
			return true
		}
		if waited, ok := w.overdue(); ok {
			log.Warn(w.what+" have not synced yet; still waiting (can the API server be reached, does the RBAC allow list and watch?)", "waited", waited)
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
}

func allSynced(synced []cache.InformerSynced) bool {
	for _, s := range synced {
		if !s() {
			return false
		}
	}
	return true
}

// Warning says, once a wait under way has warned, what has not synced for how long; "" otherwise.
func (w *cacheSyncWait) Warning() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.warned {
		return ""
	}
	return fmt.Sprintf("%s have not synced after %s: still waiting (can the API server be reached, does the RBAC allow list and watch?)",
		w.what, time.Since(w.since).Round(time.Second))
}
