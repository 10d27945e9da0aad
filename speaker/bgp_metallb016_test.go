package speaker

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// metallb016State is one node, one pool (the website's first-pool), the given BGP advertisements
// and peers, and two LoadBalancer Services labelled environment=production and staging.
func metallb016State(ads []*metallbv1beta1.BGPAdvertisement, peers ...*metallbv1beta2.BGPPeer) *cluster.State {
	svc := func(name, ip, env string) *cluster.Service {
		return &cluster.Service{Key: cluster.ServiceKey{Namespace: "default", Name: name}, Type: cluster.TypeLoadBalancer,
			Labels: map[string]string{"environment": env}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	prod, staging := svc("prod", "198.51.100.10", "production"), svc("staging", "198.51.100.11", "staging")
	return &cluster.State{
		Nodes:    map[string]*cluster.Node{"n1": {Name: "n1"}},
		Services: map[cluster.ServiceKey]*cluster.Service{prod.Key: prod, staging.Key: staging},
		MetalLB: &cluster.MetalLBConfig{
			IPAddressPools: []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: "first-pool"},
				Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"198.51.100.10/24"}}}},
			BGPAdvertisements: ads,
			BGPPeers:          peers,
		},
	}
}

func bgpAd(name string, localPref uint32, sels []metav1.LabelSelector, aggr *int32) *metallbv1beta1.BGPAdvertisement {
	return &metallbv1beta1.BGPAdvertisement{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: name},
		Spec: metallbv1beta1.BGPAdvertisementSpec{IPAddressPools: []string{"first-pool"}, LocalPref: localPref,
			ServiceSelectors: sels, AggregationLength: aggr}}
}

func envSelector(env string) []metav1.LabelSelector {
	return []metav1.LabelSelector{{MatchLabels: map[string]string{"environment": env}}}
}

