package relay

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Limits bound what the relay lets through, each way.
type Limits struct {
	// Datagrams per second (and Burst at once) handed to conntrackd, and sent to the peer. A
	// full table of conntrackd's HashLimit (262,144 entries, ~15 a datagram) is ~18,000 datagrams.
	Datagrams float64
	Burst     int
	// ResyncEvery is the least time between two resync requests (each one makes the receiver
	// dump its table to the peer) handed to conntrackd, ResyncBurst how many may come at once.
	ResyncEvery time.Duration
	ResyncBurst int
	// Hellos per second sent, in each of three budgets (Burst the same number): the first answers to
	// stale datagrams of an (instance, challenge) never answered before, the repeated answers (at
	// most one a second per pair), and the hellos that move a handshake forward (to a peer whose
	// challenge is not known or not usable yet), which stale datagrams cannot spend.
	Hellos float64
	// RenewEvery is the least time between two renewals of the challenge (another instance of
	// the peer presented it, or the bound instance's datagrams keep failing the window).
	RenewEvery time.Duration
}

// DefaultLimits are the relay's limits: 10,000 datagrams/s with bursts of 20,000 (a full table at
// once), a resync request every 10 s with 2 at once, 10 hellos/s in each budget, a renewal a second.
var DefaultLimits = Limits{Datagrams: 10000, Burst: 20000, ResyncEvery: 10 * time.Second, ResyncBurst: 2, Hellos: 10,
	RenewEvery: time.Second}

// bucket is a token bucket.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newBucket(rate float64, burst int) *bucket {
	return &bucket{rate: rate, burst: float64(max(burst, 1)), tokens: float64(max(burst, 1))}
}

