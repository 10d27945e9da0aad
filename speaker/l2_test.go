package speaker

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

func l2State() *cluster.State {
	ns := "metallb-system"
	st := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{},
		Nodes: map[string]*cluster.Node{
			"n1": {Name: "n1", Labels: map[string]string{"rack": "a"}},
			"n2": {Name: "n2", Labels: map[string]string{"rack": "a"}},
			"n3": {Name: "n3", Labels: map[string]string{"rack": "b"}},
		},
		MetalLB: &cluster.MetalLBConfig{
			IPAddressPools: []*metallbv1beta1.IPAddressPool{
				{ObjectMeta: metav1.ObjectMeta{Name: "lan", Namespace: ns}, Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"192.0.2.200-192.0.2.250"}}},
				{ObjectMeta: metav1.ObjectMeta{Name: "rack-a", Namespace: ns, Labels: map[string]string{"zone": "a"}}, Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"198.51.100.0/28"}}},
				{ObjectMeta: metav1.ObjectMeta{Name: "unadvertised", Namespace: ns}, Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"203.0.113.0/24"}}},
			},
			L2Advertisements: []*metallbv1beta1.L2Advertisement{
				{ObjectMeta: metav1.ObjectMeta{Name: "lan", Namespace: ns}, Spec: metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"lan"}}},
				{ObjectMeta: metav1.ObjectMeta{Name: "rack-a", Namespace: ns}, Spec: metallbv1beta1.L2AdvertisementSpec{
					IPAddressPoolSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"zone": "a"}}},
					NodeSelectors:          []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "a"}}},
					Interfaces:             []string{"eth1"}}},
			},
		},
	}
	add := func(name, ip string, local bool, epNodes ...string) {
		k := cluster.ServiceKey{Namespace: "default", Name: name}
		st.Services[k] = &cluster.Service{Key: k, Type: cluster.TypeLoadBalancer, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(ip)}, ExternalPolicyLocal: local}
		es := &cluster.EndpointSlice{Service: k, Family: cluster.IPv4}
		for _, n := range epNodes {
			es.Endpoints = append(es.Endpoints, cluster.Endpoint{Ready: true, NodeName: n})
		}
		st.EndpointSlices[k] = []*cluster.EndpointSlice{es}
	}
	add("web", "192.0.2.200", false, "n1")
	add("local", "192.0.2.201", true, "n3")
	add("racked", "198.51.100.5", false, "n1")
	add("nopool", "192.0.2.10", false, "n1")
	add("noad", "203.0.113.7", false, "n1")
	return st
}

func owners(t *testing.T, live map[string]bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, self := range []string{"n1", "n2", "n3"} {
		_, ds := DecideL2(L2Input{Self: self, Live: live, Quorum: true, DefaultInterface: "eth0", State: l2State()})
		for _, d := range ds {
			if prev, ok := out[d.Service.Name]; ok && prev != d.Owner+"|"+d.Reason {
				t.Fatalf("nodes disagree on %s: %s vs %s", d.Service.Name, prev, d.Owner+"|"+d.Reason)
			}
			out[d.Service.Name] = d.Owner + "|" + d.Reason
		}
	}
	return out
}

func TestDecideL2(t *testing.T) {
	all := map[string]bool{"n1": true, "n2": true, "n3": true}
	got := owners(t, all)
	// Rendezvous hashing: fixed by the node names and IPs, the same on every node.
	web := got["web"]
	if web == "|" || web == "" {
		t.Fatalf("web has no owner: %q", web)
	}
	want := map[string]string{
		"local":  "n3|",                                       // eTP=Local: only the node with a ready endpoint
		"nopool": "|no IPAddressPool contains this IP",        // not ours to announce
		"noad":   "|pool unadvertised has no L2Advertisement", // pool without advertisement
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	if r := got["racked"]; r != "n1|" && r != "n2|" {
		t.Errorf("racked (nodeSelectors rack=a): owner %q, want n1 or n2", r)
	}
	// The owner dies: its IPs move, the others stay.
	dead := ownerOf(web)
	live := map[string]bool{"n1": true, "n2": true, "n3": true}
	live[dead] = false
	moved := owners(t, live)
	if moved["web"] == web || moved["web"] == "|" {
		t.Errorf("web did not move off dead %s: %q", dead, moved["web"])
	}
	if dead != "n3" && moved["local"] != "n3|" {
		t.Errorf("local moved although its owner lives: %q", moved["local"])
	}
	// Without quorum this node announces nothing.
	owned, _ := DecideL2(L2Input{Self: "n3", Live: all, Quorum: false, DefaultInterface: "eth0", State: l2State()})
	if len(owned) != 0 {
		t.Errorf("announced %v without quorum", owned)
	}
	// Interfaces: the advertisement's, else the default.
	owned, _ = DecideL2(L2Input{Self: "n3", Live: all, Quorum: true, DefaultInterface: "eth0", State: l2State()})
	if diff := cmp.Diff([]string{"eth0"}, owned[netip.MustParseAddr("192.0.2.201")]); diff != "" {
		t.Errorf("interfaces (-want +got):\n%s", diff)
	}
}

func ownerOf(ownerReason string) string {
	for i := range ownerReason {
		if ownerReason[i] == '|' {
			return ownerReason[:i]
		}
	}
	return ownerReason
}

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in      string
		in1     string
		out     string
		wantErr bool
	}{
		{in: "192.0.2.0/30", in1: "192.0.2.3", out: "192.0.2.4"},
		{in: "192.0.2.10-192.0.2.20", in1: "192.0.2.20", out: "192.0.2.21"},
		{in: "2001:db8::/126", in1: "2001:db8::3", out: "2001:db8::4"},
		{in: "192.0.2.20-192.0.2.10", wantErr: true},
		{in: "192.0.2.0/33", wantErr: true},
	} {
		r, err := parseRange(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v", tc.in, err)
			continue
		}
		if err == nil && (!r.contains(netip.MustParseAddr(tc.in1)) || r.contains(netip.MustParseAddr(tc.out))) {
			t.Errorf("%s: range %v..%v", tc.in, r.first, r.last)
		}
	}
}
