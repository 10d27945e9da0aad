package cluster

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// simulateCoalescer runs the coalescer on a virtual clock the way KubeSource.Run drives it: events at
// the given offsets (ms, ascending), a timer that fires at its deadline unless re-armed first, and it
// returns the offsets (ms) at which snapshots were taken, each with the newest event it includes.
func simulateCoalescer(quiet, debounce, maxDelay int, events []int) [][2]int {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	t0 := time.Unix(1000, 0)
	c := coalescer{quiet: ms(quiet), debounce: ms(debounce), maxDelay: ms(maxDelay)}
	var (
		out      [][2]int
		deadline = -1 // timer off
		newest   = -1 // newest event seen
	)
	take := func(at int) {
		c.taken()
		out = append(out, [2]int{at, newest})
	}
	for _, e := range events {
		if deadline >= 0 && deadline <= e {
			take(deadline)
			deadline = -1
		}
		newest = e
		if d := c.event(t0.Add(ms(e))); d > 0 {
			deadline = e + int(d/time.Millisecond)
		} else {
			deadline = -1
			take(e)
		}
	}
	if deadline >= 0 {
		take(deadline)
	}
	return out
}

func TestCoalescer(t *testing.T) {
	burst := func(from, every, n int) []int {
		var out []int
		for i := range n {
			out = append(out, from+i*every)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		events []int
		want   [][2]int // snapshot at, newest event included
	}{
		{name: "a lone change is taken at once", events: []int{0}, want: [][2]int{{0, 0}}},
		{name: "lone changes further apart than the quiet period are each taken at once",
			events: []int{0, 50, 200, 1000}, want: [][2]int{{0, 0}, {50, 50}, {200, 200}, {1000, 1000}}},
		{name: "a Service update with its EndpointSlice updates: the first at once, the rest coalesced",
			events: []int{0, 2, 3, 5}, want: [][2]int{{0, 0}, {55, 5}}},
		{name: "the next lone change after a burst has gone quiet is taken at once again",
			events: []int{0, 10, 20, 300}, want: [][2]int{{0, 0}, {70, 20}, {300, 300}}},
		{name: "a change just inside the quiet period waits for the debounce",
			events: []int{0, 49}, want: [][2]int{{0, 0}, {99, 49}}},
		{name: "a continuous stream is cut at the maximum delay, and nothing is lost",
			events: burst(0, 10, 120), // 0..1190 ms, a change every 10 ms
			want:   [][2]int{{0, 0}, {510, 500}, {1010, 1000}, {1240, 1190}}},
		{name: "a change during a pending burst joins it instead of being taken at once",
			events: []int{0, 40, 60}, want: [][2]int{{0, 0}, {110, 60}}},
		{name: "quiet is counted from the newest change, not from the last snapshot",
			events: []int{0, 40, 95}, want: [][2]int{{0, 0}, {90, 40}, {95, 95}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := simulateCoalescer(50, 50, 500, tc.events)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("snapshots (-want +got):\n%s", diff)
			}
			// Nothing lost: the last snapshot includes the last change.
			if last := got[len(got)-1]; last[1] != tc.events[len(tc.events)-1] {
				t.Errorf("the last snapshot holds the change at %d ms, not the last one at %d ms", last[1], tc.events[len(tc.events)-1])
			}
		})
	}
}

// TestCoalescerDefaults runs the source's own tunables (kubeQuiet, kubeDebounce, kubeMaxDelay) on
// the cases they were chosen for: a lone change at once, a Service update with its EndpointSlice
// updates in two snapshots, and a rolling update of a change every millisecond (issue #19's churn)
// cut into snapshots no change waits longer than kubeMaxDelay for.
func TestCoalescerDefaults(t *testing.T) {
	ms := func(d time.Duration) int { return int(d / time.Millisecond) }
	quiet, debounce, maxDelay := ms(kubeQuiet), ms(kubeDebounce), ms(kubeMaxDelay)
	if maxDelay < debounce || debounce < 1 || quiet < debounce {
		t.Fatalf("tunables out of order: quiet %d ms, debounce %d ms, max delay %d ms", quiet, debounce, maxDelay)
	}

	if got := simulateCoalescer(quiet, debounce, maxDelay, []int{0}); !cmp.Equal(got, [][2]int{{0, 0}}) {
		t.Errorf("a lone change: snapshots %v, want one at once", got)
	}
	burst := []int{0, 1, 2, 4}
	if got, want := simulateCoalescer(quiet, debounce, maxDelay, burst), [][2]int{{0, 0}, {4 + debounce, 4}}; !cmp.Equal(got, want) {
		t.Errorf("a Service update with its EndpointSlices: snapshots %v, want %v", got, want)
	}

	var stream []int
	for e := range 1000 {
		stream = append(stream, e)
	}
	got := simulateCoalescer(quiet, debounce, maxDelay, stream)
	// Each event is in the first snapshot taken at or after it; none waits longer than maxDelay.
	next, worst := 0, 0
	for _, e := range stream {
		for got[next][1] < e {
			next++
		}
		worst = max(worst, got[next][0]-e)
	}
	if worst > maxDelay {
		t.Errorf("under a stream a change waited %d ms for its snapshot, more than the max delay %d ms", worst, maxDelay)
	}
	// And the stream is still coalesced: about one snapshot per maxDelay, not one per change.
	if n, most := len(got), 1000/maxDelay+2; n > most {
		t.Errorf("a change every ms for 1 s took %d snapshots, want at most %d", n, most)
	}
}
