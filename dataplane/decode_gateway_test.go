package dataplane

import (
	"net/netip"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// TestGatewayDecodeRoundTrip: gateway tables of every forwarding mode and SNAT setting, both
// families, programmed into a throwaway namespace and read back: the decoder proves the jhash DNAT
// and the routed dup rules against the encoder and returns exactly the model that was programmed.
func TestGatewayDecodeRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  GatewayConfig
	}{
		{"nodePort auto", GatewayConfig{Forwarding: cluster.ForwardNodePort}},
		{"direct always", GatewayConfig{Forwarding: cluster.ForwardDirect, SNAT: cluster.SNATAlways}},
		{"route", GatewayConfig{Forwarding: cluster.ForwardRoute}},
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
			health := Health{{gwNode1, 32001}: true}
			prog := &NetlinkProgrammer{NetNSFd: fd}
			p := NewGatewayProxier(hclog.NewNullLogger(), c.cfg, prog)
			if _, err := p.Sync(st, health); err != nil {
				t.Fatal(err)
			}
			for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildGatewayRuleset(c.cfg, f, st, health)
				if err != nil {
					t.Fatal(err)
				}
				got, err := prog.ReadTable(f, "vipgate")
				if err != nil {
					t.Fatalf("IPv%d: reading the table back: %v", f, err)
				}
				if ok, diff := FlatEqual(grs.Ruleset.Flatten(), got); !ok {
					t.Errorf("IPv%d: the kernel's table decodes to something else: %s", f, diff)
				}
			}
		})
	}
}
