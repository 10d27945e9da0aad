package speaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/cluster/mlbstatus"
)

// Recording fakes of what the Controller drives.

// fakeL2 records every SetOwned and, from consecutive sets, each start and end of an IP's
// announcement ("+ip" / "-ip"), as the wire would show them.
type fakeL2 struct {
	mu      sync.Mutex
	cur     map[netip.Addr]L2Where
	calls   int
	changes []string
	fail    error
	closed  bool
}

func (f *fakeL2) SetOwned(owned map[netip.Addr]L2Where) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for _, ip := range slices.SortedFunc(maps.Keys(owned), netip.Addr.Compare) {
		if _, ok := f.cur[ip]; !ok {
			f.changes = append(f.changes, "+"+ip.String())
		}
	}
	for _, ip := range slices.SortedFunc(maps.Keys(f.cur), netip.Addr.Compare) {
		if _, ok := owned[ip]; !ok {
			f.changes = append(f.changes, "-"+ip.String())
		}
	}
	f.cur = maps.Clone(owned)
	return f.fail
}

func (f *fakeL2) Close() error { f.mu.Lock(); f.closed = true; f.mu.Unlock(); return nil }

func (f *fakeL2) owned() map[netip.Addr]L2Where {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.cur)
}

func (f *fakeL2) takeChanges() []string { return takeLines(&f.mu, &f.changes) }

// takeLines returns what a fake recorded in *lines and clears it, under mu.
func takeLines(mu *sync.Mutex, lines *[]string) []string {
	mu.Lock()
	defer mu.Unlock()
	out := *lines
	*lines = nil
	return out
}

// fakeBGP records the calls in order.
type fakeBGP struct {
	mu    sync.Mutex
	calls []string
	ads   []bgp.Advertisement
	peers []bgp.PeerConfig
}

func (f *fakeBGP) record(s string) { f.mu.Lock(); f.calls = append(f.calls, s); f.mu.Unlock() }
func (f *fakeBGP) SetAdvertisements(ads []bgp.Advertisement) error {
	f.record(fmt.Sprintf("ads %d", len(ads)))
	f.mu.Lock()
	f.ads = ads
	f.mu.Unlock()
	return nil
}
func (f *fakeBGP) SetPeers(peers []bgp.PeerConfig) error {
	f.record(fmt.Sprintf("peers %d", len(peers)))
	f.mu.Lock()
	f.peers = peers
	f.mu.Unlock()
	return nil
}
func (f *fakeBGP) Status() []bgp.PeerStatus {
	var out []bgp.PeerStatus
	for _, p := range f.peers {
		out = append(out, bgp.PeerStatus{Name: p.Name, Address: p.PeerAddress, State: "established"})
	}
	return out
}
func (f *fakeBGP) Shutdown(_ context.Context, d time.Duration) error {
	f.record("shutdown " + d.String())
	return nil
}
func (f *fakeBGP) Stop(context.Context) error { f.record("stop"); return nil }

// fakeEvents records "type reason kind ns/name: message".
type fakeEvents struct {
	mu  sync.Mutex
	got []string
}

func (f *fakeEvents) Event(ref *corev1.ObjectReference, eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, fmt.Sprintf("%s %s %s %s/%s: %s", eventType, reason, ref.Kind, ref.Namespace, ref.Name, message))
}

func (f *fakeEvents) take() []string { return takeLines(&f.mu, &f.got) }

// fakeNet is the membership every fake member sees: who is a candidate (alive and ready).
type fakeNet struct {
	mu    sync.Mutex
	cands map[string]bool
	// withdrawn: node -> the SegmentKeys it withdrew from (SetWithdrawn); onChange runs after a
	// withdrawal changed, as the membership's OnChange does (Recompute on every node).
	withdrawn map[string]map[string]bool
	onChange  []func()
}

func (n *fakeNet) set(cands ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cands = map[string]bool{}
	for _, c := range cands {
		n.cands[c] = true
	}
}

// fakeMembers is one node's membership on a fakeNet: its views are the net's candidates within each
// segment it was handed.
type fakeMembers struct {
	net     *fakeNet
	self    string
	mu      sync.Mutex
	segs    [][]string
	willing bool
}

