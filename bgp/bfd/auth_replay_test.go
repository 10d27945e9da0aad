package bfd

import (
	"net/netip"
	"testing"
	"time"
)

// replayer replays packets a node sent, signed with key, to another node: an on-link attacker
// who recorded them.
type replayer struct {
	s    *sim
	to   *simNode
	from *simNode
	key  string
	recs []Packet
	i    int
}

func (r *replayer) next() DropReason {
	p, why := Parse(r.recs[r.i%len(r.recs)].AppendSigned(nil, r.key))
	r.i++
	return r.s.deliver(r.to, r.from.addr, 255, p, why)
}

// TestAuthReplayedDownDoesNotLockOutPeer: the router runs alone (Down, Your Discriminator zero)
// while an attacker records its packets; vipgate starts and the attacker replays one every 250 ms.
// The first replay must not anchor the receive window (RFC 5880 6.7.3/6.7.4) on its old sequence
// number: the real router's packets, far ahead, were all dropped as out of window and the session
// never came Up. Now a window set by a packet with Your Discriminator zero is tentative, and the
// first packet naming our discriminator sets it.
func TestAuthReplayedDownDoesNotLockOutPeer(t *testing.T) {
	for _, typ := range []AuthType{AuthKeyedSHA1, AuthMeticulousKeyedMD5} {
		t.Run(typ.String(), func(t *testing.T) {
			s := newSim(t)
			a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
			auth := Auth{Type: typ, KeyID: 7, Key: "s3cret-key"}
			cb := cfgFor(a, 100*ms, 100*ms, 3)
			cb.Auth = auth
			s.set(b, cb)
			s.run(60 * time.Second)
			r := &replayer{s: s, to: a, from: b, key: auth.Key}
			for _, f := range b.sent {
				if f.State == StateDown && f.YourDiscr == 0 {
					r.recs = append(r.recs, f.Packet)
				}
			}
			ca := cfgFor(b, 100*ms, 100*ms, 3)
			ca.Auth = auth
			s.set(a, ca)
			r.next()
			for range 240 {
				s.run(250 * ms)
				r.next()
			}
			if sa, sb := a.session(b), b.session(a); sa.state != StateUp || sb.state != StateUp {
				t.Errorf("sessions %s / %s after a minute of replays, want up / up (drops %v)", sa.state, sb.state, a.drops)
			}
			if n := len(a.failures()) + len(b.failures()); n != 0 {
				t.Errorf("%d failures", n)
			}
		})
	}
}

// TestAuthRecordedSessionCannotBringDeadPeerBack: the attacker records everything the router sends during a
// session (handshake included), the router dies, and once the session failed the attacker replays
// the recording in order, one packet per 100 ms. The session must fail and stay down. Before, once the sequence number
// was forgotten (two detection times), the router's recorded Down and Init brought the session
// back Up and its Up packets, in order, kept it there.
func TestAuthRecordedSessionCannotBringDeadPeerBack(t *testing.T) {
	for _, typ := range []AuthType{AuthKeyedMD5, AuthMeticulousKeyedSHA1} {
		t.Run(typ.String(), func(t *testing.T) {
			s, a, b := authPairAfter(t, typ, 30*time.Second)
			r := &replayer{s: s, to: a, from: b, key: "s3cret-key"}
			for _, f := range b.sent {
				r.recs = append(r.recs, f.Packet)
			}
			b.drop = true // the router dies
			s.run(time.Second)
			if len(a.failures()) == 0 {
				t.Fatalf("no failure after the router died")
			}
			upAgain := 0
			for range 600 {
				s.run(100 * ms)
				r.next()
				if a.session(b).state == StateUp {
					upAgain++
				}
			}
			if upAgain > 0 {
				t.Errorf("session Up again for %d of 600 ticks on replayed packets (drops %v)", upAgain, a.drops)
			}
		})
	}
}

