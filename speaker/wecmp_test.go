package speaker

import (
	"context"
	"math"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

func TestLinkBandwidthFor(t *testing.T) {
	for _, c := range []struct {
		endpoints int
		as        uint32
		want      bgp.LinkBandwidth
	}{
		{0, 64513, bgp.LinkBandwidth{}},
		{-1, 64513, bgp.LinkBandwidth{}},
		{1, 64513, bgp.LinkBandwidth{AS: 64513, BytesPerSecond: 125000}},
		{3, 64513, bgp.LinkBandwidth{AS: 64513, BytesPerSecond: 375000}},
		{10, 4200000000, bgp.LinkBandwidth{AS: 4200000000, BytesPerSecond: 1250000}},
		{MaxWeightedEndpoints, 1, bgp.LinkBandwidth{AS: 1, BytesPerSecond: 1.25e9}},
		{MaxWeightedEndpoints + 1, 1, bgp.LinkBandwidth{AS: 1, BytesPerSecond: 1.25e9}},
		{1 << 40, 1, bgp.LinkBandwidth{AS: 1, BytesPerSecond: 1.25e9}},
	} {
		if got := LinkBandwidthFor(c.endpoints, c.as); got != c.want {
			t.Errorf("LinkBandwidthFor(%d, %d) = %+v, want %+v", c.endpoints, c.as, got, c.want)
		}
	}
	// The value is exact up to 1024 endpoints (125000 x 1024 needs float32's 24 bits of mantissa)
	// and within 1e-7 of it up to the cap: the ratio of two nodes' counts is the ratio the router
	// sees (FRR's weights are whole percents).
	for n := 1; n <= MaxWeightedEndpoints; n++ {
		got, want := float64(LinkBandwidthFor(n, 1).BytesPerSecond), float64(n*LinkBandwidthPerEndpoint)
		if (n <= 1024 && got != want) || math.Abs(got-want)/want > 1e-7 {
			t.Fatalf("%d endpoints: %v bytes/s, want %v", n, got, want)
		}
	}
}

func ep(addr, node string, ready, serving bool) cluster.Endpoint {
	return cluster.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, NodeName: node, Ready: ready, Serving: serving}
}

func TestLocalEndpoints(t *testing.T) {
	v4 := &cluster.EndpointSlice{Family: cluster.IPv4, Endpoints: []cluster.Endpoint{
		ep("10.244.1.2", "x", true, true), ep("10.244.2.2", "y", true, true), ep("10.244.2.3", "y", true, true),
		ep("10.244.2.4", "y", false, true),  // terminating, still serving: not counted while ready ones exist
		ep("10.244.2.5", "y", false, false), // not ready
		ep("10.244.3.2", "z", false, true),  // z: only a serving terminating endpoint
		ep("10.244.9.9", "", true, true),    // no node
	}}
	// The same pod in a second slice (slice churn) counts once; the IPv6 slice does not count for
	// an IPv4 VIP.
	dup := &cluster.EndpointSlice{Family: cluster.IPv4, Endpoints: []cluster.Endpoint{ep("10.244.2.3", "y", true, true)}}
	v6 := &cluster.EndpointSlice{Family: cluster.IPv6, Endpoints: []cluster.Endpoint{
		ep("fd00::1", "x", true, true), ep("fd00::2", "x", true, true)}}
	slices := []*cluster.EndpointSlice{v4, dup, v6}
	for _, c := range []struct {
		node   string
		family cluster.Family
		want   int
	}{
		{"x", cluster.IPv4, 1}, {"y", cluster.IPv4, 2}, {"z", cluster.IPv4, 1}, {"w", cluster.IPv4, 0},
		{"x", cluster.IPv6, 2}, {"y", cluster.IPv6, 0},
	} {
		if got := localEndpoints(slices, c.node, c.family); got != c.want {
			t.Errorf("localEndpoints(%s, IPv%d) = %d, want %d", c.node, c.family, got, c.want)
		}
	}
}

