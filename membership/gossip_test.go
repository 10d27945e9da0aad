package membership

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/hashicorp/go-hclog"
)

func TestGossipAgeCode(t *testing.T) {
	prev := byte(0)
	for u := int64(0); u <= gossipMaxUnits+20; u++ {
		c := ageCode(u)
		if c < prev {
			t.Fatalf("ageCode(%d) = %d < ageCode(%d) = %d: not monotonic", u, c, u-1, prev)
		}
		prev = c
		if u > gossipMaxUnits {
			if c != gossipUnknown {
				t.Errorf("ageCode(%d) = %d, want unknown", u, c)
			}
			continue
		}
		// Rounded up: the age a code stands for is never younger than the age encoded.
		if got := codeUnits(c); got < u || c == gossipUnknown {
			t.Errorf("ageCode(%d) = %d stands for %d units", u, c, got)
		}
	}
}

// Information only ages as it travels: relayed back and forth, an entry never comes back fresher
// than it left, and the readiness travels with the entry that wins.
func TestGossipMergeConservative(t *testing.T) {
	p := gossipParams{Unit: time.Millisecond, Stop: 400 * time.Millisecond, Dead: 800 * time.Millisecond, Relay: time.Hour}
	a, b := newGossipCore(3, 0, p, 0), newGossipCore(3, 1, p, 0)
	now := int64(time.Second)
	a.setSelf(now, true)
	a.fresh[2], a.ready[2] = now-int64(100*time.Millisecond), true
	b.merge(now, a.unit, 0, a.encode(now, nil, 0, 3), -1)
	if b.fresh[2] > a.fresh[2] || b.fresh[0] > now || !b.ready[2] || !b.ready[0] {
		t.Fatalf("relayed entries fresher than their source: %v, %v", b.fresh, b.ready)
	}
	before := a.fresh[2]
	for range 10 {
		now += int64(3 * time.Millisecond)
		a.merge(now, b.unit, 0, b.encode(now, nil, 0, 3), -1)
		b.merge(now, a.unit, 0, a.encode(now, nil, 0, 3), -1)
	}
	if a.fresh[2] != before {
		t.Errorf("member 2's entry came back fresher: %v, was %v", a.fresh[2], before)
	}
	// A fresher entry wins, with its readiness.
	b.fresh[2] = now
	b.ready[2] = false
	a.merge(now, b.unit, 0, b.encode(now, nil, 0, 3), -1)
	if a.ready[2] || a.fresh[2] <= before {
		t.Errorf("a fresher not-ready entry did not win: fresh %v ready %v", a.fresh[2], a.ready[2])
	}
	// Unknown entries are skipped; our own entry is ours alone.
	c := newGossipCore(3, 2, p, 0)
	a.merge(now, c.unit, 0, c.encode(now, nil, 0, 3), -1)
	if a.fresh[2] == never || a.fresh[0] == never {
		t.Errorf("unknown entries overwrote known ones: %v", a.fresh)
	}
}

func TestGossipWire(t *testing.T) {
	g := gossipChunk{name: "n1", ready: true, reply: true, counter: 7, echo: 9, digest: 42, unit: 1500 * time.Microsecond,
		total: 5, offset: 2, entries: []byte{1, 0x82, gossipUnknown}}
	b, err := appendGossip(nil, &g)
	if err != nil {
		t.Fatal(err)
	}
	b = mac(testKeys[0], "n2", b, b)
	var got gossipChunk
	if r := parseGossip(b, &got); r != acceptedReason {
		t.Fatal(r)
	}
	got.entries, g.count = append([]byte(nil), got.entries...), 3
	if got.name != g.name || got.ready != g.ready || got.reply != g.reply || got.counter != 7 || got.echo != 9 ||
		got.digest != 42 || got.unit != g.unit || got.total != 5 || got.offset != 2 || got.count != 3 || string(got.entries) != string(g.entries) {
		t.Errorf("round trip: %+v, want %+v", got, g)
	}
	if !verify(testKeys, "n2", b) || verify(testKeys, "n3", b) {
		t.Error("the MAC does not bind the receiver")
	}
	// A chunk of the largest size fits; one more entry is an error, never a cut.
	g = gossipChunk{name: "n1", unit: time.Millisecond, total: 60000, entries: make([]byte, gossipPerChunk(2))}
	if b, err := appendGossip(nil, &g); err != nil || len(b)+macSize != MaxHeartbeat {
		t.Errorf("a full chunk: %d bytes, %v", len(b)+macSize, err)
	}
	g.entries = append(g.entries, 0)
	if _, err := appendGossip(nil, &g); !errors.Is(err, errOversize) {
		t.Errorf("an oversize chunk: %v, want errOversize", err)
	}
	// Hostile headers.
	good, _ := appendGossip(nil, &gossipChunk{name: "n1", unit: time.Millisecond, total: 3, entries: []byte{0, 0, 0}})
	good = mac(testKeys[0], "n2", good, good)
	for name, mut := range map[string]func(b []byte) []byte{
		"count beyond the datagram": func(b []byte) []byte { b[6+2+24+6+1]++; return b },
		"offset beyond total":       func(b []byte) []byte { b[6+2+24+4+1] = 1; return b },
		"zero unit":                 func(b []byte) []byte { b[6+2+24] = 0; b[6+2+24+1] = 0; return b },
		"unknown flag":              func(b []byte) []byte { b[4] = 0x10; return b },
		"truncated":                 func(b []byte) []byte { return b[:20] },
		"oversize":                  func(b []byte) []byte { return append(b, make([]byte, MaxHeartbeat)...) },
	} {
		var g gossipChunk
		if r := parseGossip(mut(append([]byte(nil), good...)), &g); r == acceptedReason {
			t.Errorf("%s: accepted", name)
		}
	}
}

