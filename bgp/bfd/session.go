package bfd

import (
	"net/netip"
	"time"
)

// Config is one BFD session: MetalLB's BFDProfile for one BGP peer.
type Config struct {
	// Peer is the remote address; one session per address.
	Peer netip.Addr
	// Local is the source address of our packets; zero lets the kernel choose by route (the same
	// choice it makes for the BGP session, so the router sees one address for both).
	Local netip.Addr
	// DesiredMinTx is the interval at which we want to send once the session is Up (MetalLB's
	// transmitInterval); RequiredMinRx the fastest rate we accept (receiveInterval).
	DesiredMinTx, RequiredMinRx time.Duration
	// DetectMult is how many intervals without a packet declare the session down.
	DetectMult uint8
	// Passive: send nothing until the peer has sent something (RFC 5880 6.1).
	Passive bool
	// Multihop runs the session over RFC 5883 (UDP 4784): received packets need a TTL of at least
	// MinTTL instead of exactly 255. For eBGP multi-hop peers.
	Multihop bool
	MinTTL   uint8
	// MaxDetectTime bounds the detection time: the peer's packets set it (its Detect Mult times
	// its Desired Min TX Interval, RFC 5880 6.8.4) and can claim up to 255 x 71 minutes, which
	// would keep a dead peer's session Up for 12.7 days. Zero means DefaultMaxDetectTime. The
	// bound is never below our own RequiredMinRx x DetectMult (see maxDetect).
	MaxDetectTime time.Duration
	// Auth authenticates the session's packets (RFC 5880 section 6.7); zero: none.
	Auth Auth
	// Hold keeps the session silent: it sends nothing and ignores what it receives, until a Set
	// without Hold starts it. A speaker holds a peer's session until the BGP session is first
	// Established (see package bgp).
	Hold bool
}

// Defaults and limits.
const (
	// slowTx is the transmit interval while the session is not Up (RFC 5880 6.8.3: at least 1 s).
	slowTx = time.Second
	// DefaultInterval and DefaultDetectMult apply to zero fields of a Config.
	DefaultInterval   = time.Second
	DefaultDetectMult = 3
	// DefaultMinTTL is the minimum TTL of a multi-hop session's packets when MinTTL is zero
	// (FRR's default: one hop).
	DefaultMinTTL = 254
	// DefaultMaxDetectTime is the bound of the detection time when Config.MaxDetectTime is zero:
	// above what a peer needs at the 1 s slow rate with a multiplier of 3 to 5, far below the
	// days a forged packet could claim.
	DefaultMaxDetectTime = 5 * time.Second
	// retirePackets is how many AdminDown packets a removed session sends that was Up (one if it
	// was not), so that the peer's client does not take the removal for a failure.
	retirePackets = 3
)

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if c.DesiredMinTx <= 0 {
		c.DesiredMinTx = DefaultInterval
	}
	if c.RequiredMinRx <= 0 {
		c.RequiredMinRx = DefaultInterval
	}
	if c.DetectMult == 0 {
		c.DetectMult = DefaultDetectMult
	}
	if c.MaxDetectTime <= 0 {
		c.MaxDetectTime = DefaultMaxDetectTime
	}
	if c.Multihop && c.MinTTL == 0 {
		c.MinTTL = DefaultMinTTL
	}
	c.Peer = c.Peer.WithZone("")
	return c
}

// Failure says why a session's failure is reported to its client (BGP): RFC 5882's "the session
// went down" in the cases that mean the path failed.
type Failure uint8

// The failures reported to the client.
const (
	FailureNone Failure = iota
	// FailureDetectTimeExpired: no packet from the peer for a detection time while Up.
	FailureDetectTimeExpired
	// FailureRemoteDown: the remote session we were Up with signalled Down with a diagnostic
	// that names a failure (its detection time expired, its path is down, ...).
	FailureRemoteDown
	// FailureNotBackUp: the peer tore down the session we were Up with (Down saying "neighbor
	// signaled session down" although we never did, or "administratively down") or replaced it by
	// a new one (a new discriminator starting in Down), and the session was not Up again within
	// one detection time at the slow rate.
	FailureNotBackUp
)

var failureNames = [...]string{
	FailureNone:              "none",
	FailureDetectTimeExpired: "detection time expired",
	FailureRemoteDown:        "the peer signalled down",
	FailureNotBackUp:         "the peer tore down or replaced its session and it did not come back up",
}

