package bfd

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// sim connects engines by a simulated link with a fake clock: every packet goes through Append and
// Parse and arrives after latency with TTL 255; a node's packets can be dropped on the way out
// (drop) or in (deaf). Time only moves in run, from one due timer or arrival to the next.
type sim struct {
	t       *testing.T
	now     time.Time
	latency time.Duration
	nodes   map[netip.Addr]*simNode
	flights []flight
}

type simNode struct {
	addr netip.Addr
	eng  *engine
	// drop makes the node's outgoing packets vanish; deaf its incoming ones.
	drop, deaf bool
	// lazy makes the node a starved receiver: packets that arrived are handed to its engine, with
	// their arrival times, only when a detection time or grace would expire, just before the
	// timers run: the worst case of Server's reader, which then gets to run because the loop
	// puts the tick off for the datagrams queued on its sockets. maxLag is the longest a packet
	// waited to be handed over.
	lazy   bool
	maxLag time.Duration
	// events and sent record everything, in order; drops counts the receive drops.
	events []timedEvent
	sent   []timedPacket
	drops  map[DropReason]int
	// filter, when set, sees every outgoing packet and may change or suppress it (false).
	filter func(*Packet) bool
}

type timedEvent struct {
	at time.Duration
	Event
}

type timedPacket struct {
	at time.Duration
	to netip.Addr
	Packet
}

