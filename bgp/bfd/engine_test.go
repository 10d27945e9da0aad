package bfd

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const ms = time.Millisecond

// sentBetween returns n's packets sent in [from, to).
func sentBetween(n *simNode, from, to time.Duration) []timedPacket {
	var ps []timedPacket
	for _, p := range n.sent {
		if p.at >= from && p.at < to {
			ps = append(ps, p)
		}
	}
	return ps
}

func TestHandshakeAndTimers(t *testing.T) {
	s, a, b := upPair(t)
	if diff := cmp.Diff([]string{"down>init", "init>up"}, a.transitions()); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
	// With both sides telling state changes at once, the handshake takes round trips, not the
	// 1 s slow interval.
	for _, ev := range a.events {
		if ev.To == StateUp && ev.at > 5*ms {
			t.Errorf("up after %v, want a few round trips", ev.at)
		}
	}
	sa := a.session(b)
	if sa.poll || sa.txInterval() != 100*ms || sa.detectTime() != 300*ms {
		t.Errorf("after the Poll Sequence: poll %v, tx %v, detect %v; want false, 100ms, 300ms", sa.poll, sa.txInterval(), sa.detectTime())
	}
	polls, finals := 0, 0
	for _, p := range a.sent {
		if p.Poll && p.Final {
			t.Errorf("packet with both Poll and Final: %+v", p)
		}
		if p.Poll {
			polls++
		}
	}
	for _, p := range b.sent {
		if p.Final {
			finals++
		}
	}
	if polls == 0 || finals == 0 {
		t.Errorf("no Poll Sequence to the Up rate (%d polls from a, %d finals from b)", polls, finals)
	}
	// 10 s at 100 ms with 75-100% jitter: between 100 and 134 packets.
	start := s.elapsed()
	s.run(10 * time.Second)
	if n := len(sentBetween(a, start, s.elapsed())); n < 100 || n > 134 {
		t.Errorf("%d packets in 10s at 100ms, want 100-134", n)
	}
	if len(a.failures())+len(b.failures()) != 0 {
		t.Errorf("failures on a healthy session: %+v %+v", a.failures(), b.failures())
	}
}

func TestSlowRateWhileDown(t *testing.T) {
	s := newSim(t)
	a := s.node("192.0.2.2", 1)
	peer := netip.MustParseAddr("192.0.2.1") // silent
	s.set(a, Config{Peer: peer, DesiredMinTx: 100 * ms, RequiredMinRx: 100 * ms, DetectMult: 3})
	s.run(10 * time.Second)
	if n := len(a.sent); n < 10 || n > 14 {
		t.Errorf("%d packets in 10s while down, want 10-14 (1s, 75-100%% jitter)", n)
	}
	for _, p := range a.sent {
		if p.State != StateDown || p.DesiredMinTx != time.Second || p.RequiredMinRx != 100*ms || p.YourDiscr != 0 {
			t.Fatalf("packet while down: %+v (want Down, Desired Min TX 1s, Required Min RX 100ms, Your Discriminator 0)", p.Packet)
		}
	}
}

func TestJitter(t *testing.T) {
	for _, tc := range []struct {
		mult     uint8
		j        float64
		min, max time.Duration
	}{
		{3, 0, 75 * ms, 75 * ms},
		{3, 0.9999, 99 * ms, 100 * ms},
		{1, 0.9999, 89 * ms, 90 * ms},
	} {
		ss := newSession(Config{Peer: netip.MustParseAddr("192.0.2.1"), DetectMult: tc.mult}, 1, t0, func() float64 { return tc.j })
		if d := ss.jittered(100 * ms); d < tc.min || d > tc.max {
			t.Errorf("mult %d, jitter %v: %v, want %v-%v", tc.mult, tc.j, d, tc.min, tc.max)
		}
	}
}

func TestDetectionTimeExpired(t *testing.T) {
	s, a, b := upPair(t)
	cutAndDetect(t, s, a, b)
	// b hears a's Down from the session it was Up with: the peer signalled the failure.
	fb := b.failures()
	if len(fb) != 1 || fb[0].Failure != FailureRemoteDown {
		t.Errorf("b's failures %+v, want one 'peer signalled down'", fb)
	}
	b.drop = false
	s.run(3 * time.Second)
	if a.session(b).state != StateUp || b.session(a).state != StateUp {
		t.Errorf("not up again after the path came back: a %s, b %s", a.session(b).state, b.session(a).state)
	}
	if len(a.failures()) != 1 || len(b.failures()) != 1 {
		t.Errorf("more failures after recovery: %+v %+v", a.failures(), b.failures())
	}
}

