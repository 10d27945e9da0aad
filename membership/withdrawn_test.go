package membership

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestWithdrawnOverUDP: three members over real UDP on loopback. A member withdrawn from the
// segment (its announcing link is down: SetWithdrawn) is a candidate nowhere, its own view
// included, but still votes: with n1 withdrawn and n3 dead, n2 keeps its majority (n1 and n2 of
// three) and is the only candidate. Taken back, n1 is a candidate everywhere again.
func TestWithdrawnOverUDP(t *testing.T) {
	f := &fabric{}
	ms, kill := startMembers(t, f, "n1", "n2", "n3")
	all := "true n1,n2,n3"
	waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})

	seg := []string{"n3", "n1", "n2"} // any order: the list is sorted as SetSegments sorts it
	start := time.Now()
	ms["n1"].SetWithdrawn([][]string{seg})
	if got := describe(ms["n1"].View()); got != "false n2,n3" {
		t.Errorf("n1 right after SetWithdrawn: %q, want %q (it stops at once)", got, "false n2,n3")
	}
	d := waitViews(t, ms, map[string]string{"n1": "false n2,n3", "n2": "true n2,n3", "n3": "true n2,n3"})
	t.Logf("n1 withdrawn: the others dropped it after %v", d)
	if d > time.Second {
		t.Logf("(slow machine: %v since SetWithdrawn)", time.Since(start))
	}

	kill("n3")
	waitViews(t, ms, map[string]string{"n1": "false n2", "n2": "true n2"})

	ms["n1"].SetWithdrawn(nil)
	waitViews(t, ms, map[string]string{"n1": "true n1,n2", "n2": "true n1,n2"})
}

// TestWithdrawnPerSegment: n2 is in A = {n1,n2,n3} and B = {n2,n3,n4}; withdrawn from A it is not
// ready there, and still ready in B; its heartbeats for A say "not ready", those for B "ready". A
// withdrawal of a segment n2 is not in yet applies when the segment appears.
func TestWithdrawnPerSegment(t *testing.T) {
	key := testKeys[0]
	m, err := newMembers(hclog.NewNullLogger(), "n2", Options{Keys: [][]byte{key}}, &queueConn{})
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string][]netip.Addr{}
	for i, n := range []string{"n1", "n2", "n3", "n4"} {
		addrs[n] = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})}
	}
	A, B := []string{"n1", "n2", "n3"}, []string{"n2", "n3", "n4"}
	m.SetWithdrawn([][]string{A}) // before the segment exists
	m.SetSegments(addrs, [][]string{A, B})
	m.SetWilling(true)
	now := time.Now().Add(time.Second)
	counter := uint64(1e18)
	for _, hb := range []struct {
		from string
		seg  []string
	}{{"n1", A}, {"n3", A}, {"n3", B}, {"n4", B}} {
		counter++
		b := seal(t, key, "n2", heartbeat{name: hb.from, ready: true, counter: counter, echo: m.boot, digest: SegmentKey(hb.seg), heard: newBitmap(3)})
		now = now.Add(time.Millisecond)
		if r := m.handle(b, addrs[hb.from][0], now); r != acceptedReason {
			t.Fatalf("heartbeat of %s: %s", hb.from, r)
		}
	}
	m.evaluate(now)
	views := m.SegmentViews()
	if got, want := describe(views[SegmentKey(A)]), "false n1,n3"; got != want {
		t.Errorf("A (withdrawn): %q, want %q", got, want)
	}
	if got, want := describe(views[SegmentKey(B)]), "true n2,n3,n4"; got != want {
		t.Errorf("B: %q, want %q", got, want)
	}
	conn := m.conn.(*queueConn)
	conn.q = nil
	m.send(nil)
	ready := map[uint64]bool{}
	for _, d := range conn.q {
		var hb heartbeat
		if r := parseHeartbeat(d.b, &hb); r != acceptedReason {
			t.Fatalf("sent heartbeat: %s", r)
		}
		ready[hb.digest] = hb.ready
	}
	if ready[SegmentKey(A)] || !ready[SegmentKey(B)] {
		t.Errorf("heartbeats' ready flags by segment: A %v, B %v; want false, true", ready[SegmentKey(A)], ready[SegmentKey(B)])
	}
	m.SetWithdrawn(nil)
	if got, want := describe(m.SegmentViews()[SegmentKey(A)]), "true n1,n2,n3"; got != want {
		t.Errorf("A taken back: %q, want %q", got, want)
	}
}

// TestWithdrawnNotForgeable: "this node's link is down" is the ready flag of an authenticated
// heartbeat, so a LAN attacker can neither forge it (another key, a flipped flag) nor replay a
// genuine one captured while n1 was withdrawn once n1 is back: n1 stays a candidate.
func TestWithdrawnNotForgeable(t *testing.T) {
	key, other := testKeys[0], []byte("another key, not the members'!!!")
	f := newAuthFixture(t, key)
	captured := f.from("n1", false, key) // n1 withdrawn: genuine, recorded by the attacker
	if r := f.deliver(captured, "192.0.2.1"); r != acceptedReason {
		t.Fatalf("genuine withdrawn heartbeat: %s", r)
	}
	if r := f.deliver(f.from("n1", true, key), "192.0.2.1"); r != acceptedReason {
		t.Fatalf("n1 back: %s", r)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want dropReason
	}{
		{"replayed withdrawal", captured, dropReplay},
		{"forged withdrawal (another key)", f.from("n1", false, other), dropBadMAC},
		{"ready flag flipped to withdrawn", flip(f.from("n1", true, key), 4), dropBadMAC},
	} {
		if got := f.deliver(tc.b, "192.0.2.1"); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	f.m.evaluate(f.now)
	if !f.m.View().Candidates["n1"] {
		t.Errorf("n1 dropped by a forged or replayed withdrawal: %+v", f.m.View())
	}
}
