package speaker

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLinkHold is the hold-down as a sequence of reads on a fake clock: a link up at the first
// read is usable at once; down is unusable at once; up again is held for HoldDown from the last
// time it came up (a flap restarts it, also one seen only as a netlink "down" between two reads);
// a link first seen down is held when it comes up; its prefixes are remembered while the kernel
// shows none; a link that went away is forgotten.
func TestLinkHold(t *testing.T) {
	p0 := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	h := LinkHold{HoldDown: 3 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at     time.Duration
		down   string // a netlink update saying this link is down, before the read
		states []LinkState
		// want: the usable links, the unusable ones with a word of their reason, the next wake-up.
		usable, unusable []string
		next             time.Duration // -1: none
	}
	up := func(names ...string) []LinkState {
		var out []LinkState
		for _, n := range names {
			up := !strings.HasPrefix(n, "!")
			n = strings.TrimPrefix(n, "!")
			var p []netip.Prefix
			if n == "eth0" && up {
				p = p0
			}
			out = append(out, LinkState{Name: n, Up: up, Prefixes: p})
		}
		return out
	}
	for i, s := range []step{
		{at: 0, states: up("eth0", "!eth1"), usable: []string{"eth0"}, unusable: []string{"eth1 is down"}, next: -1},
		{at: time.Second, states: up("!eth0", "!eth1"), unusable: []string{"eth0 is down", "eth1 is down"}, next: -1},
		{at: 2 * time.Second, states: up("eth0", "eth1"), unusable: []string{"eth0 came up again", "eth1 came up again"}, next: 5 * time.Second},
		// eth0 flaps during its hold-down: held from the new up.
		{at: 3 * time.Second, states: up("!eth0", "eth1"), unusable: []string{"eth0 is down", "eth1 came up again"}, next: 5 * time.Second},
		{at: 4 * time.Second, states: up("eth0", "eth1"), unusable: []string{"eth0 came up again", "eth1 came up again"}, next: 5 * time.Second},
		{at: 5 * time.Second, states: up("eth0", "eth1"), usable: []string{"eth1"}, unusable: []string{"eth0 came up again"}, next: 7 * time.Second},
		{at: 7 * time.Second, states: up("eth0", "eth1"), usable: []string{"eth0", "eth1"}, next: -1},
		// A down and up between two reads, seen only as a netlink update: held again.
		{at: 8 * time.Second, down: "eth1", states: up("eth0", "eth1"), usable: []string{"eth0"}, unusable: []string{"eth1 came up again"}, next: 11 * time.Second},
		// eth1 goes away: forgotten; back up, it is new (usable at once).
		{at: 9 * time.Second, states: up("eth0"), usable: []string{"eth0"}, next: -1},
		{at: 10 * time.Second, states: up("eth0", "eth1"), usable: []string{"eth0", "eth1"}, next: -1},
	} {
		if s.down != "" {
			h.Down(s.down)
		}
		links, why, next := h.Observe(s.states, t0.Add(s.at))
		var usable, unusable []string
		for _, l := range links {
			if l.Up {
				usable = append(usable, l.Name)
				if why[l.Name] != "" {
					t.Errorf("step %d: usable %s has a reason %q", i, l.Name, why[l.Name])
				}
				continue
			}
			r := strings.TrimPrefix(why[l.Name], "interface ")
			r, _, _ = strings.Cut(r, ":")
			unusable = append(unusable, r)
			if l.Name == "eth0" && !slices.Equal(l.Prefixes, p0) {
				t.Errorf("step %d: eth0's prefixes while down: %v, want the last known %v", i, l.Prefixes, p0)
			}
		}
		if d := cmp.Diff(s.usable, usable); d != "" {
			t.Errorf("step %d: usable (-want +got):\n%s", i, d)
		}
		if d := cmp.Diff(s.unusable, unusable); d != "" {
			t.Errorf("step %d: unusable (-want +got):\n%s", i, d)
		}
		wantNext := time.Time{}
		if s.next >= 0 {
			wantNext = t0.Add(s.next)
		}
		if !next.Equal(wantNext) {
			t.Errorf("step %d: next wake-up %v, want %v", i, next.Sub(t0), s.next)
		}
	}
}

