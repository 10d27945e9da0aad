package relay

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

var (
	addrA = netip.MustParseAddr("192.0.2.11")
	addrB = netip.MustParseAddr("192.0.2.12")
	key1  = []byte("0123456789abcdef0123456789abcdef")
	key2  = []byte("fedcba9876543210fedcba9876543210")
)

// clock is a fake clock the tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// counter hands out 1, 2, 3, ... as "random" numbers, distinct per generator seed.
func counter(seed uint64) func() uint64 {
	n := seed << 32
	return func() uint64 { n++; return n }
}

// ftfw is one FTFW message of type typ with flags, n bytes long (n >= its header).
func ftfw(typ, flags byte, n int) []byte {
	b := make([]byte, n)
	b[0], b[1] = typ|1<<4, flags
	binary.BigEndian.PutUint16(b[2:], uint16(n))
	binary.BigEndian.PutUint32(b[4:], 7)
	return b
}

// update is a conntrackd datagram with one entry update (type 1, 64 bytes).
var update = ftfw(1, 0, 64)

// resyncReq is a conntrackd datagram with a resync request (a control message, flag resync).
var resyncReq = ftfw(ftfwTypeCtl, ftfwResync, 16)

type pair struct {
	t    testing.TB
	clk  *clock
	a, b *session
}

