package dataplane

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// The runner's tests run on a fake clock: nothing waits for real time except the hang guard of srRecv,
// and no assertion is about how long anything took.

// srFakeClock is a runnerClock whose time moves only by Advance. Every timer the runner arms is
// reported on armed (its duration), so a test sees what the runner waits for.
type srFakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*srFakeTimer
	armed  chan time.Duration
}

type srFakeTimer struct {
	at      time.Time
	c       chan time.Time
	stopped bool
}

func newSRFakeClock() *srFakeClock {
	return &srFakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), armed: make(chan time.Duration, 100)}
}

func (c *srFakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *srFakeClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &srFakeTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.armed <- d
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// Advance moves the clock and fires the timers that are due.
func (c *srFakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.c <- c.now
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
}

// srRecv receives from ch; the timeout only turns a hang (a runner that never syncs) into a failure.
func srRecv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// srNone asserts that ch holds nothing right now.
func srNone[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %v", what, v)
	default:
	}
}

// srCall is one call of the fake sync: the state, and where the test sends the sync's result.
type srCall struct {
	st     *cluster.State
	result chan error
}

// srHarness is a runner over a fake sync that blocks until the test answers each call.
type srHarness struct {
	r        *SyncRunner[int]
	clock    *srFakeClock
	calls    chan srCall
	synced   chan *cluster.State // AfterSync, in order
	attempts chan error          // Attempted
	done     chan error          // Run's result
	cancel   context.CancelFunc
}

func newSRHarness(t *testing.T) *srHarness {
	t.Helper()
	h := &srHarness{
		clock:    newSRFakeClock(),
		calls:    make(chan srCall),
		synced:   make(chan *cluster.State, 100),
		attempts: make(chan error, 100),
		done:     make(chan error, 1),
	}
	n := 0
	h.r = NewSyncRunner(nil, SyncRunnerOptions[int]{
		Name: "test sync",
		Sync: func(ctx context.Context, st *cluster.State) (int, error) {
			c := srCall{st: st, result: make(chan error)}
			h.calls <- c
			n++
			return n, <-c.result
		},
		Attempted: func(_ *cluster.State, _ int, err error) { h.attempts <- err },
		AfterSync: []func(*cluster.State, int){
			func(st *cluster.State, _ int) { h.synced <- st },
		},
	})
	h.r.clock = h.clock
	h.r.random = func() float64 { return 0.5 } // no jitter: the delays are exact
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		srRecv(t, h.done, "return from Run")
	})
	return h
}

// sync waits for the next sync call, checks its state and answers it with err.
func (h *srHarness) sync(t *testing.T, want *cluster.State, err error) {
	t.Helper()
	c := srRecv(t, h.calls, "sync")
	if c.st != want {
		t.Fatalf("synced state %p, want %p", c.st, want)
	}
	c.result <- err
	if got := srRecv(t, h.attempts, "Attempted"); !errors.Is(got, err) {
		t.Fatalf("Attempted got %v, want %v", got, err)
	}
	if err == nil {
		if got := srRecv(t, h.synced, "AfterSync"); got != want {
			t.Fatalf("AfterSync state %p, want %p", got, want)
		}
	}
}

func srState() *cluster.State { return &cluster.State{} }

// TestSyncRunnerLeadingEdge: the first state after a quiet period is synced at once, without arming a
// timer (no debounce in the runner; the sources coalesce).
func TestSyncRunnerLeadingEdge(t *testing.T) {
	h := newSRHarness(t)
	s1 := srState()
	h.r.Submit(s1)
	h.sync(t, s1, nil)
	srNone(t, h.clock.armed, "timer before the first sync")

	// Quiet again: the next state goes straight through too.
	s2 := srState()
	h.r.Submit(s2)
	h.sync(t, s2, nil)
	srNone(t, h.clock.armed, "timer")
}

// TestSyncRunnerNewestWins: states submitted while a sync runs collapse into the newest one.
func TestSyncRunnerNewestWins(t *testing.T) {
	h := newSRHarness(t)
	s1, s2, s3, s4 := srState(), srState(), srState(), srState()
	h.r.Submit(s1)
	c := srRecv(t, h.calls, "sync of s1") // s1's sync is running
	h.r.Submit(s2)
	h.r.Submit(s3)
	h.r.Submit(s4)
	c.result <- nil
	srRecv(t, h.attempts, "Attempted")
	srRecv(t, h.synced, "AfterSync")
	h.sync(t, s4, nil) // s2 and s3 are never synced
	srNone(t, h.calls, "sync")
}

