package speaker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// segWorld: rack a = n1, n2, n3 and the witness w1; rack b = n4; n5 in rack a but excluded from
// load balancers; n6 is a Node without a speaker (not passed as one).
func segWorld() *l2World {
	w := newL2World()
	w.st.Nodes = map[string]*cluster.Node{}
	for n, l := range map[string]map[string]string{
		"n1": {"rack": "a"}, "n2": {"rack": "a"}, "n3": {"rack": "a"}, "n4": {"rack": "b"},
		"n5": {"rack": "a", ExcludeFromLBLabel: ""}, "n6": {"rack": "a"}, "w1": {"rack": "a", WitnessLabel: "true"},
	} {
		w.st.Nodes[n] = &cluster.Node{Name: n, Labels: l}
	}
	rack := func(r string) []metav1.LabelSelector {
		return []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": r}}}
	}
	return w.pool("a", nil, "192.0.2.0/26").pool("a2", nil, "192.0.2.64/26").pool("b", nil, "198.51.100.0/24").
		pool("ab", nil, "203.0.113.0/25").pool("nobody", nil, "203.0.113.128/25").pool("bgp-only", nil, "2001:db8::/64").
		ad("rack-a", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"a", "a2"}, NodeSelectors: rack("a")}).
		ad("rack-b", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"b"}, NodeSelectors: rack("b")}).
		ad("everywhere", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"ab"}}).
		ad("rack-z", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"nobody"}, NodeSelectors: rack("z")})
}

var segSpeakers = []string{"n1", "n2", "n3", "n4", "n5", "w1"}

func TestL2Segments(t *testing.T) {
	got := L2Segments(segWorld().st, segSpeakers)
	type seg struct{ Members, Pools string }
	var gotS []seg
	for _, g := range got {
		if g.Key != memberDigest(g.Members) {
			t.Errorf("segment %v: key %x is not the digest of its members", g.Members, g.Key)
		}
		gotS = append(gotS, seg{strings.Join(g.Members, ","), strings.Join(g.Pools, ",")})
	}
	slices.SortFunc(gotS, func(a, b seg) int { return strings.Compare(a.Members, b.Members) })
	want := []seg{
		// n5 is excluded, n6 runs no speaker, the witness votes; the two rack-a pools share one.
		{"n1,n2,n3,n4,w1", mlbNS + "/ab"},
		{"n1,n2,n3,w1", mlbNS + "/a," + mlbNS + "/a2"},
		{"n4", mlbNS + "/b"},
	}
	if d := cmp.Diff(want, gotS); d != "" {
		t.Errorf("segments (-want +got):\n%s", d)
	}
	if d := cmp.Diff([][]string{{"n4"}}, SegmentsOf(got, "n4")[1:]); d != "" && len(SegmentsOf(got, "n4")) != 2 {
		t.Errorf("n4's segments: %v", SegmentsOf(got, "n4"))
	}
	if s := SegmentsOf(got, "n6"); s != nil {
		t.Errorf("a node without a speaker is in segments %v", s)
	}
	// The same on every node, whatever order the speakers come in.
	rev := slices.Clone(segSpeakers)
	slices.Reverse(rev)
	if d := cmp.Diff(got, L2Segments(segWorld().st, rev)); d != "" {
		t.Errorf("order of speakers changes the segments:\n%s", d)
	}
}

