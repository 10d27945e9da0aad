package bfd

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Options configure a Server.
type Options struct {
	Logger hclog.Logger
	// OnEvent receives every Event, in order, on the server's goroutine: it must not block.
	OnEvent func(Event)
	// Port and MultihopPort replace 3784 and 4784 as the ports we listen on and send to (tests).
	Port, MultihopPort int
}

// SessionStatus is a snapshot of one session.
type SessionStatus struct {
	Peer, Local             netip.Addr
	Multihop                bool
	State, RemoteState      State
	Diag, RemoteDiag        Diag
	LocalDiscr, RemoteDiscr uint32
	// TxInterval is the current transmit interval before jitter, DetectTime the time without a
	// packet after which the session goes down.
	TxInterval, DetectTime time.Duration
	// Transitions counts the entries into each state (indexed by State) since the session was
	// created; Failures the failures reported to the client.
	Transitions [4]uint64
	Failures    uint64
	// Auth is the session's authentication type; RcvAuthSeq the last sequence number received
	// from the peer, while AuthSeqKnown (RFC 5880 6.8.1).
	Auth         AuthType
	AuthSeqKnown bool
	RcvAuthSeq   uint32
}

// Server runs BFD sessions over UDP: one goroutine owns every session (the engine) and the sending
// sockets; one reader goroutine per listening socket drops what is not for a configured peer or
// has the wrong TTL before it reaches that goroutine. Listening sockets are opened when the first
// session of their family and hop mode is set, so a speaker without BFD peers binds nothing.
type Server struct {
	log     hclog.Logger
	onEvent func(Event)
	port    [2]int // [multihop]

	reqs chan func()
	rx   chan received
	quit chan struct{}
	done chan struct{}
	once sync.Once

	drops dropCounters
	// pending counts the datagrams the readers have taken from a socket and the loop has not
	// yet received from rx (those dropped by a reader are uncounted at once). A datagram is in
	// neither the socket nor pending only between the read's return and the count; a loop that
	// looks just then ticks as it would without looking.
	pending atomic.Int64
	// peers is the readers' filter: the set of peer addresses (value: multi-hop), replaced
	// (never modified) by the loop.
	peers atomic.Pointer[map[netip.Addr]bool]

	// Owned by the loop goroutine.
	eng       *engine
	listeners map[listenKey]*listener
	senders   map[*session]*sender
	readers   sync.WaitGroup
	buf       []byte
	// lastWarn rate-limits warnings by topic.
	lastWarn map[string]time.Time
	// gen is the engine generation the sockets and the readers' filter were last made for.
	gen uint64
	// deferUntil is when a tick put off for packets still on their way in (see deferStep) runs
	// whatever the sockets hold, deferredAt when it was last put off; both zero when no detection
	// time or grace is expiring.
	deferUntil, deferredAt time.Time
	// noStamps is set once listen reported that a socket gets no receive timestamps.
	noStamps bool

	hooks testHooks
}

// testHooks let tests stand in for the scheduler: beforeRead runs in a reader before each read,
// onDefer in the loop when it puts a tick off at now, with the deadline of the deferral. Both nil
// outside tests.
type testHooks struct {
	beforeRead func()
	onDefer    func(now, until time.Time)
}

// A tick that would expire a detection time while datagrams are queued on a listening socket, or
// read but not yet handed to the loop, holds the expiry back for deferStep so the readers can catch
// up (when our process was not scheduled for a while, the Go runtime runs the expired timer before
// it polls the sockets, so the loop would otherwise act first); the transmissions due run on time.
// Packets count from their arrival, so this only delays the report of a failure, by at most
// maxDefer from the first time it was held back, however much a sender keeps the sockets busy
// (multi-hop packets have no TTL to check: anyone can send them).
const (
	deferStep = time.Millisecond
	maxDefer  = 5 * time.Millisecond
)

type listenKey struct{ v6, multihop bool }

