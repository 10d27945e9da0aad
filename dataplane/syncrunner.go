package dataplane

// The sync loop `vipgate node` and `vipgate gateway` share: take the newest desired state, program
// it, retry with backoff when that fails, run the post-sync steps when it succeeds.

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

// Backoff is the delay between retries of a failed sync: Initial after the first failure, doubling
// (Factor) after each further one up to Max, each delay moved by a random ±Jitter fraction so that
// nodes failing together (an API outage, a kernel upgrade) do not retry in lockstep. A success starts
// over at Initial.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	Factor  float64
	Jitter  float64
}

// DefaultSyncBackoff is the SyncRunner's default: 100 ms, doubling to 30 s, ±20 %.
var DefaultSyncBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Factor: 2, Jitter: 0.2}

// Delay returns the delay after the failures-th consecutive failure (1 for the first). random returns
// a number in [0, 1) (rand.Float64); 0.5 means no jitter. The result never exceeds Max.
func (b Backoff) Delay(failures int, random func() float64) time.Duration {
	d := float64(b.Initial)
	for i := 1; i < failures && d < float64(b.Max); i++ {
		d *= max(b.Factor, 1)
	}
	d = min(d, float64(b.Max))
	if b.Jitter > 0 && random != nil {
		d *= 1 + b.Jitter*(2*random()-1)
	}
	return time.Duration(min(max(d, 0), float64(b.Max)))
}

// SyncRunnerOptions configures a SyncRunner. Sync is required.
type SyncRunnerOptions[R any] struct {
	// Name names the loop in log lines ("sync", "gateway sync").
	Name string
	// Sync programs st. It is called from Run's goroutine only, one call at a time, so it may keep
	// state between calls without locking.
	Sync func(ctx context.Context, st *cluster.State) (R, error)
	// Attempted is called after every Sync, failed or not (e.g. to record it for /status).
	Attempted func(st *cluster.State, rep R, err error)
	// AfterSync are called in order after every successful Sync, from Run's goroutine. They may call
	// the runner's Submit, Resync and ResyncAt.
	AfterSync []func(st *cluster.State, rep R)
	// Backoff is the retry delay after failures (zero: DefaultSyncBackoff).
	Backoff Backoff
}

// SyncRunner runs a dataplane's sync loop. A new state (Submit) is synced at once when the runner is
// idle: the sources already coalesce bursts of changes (cluster's coalescer, a leading-edge debounce),
// so the runner adds no delay of its own to the first change after a quiet period. States submitted
// while a sync runs are coalesced: only the newest is synced next, the others are never synced. A
// failed sync is retried with the same (or a newer) state after Backoff; a new state or a Resync
// does not wait for the retry. Run returns when its context is done.
type SyncRunner[R any] struct {
	opts   SyncRunnerOptions[R]
	log    hclog.Logger
	clock  runnerClock
	random func() float64

	// wake has room for one token: Submit, Resync and ResyncAt leave one so that Run re-evaluates.
	wake chan struct{}

	mu sync.Mutex
	// latest is the newest submitted state (nil before the first Submit). It stays after a successful
	// sync, for Resync.
	latest *cluster.State
	// now is set when latest must be synced without waiting for a retry: a new state, a Resync, or
	// the ResyncAt time reached.
	now bool
	// resyncAt is when to sync latest again (zero: no such request).
	resyncAt time.Time
}