// startGossipMembers is startMembers in gossip mode (every segment gossips); kill stops a member
// and start starts it again (a new incarnation: new boot counter, nothing remembered).
func startGossipMembers(t *testing.T, f *fabric, names ...string) (ms map[string]*Members, kill, start func(string)) {
	return startMembersLimit(t, f, -1, names...)
}

// startMembersLimit is startGossipMembers with a given Options.DirectMembersLimit.
func startMembersLimit(t *testing.T, f *fabric, limit int, names ...string) (ms map[string]*Members, kill, start func(string)) {
	t.Helper()
	port := 20000 + (os.Getpid()+int(portSeq.Add(1)))%20000
	addrs := map[string][]netip.Addr{}
	for i, n := range names {
		addrs[n] = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})}
	}
	out := map[string]*Members{}
	cancels := map[string]context.CancelFunc{}
	start = func(n string) {
		m, err := New(hclog.NewNullLogger(), n, Options{Port: port, Bind: addrs[n][0], Keys: testKeys, DirectMembersLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		m.drop = f.drops(n)
		m.SetPeers(addrs)
		m.SetWilling(true)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); m.Close() })
		go m.Run(ctx)
		out[n], cancels[n] = m, cancel
	}
	for _, n := range names {
		start(n)
	}
	return out, func(n string) { cancels[n](); out[n].Close() }, start
}

// TestGossipMembers is TestMembers in gossip mode, over real UDP on loopback: agreement, a partial
// partition (relayed ages keep everyone's candidates equal), a full partition with a sampler for
// moments of two owners (the minority still ready while a majority member already dropped it),
// healing, a death and a restart (the first datagrams of a new incarnation are not fresh: answered,
// so the next ones count).
func TestGossipMembers(t *testing.T) {
	f := &fabric{}
	ms, kill, start := startGossipMembers(t, f, "n1", "n2", "n3")
	if ms["n1"].segs[0].gossip == nil {
		t.Fatal("not in gossip mode")
	}
	all := "true n1,n2,n3"
	d := waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	t.Logf("three gossiping members agree after %v (%+v)", d, ms["n1"].segs[0].gossip.p)

	f.set("n1", "n2", true)
	f.set("n2", "n1", true)
	time.Sleep(3 * DefaultDeadAfter)
	waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	f.set("n1", "n2", false)
	f.set("n2", "n1", false)

	stop := make(chan struct{})
	overlaps := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				overlaps <- n
				return
			case <-time.After(2 * time.Millisecond):
			}
			if ms["n3"].View().Ready && (!ms["n1"].View().Candidates["n3"] || !ms["n2"].View().Candidates["n3"]) {
				n++
			}
		}
	}()
	f.isolate("n3", true, "n1", "n2")
	d = waitViews(t, ms, map[string]string{"n1": "true n1,n2", "n2": "true n1,n2", "n3": "false "})
	close(stop)
	t.Logf("partition {n1,n2} | {n3} settled after %v; samples with n3 still ready while a majority member dropped it: %d", d, <-overlaps)
	f.isolate("n3", false, "n1", "n2")
	d = waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	t.Logf("partition healed after %v", d)

	kill("n2")
	d = waitViews(t, ms, map[string]string{"n1": "true n1,n3", "n3": "true n1,n3"})
	t.Logf("n2's death noticed after %v (Dead %v)", d, ms["n1"].segs[0].gossip.p.Dead)
	start("n2")
	d = waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	t.Logf("n2 restarted: everyone agrees after %v", d)
}

