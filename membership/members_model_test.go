package membership

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestMembersIncrementalMatchesModel drives one member with random heartbeats (readiness, heard
// sets, silences), member list changes and willingness changes on a virtual clock, and after every
// event compares its View — kept up to date incrementally (heardBy counts, dirty flags) — with the
// rules computed from scratch, as the protocol states them.
func TestMembersIncrementalMatchesModel(t *testing.T) {
	key := testKeys[0]
	m, err := newMembers(hclog.NewNullLogger(), "m00", Options{Keys: [][]byte{key}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	all := []string{}
	addr := map[string]netip.Addr{}
	for i := 1; i <= 12; i++ {
		n := fmt.Sprintf("m%02d", i)
		all = append(all, n)
		addr[n] = netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
	}
	// The model: what each listed peer last said, and when.
	type said struct {
		seen  time.Time
		ready bool
		heard map[string]bool
	}
	listed := map[string]bool{}
	model := map[string]*said{}
	counter := map[string]uint64{}
	willing := true
	now := time.Unix(1e9, 0)
	since := time.Time{}
	setPeers := func() {
		ps := map[string][]netip.Addr{}
		for n := range listed {
			ps[n] = []netip.Addr{addr[n]}
		}
		m.mu.Lock()
		m.setMembershipLocked(ps, nil, false, now)
		m.mu.Unlock()
		if since.IsZero() {
			since = now
		}
		for n := range model {
			if !listed[n] {
				delete(model, n)
			}
		}
		for _, s := range model {
			for h := range s.heard {
				if !listed[h] && h != m.self {
					delete(s.heard, h)
				}
			}
		}
	}
	for _, n := range all[:9] {
		listed[n] = true
	}
	setPeers()
	m.mu.Lock()
	m.willing = true
	m.markAllLocked()
	m.mu.Unlock()

	expected := func() string {
		dead, take := m.opts.DeadAfter, m.takeoverAfter()
		heard := 1
		vouched := map[string]bool{}
		for n, s := range model {
			if now.Sub(s.seen) < dead {
				heard++
			}
			if now.Sub(s.seen) < take {
				vouched[n] = true
			}
		}
		total := len(listed) + 1
		settled := heard == total || now.Sub(since) >= dead
		other := ""
		for n := range listed {
			other = n
		}
		ready := willing && settled && hasQuorum(m.self, heard, total, other)
		var c []string
		if ready {
			c = append(c, m.self)
		}
		for n := range listed {
			if vouched[n] {
				if model[n].ready {
					c = append(c, n)
				}
				continue
			}
			for k := range vouched {
				if model[k].heard[n] {
					c = append(c, n)
					break
				}
			}
		}
		slices.Sort(c)
		return describe(View{Ready: ready, Candidates: toSet(c)}) + fmt.Sprintf(" %d/%d", heard, total)
	}

	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(60)) * time.Millisecond)
		switch r := rng.IntN(100); {
		case r < 2: // a member joins or leaves the list
			n := all[rng.IntN(len(all))]
			if listed[n] {
				delete(listed, n)
			} else {
				listed[n] = true
			}
			setPeers()
		case r < 3:
			willing = !willing
			// (SetWilling itself evaluates at the wall clock's time, not the virtual one.)
			m.mu.Lock()
			m.willing = willing
			m.markAllLocked()
			m.mu.Unlock()
		case r < 90: // a heartbeat from a listed member, maybe against another member list
			var ls []string
			for n := range listed {
				ls = append(ls, n)
			}
			slices.Sort(ls)
			if len(ls) == 0 {
				continue
			}
			from := ls[rng.IntN(len(ls))]
			if rng.IntN(4) == 0 { // this one stays silent for a while
				continue
			}
			m.mu.Lock()
			sorted, digest := slices.Clone(m.segs[0].sorted), m.segs[0].key
			m.mu.Unlock()
			bits := newBitmap(len(sorted))
			heardSet := map[string]bool{}
			for i, n := range sorted {
				if rng.IntN(3) == 0 {
					bits.set(i)
					heardSet[n] = true
				}
			}
			stale := rng.IntN(10) == 0
			if stale {
				digest++
			}
			counter[from]++
			hb := heartbeat{name: from, ready: rng.IntN(5) != 0, counter: counter[from], echo: m.boot, digest: digest, heard: bits}
			b, _ := appendHeartbeat(nil, &hb)
			b = mac(key, m.self, b, b)
			if got := m.handle(b, addr[from], now); got != acceptedReason {
				t.Fatalf("step %d: heartbeat of %s: %s", step, from, got)
			}
			s := model[from]
			if s == nil {
				s = &said{}
				model[from] = s
			}
			s.seen, s.ready = now, hb.ready
			if !stale {
				s.heard = heardSet
			}
		}
		m.evaluate(now)
		v := m.View()
		got := describe(v) + fmt.Sprintf(" %d/%d", v.Heard, v.Total)
		if want := expected(); got != want {
			for n, s := range model {
				t.Logf("model %s: seen %v ago, ready %v, heard %v", n, now.Sub(s.seen), s.ready, s.heard)
			}
			for _, p := range m.peers {
				t.Logf("member %s: seen %v ago, alive %v vouched %v ready %v heard %v", p.name, now.Sub(p.lastSeen), p.alive, p.vouched, p.in[0].ready, p.in[0].heard)
			}
			t.Fatalf("step %d: view %q, want %q", step, got, want)
		}
	}
}

func toSet(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}
