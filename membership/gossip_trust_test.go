package membership

import (
	"testing"
	"time"
)

// forgeGossip is a vector that member from, holding the key, sends to member to: entries by member
// name (an age code, | gossipReady for ready), every other entry unknown. It is authenticated and
// fresh (it echoes to's latest counter): what a lying member can send.
func (l *wireLab) forgeGossip(from, to string, entries map[string]byte) dropReason {
	m := l.ms[to]
	m.mu.Lock()
	g := m.segs[0]
	echo, counter, unit := m.counter, m.byName[from].order.counter+1, g.gossip.p.Unit
	e := make([]byte, len(g.sorted))
	for i, n := range g.sorted {
		e[i] = gossipUnknown
		if v, ok := entries[n]; ok {
			e[i] = v
		}
	}
	m.mu.Unlock()
	gc := gossipChunk{name: from, ready: true, reply: true, counter: counter, echo: echo, digest: g.key, unit: unit,
		total: len(e), entries: e}
	b, err := appendGossip(nil, &gc)
	if err != nil {
		l.t.Fatal(err)
	}
	return m.handle(mac(testKeys[0], to, b, b), l.addrs[from][0], l.now)
}

// TestGossipRelayCannotRemoveLiveMember (issue 27): in gossip mode, n3 (holding the key) keeps
// telling n2 that n1 is not ready, with age 0, i.e. fresher than anything else n2 knows. Before, the
// fresher entry won with its readiness, so n2 dropped n1, which was still announcing: two owners
// for n1's VIPs. Now n1's own word, heard directly, beats what a relay says about it.
func TestGossipRelayCannotRemoveLiveMember(t *testing.T) {
	l := newWireLab(t, Options{DirectMembersLimit: -1}, "n1", "n2", "n3")
	if l.until(80, l.allHearAll) < 0 {
		t.Fatal("the members never heard each other")
	}
	lost := 0
	for i := range 80 { // 2 s
		if r := l.forgeGossip("n3", "n2", map[string]byte{"n1": 0, "n3": gossipReady}); r != acceptedReason {
			t.Fatalf("the lie was not even delivered: %q", r)
		}
		if !l.hears("n2", "n1") {
			lost++
			if lost == 1 {
				t.Errorf("tick %d: n2 dropped the live, ready n1 on n3's word", i)
			}
		}
		l.step()
	}
	if lost > 0 {
		t.Errorf("n2 did not count n1 as a candidate in %d of 80 ticks", lost)
	}
}

// TestGossipRelayCannotKeepDeadMemberAlive (issue 27): n1 dies; n3 (holding the key) keeps telling
// n2 that n1 is alive and ready, with age 0. Before, n2 kept n1 a candidate for as long as n3 said
// so: n1's VIPs were never taken over. Now relayed liveness ends tRelay after n1's own word, and n1
// is dropped within tRelay + Dead.
func TestGossipRelayCannotKeepDeadMemberAlive(t *testing.T) {
	l := newWireLab(t, Options{DirectMembersLimit: -1}, "n1", "n2", "n3")
	if l.until(80, l.allHearAll) < 0 {
		t.Fatal("the members never heard each other")
	}
	p := l.ms["n2"].segs[0].gossip.p
	l.cut = func(from, to string) bool { return from == "n1" || to == "n1" }
	died := l.now
	// Deadline: a bound, not a timing assertion (the old code never drops n1).
	limit := p.Relay + p.Dead + time.Second
	for l.hears("n2", "n1") {
		if l.now.Sub(died) > limit {
			t.Fatalf("n2 still counts the dead n1 %v after its death on n3's word (relay bound %v, dead %v)",
				l.now.Sub(died), p.Relay, p.Dead)
		}
		if r := l.forgeGossip("n3", "n2", map[string]byte{"n1": gossipReady, "n3": gossipReady}); r != acceptedReason {
			t.Fatalf("the lie was not even delivered: %q", r)
		}
		l.step()
	}
	t.Logf("n2 dropped the dead n1 %v after its death despite n3's relays (relay bound %v, dead %v)",
		l.now.Sub(died), p.Relay, p.Dead)
	// Without the lie n1 goes at Dead; with it, no later than its own word + Relay + Dead.
	if got := l.now.Sub(died); got > p.Relay+p.Dead+2*l.ms["n2"].tick() {
		t.Errorf("dropped after %v, more than relay bound %v + dead %v", got, p.Relay, p.Dead)
	}
}

// TestGossipOwnWord: the pure rules. A relayed entry, however fresh, does not change the readiness
// of a member heard directly within Stop, adds liveness only up to Relay after the member's own
// word, and never makes an entry older; the member's own word always applies.
func TestGossipOwnWord(t *testing.T) {
	p := gossipParams{Unit: time.Millisecond, Stop: 400 * time.Millisecond, Dead: 800 * time.Millisecond, Relay: 2 * time.Second}
	c := newGossipCore(3, 0, p, 0)
	ms := func(d int64) int64 { return d * int64(time.Millisecond) }
	c.heard(ms(1000), 1, true)
	c.merge(ms(1100), c.unit, 0, []byte{0, 0, 0}, 2) // n2 relays: n1 not ready, age 0
	if !c.ready[1] {
		t.Errorf("a relay made a member heard 100 ms ago unready")
	}
	if c.fresh[1] != ms(1100)-c.unit {
		t.Errorf("the relayed liveness was not taken: %v", c.fresh[1])
	}
	c.heard(ms(1200), 1, false)
	c.merge(ms(1300), c.unit, 0, []byte{0, gossipReady, 0}, 2)
	if c.ready[1] {
		t.Errorf("a relay made a member that said it is not ready ready")
	}
	c.heard(ms(1400), 1, true)
	if !c.ready[1] {
		t.Errorf("the member's own word did not apply")
	}
	// Past Stop without its word, relayed readiness applies again (as before).
	c.merge(ms(1900), c.unit, 0, []byte{0, 0, 0}, 2)
	if c.ready[1] {
		t.Errorf("relayed readiness never applies")
	}
	// Relayed liveness ends Relay after the own word (at 1.4 s - unit).
	for now := int64(ms(1900)); now < ms(6000); now += ms(25) {
		c.merge(now, c.unit, 0, []byte{0, gossipReady, 0}, 2)
	}
	if want := ms(1400) - c.unit + int64(p.Relay); c.fresh[1] != want {
		t.Errorf("relayed liveness reaches %v, want bounded at %v", time.Duration(c.fresh[1]), time.Duration(want))
	}
	// Relays never make an entry older.
	before := c.fresh[1]
	c.merge(ms(6000), c.unit, 0, []byte{0, 100, 0}, 2)
	if c.fresh[1] != before {
		t.Errorf("a relay aged an entry")
	}
}

// TestGossipPickCycle: pick visits every other member once per cycle.
func TestGossipPickCycle(t *testing.T) {
	for _, n := range []int{2, 3, 10, 97, 1000} {
		c := newGossipCore(n, n/2, gossipParams{}, 0)
		rnd := newGossipRand("x", uint64(n))
		for cycle := range 3 {
			seen := map[int]bool{}
			for range n - 1 {
				j := c.pick(nil, 1, rnd)[0]
				if j == c.self || seen[j] {
					t.Fatalf("n=%d cycle %d: picked %d twice or self", n, cycle, j)
				}
				seen[j] = true
			}
		}
	}
}