type listener struct {
	conn    *net.UDPConn
	retryAt time.Time // when conn is nil: next attempt
}

type sender struct {
	conn    *net.UDPConn
	dst     netip.AddrPort
	retryAt time.Time
}

type received struct {
	// at is when the datagram arrived (arrival).
	at       time.Time
	src      netip.Addr
	ttl      int
	multihop bool
	p        Packet
}

// New starts a Server with no sessions.
func New(opts Options) *Server { return newServer(opts, testHooks{}) }

func newServer(opts Options, hooks testHooks) *Server {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.OnEvent == nil {
		opts.OnEvent = func(Event) {}
	}
	if opts.Port == 0 {
		opts.Port = SingleHopPort
	}
	if opts.MultihopPort == 0 {
		opts.MultihopPort = MultihopPort
	}
	s := &Server{
		log:       opts.Logger,
		onEvent:   opts.OnEvent,
		port:      [2]int{opts.Port, opts.MultihopPort},
		reqs:      make(chan func()),
		rx:        make(chan received, 64),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		eng:       newEngine(randomDiscr, rand.Float64),
		listeners: map[listenKey]*listener{},
		senders:   map[*session]*sender{},
		lastWarn:  map[string]time.Time{},
		hooks:     hooks,
	}
	s.peers.Store(&map[netip.Addr]bool{})
	s.gen = ^uint64(0)
	go s.loop()
	return s
}

func randomDiscr() uint32 { return rand.Uint32() }

// ErrClosed is returned by calls on a closed Server.
var ErrClosed = errors.New("BFD server closed")

// do runs f on the loop goroutine and waits for it.
func (s *Server) do(f func()) error {
	ran := make(chan struct{})
	select {
	case s.reqs <- func() { f(); close(ran) }:
	case <-s.done:
		return ErrClosed
	}
	<-ran
	return nil
}

// Validate checks a Config: a unicast peer, a source of the same family, intervals that fit the
// wire format (microseconds in 32 bits).
func Validate(c Config) error {
	switch {
	case !c.Peer.IsValid() || c.Peer.IsUnspecified() || c.Peer.IsMulticast() || c.Peer.Is4In6():
		return fmt.Errorf("invalid BFD peer %q", c.Peer)
	case c.Local.IsValid() && c.Local.Is4() != c.Peer.Is4():
		return fmt.Errorf("BFD source %s and peer %s are of different families", c.Local, c.Peer)
	case c.DesiredMinTx < 0 || c.RequiredMinRx < 0:
		return errors.New("negative BFD interval")
	case c.DesiredMinTx > time.Hour || c.RequiredMinRx > time.Hour:
		return errors.New("BFD interval above 1h")
	case c.DesiredMinTx != 0 && c.DesiredMinTx < time.Millisecond || c.RequiredMinRx != 0 && c.RequiredMinRx < time.Millisecond:
		return errors.New("BFD interval below 1ms")
	case c.MaxDetectTime < 0 || c.MaxDetectTime > time.Hour:
		return errors.New("BFD maximum detection time negative or above 1h")
	}
	if err := c.Auth.Validate(); err != nil {
		return err
	}
	return nil
}

// Set creates the session for cfg.Peer, or updates it in place: new intervals go through a Poll
// Sequence without taking the session down. A new source address or hop mode replaces it.
func (s *Server) Set(cfg Config) error {
	if err := Validate(cfg); err != nil {
		return err
	}
	return s.do(func() {
		var a actions
		now := time.Now()
		s.eng.set(now, cfg, &a)
		s.flush(now, &a)
	})
}

// Remove retires the session of peer: it sends AdminDown (so the peer does not report a failure
// to its client) and goes away.
func (s *Server) Remove(peer netip.Addr) error {
	return s.do(func() {
		var a actions
		now := time.Now()
		s.eng.remove(now, peer, &a)
		s.flush(now, &a)
	})
}

