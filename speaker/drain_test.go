package speaker

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

func TestNodeDrain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		node  *cluster.Node
		drain bool
	}{
		{"no Node", nil, false},
		{"schedulable", &cluster.Node{Name: "n1"}, false},
		{"cordoned", &cluster.Node{Name: "n1", Unschedulable: true}, true},
		{"to be deleted", &cluster.Node{Name: "n1", ToBeDeleted: true}, true},
		{"annotated", &cluster.Node{Name: "n1", Annotations: map[string]string{DrainAnnotation: ""}}, true},
		{"annotated true", &cluster.Node{Name: "n1", Annotations: map[string]string{DrainAnnotation: "true"}}, true},
		{"annotated false", &cluster.Node{Name: "n1", Annotations: map[string]string{DrainAnnotation: "false"}}, false},
		{"labelled", &cluster.Node{Name: "n1", Labels: map[string]string{DrainAnnotation: "yes"}}, true},
		{"labelled false", &cluster.Node{Name: "n1", Labels: map[string]string{DrainAnnotation: "false"}}, false},
		{"other annotation", &cluster.Node{Name: "n1", Annotations: map[string]string{"vipgate.io/other": ""}}, false},
	} {
		if got := NodeDrain(tc.node); (got != "") != tc.drain {
			t.Errorf("%s: NodeDrain = %q, want draining %v", tc.name, got, tc.drain)
		}
	}
}

// netipEq compares netip values in cmp.
var netipEq = cmp.Options{cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })}

func TestDrainBGP(t *testing.T) {
	ads := []bgp.Advertisement{{Prefix: netip.MustParsePrefix("198.51.100.10/32"), Communities: []string{"64512:1"}},
		{Prefix: netip.MustParsePrefix("198.51.100.11/32"), Communities: []string{bgp.GracefulShutdownCommunity}}}
	decs := []VIPDecision{{IP: netip.MustParseAddr("198.51.100.10"), Owner: "n1", Reason: "advertised by BGP"},
		{IP: netip.MustParseAddr("198.51.100.12"), Reason: "no BGPAdvertisement"}}
	keep := slices.Clone(ads[0].Communities)

	gotAds, gotDecs := DrainBGP(BGPAnnounced, "n1", ads, decs)
	if d := cmp.Diff(ads, gotAds, netipEq); d != "" {
		t.Errorf("announced: ads changed (-want +got):\n%s", d)
	}
	if d := cmp.Diff(decs, gotDecs, netipEq); d != "" {
		t.Errorf("announced: decisions changed (-want +got):\n%s", d)
	}

	gotAds, gotDecs = DrainBGP(BGPGracefulShutdown, "n1", ads, decs)
	if d := cmp.Diff([][]string{{"64512:1", "65535:0"}, {"65535:0"}}, [][]string{gotAds[0].Communities, gotAds[1].Communities}); d != "" {
		t.Errorf("graceful shutdown: communities (-want +got):\n%s", d)
	}
	if !slices.Equal(ads[0].Communities, keep) {
		t.Errorf("the caller's advertisement changed: %v", ads[0].Communities)
	}
	if gotDecs[0].Owner != "n1" || !strings.Contains(gotDecs[0].Reason, "GRACEFUL_SHUTDOWN") || !cmp.Equal(gotDecs[1], decs[1], netipEq) {
		t.Errorf("graceful shutdown: decisions %+v", gotDecs)
	}

	gotAds, gotDecs = DrainBGP(BGPWithdrawn, "n1", ads, decs)
	if len(gotAds) != 0 || gotDecs[0].Owner != "" || !strings.Contains(gotDecs[0].Reason, "draining") || !cmp.Equal(gotDecs[1], decs[1], netipEq) || decs[0].Owner != "n1" {
		t.Errorf("withdrawn: ads %v, decisions %+v (caller's %+v)", gotAds, gotDecs, decs)
	}
}

func TestHoldOwned(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("192.0.2.201")
	held := map[netip.Addr]L2Where{a: {Answer: []string{"eth0"}}}
	now := map[netip.Addr]L2Where{a: {Answer: []string{"eth1"}}, b: {Answer: []string{"eth0"}}}
	if d := cmp.Diff(now, HoldOwned(now, held)); d != "" {
		t.Errorf("now wins (-want +got):\n%s", d)
	}
	if d := cmp.Diff(held, HoldOwned(nil, held)); d != "" {
		t.Errorf("held alone (-want +got):\n%s", d)
	}
	if len(held) != 1 {
		t.Errorf("held changed: %v", held)
	}
}

