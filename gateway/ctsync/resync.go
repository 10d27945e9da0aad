package ctsync

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A gateway that (re)starts has an empty conntrack table until its conntrackd has the peer's
// (StartupResync, and vipgate's full-table answer on the peer: Supervisor.answerResyncs). A flow
// the router moves to it before then meets no state: its replies are dropped by the guard
// (ProgramSNAT) and its client's packets start a new NAT binding, so the flow pauses or breaks.
// So the gateway joins the announcing only once that resync is over (Supervisor.Resynced, Hold).
//
// conntrackd says nothing when a resync is over: the peer sends its entries like any update, with
// no end marker. The supervisor reads conntrackd's counters (`conntrackd -s`) instead: the resync
// is over when the peer has been heard and its entries have stopped pouring in. A peer that is
// never heard (down, or the sync link is) ends the wait early: there is no table to wait for, and
// the gateway may be the only one left. A deadline bounds it all: a broken peer never keeps the
// gateway out of the router for long.

// ResyncWait bounds the wait for the initial resync.
type ResyncWait struct {
	// Deadline ends the wait whatever conntrackd says, counted from the supervisor's start.
	Deadline time.Duration
	// PeerSilence ends it when no sync message came from the peer in that long: the peer sends
	// one at least every second (FTFW's alive messages) and answers a resync request at once.
	PeerSilence time.Duration
	// MinWait is the least wait once the peer is heard: it answers the request from conntrackd's
	// cache at once, and vipgate on the peer follows with the whole kernel table (SendTable) once it
	// has read the request in conntrackd's log (100 ms polls) and had the table read.
	MinWait time.Duration
	// Quiet: the entries have stopped pouring in when, for this long, each poll saw no more than a
	// trickle of them (a sixteenth of the busiest poll's, and never less than trickleFloor): a busy
	// peer replicates its new flows all the time, which must not hold the gateway until the
	// deadline — nor may a small table's light churn (a peak of 10 makes a sixteenth 0, and every
	// new flow would restart the quiet).
	Quiet time.Duration
	// Poll is how often conntrackd's counters are read.
	Poll time.Duration
}

// DefaultResyncWait is the wait the gateway uses: at most 10 s; 3 s without a word from the peer;
// done 0.5 s after the peer's entries stopped, 1 s after it was heard at the earliest.
var DefaultResyncWait = ResyncWait{Deadline: 10 * time.Second, PeerSilence: 3 * time.Second, MinWait: time.Second,
	Quiet: 500 * time.Millisecond, Poll: 100 * time.Millisecond}

// trickleFloor is the most entries per poll that still count as a trickle (see ResyncWait.Quiet): a
// few new flows a second on the peer.
const trickleFloor = 8

// ResyncOutcome is how the wait for the initial resync ended.
type ResyncOutcome string

const (
	// ResyncWaiting: not over yet.
	ResyncWaiting ResyncOutcome = ""
	// ResyncDone: the peer was heard and its entries stopped arriving.
	ResyncDone ResyncOutcome = "done"
	// ResyncNoPeer: nothing came from the peer within PeerSilence.
	ResyncNoPeer ResyncOutcome = "no word from the peer"
	// ResyncDeadline: the deadline passed first.
	ResyncDeadline ResyncOutcome = "deadline passed"
	// ResyncStopped: the supervisor stopped first.
	ResyncStopped ResyncOutcome = "stopped"
)

// resyncSample is one reading of conntrackd's counters.
type resyncSample struct {
	// at is the time since the wait began.
	at time.Duration
	// received counts the sync packets received from the peer.
	received uint64
	// injected counts the kernel table changes the peer's messages made (created, updated and
	// destroyed entries, failed attempts included: an entry that exists already is news too).
	injected uint64
}

// resyncTracker decides, from successive samples, whether the initial resync is over. Pure: the
// supervisor feeds it, tests too.
type resyncTracker struct {
	w ResyncWait
	// heard is when the peer was first heard (-1: not yet).
	heard time.Duration
	// lastBurst is when a poll last saw more than a trickle of entries.
	lastBurst time.Duration
	prev      uint64
	peak      uint64
}

func newResyncTracker(w ResyncWait) *resyncTracker {
	return &resyncTracker{w: w, heard: -1}
}

// add takes a sample (ok: conntrackd answered; a failed reading only advances the clock) and says
// whether the wait is over, and how.
func (r *resyncTracker) add(s resyncSample, ok bool) ResyncOutcome {
	if ok {
		if r.heard < 0 && s.received > 0 {
			r.heard, r.lastBurst = s.at, s.at
		}
		inc := s.injected - r.prev
		if s.injected < r.prev {
			inc = s.injected // conntrackd restarted: its counters did too
		}
		r.prev = s.injected
		r.peak = max(r.peak, inc)
		if inc > max(r.peak/16, trickleFloor) {
			r.lastBurst = s.at
		}
	}
	switch {
	case r.heard >= 0 && s.at-r.heard >= r.w.MinWait && s.at-r.lastBurst >= r.w.Quiet:
		return ResyncDone
	case s.at >= r.w.Deadline:
		return ResyncDeadline
	case r.heard < 0 && s.at >= r.w.PeerSilence:
		return ResyncNoPeer
	}
	return ResyncWaiting
}

