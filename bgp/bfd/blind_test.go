package bfd

import (
	"testing"
	"time"
)

// blindDown is what a blind sender on the link can send without authentication: Down, Your
// Discriminator zero, a made-up My Discriminator, the peer's address and TTL 255.
func blindDown(d uint32) Packet {
	return Packet{State: StateDown, DetectMult: 3, MyDiscr: d, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
}

// TestBlindDownStreamDoesNotDelayHandshake: a blind sender streams Down packets with made-up
// discriminators (a new one every 10 ms) at a session that is not Up. Each bound our Init to a
// session that does not exist, so our Init packets named the wrong discriminator and the peer's
// Init, naming ours, was dropped as stale: the handshake waited for the rare Init of ours that
// went out between the peer's packet and the next forged one. Now a remote session
// that names our discriminator in Init or Up takes over a binding nobody confirmed.
func TestBlindDownStreamDoesNotDelayHandshake(t *testing.T) {
	s := newSim(t)
	s.latency = 10 * ms
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	s.set(a, cfgFor(b, 100*ms, 100*ms, 3))
	s.set(b, cfgFor(a, 100*ms, 100*ms, 3))
	s.run(ms) // our first packet is on its way: the sender starts after it
	upAt := time.Duration(-1)
	d := uint32(0x1000)
	for k := 0; k < 3000 && upAt < 0; k++ {
		d++
		s.inject(a, b.addr, 255, blindDown(d))
		s.run(10 * ms)
		if a.session(b).state == StateUp && b.session(a).state == StateUp {
			upAt = s.elapsed()
		}
	}
	t.Logf("up at %v", upAt)
	if upAt < 0 || upAt > 3*time.Second {
		t.Errorf("sessions Up at %v (-1: not in 30 s) under a stream of forged Down packets, want within the 1 s slow-rate handshake (3 s)", upAt)
	}
}

// TestMadeUpSuccessorsDoNotExtendDetection: a blind sender alternates made-up successors (Down,
// Your Discriminator zero) at an Up session, then the peer dies. The held successor turned the
// expiry into a replacement whose grace ran from the last made-up one: each new discriminator
// restarted it, 3 s on top of a 300 ms detection time. The grace now runs from when a successor
// first spoke, so the failure comes at the detection time.
func TestMadeUpSuccessorsDoNotExtendDetection(t *testing.T) {
	s := newSim(t)
	a, b := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	s.set(a, cfgFor(b, 100*ms, 100*ms, 3))
	s.set(b, cfgFor(a, 100*ms, 100*ms, 3))
	s.run(5 * time.Second)
	if st := a.session(b).state; st != StateUp {
		t.Fatalf("session %s, want up", st)
	}
	forge := func(k int) { s.inject(a, b.addr, 255, blindDown(0x1000+uint32(k%2))) }
	for k := range 50 {
		forge(k)
		s.run(100 * ms)
	}
	b.drop = true // the peer dies
	died := s.elapsed()
	for k := range 50 {
		forge(k)
		s.run(100 * ms)
	}
	fs := a.failures()
	if len(fs) == 0 {
		t.Fatalf("no failure 5 s after the peer died")
	}
	t.Logf("failure %v after the peer died: %v", fs[0].at-died, fs[0].Failure)
	if took := fs[0].at - died; took > time.Second {
		t.Errorf("failure %v after the peer died (%v), want at its 300 ms detection time", took, fs[0].Failure)
	}
}