func newSessionT(t testing.TB, local, peer netip.Addr, keys [][]byte, l Limits, clk *clock, seed uint64) *session {
	t.Helper()
	s, err := newSession(local, peer, keys, l, clk.now, counter(seed))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newPair(t testing.TB, l Limits) *pair {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	return &pair{t: t, clk: clk, a: newSessionT(t, addrA, addrB, [][]byte{key1}, l, clk, 1),
		b: newSessionT(t, addrB, addrA, [][]byte{key1}, l, clk, 2)}
}

// exchange delivers msg to "to", and what each side sends back to the other, until nothing is
// sent (at most 20 deliveries); it returns the verdict of the first delivery and what each side
// handed its conntrackd.
func (p *pair) exchange(msg []byte, to *session) (Verdict, map[*session][][]byte) {
	p.t.Helper()
	type delivery struct {
		b  []byte
		to *session
	}
	got := map[*session][][]byte{}
	var first Verdict
	queue := []delivery{{msg, to}}
	for i := 0; len(queue) > 0; i++ {
		if i > 20 {
			p.t.Fatal("the relays keep answering each other")
		}
		d := queue[0]
		queue = queue[1:]
		payload, send, v := d.to.fromPeer(d.b)
		if i == 0 {
			first = v
		}
		if payload != nil {
			got[d.to] = append(got[d.to], payload)
		}
		other := p.a
		if d.to == p.a {
			other = p.b
		}
		for _, b := range send {
			queue = append(queue, delivery{b, other})
		}
	}
	return first, got
}

// handshake runs a's start-up hello until both know each other's challenge.
func (p *pair) handshake() {
	p.t.Helper()
	p.exchange(p.a.Hello(), p.b)
	if p.a.peerChal != p.b.chal || p.b.peerChal != p.a.chal {
		p.t.Fatalf("after the handshake a knows %x (b's is %x), b knows %x (a's is %x)", p.a.peerChal, p.b.chal, p.b.peerChal, p.a.chal)
	}
}

// send makes conntrackd's datagram d into a relay datagram of from.
func (p *pair) send(from *session, d []byte) []byte {
	p.t.Helper()
	out, v := from.fromDaemon(d)
	if v != Forwarded {
		p.t.Fatalf("conntrackd's datagram: %s, want forwarded", v)
	}
	return out
}

func (p *pair) want(to *session, msg []byte, want Verdict) {
	p.t.Helper()
	payload, _, v := to.fromPeer(msg)
	if v != want {
		p.t.Fatalf("verdict %s, want %s", v, want)
	}
	if (payload != nil) != (want == Forwarded) {
		p.t.Fatalf("verdict %s with payload %x", v, payload)
	}
}

func TestHandshakeAndForward(t *testing.T) {
	p := newPair(t, DefaultLimits)
	// Before the handshake conntrackd's datagrams wait: a hello goes instead, and they follow
	// once it is over.
	hello, v := p.a.fromDaemon(update)
	if v != Queued || hello == nil {
		t.Fatalf("before the handshake: %s, %v", v, hello)
	}
	if _, got := p.exchange(hello, p.b); len(got[p.b]) != 1 || !bytes.Equal(got[p.b][0], update) {
		t.Fatalf("after the handshake b's conntrackd got %x, want the queued datagram", got[p.b])
	}
	p.handshake()
	msg := p.send(p.a, update)
	payload, _, v := p.b.fromPeer(msg)
	if v != Forwarded || !bytes.Equal(payload, update) {
		t.Fatalf("a -> b: %s, payload %x", v, payload)
	}
	back := p.send(p.b, update)
	p.want(p.a, back, Forwarded)
}

func TestReplay(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	msgs := make([][]byte, windowSize+10)
	for i := range msgs {
		msgs[i] = p.send(p.a, update)
	}
	p.want(p.b, msgs[5], Forwarded)
	p.want(p.b, msgs[5], Replayed)
	// Reordered but within the window: taken once.
	p.want(p.b, msgs[3], Forwarded)
	p.want(p.b, msgs[3], Replayed)
	p.want(p.b, msgs[len(msgs)-1], Forwarded)
	// Older than the window: never taken, seen or not.
	p.want(p.b, msgs[4], Replayed)
	p.want(p.b, msgs[len(msgs)-1], Replayed)
}

// TestReplayAfterReceiverRestart: datagrams recorded before the receiver restarted carry its old
// challenge.
func TestReplayAfterReceiverRestart(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	old := p.send(p.a, resyncReq)
	p.want(p.b, old, Forwarded)
	p.b = newSessionT(t, addrB, addrA, [][]byte{key1}, DefaultLimits, p.clk, 3)
	p.want(p.b, old, Stale)
	// The hello the stale datagram got back went to a and was lost here; the answer to the same
	// (instance, challenge) is repeated at most once a second. The live peer learns the new
	// challenge from it, and gets through again; the recording still does not.
	p.clk.advance(staleEvery)
	p.exchange(p.send(p.a, update), p.b)
	p.want(p.b, p.send(p.a, update), Forwarded)
	p.want(p.b, old, Stale)
}

// TestReplayAfterSenderRestart: datagrams of the peer's previous instance are refused once its new
// instance has shown up, though they carry the receiver's challenge of their time.
func TestReplayAfterSenderRestart(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	old := []([]byte){p.send(p.a, update), p.send(p.a, resyncReq), p.send(p.a, update)}
	p.want(p.b, old[0], Forwarded)
	// a restarts; old[1] and old[2] were never delivered. Its conntrackd's first datagram (a
	// resync request) waits for the handshake, in which b renews its challenge (another instance
	// than the bound one presents it), and then gets through: nothing of the new instance is lost.
	p.a = newSessionT(t, addrA, addrB, [][]byte{key1}, DefaultLimits, p.clk, 4)
	p.clk.advance(2 * time.Second)
	hello, v := p.a.fromDaemon(resyncReq)
	if v != Queued {
		t.Fatalf("the new instance's first datagram: %s, want %s", v, Queued)
	}
	chal := p.b.chal
	if _, got := p.exchange(hello, p.b); len(got[p.b]) != 1 || !bytes.Equal(got[p.b][0], resyncReq) {
		t.Fatalf("b's conntrackd got %x, want the new instance's resync request", got[p.b])
	}
	if p.b.chal == chal {
		t.Fatal("b did not renew its challenge for the new instance")
	}
	p.want(p.b, p.send(p.a, update), Forwarded)
	for _, m := range old {
		p.want(p.b, m, Stale)
	}
}

// TestReplayBeforeSenderReturns: an attacker replays the old instance's undelivered datagrams
// while the peer is down (it holds the peer's address): they are the peer's own, made under the
// receiver's current challenge, and arrive once each at most; nothing recorded twice gets in.
func TestReplayBeforeSenderReturns(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	m := p.send(p.a, update)
	p.want(p.b, m, Forwarded)
	for range 100 {
		p.want(p.b, m, Replayed)
	}
}

func TestWrongKey(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a := newSessionT(t, addrA, addrB, [][]byte{key2}, DefaultLimits, clk, 1)
	b := newSessionT(t, addrB, addrA, [][]byte{key1}, DefaultLimits, clk, 2)
	p := &pair{t: t, clk: clk, a: a, b: b}
	if _, _, v := b.fromPeer(a.Hello()); v != BadMAC {
		t.Fatalf("hello signed with another key: %s", v)
	}
	// b's own datagram reflected back to b (same key, other direction), and a datagram for the
	// other direction: neither verifies.
	p2 := newPair(t, DefaultLimits)
	p2.handshake()
	mine := p2.send(p2.a, update)
	p2.want(p2.a, mine, BadMAC)
	// Flipping any bit of a good datagram breaks it.
	good := p2.send(p2.a, update)
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x10
		if payload, _, v := p2.b.fromPeer(bad); payload != nil || v == Forwarded {
			t.Fatalf("bit flipped at byte %d: %s", i, v)
		}
	}
	p2.want(p2.b, good, Forwarded)
	_ = p
}