// allow takes a token if there is one.
func (b *bucket) allow(now time.Time) bool {
	if !b.last.IsZero() {
		if d := now.Sub(b.last).Seconds(); d > 0 {
			b.tokens = min(b.burst, b.tokens+d*b.rate)
		}
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// windowSize is how far behind the newest sequence number a datagram may arrive (reordered).
const windowSize = 256

// maxSeqJump is how far ahead of the newest sequence number a datagram may be (datagrams lost on
// the way): a key holder cannot move the window to the end of the sequence space in one step. A
// larger gap (a long outage of the link) is refused, and the channel recovers by a renewal
// (stuckAfter).
const maxSeqJump = 1 << 16

// window remembers which of the last windowSize sequence numbers were seen.
type window struct {
	top  uint64
	bits [windowSize / 64]uint64
}

func (w *window) bit(seq uint64) (*uint64, uint64) {
	i := seq % windowSize
	return &w.bits[i/64], 1 << (i % 64)
}

// accept says whether seq is new, and records it. The first sequence number after a reset may be
// any; later ones at most maxSeqJump ahead.
func (w *window) accept(seq uint64) bool {
	switch {
	case seq > w.top && w.top != 0 && seq-w.top > maxSeqJump:
		return false
	case seq > w.top:
		if seq-w.top >= windowSize {
			w.bits = [windowSize / 64]uint64{}
		} else {
			for s := w.top + 1; s < seq; s++ {
				word, m := w.bit(s)
				*word &^= m
			}
		}
		w.top = seq
	case w.top-seq >= windowSize:
		return false
	default:
		if word, m := w.bit(seq); *word&m != 0 {
			return false
		}
	}
	word, m := w.bit(seq)
	*word |= m
	return true
}

// session is one relay's state: its instance, sequence numbers and challenge, the peer's challenge
// and the peer instance bound to its own, the keys and the budgets. Pure but for the clock and the
// random numbers; the socket loops call it under its lock.
type session struct {
	mu          sync.Mutex
	local, peer netip.Addr
	// send are the keys of local -> peer (send[0] signs), recv those of peer -> local (all verify).
	send, recv keySet

	instance uint64
	seq      uint64
	// chal is what the peer's datagrams must carry (echo); bound is the peer instance that
	// presented it first (0: none yet), win its sequence numbers; taken is when a datagram of it
	// was last taken (or it was bound), refused how many of its datagrams failed the window since.
	chal    uint64
	bound   uint64
	win     window
	taken   time.Time
	refused int
	// peerChal is the peer's challenge, as last heard in a fresh datagram (0: unknown), peerInst
	// the instance that sent it, peerReady whether that challenge is bound to no other instance of
	// this relay (no flagOtherBound): then data can go.
	peerChal, peerInst uint64
	peerReady          bool
	// queue holds conntrackd's datagrams while the handshake is not over (its first ones are the
	// HELLO of FTFW's sequence numbers and the resync request, which FTFW does not resend).
	queue []queued

	// answered is when each (instance, challenge) of a stale datagram was last answered.
	answered map[pairKey]time.Time

	toDaemon, toPeer, resync, renewals *bucket
	// The hello budgets (Limits.Hellos): first answers to a stale pair, repeated ones, handshake.
	firstHellos, staleHellos, progressHellos *bucket

	now  func() time.Time
	rand func() uint64
}

// queued is a conntrackd datagram waiting for the handshake.
type queued struct {
	b  []byte
	at time.Time
}

// The queue's bounds: conntrackd's first datagrams, not a backlog of a peer long gone.
const (
	queueMax = 256
	queueTTL = 5 * time.Second
)

// pairKey is the sender's instance and challenge of a stale datagram: what the answer says is
// known by them (the answer echoes the challenge, to the instance).
type pairKey struct{ instance, chal uint64 }

// The answers to stale datagrams: a recording replayed without end (stale forever) gets one a
// staleEvery per pair, from the repeated answers' budget; the first answer to a pair (a peer's new
// instance or challenge) has a budget of its own, which a recording spends once per pair
// remembered. answeredMax pairs are remembered (a LAN attacker would need that many recorded
// instances and challenges of the peer to get a pair answered as new again).
const (
	staleEvery  = time.Second
	answeredMax = 4096
)

// The bound instance is stuck when none of its datagrams was taken for stuckAfter while at least
// stuckCount of them (with a valid MAC and the current challenge) failed the window: a key holder
// moved the window ahead of the peer's sequence numbers, or the peer's jumped beyond maxSeqJump.
// Then the challenge is renewed (within the renewal budget), and the peer binds again with a fresh
// window. A live peer's conntrackd sends at least once a second (FTFW's ALIVE), so replays of old
// datagrams alone renew nothing while the peer is up.
const (
	stuckAfter = 3 * time.Second
	stuckCount = 4
)

// randomU64 is a non-zero random number.
func randomU64() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract since Go 1.24)
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

func newSession(local, peer netip.Addr, keys [][]byte, l Limits, now func() time.Time, rnd func() uint64) (*session, error) {
	hellos := func() *bucket { return newBucket(l.Hellos, int(max(l.Hellos, 1))) }
	s := &session{local: local, peer: peer, now: now, rand: rnd, answered: map[pairKey]time.Time{},
		toDaemon: newBucket(l.Datagrams, l.Burst), toPeer: newBucket(l.Datagrams, l.Burst),
		resync: newBucket(1/l.ResyncEvery.Seconds(), l.ResyncBurst), renewals: newBucket(1/l.RenewEvery.Seconds(), 1),
		firstHellos: hellos(), staleHellos: hellos(), progressHellos: hellos()}
	if err := s.setKeys(keys); err != nil {
		return nil, err
	}
	s.instance, s.chal = s.rand(), s.rand()
	return s, nil
}

// setKeys replaces the keys (a rotation: the first signs from now on, any verifies).
func (s *session) setKeys(keys [][]byte) error {
	send, err := deriveKeys(keys, s.local, s.peer)
	if err != nil {
		return err
	}
	recv, err := deriveKeys(keys, s.peer, s.local)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.send, s.recv = send, recv
	return nil
}

// helloLocked returns a hello to the peer instance to (0: unknown) that echoes echo, or nil when
// over the budget (nil: a renewal's or a stale answer's, whose budgets were checked).
func (s *session) helloLocked(echo, to uint64, budget *bucket) []byte {
	if budget != nil && !budget.allow(s.now()) {
		return nil
	}
	var flags uint8
	if s.peerChal == 0 {
		flags |= flagNeedChallenge
	}
	if s.bound != 0 && s.bound != to {
		flags |= flagOtherBound
	}
	s.seq++
	return seal(nil, s.send[0], header{kind: kindHello, flags: flags, instance: s.instance, chal: s.chal, echo: echo, seq: s.seq}, nil)
}

// Hello returns a hello to send at start: it asks the peer for its challenge.
func (s *session) Hello() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.helloLocked(s.peerChal, s.peerInst, s.progressHellos)
}

// staleAnswerLocked answers a stale datagram of instance with challenge chal: a hello echoing chal,
// within the stale budgets (pairKey), or nil.
func (s *session) staleAnswerLocked(instance, chal uint64) []byte {
	k, now := pairKey{instance, chal}, s.now()
	last, known := s.answered[k]
	switch {
	case known && now.Sub(last) < staleEvery:
		return nil
	case known && !s.staleHellos.allow(now):
		return nil
	case !known && !s.firstHellos.allow(now):
		return nil
	}
	if !known && len(s.answered) >= answeredMax {
		// Forget the pair answered longest ago (at most Hellos times a second: cheap enough).
		var oldest pairKey
		var at time.Time
		for p, t := range s.answered {
			if at.IsZero() || t.Before(at) {
				oldest, at = p, t
			}
		}
		delete(s.answered, oldest)
	}
	s.answered[k] = now
	return s.helloLocked(chal, instance, nil)
}

// bindLocked binds the peer instance to this relay's challenge (0: none), with a fresh window.
func (s *session) bindLocked(instance uint64) {
	s.bound, s.win, s.taken, s.refused = instance, window{}, s.now(), 0
}