// wecmpState: nodes x and y, one BGPPeer (AS 64513 towards 64512), a pool, the advertisements
// given, and Services web (eTP Local, 203.0.113.80) and all (eTP Cluster, 203.0.113.81), each
// with one ready endpoint on x and three on y.
func wecmpState(ads ...*metallbv1beta1.BGPAdvertisement) *cluster.State {
	svc := func(name, ip string, local bool) *cluster.Service {
		return &cluster.Service{Key: cluster.ServiceKey{Namespace: "default", Name: name}, Type: cluster.TypeLoadBalancer,
			ExternalPolicyLocal: local, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	web, all := svc("web", "203.0.113.80", true), svc("all", "203.0.113.81", false)
	eps := func(k cluster.ServiceKey, n int) []*cluster.EndpointSlice {
		es := &cluster.EndpointSlice{Service: k, Family: cluster.IPv4, Endpoints: []cluster.Endpoint{ep("10.244.1.2", "x", true, true)}}
		for i := range n {
			es.Endpoints = append(es.Endpoints, ep("10.244.2."+string(rune('2'+i)), "y", true, true))
		}
		return []*cluster.EndpointSlice{es}
	}
	return &cluster.State{
		Nodes:          map[string]*cluster.Node{"x": {Name: "x"}, "y": {Name: "y"}},
		Services:       map[cluster.ServiceKey]*cluster.Service{web.Key: web, all.Key: all},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{web.Key: eps(web.Key, 3), all.Key: eps(all.Key, 3)},
		MetalLB: &cluster.MetalLBConfig{
			IPAddressPools: []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: "tor"},
				Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"203.0.113.64/26"}}}},
			BGPAdvertisements: ads,
			BGPPeers: []*metallbv1beta2.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: "tor"},
				Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64513, ASN: 64512, Address: "192.0.2.1"}}},
		},
	}
}

func wecmpAd(name, annotation string, aggr *int32) *metallbv1beta1.BGPAdvertisement {
	ad := &metallbv1beta1.BGPAdvertisement{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: name},
		Spec: metallbv1beta1.BGPAdvertisementSpec{IPAddressPools: []string{"tor"}, AggregationLength: aggr}}
	if annotation != "" {
		ad.Annotations = map[string]string{WeightedECMPAnnotation: annotation}
	}
	return ad
}

// TestDecideBGPWeightedECMP: with the annotation, each node's route of the eTP=Local VIP carries
// its own count of ready endpoints (x 1, y 3: 1 and 3 Mbit/s); the eTP=Cluster VIP and aggregated
// prefixes carry none; without the annotation (or with "false") nothing changes; a bad value is
// reported and leaves it off.
func TestDecideBGPWeightedECMP(t *testing.T) {
	pfx := netip.MustParsePrefix
	lb := func(n int) bgp.LinkBandwidth { return LinkBandwidthFor(n, 64513) }
	for _, c := range []struct {
		name     string
		ads      []*metallbv1beta1.BGPAdvertisement
		want     map[string][]bgp.Advertisement // by node
		problems []Problem
	}{
		{
			name: "annotated: Local weighted by endpoints, Cluster not",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("tor", "true", nil)},
			want: map[string][]bgp.Advertisement{
				"x": {{Prefix: pfx("203.0.113.80/32"), LinkBandwidth: lb(1)}, {Prefix: pfx("203.0.113.81/32")}},
				"y": {{Prefix: pfx("203.0.113.80/32"), LinkBandwidth: lb(3)}, {Prefix: pfx("203.0.113.81/32")}},
			},
		},
		{
			name: "not annotated: as before",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("tor", "", nil)},
			want: map[string][]bgp.Advertisement{
				"x": {{Prefix: pfx("203.0.113.80/32")}, {Prefix: pfx("203.0.113.81/32")}},
				"y": {{Prefix: pfx("203.0.113.80/32")}, {Prefix: pfx("203.0.113.81/32")}},
			},
		},
		{
			name: "false",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("tor", "false", nil)},
			want: map[string][]bgp.Advertisement{"y": {{Prefix: pfx("203.0.113.80/32")}, {Prefix: pfx("203.0.113.81/32")}}},
		},
		{
			name: "one of two advertisements of the pool annotated: the route carries it",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("a", "", nil), wecmpAd("b", "true", nil)},
			want: map[string][]bgp.Advertisement{"y": {{Prefix: pfx("203.0.113.80/32"), LinkBandwidth: lb(3)}, {Prefix: pfx("203.0.113.81/32")}}},
		},
		{
			name: "aggregated: the prefix covers both Services, no community",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("tor", "true", new(int32(26)))},
			want: map[string][]bgp.Advertisement{"y": {{Prefix: pfx("203.0.113.64/26")}}},
		},
		{
			name: "bad value: reported, off",
			ads:  []*metallbv1beta1.BGPAdvertisement{wecmpAd("tor", "yes please", nil)},
			want: map[string][]bgp.Advertisement{"y": {{Prefix: pfx("203.0.113.80/32")}, {Prefix: pfx("203.0.113.81/32")}}},
			problems: []Problem{{Object: ObjectRef{"BGPAdvertisement", "metallb-system", "tor"},
				Reason: `annotation vipgate.io/weighted-ecmp: "yes please" is not true or false; weighted ECMP off`, Accepted: true}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			for node, want := range c.want {
				_, ads, _, problems := DecideBGP(BGPInput{Self: node, State: wecmpState(c.ads...)})
				if diff := cmp.Diff(want, ads, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
					t.Errorf("%s: advertisements (-want +got):\n%s", node, diff)
				}
				if diff := cmp.Diff(c.problems, problems); diff != "" {
					t.Errorf("%s: problems (-want +got):\n%s", node, diff)
				}
			}
		})
	}
}