func (f Failure) String() string {
	if int(f) < len(failureNames) {
		return failureNames[f]
	}
	return "unknown"
}

// EventKind tells an Event's meaning.
type EventKind uint8

// The event kinds.
const (
	// EventState: the session changed state (From -> To, Diag says why).
	EventState EventKind = iota
	// EventFailure: the session failed (Failure says how); the client should reset what it
	// protects. AdminDown from the peer, the removal of a session and a replaced remote session
	// that comes Up in time are never failures (RFC 5882 section 3.2).
	EventFailure
)

// Event is something a session reports to its owner.
type Event struct {
	Kind     EventKind
	Peer     netip.Addr
	From, To State
	// Diag is our diagnostic (why we changed state); Remote* are from the packet that caused it.
	Diag        Diag
	Failure     Failure
	RemoteState State
	RemoteDiag  Diag
	RemoteDiscr uint32
	LocalDiscr  uint32
	// Grace is set on a transition from Up to Down that becomes a failure only if the session is
	// not Up again within Grace: the peer tore its session down (Replaced false) or replaced it by
	// a new one (Replaced true); ReplacedFrom is the remote discriminator we were Up with.
	Grace        time.Duration
	Replaced     bool
	ReplacedFrom uint32
}

// actions collects what handling one input asks the owner to do.
type actions struct {
	send   []outPacket
	events []Event
}

type outPacket struct {
	s *session
	p Packet
}

// session is one BFD session's state machine (RFC 5880 section 6.8), pure: time comes in as an
// argument, packets go out through actions, randomness through jitter.
type session struct {
	cfg Config

	// The state variables of RFC 5880 section 6.8.1.
	localDiscr, remoteDiscr uint32
	state, remoteState      State
	diag, remoteDiag        Diag
	remoteMinRx             time.Duration // bfd.RemoteMinRxInterval
	remoteDesiredTx         time.Duration
	remoteDetectMult        uint8
	remoteDemand            bool

	// txAdvertised and rxAdvertised are the intervals in our packets; txInUse and rxInUse the
	// ones our transmit rate and detection time use. They differ during a Poll Sequence: a faster
	// transmit rate and a slower receive rate apply at once, the others once the peer answered
	// with Final (RFC 5880 6.8.3).
	txAdvertised, rxAdvertised time.Duration
	txInUse, rxInUse           time.Duration
	poll                       bool

	// nextTx is when the next periodic packet is due (zero: none scheduled), scheduledWith the
	// interval it was computed from; detectAt when the detection time expires (zero: no timer).
	nextTx        time.Time
	scheduledWith time.Duration
	detectAt      time.Time

	// upRemote is the remote discriminator of the current Up period (or of the last one).
	upRemote uint32
	// remoteConfirmed is set once the bound remote session (remoteDiscr) has sent a packet
	// naming our discriminator: it reads our packets. A binding made by a packet with Your
	// Discriminator zero alone may be anyone's (see receive).
	remoteConfirmed bool
	// graceUntil is set while a session the peer tore down or replaced has until then to come Up
	// again before the failure is reported; graceFrom is the remote discriminator we were Up with.
	graceUntil time.Time
	graceFrom  uint32
	// successor is a new remote session that announced itself (Down, Your Discriminator zero)
	// while we were Up with another, on a session without authentication: first seen at
	// successorFirst, last at successorAt. It is only taken once the current remote session goes
	// away (its goodbye, or its detection time), because anyone on the link can send that packet
	// without knowing a discriminator.
	successor                   uint32
	successorFirst, successorAt time.Time

	// retire counts the AdminDown packets left to send once the session has been removed;
	// retired is set when it has sent them and can be deleted.
	retire  int
	retired bool

	// transitions counts the entries into each state; failures the failures reported.
	transitions [4]uint64
	failures    uint64

	// auth holds the authentication sequence numbers (auth.go); renew gives the session a new
	// local discriminator (the engine's renewDiscr), nil outside an engine.
	auth  authState
	renew func(*session)

	jitter func() float64
}

