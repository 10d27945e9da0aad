package membership

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHasQuorum(t *testing.T) {
	for _, tc := range []struct {
		self         string
		heard, total int
		other        string
		want         bool
	}{
		{"a", 1, 1, "", true},  // alone by configuration
		{"a", 2, 3, "", true},  // majority
		{"a", 1, 3, "", false}, // minority
		{"a", 2, 4, "", false}, // half is not a majority
		{"a", 2, 2, "b", true}, // two members that hear each other
		{"a", 1, 2, "b", true}, // two members, alone: the lower name keeps announcing
		{"b", 1, 2, "a", false},
	} {
		if got := hasQuorum(tc.self, tc.heard, tc.total, tc.other); got != tc.want {
			t.Errorf("hasQuorum(%s, %d/%d) = %v, want %v", tc.self, tc.heard, tc.total, got, tc.want)
		}
	}
}

// fabric cuts heartbeats between members: cut[a][b] drops what b receives from a.
type fabric struct {
	mu  sync.Mutex
	cut map[[2]string]bool
}

func (f *fabric) set(from, to string, cut bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut == nil {
		f.cut = map[[2]string]bool{}
	}
	f.cut[[2]string{from, to}] = cut
}

func (f *fabric) isolate(n string, cut bool, others ...string) {
	for _, o := range others {
		f.set(n, o, cut)
		f.set(o, n, cut)
	}
}

func (f *fabric) drops(to string) func(string) bool {
	return func(from string) bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.cut[[2]string{from, to}]
	}
}

// startMembers runs members on loopback addresses 127.0.0.1.. with real UDP heartbeats (the default
// direct-members limit: all-to-all). It returns the members and a function that kills one.
func startMembers(t *testing.T, f *fabric, names ...string) (map[string]*Members, func(string)) {
	t.Helper()
	ms, kill, _ := startMembersLimit(t, f, 0, names...)
	return ms, kill
}

var portSeq atomic.Int32

// testKeys is the membership key of the tests.
var testKeys = [][]byte{[]byte("0123456789abcdef0123456789abcdef")}

// describe renders a view as "ready candidates", e.g. "true n1,n2".
func describe(v View) string {
	var c []string
	for n := range v.Candidates {
		c = append(c, n)
	}
	slices.Sort(c)
	return fmt.Sprintf("%v %s", v.Ready, strings.Join(c, ","))
}

// waitViews polls until every member's view is as wanted and returns how long that took.
func waitViews(t *testing.T, ms map[string]*Members, want map[string]string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for {
		got := map[string]string{}
		for n := range want {
			got[n] = describe(ms[n].View())
		}
		if cmp.Equal(want, got) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("views (-want +got):\n%s", cmp.Diff(want, got))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMembers(t *testing.T) {
	f := &fabric{}
	ms, kill := startMembers(t, f, "n1", "n2", "n3")
	all := "true n1,n2,n3"
	d := waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	t.Logf("three members agree after %v", d)

	// A partial partition: n1 and n2 cannot hear each other, both hear n3. Nobody may drop the other
	// (else n1 and n2 would both take each other's VIPs): n3 vouches for both.
	f.set("n1", "n2", true)
	f.set("n2", "n1", true)
	time.Sleep(3 * DefaultDeadAfter)
	waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	f.set("n1", "n2", false)
	f.set("n2", "n1", false)

	// A full partition: n3 alone loses its majority and stops; n1 and n2 carry on without it. A
	// sampler looks for the moments when n3 still announces while n1 already took its VIPs.
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
			if ms["n3"].View().Ready && !ms["n1"].View().Candidates["n3"] {
				n++
			}
		}
	}()
	f.isolate("n3", true, "n1", "n2")
	d = waitViews(t, ms, map[string]string{"n1": "true n1,n2", "n2": "true n1,n2", "n3": "false "})
	close(stop)
	t.Logf("partition {n1,n2} | {n3} settled after %v; samples with n3 still ready while n1 dropped it: %d", d, <-overlaps)
	f.isolate("n3", false, "n1", "n2")
	d = waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	t.Logf("partition healed after %v", d)

	// A member dies: the others drop it after DeadAfter.
	start := time.Now()
	kill("n2")
	waitViews(t, ms, map[string]string{"n1": "true n1,n3", "n3": "true n1,n3"})
	t.Logf("n2's death noticed after %v (DeadAfter %v)", time.Since(start), DefaultDeadAfter)
}

func TestMembersTwoNodes(t *testing.T) {
	f := &fabric{}
	ms, _ := startMembers(t, f, "a", "b")
	waitViews(t, ms, map[string]string{"a": "true a,b", "b": "true a,b"})
	// Partitioned, only the lower name keeps announcing: never two owners.
	f.isolate("b", true, "a")
	waitViews(t, ms, map[string]string{"a": "true a", "b": "false "})
	f.isolate("b", false, "a")
	waitViews(t, ms, map[string]string{"a": "true a,b", "b": "true a,b"})
}

func TestMembersIgnoresStrangers(t *testing.T) {
	f := &fabric{}
	ms, _ := startMembers(t, f, "n1", "n2", "n3")
	all := "true n1,n2,n3"
	waitViews(t, ms, map[string]string{"n1": all, "n2": all, "n3": all})
	// n3 forgets n2's address: n2's heartbeats no longer count for n3, but n1 still vouches for it.
	ms["n3"].SetPeers(map[string][]netip.Addr{"n1": {netip.MustParseAddr("127.0.0.1")}, "n2": {netip.MustParseAddr("127.0.0.9")}})
	time.Sleep(3 * DefaultDeadAfter)
	if v := ms["n3"].View(); v.Heard != 2 || !v.Ready || !v.Candidates["n2"] {
		t.Errorf("n3's view: %+v", v)
	}
}