// Status returns every session, sorted by peer (nil once closed). It asks the server's goroutine:
// never call it from OnEvent.
func (s *Server) Status() []SessionStatus {
	var out []SessionStatus
	_ = s.do(func() {
		out = make([]SessionStatus, 0, len(s.eng.byPeer))
		for _, ss := range s.eng.byPeer {
			out = append(out, ss.status())
		}
	})
	slices.SortFunc(out, func(a, b SessionStatus) int { return a.Peer.Compare(b.Peer) })
	return out
}

// Session returns the session of peer. Like Status, never call it from OnEvent.
func (s *Server) Session(peer netip.Addr) (st SessionStatus, ok bool) {
	_ = s.do(func() {
		var ss *session
		if ss, ok = s.eng.byPeer[peer.WithZone("")]; ok {
			st = ss.status()
		}
	})
	return st, ok
}

func (ss *session) status() SessionStatus {
	return SessionStatus{
		Peer: ss.cfg.Peer, Local: ss.cfg.Local, Multihop: ss.cfg.Multihop,
		State: ss.state, RemoteState: ss.remoteState, Diag: ss.diag, RemoteDiag: ss.remoteDiag,
		LocalDiscr: ss.localDiscr, RemoteDiscr: ss.remoteDiscr,
		TxInterval: ss.txInterval(), DetectTime: ss.detectTime(),
		Transitions: ss.transitions, Failures: ss.failures,
		Auth: ss.cfg.Auth.Type, AuthSeqKnown: ss.auth.seqKnown, RcvAuthSeq: ss.auth.rcvSeq,
	}
}

// Drops returns how many received datagrams were dropped, by reason.
func (s *Server) Drops() map[DropReason]uint64 {
	m := make(map[DropReason]uint64, numDropReasons)
	for _, r := range DropReasons() {
		m[r] = s.drops[r].Load()
	}
	return m
}

// Close sends AdminDown on every session, so peers take it as BFD being turned off rather than a
// failure (RFC 5882 section 3.2), then closes every socket. Safe to call twice.
func (s *Server) Close() {
	s.once.Do(func() {
		_ = s.do(func() {
			var a actions
			now := time.Now()
			for _, peer := range slices.Collect(maps.Keys(s.eng.byPeer)) {
				s.eng.remove(now, peer, &a)
			}
			s.flush(now, &a)
		})
		close(s.quit)
		<-s.done
	})
}

func (s *Server) loop() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var a actions
		select {
		case <-s.quit:
			s.shutdown()
			return
		case f := <-s.reqs:
			f()
		case r := <-s.rx:
			now := time.Now()
			s.receive(now, r, &a)
			s.flush(now, &a)
		case <-timer.C:
			// Packets that arrived before the timer fired count first: when this goroutine
			// was not scheduled for a while, both are ready, and a detection time must not
			// expire with the peer's packets waiting in the queue.
			now := time.Now()
			for drained := false; !drained; {
				select {
				case r := <-s.rx:
					s.receive(now, r, &a)
				default:
					drained = true
				}
			}
			if s.eng.expiring(now) && (s.deferUntil.IsZero() || now.Before(s.deferUntil)) && s.backlog() {
				if s.deferUntil.IsZero() {
					s.deferUntil = now.Add(maxDefer)
				}
				s.deferredAt = now
				s.eng.transmit(now, &a)
				s.flush(now, &a)
				if s.hooks.onDefer != nil {
					s.hooks.onDefer(now, s.deferUntil)
				}
			} else {
				s.eng.tick(now, &a)
				s.flush(now, &a)
			}
		}
		if !s.deferUntil.IsZero() && !s.eng.expiring(time.Now()) {
			// Expired, or rescued by a packet that arrived in time: the next expiry gets
			// its own deadline.
			s.deferUntil, s.deferredAt = time.Time{}, time.Time{}
		}
		if next := s.nextWakeup(); next.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(time.Until(next))
		}
	}
}