// TestKeyRotation follows a rotation as the membership's: both gateways get [old, new] (old signs),
// then [new, old] one after the other, then [new]. The channel never stops.
func TestKeyRotation(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	step := func(aKeys, bKeys [][]byte) {
		t.Helper()
		if err := p.a.setKeys(aKeys); err != nil {
			t.Fatal(err)
		}
		if err := p.b.setKeys(bKeys); err != nil {
			t.Fatal(err)
		}
		p.want(p.b, p.send(p.a, update), Forwarded)
		p.want(p.a, p.send(p.b, update), Forwarded)
	}
	step([][]byte{key1, key2}, [][]byte{key1, key2})
	step([][]byte{key2, key1}, [][]byte{key1, key2})
	step([][]byte{key2, key1}, [][]byte{key2, key1})
	step([][]byte{key2}, [][]byte{key2, key1})
	step([][]byte{key2}, [][]byte{key2})
	// The old key is gone: what it signs no longer verifies.
	if err := p.a.setKeys([][]byte{key1}); err != nil {
		t.Fatal(err)
	}
	p.want(p.b, p.send(p.a, update), BadMAC)
	// A short key is refused and the old ones stay.
	if err := p.b.setKeys([][]byte{[]byte("short")}); err == nil {
		t.Fatal("a 5-byte key was taken")
	}
	if err := p.a.setKeys([][]byte{key2}); err != nil {
		t.Fatal(err)
	}
	p.want(p.b, p.send(p.a, update), Forwarded)
}

