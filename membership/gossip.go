package membership

import (
	"math"
	"time"
)

// Gossip mode: the membership of a segment larger than Options.DirectMembersLimit. Instead of
// every member heartbeating every other member each interval (N² datagrams), every member keeps an
// age vector over the segment's sorted members and, every round, sends it to a few members picked
// at random, who answer with theirs (push-pull; van Renesse, Minsky, Hayden 1998, with ages instead
// of counters, so the members' clocks need no synchronisation). README.md ("Scale") has the design,
// its safety argument and the measurements; gossipCore is its pure part (no I/O, no locks, no
// clock of its own), which the simulation instantiates thousands of times on a virtual clock.

// Entry encoding: one byte per member, bit 7 ready, bits 0-6 the age code, rounded up:
// codes 0-63 are 0-63 units, codes 64-126 are 64 units plus 8 units per step above 64 (up to
// 560 units), so young entries, the ones the decisions turn on, lose at most one unit to rounding
// per hop, and an age up to Dead still fits; gossipUnknown = nothing known or too old to say.
const (
	gossipReady   = 0x80
	gossipUnknown = 0x7f
	// gossipFine is the first code of the coarse range, gossipCoarse its step in units.
	gossipFine   = 64
	gossipCoarse = 8
	// gossipMaxUnits is the largest age an entry can carry, in units.
	gossipMaxUnits = gossipFine + (gossipUnknown-1-gossipFine)*gossipCoarse
)

// ageCode encodes an age of units (rounded up by the caller) as a code, rounding up.
func ageCode(units int64) byte {
	if units < gossipFine {
		return byte(units)
	}
	if units > gossipMaxUnits {
		return gossipUnknown
	}
	return byte(gossipFine + (units-gossipFine+gossipCoarse-1)/gossipCoarse)
}

// codeUnits is the age a code stands for, in units (the upper bound of its bucket).
func codeUnits(code byte) int64 {
	if code < gossipFine {
		return int64(code)
	}
	return gossipFine + int64(code-gossipFine)*gossipCoarse
}

// never is the freshness of a member nothing is known about.
const never = math.MinInt64

// gossipCore is one member's knowledge of a gossip segment: per member j, fresh[j] (this member's
// local monotonic time, in ns since an arbitrary origin, of the freshest proof of life of j it
// knows) and ready[j] (what that proof said). Everything is conservative: a merged entry is dated
// (age+1) units before its arrival, so information only ages as it travels, and a stale entry can
// never come back fresh.
//
// A member's own word beats what others relay about it (issue 27: a member holding the key could
// remove a live member, or keep a dead one alive, by relaying made-up entries about it). own[j] is
// when j itself was last heard (an authenticated datagram of j, received directly):
//
//   - while that is younger than tStop, j's readiness is what j said; a relayed entry, however
//     fresh it claims to be, adds liveness only (a relay cannot make a member it hears directly
//     unready, nor ready). A member whose readiness changes tells the members that hold its word
//     at once (gossipRound), so honest news is not held back;
//   - a relayed entry never dates j later than tRelay after j's own word (or after this core
//     started, while j has not been heard yet): relays add liveness bounded in time. Every member
//     contacts every other one at least once per cycle of rounds (pick walks a permutation), so
//     tRelay, two cycles and Dead, is never reached by a live member;
//   - relays never make an entry older (max), so a relay cannot declare anyone dead.
type gossipCore struct {
	self  int
	unit  int64 // ns per age unit
	tStop int64 // quorum counts members with age <= tStop
	tDead int64 // candidates are ready members with age < tDead
	// tRelay bounds relayed liveness after a member's own word; start is when the core started.
	tRelay, start int64
	fresh         []int64
	ready         []bool
	own           []int64
	// The state as of the last tick (or merge): live[j] = age <= tStop, cand[j] = ready and age <
	// tDead. nLive counts live members, self included. changed says the view must be recomputed.
	live, cand []bool
	nLive      int
	changed    bool
	// maxAge is the largest age of a live member seen by tick since the last reset (for the
	// simulation's report; cheap).
	maxAge int64
	// perm walks the other members in a random order, cycle after cycle (see pick).
	perm gossipPerm
}

// gossipParams are the timings of one gossip segment, derived from the options and its size.
type gossipParams struct {
	// Round is how often a member sends its vector; Fanout to how many members.
	Round  time.Duration
	Fanout int
	// Unit is the age unit of the entries; Stop and Dead the thresholds (see gossipCore).
	Unit, Stop, Dead time.Duration
	// Spread is the estimated largest age of a live member under normal gossip (A_max).
	Spread time.Duration
	// Relay bounds how long after a member's own word relayed entries keep it alive: two cycles
	// of rounds (every member contacts every other one once per cycle) plus Dead.
	Relay time.Duration
}