// runnerClock is the runner's view of time; tests replace it.
type runnerClock interface {
	Now() time.Time
	// NewTimer returns a channel that receives once d has passed, and a function that stops it.
	NewTimer(d time.Duration) (<-chan time.Time, func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// NewSyncRunner returns a runner for opts; Run starts it.
func NewSyncRunner[R any](logger hclog.Logger, opts SyncRunnerOptions[R]) *SyncRunner[R] {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if opts.Name == "" {
		opts.Name = "sync"
	}
	// Each unset field takes the default, so a partly set Backoff never retries without a delay.
	b, d := &opts.Backoff, DefaultSyncBackoff
	if b.Initial <= 0 {
		b.Initial = d.Initial
	}
	if b.Max <= 0 {
		b.Max = max(d.Max, b.Initial)
	}
	b.Max = max(b.Max, b.Initial)
	if b.Factor < 1 {
		b.Factor = d.Factor
	}
	if b.Jitter <= 0 || b.Jitter >= 1 {
		b.Jitter = d.Jitter
	}
	return &SyncRunner[R]{
		opts:   opts,
		log:    logger,
		clock:  realClock{},
		random: rand.Float64,
		wake:   make(chan struct{}, 1),
	}
}

// Submit hands the runner a new desired state. It never blocks: the state replaces any state not yet
// synced. It may be called from any goroutine.
func (r *SyncRunner[R]) Submit(st *cluster.State) {
	r.mu.Lock()
	r.latest, r.now = st, true
	r.mu.Unlock()
	r.poke()
}

// Resync asks for the latest state to be synced again (something the sync reads besides the state
// changed, such as the gateway's health checks). Before the first Submit it does nothing.
func (r *SyncRunner[R]) Resync() {
	r.mu.Lock()
	r.now = true
	r.mu.Unlock()
	r.poke()
}

// ResyncAt asks for the latest state to be synced again at t (a drain deadline), replacing an
// earlier ResyncAt request.
func (r *SyncRunner[R]) ResyncAt(t time.Time) {
	r.mu.Lock()
	r.resyncAt = t
	r.mu.Unlock()
	r.poke()
}

func (r *SyncRunner[R]) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run syncs until ctx is done, then returns ctx's error. Call it once.
func (r *SyncRunner[R]) Run(ctx context.Context) error {
	var (
		failures int       // consecutive failed syncs
		retryAt  time.Time // when to retry the failed sync (zero: none failed)
		// The one timer, armed for timerAt (zero: not armed); it is only re-armed when the time
		// it must fire at changes.
		timerC    <-chan time.Time
		stopTimer = func() bool { return false }
		timerAt   time.Time
	)
	defer func() { stopTimer() }()
	for {
		r.mu.Lock()
		now := r.clock.Now()
		if !r.resyncAt.IsZero() && !now.Before(r.resyncAt) {
			r.now, r.resyncAt = true, time.Time{}
		}
		st := r.latest
		due := st != nil && (r.now || (!retryAt.IsZero() && !now.Before(retryAt)))
		if due {
			r.now = false
		}
		// The earliest time the loop must look again without being poked.
		next := retryAt
		if !r.resyncAt.IsZero() && (next.IsZero() || r.resyncAt.Before(next)) {
			next = r.resyncAt
		}
		r.mu.Unlock()

		if !due {
			if !next.Equal(timerAt) {
				stopTimer()
				timerC, timerAt = nil, next
				if !next.IsZero() {
					timerC, stopTimer = r.clock.NewTimer(next.Sub(now))
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.wake:
			case <-timerC:
				timerC, timerAt = nil, time.Time{}
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}

		rep, err := r.opts.Sync(ctx, st)
		if err != nil && ctx.Err() != nil {
			return ctx.Err() // a sync cut short by shutdown is not a failure to retry or report
		}
		if r.opts.Attempted != nil {
			r.opts.Attempted(st, rep, err)
		}
		if err != nil {
			failures++
			d := r.opts.Backoff.Delay(failures, r.random)
			retryAt = r.clock.Now().Add(d)
			r.log.Error(r.opts.Name+" failed, retrying", "in", d, "failures", failures, "err", err)
			continue
		}
		failures, retryAt = 0, time.Time{}
		for _, f := range r.opts.AfterSync {
			f(st, rep)
		}
	}
}

// ConntrackCleanup is the conntrack step after a sync, the same for a node and a gateway: delete the
// entries the sync made stale, and after a full sync reconcile the whole table against the state. A
// nil Cleaner (conntrack unavailable) does nothing.
type ConntrackCleanup struct {
	Cleaner conntrack.Cleaner
	Log     hclog.Logger
}

// Reconcile removes the UDP/SCTP entries to Service ports of st whose reply source is no longer an
// endpoint, keeping every flow that is still right. Call it after a full sync (a start or a recovery),
// when no previous view tells what changed. It does nothing unless the Cleaner is a
// conntrack.Reconciler.
func (c ConntrackCleanup) Reconcile(st *cluster.State) {
	r, ok := c.Cleaner.(conntrack.Reconciler)
	if !ok {
		return
	}
	if n, err := r.Reconcile(ConntrackView(st)); err != nil {
		c.logger().Warn("conntrack reconcile", "err", err)
	} else if n > 0 {
		c.logger().Info("deleted stale conntrack entries", "count", n)
	}
}

// Delete removes the entries matching flows (a sync report's StaleFlows).
func (c ConntrackCleanup) Delete(flows []conntrack.StaleFlow) {
	if c.Cleaner == nil || len(flows) == 0 {
		return
	}
	if n, err := c.Cleaner.Delete(flows); err != nil {
		c.logger().Warn("conntrack cleanup", "err", err)
	} else if n > 0 {
		c.logger().Debug("deleted stale conntrack entries", "count", n)
	}
}

func (c ConntrackCleanup) logger() hclog.Logger {
	if c.Log == nil {
		return hclog.NewNullLogger()
	}
	return c.Log
}

// SyncReport tells the caller what a sync did and what follows from it.
type SyncReport struct {
	Duration time.Duration
	Full     bool
	Txs      []*Tx
	// StaleFlows are conntrack entries to delete (UDP/SCTP endpoints that went away, entries that
	// gained their first endpoint).
	StaleFlows []conntrack.StaleFlow
	// HealthChecks is the healthCheckNodePort of every eTP=Local Service, and LocalEndpoints their local
	// ready endpoint counts (both complete, not just the changes).
	HealthChecks   map[cluster.ServiceKey]uint16
	LocalEndpoints map[cluster.ServiceKey]int
	// Adopted says the first sync reconciled the live table in place instead of replacing it.
	Adopted bool
	// Conflicts lists, complete and sorted, the entries of Services that are not programmed because
	// another Service holds them (claims.go) and the external and LoadBalancer IPs the node's policy
	// refuses (AddressScreen).
	Conflicts []cluster.Rejection
}