// TestDecideL2Segments: an IP's candidates are its segment's; an IP of a segment this node is not
// in has no owner here; a witness never owns.
func TestDecideL2Segments(t *testing.T) {
	w := segWorld().svc("in-a", false, []string{"192.0.2.10"}, "n1", "n2").svc("in-b", false, []string{"198.51.100.10"}, "n4").
		svc("in-ab", false, []string{"203.0.113.10"}, "n1").svc("local-a", true, []string{"192.0.2.70"}, "n3", "n6")
	segs := L2Segments(w.st, segSpeakers)
	keyOf := func(members string) uint64 { return memberDigest(strings.Split(members, ",")) }
	views := map[uint64]View{
		// n3 is silent in rack a; in the big segment everyone but the witness is a candidate (it is
		// ready and heard, but never announces).
		keyOf("n1,n2,n3,w1"):       {Candidates: map[string]bool{"n1": true, "n2": true, "w1": true}},
		keyOf("n1,n2,n3,n4,w1"):    {Candidates: map[string]bool{"n1": true, "n2": true, "n3": true, "n4": true, "w1": true}},
		keyOf("not,a,segment,any"): {Candidates: map[string]bool{"n9": true}},
	}
	_, decisions := DecideL2(L2Input{Self: "n1", State: w.st, Segments: segs, SegmentViews: views,
		Links:  []Link{{Name: "eth0", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.11/24"), netip.MustParsePrefix("203.0.113.11/24")}}},
		Owners: NewOwnerCache()})
	got := map[string]string{}
	for _, d := range decisions {
		got[d.Service.Name] = d.Owner + " | " + d.Reason
	}
	want := map[string]string{
		"in-a":    hashOwner("192.0.2.10", "n1", "n2") + " | ",
		"in-b":    " | this node is not in the IP's L2 segment (1 speakers); they decide its owner",
		"in-ab":   hashOwner("203.0.113.10", "n1", "n2", "n3", "n4") + " | ",
		"local-a": " | no live eligible node with a local endpoint (externalTrafficPolicy Local)",
	}
	for k, v := range want {
		if strings.HasPrefix(v, "n1 |") {
			// Self owns: it also gets interfaces; only compare the owner and reason.
			want[k] = "n1 | "
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("decisions (-want +got):\n%s", d)
	}
}

// TestSegmentReadiness: n2 is in A = {n1,n2,n3} and B = {n2,n3,n4}. Each segment has its own
// majority; n3's ready flag for A says nothing about B; heartbeats go to the members of n2's
// segments only, one datagram per shared segment.
func TestSegmentReadiness(t *testing.T) {
	key := testKeys[0]
	conn := &recordConn{}
	m, err := newMembers(hclog.NewNullLogger(), "n2", MemberOptions{Keys: [][]byte{key}}, conn)
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
	ka, kb := memberDigest(A), memberDigest(B)
	now := time.Now().Add(time.Second) // past the start-up grace
	counter := uint64(1e18)
	send := func(from string, seg []string, ready bool) {
		t.Helper()
		counter++
		b := seal(t, key, "n2", heartbeat{name: from, ready: ready, counter: counter, echo: m.boot, digest: memberDigest(seg), heard: newBitmap(3)})
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

// TestOwnerCacheProperty: on random sequences of candidates joining and leaving (one, a few, most
// of them at once) and VIPs coming and going, the cached owner of every VIP is the full
// computation's.
func TestOwnerCacheProperty(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var universe []string
		for i := range 60 {
			universe = append(universe, fmt.Sprintf("node-%02d", i))
		}
		vips := map[netip.Addr]bool{}
		for i := range 300 {
			vips[netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)})] = true
		}
		c := NewOwnerCache()
		cands := map[string]bool{}
		for step := range 150 {
			next := map[string]bool{}
			for n := range cands {
				next[n] = true
			}
			switch r := rng.IntN(10); {
			case r < 4: // one joins
				next[universe[rng.IntN(len(universe))]] = true
			case r < 8: // one leaves
				for n := range next {
					delete(next, n)
					break
				}
			case r < 9: // many change at once
				for _, n := range universe {
					if rng.IntN(3) == 0 {
						next[n] = !next[n]
						if !next[n] {
							delete(next, n)
						}
					}
				}
			default: // VIPs come and go
				for i := range 20 {
					vips[netip.AddrFrom4([4]byte{10, 1, byte(step), byte(i)})] = rng.IntN(2) == 0
				}
			}
			cands = next
			c.begin()
			s := c.set("pool", cloneSet(cands))
			for ip, on := range vips {
				if !on {
					continue
				}
				if got, want := s.owner(ip, c.gen), rendezvousOwner(cands, ip); got != want {
					t.Fatalf("seed %d step %d: owner of %s = %q, want %q (%d candidates)", seed, step, ip, got, want, len(cands))
				}
			}
			c.end()
		}
	}
}

func cloneSet(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// BenchmarkDecideL2MembershipChange: 1,000 VIPs over N candidates; each iteration one candidate
// leaves or comes back (a membership change) and DecideL2 runs again, without (full) and with the
// OwnerCache (cached).
func BenchmarkDecideL2MembershipChange(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		w := newL2World().pool("lan", nil, "10.0.0.0/16").ad("lan", metallbv1beta1.L2AdvertisementSpec{})
		w.st.Nodes = map[string]*cluster.Node{}
		live := map[string]bool{}
		for i := range n {
			name := fmt.Sprintf("node-%04d", i)
			w.st.Nodes[name] = &cluster.Node{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}
			live[name] = true
		}
		for i := range 1000 {
			w.svc(fmt.Sprintf("s%04d", i), false, []string{netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)}).String()}, "node-0000")
		}
		without := cloneSet(live)
		delete(without, "node-0001")
		for _, mode := range []string{"full", "cached"} {
			b.Run(fmt.Sprintf("candidates=%d/vips=1000/%s", n, mode), func(b *testing.B) {
				var owners *OwnerCache
				if mode == "cached" {
					owners = NewOwnerCache()
				}
				DecideL2(L2Input{Self: "node-0000", Live: live, State: w.st, Owners: owners})
				for i := 0; b.Loop(); i++ {
					l := live
					if i%2 == 0 {
						l = without
					}
					DecideL2(L2Input{Self: "node-0000", Live: l, State: w.st, Owners: owners})
				}
			})
		}
	}
}

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
	ka, kb := memberDigest(A), memberDigest(B)
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
