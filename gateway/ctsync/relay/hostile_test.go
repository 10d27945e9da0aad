package relay

import (
	"bytes"
	"math"
	"testing"
	"time"
)

// TestStaleReplayFloodDoesNotStallHandshake: a LAN attacker replays recorded hellos (echo 0:
// stale at any instance of the receiver, forever) to both relays at 1,000/s while one of them
// restarts. The restarted relay still finishes its handshake, and its conntrackd's first datagram
// (the resync request FTFW does not resend) and the ones after it get through: stale datagrams
// cannot spend the hellos that move a handshake forward (review finding F2; before the fix: not
// ready after 20 s, nothing forwarded, 200 datagrams queued).
func TestStaleReplayFloodDoesNotStallHandshake(t *testing.T) {
	p := newPair(t, DefaultLimits)
	recA := p.a.Hello() // recorded on the LAN at a's first start
	recB := p.b.Hello() // b's hello at its first start
	p.exchange(recA, p.b)
	p.handshake()
	for range 1000 { // the flood runs before a restarts too
		p.clk.advance(time.Millisecond)
		p.b.fromPeer(recA)
	}
	// a restarts.
	a2 := newSessionT(t, addrA, addrB, [][]byte{key1}, DefaultLimits, p.clk, 9)
	var toB [][]byte
	delivered, resyncs := 0, 0
	deliver := func() {
		for len(toB) > 0 {
			d := toB[0]
			toB = toB[1:]
			payload, send, _ := p.b.fromPeer(d)
			if payload != nil {
				if bytes.Equal(payload, resyncReq) {
					resyncs++
				}
				delivered++
			}
			for _, s := range send {
				_, back, _ := a2.fromPeer(s)
				toB = append(toB, back...)
			}
		}
	}
	if h := a2.Hello(); h != nil {
		toB = append(toB, h)
	}
	for ms := 0; ms < 20000; ms++ {
		p.clk.advance(time.Millisecond)
		a2.fromPeer(recB) // a2 is flooded with b's recorded hello
		_, send, _ := p.b.fromPeer(recA)
		for _, s := range send { // b's answers go to a's address: a2 gets them
			_, back, _ := a2.fromPeer(s)
			toB = append(toB, back...)
		}
		if ms%100 == 0 { // a2's conntrackd: a resync request first, then updates
			d := update
			if ms == 0 {
				d = resyncReq
			}
			if out, _ := a2.fromDaemon(d); out != nil {
				toB = append(toB, out)
			}
		}
		deliver()
	}
	if !a2.peerReady || a2.peerChal != p.b.chal || len(a2.queue) != 0 {
		t.Fatalf("after 20 s of replayed hellos the restarted relay is not through its handshake: ready %v, queue %d", a2.peerReady, len(a2.queue))
	}
	if resyncs != 1 || delivered < 150 {
		t.Fatalf("b's conntrackd got %d datagrams of 200 from the restarted peer, %d resync requests (want 1)", delivered, resyncs)
	}
	t.Logf("b's conntrackd got %d of the restarted peer's 200 datagrams, its resync request included", delivered)
}