func TestRateLimit(t *testing.T) {
	l := Limits{Datagrams: 10, Burst: 20, ResyncEvery: 10 * time.Second, ResyncBurst: 2, Hellos: 10, RenewEvery: time.Second}
	p := newPair(t, l)
	p.handshake()
	// a's conntrackd floods: a sends 20 at once, then 10 a second.
	sent := 0
	var msgs [][]byte
	for range 100 {
		if out, v := p.a.fromDaemon(update); v == Forwarded {
			sent++
			msgs = append(msgs, out)
		} else if v != RateLimited {
			t.Fatalf("verdict %s", v)
		}
	}
	if sent != 20 {
		t.Fatalf("a sent %d of 100 at once, want 20", sent)
	}
	p.clk.advance(time.Second)
	for range 100 {
		if out, v := p.a.fromDaemon(update); v == Forwarded {
			sent++
			msgs = append(msgs, out)
		}
	}
	if sent != 30 {
		t.Fatalf("a sent %d after a second, want 30", sent)
	}
	// b hands conntrackd at most as many (a peer that ignores its own limit is cut by b's).
	got := 0
	for _, m := range msgs {
		if payload, _, v := p.b.fromPeer(m); v == Forwarded && payload != nil {
			got++
		}
	}
	if got != 20 {
		t.Fatalf("b handed %d of 30 to conntrackd at once, want 20", got)
	}
	// Resync requests: 2 at once, then one every 10 s.
	p.clk.advance(time.Hour)
	resyncs := 0
	for range 5 {
		if _, _, v := p.b.fromPeer(p.send(p.a, resyncReq)); v == Forwarded {
			resyncs++
		} else if v != ResyncLimited {
			t.Fatalf("verdict %s", v)
		}
	}
	p.clk.advance(10 * time.Second)
	for range 5 {
		if _, _, v := p.b.fromPeer(p.send(p.a, resyncReq)); v == Forwarded {
			resyncs++
		}
	}
	if resyncs != 3 {
		t.Fatalf("%d resync requests reached conntrackd in 10 s, want 3", resyncs)
	}
	// Hellos: a flood of stale datagrams of 100 instances (100 pairs never answered) gets at most
	// 10 answers a second; the same flood again a second later (pairs answered before) 10 more.
	var stale [][]byte
	for i := range 100 {
		stale = append(stale, newSessionT(t, addrA, addrB, [][]byte{key1}, l, p.clk, uint64(100+i)).Hello())
	}
	p.b = newSessionT(t, addrB, addrA, [][]byte{key1}, l, p.clk, 9)
	answers := 0
	for _, m := range stale {
		if _, send, _ := p.b.fromPeer(m); len(send) > 0 {
			answers++
		}
	}
	if answers != 10 {
		t.Fatalf("%d hellos answered 100 stale datagrams of new pairs, want 10", answers)
	}
	p.clk.advance(time.Second)
	for range 2 {
		for _, m := range stale {
			if _, send, _ := p.b.fromPeer(m); len(send) > 0 {
				answers++
			}
		}
	}
	if answers != 30 {
		t.Fatalf("%d hellos answered the flood twice more a second later, want 30", answers)
	}
}

func TestScanFTFW(t *testing.T) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name       string
		in         []byte
		msgs       int
		resync, ok bool
	}{
		{"one update", update, 1, false, true},
		{"updates and a resync", cat(update, update, resyncReq), 3, true, true},
		{"ack", ftfw(ftfwTypeCtl, ftfwAck, 16), 1, false, true},
		{"short ack", ftfw(ftfwTypeCtl, ftfwAck, 8), 0, false, false},
		{"truncated", update[:7], 0, false, false},
		{"length beyond the datagram", cat(update, update[:40]), 1, false, false},
		{"zero length", cat(update, make([]byte, 8)), 1, false, false},
		{"resync after a malformed message is not processed", cat(update[:4], resyncReq), 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, resync, ok := scanFTFW(tc.in)
			if msgs != tc.msgs || resync != tc.resync || ok != tc.ok {
				t.Errorf("scanFTFW = %d, %v, %v; want %d, %v, %v", msgs, resync, ok, tc.msgs, tc.resync, tc.ok)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	p := newPair(t, DefaultLimits)
	p.handshake()
	good := p.send(p.a, update)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:Overhead-1],
		"no magic":  append([]byte("XXXX"), good[4:]...),
		"too long":  make([]byte, MaxPayload+Overhead+1),
		"bad kind":  func() []byte { c := bytes.Clone(good); c[5] = 9; return c }(),
		"bad flags": func() []byte { c := bytes.Clone(good); c[6] = 0x80; return c }(),
	} {
		if _, _, err := parse(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// BenchmarkRelay is the cost of one full conntrackd datagram (1,472 bytes) through both relays:
// sealed by one, checked and handed on by the other.
func BenchmarkRelay(b *testing.B) {
	l := DefaultLimits
	l.Datagrams, l.Burst = 1e12, 1<<30
	p := newPair(b, l)
	p.handshake()
	d := bytes.Repeat(update, 1472/len(update))
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		msg, _ := p.a.fromDaemon(d)
		if payload, _, v := p.b.fromPeer(msg); v != Forwarded || payload == nil {
			b.Fatal(v)
		}
	}
}