func newSession(cfg Config, discr uint32, now time.Time, jitter func() float64) *session {
	cfg = cfg.withDefaults()
	s := &session{
		cfg:              cfg,
		localDiscr:       discr,
		state:            StateDown,
		remoteState:      StateDown,
		remoteMinRx:      time.Microsecond, // RFC 5880 6.8.1: initialized to 1
		remoteDetectMult: cfg.DetectMult,
		jitter:           jitter,
	}
	if cfg.Auth.Type != AuthNone {
		// RFC 5880 6.8.1: bfd.XmitAuthSeq starts at a random value (it protects against
		// replay, not guessing: it is on the wire).
		s.auth.xmitSeq = uint32(jitter() * (1 << 32))
	}
	s.txAdvertised = max(cfg.DesiredMinTx, slowTx)
	s.rxAdvertised = cfg.RequiredMinRx
	s.txInUse, s.rxInUse = s.txAdvertised, s.rxAdvertised
	s.transitions[StateDown]++
	if s.canSendPeriodic() {
		s.nextTx = now
		s.scheduledWith = s.txInterval()
	}
	return s
}

// txInterval is the transmit interval before jitter: the slower of ours and the peer's wish, the
// peer's bounded like the detection time (a forged Required Min RX Interval of 71 minutes must not
// silence us either; a real peer that slow needs a larger MaxDetectTime).
func (s *session) txInterval() time.Duration {
	return max(s.txInUse, min(s.remoteMinRx, s.maxDetect()))
}

// detectTime is RFC 5880 6.8.4 for asynchronous mode, bounded by maxDetect: the peer's Detect
// Mult and Desired Min TX Interval come from its packets, unauthenticated unless Auth is set, and
// one packet claiming 255 x 2^32-1 us would otherwise put the detection of a dead peer 12.7 days
// off. A peer sending as slowly as it may still meets the bound as long as it sends at least once
// per maxDetect; only a peer pacing slower than that (which our profile never asked for) sees its
// session time out, and is told so by our Down (diagnostic "control detection time expired").
func (s *session) detectTime() time.Duration {
	return min(time.Duration(s.remoteDetectMult)*max(s.rxInUse, s.remoteDesiredTx), s.maxDetect())
}

// maxDetect is the bound of the detection time: Config.MaxDetectTime, but never below what our
// own profile asks for (RequiredMinRx x DetectMult, with the receive interval in use during a
// Poll Sequence), so a slow profile keeps working without setting it.
func (s *session) maxDetect() time.Duration {
	mult := time.Duration(s.cfg.DetectMult)
	return max(s.cfg.MaxDetectTime, mult*s.cfg.RequiredMinRx, mult*s.rxInUse)
}

// canSendPeriodic reports whether periodic packets are allowed (RFC 5880 6.8.7).
func (s *session) canSendPeriodic() bool {
	switch {
	case s.retired, s.cfg.Hold:
		return false
	case s.cfg.Passive && s.remoteDiscr == 0 && s.state != StateAdminDown:
		return false
	case s.remoteMinRx == 0:
		return false
	case s.remoteDemand && s.state == StateUp && s.remoteState == StateUp && !s.poll:
		return false
	}
	return true
}

// jittered applies RFC 5880 6.8.7's jitter: 75-100% of d, or 75-90% with a multiplier of 1.
func (s *session) jittered(d time.Duration) time.Duration {
	spread := 0.25
	if s.cfg.DetectMult == 1 {
		spread = 0.15
	}
	return time.Duration(float64(d) * (0.75 + spread*s.jitter()))
}

// packet is the next packet to send; with authentication it takes the next sequence number (the
// digest is computed on the way out, by AppendSigned with the key).
func (s *session) packet(final bool) Packet {
	p := Packet{
		Diag:          s.diag,
		State:         s.state,
		Poll:          s.poll && !final,
		Final:         final,
		DetectMult:    s.cfg.DetectMult,
		MyDiscr:       s.localDiscr,
		YourDiscr:     s.remoteDiscr,
		DesiredMinTx:  s.txAdvertised,
		RequiredMinRx: s.rxAdvertised,
		// RequiredMinEchoRx 0: we do not loop Echo packets back.
	}
	if t := s.cfg.Auth.Type; t != AuthNone {
		// Every keyed type takes one sequence number per packet: the meticulous ones must
		// (RFC 5880 6.7.3/6.7.4), the others may, and the receiver's window of 3 x Detect Mult
		// then covers up to that many lost packets.
		p.AuthPresent = true
		p.Auth = AuthSection{Type: t, KeyID: s.cfg.Auth.KeyID, Seq: s.auth.xmitSeq}
		s.auth.xmitSeq++
	}
	return p
}