// TestWithdrawnSegments is the rule as a table: which of self's segments it withdraws from for
// which links down. n1, n2 (rack a) and n3 (rack b); pool "lan" 192.0.2.200-220 on eth0's subnet,
// pool "dmz" 203.0.113.0/28 on eth2, named in its advertisement.
func TestWithdrawnSegments(t *testing.T) {
	links := func(down ...string) ([]LinkState, map[string]string) {
		ls := []LinkState{
			{Name: "eth0", Up: true, Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
			{Name: "eth1", Up: true, Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
			{Name: "eth2", Up: true},
		}
		why := map[string]string{}
		for i := range ls {
			if slices.Contains(down, ls[i].Name) {
				ls[i].Up = false
				why[ls[i].Name] = "interface " + ls[i].Name + " is down"
			}
		}
		return ls, why
	}
	rackA := []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "a"}}}
	for _, tc := range []struct {
		name  string
		self  string
		dmzAd metallbv1beta1.L2AdvertisementSpec
		down  []string
		want  string // "members: reason" lines
	}{
		{name: "all up", self: "n1", down: nil, want: ""},
		{name: "the VIP's subnet is on eth0, eth0 down", self: "n1", down: []string{"eth0"},
			want: "n1,n2,n3: pool metallb-system/lan: interface eth0 is down (the subnet of 192.0.2.200)"},
		{name: "another link down (membership NIC)", self: "n1", down: []string{"eth1"}, want: ""},
		{name: "named interface down", self: "n1", down: []string{"eth2"},
			want: "n1,n2: pool metallb-system/dmz: interface eth2 is down"},
		{name: "named interface down, self not selected by the advertisement", self: "n3", down: []string{"eth2"}, want: ""},
		{name: "named interface missing is not down", self: "n1",
			dmzAd: metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"dmz"}, Interfaces: []string{"eth9"}, NodeSelectors: rackA},
			down:  []string{"eth2"}, want: ""},
		{name: "both", self: "n2", down: []string{"eth0", "eth2"},
			want: "n1,n2: pool metallb-system/dmz: interface eth2 is down\nn1,n2,n3: pool metallb-system/lan: interface eth0 is down (the subnet of 192.0.2.200)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dmzAd := tc.dmzAd
			if dmzAd.IPAddressPools == nil {
				dmzAd = metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"dmz"}, Interfaces: []string{"eth2"}, NodeSelectors: rackA}
			}
			w := newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).
				pool("dmz", nil, "203.0.113.0/28").ad("dmz", dmzAd).
				svc("web", false, []string{"192.0.2.200"}, "n1").svc("dmz", false, []string{"203.0.113.1"}, "n1")
			segs := L2Segments(w.st, []string{"n1", "n2", "n3"})
			ls, why := links(tc.down...)
			var got []string
			for _, x := range WithdrawnSegments(w.st, tc.self, segs, ls, why) {
				got = append(got, strings.Join(x.Segment.Members, ",")+": "+x.Reason)
			}
			if d := cmp.Diff(tc.want, strings.Join(got, "\n")); d != "" {
				t.Errorf("withdrawn (-want +got):\n%s", d)
			}
		})
	}
}

// TestControllerLinkDown: three Controllers on a fake membership, the VIP's owner loses the link
// its subnet is on. It withdraws from the segment (LinksChanged, as on a netlink update): it stops
// answering at once and the hash's next owner answers; the link back up, it takes the VIP back
// only when the hold-down is over (its timer, nobody calls it), and says why in Warnings meanwhile.
func TestControllerLinkDown(t *testing.T) {
	net := &fakeNet{}
	net.set("n1", "n2", "n3")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1").st
	owner := hashOwner(webIP.String(), "n1", "n2", "n3")
	var others []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if n != owner {
			others = append(others, n)
		}
	}
	next := hashOwner(webIP.String(), others...)
	var mu sync.Mutex
	eth0Up := true
	states := func() []LinkState {
		mu.Lock()
		defer mu.Unlock()
		return []LinkState{{Name: "eth0", Up: eth0Up, Prefixes: lan[0].Prefixes}, {Name: "eth1", Up: true, Prefixes: lan[1].Prefixes}}
	}
	nodes := map[string]*ctlNode{}
	for _, self := range []string{"n1", "n2", "n3"} {
		nodes[self] = newCtlNode(t, self, net, func(o *ControllerOptions) {
			o.LinkStates = states
			o.LinkHoldDown = 300 * time.Millisecond
		})
		t.Cleanup(nodes[self].c.Stop)
	}
	net.onChange = []func(){nodes["n1"].c.Recompute, nodes["n2"].c.Recompute, nodes["n3"].c.Recompute}
	for _, n := range nodes {
		n.c.Update(st)
	}
	answers := func() []string {
		var out []string
		for _, self := range []string{"n1", "n2", "n3"} {
			if _, ok := nodes[self].l2.owned()[webIP]; ok {
				out = append(out, self)
			}
		}
		return out
	}
	if d := cmp.Diff([]string{owner}, answers()); d != "" {
		t.Fatalf("before: who answers (-want +got):\n%s", d)
	}

	mu.Lock()
	eth0Up = false
	mu.Unlock()
	nodes[owner].c.linkDown("eth0")
	if d := cmp.Diff([]string{next}, answers()); d != "" {
		t.Errorf("eth0 down on the owner %s: who answers (-want +got):\n%s", owner, d)
	}
	if w := strings.Join(nodes[owner].c.Warnings(), "\n"); !strings.Contains(w, "interface eth0 is down") {
		t.Errorf("the owner's warnings do not say why: %q", w)
	}

	mu.Lock()
	eth0Up = true
	mu.Unlock()
	nodes[owner].c.LinksChanged()
	if d := cmp.Diff([]string{next}, answers()); d != "" {
		t.Errorf("eth0 up again, within the hold-down: who answers (-want +got):\n%s", d)
	}
	if w := strings.Join(nodes[owner].c.Warnings(), "\n"); !strings.Contains(w, "held down") {
		t.Errorf("the owner's warnings do not say it is held down: %q", w)
	}
	// The hold-down ends on the owner's own timer.
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(answers(), []string{owner}) {
		if time.Now().After(deadline) {
			t.Fatalf("the owner never took its VIP back after the hold-down: %v answer", answers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := nodes[owner].c.Warnings(); len(w) != 0 {
		t.Errorf("warnings after the hold-down: %q", w)
	}
}
