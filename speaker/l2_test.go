package speaker

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

const mlbNS = "metallb-system"

// l2World builds States for the table tests: nodes n1..n3 (rack a, a, b), pools and advertisements
// added per case.
type l2World struct{ st *cluster.State }

func newL2World() *l2World {
	return &l2World{st: &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{},
		Nodes: map[string]*cluster.Node{
			"n1": {Name: "n1", Labels: map[string]string{"rack": "a"}},
			"n2": {Name: "n2", Labels: map[string]string{"rack": "a"}},
			"n3": {Name: "n3", Labels: map[string]string{"rack": "b"}},
		},
		MetalLB: &cluster.MetalLBConfig{},
	}}
}

func (w *l2World) pool(name string, labels map[string]string, addrs ...string) *l2World {
	w.st.MetalLB.IPAddressPools = append(w.st.MetalLB.IPAddressPools, &metallbv1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: mlbNS, Labels: labels},
		Spec:       metallbv1beta1.IPAddressPoolSpec{Addresses: addrs}})
	return w
}

func (w *l2World) ad(name string, spec metallbv1beta1.L2AdvertisementSpec) *l2World {
	w.st.MetalLB.L2Advertisements = append(w.st.MetalLB.L2Advertisements, &metallbv1beta1.L2Advertisement{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: mlbNS}, Spec: spec})
	return w
}

// svc adds a LoadBalancer Service; eps are "node" (ready) or "node:serving" / "node:unready".
func (w *l2World) svc(name string, local bool, ips []string, eps ...string) *l2World {
	k := cluster.ServiceKey{Namespace: "default", Name: name}
	s := &cluster.Service{Key: k, Type: cluster.TypeLoadBalancer, ExternalPolicyLocal: local}
	for _, ip := range ips {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(ip))
	}
	w.st.Services[k] = s
	es := &cluster.EndpointSlice{Service: k, Family: cluster.IPv4}
	for _, e := range eps {
		node, cond, _ := strings.Cut(e, ":")
		ep := cluster.Endpoint{NodeName: node, Ready: cond == "", Serving: cond == "" || cond == "serving", Terminating: cond == "serving"}
		es.Endpoints = append(es.Endpoints, ep)
	}
	w.st.EndpointSlices[k] = []*cluster.EndpointSlice{es}
	return w
}

// hashOwner is MetalLB's rule written out independently: sort by sha256(node#ip), take the first.
func hashOwner(ip string, nodes ...string) string {
	slices.SortFunc(nodes, func(a, b string) int {
		ha, hb := sha256.Sum256([]byte(a+"#"+ip)), sha256.Sum256([]byte(b+"#"+ip))
		return bytes.Compare(ha[:], hb[:])
	})
	return nodes[0]
}

var (
	all3  = map[string]bool{"n1": true, "n2": true, "n3": true}
	lan   = []Link{{Name: "eth0", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.11/24"), netip.MustParsePrefix("2001:db8:1::11/64")}}, {Name: "eth1", Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.2/24")}}}
	lanAd = metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"lan"}}
)

// decide runs DecideL2 as every live node and checks they agree; it returns "owner|reason" per
// Service/IP and what each node would answer for.
func decide(t *testing.T, st *cluster.State, live map[string]bool) (map[string]string, map[string]map[netip.Addr][]string) {
	t.Helper()
	out, owned := map[string]string{}, map[string]map[netip.Addr][]string{}
	for _, self := range []string{"n1", "n2", "n3"} {
		o, ds := DecideL2(L2Input{Self: self, Live: live, Links: lan, State: st})
		owned[self] = o
		for _, d := range ds {
			key := d.Service.Name + " " + d.IP.String()
			v := d.Owner + "|" + d.Reason
			if d.Owner != self {
				// Only the owner knows about its interfaces; compare the part everyone computes.
				if prev, ok := out[key]; ok && ownerOf(prev) != d.Owner {
					t.Fatalf("%s and another node disagree on %s: %s vs %s", self, key, prev, v)
				}
			}
			if d.Owner == self || out[key] == "" {
				out[key] = v
			}
		}
	}
	return out, owned
}

func ownerOf(v string) string { o, _, _ := strings.Cut(v, "|"); return o }