// TestGossipSegmentsOverUDP is TestSegmentsOverUDP with segment A = {n1,n2,n3} gossiping and B =
// {n3,n4} heartbeating all-to-all (limit 2), on one socket: n3, in both, is cut off; A is decided
// by n1 and n2, B by n3 alone (the lower name of two).
func TestGossipSegmentsOverUDP(t *testing.T) {
	f := &fabric{}
	names := []string{"n1", "n2", "n3", "n4"}
	ms, _, _ := startMembersLimit(t, f, 2, names...)
	addrs := map[string][]netip.Addr{}
	for i, n := range names {
		addrs[n] = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})}
	}
	A, B := []string{"n1", "n2", "n3"}, []string{"n3", "n4"}
	for _, m := range ms {
		m.SetSegments(addrs, [][]string{A, B})
	}
	ka, kb := SegmentKey(A), SegmentKey(B)
	ms["n3"].mu.Lock()
	for _, g := range ms["n3"].segs {
		if (g.gossip != nil) != (g.key == ka) {
			t.Errorf("segment %v: gossip %v, want only A to gossip", g.sorted, g.gossip != nil)
		}
	}
	ms["n3"].mu.Unlock()
	wait := func(want map[string]string) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			got := map[string]string{}
			for k := range want {
				n, seg, _ := strings.Cut(k, "/")
				key := ka
				if seg == "B" {
					key = kb
				}
				got[k] = describe(ms[n].SegmentViews()[key])
			}
			if cmp.Equal(want, got) {
				return time.Since(start)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("segment views (-want +got):\n%s", cmp.Diff(want, got))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait(map[string]string{"n1/A": "true n1,n2,n3", "n2/A": "true n1,n2,n3", "n3/A": "true n1,n2,n3",
		"n3/B": "true n3,n4", "n4/B": "true n3,n4"})
	f.isolate("n3", true, "n1", "n2", "n4")
	d := wait(map[string]string{"n1/A": "true n1,n2", "n2/A": "true n1,n2", "n3/A": "false ",
		"n3/B": "true n3", "n4/B": "false "})
	t.Logf("n3 cut off: A decided by n1, n2 and B by n3 alone %v later", d.Round(time.Millisecond))
	f.isolate("n3", false, "n1", "n2", "n4")
	wait(map[string]string{"n1/A": "true n1,n2,n3", "n3/A": "true n1,n2,n3", "n3/B": "true n3,n4", "n4/B": "true n3,n4"})
}

// TestGossipMemberListSkew: a speaker added to the segment reaches two of five members first (their
// informers are faster). For a while the two gossip against a 6-member list, the three against the
// old 5-member one: the two read the three's vectors by name (a list they had), the three count the
// two's own proofs of life, and nobody loses its quorum or a candidate (before: each side dropped
// the other's datagrams whole and the quorum could go).
func TestGossipMemberListSkew(t *testing.T) {
	f := &fabric{}
	names := []string{"n1", "n2", "n3", "n4", "n5"}
	ms, _, _ := startGossipMembers(t, f, names...)
	all := "true n1,n2,n3,n4,n5"
	want := map[string]string{}
	for _, n := range names {
		want[n] = all
	}
	waitViews(t, ms, want)
	time.Sleep(DefaultDeadAfter) // past the start-up grace (until then n6, never heard, would count)
	grown := map[string][]netip.Addr{"n6": {netip.AddrFrom4([4]byte{127, 0, 0, 6})}}
	for i, n := range names {
		grown[n] = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})}
	}
	ms["n1"].SetPeers(grown)
	ms["n2"].SetPeers(grown)
	lost := 0
	for end := time.Now().Add(4 * DefaultDeadAfter); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		for _, n := range names {
			if v := ms[n].View(); !v.Ready || len(v.Candidates) != 5 {
				lost++
				t.Logf("%s: %s (heard %d of %d)", n, describe(v), v.Heard, v.Total)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d samples with a member that lost its quorum or a candidate while the lists differed", lost)
	}
	if d1, d2 := ms["n1"].segs[0].key, ms["n3"].segs[0].key; d1 == d2 {
		t.Fatal("the lists do not differ: the test tests nothing")
	}
}