func TestRemoteAdminDownIsNoFailure(t *testing.T) {
	s, a, b := upPair(t)
	s.remove(b, a.addr)
	s.run(5 * time.Second)
	if f := a.failures(); len(f) != 0 {
		t.Errorf("failures after the peer's AdminDown: %+v (RFC 5882 3.2: not a failure)", f)
	}
	if diff := cmp.Diff([]string{"down>init", "init>up", "up>down"}, a.transitions()); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
	if got := len(b.sent) - len(sentBetween(b, 0, 3*time.Second)); got != retirePackets {
		t.Errorf("b sent %d packets after removing an Up session, want %d AdminDown", got, retirePackets)
	}
	if b.session(a) != nil {
		t.Errorf("b's session still exists after retiring")
	}
}

// frrReplace replaces b's session with a is a new one, as FRR's bgpd does when the BGP session
// comes up (bgp_peer_bfd_update_source): the old session is deleted and a new one, with a new
// discriminator, starts in Down. how is what the old session sends on the way out.
func frrReplace(s *sim, a, b *simNode, how string) *session {
	old := b.session(a)
	bye := old.packet(false)
	bye.Diag = DiagNeighborDown
	switch how {
	case "admindown-first":
		bye.State = StateAdminDown
		s.transmit(b, a.addr, bye, 255)
	case "down-first":
		// FRR 8.4 (bfdd ptm-del-session): Down, "neighbor signaled session down".
		bye.State = StateDown
		s.transmit(b, a.addr, bye, 255)
	case "expired-first":
		bye.State, bye.Diag = StateDown, DiagDetectTimeExpired
		s.transmit(b, a.addr, bye, 255)
	}
	b.eng.forget(old)
	s.set(b, old.cfg)
	if how == "admindown-late" {
		// The old session's AdminDown overtakes nothing: it arrives after the new session's
		// first packet.
		s.run(time.Millisecond)
		bye.State = StateAdminDown
		s.transmit(b, a.addr, bye, 255)
	}
	return old
}

func TestRemoteReplacesSession(t *testing.T) {
	for _, tc := range []struct {
		how string
		// failure is what a must report; none for every way FRR does it.
		failure   Failure
		staleDrop bool
		// held: the new session's first packet came while the old one was live, and was held
		// (successor_held) until the old one went away; a silent replacement then waits for
		// the old session's detection time (300 ms here) before the new handshake.
		held  bool
		after time.Duration
	}{
		{how: "silent", held: true, after: 300 * ms},
		{how: "admindown-first"},
		{how: "admindown-late", held: true},
		{how: "down-first"},
		// A Down that says the peer's detection time expired is the peer telling us the path
		// failed, even if a new session follows: reported.
		{how: "expired-first", failure: FailureRemoteDown},
	} {
		t.Run(tc.how, func(t *testing.T) {
			s, a, b := upPair(t)
			at := s.elapsed()
			old := frrReplace(s, a, b, tc.how)
			s.run(10 * time.Second)
			sa := a.session(b)
			if sa.state != StateUp || sa.remoteDiscr == old.localDiscr || sa.remoteDiscr != b.session(a).localDiscr {
				t.Fatalf("a's session: %s, bound to %d (old %d, new %d); want up with the new one",
					sa.state, sa.remoteDiscr, old.localDiscr, b.session(a).localDiscr)
			}
			var fs []Failure
			for _, f := range a.failures() {
				fs = append(fs, f.Failure)
			}
			want := []Failure(nil)
			if tc.failure != FailureNone {
				want = []Failure{tc.failure}
			}
			if !slices.Equal(fs, want) {
				t.Errorf("failures %v, want %v", fs, want)
			}
			for _, ev := range a.events {
				if ev.Kind == EventState && ev.To == StateUp && ev.at > at && ev.at-at > tc.after+10*ms {
					t.Errorf("up again %v after the replacement, want a few round trips after %v", ev.at-at, tc.after)
				}
			}
			if got := a.drops[DropStaleRemote] > 0; got != tc.staleDrop {
				t.Errorf("stale-remote drops %d, want some: %v", a.drops[DropStaleRemote], tc.staleDrop)
			}
			if got := a.drops[DropSuccessorHeld] > 0; got != tc.held {
				t.Errorf("successor-held drops %d, want some: %v", a.drops[DropSuccessorHeld], tc.held)
			}
		})
	}
}