// TestStaleAnsweredOncePerPair: however often a stale datagram is replayed, its (instance,
// challenge) gets at most one answer a second; a pair never answered before still gets one, and the
// handshake's own hellos still go.
func TestStaleAnsweredOncePerPair(t *testing.T) {
	p := newPair(t, DefaultLimits)
	rec := p.a.Hello()
	p.exchange(rec, p.b)
	p.handshake()
	answers := 0
	for range 10000 {
		p.clk.advance(100 * time.Microsecond)
		if _, send, v := p.b.fromPeer(rec); v != Stale {
			t.Fatalf("the recorded hello: %s, want %s", v, Stale)
		} else {
			answers += len(send)
		}
	}
	if answers > 2 {
		t.Fatalf("%d answers to one recorded hello replayed 10,000 times in 1 s, want at most 2", answers)
	}
	// A new instance of a (another pair) is answered at once.
	a2 := newSessionT(t, addrA, addrB, [][]byte{key1}, DefaultLimits, p.clk, 9)
	if _, send, v := p.b.fromPeer(a2.Hello()); v != Stale || len(send) != 1 {
		t.Fatalf("the new instance's hello: %s with %d answers, want %s with one", v, len(send), Stale)
	}
	// b's own handshake hellos were not spent: a restarted b gets its retries out while a is
	// flooded with stale datagrams.
	recB := p.b.Hello()
	b2 := newSessionT(t, addrB, addrA, [][]byte{key1}, DefaultLimits, p.clk, 10)
	for range 1000 {
		b2.fromPeer(recB)
		b2.fromPeer(rec)
	}
	if out, v := b2.fromDaemon(update); v != Queued || out == nil {
		t.Fatalf("conntrackd's datagram before the handshake after a stale flood: %s, hello %v", v, out != nil)
	}
}

// forge seals a data datagram as a key holder can: with the bound instance, the receiver's current
// challenge (both travel in clear) and a sequence number of its choice.
func forge(p *pair, from, to *session, seq uint64) []byte {
	return seal(nil, from.send[0], header{kind: kindData, instance: from.instance, chal: from.chal, echo: to.chal, seq: seq}, update)
}

// TestSeqJumpIsBounded: a key holder's datagram with the bound instance, the current challenge and
// sequence number 2^64-1 is refused (a jump beyond the bound), and the peer's datagrams keep
// getting through (review finding F3; before the fix the window top became 2^64-1 and every real
// datagram was refused until a relay restarted).
func TestSeqJumpIsBounded(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	p.want(p.b, p.send(p.a, update), Forwarded)
	if _, _, v := p.b.fromPeer(forge(p, p.a, p.b, math.MaxUint64)); v == Forwarded {
		t.Fatal("a datagram with sequence number 2^64-1 was forwarded")
	}
	for range 10 {
		p.want(p.b, p.send(p.a, update), Forwarded)
	}
}

// TestSeqJumpRecovers: a key holder pushes the window ahead by as much as one step may (the peer's
// datagrams are then below the window), and stops. The channel recovers by itself: the receiver
// renews its challenge when the bound instance's datagrams keep failing the window while none is
// taken, and the peer's conntrackd gets through again.
func TestSeqJumpRecovers(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	p.want(p.b, p.send(p.a, update), Forwarded)
	if _, _, v := p.b.fromPeer(forge(p, p.a, p.b, p.a.seq+maxSeqJump)); v != Forwarded {
		t.Fatalf("a jump of %d: %s", maxSeqJump, v)
	}
	got, lost := 0, 0
	for i := range 600 { // a's conntrackd: 10 datagrams a second for a minute
		p.clk.advance(100 * time.Millisecond)
		out, v := p.a.fromDaemon(update)
		if out == nil {
			t.Fatalf("datagram %d of a's conntrackd: %s", i, v)
		}
		if _, g := p.exchange(out, p.b); len(g[p.b]) > 0 {
			got += len(g[p.b])
		} else {
			got, lost = 0, i+1
		}
	}
	if got < 500 {
		t.Fatalf("after the jump b's conntrackd got only the last %d of 600 datagrams", got)
	}
	t.Logf("after the jump: %d datagrams of a's conntrackd lost (10/s), then all %d after them got through", lost, got)
	// A LAN replay of the bound instance's old datagrams while the peer is live renews nothing.
	chal := p.b.chal
	old := p.send(p.a, update)
	p.want(p.b, old, Forwarded)
	for range 100 {
		p.clk.advance(100 * time.Millisecond)
		for range 10 {
			p.want(p.b, old, Replayed)
		}
		p.want(p.b, p.send(p.a, update), Forwarded)
	}
	if p.b.chal != chal {
		t.Fatal("replays of old datagrams with the peer live renewed the challenge")
	}
}
