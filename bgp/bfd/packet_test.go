package bfd

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestPacketRoundTrip(t *testing.T) {
	p := Packet{Diag: DiagNeighborDown, State: StateUp, Poll: true, Demand: true, DetectMult: 5, MyDiscr: 0xdeadbeef, YourDiscr: 7,
		DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond, RequiredMinEchoRx: 50 * time.Millisecond}
	b := p.Append(nil)
	want := []byte{
		0x23, 0xe2, 5, 24, // version 1, diag 3; state Up, Poll, Demand; mult; length
		0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 7,
		0x00, 0x01, 0x86, 0xa0, // 100000 µs
		0x00, 0x04, 0x93, 0xe0, // 300000 µs
		0x00, 0x00, 0xc3, 0x50, // 50000 µs
	}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Errorf("wire format (-want +got):\n%s", diff)
	}
	got, why := Parse(b)
	if why != DropNone {
		t.Fatalf("Parse: %v", why)
	}
	if diff := cmp.Diff(p, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestParseDrops(t *testing.T) {
	good := func() []byte {
		p := Packet{State: StateDown, DetectMult: 3, MyDiscr: 1, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
		return p.Append(nil)
	}
	for _, tc := range []struct {
		name string
		b    func() []byte
		want DropReason
	}{
		{"valid", good, DropNone},
		{"valid with trailing bytes", func() []byte { return append(good(), 0, 0, 0) }, DropNone},
		{"empty", func() []byte { return nil }, DropShort},
		{"23 bytes", func() []byte { return good()[:23] }, DropShort},
		{"version 0", func() []byte { b := good(); b[0] &= 0x1f; return b }, DropVersion},
		{"version 7", func() []byte { b := good(); b[0] |= 0xe0; return b }, DropVersion},
		{"length 23", func() []byte { b := good(); b[3] = 23; return b }, DropLength},
		{"length beyond the datagram", func() []byte { b := good(); b[3] = 25; return b }, DropLength},
		{"auth bit, length 24", func() []byte { b := good(); b[1] |= flagAuth; return b }, DropLength},
		{"auth bit, length 26, simple password", func() []byte { b := append(good(), 1, 2); b[1] |= flagAuth; b[3] = 26; return b }, DropAuthType},
		{"auth bit, length 26, keyed SHA1", func() []byte { b := append(good(), 4, 28); b[1] |= flagAuth; b[3] = 26; return b }, DropAuthMalformed},
		{"detect mult 0", func() []byte { b := good(); b[2] = 0; return b }, DropDetectMult},
		{"multipoint", func() []byte { b := good(); b[1] |= flagMultipoint; return b }, DropMultipoint},
		{"my discriminator 0", func() []byte { b := good(); binary.BigEndian.PutUint32(b[4:], 0); return b }, DropZeroMyDiscr},
		{"poll and final", func() []byte { b := good(); b[1] |= flagPoll | flagFinal; return b }, DropPollFinal},
	} {
		if _, got := Parse(tc.b()); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWireIntervalLimits(t *testing.T) {
	for d, want := range map[time.Duration]uint32{-1: 0, 0: 0, 999 * time.Nanosecond: 0, time.Microsecond: 1, 2 * time.Hour: 1<<32 - 1} {
		if got := wireInterval(d); got != want {
			t.Errorf("wireInterval(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestHopLimit(t *testing.T) {
	oob := make([]byte, 64)
	if _, ok := hopLimit(oob[:0]); ok {
		t.Errorf("hop limit from no control message")
	}
	if _, ok := hopLimit(oob[:5]); ok {
		t.Errorf("hop limit from a truncated control message")
	}
}

// stampOOB is the control message of a kernel receive timestamp at.
func stampOOB(at time.Time) []byte {
	b := make([]byte, unix.CmsgSpace(16))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS
	h.SetLen(unix.CmsgLen(16))
	binary.NativeEndian.PutUint64(b[unix.CmsgLen(0):], uint64(at.Unix()))
	binary.NativeEndian.PutUint64(b[unix.CmsgLen(8):], uint64(at.Nanosecond()))
	return b
}

// TestArrival: a datagram's arrival is its age by the kernel's timestamp before the read; without
// a timestamp, or with one that cannot be right (the wall clock was stepped), it is the read.
func TestArrival(t *testing.T) {
	now := time.Now()
	wall := now.Round(0)
	for _, tc := range []struct {
		name string
		oob  []byte
		want time.Time
	}{
		{"no timestamp", nil, now},
		{"queued 300ms", stampOOB(wall.Add(-300 * ms)), now.Add(-300 * ms)},
		{"stamped in the future (clock stepped back)", stampOOB(wall.Add(time.Second)), now},
		{"queued for longer than maxQueueAge (clock stepped forward)", stampOOB(wall.Add(-time.Hour)), now},
		{"truncated", stampOOB(wall.Add(-300 * ms))[:12], now},
	} {
		if got := arrival(tc.oob, now); !got.Equal(tc.want) {
			t.Errorf("%s: %v from the read, want %v", tc.name, got.Sub(now), tc.want.Sub(now))
		}
	}
}

// TestArrivals: the datagrams read from one socket are dated in order, none before the socket
// was opened.
func TestArrivals(t *testing.T) {
	opened := time.Now()
	r := arrivals{last: opened, prev: opened}
	for _, tc := range []struct {
		name       string
		read, sent time.Duration // after opened
		want       time.Duration
	}{
		{"stamped before the socket was opened", 10 * ms, -time.Second, 0},
		{"queued 5ms", 20 * ms, 15 * ms, 15 * ms},
		{"stamped before the previous one", 30 * ms, 10 * ms, 15 * ms},
		{"queued 100ms", 300 * ms, 200 * ms, 200 * ms},
	} {
		now := opened.Add(tc.read)
		if got := r.at(stampOOB(opened.Round(0).Add(tc.sent)), now); !got.Equal(opened.Add(tc.want)) {
			t.Errorf("%s: %v after the socket was opened, want %v", tc.name, got.Sub(opened), tc.want)
		}
	}
}

// TestClockStepped: only a wall clock that moved against the monotonic one by more than
// maxClockStep between two reads counts as stepped.
func TestClockStepped(t *testing.T) {
	for _, tc := range []struct {
		wall, mono time.Duration
		want       bool
	}{
		{time.Second, time.Second, false},
		{time.Second + 500*time.Microsecond, time.Second, false},
		{2 * time.Second, time.Second, true},
		{-time.Hour, time.Second, true},
		{0, 5 * ms, true},
	} {
		if got := clockStepped(tc.wall, tc.mono); got != tc.want {
			t.Errorf("wall clock moved %v, monotonic %v: stepped %v, want %v", tc.wall, tc.mono, got, tc.want)
		}
	}
	now := time.Now()
	if base := now.Add(-time.Second); clockStepped(now.Round(0).Sub(base.Round(0)), now.Sub(base)) {
		t.Errorf("times from one clock reading taken for a step")
	}
}

// FuzzReceive feeds arbitrary datagrams to an engine with an Up session, from the peer and with
// TTL 255: nothing may panic, and whatever is accepted must have passed every check.
func FuzzReceive(f *testing.F) {
	p := Packet{State: StateUp, DetectMult: 3, MyDiscr: 2, YourDiscr: 1, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	f.Add(p.Append(nil))
	p.State, p.YourDiscr = StateDown, 0
	f.Add(p.Append(nil))
	f.Add([]byte{0x20, 0x40, 0, 24})
	peer := netip.MustParseAddr("192.0.2.1")
	f.Fuzz(func(t *testing.T, b []byte) {
		e := newEngine(func() uint32 { return 1 }, func() float64 { return 0.5 })
		var a actions
		e.set(t0, Config{Peer: peer, DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond, DetectMult: 3}, &a)
		q, why := Parse(b)
		if why != DropNone {
			return
		}
		if q.DetectMult == 0 || q.MyDiscr == 0 || q.Multipoint || q.AuthPresent || int(b[3]) > len(b) {
			t.Fatalf("Parse accepted %x as %+v", b, q)
		}
		e.receive(t0, t0, peer, 255, false, q, &a)
		e.tick(t0.Add(10*time.Second), &a)
		for _, o := range a.send {
			if o.p.Poll && o.p.Final {
				t.Fatalf("sent Poll and Final together")
			}
		}
	})
}

// BenchmarkReceiveNonPeer is what a datagram from an address that is no peer costs once read:
// parse and one map lookup, whatever it contains.
func BenchmarkReceiveNonPeer(b *testing.B) {
	e := newEngine(func() uint32 { return 1 }, func() float64 { return 0.5 })
	var a actions
	e.set(t0, Config{Peer: netip.MustParseAddr("192.0.2.1")}, &a)
	p := Packet{State: StateDown, DetectMult: 3, MyDiscr: 2, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	buf := p.Append(nil)
	stranger := netip.MustParseAddr("192.0.2.99")
	b.ReportAllocs()
	for b.Loop() {
		q, why := Parse(buf)
		if why == DropNone {
			e.receive(t0, t0, stranger, 255, false, q, &a)
		}
	}
}

// BenchmarkUpSession is the state machine's cost for one Up session: receive one packet from the
// peer and send one, as every 100 ms at 100 ms x 3.
func BenchmarkUpSession(b *testing.B) {
	s := newSim(nil)
	x, y := s.node("192.0.2.2", 1), s.node("192.0.2.1", 2)
	s.set(x, cfgFor(y, 100*ms, 100*ms, 3))
	s.set(y, cfgFor(x, 100*ms, 100*ms, 3))
	s.run(2 * time.Second)
	sx := x.session(y)
	in := y.session(x).packet(false)
	buf := in.Append(nil)
	now := s.now
	var a actions
	out := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * ms)
		a.send, a.events = a.send[:0], a.events[:0]
		q, _ := Parse(buf)
		x.eng.receive(now, now, y.addr, 255, false, q, &a)
		sx.nextTx = now
		x.eng.tick(now, &a)
		for _, o := range a.send {
			out = o.p.Append(out[:0])
		}
	}
}