// gossipBudget is the traffic a member of a segment of n members may spend on gossip, in and out,
// in bytes per second: 2 Mbit/s, and at most 5 Gbit/s for the whole segment (1 Mbit/s per member
// at 5,000), less 10 % for the headers below UDP. The round is stretched until the vectors fit it.
func gossipBudget(n int) float64 { return min(2e6, 5e9/float64(n)) / 8 * 0.9 }

// deriveGossipParams picks the round, fanout, unit and thresholds of a segment of n members whose
// vector goes in chunks of at most perChunk entries (see README.md "Scale" for the derivation):
//
//   - Fanout F (Options.GossipFanout, default 1) and round R: R is a quarter of the
//     heartbeat interval (at least one tick), stretched (to a multiple of tick) until push-pull
//     traffic, about 4·F vectors per round in and out, fits gossipBudget. At equal traffic a
//     smaller fanout with shorter rounds spreads news faster (measured: README.md).
//   - Spread A (the largest age of a live member): push-pull with fanout F multiplies the members
//     that know a fresh entry by about 2F+1 per round, so it reaches everyone in about
//     log_{2F+1}(n) rounds; A = R·(⌈log_{2F+1} n⌉ + gossipSpreadRounds) plus one tick. The
//     simulation measures the real distribution against it (README.md).
//   - Stop = max(DeadAfter, A + R): a member stops (loses its quorum) when a majority is older.
//   - Dead = Stop + A + R + 2 ticks: a member cut off stops Stop after the last datagram it
//     received; the others' freshest news of it is at most A old at the cut (and its last datagram
//     out is at most one round older than its last one in), so they drop it after it stopped.
//   - Unit: Dead fits in gossipMaxUnits-8 units (rounded up to 100 µs), so every entry that
//     matters can be relayed.
func deriveGossipParams(opts Options, tick time.Duration, n, perChunk, nameLen int) gossipParams {
	f := opts.GossipFanout
	if f <= 0 {
		f = DefaultGossipFanout
	}
	f = min(f, max(1, n-1))
	// gossipSpreadRounds is the rounds beyond ⌈log_{2F+1} n⌉ the slowest news takes (the tail of
	// the epidemic plus the rounding of the ages), fitted with margin to the simulation.
	const gossipSpreadRounds = 6
	chunks := max(1, (n+perChunk-1)/perChunk)
	vector := n + chunks*(gossipFixed+nameLen+28) // + IP and UDP headers
	r := max(opts.HeartbeatInterval/4, tick)
	need := time.Duration(float64(4*f*vector) / gossipBudget(n) * float64(time.Second))
	if need > r {
		r = (need + tick - 1) / tick * tick
	}
	rounds := 1
	for k, g := 1, 2*f+1; k < n; k *= g {
		rounds++
	}
	spread := time.Duration(rounds+gossipSpreadRounds)*r + tick
	stop := max(opts.DeadAfter, spread+r)
	dead := stop + spread + r + 2*tick
	unit := (dead/(gossipMaxUnits-8) + 100*time.Microsecond - 1) / (100 * time.Microsecond) * (100 * time.Microsecond)
	cycle := time.Duration((n-1+f-1)/f) * r
	return gossipParams{Round: r, Fanout: f, Unit: unit, Stop: stop, Dead: dead, Spread: spread, Relay: 2*cycle + dead}
}

// newGossipCore makes the knowledge of member self of a segment of n members, started at start;
// nothing is known of the others yet.
func newGossipCore(n, self int, p gossipParams, start int64) *gossipCore {
	c := &gossipCore{self: self, unit: int64(p.Unit), tStop: int64(p.Stop), tDead: int64(p.Dead),
		tRelay: int64(p.Relay), start: start,
		fresh: make([]int64, n), ready: make([]bool, n), own: make([]int64, n), live: make([]bool, n), cand: make([]bool, n), changed: true}
	for j := range c.fresh {
		c.fresh[j], c.own[j] = never, never
	}
	return c
}

// setSelf records this member's own state (its entry always has age 0).
func (c *gossipCore) setSelf(now int64, ready bool) {
	c.fresh[c.self] = now
	if c.ready[c.self] != ready {
		c.ready[c.self] = ready
		c.changed = true
	}
}

// ageUnits is j's age in units, rounded up; gossipUnknown when unknown or too old to carry.
func (c *gossipCore) ageUnits(now int64, j int) byte {
	f := c.fresh[j]
	if f == never {
		return gossipUnknown
	}
	a := now - f
	if a <= 0 {
		return 0
	}
	return ageCode((a + c.unit - 1) / c.unit)
}