func (m *fakeMembers) SetSegments(_ map[string][]netip.Addr, segments [][]string) {
	m.mu.Lock()
	m.segs = segments
	m.mu.Unlock()
}
func (m *fakeMembers) SetWilling(w bool) { m.mu.Lock(); m.willing = w; m.mu.Unlock() }

func (m *fakeMembers) SetWithdrawn(segments [][]string) {
	m.net.mu.Lock()
	if m.net.withdrawn == nil {
		m.net.withdrawn = map[string]map[string]bool{}
	}
	keys := map[string]bool{}
	for _, s := range segments {
		keys[SegmentKey(s)] = true
	}
	m.net.withdrawn[m.self] = keys
	hooks := slices.Clone(m.net.onChange)
	m.net.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

func (m *fakeMembers) view(members []string) View {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	v := View{Candidates: map[string]bool{}, Total: len(members)}
	for _, n := range members {
		if m.net.cands[n] && !m.net.withdrawn[n][SegmentKey(members)] {
			v.Candidates[n] = true
		}
	}
	// Not ready (unwilling, or not a candidate on the net): never its own candidate.
	if !m.willing {
		delete(v.Candidates, m.self)
	}
	return v
}

func (m *fakeMembers) View() View {
	m.mu.Lock()
	var all []string
	for _, s := range m.segs {
		all = append(all, s...)
	}
	m.mu.Unlock()
	slices.Sort(all)
	return m.view(slices.Compact(all))
}

func (m *fakeMembers) SegmentViews() map[string]View {
	m.mu.Lock()
	segs := slices.Clone(m.segs)
	m.mu.Unlock()
	out := map[string]View{}
	for _, s := range segs {
		out[SegmentKey(s)] = m.view(s)
	}
	return out
}

// fakeStatus records the last status handed over.
type fakeStatus struct {
	svcs     map[types.NamespacedName]mlbstatus.ServiceStatus
	problems []string
}

func (f *fakeStatus) SetSpeaker(s map[types.NamespacedName]mlbstatus.ServiceStatus, p []string) {
	f.svcs, f.problems = s, p
}

// ctlNode is one node's Controller with its fakes.
type ctlNode struct {
	c      *Controller
	l2     *fakeL2
	bgp    *fakeBGP
	newBGP int
	events *fakeEvents
	status *fakeStatus
}

func newCtlNode(t *testing.T, self string, net *fakeNet, tweak func(*ControllerOptions)) *ctlNode {
	t.Helper()
	n := &ctlNode{l2: &fakeL2{}, bgp: &fakeBGP{}, events: &fakeEvents{}, status: &fakeStatus{}}
	opts := ControllerOptions{Self: self, L2: n.l2, Links: func() []Link { return lan },
		RouterID: netip.MustParseAddr("192.0.2.11"),
		NewBGP: func(netip.Addr) (BGPAnnouncer, error) {
			n.newBGP++
			return n.bgp, nil
		}}
	if net != nil {
		opts.Members = &fakeMembers{net: net, self: self}
	}
	if tweak != nil {
		tweak(&opts)
	}
	n.c = NewController(opts)
	n.c.SetEvents(n.events)
	n.c.SetStatus(n.status)
	return n
}

// ctlWorld is l2World with node addresses (the members come from the Nodes).
func ctlWorld() *l2World {
	w := newL2World()
	for i, n := range []string{"n1", "n2", "n3"} {
		w.st.Nodes[n].Addresses = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)})}
	}
	return w
}

var webIP = netip.MustParseAddr("192.0.2.200")