// cordoned is st with node cordoned (a new Nodes map; st is not changed).
func cordoned(st *cluster.State, node string, on bool) *cluster.State {
	out := *st
	out.Nodes = maps.Clone(st.Nodes)
	n := *st.Nodes[node]
	n.Unschedulable = on
	out.Nodes[node] = &n
	return &out
}

// eventually polls cond every 5 ms for up to 5 s (a bound, not a timing assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
	}
}

// TestControllerDrainL2: a cordoned owner is no longer willing; the next owner (the hash among the
// others, which hear its not-ready heartbeat) answers while the drained one still does for the
// overlap — never neither — then only the new owner answers; uncordoned, the node is a candidate
// again and takes its VIP back.
func TestControllerDrainL2(t *testing.T) {
	net := &fakeNet{}
	net.set("n1", "n2", "n3")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1", "n2", "n3").st
	owner := hashOwner(webIP.String(), "n1", "n2", "n3")
	var rest []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if n != owner {
			rest = append(rest, n)
		}
	}
	next := hashOwner(webIP.String(), slices.Clone(rest)...)
	nodes := map[string]*ctlNode{}
	for _, self := range []string{"n1", "n2", "n3"} {
		nodes[self] = newCtlNode(t, self, net, func(o *ControllerOptions) { o.L2DrainOverlap = 200 * time.Millisecond })
		nodes[self].c.Update(st)
	}
	answering := func() []string {
		var out []string
		for _, self := range []string{"n1", "n2", "n3"} {
			if _, ok := nodes[self].l2.owned()[webIP]; ok {
				out = append(out, self)
			}
		}
		return out
	}
	if d := cmp.Diff([]string{owner}, answering()); d != "" {
		t.Fatalf("before (-want +got):\n%s", d)
	}

	drained := cordoned(st, owner, true)
	for _, n := range nodes {
		n.c.Update(drained)
	}
	m := nodes[owner].c.opts.Members.(*fakeMembers)
	if m.willing {
		t.Fatalf("%s cordoned but willing", owner)
	}
	if on, why := nodes[owner].c.Draining(); !on || !strings.Contains(why, "cordoned") {
		t.Errorf("Draining() = %v %q", on, why)
	}
	if d := cmp.Diff([]string{owner}, answering()); d != "" {
		t.Errorf("the others have not heard yet: the owner still answers (-want +got):\n%s", d)
	}
	// Its heartbeat says it is not ready: the others take over, it still answers (the overlap).
	net.set(rest...)
	for _, n := range nodes {
		n.c.Recompute()
	}
	if d := cmp.Diff(sortedPair(owner, next), answering()); d != "" {
		t.Errorf("the overlap (-want +got):\n%s", d)
	}
	eventually(t, "the drained node lets go after the overlap", func() bool { return slices.Equal(answering(), []string{next}) })
	if d := cmp.Diff([]string{"+192.0.2.200", "-192.0.2.200"}, nodes[owner].l2.takeChanges()); d != "" {
		t.Errorf("%s: (-want +got):\n%s", owner, d)
	}
	if w := nodes[owner].c.Warnings(); !slices.ContainsFunc(w, func(s string) bool { return strings.HasPrefix(s, "draining (cordoned") }) {
		t.Errorf("warnings %q", w)
	}
	for range 3 {
		nodes[owner].c.Recompute() // resyncs do not bring it back
	}
	if d := cmp.Diff([]string{next}, answering()); d != "" {
		t.Errorf("after resyncs (-want +got):\n%s", d)
	}

	for _, n := range nodes {
		n.c.Update(st)
	}
	if !m.willing {
		t.Fatalf("%s uncordoned but not willing", owner)
	}
	net.set("n1", "n2", "n3")
	for _, n := range nodes {
		n.c.Recompute()
	}
	if d := cmp.Diff([]string{owner}, answering()); d != "" {
		t.Errorf("uncordoned (-want +got):\n%s", d)
	}
}

func sortedPair(a, b string) []string {
	s := []string{a, b}
	slices.Sort(s)
	return s
}

// bgpDrainState is one Node, n1, with a VIP advertised to one peer.
func bgpDrainState() *cluster.State {
	return &cluster.State{
		Nodes: map[string]*cluster.Node{"n1": {Name: "n1"}},
		Services: map[cluster.ServiceKey]*cluster.Service{
			{Namespace: "default", Name: "web"}: {Key: cluster.ServiceKey{Namespace: "default", Name: "web"}, Type: cluster.TypeLoadBalancer,
				LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.10")}},
		},
		MetalLB: &cluster.MetalLBConfig{
			IPAddressPools: []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "pub"},
				Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"198.51.100.0/24"}}}},
			BGPAdvertisements: []*metallbv1beta1.BGPAdvertisement{{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "host"},
				Spec: metallbv1beta1.BGPAdvertisementSpec{IPAddressPools: []string{"pub"}, Communities: []string{"64512:1"}}}},
			BGPPeers: []*metallbv1beta2.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "tor1"},
				Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64500, Address: "192.0.2.1"}}},
		},
	}
}