// parseStats reads the counters the tracker needs from `conntrackd -s`: the packets of the sync
// channel's "Pckts recv" and the "external inject" section's entries, ok and failed.
func parseStats(out string) (received, injected uint64, err error) {
	var haveRecv, haveInject bool
	section := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(strings.TrimSpace(line), ":") {
			section = strings.TrimSpace(line)
			continue
		}
		f := strings.Fields(line)
		switch {
		case strings.HasSuffix(strings.TrimSpace(line), "Pckts recv") && len(f) >= 4 && f[1] == "Pckts" && f[2] == "sent":
			// "  2 Pckts sent   2 Pckts recv"
			n, err := strconv.ParseUint(f[3], 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("conntrackd -s: %q: %w", line, err)
			}
			received, haveRecv = received+n, true
		case section == "external inject:" && strings.HasPrefix(line, "connections ") && len(f) == 5 && f[3] == "failed:":
			// "connections created:   2	failed:   0"
			for _, v := range []string{f[2], f[4]} {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("conntrackd -s: %q: %w", line, err)
				}
				injected += n
			}
			haveInject = true
		}
	}
	if !haveRecv || !haveInject {
		return 0, 0, fmt.Errorf("conntrackd -s: no sync channel traffic or external inject counters in %q", out)
	}
	return received, injected, nil
}

// watchResync reads conntrackd's counters every w.Poll from start on until the tracker says the
// initial resync is over or ctx ends, and records the outcome (Resynced).
func (s *Supervisor) watchResync(ctx context.Context, start time.Time) {
	w := s.wait
	tr := newResyncTracker(w)
	conf := PathsOf(s.cfg.Dir).Config
	t := time.NewTicker(w.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.endResync(ResyncStopped, time.Since(start))
			return
		case <-t.C:
		}
		var sample resyncSample
		ok := false
		if s.Status().Up {
			cctx, cancel := context.WithTimeout(ctx, w.Poll*5)
			out, err := exec.CommandContext(cctx, s.bin, "-C", conf, "-s").Output()
			cancel()
			if err == nil {
				sample.received, sample.injected, err = parseStats(string(out))
			}
			ok = err == nil
		}
		sample.at = time.Since(start)
		if o := tr.add(sample, ok); o != ResyncWaiting {
			s.endResync(o, sample.at)
			return
		}
	}
}

// endResync records the outcome of the initial resync, once, and closes Resynced.
func (s *Supervisor) endResync(o ResyncOutcome, after time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status.Resync != ResyncWaiting {
		return
	}
	s.status.Resync, s.status.ResyncAfter = o, after
	// Logged first: whatever the release sets off comes after the line.
	if o != ResyncStopped {
		s.log.Info("conntrack sync: initial resync over", "outcome", string(o), "after", after.Round(time.Millisecond))
	}
	close(s.resynced)
}

// Resynced is closed once the initial resync of the supervisor's first conntrackd is over (done,
// no word from the peer, deadline passed, or stopped: Status().Resync says which). Later restarts
// of conntrackd do not reopen it: the kernel table survives them.
func (s *Supervisor) Resynced() <-chan struct{} { return s.resynced }

// Hold keeps back the values handed to Put until it is released, then hands on the last one kept
// and passes the later ones straight through, in order. A gateway's speaker state goes through
// one: the gateway takes no part in announcing its VIPs (BGP routes, L2 votes) before its
// conntrack table has arrived (Supervisor.Resynced).
type Hold[T any] struct {
	mu       sync.Mutex
	released bool
	last     T
	has      bool
	out      func(T)
}

// NewHold returns a Hold that hands values to out and is released when release is closed (never,
// if ctx ends first). out is called with the Hold's lock held: one call at a time.
func NewHold[T any](ctx context.Context, release <-chan struct{}, out func(T)) *Hold[T] {
	h := &Hold[T]{out: out}
	go func() {
		select {
		case <-release:
		case <-ctx.Done():
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.released = true
		if h.has {
			var zero T
			v := h.last
			h.last, h.has = zero, false
			h.out(v)
		}
	}()
	return h
}

// Put hands v on, or keeps it (replacing the one kept) until the Hold is released.
func (h *Hold[T]) Put(v T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		h.out(v)
		return
	}
	h.last, h.has = v, true
}

// Held says whether the Hold still keeps values back.
func (h *Hold[T]) Held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.released
}