// TestControllerL2OwnerOnly: a VIP is answered by its owner only (MetalLB's hash over the
// candidates), on every eligible interface with takeovers announced on the one whose subnet holds
// it, and the owner alone records nodeAssigned.
func TestControllerL2OwnerOnly(t *testing.T) {
	net := &fakeNet{}
	net.set("n1", "n2", "n3")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1").st
	owner := hashOwner(webIP.String(), "n1", "n2", "n3")
	for _, self := range []string{"n1", "n2", "n3"} {
		n := newCtlNode(t, self, net, nil)
		n.c.Update(st)
		got := n.l2.owned()
		events := n.events.take()
		if self != owner {
			if len(got) != 0 || len(events) != 0 {
				t.Errorf("%s (not the owner %s) answers %v, events %q", self, owner, got, events)
			}
			continue
		}
		if d := cmp.Diff(map[netip.Addr]L2Where{webIP: {Answer: []string{"eth0", "eth1"}, Announce: []string{"eth0"}}}, got); d != "" {
			t.Errorf("owner %s answers (-want +got):\n%s", self, d)
		}
		want := []string{fmt.Sprintf(`Normal nodeAssigned Service default/web: announcing 192.0.2.200 from node %q with protocol "layer2"`, self)}
		if d := cmp.Diff(want, events); d != "" {
			t.Errorf("owner's events (-want +got):\n%s", d)
		}
		if d := cmp.Diff([]string{"192.0.2.200 default/web"}, n.c.Announced(ModeL2)); d != "" {
			t.Errorf("announced (-want +got):\n%s", d)
		}
		if s := n.status.svcs[types.NamespacedName{Namespace: "default", Name: "web"}]; !slices.Equal(s.Interfaces, []string{"eth0", "eth1"}) ||
			!slices.Equal(s.L2Owners, []string{self}) {
			t.Errorf("status of web: %+v", s)
		}
		var vip *VIPStatus
		for _, v := range n.c.VIPs() {
			if v.Mode == "l2" && v.IP == webIP {
				vip = &v
			}
		}
		if vip == nil || !vip.Announced || vip.Announcer != self {
			t.Errorf("VIPs: %+v", n.c.VIPs())
		}
	}
}

// TestControllerWithdrawOnce: a VIP that goes away is withdrawn once, resyncs neither withdraw nor
// announce it again, and announcing it again later is a new start (a new Event): the announced set
// was pruned in the one place that changes it.
func TestControllerWithdrawOnce(t *testing.T) {
	net := &fakeNet{}
	net.set("n1")
	w := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd)
	n := newCtlNode(t, "n1", net, func(o *ControllerOptions) { o.FixedPeers = map[string][]netip.Addr{} })
	with := w.svc("web", false, []string{"192.0.2.200"}, "n1").st
	without := &cluster.State{Nodes: with.Nodes, MetalLB: with.MetalLB, Services: map[cluster.ServiceKey]*cluster.Service{},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}

	n.c.Update(with)
	n.c.Recompute()
	if d := cmp.Diff([]string{"+192.0.2.200"}, n.l2.takeChanges()); d != "" {
		t.Errorf("announce (-want +got):\n%s", d)
	}
	if e := n.events.take(); len(e) != 1 {
		t.Errorf("events on announce: %q, want one nodeAssigned", e)
	}
	n.c.Update(without)
	for range 3 {
		n.c.Recompute() // resyncs
	}
	if d := cmp.Diff([]string{"-192.0.2.200"}, n.l2.takeChanges()); d != "" {
		t.Errorf("withdraw (-want +got):\n%s", d)
	}
	if e := n.events.take(); len(e) != 0 {
		t.Errorf("events on withdraw: %q", e)
	}
	if a := n.c.Announced(ModeL2); len(a) != 0 {
		t.Errorf("still recorded as announced: %q", a)
	}
	n.c.Update(with)
	n.c.Recompute()
	if d := cmp.Diff([]string{"+192.0.2.200"}, n.l2.takeChanges()); d != "" {
		t.Errorf("announce again (-want +got):\n%s", d)
	}
	if e := n.events.take(); len(e) != 1 || !strings.Contains(e[0], "nodeAssigned") {
		t.Errorf("events on announcing again: %q, want a new nodeAssigned", e)
	}
}

