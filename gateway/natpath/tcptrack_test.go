package natpath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// The TCP tracking's answers to a blind attacker (one who can spoof a client's or a backend's
// address but sees none of the connection's packets), from the review of the fast path.

// findFlow is the entry of the flow tables at src -> dst, nil without one.
func findFlow(t *testing.T, r *runner, src, dst netip.AddrPort) *Flow {
	t.Helper()
	flows, err := r.path.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Src == src && f.Dst == dst {
			return &f
		}
	}
	return nil
}

// tcpSide is what an entry knows of its sender's side of a TCP connection: the sequence number
// after its last segment, its window (scaled).
type tcpSide struct{ end, win uint32 }

// flowSide reads the entry at src -> dst's TCP side (struct flow_val's end and win).
func flowSide(t *testing.T, r *runner, src, dst netip.AddrPort) tcpSide {
	t.Helper()
	var got *tcpSide
	if err := r.path.walk(func(_ *ebpf.Map, _, v []byte, f Flow) bool {
		if f.Src == src && f.Dst == dst {
			got = &tcpSide{binary.NativeEndian.Uint32(v[48:]), binary.NativeEndian.Uint32(v[52:])}
			return false
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if got == nil {
		t.Fatalf("no entry %s -> %s", src, dst)
	}
	return *got
}

// A client with a spoofed source never sees the backend's SYN-ACK; its ACKs must not confirm the
// flow (which would put it in the established table, where nothing evicts it). The ACKs carry a
// window of 0xffff scaled by 14 (2^30): were it the tolerance of the check, one of these five
// acknowledgment numbers would always be within it.
func TestBlindClientCannotConfirm(t *testing.T) { eachProg(t, testBlindClientCannotConfirm) }

func testBlindClientCannotConfirm(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	vip, backend := ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	ws14 := padOpts([]byte{2, 4, 5, 0xb4, 4, 2, 1, 3, 3, 14})
	confirmed := 0
	for i := range 50 {
		c := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.99"), uint16(40000+i))
		r.run(t, frame(pktSpec{src: c, dst: vip, proto: 6, tcpFlags: 0x02, seq: 1000, options: ws14}))
		// The real backend's SYN-ACK (the attacker never sees it): an ISN it cannot know.
		isn := uint32(i)*2654435761 + 12345
		r.run(t, frame(pktSpec{src: backend, dst: c, proto: 6, tcpFlags: 0x12, seq: isn, ack: 1001, options: padOpts(tcpOpts)}))
		for k := range 5 {
			r.run(t, frame(pktSpec{src: c, dst: vip, proto: 6, tcpFlags: 0x10, seq: 1001, ack: uint32(k) * (1<<30 - 1<<14), window: 0xffff}))
		}
		if f := findFlow(t, r, c, vip); f == nil || !f.Unconfirmed {
			confirmed++
		}
	}
	if confirmed != 0 {
		t.Errorf("blind clients confirmed %d of 50 flows, want 0", confirmed)
	}
	// The real client, which acknowledges the SYN-ACK exactly, still confirms its flow.
	c := ap("198.51.100.99:39999")
	r.run(t, frame(pktSpec{src: c, dst: vip, proto: 6, tcpFlags: 0x02, seq: 1000, options: ws14}))
	r.run(t, frame(pktSpec{src: backend, dst: c, proto: 6, tcpFlags: 0x12, seq: 12345, ack: 1001, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: c, dst: vip, proto: 6, tcpFlags: 0x10, seq: 1001, ack: 12346, window: 0xffff}))
	if f := findFlow(t, r, c, vip); f == nil || f.Unconfirmed {
		t.Errorf("the handshake's own ACK: %+v, want confirmed", f)
	}
}

// establish opens a TCP connection client -> vip, answered by backend a (ISNs 0x12345678 and
// 0x9abcdef0, window scale 7 both ways), and checks that it was confirmed.
func establish(t *testing.T, r *runner, client, vip, a netip.AddrPort) {
	t.Helper()
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x02, seq: 0x12345678, window: 64240, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 0x9abcdef0, ack: 0x12345679, window: 65160, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x10, seq: 0x12345679, ack: 0x9abcdef1, window: 502}))
	if f := findFlow(t, r, client, vip); f == nil || f.Unconfirmed {
		t.Fatalf("not established: %+v", f)
	}
}