func TestDecideL2(t *testing.T) {
	for _, tc := range []struct {
		name  string
		world *l2World
		live  map[string]bool
		want  map[string]string // "svc ip" -> "owner|reason"
	}{{
		name:  "eTP=Cluster: rendezvous owner among all live nodes",
		world: newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1"),
		live:  all3,
		want:  map[string]string{"web 192.0.2.200": hashOwner("192.0.2.200", "n1", "n2", "n3") + "|"},
	}, {
		name:  "the owner's death moves the IP to the next in hash order",
		world: newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1"),
		live:  without(all3, hashOwner("192.0.2.200", "n1", "n2", "n3")),
		want: map[string]string{"web 192.0.2.200": hashOwner("192.0.2.200",
			slices.DeleteFunc([]string{"n1", "n2", "n3"}, func(n string) bool { return n == hashOwner("192.0.2.200", "n1", "n2", "n3") })...) + "|"},
	}, {
		name:  "eTP=Local: only nodes with a local endpoint that can serve",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).svc("local", true, []string{"192.0.2.201"}, "n3", "n2:unready"),
		live:  all3,
		want:  map[string]string{"local 192.0.2.201": "n3|"},
	}, {
		name:  "eTP=Local: a terminating endpoint that still serves counts",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).svc("local", true, []string{"192.0.2.201"}, "n2:serving"),
		live:  all3,
		want:  map[string]string{"local 192.0.2.201": "n2|"},
	}, {
		name:  "eTP=Local: the endpoint's node is dead",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).svc("local", true, []string{"192.0.2.201"}, "n3"),
		live:  without(all3, "n3"),
		want:  map[string]string{"local 192.0.2.201": "|no live eligible node with a local endpoint (externalTrafficPolicy Local)"},
	}, {
		name:  "no endpoint can serve: not announced (MetalLB)",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).svc("empty", false, []string{"192.0.2.202"}, "n1:unready"),
		live:  all3,
		want:  map[string]string{"empty 192.0.2.202": "|no endpoint can serve"},
	}, {
		name:  "IP in no pool",
		world: newL2World().pool("lan", nil, "192.0.2.200/29").ad("lan", lanAd).svc("nopool", false, []string{"192.0.2.10"}, "n1"),
		live:  all3,
		want:  map[string]string{"nopool 192.0.2.10": "|no IPAddressPool contains this IP"},
	}, {
		name: "pool without L2Advertisement",
		world: newL2World().pool("lan", nil, "192.0.2.200/29").pool("other", nil, "203.0.113.0/24").ad("lan", lanAd).
			svc("noad", false, []string{"203.0.113.7"}, "n1"),
		live: all3,
		want: map[string]string{"noad 203.0.113.7": "|pool metallb-system/other has no L2Advertisement"},
	}, {
		name:  "an advertisement naming no pool covers every pool",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("all", metallbv1beta1.L2AdvertisementSpec{}).svc("web", false, []string{"192.0.2.203"}, "n1"),
		live:  map[string]bool{"n2": true},
		want:  map[string]string{"web 192.0.2.203": "n2|"},
	}, {
		name: "ipAddressPoolSelectors + nodeSelectors + interfaces",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").pool("rack-a", map[string]string{"zone": "a"}, "198.51.100.0/28").ad("lan", lanAd).
			ad("rack-a", metallbv1beta1.L2AdvertisementSpec{
				IPAddressPoolSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"zone": "a"}}},
				NodeSelectors:          []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "a"}}},
				Interfaces:             []string{"eth1"}}).
			svc("racked", false, []string{"198.51.100.5"}, "n3"),
		live: all3,
		want: map[string]string{"racked 198.51.100.5": hashOwner("198.51.100.5", "n1", "n2") + "|"},
	}, {
		name: "nodeSelectors match no live node",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").
			ad("rack-b", metallbv1beta1.L2AdvertisementSpec{NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "b"}}}}).
			svc("web", false, []string{"192.0.2.204"}, "n1"),
		live: without(all3, "n3"),
		want: map[string]string{"web 192.0.2.204": "|no live eligible node"},
	}, {
		name:  "a node labelled exclude-from-external-load-balancers never announces",
		world: excluded(newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).svc("web", false, []string{"192.0.2.205"}, "n1"), "n1", "n2"),
		live:  all3,
		want:  map[string]string{"web 192.0.2.205": "n3|"},
	}, {
		name:  "a missing interface is reported by the owner, the others are used",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", metallbv1beta1.L2AdvertisementSpec{Interfaces: []string{"eth0", "bond7"}}).svc("web", false, []string{"192.0.2.206"}, "n1"),
		live:  map[string]bool{"n1": true},
		want:  map[string]string{"web 192.0.2.206": "n1|L2Advertisement interface(s) bond7 not found on this node"},
	}, {
		// As MetalLB: an advertisement without interfaces means every interface (l2_ifaces_test.go).
		name:  "a VIP on no attached subnet is answered on every interface",
		world: newL2World().pool("far", nil, "203.0.113.0/24").ad("lan", metallbv1beta1.L2AdvertisementSpec{}).svc("far", false, []string{"203.0.113.9"}, "n1"),
		live:  map[string]bool{"n2": true},
		want:  map[string]string{"far 203.0.113.9": "n2|"},
	}, {
		name: "a shared IP gets one owner: the union of its Services' candidates",
		world: newL2World().pool("lan", nil, "192.0.2.0/24").ad("lan", lanAd).
			svc("a", true, []string{"192.0.2.207"}, "n1").svc("b", true, []string{"192.0.2.207"}, "n2"),
		live: all3,
		want: map[string]string{"a 192.0.2.207": hashOwner("192.0.2.207", "n1", "n2") + "|", "b 192.0.2.207": hashOwner("192.0.2.207", "n1", "n2") + "|"},
	}, {
		name:  "IPv6",
		world: newL2World().pool("lan", nil, "2001:db8:1::200/120").ad("lan", lanAd).svc("web6", false, []string{"2001:db8:1::200"}, "n1"),
		live:  all3,
		want:  map[string]string{"web6 2001:db8:1::200": hashOwner("2001:db8:1::200", "n1", "n2", "n3") + "|"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, owned := decide(t, tc.world.st, tc.live)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decisions (-want +got):\n%s", diff)
			}
			// Exactly the owner answers, and only for IPs it owns with usable interfaces.
			for key, v := range got {
				ip := netip.MustParseAddr(strings.Fields(key)[1])
				for self, o := range owned {
					if _, answers := o[ip]; answers && self != ownerOf(v) {
						t.Errorf("%s answers for %s owned by %q", self, ip, ownerOf(v))
					}
				}
			}
		})
	}
}