// TestControllerLosesQuorum: a node that stops being ready (it leaves the majority, or the others
// stop hearing it) withdraws its VIPs, and the new owner — the hash among the rest — takes them
// over; when it comes back, it takes its VIPs back.
func TestControllerLosesQuorum(t *testing.T) {
	net := &fakeNet{}
	net.set("n1", "n2", "n3")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1", "n2", "n3").st
	nodes := map[string]*ctlNode{}
	for _, self := range []string{"n1", "n2", "n3"} {
		nodes[self] = newCtlNode(t, self, net, nil)
		nodes[self].c.Update(st)
	}
	owner := hashOwner(webIP.String(), "n1", "n2", "n3")
	var rest []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if n != owner {
			rest = append(rest, n)
		}
	}
	next := hashOwner(webIP.String(), slices.Clone(rest)...)
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
	// The owner leaves the quorum: the membership tells every node (OnChange -> Recompute).
	net.set(rest...)
	for _, n := range nodes {
		n.c.Recompute()
	}
	if d := cmp.Diff([]string{next}, answering()); d != "" {
		t.Errorf("after %s left (-want +got):\n%s", owner, d)
	}
	if d := cmp.Diff([]string{"+192.0.2.200", "-192.0.2.200"}, nodes[owner].l2.takeChanges()); d != "" {
		t.Errorf("%s: (-want +got):\n%s", owner, d)
	}
	for _, v := range nodes[owner].c.VIPs() {
		if v.IP == webIP && (v.Announced || v.Announcer != next) {
			t.Errorf("%s reports %+v, want announced by %s", owner, v, next)
		}
	}
	net.set("n1", "n2", "n3")
	for _, n := range nodes {
		n.c.Recompute()
	}
	if d := cmp.Diff([]string{owner}, answering()); d != "" {
		t.Errorf("after %s came back (-want +got):\n%s", owner, d)
	}
}

