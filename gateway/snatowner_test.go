package gateway

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The SNAT addresses of a pair, gw1 (this gateway) and gw2.
var (
	snatGw1  = netip.MustParseAddr("198.51.100.11")
	snatGw2  = netip.MustParseAddr("198.51.100.12")
	snatPair = map[string][]netip.Addr{"gw1": {snatGw1}, "gw2": {snatGw2}}
	snatT0   = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
)

const testResync = 5 * time.Second

// step is one poll of a table test: at snatT0+at, the membership says total and alive; the
// decision must own want, send the table to returned and reannounce or not.
type step struct {
	what       string
	at         time.Duration
	total      int
	alive      map[string]bool
	want       []netip.Addr
	returned   []string
	reannounce bool
	set        bool
}

func runSteps(t *testing.T, o *SNATOwners, steps []step) {
	t.Helper()
	for _, s := range steps {
		d := o.Step(snatT0.Add(s.at), s.total, s.alive)
		if !slices.Equal(d.Owned, s.want) || !slices.Equal(d.Returned, s.returned) || d.Reannounce != s.reannounce || d.Set != s.set {
			t.Errorf("%s: owned %v, returned %v, reannounce %v, set %v; want %v, %v, %v, %v",
				s.what, d.Owned, d.Returned, d.Reannounce, d.Set, s.want, s.returned, s.reannounce, s.set)
		}
		if d.Changed && !d.Set {
			t.Errorf("%s: a changed set not handed to the announcer", s.what)
		}
	}
}

// TestSNATOwnersNoEvidence: a gateway that starts and has not heard its peer yet takes nothing
// over before SNATSettle (the view fills in member by member), then takes the silent peer's
// address over.
func TestSNATOwnersNoEvidence(t *testing.T) {
	o := NewSNATOwners("gw1", snatPair, testResync, snatT0)
	runSteps(t, o, []step{
		{what: "start, the peer unknown", total: 2, alive: map[string]bool{"gw1": true}, want: []netip.Addr{snatGw1}, set: true},
		{what: "the peer heard dead, never seen alive", at: time.Second, total: 2, alive: map[string]bool{"gw1": true, "gw2": false}, want: []netip.Addr{snatGw1}},
		{what: "just before SNATSettle", at: SNATSettle, total: 2, alive: map[string]bool{"gw1": true, "gw2": false}, want: []netip.Addr{snatGw1}},
		{what: "SNATSettle passed", at: SNATSettle + SNATOwnerPoll, total: 2, alive: map[string]bool{"gw1": true, "gw2": false},
			want: []netip.Addr{snatGw1, snatGw2}, set: true},
	})
}

// TestSNATOwnersPeerDeathAndReturn: a peer seen alive gets the conntrack table (it joined), its
// death makes this gateway answer for its address at the next poll, and its return gives the
// address back, sends it the table again and announces this gateway's own addresses again.
func TestSNATOwnersPeerDeathAndReturn(t *testing.T) {
	o := NewSNATOwners("gw1", snatPair, testResync, snatT0)
	both := map[string]bool{"gw1": true, "gw2": true}
	alone := map[string]bool{"gw1": true, "gw2": false}
	runSteps(t, o, []step{
		// The first poll: prevAlive is empty, so no re-announcement (nothing was cut off).
		{what: "both alive at start", total: 2, alive: both, want: []netip.Addr{snatGw1}, returned: []string{"gw2"}, set: true},
		{what: "both alive", at: SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw1}},
		{what: "gw2 dead", at: 2 * SNATOwnerPoll, total: 2, alive: alone, want: []netip.Addr{snatGw1, snatGw2}, set: true},
		{what: "gw2 still dead", at: 3 * SNATOwnerPoll, total: 2, alive: alone, want: []netip.Addr{snatGw1, snatGw2}},
		{what: "gw2 back", at: 4 * SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw1}, returned: []string{"gw2"}, reannounce: true, set: true},
		{what: "gw2 stays", at: 5 * SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw1}},
	})
	// The peer's view of the same events: gw1 (not it) died and came back.
	p := NewSNATOwners("gw2", snatPair, testResync, snatT0)
	runSteps(t, p, []step{
		{what: "gw2: both alive", total: 2, alive: both, want: []netip.Addr{snatGw2}, returned: []string{"gw1"}, set: true},
		{what: "gw2: gw1 dead", at: SNATOwnerPoll, total: 2, alive: map[string]bool{"gw1": false, "gw2": true}, want: []netip.Addr{snatGw1, snatGw2}, set: true},
		{what: "gw2: gw1 back", at: 2 * SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw2}, returned: []string{"gw1"}, reannounce: true, set: true},
	})
}