// TestDecideBGPWeightedECMPFollowsEndpoints: the value follows the node's endpoints (y: 3, then 1,
// then only a terminating one still serving), and with none the route is not advertised at all
// (eTP=Local, as without weighted ECMP). The decision's reason says what was sent.
func TestDecideBGPWeightedECMPFollowsEndpoints(t *testing.T) {
	st := wecmpState(wecmpAd("tor", "true", nil))
	web := cluster.ServiceKey{Namespace: "default", Name: "web"}
	vip := netip.MustParsePrefix("203.0.113.80/32")
	decide := func() (bgp.LinkBandwidth, bool, string) {
		_, ads, decisions, _ := DecideBGP(BGPInput{Self: "y", State: st})
		var reason string
		for _, d := range decisions {
			if d.Service == web {
				reason = d.Reason
			}
		}
		for _, a := range ads {
			if a.Prefix == vip {
				return a.LinkBandwidth, true, reason
			}
		}
		return bgp.LinkBandwidth{}, false, reason
	}
	set := func(eps ...cluster.Endpoint) {
		st.EndpointSlices[web] = []*cluster.EndpointSlice{{Service: web, Family: cluster.IPv4, Endpoints: eps}}
	}
	if got, ok, reason := decide(); !ok || got.BytesPerSecond != 375000 || !strings.Contains(reason, "link bandwidth 3 Mbit/s for 3 ready local endpoints") {
		t.Errorf("3 endpoints: %+v %v %q", got, ok, reason)
	}
	set(ep("10.244.2.2", "y", true, true), ep("10.244.2.3", "y", false, false))
	if got, ok, _ := decide(); !ok || got.BytesPerSecond != 125000 {
		t.Errorf("1 ready endpoint: %+v %v", got, ok)
	}
	set(ep("10.244.2.2", "y", false, true))
	if got, ok, _ := decide(); !ok || got.BytesPerSecond != 125000 {
		t.Errorf("1 terminating serving endpoint: %+v %v", got, ok)
	}
	set(ep("10.244.1.2", "x", true, true))
	if got, ok, reason := decide(); ok || !strings.Contains(reason, "no ready endpoint on this node") {
		t.Errorf("no endpoint on y: advertised %+v %v, reason %q", got, ok, reason)
	}
}

