package membership

import (
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"
)

// gossipState is a segment's gossip mode inside Members: the pure core, its timings, and who we
// sent to this round (push-pull answers a push only when we did not already send to that member).
type gossipState struct {
	core *gossipCore
	p    gossipParams
	// byIdx maps a member's index in the segment's sorted list to its membership (nil: self, or a
	// member without an address, which counts in the majority but cannot be sent to).
	byIdx []*segMember
	// round counts our rounds; sentIn[j] is the last round in which we sent our vector to j.
	round     uint32
	sentIn    []uint32
	lastRound time.Time
	lastTick  time.Time
	picks     []int
}

// newGossipRand is the source of a member's gossip peer choices, seeded per member and run.
func newGossipRand(self string, boot uint64) func(n int) int {
	h := fnv.New64a()
	h.Write([]byte(self))
	r := rand.New(rand.NewPCG(h.Sum64(), boot))
	return r.IntN
}

// nanos is now on the gossip cores' clock.
func (m *Members) nanos(now time.Time) int64 { return int64(now.Sub(m.origin)) }

// gossipLimit is the largest segment that heartbeats all-to-all (-1: none).
func (m *Members) gossipLimit() int {
	switch l := m.opts.DirectMembersLimit; {
	case l < 0:
		return -1
	case l == 0:
		return DefaultDirectMembersLimit
	default:
		return l
	}
}

// setupGossipLocked puts the segments larger than the limit in gossip mode. What the old segments
// knew is carried over by name (a changed member list must not make every member look silent and
// drop the quorum until the vectors have gone round again): O(members · log members).
func (m *Members) setupGossipLocked(next []*segment, now time.Time) {
	for _, o := range m.segs {
		if o.gossip != nil && !slices.ContainsFunc(next, func(g *segment) bool { return g.key == o.key }) {
			m.rememberListLocked(o.key, o.sorted)
		}
	}
	limit := m.gossipLimit()
	t := m.nanos(now)
	for _, g := range next {
		if len(g.members) == 0 || (limit >= 0 && len(g.sorted) <= limit) {
			continue
		}
		// The timings must be the same on every member (the safety argument compares one member's
		// Stop with another's Dead): derived from the segment, never from this member's own name.
		longest := 0
		for _, n := range g.sorted {
			longest = max(longest, len(n))
		}
		p := deriveGossipParams(m.opts, m.tick(), len(g.sorted), gossipPerChunk(longest), longest)
		gs := &gossipState{core: newGossipCore(len(g.sorted), g.selfIdx, p, t), p: p,
			byIdx: make([]*segMember, len(g.sorted)), sentIn: make([]uint32, len(g.sorted))}
		for _, sm := range g.members {
			gs.byIdx[sm.idx] = sm
		}
		for _, o := range m.segs {
			if o.gossip == nil {
				continue
			}
			oc := o.gossip.core
			// The bound on relayed liveness runs from the first core's start, not the list change.
			gs.core.start = min(gs.core.start, oc.start)
			for j, name := range o.sorted {
				if oc.fresh[j] == never || j == oc.self {
					continue
				}
				k, ok := slices.BinarySearch(g.sorted, name)
				if !ok {
					continue
				}
				if oc.fresh[j] > gs.core.fresh[k] {
					gs.core.fresh[k], gs.core.ready[k] = oc.fresh[j], oc.ready[j]
				}
				gs.core.own[k] = max(gs.core.own[k], oc.own[j])
			}
		}
		// A segment that just crossed into gossip mode starts from what the heartbeats said: each
		// member's last direct proof of life and readiness (else every member would look silent and
		// the quorum would drop until the vectors had gone round).
		// (Only where no gossip segment said anything: a gossiping segment's ready flags are in
		// its core, not in the heartbeat state, which then is stale.)
		for _, sm := range g.members {
			if !sm.p.lastSeen.IsZero() && gs.core.fresh[sm.idx] == never {
				gs.core.fresh[sm.idx], gs.core.ready[sm.idx] = m.nanos(sm.p.lastSeen), sm.ready
				gs.core.own[sm.idx] = m.nanos(sm.p.lastSeen)
			}
		}
		gs.core.setSelf(t, false)
		// Live flags and the live count from the seeded ages now, not at the next tick: the first
		// view of the new segment must not be computed from an empty count (that would drop our
		// own readiness, and with it our candidacy everywhere, until something else changed).
		gs.core.tick(t)
		g.dirty = true
		g.gossip = gs
		if !slices.ContainsFunc(m.segs, func(o *segment) bool { return o.key == g.key && o.gossip != nil }) {
			m.log.Info("L2 segment gossips", "members", len(g.sorted), "limit", limit, "round", p.Round,
				"fanout", p.Fanout, "stop", p.Stop, "dead", p.Dead)
		}
	}
}