func without(m map[string]bool, dead string) map[string]bool {
	out := map[string]bool{}
	for n, v := range m {
		if n != dead {
			out[n] = v
		}
	}
	return out
}

func excluded(w *l2World, nodes ...string) *l2World {
	for _, n := range nodes {
		w.st.Nodes[n].Labels[ExcludeFromLBLabel] = ""
	}
	return w
}

func TestDecideL2Interfaces(t *testing.T) {
	w := newL2World().pool("lan", nil, "192.0.2.0/24", "2001:db8:1::/64", "198.51.100.0/24").ad("lan", metallbv1beta1.L2AdvertisementSpec{}).
		svc("v4", false, []string{"192.0.2.200"}, "n1").svc("v6", false, []string{"2001:db8:1::200"}, "n1").svc("eth1", false, []string{"198.51.100.9"}, "n1")
	owned, ds := DecideL2(L2Input{Self: "n1", Live: map[string]bool{"n1": true}, Links: lan, State: w.st})
	// Answered on every interface (as MetalLB); announced where the subnet holds the IP
	// (TestDecideL2AllInterfaces).
	want := map[netip.Addr][]string{
		netip.MustParseAddr("192.0.2.200"):     {"eth0", "eth1"},
		netip.MustParseAddr("2001:db8:1::200"): {"eth0", "eth1"},
		netip.MustParseAddr("198.51.100.9"):    {"eth0", "eth1"},
	}
	if diff := cmp.Diff(want, owned); diff != "" {
		t.Errorf("owned (-want +got):\n%s\n%v", diff, ds)
	}
	// Without link information the default interface answers.
	owned, _ = DecideL2(L2Input{Self: "n1", Live: map[string]bool{"n1": true}, DefaultInterface: "eth9", State: w.st})
	if got := owned[netip.MustParseAddr("192.0.2.200")]; !slices.Equal(got, []string{"eth9"}) {
		t.Errorf("default interface: got %v", got)
	}
	// Not live (no quorum): nothing.
	if owned, _ := DecideL2(L2Input{Self: "n1", Live: map[string]bool{"n2": true}, Links: lan, State: w.st}); len(owned) != 0 {
		t.Errorf("announced %v while not a candidate", owned)
	}
}

