package cluster

import "time"

// coalescer decides when a source builds its next snapshot after a change, in the manner of a
// leading-edge debounce: the first change after the source has been quiet for at least quiet is
// taken at once, because a lone API write (an EndpointSlice created, a pod gone ready) should reach
// the kernel as fast as the snapshot and the sync allow; changes that follow it closely are a burst
// (a Service update and its EndpointSlice updates, a rolling Deployment) and are coalesced: the
// snapshot waits until the burst has been quiet for debounce, but never longer than maxDelay after
// the first change it holds. The snapshot is always built from the informers' caches when it is
// taken, so the newest state wins and no change is lost: a change that arrives while one is pending
// is simply part of that snapshot.
//
// It is pure: the caller passes the time and arms its own timer, so the tests run on a virtual
// clock.
type coalescer struct {
	quiet, debounce, maxDelay time.Duration

	lastEvent  time.Time // the newest change seen (zero: none yet)
	firstEvent time.Time // the oldest change the pending snapshot holds
	pending    bool      // changes are waiting for the timer
}

// event records a change at now and says when the snapshot should be taken: a delay of 0 means
// now (the caller then calls taken); otherwise the caller (re)arms its timer with the delay and
// calls taken when it fires.
func (c *coalescer) event(now time.Time) time.Duration {
	quietSince := c.lastEvent
	c.lastEvent = now
	if !c.pending && (quietSince.IsZero() || now.Sub(quietSince) >= c.quiet) {
		return 0
	}
	if !c.pending {
		c.pending = true
		c.firstEvent = now
	}
	return min(c.debounce, max(0, c.maxDelay-now.Sub(c.firstEvent)))
}

// taken records that the snapshot was built (at once, or when the timer fired).
func (c *coalescer) taken() {
	c.pending = false
}