// schedule sets the next periodic packet one jittered interval after now.
func (s *session) schedule(now time.Time) {
	if !s.canSendPeriodic() {
		s.nextTx = time.Time{}
		return
	}
	s.scheduledWith = s.txInterval()
	s.nextTx = now.Add(s.jittered(s.scheduledWith))
}

// transmit sends a packet now. A packet with Final answers a Poll and may be sent at any time;
// any other restarts the periodic schedule, so the rate never exceeds the negotiated one by more
// than the state changes themselves.
func (s *session) transmit(now time.Time, final bool, a *actions) {
	a.send = append(a.send, outPacket{s, s.packet(final)})
	if s.state == StateAdminDown && s.retire > 0 {
		s.retire--
		if s.retire == 0 {
			s.retired = true
		}
	}
	if !final || s.nextTx.IsZero() {
		s.schedule(now)
	}
}

// setState changes state and records the event.
func (s *session) setState(now time.Time, to State, diag Diag, a *actions, ev Event) {
	from := s.state
	s.state, s.diag = to, diag
	s.transitions[to]++
	ev.Kind, ev.Peer, ev.From, ev.To, ev.Diag = EventState, s.cfg.Peer, from, to, diag
	ev.LocalDiscr, ev.RemoteDiscr = s.localDiscr, s.remoteDiscr
	a.events = append(a.events, ev)
	switch to {
	case StateUp:
		s.diag = DiagNone
		s.upRemote = s.remoteDiscr
		s.graceUntil, s.graceFrom = time.Time{}, 0
		s.successor = 0
		// Leave the 1 s slow rate for the configured one with a Poll Sequence. A faster rate
		// applies at once (the peer may shorten its detection time as soon as it reads ours).
		s.setIntervals(s.cfg.DesiredMinTx, s.cfg.RequiredMinRx)
	case StateDown, StateAdminDown:
		s.poll = false
		s.txAdvertised = max(s.cfg.DesiredMinTx, slowTx)
		s.rxAdvertised = s.cfg.RequiredMinRx
		s.txInUse, s.rxInUse = s.txAdvertised, s.rxAdvertised
	}
}

// setIntervals changes the advertised intervals. Up, a change starts a Poll Sequence and only the
// safe direction applies before the peer's Final: a shorter transmit interval and a longer
// receive interval (so our detection time is never shorter than what the peer paces for).
func (s *session) setIntervals(tx, rx time.Duration) {
	if s.state != StateUp {
		tx = max(tx, slowTx)
	}
	if tx == s.txAdvertised && rx == s.rxAdvertised {
		return
	}
	s.txAdvertised, s.rxAdvertised = tx, rx
	if s.state == StateUp {
		s.poll = true
		s.txInUse = min(s.txInUse, tx)
		s.rxInUse = max(s.rxInUse, rx)
		return
	}
	s.txInUse, s.rxInUse = tx, rx
}

// slowDetect is our detection time of a peer at the 1 s slow rate with our multiplier: the least
// grace a torn-down session gets, whatever the bound.
func (s *session) slowDetect() time.Duration { return time.Duration(s.cfg.DetectMult) * slowTx }

// fail reports a failure to the client.
func (s *session) fail(f Failure, a *actions) {
	s.failures++
	a.events = append(a.events, Event{Kind: EventFailure, Peer: s.cfg.Peer, From: StateUp, To: s.state, Diag: s.diag,
		Failure: f, RemoteState: s.remoteState, RemoteDiag: s.remoteDiag, RemoteDiscr: s.remoteDiscr, LocalDiscr: s.localDiscr, ReplacedFrom: s.graceFrom})
}

