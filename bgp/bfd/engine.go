package bfd

import (
	"net/netip"
	"time"
)

// engine holds every session and demultiplexes received packets to them (RFC 5880 6.8.6, RFC 5881
// section 3). It does no I/O and reads no clock, so tests drive it with a fake clock and connect
// two engines by a slice of packets. One goroutine owns it (Server's loop).
type engine struct {
	byPeer  map[netip.Addr]*session
	byDiscr map[uint32]*session
	// newDiscr returns a random discriminator (RFC 5880 6.8.1 recommends random ones, so a
	// restarted speaker is not taken for its predecessor); jitter a number in [0, 1).
	newDiscr func() uint32
	jitter   func() float64
	// gen changes whenever a session is created, deleted or held/started: the owner's cue to
	// look at sockets again.
	gen uint64
}

func newEngine(newDiscr func() uint32, jitter func() float64) *engine {
	return &engine{byPeer: map[netip.Addr]*session{}, byDiscr: map[uint32]*session{}, newDiscr: newDiscr, jitter: jitter}
}

// sameEndpoints reports whether a session for a can be updated in place to b: same peer, source
// and hop mode. Anything else is a different session for the peer.
func sameEndpoints(a, b Config) bool {
	return a.Peer == b.Peer && a.Local == b.Local && a.Multihop == b.Multihop
}

// set creates the session for cfg.Peer or updates it in place. A session being removed, or one
// with other endpoints, is replaced by a new session (new discriminator).
func (e *engine) set(now time.Time, cfg Config, a *actions) *session {
	cfg = cfg.withDefaults()
	if s, ok := e.byPeer[cfg.Peer]; ok {
		if s.state != StateAdminDown && sameEndpoints(s.cfg, cfg) {
			if s.cfg.Hold != cfg.Hold {
				e.gen++
			}
			authChanged := s.cfg.Auth != cfg.Auth
			s.update(now, cfg)
			if authChanged && cfg.Auth.Type != AuthNone {
				// The peer's packets under the old key say nothing about the new one: a new
				// discriminator makes the ones recorded before unusable (see authenticate).
				e.renewDiscr(s)
			}
			return s
		}
		e.forget(s)
	}
	e.gen++
	d := e.freeDiscr()
	s := newSession(cfg, d, now, e.jitter)
	s.renew = e.renewDiscr
	e.byPeer[cfg.Peer] = s
	e.byDiscr[d] = s
	a.events = append(a.events, Event{Kind: EventState, Peer: cfg.Peer, From: StateDown, To: StateDown, RemoteState: StateDown, LocalDiscr: d})
	return s
}

// freeDiscr returns a random discriminator no session uses.
func (e *engine) freeDiscr() uint32 {
	var d uint32
	for d == 0 || e.byDiscr[d] != nil {
		d = e.newDiscr()
	}
	return d
}

// renewDiscr gives an authenticated session a new local discriminator and forgets the peer's
// sequence numbers: every packet recorded under the old one (Init, Up, anything naming it) then
// fails the discriminator lookup, so none can be replayed to bring the session Up or keep it Up.
// The peer learns the new one from our next packet (RFC 5880 6.8.6: bfd.RemoteDiscr is set from
// every packet's My Discriminator).
func (e *engine) renewDiscr(s *session) {
	if e.byDiscr[s.localDiscr] == s {
		delete(e.byDiscr, s.localDiscr)
	}
	s.localDiscr = e.freeDiscr()
	e.byDiscr[s.localDiscr] = s
	s.auth.forget()
}

// remove retires the session of peer: it sends AdminDown and is deleted afterwards.
func (e *engine) remove(now time.Time, peer netip.Addr, a *actions) {
	if s, ok := e.byPeer[peer.WithZone("")]; ok {
		s.remove(now, a)
		if s.retired {
			e.forget(s)
		}
	}
}

func (e *engine) forget(s *session) {
	e.gen++
	if e.byPeer[s.cfg.Peer] == s {
		delete(e.byPeer, s.cfg.Peer)
	}
	if e.byDiscr[s.localDiscr] == s {
		delete(e.byDiscr, s.localDiscr)
	}
}

// receive hands a parsed packet from src, which arrived at at (at most now) with the given TTL
// (hop limit) on the single-hop (multihop false) or multi-hop port, to its session. Costs a few
// map lookups whatever the packet.
func (e *engine) receive(now, at time.Time, src netip.Addr, ttl int, multihop bool, p Packet, a *actions) DropReason {
	s, ok := e.byPeer[src.Unmap().WithZone("")]
	if !ok {
		return DropUnknownPeer
	}
	if s.cfg.Multihop != multihop {
		// A packet on the other port than the session uses: not for this session.
		return DropUnknownPeer
	}
	if multihop && ttl < int(s.cfg.MinTTL) || !multihop && ttl != 255 {
		return DropTTL
	}
	if p.YourDiscr != 0 {
		byD, ok := e.byDiscr[p.YourDiscr]
		switch {
		case !ok:
			return DropUnknownDiscr
		case byD != s:
			return DropWrongSource
		}
	} else if p.State != StateDown && p.State != StateAdminDown {
		return DropZeroYourDiscr
	}
	// Authentication (RFC 5880 6.8.6) before anything of the packet is believed. The
	// discriminator checks above leak nothing a peer does not see on the wire.
	// The sequence number is kept for two detection times at their bound, so never forgotten
	// before the detection time expires (which gives the session a new discriminator anyway):
	// the packet may lengthen the detection time, and a window forgotten while Up would take
	// a replay.
	if why := s.auth.authenticate(at, s.cfg.Auth, s.maxDetect(), s.state == StateUp, &p); why != DropNone {
		return why
	}
	return s.receive(now, at, p, a)
}

// tick runs every due timer and deletes the sessions that finished retiring.
func (e *engine) tick(now time.Time, a *actions) { e.run(now, true, a) }

// transmit is tick without the detection times and graces: it sends the packets due (periodic,
// and the retiring sessions' AdminDown) while the owner holds the expiries back for packets still
// on their way in, so that no session's transmissions wait for another's expiry.
func (e *engine) transmit(now time.Time, a *actions) { e.run(now, false, a) }

// run runs the due timers, the detection times and graces only if expire, and deletes the
// sessions that finished retiring.
func (e *engine) run(now time.Time, expire bool, a *actions) {
	for _, s := range e.byPeer {
		if n := s.next(); !n.IsZero() && !now.Before(n) {
			s.tick(now, expire, a)
		}
		if s.retired {
			e.forget(s)
		}
	}
}

// expiring reports whether tick at now would expire a detection time or a grace: the owner's cue
// to make sure every packet that arrived before now has been received first.
func (e *engine) expiring(now time.Time) bool {
	for _, s := range e.byPeer {
		if s.expiring(now) {
			return true
		}
	}
	return false
}

// next is the earliest time tick has work; zero if none.
func (e *engine) next() time.Time {
	var t time.Time
	for _, s := range e.byPeer {
		if n := s.next(); !n.IsZero() && (t.IsZero() || n.Before(t)) {
			t = n
		}
	}
	return t
}