// encode appends the entries [off, off+count) as of now (the caller refreshed its own entry).
func (c *gossipCore) encode(now int64, b []byte, off, count int) []byte {
	for j := off; j < off+count; j++ {
		e := c.ageUnits(now, j)
		if c.ready[j] && e != gossipUnknown {
			e |= gossipReady
		}
		b = append(b, e)
	}
	return b
}

// merge takes the entries [off, off+len(entries)) of a vector relayed by member sender (its own
// entry is skipped: heard records it), written with the given unit (ns), received at now:
// fresh[j] = max(fresh[j], now - (age+1)·unit), bounded by j's own word (see gossipCore), and
// readiness comes with the entry that wins unless j's own word is recent. Our own entry is ours
// alone. It marks the view for recomputation only when a member becomes live or a candidate, or
// its readiness changes (O(entries), no allocation).
func (c *gossipCore) merge(now int64, unit int64, off int, entries []byte, sender int) {
	for i, e := range entries {
		if off+i != sender {
			c.mergeOne(now, unit, off+i, e)
		}
	}
}

// mergeOne merges one relayed entry into member j's (see merge).
func (c *gossipCore) mergeOne(now int64, unit int64, j int, e byte) {
	code := e & gossipUnknown
	if code == gossipUnknown || j == c.self || j < 0 || j >= len(c.fresh) {
		return
	}
	f := now - (codeUnits(code)+1)*unit
	if limit := max(c.own[j], c.start) + c.tRelay; f > limit {
		f = limit
	}
	if f <= c.fresh[j] {
		return
	}
	r := e&gossipReady != 0
	if c.own[j] != never && now-c.own[j] < c.tStop {
		r = c.ready[j] // j's own word stands
	}
	c.set(now, j, f, r)
}

// set dates j's freshest proof of life at f (not older than what we have), saying ready.
func (c *gossipCore) set(now int64, j int, f int64, r bool) {
	c.fresh[j] = max(c.fresh[j], f)
	if r != c.ready[j] {
		c.ready[j] = r
		c.changed = true
	}
	f = c.fresh[j]
	if !c.live[j] && now-f <= c.tStop || !c.cand[j] && r && now-f < c.tDead {
		c.changed = true
	}
}

// heard records a datagram of member j itself (authenticated, received directly): a proof of life
// at now - unit, as an entry of age 0 would be, and j's readiness, whatever relays said.
func (c *gossipCore) heard(now int64, j int, ready bool) {
	if j == c.self || j < 0 || j >= len(c.fresh) {
		return
	}
	f := now - c.unit
	c.own[j] = max(c.own[j], f)
	c.set(now, j, f, ready)
}

// tick recomputes live and cand, O(members); it reports whether the view changed since the last
// call (a member crossed a threshold, a readiness changed, or a merge said so).
func (c *gossipCore) tick(now int64) bool {
	nLive := 0
	for j, f := range c.fresh {
		age := now - f
		if f == never {
			age = math.MaxInt64
		}
		live := age <= c.tStop || j == c.self
		cand := c.ready[j] && age < c.tDead
		if live {
			nLive++
			if age > c.maxAge && j != c.self {
				c.maxAge = age
			}
		}
		if live != c.live[j] || cand != c.cand[j] {
			c.live[j], c.cand[j] = live, cand
			c.changed = true
		}
	}
	c.nLive = nLive
	ch := c.changed
	c.changed = false
	return ch
}

// pick fills out with up to k distinct members other than self, with rnd a source of random
// numbers (a *rand.Rand in production, seeded per member). The members come in a random order that
// visits every one once per cycle (SWIM's round-robin over a shuffled list), so every member hears
// from every other one directly at least once per cycle: what bounds relayed liveness (tRelay).
func (c *gossipCore) pick(out []int, k int, rnd func(n int) int) []int {
	out = out[:0]
	n := len(c.fresh)
	if n <= 1 {
		return out
	}
	k = min(k, n-1)
	for len(out) < k {
		j := c.perm.next(n-1, rnd)
		if j >= c.self {
			j++
		}
		dup := false
		for _, o := range out {
			dup = dup || o == j
		}
		if !dup {
			out = append(out, j)
		}
	}
	return out
}

// gossipPerm walks 0..m-1 in the order (a·i + b) mod m, a coprime with m, with a and b drawn anew
// every cycle: a random cyclic order in O(1) memory (5,000 simulated members keep one each).
type gossipPerm struct{ m, a, b, i int }

func (p *gossipPerm) next(m int, rnd func(n int) int) int {
	if p.m != m || p.i >= m {
		p.m, p.i, p.b = m, 0, rnd(m)
		p.a = 1
		for range 64 {
			if a := 1 + rnd(m); gcd(a, m) == 1 {
				p.a = a
				break
			}
		}
	}
	j := (p.a*p.i + p.b) % m
	p.i++
	return j
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
