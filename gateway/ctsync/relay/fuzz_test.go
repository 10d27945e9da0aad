package relay

import (
	"bytes"
	"testing"
)

// FuzzRelayDatagram feeds the relay's receiver (session.fromPeer: parse, MAC, challenge, window,
// FTFW scan) arbitrary datagrams from the LAN (mode 0) and arbitrary conntrackd payloads sealed by a
// real peer (mode 1, which gets past the MAC to the FTFW scan). It must never panic, hand
// conntrackd something only with the verdict forwarded, and then only a payload the peer sealed
// (the relays' numbers are the same in every run, so a seed sealed by the peer verifies), whole
// FTFW messages only, once.
func FuzzRelayDatagram(f *testing.F) {
	p := newPair(f, DefaultLimits)
	p.handshake()
	good, _ := p.a.fromDaemon(update)
	f.Add(byte(0), good)
	f.Add(byte(0), p.a.Hello())
	f.Add(byte(0), good[:Overhead])
	f.Add(byte(1), bytes.Join([][]byte{update, resyncReq}, nil))
	f.Add(byte(1), update[:9])
	f.Fuzz(func(t *testing.T, mode byte, in []byte) {
		p := newPair(t, DefaultLimits)
		p.handshake()
		msg := in
		if mode&1 == 1 {
			var v Verdict
			if msg, v = p.a.fromDaemon(in); msg == nil {
				if len(in) != 0 && len(in) <= MaxPayload {
					t.Fatalf("a valid payload was not sealed: %s", v)
				}
				return
			}
		}
		payload, _, v := p.b.fromPeer(msg)
		if (payload != nil) != (v == Forwarded) {
			t.Fatalf("verdict %s with payload %v", v, payload != nil)
		}
		if payload == nil {
			return
		}
		if mode&1 == 0 {
			// Only a datagram the peer signed (the seeds are: the fuzzer cannot forge one).
			if !verify(p.b.recv, in) || !bytes.Equal(payload, in[headerLen:len(in)-tagLen]) {
				t.Fatalf("an unsigned datagram was forwarded: %x", in)
			}
		} else if !bytes.Equal(payload, in) {
			t.Fatalf("forwarded %x, the peer sealed %x", payload, in)
		}
		if _, _, ok := scanFTFW(payload); !ok {
			t.Fatalf("forwarded a payload that is not whole FTFW messages: %x", payload)
		}
		// Once only.
		if payload, _, v := p.b.fromPeer(msg); payload != nil || v != Replayed {
			t.Fatalf("the same datagram again: %s", v)
		}
	})
}