// handleGossip is handle for a gossip datagram: the same checks, cheapest first, then the sender's
// liveness, then its vector merged into the segment whose digest it carries; a push (not a reply)
// is answered with our vector unless we already sent to its sender this round.
func (m *Members) handleGossip(b []byte, from netip.Addr, now time.Time) dropReason {
	var gc gossipChunk
	r := parseGossip(b, &gc)
	if r == acceptedReason && m.drop != nil && m.drop(gc.name) {
		return dropPartition
	}
	m.mu.Lock()
	var p *peer
	if r == acceptedReason {
		hb := heartbeat{name: gc.name, counter: gc.counter, echo: gc.echo}
		r = m.checkLocked(b, &hb, from, now, &p)
	}
	if r != acceptedReason {
		m.rejectLocked(r, gc.name, from, now)
		// A genuine push from a member that has not heard us since we started (its echo is older
		// than our boot) is not merged, but its counter was recorded: answering it (once per round
		// and member, so a replay buys at most that) lets its next push count. Without this, two
		// members of a large segment would need to pick each other in turn before either counted.
		var g *segment
		idx := -1
		if q := m.byName[gc.name]; r == dropUnfreshed && q != nil && !gc.reply && gc.offset == 0 {
			for _, sm := range q.in {
				if sm.seg.key == gc.digest && sm.seg.gossip != nil && sm.seg.gossip.sentIn[sm.idx] != sm.seg.gossip.round {
					g, idx = sm.seg, sm.idx
				}
			}
		}
		m.mu.Unlock()
		if g != nil {
			m.gossipReply(g, idx, now)
		}
		return r
	}
	m.received.Inc()
	m.touchLocked(p, now)
	var reply *segment
	replyTo := -1
	// Right after a stall, queued datagrams are read as new: their relayed entries could bring a
	// member that died meanwhile back to life everywhere, so only the sender's own life counts then.
	relayed := !now.Before(m.graceUntil)
	for _, sm := range p.in {
		gs := sm.seg.gossip
		if gs == nil {
			continue
		}
		t := m.nanos(now)
		if sm.seg.key != gc.digest || gc.total != len(sm.seg.sorted) {
			// Written against another member list (the informers disagree for a moment): the
			// sender's own proof of life still counts, and a list we had is read by name.
			gs.core.heard(t, sm.idx, gc.ready)
			if old := m.prevLists[gc.digest]; relayed && old != nil && gc.total == len(old) && gc.offset+len(gc.entries) <= len(old) {
				for i, e := range gc.entries {
					if k, ok := slices.BinarySearch(sm.seg.sorted, old[gc.offset+i]); ok && k != sm.idx {
						gs.core.mergeOne(t, int64(gc.unit), k, e)
					}
				}
			}
			if gs.core.changed {
				sm.seg.dirty, m.dirty = true, true
			}
			continue
		}
		gs.core.heard(t, sm.idx, gc.ready)
		if relayed {
			gs.core.merge(t, int64(gc.unit), gc.offset, gc.entries, sm.idx)
		}
		if gs.core.changed {
			sm.seg.dirty, m.dirty = true, true
		}
		if !gc.reply && gc.offset == 0 && gs.sentIn[sm.idx] != gs.round {
			reply, replyTo = sm.seg, sm.idx
		}
		break
	}
	dirty := m.dirty
	m.mu.Unlock()
	if dirty {
		m.evaluate(now)
	}
	if reply != nil {
		m.gossipReply(reply, replyTo, now)
	}
	return acceptedReason
}

