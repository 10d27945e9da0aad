package gateway

import (
	"net/netip"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestGatewayDecodeRoundTrip: gateway tables of every forwarding mode and SNAT setting, both
// families, programmed into a throwaway namespace and read back: the decoder proves the jhash DNAT
// and the routed dup rules against the encoder and returns exactly the model that was programmed.
// With ranges, web and web6 have loadBalancerSourceRanges (the gateway's fw- chains).
func TestGatewayDecodeRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name   string
		cfg    Config
		ranges []string
	}{
		{"nodePort auto", Config{Forwarding: cluster.ForwardNodePort}, nil},
		{"direct always", Config{Forwarding: cluster.ForwardDirect, SNAT: cluster.SNATAlways}, nil},
		{"route", Config{Forwarding: cluster.ForwardRoute}, nil},
		{"nodePort source ranges", Config{Forwarding: cluster.ForwardNodePort}, []string{"198.51.100.0/24", "192.0.2.128/25", "2001:db8:c::/48"}},
		{"direct source ranges", Config{Forwarding: cluster.ForwardDirect}, []string{"198.51.100.0/24", "2001:db8:c::/48"}},
		// The NAT fast path masquerades at 40000-49999: conntrack's masquerade takes 1024-39999.
		{"nodePort NAT fast path", Config{Forwarding: cluster.ForwardNodePort, NATPath: &NATPath{Path: &natFake{},
			Interfaces: func() ([]string, error) { return nil, nil }, SNATPortMin: 40000, SNATPortMax: 49999}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, fd := testNetns(t)
			st := gwState()
			v6 := gwService("web6", "2001:db8:ff::50", false, 80, 30090, 0)
			st.Services[v6.Key] = v6
			st.EndpointSlices[v6.Key] = []*cluster.EndpointSlice{{Namespace: "gw", Name: "web6", Service: v6.Key, Family: cluster.IPv6,
				Ports:     []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 8080}},
				Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("2001:db8:244:1::11")}, NodeName: "node1", Ready: true, Serving: true}}}}
			st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
			for _, r := range c.ranges {
				for _, svc := range []*cluster.Service{v6, st.Services[cluster.ServiceKey{Namespace: "gw", Name: "web"}]} {
					svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
				}
			}
			health := Health{{gwNode1, 32001}: true}
			prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
			p := NewProxier(hclog.NewNullLogger(), c.cfg, prog)
			if _, err := p.Sync(st, health); err != nil {
				t.Fatal(err)
			}
			for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildRuleset(c.cfg, f, st, health)
				if err != nil {
					t.Fatal(err)
				}
				got, err := prog.ReadTable(f, "vipgate")
				if err != nil {
					t.Fatalf("IPv%d: reading the table back: %v", f, err)
				}
				if ok, diff := dataplane.FlatEqual(grs.Ruleset.Flatten(), got); !ok {
					t.Errorf("IPv%d: the kernel's table decodes to something else: %s", f, diff)
				}
			}
		})
	}
}