// TestAuthRepeatedSeqDoesNotKeepDeadPeerUp: with the plain keyed types a sequence number may repeat
// (RFC 5880 6.7.3), so one recorded Up packet, replayed every 100 ms, reset the detection time of
// a dead router for ever. A repeat is now taken for maxSeqRepeat only.
func TestAuthRepeatedSeqDoesNotKeepDeadPeerUp(t *testing.T) {
	s, a, b := authPairAfter(t, AuthKeyedSHA1, 10*time.Second)
	b.drop = true // the router dies; its last packet is replayed
	r := &replayer{s: s, to: a, from: b, key: "s3cret-key", recs: []Packet{b.sent[len(b.sent)-1].Packet}}
	for range 300 {
		s.run(100 * ms)
		r.next()
	}
	fs := a.failures()
	if len(fs) == 0 {
		t.Fatalf("no failure 30 s after the router died (drops %v)", a.drops)
	}
	t.Logf("failure %v after the router died: %v", fs[0].at-10*time.Second, fs[0].Failure)
}

// TestAuthKeyChangeRenewsDiscriminator: a new key forgets the peer's sequence numbers, so it also
// takes a new local discriminator: packets recorded under the old one (signed with a key that may
// come back) then name a discriminator nobody has.
func TestAuthKeyChangeRenewsDiscriminator(t *testing.T) {
	next := uint32(100)
	e := newEngine(func() uint32 { next++; return next }, func() float64 { return 0.5 })
	var a actions
	cfg := Config{Peer: netip.MustParseAddr("192.0.2.1"), Auth: Auth{Type: AuthKeyedSHA1, KeyID: 1, Key: "old"}}
	s := e.set(t0, cfg, &a)
	old := s.localDiscr
	s.auth.seqKnown, s.auth.confirmed = true, true
	cfg.Auth.Key = "new"
	if e.set(t0, cfg, &a) != s {
		t.Fatal("a key change replaced the session")
	}
	if s.localDiscr == old || e.byDiscr[old] != nil || e.byDiscr[s.localDiscr] != s {
		t.Errorf("discriminator %d -> %d after a key change (old one still mapped: %v)", old, s.localDiscr, e.byDiscr[old] != nil)
	}
	if s.auth.seqKnown || s.auth.confirmed {
		t.Errorf("sequence number still known after a key change")
	}
}

// TestAuthReplayAfterRouterRestartDoesNotLockOutPeer: the attacker recorded the router's Downs
// (Your Discriminator zero) from before a session came up; the router restarts (another
// discriminator, other sequence numbers) and the attacker replays the old Downs every 250 ms.
// Before, the first replay after the window was forgotten anchored it, and the restarted router's
// packets were dropped as out of window for the whole minute.
func TestAuthReplayAfterRouterRestartDoesNotLockOutPeer(t *testing.T) {
	for _, typ := range []AuthType{AuthKeyedSHA1, AuthMeticulousKeyedMD5} {
		t.Run(typ.String(), func(t *testing.T) {
			s := newSim(t)
			a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
			auth := Auth{Type: typ, KeyID: 7, Key: "s3cret-key"}
			ca, cb := cfgFor(b, 100*ms, 100*ms, 3), cfgFor(a, 100*ms, 100*ms, 3)
			ca.Auth, cb.Auth = auth, auth
			s.set(b, cb)
			s.run(5 * time.Second)
			s.set(a, ca)
			s.run(5 * time.Second)
			r := &replayer{s: s, to: a, from: b, key: auth.Key}
			for _, f := range b.sent {
				if f.State == StateDown && f.YourDiscr == 0 {
					r.recs = append(r.recs, f.Packet)
				}
			}
			b.drop = true // the router goes away silently, and starts again 2 s later
			s.run(2 * time.Second)
			delete(b.eng.byPeer, a.addr)
			b.drop = false
			s.set(b, cb)
			up := false
			for k := 0; k < 240 && !up; k++ {
				r.next()
				s.run(250 * ms)
				up = a.session(b).state == StateUp && b.session(a).state == StateUp
			}
			if !up {
				t.Errorf("sessions %s / %s after a minute of replays, want up (drops %v)", a.session(b).state, b.session(a).state, a.drops)
			}
		})
	}
}