// receive applies a packet that the engine has already matched to this session (RFC 5880 6.8.6
// from "If bfd.SessionState is AdminDown" on), plus the binding to one remote session. The packet
// arrived at at (the kernel's receive timestamp, at most now): the detection time runs from its
// arrival, not from when we get to it, so a receiver that falls behind neither loses a session
// whose packets arrived in time nor keeps one whose packets did not.
func (s *session) receive(now, at time.Time, p Packet, a *actions) DropReason {
	if s.state == StateAdminDown {
		return DropLocalAdminDown
	}
	if s.cfg.Hold {
		return DropHeld
	}
	// A detection time (or grace) that had run out before the packet arrived has expired,
	// however late our timer is: the packet does not rescue the session.
	s.expire(now, at, a)
	// Once bound to a remote discriminator, only that remote session may drive ours. The one
	// exception is a new remote session starting (Down, Your Discriminator zero): the peer
	// replaced its session, as FRR does when BGP comes up after BFD. Anything else from another
	// discriminator is the tail of a session that is gone (its AdminDown or Down arriving after
	// its successor's packets) and would only tear the new binding down.
	//
	// Without authentication, that new session's first packet needs no discriminator at all: a
	// blind sender on the link could make us drop a live session with one packet (we would bind
	// to its made-up discriminator, drop the real peer's packets as stale, and the peer would
	// time us out). So while Up with a live remote session, its successor is only remembered, and
	// taken when the current one says goodbye or its detection time expires.
	//
	// While not Up, a binding made only by packets with Your Discriminator zero (nobody has named
	// our discriminator yet) gives way to a remote session in Init or Up that names it: that one
	// reads our packets, where a blind sender's made-up discriminator (or a replayed one) would
	// keep our Init answering a session that does not exist and hold the real peer off.
	replaced := false
	if s.remoteDiscr != 0 && p.MyDiscr != s.remoteDiscr {
		switch {
		case p.YourDiscr != 0 && (p.State == StateInit || p.State == StateUp) && !s.remoteConfirmed && s.state != StateUp:
			// Taken: it names us, the binding it replaces never did.
		case p.YourDiscr != 0 || p.State != StateDown:
			return DropStaleRemote
		case s.state == StateUp && s.cfg.Auth.Type == AuthNone:
			if s.successor == 0 || s.successorAt.Before(at.Add(-max(s.detectTime(), s.slowDetect()))) {
				// The grace of a replacement runs from when a successor first spoke
				// (expire): another made-up discriminator does not restart it.
				s.successorFirst = at
			}
			s.successor, s.successorAt = p.MyDiscr, at
			return DropSuccessorHeld
		default:
			replaced = true
		}
	}
	if p.MyDiscr != s.remoteDiscr {
		s.remoteConfirmed = false
	}
	s.remoteConfirmed = s.remoteConfirmed || p.YourDiscr != 0
	s.remoteDiscr = p.MyDiscr
	s.remoteState = p.State
	s.remoteDiag = p.Diag
	s.remoteDemand = p.Demand
	s.remoteDesiredTx = p.DesiredMinTx
	s.remoteDetectMult = p.DetectMult
	oldMinRx := s.remoteMinRx
	s.remoteMinRx = p.RequiredMinRx
	if p.Final && s.poll {
		s.poll = false
		s.txInUse, s.rxInUse = s.txAdvertised, s.rxAdvertised
	}

	ev := Event{RemoteState: p.State, RemoteDiag: p.Diag}
	changed := true
	switch {
	case p.State == StateAdminDown:
		// RFC 5882 3.2: the peer turned BFD off for this session; that is no path failure.
		if s.state != StateDown {
			s.setState(now, StateDown, DiagNeighborDown, a, ev)
		} else {
			changed = false
		}
		s.graceUntil, s.graceFrom = time.Time{}, 0
		// The peer's session is gone: answer its successor (with Your Discriminator zero if
		// it has not spoken yet).
		s.remoteDiscr, s.remoteConfirmed = s.takeSuccessor(at), false
	case s.state == StateDown && p.State == StateDown:
		s.setState(now, StateInit, DiagNone, a, ev)
	case s.state == StateDown && p.State == StateInit, s.state == StateInit && (p.State == StateInit || p.State == StateUp):
		s.setState(now, StateUp, DiagNone, a, ev)
	case s.state == StateUp && p.State == StateDown:
		replaced = replaced || p.MyDiscr != s.upRemote
		// "Neighbor signaled session down" cannot be true while we are Up: it is how FRR's bfdd
		// deletes a session (bgpd replacing it, as when BGP comes up after BFD; FRR 8.4 sends it
		// from the old session, then starts the new one). "Administratively down" in a Down packet
		// is the same kind of goodbye.
		teardown := p.Diag == DiagNeighborDown || p.Diag == DiagAdminDown
		if replaced || teardown {
			// Re-handshake (with the new session if there is one); it is a failure only if the
			// session is not Up again within a detection time at the slow rate, counted like the
			// detection time from the packet's arrival.
			// Bounded as the detection time is: the packet's timers are the peer's word.
			grace := min(time.Duration(p.DetectMult)*max(s.rxInUse, p.DesiredMinTx, slowTx), max(s.maxDetect(), s.slowDetect()))
			ev.Grace, ev.Replaced, ev.ReplacedFrom = grace, replaced, s.upRemote
			s.setState(now, StateDown, DiagNeighborDown, a, ev)
			s.graceFrom = s.upRemote
			s.graceUntil = at.Add(grace)
			if !replaced {
				// The peer's session is going away: answer its successor with Your
				// Discriminator zero, which it can match (FRR drops a packet naming a
				// discriminator it no longer has).
				s.remoteDiscr, s.remoteConfirmed = s.takeSuccessor(at), false
			}
		} else {
			s.setState(now, StateDown, DiagNeighborDown, a, ev)
			s.fail(FailureRemoteDown, a)
		}
	default:
		changed = false
	}

	// The packet is valid: restart the detection timer (RFC 5880 6.8.4) from its arrival, unless
	// the peer is administratively down and sends nothing more to time out.
	if s.remoteState == StateAdminDown {
		s.detectAt = time.Time{}
	} else {
		s.detectAt = at.Add(s.detectTime())
	}

	switch {
	case changed || p.Poll:
		// A state change is told at once (it halves the handshake at the 1 s slow rate); a Poll
		// is answered with Final at once (RFC 5880 6.5).
		if changed && !s.canSendPeriodic() && !p.Poll {
			s.nextTx = time.Time{}
			break
		}
		s.transmitReply(now, changed, p.Poll, a)
	case s.nextTx.IsZero() || s.txInterval() < s.scheduledWith:
		// Sending became allowed (passive role, the peer's Required Min RX was 0), or the peer
		// asked for a faster rate: do not wait out a long interval scheduled before.
		if s.canSendPeriodic() {
			next := now.Add(s.jittered(s.txInterval()))
			if s.nextTx.IsZero() || next.Before(s.nextTx) {
				s.nextTx, s.scheduledWith = next, s.txInterval()
			}
		} else {
			s.nextTx = time.Time{}
		}
	case oldMinRx != s.remoteMinRx && !s.canSendPeriodic():
		s.nextTx = time.Time{}
	}
	return DropNone
}