// TestControllerBGP: a VIP of a pool a BGPAdvertisement selects is advertised with the
// advertisement's attributes (MetalLB's localPref, communities with their aliases, large
// communities, aggregation length, peers), routes before sessions; a BGPPeer that cannot be used is
// rejected with one Warning Event and the others still peer; Stop drains with GRACEFUL_SHUTDOWN.
func TestControllerBGP(t *testing.T) {
	aggr := int32(24)
	st := &cluster.State{
		Nodes: map[string]*cluster.Node{"n1": {Name: "n1", Labels: map[string]string{"bgp": "yes"}}},
		Services: map[cluster.ServiceKey]*cluster.Service{
			{Namespace: "default", Name: "web"}: {Key: cluster.ServiceKey{Namespace: "default", Name: "web"}, Type: cluster.TypeLoadBalancer,
				LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.51.100.10")}},
		},
		MetalLB: &cluster.MetalLBConfig{
			IPAddressPools: []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "pub"},
				Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"198.51.100.0/24"}}}},
			Communities: []*metallbv1beta1.Community{{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "c"},
				Spec: metallbv1beta1.CommunitySpec{Communities: []metallbv1beta1.CommunityAlias{{Name: "no-export", Value: "65535:65281"}}}}},
			BGPAdvertisements: []*metallbv1beta1.BGPAdvertisement{
				{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "agg"}, Spec: metallbv1beta1.BGPAdvertisementSpec{
					IPAddressPools: []string{"pub"}, AggregationLength: &aggr, LocalPref: 150,
					Communities: []string{"no-export", "64512:1", "large:64512:1:2"}, Peers: []string{"tor1"}}},
				{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "host"}, Spec: metallbv1beta1.BGPAdvertisementSpec{
					IPAddressPools: []string{"pub"}, LocalPref: 100}},
			},
			BGPPeers: []*metallbv1beta2.BGPPeer{
				{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "tor1"}, Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64500, Address: "192.0.2.1"}},
				{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "broken"}, Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, Address: "192.0.2.2"}},
			},
		},
	}
	n := newCtlNode(t, "n1", nil, func(o *ControllerOptions) {
		o.L2Disabled = "L2 mode refused: no key"
		o.BGPDrain = 30 * time.Second
	})
	n.c.Update(st)
	n.c.Update(st) // the same State again: no second Event, no second speaker
	want := []bgp.Advertisement{
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), LocalPref: 150, Communities: []string{"64512:1", "65535:65281"},
			LargeCommunities: []string{"64512:1:2"}, Peers: []string{mlbNS + "/tor1"}},
		{Prefix: netip.MustParsePrefix("198.51.100.10/32"), LocalPref: 100},
	}
	if d := cmp.Diff(want, n.bgp.ads, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmpopts.EquateEmpty()); d != "" {
		t.Errorf("advertisements (-want +got):\n%s", d)
	}
	if len(n.bgp.peers) != 1 || n.bgp.peers[0].Name != mlbNS+"/tor1" || n.bgp.peers[0].PeerASN != 64500 {
		t.Errorf("peers %+v, want tor1 only", n.bgp.peers)
	}
	if d := cmp.Diff([]string{"ads 2", "peers 1", "ads 2", "peers 1"}, n.bgp.calls); d != "" {
		t.Errorf("BGP calls, routes before sessions (-want +got):\n%s", d)
	}
	if n.newBGP != 1 {
		t.Errorf("BGP started %d times", n.newBGP)
	}
	events := n.events.take()
	slices.Sort(events)
	wantEvents := []string{
		`Normal nodeAssigned Service default/web: announcing 198.51.100.10 from node "n1" with protocol "bgp" to peers metallb-system/tor1`,
		"Warning Rejected BGPPeer metallb-system/broken: " + problemOf(t, st, "BGPPeer metallb-system/broken"),
	}
	if d := cmp.Diff(wantEvents, events); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	if s := n.status.svcs[types.NamespacedName{Namespace: "default", Name: "web"}]; !slices.Equal(s.Peers, []string{"tor1"}) {
		t.Errorf("status of web: %+v", s)
	}
	if len(n.status.problems) != 1 || !strings.HasPrefix(n.status.problems[0], "BGPPeer metallb-system/broken: ") {
		t.Errorf("status problems %q", n.status.problems)
	}
	// BGP works without the membership; L2 says why it does not.
	if len(n.l2.owned()) != 0 {
		t.Errorf("L2 answers %v without a membership", n.l2.owned())
	}
	if w := n.c.Warnings(); len(w) != 2 || w[0] != "L2 mode refused: no key" || !strings.HasPrefix(w[1], "BGPPeer metallb-system/broken: ") {
		t.Errorf("warnings %q", w)
	}
	var bgpVIPs int
	for _, v := range n.c.VIPs() {
		if v.Mode == "bgp" {
			bgpVIPs++
			if !v.Announced || !slices.Equal(v.Peers, []string{"metallb-system/tor1 192.0.2.1 (established)"}) {
				t.Errorf("VIP %+v", v)
			}
		}
	}
	if bgpVIPs != 2 { // one decision per advertisement
		t.Errorf("%d BGP VIPs in %+v", bgpVIPs, n.c.VIPs())
	}

	n.c.Stop()
	n.c.Update(st) // after Stop: nothing
	if d := cmp.Diff([]string{"ads 2", "peers 1", "ads 2", "peers 1", "shutdown 30s"}, n.bgp.calls); d != "" {
		t.Errorf("BGP calls after Stop (-want +got):\n%s", d)
	}
	if !n.l2.closed {
		t.Error("L2 announcer not closed")
	}
}

// problemOf is DecideBGP's reason for obj.
func problemOf(t *testing.T, st *cluster.State, obj string) string {
	t.Helper()
	_, _, _, problems := DecideBGP(BGPInput{Self: "n1", State: st})
	for _, p := range problems {
		if p.Object.String() == obj {
			return p.Reason
		}
	}
	t.Fatalf("no problem for %s in %+v", obj, problems)
	return ""
}