// TestDecideL2Spread: 1,000 IPs over three nodes land roughly evenly, and when one node dies only
// its IPs move, spread over the two survivors.
func TestDecideL2Spread(t *testing.T) {
	w := newL2World().pool("lan", nil, "198.51.100.0/22").ad("lan", metallbv1beta1.L2AdvertisementSpec{Interfaces: []string{"eth0"}})
	var ips []string
	for i := range 1000 {
		ip := netip.AddrFrom4([4]byte{198, 51, 100 + byte(i/250), byte(i % 250)}).String()
		ips = append(ips, ip)
	}
	w.svc("many", false, ips, "n1")
	before, _ := decide(t, w.st, all3)
	count := map[string]int{}
	for _, v := range before {
		count[ownerOf(v)]++
	}
	t.Logf("1,000 IPs over 3 nodes: %v", count)
	for _, n := range []string{"n1", "n2", "n3"} {
		if count[n] < 250 || count[n] > 420 {
			t.Errorf("%s owns %d of 1,000 IPs: not spread", n, count[n])
		}
	}
	after, _ := decide(t, w.st, without(all3, "n2"))
	moved := map[string]int{}
	for k, v := range before {
		if ownerOf(v) != "n2" && ownerOf(after[k]) != ownerOf(v) {
			t.Errorf("%s moved from live %s to %s", k, ownerOf(v), ownerOf(after[k]))
		}
		if ownerOf(v) == "n2" {
			moved[ownerOf(after[k])]++
		}
	}
	t.Logf("n2's %d IPs went to %v", count["n2"], moved)
}

func ExampleDecideL2() {
	w := newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220").ad("lan", lanAd).svc("web", false, []string{"192.0.2.200"}, "n1", "n2")
	_, ds := DecideL2(L2Input{Self: "n1", Live: all3, Links: lan, State: w.st})
	fmt.Println(ds[0].Service, ds[0].IP, "owner", ds[0].Owner)
	// Output: default/web 192.0.2.200 owner n3
}

// TestDecideL2ServiceSelectors: MetalLB v0.16's L2Advertisement serviceSelectors. An advertisement
// covers only the Services it selects: rack-a's advertisement selects tier=web, rack-b's selects
// everything; a Service no advertisement selects is not announced.
func TestDecideL2ServiceSelectors(t *testing.T) {
	web := []metav1.LabelSelector{{MatchLabels: map[string]string{"tier": "web"}}}
	db := []metav1.LabelSelector{{MatchLabels: map[string]string{"tier": "db"}}}
	rack := func(r string) []metav1.LabelSelector {
		return []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": r}}}
	}
	w := newL2World().pool("lan", nil, "192.0.2.200-192.0.2.220").
		ad("a-web", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"lan"}, NodeSelectors: rack("a"), ServiceSelectors: web}).
		ad("b-db", metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"lan"}, NodeSelectors: rack("b"), ServiceSelectors: db}).
		svc("front", false, []string{"192.0.2.200"}, "n1").
		svc("store", false, []string{"192.0.2.201"}, "n1").
		svc("other", false, []string{"192.0.2.202"}, "n1")
	w.st.Services[cluster.ServiceKey{Namespace: "default", Name: "front"}].Labels = map[string]string{"tier": "web"}
	w.st.Services[cluster.ServiceKey{Namespace: "default", Name: "store"}].Labels = map[string]string{"tier": "db"}
	got, _ := decide(t, w.st, all3)
	want := map[string]string{
		"front 192.0.2.200": hashOwner("192.0.2.200", "n1", "n2") + "|",
		"store 192.0.2.201": "n3|",
		"other 192.0.2.202": "|no L2Advertisement of pool metallb-system/lan selects this Service (serviceSelectors)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("owners (-want +got):\n%s", diff)
	}
}