// transmitReply sends the packet a state change or a Poll asks for.
func (s *session) transmitReply(now time.Time, changed, final bool, a *actions) {
	a.send = append(a.send, outPacket{s, s.packet(final)})
	if changed || s.nextTx.IsZero() {
		s.schedule(now)
	}
}

// tick runs the timers that are due at now; the detection time and the grace only if expire.
func (s *session) tick(now time.Time, expire bool, a *actions) {
	if expire {
		s.expire(now, now, a)
	}
	if !s.nextTx.IsZero() && !now.Before(s.nextTx) {
		if s.canSendPeriodic() {
			s.transmit(now, false, a)
		} else {
			s.nextTx = time.Time{}
		}
	}
}

// expire runs the detection time and the grace of a torn-down session if they had run out at at
// (tick: now; a received packet: its arrival). now is the time of the actions it takes.
func (s *session) expire(now, at time.Time, a *actions) {
	if !s.detectAt.IsZero() && !at.Before(s.detectAt) {
		s.detectAt = time.Time{}
		wasUp := s.state == StateUp
		ev := Event{RemoteState: s.remoteState, RemoteDiag: s.remoteDiag}
		// RFC 5880 6.8.1: a detection time without packets forgets the remote session.
		s.remoteDiscr, s.remoteState, s.remoteDemand, s.remoteConfirmed = 0, StateDown, false, false
		if s.cfg.Auth.Type != AuthNone && s.renew != nil {
			// With authentication, the next remote session also gets a new local
			// discriminator, so the dead one's recorded packets cannot be replayed (auth.go).
			s.renew(s)
		}
		firstSeen := s.successorFirst
		if succ := s.takeSuccessor(at); succ != 0 && wasUp && at.Before(firstSeen.Add(s.slowDetect())) {
			// The peer replaced its session without a goodbye: as a replacement (see
			// receive), a failure only if not Up again within a detection time at the slow
			// rate from when the successor first spoke (a grace already over is none: the
			// expiry is a plain failure).
			grace := s.slowDetect()
			s.remoteDiscr, s.remoteConfirmed = succ, false
			ev.Grace, ev.Replaced, ev.ReplacedFrom = grace, true, s.upRemote
			s.setState(now, StateDown, DiagDetectTimeExpired, a, ev)
			s.graceFrom, s.graceUntil = s.upRemote, firstSeen.Add(grace)
			s.transmit(now, false, a)
		} else if s.state == StateInit || s.state == StateUp {
			s.setState(now, StateDown, DiagDetectTimeExpired, a, ev)
			if wasUp {
				s.fail(FailureDetectTimeExpired, a)
			}
			s.transmit(now, false, a)
		} else if !s.canSendPeriodic() {
			s.nextTx = time.Time{}
		}
	}
	if !s.graceUntil.IsZero() && !at.Before(s.graceUntil) {
		s.fail(FailureNotBackUp, a)
		s.graceUntil, s.graceFrom = time.Time{}, 0
	}
}