// TestControllerBadObjectIsolated: an L2Advertisement naming an interface this node lacks leaves its
// pool's VIP unanswered with a reason (in status), while the other pool's VIP is answered; an L2
// announcer error does not stop the decisions and the same set is handed over again on resync.
func TestControllerBadObjectIsolated(t *testing.T) {
	net := &fakeNet{}
	net.set("n1")
	st := ctlWorld().
		pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).
		pool("bad", nil, "192.0.2.230-192.0.2.240").ad("bad", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"bad"}, Interfaces: []string{"eth9"}}).
		svc("web", false, []string{"192.0.2.200"}, "n1").svc("broken", false, []string{"192.0.2.230"}, "n1").st
	n := newCtlNode(t, "n1", net, func(o *ControllerOptions) { o.FixedPeers = map[string][]netip.Addr{} })
	n.l2.fail = errors.New("eth0: socket broken")
	n.c.Update(st)
	if got := slices.Collect(maps.Keys(n.l2.owned())); !slices.Equal(got, []netip.Addr{webIP}) {
		t.Errorf("answered %v, want only %s", got, webIP)
	}
	var reason string
	for _, v := range n.c.VIPs() {
		if v.IP == netip.MustParseAddr("192.0.2.230") {
			reason = v.Reason
		}
	}
	if !strings.Contains(reason, "eth9") {
		t.Errorf("broken's reason %q, want one naming eth9", reason)
	}
	if len(n.status.problems) != 1 || !strings.HasPrefix(n.status.problems[0], "Service default/broken IP 192.0.2.230: ") {
		t.Errorf("status problems %q", n.status.problems)
	}
	if d := cmp.Diff([]string{"192.0.2.200 default/web"}, n.c.Announced(ModeL2)); d != "" {
		t.Errorf("announced (-want +got):\n%s", d)
	}
	calls := n.l2.calls
	n.c.Recompute()
	if n.l2.calls != calls+1 || len(n.l2.takeChanges()) != 1 {
		t.Errorf("resync after an error: %d calls (was %d)", n.l2.calls, calls)
	}
}

// TestControllerNoBGPWithoutRouterID: BGP peers without an IPv4 router ID do not start BGP; the
// reason is a warning, L2 goes on.
func TestControllerNoBGPWithoutRouterID(t *testing.T) {
	st := metallb016State([]*metallbv1beta1.BGPAdvertisement{bgpAd("a", 0, nil, nil)},
		&metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "tor"}, Spec: metallbv1beta2.BGPPeerSpec{MyASN: 1, ASN: 2, Address: "192.0.2.1"}})
	n := newCtlNode(t, "n1", nil, func(o *ControllerOptions) { o.RouterID = netip.Addr{} })
	n.c.Update(st)
	if n.newBGP != 0 {
		t.Error("BGP started without a router ID")
	}
	if w := n.c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "router ID") {
		t.Errorf("warnings %q", w)
	}
}

// TestControllerBGPNotRunning: while the BGP speaker cannot start, the BGP decisions announce
// nothing: no nodeAssigned Event, no peers in the status sink (no ServiceBGPStatus), nothing
// announced, and the VIPs and ConfigurationState say why; once it starts, all of it follows.
func TestControllerBGPNotRunning(t *testing.T) {
	st := metallb016State([]*metallbv1beta1.BGPAdvertisement{bgpAd("a", 0, nil, nil)},
		&metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "tor"}, Spec: metallbv1beta2.BGPPeerSpec{MyASN: 1, ASN: 2, Address: "192.0.2.1"}})
	fail := true
	var n *ctlNode
	n = newCtlNode(t, "n1", nil, func(o *ControllerOptions) {
		o.NewBGP = func(netip.Addr) (BGPAnnouncer, error) {
			n.newBGP++
			if fail {
				return nil, errors.New("bind: address in use")
			}
			return n.bgp, nil
		}
	})
	n.c.Update(st)
	if n.newBGP != 1 {
		t.Fatalf("BGP start tried %d times", n.newBGP)
	}
	if ev := n.events.take(); len(ev) != 0 {
		t.Errorf("events without a BGP speaker: %q", ev)
	}
	if a := n.c.Announced(ModeBGP); len(a) != 0 {
		t.Errorf("announced by BGP without a speaker: %q", a)
	}
	for k, s := range n.status.svcs {
		if len(s.Peers) != 0 {
			t.Errorf("status of %s has BGP peers %q without a speaker", k, s.Peers)
		}
	}
	if !slices.Contains(n.status.problems, "BGP speaker: not peering: starting BGP: bind: address in use") {
		t.Errorf("status problems %q do not say BGP is not running", n.status.problems)
	}
	var vips int
	for _, v := range n.c.VIPs() {
		if v.Mode != "bgp" {
			continue
		}
		vips++
		if v.Announced || !strings.Contains(v.Reason, "BGP is not running") {
			t.Errorf("VIP %+v without a speaker", v)
		}
	}
	if vips != 2 {
		t.Errorf("%d BGP VIPs, want prod and staging", vips)
	}

	fail = false
	n.c.Update(st)
	events := n.events.take()
	slices.Sort(events)
	want := []string{
		`Normal nodeAssigned Service default/prod: announcing 198.51.100.10 from node "n1" with protocol "bgp" to peers metallb-system/tor`,
		`Normal nodeAssigned Service default/staging: announcing 198.51.100.11 from node "n1" with protocol "bgp" to peers metallb-system/tor`,
	}
	if d := cmp.Diff(want, events); d != "" {
		t.Errorf("events once BGP runs (-want +got):\n%s", d)
	}
	if s := n.status.svcs[types.NamespacedName{Namespace: "default", Name: "prod"}]; !slices.Equal(s.Peers, []string{"tor"}) {
		t.Errorf("status of prod once BGP runs: %+v", s)
	}
	if len(n.status.problems) != 0 || len(n.c.Warnings()) != 0 {
		t.Errorf("problems %q, warnings %q once BGP runs", n.status.problems, n.c.Warnings())
	}
}