func TestTeardownThatDoesNotComeBack(t *testing.T) {
	for _, how := range []string{"replaced, the new session cannot hear us", "torn down, nothing follows"} {
		t.Run(how, func(t *testing.T) {
			s, a, b := upPair(t)
			at := s.elapsed()
			if how == "torn down, nothing follows" {
				frrReplace(s, a, b, "down-first")
				b.eng.forget(b.session(a))
				b.drop = true
			} else {
				b.deaf = true // the new session stays Down, sending Down every second
				frrReplace(s, a, b, "silent")
			}
			s.run(10 * time.Second)
			fs := a.failures()
			if len(fs) != 1 || fs[0].Failure != FailureNotBackUp {
				t.Fatalf("failures %+v, want one 'not back up'", fs)
			}
			// One detection time at the slow rate: 3 x 1 s.
			if d := fs[0].at - at; d < 2990*ms || d > 3010*ms {
				t.Errorf("reported %v after the teardown, want 3s", d)
			}
		})
	}
}

func TestPollSequenceOnNewTimers(t *testing.T) {
	s, a, b := upPair(t)
	before := len(a.events)
	s.set(a, cfgFor(b, 300*ms, 300*ms, 3))
	sa := a.session(b)
	// Before the Final: keep sending fast, and already expect slower packets.
	if !sa.poll || sa.txInUse != 100*ms || sa.rxInUse != 300*ms {
		t.Errorf("during the Poll Sequence: poll %v, tx %v, rx %v; want true, 100ms, 300ms", sa.poll, sa.txInUse, sa.rxInUse)
	}
	s.run(2 * time.Second)
	if sa.poll || sa.txInterval() != 300*ms {
		t.Errorf("after the Poll Sequence: poll %v, tx %v; want false, 300ms", sa.poll, sa.txInterval())
	}
	sb := b.session(a)
	if sb.txInterval() != 300*ms || sb.detectTime() != 900*ms {
		t.Errorf("peer: tx %v, detect %v; want 300ms, 900ms", sb.txInterval(), sb.detectTime())
	}
	for _, ev := range a.events[before:] {
		if ev.Kind != EventState || ev.From != ev.To {
			t.Errorf("event during a timer change: %+v", ev)
		}
	}
	if sa.state != StateUp || sb.state != StateUp {
		t.Errorf("states %s %s, want up", sa.state, sb.state)
	}
}

func TestPassive(t *testing.T) {
	s := newSim(t)
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	c := cfgFor(b, 100*ms, 100*ms, 3)
	c.Passive = true
	s.set(a, c)
	s.run(5 * time.Second)
	if len(a.sent) != 0 {
		t.Fatalf("passive session sent %d packets before hearing the peer", len(a.sent))
	}
	s.set(b, cfgFor(a, 100*ms, 100*ms, 3))
	s.run(time.Second)
	if a.session(b).state != StateUp {
		t.Errorf("passive session %s after the peer started, want up", a.session(b).state)
	}
}

func TestRemoteDemandStopsPeriodicPackets(t *testing.T) {
	s, a, b := upPair(t)
	b.filter = func(p *Packet) bool {
		if p.State == StateUp {
			p.Demand = true
		}
		return true
	}
	s.run(100 * ms) // b's next packet carries D
	at := s.elapsed()
	s.run(150 * ms) // b's own detection (which this test's b does not suspend) would fire at 300ms
	if n := len(sentBetween(a, at, s.elapsed())); n != 0 {
		t.Errorf("%d periodic packets to a peer in Demand mode", n)
	}
}

