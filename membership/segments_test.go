package membership

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
)

// TestSegmentReadiness: n2 is in A = {n1,n2,n3} and B = {n2,n3,n4}. Each segment has its own
// majority; n3's ready flag for A says nothing about B; heartbeats go to the members of n2's
// segments only, one datagram per shared segment.
func TestSegmentReadiness(t *testing.T) {
	key := testKeys[0]
	conn := &recordConn{}
	m, err := newMembers(hclog.NewNullLogger(), "n2", Options{Keys: [][]byte{key}}, conn)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string][]netip.Addr{}
	for i, n := range []string{"n1", "n2", "n3", "n4", "n5", "n6"} {
		addrs[n] = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})}
	}
	A, B, C := []string{"n1", "n2", "n3"}, []string{"n2", "n3", "n4"}, []string{"n5", "n6"}
	m.SetSegments(addrs, [][]string{A, B, C})
	m.SetWilling(true)
	ka, kb := SegmentKey(A), SegmentKey(B)
	now := time.Now().Add(time.Second) // past the start-up grace
	counter := uint64(1e18)
	send := func(from string, seg []string, ready bool) {
		t.Helper()
		counter++
		b := seal(t, key, "n2", heartbeat{name: from, ready: ready, counter: counter, echo: m.boot, digest: SegmentKey(seg), heard: newBitmap(3)})
		now = now.Add(time.Millisecond)
		if r := m.handle(b, addrs[from][0], now); r != acceptedReason {
			t.Fatalf("heartbeat of %s: %s", from, r)
		}
	}
	views := func() string {
		m.evaluate(now)
		var out []string
		for _, k := range []uint64{ka, kb} {
			v := m.SegmentViews()[k]
			c := slices.Sorted(func(yield func(string) bool) {
				for n := range v.Candidates {
					if !yield(n) {
						return
					}
				}
			})
			out = append(out, fmt.Sprintf("ready=%v heard=%d/%d %v", v.Ready, v.Heard, v.Total, c))
		}
		return strings.Join(out, " | ")
	}
	if len(m.SegmentViews()) != 2 {
		t.Fatalf("n2 is in %d segments, want 2 (not C)", len(m.SegmentViews()))
	}
	send("n1", A, true)
	if got, want := views(), "ready=true heard=2/3 [n1 n2] | ready=false heard=1/3 []"; got != want {
		t.Errorf("n1 heard:\n got %s\nwant %s", got, want)
	}
	send("n3", A, true)
	send("n3", B, false) // n3 hears too little of B
	if got, want := views(), "ready=true heard=3/3 [n1 n2 n3] | ready=true heard=2/3 [n2]"; got != want {
		t.Errorf("n3 ready in A only:\n got %s\nwant %s", got, want)
	}
	// A stranger's digest (lists not agreed yet) from a member of two segments: liveness counts,
	// the ready flag cannot be placed and the last readable ones stay.
	send("n3", []string{"n2", "n3"}, false)
	if got, want := views(), "ready=true heard=3/3 [n1 n2 n3] | ready=true heard=2/3 [n2]"; got != want {
		t.Errorf("unknown digest:\n got %s\nwant %s", got, want)
	}
	// Heartbeats: to n1 (A), n3 (A and B: two datagrams), n4 (B); never to n5 and n6.
	m.send(nil)
	got := map[string]int{}
	for _, d := range conn.dsts {
		got[d.Addr().String()]++
	}
	if d := cmp.Diff(map[string]int{"192.0.2.1": 1, "192.0.2.3": 2, "192.0.2.4": 1}, got); d != "" {
		t.Errorf("heartbeats sent (-want +got):\n%s", d)
	}

	// In no segment at all: nothing is sent, never ready.
	conn.dsts = nil
	m.SetSegments(addrs, [][]string{C})
	m.send(nil)
	if len(conn.dsts) != 0 || m.View().Ready {
		t.Errorf("in no segment: sent %d heartbeats, view %+v", len(conn.dsts), m.View())
	}
}

// recordConn records what is sent.
type recordConn struct {
	mu   sync.Mutex
	dsts []netip.AddrPort
}

func (c *recordConn) ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error) {
	select {}
}
func (c *recordConn) WriteToUDPAddrPort(b []byte, a netip.AddrPort) (int, error) {
	c.mu.Lock()
	c.dsts = append(c.dsts, a)
	c.mu.Unlock()
	return len(b), nil
}
func (c *recordConn) Close() error { return nil }

// TestSegmentsOverUDP: four members over real UDP on loopback, segments A = {n1,n2,n3} and
// B = {n3,n4}. When n3 is cut off from everyone, A's majority (n1, n2) takes its place there, n3
// stops announcing A's VIPs, and B keeps exactly one owner by the two-member rule (n3, the lower
// name, alone; n4 yields): each segment decides by its own members, and no segment has two owners.
func TestSegmentsOverUDP(t *testing.T) {
	f := &fabric{}
	names := []string{"n1", "n2", "n3", "n4"}
	ms, _ := startMembers(t, f, names...)
	addrs := map[string][]netip.Addr{}
	for i, n := range names {
		addrs[n] = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})}
	}
	A, B := []string{"n1", "n2", "n3"}, []string{"n3", "n4"}
	for _, m := range ms {
		m.SetSegments(addrs, [][]string{A, B})
	}
	ka, kb := SegmentKey(A), SegmentKey(B)
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
	if _, ok := ms["n1"].SegmentViews()[kb]; ok {
		t.Error("n1 has a view of segment B, which it is not in")
	}
	f.isolate("n3", true, "n1", "n2", "n4")
	d := wait(map[string]string{"n1/A": "true n1,n2", "n2/A": "true n1,n2", "n3/A": "false ",
		"n3/B": "true n3", "n4/B": "false "})
	t.Logf("n3 cut off: A decided by n1, n2 and B by n3 alone %v later", d.Round(time.Millisecond))
	f.isolate("n3", false, "n1", "n2", "n4")
	wait(map[string]string{"n1/A": "true n1,n2,n3", "n3/A": "true n1,n2,n3", "n3/B": "true n3,n4", "n4/B": "true n3,n4"})
}