type flight struct {
	at       time.Time
	from, to netip.Addr
	ttl      int
	b        []byte
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newSim(t *testing.T) *sim {
	return &sim{t: t, now: t0, latency: 100 * time.Microsecond, nodes: map[netip.Addr]*simNode{}}
}

// node adds an engine at addr with deterministic discriminators and jitter.
func (s *sim) node(addr string, seed uint64) *simNode {
	r := rand.New(rand.NewPCG(seed, seed+1))
	n := &simNode{addr: netip.MustParseAddr(addr), eng: newEngine(r.Uint32, r.Float64), drops: map[DropReason]int{}}
	s.nodes[n.addr] = n
	return n
}

func (s *sim) elapsed() time.Duration { return s.now.Sub(t0) }

// apply dispatches what node n's engine asked for.
func (s *sim) apply(n *simNode, a *actions) {
	for _, o := range a.send {
		s.transmitKeyed(n, o.s.cfg.Peer, o.p, 255, o.s.cfg.Auth.Key)
	}
	for _, ev := range a.events {
		n.events = append(n.events, timedEvent{s.elapsed(), ev})
	}
}

func (s *sim) transmit(n *simNode, to netip.Addr, p Packet, ttl int) {
	s.transmitKeyed(n, to, p, ttl, "")
}

// transmitKeyed sends p, signed with key when it carries an Authentication Section.
func (s *sim) transmitKeyed(n *simNode, to netip.Addr, p Packet, ttl int, key string) {
	if n.filter != nil && !n.filter(&p) {
		return
	}
	n.sent = append(n.sent, timedPacket{s.elapsed(), to, p})
	if n.drop {
		return
	}
	b := p.Append(nil)
	if p.AuthPresent {
		b = p.AppendSigned(nil, key)
	}
	s.flights = append(s.flights, flight{at: s.now.Add(s.latency), from: n.addr, to: to, ttl: ttl, b: b})
}

// set configures a session on n.
func (s *sim) set(n *simNode, cfg Config) {
	var a actions
	n.eng.set(s.now, cfg, &a)
	s.apply(n, &a)
}

func (s *sim) remove(n *simNode, peer netip.Addr) {
	var a actions
	n.eng.remove(s.now, peer, &a)
	s.apply(n, &a)
}

// inject delivers a hand-made packet to n as if from src, now.
func (s *sim) inject(n *simNode, src netip.Addr, ttl int, p Packet) DropReason {
	q, why := Parse(p.Append(nil))
	return s.deliver(n, src, ttl, q, why)
}

func (s *sim) deliver(n *simNode, src netip.Addr, ttl int, p Packet, why DropReason) DropReason {
	return s.deliverAt(n, s.now, src, ttl, p, why)
}

// deliverAt hands n a packet that arrived at at.
func (s *sim) deliverAt(n *simNode, at time.Time, src netip.Addr, ttl int, p Packet, why DropReason) DropReason {
	var a actions
	n.maxLag = max(n.maxLag, s.now.Sub(at))
	if why == DropNone {
		why = n.eng.receive(s.now, at, src, ttl, false, p, &a)
	}
	if why != DropNone {
		n.drops[why]++
	}
	s.apply(n, &a)
	return why
}

// run advances the clock by d, processing arrivals and timers in time order.
func (s *sim) run(d time.Duration) {
	end := s.now.Add(d)
	for {
		next := end
		for _, n := range s.nodes {
			if t := n.eng.next(); !t.IsZero() && t.Before(next) {
				next = t
			}
		}
		for _, f := range s.flights {
			if n := s.nodes[f.to]; f.at.Before(next) && (n == nil || !n.lazy) {
				next = f.at
			}
		}
		if next.After(s.now) {
			s.now = next
		}
		progressed := false
		var due, rest []flight
		for _, f := range s.flights {
			if n := s.nodes[f.to]; f.at.After(s.now) || n != nil && n.lazy {
				rest = append(rest, f)
			} else {
				due = append(due, f)
			}
		}
		s.flights = rest
		for _, f := range due {
			progressed = true
			if n := s.nodes[f.to]; n != nil && !n.deaf {
				p, why := Parse(f.b)
				s.deliver(n, f.from, f.ttl, p, why)
			}
		}
		for _, n := range s.nodes {
			if t := n.eng.next(); !t.IsZero() && !t.After(s.now) {
				if n.lazy && n.eng.expiring(s.now) {
					s.catchUp(n)
				}
				var a actions
				n.eng.tick(s.now, &a)
				s.apply(n, &a)
				progressed = true
			}
		}
		if !progressed && !s.now.Before(end) {
			return
		}
	}
}

// catchUp hands lazy node n every packet that has arrived for it, in order, with its arrival time.
func (s *sim) catchUp(n *simNode) {
	var rest []flight
	flights := s.flights
	s.flights = nil // what n sends meanwhile
	for _, f := range flights {
		if f.to != n.addr || f.at.After(s.now) {
			rest = append(rest, f)
			continue
		}
		if !n.deaf {
			p, why := Parse(f.b)
			s.deliverAt(n, f.at, f.from, f.ttl, p, why)
		}
	}
	s.flights = append(rest, s.flights...)
}

// session is n's session with peer (nil if none).
func (n *simNode) session(peer *simNode) *session { return n.eng.byPeer[peer.addr] }

func (n *simNode) failures() []timedEvent {
	var fs []timedEvent
	for _, ev := range n.events {
		if ev.Kind == EventFailure {
			fs = append(fs, ev)
		}
	}
	return fs
}

// transitions lists n's state changes as "from>to" strings, for readable assertions.
func (n *simNode) transitions() []string {
	var ts []string
	for _, ev := range n.events {
		if ev.Kind == EventState && ev.From != ev.To {
			ts = append(ts, ev.From.String()+">"+ev.To.String())
		}
	}
	return ts
}

func cfgFor(peer *simNode, tx, rx time.Duration, mult uint8) Config {
	return Config{Peer: peer.addr, DesiredMinTx: tx, RequiredMinRx: rx, DetectMult: mult}
}

// upPair returns two nodes with a session each, 100 ms x 3, Up and past the Poll Sequence.
func upPair(t *testing.T) (*sim, *simNode, *simNode) {
	t.Helper()
	s := newSim(t)
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	s.set(a, cfgFor(b, 100*time.Millisecond, 100*time.Millisecond, 3))
	s.set(b, cfgFor(a, 100*time.Millisecond, 100*time.Millisecond, 3))
	s.run(3 * time.Second)
	if sa, sb := a.session(b), b.session(a); sa.state != StateUp || sb.state != StateUp {
		t.Fatalf("sessions %s and %s after 3s, want up", sa.state, sb.state)
	}
	return s, a, b
}