// TestHoldLinkBandwidth: at most one bandwidth change per route per interval (the first at once),
// the newest value when the interval is over; new and withdrawn routes are never held.
func TestHoldLinkBandwidth(t *testing.T) {
	const iv = 5 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := netip.MustParsePrefix("203.0.113.80/32"), netip.MustParsePrefix("203.0.113.81/32")
	ad := func(p netip.Prefix, n int) bgp.Advertisement {
		return bgp.Advertisement{Prefix: p, LinkBandwidth: LinkBandwidthFor(n, 64513)}
	}
	sent := map[netip.Prefix]bgp.Advertisement{}
	changed := map[netip.Prefix]time.Time{}
	step := func(at time.Duration, want []bgp.Advertisement, wantOut []bgp.Advertisement, wantWait time.Duration) {
		t.Helper()
		out, wait := holdLinkBandwidth(want, sent, changed, t0.Add(at), iv)
		if diff := cmp.Diff(wantOut, out, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
			t.Errorf("at %v: handed (-want +got):\n%s", at, diff)
		}
		if wait != wantWait {
			t.Errorf("at %v: wait %v, want %v", at, wait, wantWait)
		}
		clear(sent)
		for _, x := range out {
			sent[x.Prefix] = x
		}
	}
	step(0, []bgp.Advertisement{ad(a, 3)}, []bgp.Advertisement{ad(a, 3)}, 0)                         // new
	step(time.Second, []bgp.Advertisement{ad(a, 2)}, []bgp.Advertisement{ad(a, 2)}, 0)               // first change: at once
	step(2*time.Second, []bgp.Advertisement{ad(a, 1)}, []bgp.Advertisement{ad(a, 2)}, 4*time.Second) // held until 1s+5s
	step(3*time.Second, []bgp.Advertisement{ad(a, 1), ad(b, 7)}, []bgp.Advertisement{ad(a, 2), ad(b, 7)}, 3*time.Second)
	step(6*time.Second, []bgp.Advertisement{ad(a, 1), ad(b, 7)}, []bgp.Advertisement{ad(a, 1), ad(b, 7)}, 0) // due: the newest
	step(7*time.Second, []bgp.Advertisement{ad(a, 1), ad(b, 6)}, []bgp.Advertisement{ad(a, 1), ad(b, 6)}, 0) // b's first change
	// A change back to what was sent, while held, is no change.
	step(8*time.Second, []bgp.Advertisement{ad(a, 4), ad(b, 6)}, []bgp.Advertisement{ad(a, 1), ad(b, 6)}, 3*time.Second)
	step(9*time.Second, []bgp.Advertisement{ad(a, 1), ad(b, 6)}, []bgp.Advertisement{ad(a, 1), ad(b, 6)}, 0)
	// Withdrawn and announced again: new, so not held, and its history is gone.
	step(10*time.Second, []bgp.Advertisement{ad(b, 6)}, []bgp.Advertisement{ad(b, 6)}, 0)
	step(10*time.Second, []bgp.Advertisement{ad(a, 5), ad(b, 6)}, []bgp.Advertisement{ad(a, 5), ad(b, 6)}, 0)
	step(10*time.Second, []bgp.Advertisement{ad(a, 6), ad(b, 6)}, []bgp.Advertisement{ad(a, 6), ad(b, 6)}, 0)
	if _, ok := changed[a]; !ok || len(changed) != 2 {
		t.Errorf("changed = %v", changed)
	}
}

// recordingBGP records the advertisements handed to it.
type recordingBGP struct {
	BGPAnnouncer
	mu    sync.Mutex
	calls [][]bgp.Advertisement
	got   chan struct{}
}

func (r *recordingBGP) SetAdvertisements(ads []bgp.Advertisement) error {
	r.mu.Lock()
	r.calls = append(r.calls, ads)
	r.mu.Unlock()
	r.got <- struct{}{}
	return nil
}

func (r *recordingBGP) Stop(context.Context) error { return nil }

// TestLinkBWHolderTimer: a held change is handed on by the holder's own timer, without a new State.
func TestLinkBWHolderTimer(t *testing.T) {
	rec := &recordingBGP{got: make(chan struct{}, 10)}
	h := newLinkBWHolder(rec, 50*time.Millisecond, hclog.NewNullLogger())
	vip := netip.MustParsePrefix("203.0.113.80/32")
	set := func(n int) {
		if err := h.SetAdvertisements([]bgp.Advertisement{{Prefix: vip, LinkBandwidth: LinkBandwidthFor(n, 64513)}}); err != nil {
			t.Fatal(err)
		}
	}
	set(3) // new
	set(2) // first change
	set(1) // held
	for range 3 {
		<-rec.got
	}
	select {
	case <-rec.got: // the timer's call, 50 ms after the first change
	case <-time.After(10 * time.Second):
		t.Fatal("the held change was never handed on")
	}
	rec.mu.Lock()
	var got []float32
	for _, c := range rec.calls {
		got = append(got, c[0].LinkBandwidth.BytesPerSecond)
	}
	rec.mu.Unlock()
	if diff := cmp.Diff([]float32{375000, 250000, 250000, 125000}, got); diff != "" {
		t.Errorf("bandwidths handed on (-want +got):\n%s", diff)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