func (s *Server) receive(now time.Time, r received, a *actions) {
	s.pending.Add(-1)
	// The reader took its time after our now: the packet arrived no later than we handle it.
	if r.at.After(now) {
		r.at = now
	}
	if why := s.eng.receive(now, r.at, r.src, r.ttl, r.multihop, r.p, a); why != DropNone {
		s.drops.add(why)
		s.warnf("drop/"+why.String(), "dropped a BFD packet", "peer", r.src, "reason", why,
			"state", r.p.State, "diag", r.p.Diag, "my_discriminator", r.p.MyDiscr, "your_discriminator", r.p.YourDiscr)
	}
}

// backlog reports whether datagrams are on their way to the loop: queued on a listening socket,
// or taken by a reader and not yet received. The sockets are looked at first: a datagram read
// between the two looks is then counted in pending.
func (s *Server) backlog() bool {
	for _, l := range s.listeners {
		if l.conn != nil && queued(l.conn) {
			return true
		}
	}
	return s.pending.Load() > 0
}

// nextWakeup is the earliest engine timer or socket retry; while an expiry is held back, no
// earlier than a deferStep after it last was (the engine's timer for it has passed).
func (s *Server) nextWakeup() time.Time {
	t := s.eng.next()
	if !s.deferredAt.IsZero() {
		if step := s.deferredAt.Add(deferStep); t.IsZero() || t.Before(step) {
			t = step
		}
	}
	earlier := func(c time.Time) {
		if !c.IsZero() && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	for _, l := range s.listeners {
		if l.conn == nil {
			earlier(l.retryAt)
		}
	}
	return t
}

// flush sends what the engine asked for, reports its events, and brings the sockets and the
// readers' filter in line with the sessions.
func (s *Server) flush(now time.Time, a *actions) {
	for _, o := range a.send {
		s.send(now, o)
	}
	for _, ev := range a.events {
		s.onEvent(ev)
	}
	s.reconcile(now)
}

func (s *Server) send(now time.Time, o outPacket) {
	snd := s.senders[o.s]
	if snd == nil {
		port := s.port[0]
		if o.s.cfg.Multihop {
			port = s.port[1]
		}
		snd = &sender{dst: netip.AddrPortFrom(o.s.cfg.Peer, uint16(port))}
		s.senders[o.s] = snd
	}
	if snd.conn == nil {
		if now.Before(snd.retryAt) {
			return
		}
		conn, err := dial(o.s.cfg.Peer, o.s.cfg.Local)
		if err != nil {
			snd.retryAt = now.Add(time.Second)
			s.warnf("dial/"+o.s.cfg.Peer.String(), "cannot open the BFD socket for a peer (retrying)", "peer", o.s.cfg.Peer, "err", err)
			return
		}
		snd.conn = conn
	}
	if o.p.AuthPresent {
		s.buf = o.p.AppendSigned(s.buf[:0], o.s.cfg.Auth.Key)
	} else {
		s.buf = o.p.Append(s.buf[:0])
	}
	if _, err := snd.conn.WriteToUDPAddrPort(s.buf, snd.dst); err != nil {
		s.warnf("send/"+o.s.cfg.Peer.String(), "sending a BFD packet", "peer", o.s.cfg.Peer, "err", err)
	}
}

// reconcile closes the sockets of sessions the engine forgot, opens the listening sockets the
// sessions need, and publishes the peer set, when sessions came or went since the last time (or a
// listening socket is to be retried): not per packet.
func (s *Server) reconcile(now time.Time) {
	retry := false
	for _, l := range s.listeners {
		retry = retry || l.conn == nil && !now.Before(l.retryAt)
	}
	if s.gen == s.eng.gen && !retry {
		return
	}
	s.gen = s.eng.gen
	for ss, snd := range s.senders {
		if s.eng.byPeer[ss.cfg.Peer] != ss {
			if snd.conn != nil {
				snd.conn.Close()
			}
			delete(s.senders, ss)
		}
	}
	need := map[listenKey]bool{}
	peers := make(map[netip.Addr]bool, len(s.eng.byPeer))
	for addr, ss := range s.eng.byPeer {
		if !ss.cfg.Hold {
			// A held session needs no socket yet: nothing is bound before BFD runs.
			need[listenKey{v6: addr.Is6(), multihop: ss.cfg.Multihop}] = true
		}
		peers[addr] = ss.cfg.Multihop
	}
	if !maps.Equal(peers, *s.peers.Load()) {
		s.peers.Store(&peers)
	}
	for k := range need {
		l := s.listeners[k]
		if l == nil {
			l = &listener{}
			s.listeners[k] = l
		}
		if l.conn != nil || now.Before(l.retryAt) {
			continue
		}
		port := s.port[0]
		if k.multihop {
			port = s.port[1]
		}
		opened := time.Now()
		conn, noStamps, err := listen(k.v6, port)
		if err != nil {
			l.retryAt = now.Add(5 * time.Second)
			s.log.Error("cannot listen for BFD packets (retrying every 5s)", "port", port, "ipv6", k.v6, "err", err)
			continue
		}
		if noStamps != nil && !s.noStamps {
			s.noStamps = true
			s.log.Debug("no kernel receive timestamps on a BFD socket: its packets count from when they are read", "port", port, "ipv6", k.v6, "err", noStamps)
		}
		l.conn = conn
		s.readers.Add(1)
		go s.read(conn, k.multihop, opened)
	}
}

// read receives datagrams on one listening socket until it is closed. It drops, at constant cost,
// what is not from a configured peer, has no or (single hop) the wrong TTL, or is malformed; the
// loop sees only well-formed packets from peers, each with its arrival time (no earlier than
// opened, before the socket was).
func (s *Server) read(conn *net.UDPConn, multihop bool, opened time.Time) {
	defer s.readers.Done()
	buf := make([]byte, readBuffer)
	oob := make([]byte, oobBuffer)
	dates := arrivals{last: opened, prev: opened}
	for {
		if s.hooks.beforeRead != nil {
			s.hooks.beforeRead()
		}
		n, oobn, flags, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.pending.Add(1)
		at := dates.at(oob[:oobn], time.Now())
		src := from.Addr().Unmap().WithZone("")
		hops, ok := hopLimit(oob[:oobn])
		peerMultihop, isPeer := (*s.peers.Load())[src]
		var why DropReason
		switch {
		case flags&unix.MSG_TRUNC != 0:
			why = DropTruncated
		case !ok || !multihop && hops != ttl:
			why = DropTTL
		case !isPeer || peerMultihop != multihop:
			why = DropUnknownPeer
		}
		if why != DropNone {
			s.drops.add(why)
			s.pending.Add(-1)
			continue
		}
		p, why := Parse(buf[:n])
		if why != DropNone {
			s.drops.add(why)
			s.pending.Add(-1)
			continue
		}
		select {
		case s.rx <- received{at: at, src: src, ttl: hops, multihop: multihop, p: p}:
		case <-s.quit:
			return
		}
	}
}

// shutdown closes every socket and waits for the readers.
func (s *Server) shutdown() {
	for _, l := range s.listeners {
		if l.conn != nil {
			l.conn.Close()
		}
	}
	for _, snd := range s.senders {
		if snd.conn != nil {
			snd.conn.Close()
		}
	}
	s.readers.Wait()
}

// warnf logs at most once per 10 s per topic: drops and send errors can come at the packet rate.
func (s *Server) warnf(topic, msg string, args ...any) {
	now := time.Now()
	if last, ok := s.lastWarn[topic]; ok && now.Sub(last) < 10*time.Second {
		return
	}
	s.lastWarn[topic] = now
	if len(s.lastWarn) > 1024 {
		clear(s.lastWarn)
	}
	if strings.HasPrefix(topic, "drop/") {
		s.log.Debug(msg, args...)
		return
	}
	s.log.Warn(msg, args...)
}