// TestBGPServiceSelectors: MetalLB v0.16's serviceSelectors on BGPAdvertisements, with the website's
// production/staging example: each Service is advertised only by the advertisements that select it;
// no selectors selects every Service (v0.15 objects unchanged); selectors with a non-default
// aggregation length (refused by MetalLB's CRD) or that do not parse are reported and that
// advertisement alone is left out.
func TestBGPServiceSelectors(t *testing.T) {
	pfx := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	for _, c := range []struct {
		name     string
		ads      []*metallbv1beta1.BGPAdvertisement
		want     []bgp.Advertisement
		problems []Problem
	}{
		{
			name: "website example: localPref by environment",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("production-services", 200, envSelector("production"), nil), bgpAd("staging-services", 100, envSelector("staging"), nil)},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.10/32"), LocalPref: 200}, {Prefix: pfx("198.51.100.11/32"), LocalPref: 100}},
		},
		{
			name: "only production selected: staging not advertised",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("production-services", 200, envSelector("production"), nil)},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.10/32"), LocalPref: 200}},
		},
		{
			name: "v0.15 object without serviceSelectors: every Service",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("all", 0, nil, nil)},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.10/32")}, {Prefix: pfx("198.51.100.11/32")}},
		},
		{
			name: "OR of selectors",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("both", 0, append(envSelector("production"), envSelector("staging")...), nil)},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.10/32")}, {Prefix: pfx("198.51.100.11/32")}},
		},
		{
			name: "with aggregationLength 24: reported, the other advertisement keeps working",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("aggr", 0, envSelector("production"), new(int32(24))), bgpAd("staging-services", 100, envSelector("staging"), nil)},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.11/32"), LocalPref: 100}},
			problems: []Problem{{Object: ObjectRef{"BGPAdvertisement", "metallb-system", "aggr"},
				Reason: "serviceSelectors and aggregationLength 24 are mutually exclusive (only the default 32); not advertising through it"}},
		},
		{
			name: "with aggregationLength 32: fine",
			ads:  []*metallbv1beta1.BGPAdvertisement{bgpAd("aggr", 0, envSelector("production"), new(int32(32)))},
			want: []bgp.Advertisement{{Prefix: pfx("198.51.100.10/32")}},
		},
		{
			name: "selector that does not parse",
			ads: []*metallbv1beta1.BGPAdvertisement{bgpAd("bad", 0, []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "environment", Operator: "Nearly"}}}}, nil)},
			problems: []Problem{{Object: ObjectRef{"BGPAdvertisement", "metallb-system", "bad"},
				Reason: `serviceSelectors[0]: "Nearly" is not a valid label selector operator; it selects no Service; not advertising through it`}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ads, _, problems := DecideBGP(BGPInput{Self: "n1", State: metallb016State(c.ads)})
			if diff := cmp.Diff(c.want, ads, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("advertisements (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.problems, problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBGPPeerV016Fields (problems in the State's peer order): localASN reaches the session; fields vipgate does not implement are
// reported (one merged Problem per object) and the peer is used without them, or not at all where
// they replace its address or AS number; a v0.15 peer reports nothing.
func TestBGPPeerV016Fields(t *testing.T) {
	peer := func(name string, f func(*metallbv1beta2.BGPPeerSpec)) *metallbv1beta2.BGPPeer {
		p := &metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: name},
			Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64513, Address: "192.0.2.1"}}
		f(&p.Spec)
		return p
	}
	st := metallb016State(nil,
		peer("v015", func(*metallbv1beta2.BGPPeerSpec) {}),
		peer("local-asn", func(s *metallbv1beta2.BGPPeerSpec) { s.LocalASN = 65010; s.Address = "192.0.2.2" }),
		peer("dual", func(s *metallbv1beta2.BGPPeerSpec) {
			// disableMP is deprecated in v0.16.2 (in favour of dualStackAddressFamily), still read.
			//lint:ignore SA1019 a user's object may still set it
			s.Address, s.DualStackAddressFamily, s.Interface, s.DisableMP = "192.0.2.3", true, "eth1", true
		}),
		peer("unnumbered", func(s *metallbv1beta2.BGPPeerSpec) { s.Address, s.Interface = "", "eth1" }),
		peer("dynamic", func(s *metallbv1beta2.BGPPeerSpec) {
			s.ASN, s.DynamicASN, s.Address = 0, metallbv1beta2.ExternalASNMode, "192.0.2.5"
		}),
		peer("vrf", func(s *metallbv1beta2.BGPPeerSpec) { s.VRFName, s.Address = "red", "192.0.2.6" }),
	)
	peers, _, _, problems := DecideBGP(BGPInput{Self: "n1", State: st})
	got := map[string]uint32{}
	for _, p := range peers {
		got[p.Name] = p.LocalASN
	}
	want := map[string]uint32{"metallb-system/v015": 0, "metallb-system/local-asn": 65010, "metallb-system/dual": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("peers and their localASN (-want +got):\n%s", diff)
	}
	wantProblems := []Problem{
		{Object: ObjectRef{"BGPPeer", "metallb-system", "dual"}, Reason: "fields spec.interface, spec.dualStackAddressFamily are not supported by vipgate; ignored (the rest of the object is in use)", Accepted: true},
		{Object: ObjectRef{"BGPPeer", "metallb-system", "unnumbered"}, Reason: `field spec.interface (unnumbered BGP over "eth1") is not supported by vipgate: set peerAddress; not peering`},
		{Object: ObjectRef{"BGPPeer", "metallb-system", "dynamic"}, Reason: `field spec.dynamicASN ("external") is not supported by vipgate: set peerASN; not peering`},
		{Object: ObjectRef{"BGPPeer", "metallb-system", "vrf"}, Reason: `field spec.vrf ("red") is not supported by vipgate (it peers from the node's default VRF only); not peering`},
	}
	if diff := cmp.Diff(wantProblems, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}

// TestMergeProblems: several problems of one object become one, in order, without repeats.
func TestMergeProblems(t *testing.T) {
	a, b, c := ObjectRef{"BGPPeer", "ns", "a"}, ObjectRef{"BGPPeer", "ns", "b"}, ObjectRef{"BGPAdvertisement", "ns", "a"}
	got := mergeProblems([]Problem{{a, "x", true}, {b, "y", true}, {a, "z", false}, {a, "x", true}, {c, "w", true}})
	want := []Problem{{a, "x; z", false}, {b, "y", true}, {c, "w", true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestL2AdsForServices: an L2Advertisement's serviceSelectors narrow the pool's advertisements to
// those selecting one of the IP's Services; none means every Service.
func TestL2AdsForServices(t *testing.T) {
	ad := func(name string, sels []metav1.LabelSelector) *metallbv1beta1.L2Advertisement {
		return &metallbv1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: name},
			Spec: metallbv1beta1.L2AdvertisementSpec{ServiceSelectors: sels}}
	}
	front := []metav1.LabelSelector{{MatchLabels: map[string]string{"tier": "frontend"}}}
	back := []metav1.LabelSelector{{MatchLabels: map[string]string{"tier": "backend"}}}
	all, f, b := ad("all", nil), ad("frontend-services", front), ad("backend-services", back)
	names := func(ads []*metallbv1beta1.L2Advertisement) []string {
		var out []string
		for _, a := range ads {
			out = append(out, a.Name)
		}
		return out
	}
	for _, c := range []struct {
		name     string
		labels   []map[string]string
		want     []string
		narrowed bool
	}{
		{"frontend", []map[string]string{{"tier": "frontend"}}, []string{"all", "frontend-services"}, true},
		{"unlabelled", []map[string]string{nil}, []string{"all"}, true},
		{"shared by frontend and backend", []map[string]string{{"tier": "frontend"}, {"tier": "backend"}}, []string{"all", "frontend-services", "backend-services"}, false},
	} {
		got, narrowed := l2AdsForServices([]*metallbv1beta1.L2Advertisement{all, f, b}, c.labels)
		if diff := cmp.Diff(c.want, names(got)); diff != "" || narrowed != c.narrowed {
			t.Errorf("%s: narrowed %v (want %v), ads (-want +got):\n%s", c.name, narrowed, c.narrowed, diff)
		}
	}
}

// TestL2CandidatesFor: the candidates of a Service's L2 advertisements are the pool's candidates
// that those advertisements' nodeSelectors select (MetalLB's website example: frontend Services
// announced by one advertisement, backend ones by another, on different nodes).
func TestL2CandidatesFor(t *testing.T) {
	st := &cluster.State{Nodes: map[string]*cluster.Node{
		"a": {Name: "a", Labels: map[string]string{"role": "front"}},
		"b": {Name: "b", Labels: map[string]string{"role": "back"}},
		"c": {Name: "c", Labels: map[string]string{"role": "back"}},
	}}
	ad := func(role string) *metallbv1beta1.L2Advertisement {
		return &metallbv1beta1.L2Advertisement{Spec: metallbv1beta1.L2AdvertisementSpec{
			NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"role": role}}}}}
	}
	cands := map[string]bool{"a": true, "b": true} // c is not alive
	got := l2CandidatesFor(newSelectorCache(), st, cands, []*metallbv1beta1.L2Advertisement{ad("back")})
	if diff := cmp.Diff(map[string]bool{"b": true}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if len(cands) != 2 {
		t.Errorf("the pool's candidates were modified: %v", cands)
	}
}

