package dataplane

// The conntrack cleanup's own tests (matching, the cleaner in a network namespace) are in
// dataplane/conntrack; these cover ConntrackView, the bridge from a cluster.State, and the decision
// (conntrack.StaleFlows) on views built from States.

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

var (
	ctA  = netip.MustParseAddr
	ctAP = netip.MustParseAddrPort
)

// ctState builds a State with one UDP Service (ClusterIP, LB IP, NodePort) and the given endpoints.
func ctState(eps ...string) *cluster.State {
	key := cluster.ServiceKey{Namespace: "demo", Name: "dns"}
	svc := &cluster.Service{
		Key:             key,
		Type:            cluster.TypeLoadBalancer,
		ClusterIPs:      []netip.Addr{ctA("10.96.0.10"), ctA("2001:db8:96::10")},
		LoadBalancerIPs: []netip.Addr{ctA("203.0.113.10")},
		Ports: []cluster.ServicePort{
			{Name: "dns", Protocol: cluster.UDP, Port: 53, NodePort: 30053},
			{Name: "dns-tcp", Protocol: cluster.TCP, Port: 53, NodePort: 30054},
		},
	}
	slice := &cluster.EndpointSlice{
		Namespace: "demo", Name: "dns-1", Service: key, Family: cluster.IPv4,
		Ports: []cluster.EndpointPort{{Name: "dns", Protocol: cluster.UDP, Port: 5353}, {Name: "dns-tcp", Protocol: cluster.TCP, Port: 5353}},
	}
	for _, e := range eps {
		ready := !strings.HasSuffix(e, "!")
		slice.Endpoints = append(slice.Endpoints, cluster.Endpoint{
			Addresses: []netip.Addr{ctA(strings.TrimSuffix(e, "!"))}, Ready: ready, Serving: ready,
		})
	}
	return &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{key: svc},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: {slice}},
	}
}

func TestConntrackView(t *testing.T) {
	got := ConntrackView(ctState("10.244.1.6", "10.244.1.5", "10.244.1.7!"))
	want := map[conntrack.PortKey]conntrack.ServicePort{
		{Service: cluster.ServiceKey{Namespace: "demo", Name: "dns"}, Port: "dns", Proto: 17}: {
			VIPs:      []netip.Addr{ctA("10.96.0.10"), ctA("2001:db8:96::10"), ctA("203.0.113.10")},
			Port:      53,
			NodePort:  30053,
			Endpoints: []netip.AddrPort{ctAP("10.244.1.5:5353"), ctAP("10.244.1.6:5353")},
		},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("ConntrackView (-want +got):\n%s", diff)
	}
}

func TestStaleFlowsFromStates(t *testing.T) {
	const udp = 17
	vip4, vip6, lb := ctA("10.96.0.10"), ctA("2001:db8:96::10"), ctA("203.0.113.10")
	allTo := []conntrack.StaleFlow{
		{Proto: udp, OrigDstPort: 30053},
		{Proto: udp, OrigDst: vip4, OrigDstPort: 53},
		{Proto: udp, OrigDst: lb, OrigDstPort: 53},
		{Proto: udp, OrigDst: vip6, OrigDstPort: 53},
	}
	gone := func(ep string) []conntrack.StaleFlow {
		e := ctA(ep)
		return []conntrack.StaleFlow{
			{Proto: udp, OrigDstPort: 30053, ReplySrc: e, ReplySrcPort: 5353},
			{Proto: udp, OrigDst: vip4, OrigDstPort: 53, ReplySrc: e, ReplySrcPort: 5353},
			{Proto: udp, OrigDst: lb, OrigDstPort: 53, ReplySrc: e, ReplySrcPort: 5353},
		}
	}
	withoutLB := ctState("10.244.1.5")
	withoutLB.Services[cluster.ServiceKey{Namespace: "demo", Name: "dns"}].LoadBalancerIPs = nil

	cases := []struct {
		name      string
		prev, cur *cluster.State
		want      []conntrack.StaleFlow
	}{
		{"nothing changed", ctState("10.244.1.5"), ctState("10.244.1.5"), nil},
		{"endpoint added", ctState("10.244.1.5"), ctState("10.244.1.5", "10.244.1.6"), nil},
		{"endpoint removed", ctState("10.244.1.5", "10.244.1.6"), ctState("10.244.1.5"), gone("10.244.1.6")},
		{"endpoint not serving any more", ctState("10.244.1.5", "10.244.1.6"), ctState("10.244.1.5", "10.244.1.6!"), gone("10.244.1.6")},
		{"zero to some endpoints", ctState(), ctState("10.244.1.5"), allTo},
		{"Service appears with endpoints", &cluster.State{}, ctState("10.244.1.5"), allTo},
		{"Service appears without endpoints", &cluster.State{}, ctState(), nil},
		{"drops to zero endpoints", ctState("10.244.1.5"), ctState(),
			slices.Concat(allTo[:1], gone("10.244.1.5")[:1], allTo[1:2], gone("10.244.1.5")[1:2], allTo[2:3], gone("10.244.1.5")[2:], allTo[3:])},
		{"Service deleted", ctState("10.244.1.5"), &cluster.State{},
			slices.Concat(allTo[:1], gone("10.244.1.5")[:1], allTo[1:2], gone("10.244.1.5")[1:2], allTo[2:3], gone("10.244.1.5")[2:], allTo[3:])},
		{"LoadBalancer IP withdrawn", ctState("10.244.1.5"), withoutLB, []conntrack.StaleFlow{{Proto: udp, OrigDst: lb, OrigDstPort: 53}}},
		{"first sync after start", nil, ctState("10.244.1.5"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var prev map[conntrack.PortKey]conntrack.ServicePort
			if tc.prev != nil {
				prev = ConntrackView(tc.prev)
			}
			got := conntrack.StaleFlows(prev, ConntrackView(tc.cur))
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("conntrack.StaleFlows (-want +got):\n%s", diff)
			}
		})
	}
}