// TestControllerDrainBGP: a cordoned node sends its routes again with GRACEFUL_SHUTDOWN, withdraws
// them after the grace, keeps its sessions, announces nothing on later States, and announces again
// once uncordoned. SIGTERM alone leaves BGP to Stop.
func TestControllerDrainBGP(t *testing.T) {
	st := bgpDrainState()
	n := newCtlNode(t, "n1", nil, func(o *ControllerOptions) { o.BGPDrain = 100 * time.Millisecond })
	ads := func() []bgp.Advertisement {
		n.bgp.mu.Lock()
		defer n.bgp.mu.Unlock()
		return slices.Clone(n.bgp.ads)
	}
	n.c.Update(st)
	if a := ads(); len(a) != 1 || !slices.Equal(a[0].Communities, []string{"64512:1"}) {
		t.Fatalf("before: %+v", a)
	}
	n.c.Update(cordoned(st, "n1", true))
	if a := ads(); len(a) != 1 || !slices.Equal(a[0].Communities, []string{"64512:1", "65535:0"}) {
		t.Errorf("cordoned: %+v, want GRACEFUL_SHUTDOWN added", a)
	}
	if got := n.c.Announced(ModeBGP); len(got) != 1 {
		t.Errorf("announced during the grace: %q", got)
	}
	eventually(t, "withdrawn after the grace", func() bool { return len(ads()) == 0 })
	n.c.Update(cordoned(st, "n1", true))
	if a := ads(); len(a) != 0 {
		t.Errorf("a later State while drained: %+v", a)
	}
	if got := n.c.Announced(ModeBGP); len(got) != 0 {
		t.Errorf("announced while withdrawn: %q", got)
	}
	for _, v := range n.c.VIPs() {
		if v.Mode == "bgp" && (v.Announced || !strings.Contains(v.Reason, "draining")) {
			t.Errorf("VIP %+v", v)
		}
	}
	n.bgp.mu.Lock()
	for _, c := range n.bgp.calls {
		if strings.HasPrefix(c, "shutdown") || c == "stop" || c == "peers 0" {
			t.Errorf("the sessions were touched: %q", n.bgp.calls)
		}
	}
	n.bgp.mu.Unlock()
	n.c.Update(st)
	if a := ads(); len(a) != 1 || !slices.Equal(a[0].Communities, []string{"64512:1"}) {
		t.Errorf("uncordoned: %+v", a)
	}

	// SIGTERM: L2 only; BGP as Stop decides (BGPDrain: GRACEFUL_SHUTDOWN in Shutdown).
	n.c.Drain(context.Background())
	if a := ads(); len(a) != 1 || !slices.Equal(a[0].Communities, []string{"64512:1"}) {
		t.Errorf("after Drain: %+v", a)
	}
	n.c.Stop()
	n.bgp.mu.Lock()
	if last := n.bgp.calls[len(n.bgp.calls)-1]; last != "shutdown 100ms" {
		t.Errorf("last BGP call %q", last)
	}
	n.bgp.mu.Unlock()
}

// TestControllerDrainSIGTERM: Drain makes the node unwilling, keeps answering its VIP for the
// overlap and returns after it, the VIP let go; a later State does not bring it back.
func TestControllerDrainSIGTERM(t *testing.T) {
	net := &fakeNet{}
	net.set("n1")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1").st
	n := newCtlNode(t, "n1", net, func(o *ControllerOptions) {
		o.FixedPeers = map[string][]netip.Addr{}
		o.L2DrainOverlap = 100 * time.Millisecond
	})
	n.c.Update(st)
	if _, ok := n.l2.owned()[webIP]; !ok {
		t.Fatal("not answering before the drain")
	}
	done := make(chan struct{})
	go func() { n.c.Drain(context.Background()); close(done) }()
	m := n.c.opts.Members.(*fakeMembers)
	eventually(t, "unwilling", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return !m.willing })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return")
	}
	if d := cmp.Diff([]string{"+192.0.2.200", "-192.0.2.200"}, n.l2.takeChanges()); d != "" {
		t.Errorf("answered until the overlap's end, then not (-want +got):\n%s", d)
	}
	n.c.Update(st)
	if len(n.l2.owned()) != 0 || m.willing {
		t.Errorf("a State after SIGTERM: owned %v, willing %v", n.l2.owned(), m.willing)
	}
}
