package bfd

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"testing"
	"time"
)

// maxTimers is a forged packet's worst: the largest Detect Mult and intervals the wire can carry.
func maxTimers(p *Packet) {
	p.DetectMult = 255
	p.DesiredMinTx = maxWireInterval
	p.RequiredMinRx = maxWireInterval
}

// TestForgedTimersDoNotHideADeadPeer: one packet with the peer's discriminators claiming the
// largest timers (255 x 2^32-1 us: 12.7 days of detection time), then the peer falls silent. The
// session goes Down, with a failure, within the bound (5 s by default for a 100 ms x 3 profile),
// and no forged interval slows our transmissions beyond it. Before the bound, the session stayed Up.
func TestForgedTimersDoNotHideADeadPeer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bound time.Duration
		cfg   func(c *Config)
	}{
		{"default bound", DefaultMaxDetectTime, nil},
		{"configured bound", 2 * time.Second, func(c *Config) { c.MaxDetectTime = 2 * time.Second }},
		// A profile slower than the bound keeps its own detection time: 2 s x 3.
		{"slow profile", 6 * time.Second, func(c *Config) { c.RequiredMinRx = 2 * time.Second; c.MaxDetectTime = time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
			ca := cfgFor(b, 100*ms, 100*ms, 3)
			if tc.cfg != nil {
				tc.cfg(&ca)
			}
			s.set(a, ca)
			s.set(b, cfgFor(a, 100*ms, 100*ms, 3))
			s.run(3 * time.Second)
			sa := a.session(b)
			if sa.state != StateUp {
				t.Fatalf("session %s, want up", sa.state)
			}
			forged := b.session(a).packet(false)
			maxTimers(&forged)
			if why := s.inject(a, b.addr, 255, forged); why != DropNone {
				t.Fatalf("forged packet dropped (%v): the test needs it accepted, as an unauthenticated session must", why)
			}
			if d := sa.detectTime(); d > tc.bound {
				t.Errorf("detection time after the forged packet %v, want at most %v", d, tc.bound)
			}
			if tx := sa.txInterval(); tx > tc.bound {
				t.Errorf("transmit interval after the forged packet %v, want at most %v", tx, tc.bound)
			}
			b.drop = true // the peer dies
			died := s.elapsed()
			s.run(tc.bound + time.Second)
			fs := a.failures()
			if sa.state != StateDown || len(fs) != 1 || fs[0].Failure != FailureDetectTimeExpired {
				t.Fatalf("%v after the peer died: session %s, failures %+v; want down with one detection failure", s.elapsed()-died, sa.state, fs)
			}
			if took := fs[0].at - died; took > tc.bound {
				t.Errorf("failure reported %v after the peer's last packet, want within the bound %v", took, tc.bound)
			}
		})
	}
}

// TestForgedTeardownGraceBounded: a forged "neighbor signaled session down" with the largest
// timers gives the session the grace of a torn-down session; that grace is bounded too, so a
// peer that is really gone is reported as a failure.
func TestForgedTeardownGraceBounded(t *testing.T) {
	s, a, b := upPair(t)
	p := b.session(a).packet(false)
	maxTimers(&p)
	p.State, p.Diag = StateDown, DiagNeighborDown
	b.drop = true
	if why := s.inject(a, b.addr, 255, p); why != DropNone {
		t.Fatalf("forged teardown dropped: %v", why)
	}
	s.run(DefaultMaxDetectTime + time.Second)
	if fs := a.failures(); len(fs) != 1 {
		t.Fatalf("failures %+v after a teardown with the largest timers and a silent peer, want one", fs)
	}
}

func authPair(t *testing.T, typ AuthType) (*sim, *simNode, *simNode) {
	t.Helper()
	return authPairAfter(t, typ, 3*time.Second)
}

// authPairAfter is authPair run for settle before the sessions must be Up (a longer run records
// more of the router's packets).
func authPairAfter(t *testing.T, typ AuthType, settle time.Duration) (*sim, *simNode, *simNode) {
	t.Helper()
	s := newSim(t)
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	ca, cb := cfgFor(b, 100*ms, 100*ms, 3), cfgFor(a, 100*ms, 100*ms, 3)
	ca.Auth = Auth{Type: typ, KeyID: 7, Key: "s3cret-key"}
	cb.Auth = ca.Auth
	s.set(a, ca)
	s.set(b, cb)
	s.run(settle)
	if sa, sb := a.session(b), b.session(a); sa.state != StateUp || sb.state != StateUp {
		t.Fatalf("%s: sessions %s and %s after %s, want up", typ, sa.state, sb.state, settle)
	}
	return s, a, b
}