// TestBGPExcludeFromLB: a node labelled node.kubernetes.io/exclude-from-external-load-balancers
// (any value) advertises nothing by BGP, as MetalLB's BGP speaker (nodeLabeledExcludeBalancers);
// its sessions stay up. Without the label it advertises.
func TestBGPExcludeFromLB(t *testing.T) {
	peer := &metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: "tor"},
		Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64513, Address: "192.0.2.1"}}
	for _, label := range []*string{nil, new(""), new("true")} {
		st := metallb016State([]*metallbv1beta1.BGPAdvertisement{bgpAd("all", 0, nil, nil)}, peer)
		if label != nil {
			st.Nodes["n1"].Labels = map[string]string{ExcludeFromLBLabel: *label}
		}
		peers, ads, decisions, _ := DecideBGP(BGPInput{Self: "n1", State: st})
		if len(peers) != 1 {
			t.Errorf("label %v: %d peers, want the session kept", label, len(peers))
		}
		if label == nil {
			if len(ads) != 2 {
				t.Errorf("no label: %d advertisements, want 2", len(ads))
			}
			continue
		}
		if len(ads) != 0 {
			t.Errorf("label %q: advertised %v, want nothing", *label, ads)
		}
		for _, d := range decisions {
			if d.Owner != "" || d.Reason != "this node is labelled "+ExcludeFromLBLabel {
				t.Errorf("label %q: decision %+v", *label, d)
			}
		}
	}
}