// gossipHeardLocked records a heartbeat of sm's member for a segment we gossip in.
func (m *Members) gossipHeardLocked(sm *segMember, ready bool, now time.Time) {
	c := sm.seg.gossip.core
	c.heard(m.nanos(now), sm.idx, ready)
	if c.changed {
		sm.seg.dirty, m.dirty = true, true
	}
}

// gossipTickLocked refreshes our own entries and notices members crossing a threshold: O(members)
// per gossip segment, at most once per half tick (or when a merge changed something).
func (m *Members) gossipTickLocked(now time.Time) {
	half := m.tick() / 2
	for _, g := range m.segs {
		gs := g.gossip
		if gs == nil || (!gs.core.changed && now.Sub(gs.lastTick) < half) {
			continue
		}
		gs.lastTick = now
		t := m.nanos(now)
		gs.core.setSelf(t, g.view.Ready)
		if gs.core.tick(t) {
			g.dirty, m.dirty = true, true
		}
	}
}

// computeGossipLocked is computeLocked for a gossip segment: quorum over the members whose age is
// at most Stop (self included), candidates the ready members younger than Dead. O(members).
func (m *Members) computeGossipLocked(g *segment) View {
	c := g.gossip.core
	v := View{Candidates: make(map[string]bool, len(g.view.Candidates)+1), Total: len(g.sorted), Heard: c.nLive}
	settled := m.settledLocked(g, v)
	other := ""
	if len(g.sorted) == 2 {
		other = g.sorted[1-g.selfIdx]
	}
	v.Ready = m.willing && !m.withdrawn[g.key] && settled && hasQuorum(m.self, v.Heard, v.Total, other)
	c.ready[c.self] = v.Ready
	if v.Ready {
		v.Candidates[m.self] = true
	}
	for j, ok := range c.cand {
		if ok && j != c.self {
			v.Candidates[g.sorted[j]] = true
		}
	}
	return v
}

// gossipOut is one destination of a round: where, its echo, and the chunks.
type gossipOut struct {
	dst    netip.AddrPort
	name   string
	echo   uint64
	bodies [][]byte
}

// gossipBodiesLocked builds our vector for segment g as chunk bodies without MACs, each with its
// own counter.
func (m *Members) gossipBodiesLocked(g *segment, now time.Time, reply bool) ([][]byte, error) {
	gs := g.gossip
	t := m.nanos(now)
	gs.core.setSelf(t, g.view.Ready)
	per := gossipPerChunk(len(m.self))
	n := len(g.sorted)
	var bodies [][]byte
	for off := 0; off < n; off += per {
		cnt := min(per, n-off)
		m.counter++
		gc := gossipChunk{name: m.self, ready: g.view.Ready, reply: reply, counter: m.counter, digest: g.key,
			unit: gs.p.Unit, total: n, offset: off}
		gc.entries = gs.core.encode(t, make([]byte, 0, cnt), off, cnt)
		b, err := appendGossip(make([]byte, 0, MaxHeartbeat), &gc)
		if err != nil {
			return nil, err
		}
		bodies = append(bodies, b)
	}
	return bodies, nil
}