// TestAuthUpAndForgeriesDropped: with each keyed type both sides come Up, and what an attacker on
// the link can send without the key is dropped, counted under its reason, and changes nothing:
// no authentication, another type, a wrong key ID, a wrong key, a replayed packet.
func TestAuthUpAndForgeriesDropped(t *testing.T) {
	for _, typ := range []AuthType{AuthKeyedMD5, AuthMeticulousKeyedMD5, AuthKeyedSHA1, AuthMeticulousKeyedSHA1} {
		t.Run(typ.String(), func(t *testing.T) {
			s, a, b := authPair(t, typ)
			sa := a.session(b)
			// An old packet of b's, as recorded on the link (signed, sequence number passed).
			var old []byte
			for _, f := range b.sent {
				if f.State == StateUp && !f.Poll && !f.Final {
					old = f.AppendSigned(nil, "s3cret-key")
					break
				}
			}
			down := b.session(a).packet(false)
			down.State, down.Diag = StateDown, DiagPathDown
			other := AuthKeyedSHA1
			if typ == AuthKeyedSHA1 {
				other = AuthMeticulousKeyedSHA1
			}
			cases := []struct {
				name string
				b    []byte
				want DropReason
			}{
				{"no authentication", func() []byte { p := down; p.AuthPresent = false; return p.Append(nil) }(), DropAuth},
				{"another type", func() []byte { p := down; p.Auth.Type = other; return p.AppendSigned(nil, "s3cret-key") }(), DropAuth},
				{"wrong key id", func() []byte { p := down; p.Auth.KeyID = 8; return p.AppendSigned(nil, "s3cret-key") }(), DropAuthKeyID},
				{"wrong key", down.AppendSigned(nil, "guessed"), DropAuthDigest},
				{"right key, changed on the way", func() []byte {
					b := down.AppendSigned(nil, "s3cret-key")
					b[0] = b[0]&^0x1f | byte(DiagNeighborDown)
					return b
				}(), DropAuthDigest},
				{"replayed", old, DropAuthSeq},
			}
			for _, c := range cases {
				p, why := Parse(c.b)
				if why != DropNone {
					t.Fatalf("%s: parse: %v", c.name, why)
				}
				if got := s.deliver(a, b.addr, 255, p, why); got != c.want {
					t.Errorf("%s: %v, want %v", c.name, got, c.want)
				}
			}
			s.run(time.Second)
			if sa.state != StateUp || len(a.failures()) != 0 {
				t.Errorf("forged packets changed the session: %s, failures %+v", sa.state, a.failures())
			}
		})
	}
}

// TestAuthReplayCannotKeepDeadPeerUp: the peer dies and an attacker keeps replaying its recorded
// Up packets, with the right discriminators: with meticulous authentication every one of them is
// dropped (sequence number not above the last) and the session fails within the detection time.
// Plain keyed authentication accepts a repeated sequence number (RFC 5880 6.7.3/6.7.4), for
// maxSeqRepeat only (TestAuthRepeatedSeqDoesNotKeepDeadPeerUp): the meticulous types are still the
// better choice against that attacker.
func TestAuthReplayCannotKeepDeadPeerUp(t *testing.T) {
	for _, typ := range []AuthType{AuthMeticulousKeyedMD5, AuthMeticulousKeyedSHA1} {
		t.Run(typ.String(), func(t *testing.T) {
			s, a, b := authPair(t, typ)
			sa := a.session(b)
			b.drop = true
			var recorded [][]byte
			for _, f := range b.sent {
				recorded = append(recorded, f.AppendSigned(nil, "s3cret-key"))
			}
			died := s.elapsed()
			s.run(ms) // deliver what b had sent: from now on the link holds only replays
			// The replays, newest first (the best chance of the window), every 20 ms for 2 s.
			for i := 0; i < 100 && sa.state == StateUp; i++ {
				r := recorded[len(recorded)-1-i%len(recorded)]
				p, why := Parse(r)
				if why != DropNone {
					t.Fatal(why)
				}
				if why := s.deliver(a, b.addr, 255, p, why); why != DropAuthSeq {
					t.Fatalf("replay %d: %v, want %v", i, why, DropAuthSeq)
				}
				s.run(20 * ms)
			}
			fs := a.failures()
			if sa.state != StateDown || len(fs) != 1 || fs[0].Failure != FailureDetectTimeExpired {
				t.Fatalf("session %s, failures %+v while the dead peer's packets are replayed; want down", sa.state, fs)
			}
			if took := fs[0].at - died; took > sa.cfg.MaxDetectTime {
				t.Errorf("failure %v after the peer died", took)
			}
		})
	}
}

