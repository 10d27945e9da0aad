package speaker

import (
	"net/netip"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// TestGatewayView: on a gateway the gateways are the nodes (selected by the group's labels), every
// gateway may own an eTP=Local VIP, and VIPs the gateway cannot forward are not announced.
func TestGatewayView(t *testing.T) {
	vip, idle := netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("192.0.2.201")
	key := cluster.ServiceKey{Namespace: "e2e", Name: "web"}
	pool := &metallbv1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "metallb-system"},
		Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"192.0.2.200-192.0.2.210"}}}
	ad := &metallbv1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "metallb-system"},
		Spec: metallbv1beta1.L2AdvertisementSpec{NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"vipgate.io/role": "gateway"}}}}}
	st := &cluster.State{
		Services: map[cluster.ServiceKey]*cluster.Service{key: {Key: key, Type: cluster.TypeLoadBalancer,
			LoadBalancerIPs: []netip.Addr{vip, idle}, ExternalPolicyLocal: true}},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: {{Endpoints: []cluster.Endpoint{
			{Addresses: []netip.Addr{netip.MustParseAddr("10.244.1.11")}, NodeName: "node1", Ready: true, Serving: true}}}}},
		Nodes:   map[string]*cluster.Node{"node1": {Name: "node1"}},
		MetalLB: &cluster.MetalLBConfig{IPAddressPools: []*metallbv1beta1.IPAddressPool{pool}, L2Advertisements: []*metallbv1beta1.L2Advertisement{ad}},
	}
	g := GatewayGroup{Members: map[string][]netip.Addr{"gw1": {netip.MustParseAddr("192.0.2.21")}, "gw2": {netip.MustParseAddr("192.0.2.22")}},
		Labels: map[string]string{"vipgate.io/role": "gateway"}}
	view := GatewayView(st, g, map[netip.Addr]bool{vip: true})
	if _, ok := view.Nodes["node1"]; ok || len(view.Nodes) != 2 || view.Nodes["gw2"].Labels["kubernetes.io/hostname"] != "gw2" {
		t.Fatalf("view nodes %v: want the gateways only", view.Nodes)
	}
	if st.Services[key].ExternalPolicyLocal != true || len(st.Services[key].LoadBalancerIPs) != 2 {
		t.Fatal("GatewayView changed its input")
	}
	owners := map[string]bool{}
	for _, self := range []string{"gw1", "gw2"} {
		owned, decisions := DecideL2(L2Input{Self: self, Live: map[string]bool{"gw1": true, "gw2": true}, State: view, DefaultInterface: "eth0"})
		if len(decisions) != 1 || decisions[0].IP != vip || decisions[0].Owner == "" {
			t.Fatalf("%s: decisions %+v: want one owner for %s only (%s has no backend)", self, decisions, vip, idle)
		}
		if _, ok := owned[vip]; ok {
			owners[self] = true
		}
	}
	if len(owners) != 1 {
		t.Errorf("owners %v: want exactly one gateway", owners)
	}
}