// takeSuccessor returns the successor remote session if it spoke recently (within a detection
// time at the slow rate: it sends every second while Down), and forgets it; zero if none.
func (s *session) takeSuccessor(at time.Time) uint32 {
	d := s.successor
	if d == 0 || s.successorAt.Before(at.Add(-max(s.detectTime(), s.slowDetect()))) {
		d = 0
	}
	s.successor = 0
	return d
}

// expiring reports whether the detection time or the grace has run out at now.
func (s *session) expiring(now time.Time) bool {
	return !s.detectAt.IsZero() && !now.Before(s.detectAt) || !s.graceUntil.IsZero() && !now.Before(s.graceUntil)
}

// next is the earliest time tick has something to do; zero if nothing.
func (s *session) next() time.Time {
	var t time.Time
	for _, c := range [...]time.Time{s.nextTx, s.detectAt, s.graceUntil} {
		if !c.IsZero() && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	return t
}

// update applies a new configuration for the same peer and local address in place.
func (s *session) update(now time.Time, cfg Config) {
	cfg = cfg.withDefaults()
	old := s.cfg
	s.cfg = cfg
	if cfg.Auth != old.Auth {
		// A new key or type: the peer's sequence numbers under the old one mean nothing.
		s.auth.forget()
	}
	if cfg.Hold && !old.Hold {
		// Back to the state of a new session, silently (no failure: the owner asked for it).
		if s.state != StateDown {
			s.setState(now, StateDown, DiagAdminDown, &actions{}, Event{})
		}
		s.remoteDiscr, s.remoteState, s.remoteDemand, s.remoteMinRx, s.remoteConfirmed = 0, StateDown, false, time.Microsecond, false
		s.detectAt, s.graceUntil, s.graceFrom = time.Time{}, time.Time{}, 0
	}
	s.setIntervals(cfg.DesiredMinTx, cfg.RequiredMinRx)
	if s.state == StateUp && cfg.DetectMult != old.DetectMult {
		// The peer's detection time of us changes with our multiplier: say so in a Poll.
		s.poll = true
	}
	if s.nextTx.IsZero() && s.canSendPeriodic() {
		s.nextTx, s.scheduledWith = now, s.txInterval()
	} else if !s.canSendPeriodic() {
		s.nextTx = time.Time{}
	}
}

// remove starts the session's retirement: AdminDown (RFC 5880 6.8.16), sent a few times so the
// peer does not take the removal for a failure, then deletion.
func (s *session) remove(now time.Time, a *actions) {
	if s.state == StateAdminDown {
		return
	}
	wasUp := s.state == StateUp
	s.graceUntil, s.graceFrom = time.Time{}, 0
	s.detectAt = time.Time{}
	s.setState(now, StateAdminDown, DiagAdminDown, a, Event{RemoteState: s.remoteState})
	s.retire = 1
	if wasUp {
		s.retire = retirePackets
		// Keep the Up rate for the goodbye packets: the peer still expects them that often.
		s.txInUse = min(s.cfg.DesiredMinTx, slowTx)
	}
	if s.remoteDiscr == 0 && s.cfg.Passive || s.remoteMinRx == 0 || s.cfg.Hold {
		s.retired = true
		return
	}
	s.transmit(now, false, a)
}