// TestControllerBGPNoPeer: with a running speaker but no BGPPeer selecting this node, nothing is
// announced by BGP either (no Event "to peers" nobody), and the VIPs say why.
func TestControllerBGPNoPeer(t *testing.T) {
	other := []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "other"}}}
	tor := &metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: mlbNS, Name: "tor"}, Spec: metallbv1beta2.BGPPeerSpec{MyASN: 1, ASN: 2, Address: "192.0.2.1"}}
	st := metallb016State([]*metallbv1beta1.BGPAdvertisement{bgpAd("a", 0, nil, nil)}, tor)
	n := newCtlNode(t, "n1", nil, nil)
	n.c.Update(st) // the speaker starts and announces
	if a := n.c.Announced(ModeBGP); len(a) != 2 {
		t.Fatalf("announced %q, want prod and staging", a)
	}
	n.events.take()

	away := tor.DeepCopy()
	away.Spec.NodeSelectors = other
	n.c.Update(metallb016State([]*metallbv1beta1.BGPAdvertisement{bgpAd("a", 0, nil, nil)}, away))
	if a := n.c.Announced(ModeBGP); len(a) != 0 {
		t.Errorf("announced %q without a peer", a)
	}
	for _, v := range n.c.VIPs() {
		if v.Mode == "bgp" && (v.Announced || v.Reason != "not announced: no BGPPeer selects this node") {
			t.Errorf("VIP %+v without a peer", v)
		}
	}
	if s := n.status.svcs[types.NamespacedName{Namespace: "default", Name: "prod"}]; len(s.Peers) != 0 {
		t.Errorf("status of prod without a peer: %+v", s)
	}
	n.c.Update(st) // the peer is back: a new start
	if ev := n.events.take(); len(ev) != 2 {
		t.Errorf("events when the peer is back: %q", ev)
	}
}

// TestControllerConcurrent: Update (the sync loop), Recompute (membership changes, resyncs) and
// VIPs/Warnings/Announced (the /status handler) run concurrently (go test -race).
func TestControllerConcurrent(t *testing.T) {
	net := &fakeNet{}
	net.set("n1", "n2")
	st := ctlWorld().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1").st
	n := newCtlNode(t, "n1", net, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.c.Run(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				switch i {
				case 0:
					n.c.Update(st)
				case 1:
					n.c.Recompute()
				default:
					_, _, _ = n.c.VIPs(), n.c.Warnings(), n.c.Announced(ModeL2)
				}
			}
		}()
	}
	wg.Wait()
}