// A blind attacker who knows only a connection's 4-tuple cannot walk the client's sequence
// number to a value it knows with many far-apart segments (each moving it a long way), and then
// reset the connection with a RST at that value (RFC 5961's check bypassed).
func TestBlindSeqWalkCannotReset(t *testing.T) { eachProg(t, testBlindSeqWalkCannotReset) }

func testBlindSeqWalkCannotReset(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	client, vip, a := ap("198.51.100.10:43111"), ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	establish(t, r, client, vip, a)
	before := flowSide(t, r, client, vip)
	for k := range 1024 {
		r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x10, seq: uint32(k) << 23, ack: 1}))
	}
	if got := flowSide(t, r, client, vip); got != before {
		t.Errorf("1024 blind ACKs moved the client's side from %+v to %+v", before, got)
	}
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x04, seq: 0xff800000}))
	if f := findFlow(t, r, client, vip); f == nil || f.Closing {
		t.Fatalf("a RST at the walked-to sequence number: %+v, want the connection open", f)
	}
	// The client's real segments are still followed: 100 bytes move its end by 100.
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, seq: 0x12345679, ack: 0x9abcdef1, window: 502, payload: make([]byte, 100)}))
	if got := flowSide(t, r, client, vip); got.end != 0x12345679+100 {
		t.Errorf("after 100 bytes of data the client's end is %#x, want %#x", got.end, 0x12345679+100)
	}
}

// One blind segment with the client's tuple and the largest window must not become the window
// that the server's RSTs are checked against.
func TestBlindSegmentCannotInflateWindow(t *testing.T) {
	eachProg(t, testBlindSegmentCannotInflateWindow)
}

func testBlindSegmentCannotInflateWindow(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	client, vip, a := ap("198.51.100.10:43112"), ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	establish(t, r, client, vip, a)
	before := flowSide(t, r, client, vip)
	if before.win != 502<<7 {
		t.Fatalf("the client's window after the handshake: %d, want %d", before.win, 502<<7)
	}
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x10, seq: 0xdeadbeef, ack: 7, window: 0xffff}))
	if got := flowSide(t, r, client, vip); got != before {
		t.Fatalf("a blind segment changed the client's side from %+v to %+v", before, got)
	}
	// The server-side RSTs a blind attacker sends then: with the real window (64 KiB) none of
	// these 4096 lands in it; with an 8 MiB one, one would.
	for k := range 4096 {
		r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x04, seq: uint32(k) * 1048573}))
		if f := findFlow(t, r, client, vip); f == nil || f.Closing {
			t.Fatalf("blind RST %d (seq %#x) closed the connection", k, uint32(k)*1048573)
		}
	}
}

// A SYN-ACK spoofed from the backend's address between the real SYN-ACK and the client's ACK
// (by someone who never saw the client's SYN, so its ack is a guess) must not reset the server's
// side: the real handshake then would never confirm the flow, which stays evictable for good.
func TestBlindSynAckCannotStallHandshake(t *testing.T) {
	eachProg(t, testBlindSynAckCannotStallHandshake)
}

func testBlindSynAckCannotStallHandshake(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	client, vip, a := ap("198.51.100.10:43113"), ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x02, seq: 1000, window: 64240, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 7000, ack: 1001, window: 65160, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 0x80000000, ack: 0x5eed, window: 1, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x10, seq: 1001, ack: 7001, window: 502}))
	if f := findFlow(t, r, client, vip); f == nil || f.Unconfirmed {
		t.Errorf("the real handshake after a spoofed SYN-ACK: %+v, want confirmed", f)
	}
}

// A server's window scale counts only if the client offered one too (RFC 7323): a SYN-ACK with
// the option, answering a SYN without, must not scale the server's windows, which the client's
// RSTs are checked against.
func TestServerWindowUnscaledWithoutClientOption(t *testing.T) {
	eachProg(t, testServerWindowUnscaledWithoutClientOption)
}

func testServerWindowUnscaledWithoutClientOption(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	client, vip, a := ap("198.51.100.10:43114"), ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x02, seq: 0x12345678, window: 64240}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 0x9abcdef0, ack: 0x12345679, window: 65160, options: padOpts(tcpOpts)}))
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x10, seq: 0x12345679, ack: 0x9abcdef1, window: 502}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x10, seq: 0x9abcdef1, ack: 0x12345679, window: 512}))
	if got := flowSide(t, r, a, client); got.win != 512 {
		t.Errorf("the server's window: %d, want 512 (unscaled: the client offered no scale)", got.win)
	}
}