// gossipRound sends, for every gossip segment whose round is due (all of them if force: our ready
// flag changed), our vector to the next Fanout members of our cycle (gossipCore.pick).
func (m *Members) gossipRound(buf []byte, now time.Time, force bool) []byte {
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	m.mu.Lock()
	var outs []gossipOut
	var firstErr error
	tick := m.tick()
	for _, g := range m.segs {
		gs := g.gossip
		if gs == nil || (!force && now.Sub(gs.lastRound) < gs.p.Round-tick/2) {
			continue
		}
		gs.lastRound = now
		gs.round++
		bodies, err := m.gossipBodiesLocked(g, now, false)
		if err != nil {
			firstErr = err
			continue
		}
		gs.picks = gs.core.pick(gs.picks, gs.p.Fanout, m.rnd)
		if force {
			// Our readiness changed: the members that hold our own word (we sent to them within
			// Stop) would keep the old one over what relays say (gossipCore), so they hear the new
			// one from us now. At most 2·Fanout per round of the last Stop.
			recent := uint32(gs.p.Stop/gs.p.Round) + 1
			for j, r := range gs.sentIn {
				if r != 0 && gs.round-r <= recent && !slices.Contains(gs.picks, j) {
					gs.picks = append(gs.picks, j)
				}
			}
		}
		for _, j := range gs.picks {
			sm := gs.byIdx[j]
			if sm == nil {
				continue
			}
			gs.sentIn[j] = gs.round
			outs = append(outs, gossipOut{dst: sm.p.dst, name: sm.p.name, echo: sm.p.echoBack, bodies: bodies})
		}
	}
	m.mu.Unlock()
	m.gossipSendErr(firstErr, now)
	return m.writeGossip(buf, outs)
}

// gossipReply answers a push of member idx of g with our vector (once per round and member).
func (m *Members) gossipReply(g *segment, idx int, now time.Time) {
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	m.mu.Lock()
	gs := g.gossip
	sm := gs.byIdx[idx]
	if sm == nil || gs.sentIn[idx] == gs.round || !slices.Contains(m.segs, g) {
		m.mu.Unlock()
		return
	}
	gs.sentIn[idx] = gs.round
	bodies, err := m.gossipBodiesLocked(g, now, true)
	var outs []gossipOut
	if err == nil {
		outs = []gossipOut{{dst: sm.p.dst, name: sm.p.name, echo: sm.p.echoBack, bodies: bodies}}
	}
	m.mu.Unlock()
	m.gossipSendErr(err, now)
	m.writeGossip(nil, outs)
}

// writeGossip signs and sends (m.sendMu held, m.mu not).
func (m *Members) writeGossip(buf []byte, outs []gossipOut) []byte {
	m.mu.Lock()
	key := m.keys[0]
	m.mu.Unlock()
	off := gossipEchoOffset(len(m.self))
	for _, o := range outs {
		for _, body := range o.bodies {
			buf = append(buf[:0], body...)
			putUint64(buf[off:], o.echo)
			buf = mac(key, o.name, buf, buf)
			// A send error (no route while a link is down) is the same as a lost datagram.
			_, _ = m.conn.WriteToUDPAddrPort(buf, o.dst)
		}
	}
	return buf
}

// gossipSendErr counts and logs (every 10 s at most) a vector that could not be built.
func (m *Members) gossipSendErr(err error, now time.Time) {
	if err == nil {
		return
	}
	m.sendErrs.Inc()
	if now.Sub(m.lastSendErr) > 10*time.Second {
		m.lastSendErr = now
		m.log.Error("not sending gossip", "err", err)
	}
}

// DirectMembersLimitOption converts the config's speaker.directMembersLimit (nil: the default; 0:
// every segment gossips) to Options.DirectMembersLimit (0: the default; negative: every
// segment gossips).
func DirectMembersLimitOption(limit *int) int {
	switch {
	case limit == nil:
		return 0
	case *limit == 0:
		return -1
	default:
		return *limit
	}
}

// gossipPrevKeep is how many left-behind member lists a member still reads vectors against.
const gossipPrevKeep = 4

// rememberListLocked keeps a left-behind segment's member list by digest (the newest
// gossipPrevKeep).
func (m *Members) rememberListLocked(digest uint64, sorted []string) {
	if m.prevLists == nil {
		m.prevLists = map[uint64][]string{}
	}
	if _, ok := m.prevLists[digest]; ok {
		return
	}
	m.prevLists[digest] = sorted
	m.prevOrder = append(m.prevOrder, digest)
	if len(m.prevOrder) > gossipPrevKeep {
		delete(m.prevLists, m.prevOrder[0])
		m.prevOrder = m.prevOrder[1:]
	}
}