// TestSNATOwnersSingle: a gateway alone in its membership (total 1), or without one (L2 refused:
// total 0), answers for its own addresses only, even long after SNATSettle, and sends no table.
func TestSNATOwnersSingle(t *testing.T) {
	for _, total := range []int{0, 1} {
		o := NewSNATOwners("gw1", snatPair, testResync, snatT0)
		var alive map[string]bool
		if total == 1 {
			alive = map[string]bool{"gw1": true}
		}
		runSteps(t, o, []step{
			{what: "start", total: total, alive: alive, want: []netip.Addr{snatGw1}, set: true},
			{what: "after SNATSettle", at: 2 * SNATSettle, total: total, alive: alive, want: []netip.Addr{snatGw1}, set: true /* resync */},
		})
	}
	// A gateway with no SNAT address of its own owns nothing, and still sends the table to a
	// peer that joins (conntrack sync without snatAddresses).
	o := NewSNATOwners("gw1", nil, testResync, snatT0)
	runSteps(t, o, []step{
		{what: "no SNAT addresses", total: 2, alive: map[string]bool{"gw1": true, "gw2": true}, returned: []string{"gw2"}, set: true},
	})
}

// TestSNATOwnersResync: the owned set goes to the announcer again once resync has passed without
// a change (a failed interface is retried), and at once when it changes.
func TestSNATOwnersResync(t *testing.T) {
	o := NewSNATOwners("gw1", snatPair, testResync, snatT0)
	both := map[string]bool{"gw1": true, "gw2": true}
	runSteps(t, o, []step{
		{what: "first", total: 2, alive: both, want: []netip.Addr{snatGw1}, returned: []string{"gw2"}, set: true},
		{what: "within resync", at: testResync / 2, total: 2, alive: both, want: []netip.Addr{snatGw1}},
		{what: "at resync", at: testResync, total: 2, alive: both, want: []netip.Addr{snatGw1}},
		{what: "past resync", at: testResync + SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw1}, set: true},
		{what: "just after", at: testResync + 2*SNATOwnerPoll, total: 2, alive: both, want: []netip.Addr{snatGw1}},
		{what: "a change within resync", at: testResync + 3*SNATOwnerPoll, total: 2, alive: map[string]bool{"gw1": true},
			want: []netip.Addr{snatGw1, snatGw2}, set: true},
	})
}

// fakePeers is a PeerView the test sets.
type fakePeers struct {
	mu    sync.Mutex
	total int
	alive map[string]bool
}

func (p *fakePeers) set(total int, alive map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total, p.alive = total, alive
}

func (p *fakePeers) View() (int, map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, p.alive
}

// fakeAnnouncer records what watchSNATOwners hands it.
type fakeAnnouncer struct {
	mu          sync.Mutex
	owned       map[netip.Addr][]string
	reannounced int
	closed      bool
}

func (a *fakeAnnouncer) SetOwned(m map[netip.Addr][]string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.owned = m
	return nil
}

func (a *fakeAnnouncer) Reannounce() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reannounced++
	return len(a.owned)
}

func (a *fakeAnnouncer) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return nil
}

// TestWatchSNATOwners: the loop carries the decisions out: the owned addresses, on the interface
// of their LAN, go to the announcer as the peer dies and returns, the return re-announces, and the
// announcer is closed when ctx ends.
func TestWatchSNATOwners(t *testing.T) {
	peers := &fakePeers{total: 2, alive: map[string]bool{"gw1": true, "gw2": true}}
	ann := &fakeAnnouncer{}
	ifaceOf := map[netip.Addr]string{snatGw1: "eth1", snatGw2: "eth1"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchSNATOwners(ctx, NewSNATOwners("gw1", snatPair, testResync, time.Now()),
			snatOwnership{log: hclog.NewNullLogger(), peers: peers, ann: ann, ifaceOf: ifaceOf})
	}()
	waitFor := func(what string, ok func(a *fakeAnnouncer) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ann.mu.Lock()
			got := ok(ann)
			owned := ann.owned
			ann.mu.Unlock()
			if got {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the announcer holds %v", what, owned)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ownsGw2 := func(a *fakeAnnouncer) bool { return a.owned[snatGw2] != nil }
	waitFor("start", func(a *fakeAnnouncer) bool {
		return a.owned != nil && slices.Equal(a.owned[snatGw1], []string{"eth1"}) && !ownsGw2(a)
	})
	peers.set(2, map[string]bool{"gw1": true, "gw2": false})
	waitFor("gw2 dead", func(a *fakeAnnouncer) bool { return slices.Equal(a.owned[snatGw2], []string{"eth1"}) })
	peers.set(2, map[string]bool{"gw1": true, "gw2": true})
	waitFor("gw2 back", func(a *fakeAnnouncer) bool { return !ownsGw2(a) && a.reannounced == 1 })
	cancel()
	<-done
	if !ann.closed {
		t.Error("the announcer is not closed once ctx ended")
	}
}
