package membership

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestMembersStallGrace: when this process itself stalls (its ticker fires 1.5 s late), the
// heartbeats that arrived meanwhile are still unread; the first tick after the stall must not expire
// the peers, and reading them within the grace keeps the node ready. A peer that really went silent
// is expired one tick later.
func TestMembersStallGrace(t *testing.T) {
	key := testKeys[0]
	m, err := newMembers(hclog.NewNullLogger(), "a", Options{Keys: [][]byte{key}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := map[string]netip.Addr{"b": netip.MustParseAddr("192.0.2.2"), "c": netip.MustParseAddr("192.0.2.3")}
	now := time.Unix(1e9, 0)
	m.mu.Lock()
	m.setMembershipLocked(map[string][]netip.Addr{"b": {addr["b"]}, "c": {addr["c"]}}, nil, false, now)
	m.mu.Unlock()
	m.SetWilling(true)
	counter := map[string]uint64{}
	beat := func(from string, at time.Time) {
		t.Helper()
		m.mu.Lock()
		digest := m.segs[0].key
		n := len(m.segs[0].sorted)
		m.mu.Unlock()
		counter[from]++
		hb := heartbeat{name: from, ready: true, counter: counter[from], echo: m.boot, digest: digest, heard: newBitmap(n)}
		b, _ := appendHeartbeat(nil, &hb)
		b = mac(key, m.self, b, b)
		if got := m.handle(b, addr[from], at); got != acceptedReason {
			t.Fatalf("heartbeat of %s: %s", from, got)
		}
	}
	tick := m.tick()
	step := func(at time.Time) {
		m.stalled(at)
		m.evaluate(at)
	}
	// Normal operation for a second: everyone heard, this node ready.
	for i := 0; i < 40; i++ {
		now = now.Add(tick)
		if i%4 == 0 {
			beat("b", now)
			beat("c", now)
		}
		step(now)
	}
	if v := m.View(); !v.Ready || v.Heard != 3 {
		t.Fatalf("before the stall: %+v", v)
	}
	// The process stalls 1.5 s: the first tick after it must not expire anyone...
	now = now.Add(1500 * time.Millisecond)
	step(now)
	if v := m.View(); !v.Ready || v.Heard != 3 {
		t.Fatalf("first tick after a stall expired the peers: %+v", v)
	}
	// ... the receiver then reads b's buffered heartbeat (c's never came: c is really gone) ...
	beat("b", now.Add(time.Millisecond))
	// ... and one tick later c, silent for 1.5 s, is expired, b is not.
	now = now.Add(tick)
	step(now)
	v := m.View()
	if !v.Ready || v.Heard != 2 {
		t.Fatalf("after the grace: want ready with 2 of 3 heard, got %+v", v)
	}
}