// renewLocked makes a new challenge, bound to no instance, and forgets the peer's (which of the
// peer's instances holds which challenge is not known: the hello sent then asks).
func (s *session) renewLocked() {
	s.chal, s.peerChal, s.peerInst, s.peerReady = s.rand(), 0, 0, false
	s.bindLocked(0)
}

// sealLocked makes conntrackd's datagram p into a datagram to the peer.
func (s *session) sealLocked(p []byte) []byte {
	s.seq++
	return seal(nil, s.send[0], header{kind: kindData, instance: s.instance, chal: s.chal, echo: s.peerChal, seq: s.seq}, p)
}

// flushLocked seals the queued datagrams that are not too old (the handshake is over).
func (s *session) flushLocked() [][]byte {
	var out [][]byte
	now := s.now()
	for _, q := range s.queue {
		if now.Sub(q.at) <= queueTTL && s.toPeer.allow(now) {
			out = append(out, s.sealLocked(q.b))
		}
	}
	s.queue = nil
	return out
}

// fromPeer takes a datagram from the peer's relay. It returns what to hand to conntrackd (nil:
// nothing), what to send to the peer (a hello, the datagrams queued for the handshake) and the
// verdict.
func (s *session) fromPeer(b []byte) (payload []byte, send [][]byte, v Verdict) {
	payload, send, v = s.receive(b)
	return payload, slices.DeleteFunc(send, func(b []byte) bool { return b == nil }), v
}

func (s *session) receive(b []byte) (payload []byte, send [][]byte, v Verdict) {
	h, p, err := parse(b)
	if err != nil {
		return nil, nil, Malformed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !verify(s.recv, b) {
		return nil, nil, BadMAC
	}
	if h.echo != s.chal {
		// Made before this relay's current challenge, or by a peer that has not heard it yet:
		// tell it (the echo of its challenge proves the answer fresh to it).
		return nil, [][]byte{s.staleAnswerLocked(h.instance, h.chal)}, Stale
	}
	switch s.bound {
	case 0:
		s.bindLocked(h.instance)
	case h.instance:
	default:
		// Two instances of the peer presented this challenge: the peer restarted, or an old
		// instance's datagrams are replayed. Which is which cannot be told: renew the challenge, so
		// that only the instance that hears the new one (the live one) can use it.
		if !s.renewals.allow(s.now()) {
			return nil, nil, OtherInstance
		}
		// Which of the two holds which challenge is not known either: ask (the hello says so).
		s.renewLocked()
		return nil, [][]byte{s.helloLocked(h.chal, h.instance, nil)}, OtherInstance
	}
	if !s.win.accept(h.seq) {
		// Replayed, or the window is ahead of the peer (stuckAfter): then renew, so that the peer
		// binds again with a fresh window.
		v = Replayed
		if h.seq > s.win.top {
			v = TooFarAhead
		}
		now := s.now()
		if s.refused++; s.refused >= stuckCount && now.Sub(s.taken) >= stuckAfter && s.renewals.allow(now) {
			s.renewLocked()
			return nil, [][]byte{s.helloLocked(h.chal, h.instance, nil)}, v
		}
		return nil, nil, v
	}
	s.taken, s.refused = s.now(), 0
	s.peerChal, s.peerInst, s.peerReady = h.chal, h.instance, h.flags&flagOtherBound == 0
	switch {
	case !s.peerReady:
		// The peer's challenge is bound to this relay's previous instance: present it in a
		// hello (the peer renews it and says the new one), not in data, which would be lost.
		send = append(send, s.helloLocked(s.peerChal, s.peerInst, s.progressHellos))
	case len(s.queue) > 0:
		send = append(send, s.flushLocked()...)
	}
	if h.kind == kindHello {
		if h.flags&flagNeedChallenge != 0 {
			send = append(send, s.helloLocked(h.chal, h.instance, s.progressHellos))
		}
		return nil, send, Handshake
	}
	_, resync, ok := scanFTFW(p)
	switch {
	case !ok:
		return nil, send, BadPayload
	case !s.toDaemon.allow(s.now()):
		return nil, send, RateLimited
	case resync && !s.resync.allow(s.now()):
		return nil, send, ResyncLimited
	}
	return p, send, Forwarded
}

// fromDaemon takes a datagram from conntrackd and returns the relay datagram to send to the peer
// (nil: nothing; a hello while the handshake is not over, the datagram then queued) and the
// verdict.
func (s *session) fromDaemon(p []byte) ([]byte, Verdict) {
	if len(p) == 0 || len(p) > MaxPayload {
		return nil, Malformed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerChal == 0 || !s.peerReady {
		v := Queued
		if len(s.queue) < queueMax {
			s.queue = append(s.queue, queued{b: bytes.Clone(p), at: s.now()})
		} else {
			v = QueueFull
		}
		return s.helloLocked(s.peerChal, s.peerInst, s.progressHellos), v
	}
	if !s.toPeer.allow(s.now()) {
		return nil, RateLimited
	}
	return s.sealLocked(p), Forwarded
}