func TestDemultiplexDrops(t *testing.T) {
	s, a, b := upPair(t)
	c := netip.MustParseAddr("192.0.2.3")
	s.set(a, Config{Peer: c})
	sa, sc := a.session(b), a.eng.byPeer[c]
	good := b.session(a).packet(false)
	for _, tc := range []struct {
		name string
		src  netip.Addr
		ttl  int
		mod  func(p *Packet)
		want DropReason
	}{
		{"unknown peer", netip.MustParseAddr("192.0.2.99"), 255, nil, DropUnknownPeer},
		{"ttl 254 (not on link)", b.addr, 254, nil, DropTTL},
		{"unknown your discriminator", b.addr, 255, func(p *Packet) { p.YourDiscr = sa.localDiscr + sc.localDiscr + 1 }, DropUnknownDiscr},
		{"your discriminator of another peer's session", b.addr, 255, func(p *Packet) { p.YourDiscr = sc.localDiscr }, DropWrongSource},
		{"zero your discriminator while up", b.addr, 255, func(p *Packet) { p.YourDiscr = 0 }, DropZeroYourDiscr},
		{"another remote session, up", b.addr, 255, func(p *Packet) { p.MyDiscr++ }, DropStaleRemote},
		{"another remote session, admindown", b.addr, 255, func(p *Packet) { p.MyDiscr++; p.State = StateAdminDown }, DropStaleRemote},
		{"another remote session, down, bound to us", b.addr, 255, func(p *Packet) { p.MyDiscr++; p.State = StateDown }, DropStaleRemote},
		{"authentication on a session without", b.addr, 255, func(p *Packet) { p.AuthPresent = true; p.Auth = AuthSection{Type: AuthKeyedSHA1} }, DropAuth},
		{"valid", b.addr, 255, nil, DropNone},
	} {
		p := good
		if tc.mod != nil {
			tc.mod(&p)
		}
		if got := s.inject(a, tc.src, tc.ttl, p); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if sa.state != StateUp || len(a.failures()) != 0 {
		t.Errorf("hostile packets changed the session: %s, failures %+v", sa.state, a.failures())
	}
}

func TestRetireWhenNotUp(t *testing.T) {
	s := newSim(t)
	a := s.node("192.0.2.2", 1)
	peer := netip.MustParseAddr("192.0.2.1")
	s.set(a, Config{Peer: peer})
	s.run(time.Second)
	n := len(a.sent)
	s.remove(a, peer)
	s.run(5 * time.Second)
	if got := len(a.sent) - n; got != 1 || a.sent[len(a.sent)-1].State != StateAdminDown {
		t.Errorf("%d packets after removing a down session, want one AdminDown", got)
	}
	if len(a.eng.byPeer) != 0 || len(a.eng.byDiscr) != 0 {
		t.Errorf("session left behind: %v %v", a.eng.byPeer, a.eng.byDiscr)
	}
}

func TestSetAgainWhileRetiringStartsOver(t *testing.T) {
	s, a, b := upPair(t)
	old := a.session(b).localDiscr
	s.remove(a, b.addr)
	s.set(a, cfgFor(b, 100*ms, 100*ms, 3))
	if sa := a.session(b); sa.state != StateDown || sa.localDiscr == old {
		t.Errorf("re-added session: %s, discriminator %d (old %d); want a new Down session", sa.state, sa.localDiscr, old)
	}
	s.run(3 * time.Second)
	if a.session(b).state != StateUp || len(a.eng.byDiscr) != 1 {
		t.Errorf("re-added session %s, %d discriminators", a.session(b).state, len(a.eng.byDiscr))
	}
}

func TestNewSourceAddressIsNewSession(t *testing.T) {
	s, a, b := upPair(t)
	old := a.session(b).localDiscr
	c := cfgFor(b, 100*ms, 100*ms, 3)
	c.Local = a.addr
	s.set(a, c)
	if a.session(b).localDiscr == old {
		t.Errorf("a new source address kept the session")
	}
	cur := a.session(b).localDiscr
	c.DesiredMinTx = 200 * ms
	s.set(a, c)
	if a.session(b).localDiscr != cur {
		t.Errorf("a timer change replaced the session")
	}
}

func TestHoldUntilStarted(t *testing.T) {
	s := newSim(t)
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	held := cfgFor(b, 100*ms, 100*ms, 3)
	held.Hold = true
	s.set(a, held)
	s.set(b, cfgFor(a, 100*ms, 100*ms, 3))
	s.run(5 * time.Second)
	if len(a.sent) != 0 || a.drops[DropHeld] == 0 || b.session(a).state != StateDown {
		t.Fatalf("held session: sent %d, held drops %d, peer %s; want silence while the peer stays down",
			len(a.sent), a.drops[DropHeld], b.session(a).state)
	}
	at := s.elapsed()
	s.set(a, cfgFor(b, 100*ms, 100*ms, 3))
	s.run(2 * time.Second)
	if a.session(b).state != StateUp {
		t.Fatalf("started session %s, want up", a.session(b).state)
	}
	for _, ev := range a.events {
		if ev.To == StateUp && ev.at-at > 1100*ms {
			t.Errorf("up %v after the start, want within one slow interval of the peer", ev.at-at)
		}
	}
}

// TestStarvedReceiverKeepsSession: a receiver whose packets reach the engine long after they
// arrived (here only when a detection time is about to expire, which is when Server puts the tick
// off for queued datagrams) keeps a healthy session, because the detection time runs from each
// packet's arrival; and it still detects a peer that stopped, on the same schedule as a timely
// receiver.
func TestStarvedReceiverKeepsSession(t *testing.T) {
	s, a, b := upPair(t)
	a.lazy = true
	s.run(10 * time.Second)
	if a.maxLag < 200*ms {
		t.Fatalf("packets reached a's engine at most %v after they arrived: not starved", a.maxLag)
	}
	if f := append(a.failures(), b.failures()...); len(f) != 0 {
		t.Fatalf("failures with a starved receiver and a healthy peer: %+v", f)
	}
	if a.session(b).state != StateUp || b.session(a).state != StateUp {
		t.Fatalf("sessions %s and %s, want up", a.session(b).state, b.session(a).state)
	}

	cutAndDetect(t, s, a, b) // as for a timely receiver
}

// cutAndDetect loses every packet from b to a from now on and checks that a declares one detection
// time expiry, 300ms after the last packet from b, which arrived at most one interval (<=100ms)
// before the cut.
func cutAndDetect(t *testing.T, s *sim, a, b *simNode) {
	t.Helper()
	cut := s.elapsed()
	b.drop = true
	s.run(2 * time.Second)
	fa := a.failures()
	if len(fa) != 1 || fa[0].Failure != FailureDetectTimeExpired {
		t.Fatalf("a's failures %+v, want one detection time expiry", fa)
	}
	if d := fa[0].at - cut; d < 200*ms || d > 301*ms {
		t.Errorf("detected %v after the cut, want 200-300ms", d)
	}
}

// TestLatePacketDoesNotHideExpiry: a packet handed to the engine after the detection time expired
// (our timer ran late) rescues the session only if it arrived before the expiry.
func TestLatePacketDoesNotHideExpiry(t *testing.T) {
	for _, tc := range []struct {
		name    string
		arrival time.Duration // relative to the expiry
		fail    bool
	}{
		{"arrived before the expiry", -10 * ms, false},
		{"arrived after the expiry", 10 * ms, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, a, b := upPair(t)
			sa := a.session(b)
			expiry := sa.detectAt
			out := b.session(a).packet(false)
			p, why := Parse(out.Append(nil))
			if why != DropNone {
				t.Fatalf("parse: %v", why)
			}
			// a gets to the packet 50ms after the expiry, before its timer has run.
			s.now = expiry.Add(50 * ms)
			if why := s.deliverAt(a, expiry.Add(tc.arrival), b.addr, 255, p, DropNone); why != DropNone {
				t.Fatalf("packet dropped: %v", why)
			}
			var act actions
			a.eng.tick(s.now, &act)
			s.apply(a, &act)
			fa := a.failures()
			switch {
			case tc.fail && (len(fa) != 1 || fa[0].Failure != FailureDetectTimeExpired):
				t.Errorf("failures %+v, want one detection time expiry", fa)
			case !tc.fail && len(fa) != 0:
				t.Errorf("failures %+v, want none", fa)
			case !tc.fail && (sa.state != StateUp || sa.detectAt != expiry.Add(tc.arrival).Add(sa.detectTime())):
				t.Errorf("state %s, detection timer %v; want up, %v after the arrival", sa.state, sa.detectAt.Sub(expiry), sa.detectTime())
			}
		})
	}
}

// TestTransmitWhileExpiryHeld: with its detection time expiring held back (Server waiting for
// packets on their way in), a session still sends its periodic packet on time; the expiry comes
// with the next full tick.
func TestTransmitWhileExpiryHeld(t *testing.T) {
	_, a, b := upPair(t)
	sa := a.session(b)
	now := sa.detectAt
	if sa.nextTx.After(now) {
		now = sa.nextTx
	}
	var act actions
	a.eng.transmit(now, &act)
	if len(act.events) != 0 || sa.state != StateUp {
		t.Errorf("events %+v, state %s with the expiry held back; want none, up", act.events, sa.state)
	}
	if len(act.send) != 1 || act.send[0].p.State != StateUp {
		t.Errorf("sent %+v with the expiry held back, want the periodic packet (up)", act.send)
	}
	act = actions{}
	a.eng.tick(now, &act)
	var failures []Failure
	for _, ev := range act.events {
		if ev.Kind == EventFailure {
			failures = append(failures, ev.Failure)
		}
	}
	if sa.state != StateDown || !slices.Equal(failures, []Failure{FailureDetectTimeExpired}) {
		t.Errorf("after the tick: state %s, failures %v; want down, one detection time expiry", sa.state, failures)
	}
}