// TestAuthSequenceWindow checks the receive window of RFC 5880 6.7.3/6.7.4 and its reset after two
// detection times without an authenticated packet (6.8.1), so a restarted peer is taken back.
func TestAuthSequenceWindow(t *testing.T) {
	at := t0
	pkt := func(typ AuthType, seq uint32) Packet {
		p := Packet{State: StateUp, DetectMult: 3, MyDiscr: 1, YourDiscr: 2, AuthPresent: true,
			Auth: AuthSection{Type: typ, KeyID: 1, Seq: seq}}
		q, why := Parse(p.AppendSigned(nil, "k"))
		if why != DropNone {
			t.Fatal(why)
		}
		return q
	}
	for _, tc := range []struct {
		typ  AuthType
		seqs []uint32
		want []DropReason
	}{
		{AuthKeyedSHA1, []uint32{1 << 31, 1 << 31, 1<<31 + 9, 1<<31 + 19, 1<<31 + 8}, []DropReason{DropNone, DropNone, DropNone, DropAuthSeq, DropAuthSeq}},
		{AuthMeticulousKeyedSHA1, []uint32{1<<32 - 2, 1<<32 - 2, 1<<32 - 1, 0, 10, 9}, []DropReason{DropNone, DropAuthSeq, DropNone, DropNone, DropAuthSeq, DropNone}},
	} {
		var st authState
		auth := Auth{Type: tc.typ, KeyID: 1, Key: "k"}
		for i, seq := range tc.seqs {
			p := pkt(tc.typ, seq)
			if got := st.authenticate(at, auth, time.Second, true, &p); got != tc.want[i] {
				t.Errorf("%s: packet %d (seq %d): %v, want %v", tc.typ, i, seq, got, tc.want[i])
			}
		}
		// Two detection times later any sequence number is taken again (a restarted peer).
		p := pkt(tc.typ, 12345)
		if got := st.authenticate(at.Add(2*time.Second-1), auth, time.Second, true, &p); got != DropAuthSeq {
			t.Errorf("%s: before two detection times: %v", tc.typ, got)
		}
		if got := st.authenticate(at.Add(2*time.Second), auth, time.Second, true, &p); got != DropNone {
			t.Errorf("%s: after two detection times: %v", tc.typ, got)
		}
	}
}

// TestAuthWireFormat pins the Authentication Section against RFC 5880 4.3/4.4 computed by hand:
// the digest is the hash of the packet with the zero-padded key in the digest field.
func TestAuthWireFormat(t *testing.T) {
	p := Packet{State: StateUp, DetectMult: 3, MyDiscr: 0x01020304, YourDiscr: 0x05060708, DesiredMinTx: time.Second,
		RequiredMinRx: time.Second, AuthPresent: true, Auth: AuthSection{Type: AuthMeticulousKeyedSHA1, KeyID: 9, Seq: 0xaabbccdd}}
	b := p.AppendSigned(nil, "key")
	if len(b) != 52 || b[3] != 52 || b[24] != 5 || b[25] != 28 || b[26] != 9 || binary.BigEndian.Uint32(b[28:]) != 0xaabbccdd {
		t.Fatalf("wire format % x", b)
	}
	hand := bytes.Clone(b)
	copy(hand[32:], append([]byte("key"), make([]byte, 17)...))
	if sum := sha1Sum(hand); !bytes.Equal(sum, b[32:]) {
		t.Errorf("digest % x, want % x", b[32:], sum)
	}
	q, why := Parse(b)
	if why != DropNone || !q.verify("key") || q.verify("kez") {
		t.Errorf("parse %v, verify with the key %v", why, q.verify("key"))
	}
	p.Auth.Type = AuthKeyedMD5
	if b := p.AppendSigned(nil, "key"); len(b) != 48 || b[3] != 48 || b[25] != 24 {
		t.Errorf("MD5 wire format % x", b)
	}
}