// TestSyncRunnerBackoff: failures are retried with the same state after a doubling delay, capped, and
// a success starts over at the initial delay.
func TestSyncRunnerBackoff(t *testing.T) {
	h := newSRHarness(t)
	boom := errors.New("boom")
	s1 := srState()
	h.r.Submit(s1)
	var delays []time.Duration
	for range 12 {
		h.sync(t, s1, boom)
		d := srRecv(t, h.clock.armed, "retry timer")
		delays = append(delays, d)
		srNone(t, h.calls, "sync before the retry is due")
		h.clock.Advance(d)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 12800 * time.Millisecond,
		25600 * time.Millisecond, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if !slices.Equal(delays, want) {
		t.Errorf("retry delays %v, want %v", delays, want)
	}
	h.sync(t, s1, nil)

	// After the success, the next failure waits the initial delay again.
	s2 := srState()
	h.r.Submit(s2)
	h.sync(t, s2, boom)
	if d := srRecv(t, h.clock.armed, "retry timer"); d != 100*time.Millisecond {
		t.Errorf("delay after a success and a failure = %v, want 100ms", d)
	}
}

// TestSyncRunnerNewStateDuringRetry: a new state does not wait for the retry of a failed one.
func TestSyncRunnerNewStateDuringRetry(t *testing.T) {
	h := newSRHarness(t)
	s1, s2 := srState(), srState()
	h.r.Submit(s1)
	h.sync(t, s1, errors.New("boom"))
	srRecv(t, h.clock.armed, "retry timer")
	h.r.Submit(s2)
	h.sync(t, s2, nil)
	// The retry of s1 is void: s2 is synced, nothing is pending.
	h.clock.Advance(time.Minute)
	srNone(t, h.calls, "sync")
}

// TestSyncRunnerResync: Resync and ResyncAt sync the latest state again; before any state they do
// nothing.
func TestSyncRunnerResync(t *testing.T) {
	h := newSRHarness(t)
	h.r.Resync()
	srNone(t, h.calls, "sync without a state")

	s1 := srState()
	h.r.Submit(s1)
	h.sync(t, s1, nil)
	h.r.Resync()
	h.sync(t, s1, nil)

	h.r.ResyncAt(h.clock.Now().Add(5 * time.Second))
	if d := srRecv(t, h.clock.armed, "resync timer"); d != 5*time.Second {
		t.Errorf("resync timer %v, want 5s", d)
	}
	srNone(t, h.calls, "sync before the resync time")
	h.clock.Advance(5 * time.Second)
	h.sync(t, s1, nil)
}

// TestSyncRunnerAfterSyncMaySchedule: a post-sync hook may call ResyncAt (the gateway's drain
// deadline) without deadlocking.
func TestSyncRunnerAfterSyncMaySchedule(t *testing.T) {
	clock := newSRFakeClock()
	calls := make(chan *cluster.State, 10)
	var r *SyncRunner[struct{}]
	r = NewSyncRunner(nil, SyncRunnerOptions[struct{}]{
		Sync: func(_ context.Context, st *cluster.State) (struct{}, error) {
			calls <- st
			return struct{}{}, nil
		},
		AfterSync: []func(*cluster.State, struct{}){
			func(*cluster.State, struct{}) { r.ResyncAt(clock.Now().Add(time.Second)) },
		},
	})
	r.clock = clock
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	s := srState()
	r.Submit(s)
	srRecv(t, calls, "first sync")
	srRecv(t, clock.armed, "resync timer")
	clock.Advance(time.Second)
	if got := srRecv(t, calls, "resync"); got != s {
		t.Errorf("resynced %p, want %p", got, s)
	}
	cancel()
	if err := srRecv(t, done, "return from Run"); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
}

// TestSyncRunnerStops: Run returns when its context is done, idle or waiting for a retry.
func TestSyncRunnerStops(t *testing.T) {
	h := newSRHarness(t)
	s1 := srState()
	h.r.Submit(s1)
	h.sync(t, s1, errors.New("boom"))
	srRecv(t, h.clock.armed, "retry timer")
	h.cancel()
	if err := srRecv(t, h.done, "return from Run"); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	h.done <- nil // for the cleanup
}

func TestBackoffDelay(t *testing.T) {
	b := DefaultSyncBackoff
	for failures, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 9: 25600 * time.Millisecond, 10: 30 * time.Second, 1000: 30 * time.Second} {
		if got := b.Delay(failures, func() float64 { return 0.5 }); got != want {
			t.Errorf("Delay(%d) = %v, want %v", failures, got, want)
		}
	}
	// Jitter moves a delay by at most ±20 %, and never beyond Max.
	if got := b.Delay(1, func() float64 { return 0 }); got != 80*time.Millisecond {
		t.Errorf("Delay(1) with the lowest jitter = %v, want 80ms", got)
	}
	if got := b.Delay(1, func() float64 { return 0.999999 }); got < 119*time.Millisecond || got > 120*time.Millisecond {
		t.Errorf("Delay(1) with the highest jitter = %v, want about 120ms", got)
	}
	if got := b.Delay(1000, func() float64 { return 0.999999 }); got != 30*time.Second {
		t.Errorf("Delay(1000) with the highest jitter = %v, want 30s (capped)", got)
	}
	if got := b.Delay(1000, func() float64 { return 0 }); got != 24*time.Second {
		t.Errorf("Delay(1000) with the lowest jitter = %v, want 24s", got)
	}
}
