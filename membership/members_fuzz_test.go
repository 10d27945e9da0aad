package membership

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// FuzzMembershipDatagram feeds arbitrary datagrams to both wire parsers (heartbeat VGH3, gossip
// VGG1) and to a member's handle, in all-to-all and in gossip mode: no panic; what a parser accepts
// encodes back to the same bytes; and nothing is ever accepted whose MAC does not verify (the
// fuzzer cannot forge one, so only the unmutated seeds may count).
//
//	go test -run '^$' -fuzz '^FuzzMembershipDatagram$' -fuzztime 20000x ./membership/
func FuzzMembershipDatagram(f *testing.F) {
	addrs := map[string][]netip.Addr{
		"n1": {netip.MustParseAddr("192.0.2.1")}, "n2": {netip.MustParseAddr("192.0.2.2")}, "n3": {netip.MustParseAddr("192.0.2.3")},
	}
	mk := func(limit int) *Members {
		m, err := newMembers(hclog.NewNullLogger(), "n2", Options{Keys: testKeys, DirectMembersLimit: limit}, &queueConn{})
		if err != nil {
			f.Fatal(err)
		}
		m.SetPeers(addrs)
		m.SetWilling(true)
		return m
	}
	direct, gossip := mk(0), mk(-1)
	for _, m := range []*Members{direct, gossip} {
		hb := heartbeat{name: "n1", ready: true, counter: 5, echo: m.boot, digest: m.segs[0].key, heard: newBitmap(3)}
		b, _ := appendHeartbeat(nil, &hb)
		f.Add(mac(testKeys[0], "n2", b, b), byte(1))
		// n1 withdrawn from the segment (its announcing link is down: SetWithdrawn): not ready.
		hb = heartbeat{name: "n1", counter: 6, echo: m.boot, digest: m.segs[0].key, heard: newBitmap(3)}
		b, _ = appendHeartbeat(nil, &hb)
		f.Add(mac(testKeys[0], "n2", b, b), byte(1))
		gc := gossipChunk{name: "n3", ready: true, counter: 9, echo: m.boot, digest: m.segs[0].key, unit: 1500 * time.Microsecond,
			total: 3, entries: []byte{gossipReady, 3, gossipUnknown}}
		g, _ := appendGossip(nil, &gc)
		f.Add(mac(testKeys[0], "n2", g, g), byte(3))
	}
	f.Add([]byte("VGH3"), byte(0))
	f.Add([]byte("VGG1\x00\x02n1"), byte(2))
	now := time.Now()
	f.Fuzz(func(t *testing.T, b []byte, src byte) {
		var hb heartbeat
		if parseHeartbeat(b, &hb) == acceptedReason {
			body, err := appendHeartbeat(nil, &hb)
			if err == nil && !bytes.Equal(body, b[:len(b)-macSize]) {
				t.Fatalf("heartbeat does not encode back: %x != %x", body, b[:len(b)-macSize])
			}
		}
		var gc gossipChunk
		if parseGossip(b, &gc) == acceptedReason {
			gc.entries = bytes.Clone(gc.entries)
			body, err := appendGossip(nil, &gc)
			if err != nil && len(gc.name) <= 253 {
				t.Fatalf("an accepted gossip chunk does not encode: %v", err)
			}
			if err == nil && !bytes.Equal(body, b[:len(b)-macSize]) {
				t.Fatalf("gossip chunk does not encode back: %x != %x", body, b[:len(b)-macSize])
			}
		}
		from := netip.AddrFrom4([4]byte{192, 0, 2, src%4 + 1})
		now = now.Add(time.Millisecond)
		for _, m := range []*Members{direct, gossip} {
			if r := m.handle(bytes.Clone(b), from, now); r == acceptedReason && (len(b) < macSize || !verify(testKeys, "n2", b)) {
				t.Fatalf("accepted a datagram whose MAC does not verify: %x", b)
			}
			m.evaluate(now)
			m.conn.(*queueConn).q = nil
		}
	})
}