func TestAuthValidate(t *testing.T) {
	for _, tc := range []struct {
		a  Auth
		ok bool
	}{
		{Auth{}, true},
		{Auth{Type: AuthMeticulousKeyedSHA1, Key: "12345678901234567890"}, true},
		{Auth{Type: AuthMeticulousKeyedSHA1, Key: "123456789012345678901"}, false},
		{Auth{Type: AuthKeyedMD5, Key: "12345678901234567"}, false},
		{Auth{Type: AuthKeyedMD5}, false},
		{Auth{Key: "x"}, false},
		{Auth{Type: AuthSimplePassword, Key: "x"}, false},
	} {
		if err := tc.a.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.a, err)
		}
	}
	for _, s := range []string{"keyed-md5", "meticulous-keyed-md5", "keyed-sha1", "meticulous-keyed-sha1", ""} {
		if typ, err := ParseAuthType(s); err != nil || s != "" && typ.String() != s {
			t.Errorf("ParseAuthType(%q) = %v, %v", s, typ, err)
		}
	}
	if _, err := ParseAuthType("simple-password"); err == nil {
		t.Error("simple-password accepted")
	}
}

// FuzzAuthSection feeds arbitrary Authentication Sections (and lengths) to Parse: it never panics,
// what it accepts re-encodes to the bytes it read, and checking a digest never panics either.
func FuzzAuthSection(f *testing.F) {
	p := Packet{State: StateUp, DetectMult: 3, MyDiscr: 1, YourDiscr: 2, AuthPresent: true,
		Auth: AuthSection{Type: AuthMeticulousKeyedSHA1, KeyID: 1, Seq: 5}}
	f.Add(p.AppendSigned(nil, "k")[packetLen:], uint8(52))
	p.Auth.Type = AuthKeyedMD5
	f.Add(p.AppendSigned(nil, "k")[packetLen:], uint8(48))
	f.Add([]byte{1, 4, 'a', 'b'}, uint8(28))
	f.Add([]byte{5}, uint8(25))
	f.Fuzz(func(t *testing.T, section []byte, length uint8) {
		hdr := Packet{State: StateUp, DetectMult: 3, MyDiscr: 1, YourDiscr: 2, AuthPresent: true}
		b := hdr.Append(nil)[:packetLen]
		b[3] = length
		b = append(b, section...)
		q, why := Parse(b)
		if why != DropNone {
			return
		}
		if got := q.Append(nil); !bytes.Equal(got, b[:length]) {
			t.Fatalf("accepted % x, re-encoded % x", b[:length], got)
		}
		_ = q.verify("k")
		var st authState
		_ = st.authenticate(t0, Auth{Type: q.Auth.Type, KeyID: q.Auth.KeyID, Key: "k"}, time.Second, false, &q)
	})
}

func sha1Sum(b []byte) []byte {
	s := sha1.Sum(b)
	return s[:]
}

// TestBlindReplacementIgnoredWhileAlive: without authentication, a sender on the link that knows
// only the peer's address (TTL 255, no discriminator: Down with Your Discriminator zero, as a new
// remote session starts) used to make us take it for the peer's replacement session: we bound to
// it, dropped the real peer's packets as stale, and the peer timed us out (a failure on its side,
// BGP reset). Now, while the current remote session is alive, such a packet is only remembered;
// neither side changes state. If the peer then dies, the failure is still reported, at the latest
// a detection time at the slow rate after the forged successor first spoke.
func TestBlindReplacementIgnoredWhileAlive(t *testing.T) {
	s, a, b := upPair(t)
	sa, sb := a.session(b), b.session(a)
	fake := Packet{State: StateDown, DetectMult: 3, MyDiscr: 0xdead, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	for range 5 {
		if why := s.inject(a, b.addr, 255, fake); why != DropSuccessorHeld {
			t.Fatalf("forged successor: %v, want %v", why, DropSuccessorHeld)
		}
		s.run(time.Second)
	}
	if sa.state != StateUp || sb.state != StateUp || len(a.failures())+len(b.failures()) != 0 || len(a.transitions()) != 2 || len(b.transitions()) != 2 {
		t.Fatalf("after forged successors: a %s %v failures %v, b %s %v failures %v; want both up, untouched",
			sa.state, a.transitions(), a.failures(), sb.state, b.transitions(), b.failures())
	}
	// The peer dies; the forger goes on. The failure is reported within the bound.
	b.drop = true
	died := s.elapsed()
	for range 10 {
		s.inject(a, b.addr, 255, fake)
		s.run(time.Second)
	}
	fs := a.failures()
	if len(fs) != 1 || fs[0].at-died > DefaultMaxDetectTime {
		t.Fatalf("failures %+v after the peer died at %v, want one within %v", fs, died, DefaultMaxDetectTime)
	}
	// With authentication the forged packet does not even get that far.
	s2, a2, b2 := authPair(t, AuthMeticulousKeyedSHA1)
	if why := s2.inject(a2, b2.addr, 255, fake); why != DropAuth {
		t.Errorf("forged successor with authentication: %v, want %v", why, DropAuth)
	}
}
