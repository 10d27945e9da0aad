package gateway

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// The gateway enforces loadBalancerSourceRanges (issue #27: a Service's restriction must never be
// silently dropped). With forwarding direct or nodePort the gateway DNATs the VIP to a pod or to a
// NodePort, which the node does not check against the ranges (NodePorts are not subject to them, as
// in kube-proxy): the gateway must drop a client outside the ranges before DNAT, per family as the
// node does (a family without ranges of its own is open). Traced through the model (trace.go).

// gwRangesState: web with a VIP of each family, ranges ranges, a pod of each family on node1, and
// node1 with an address of each family.
func gwRangesState(ranges ...string) *cluster.State {
	st := gwState()
	web := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "web"}]
	web.LoadBalancerIPs = append(web.LoadBalancerIPs, netip.MustParseAddr("2001:db8:ff::50"))
	web.ClusterIPs = append(web.ClusterIPs, netip.MustParseAddr("fd00:96::7:1"))
	for _, r := range ranges {
		web.LoadBalancerSourceRanges = append(web.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
	}
	st.EndpointSlices[web.Key] = append(st.EndpointSlices[web.Key], &cluster.EndpointSlice{Namespace: "gw", Name: "web-6", Service: web.Key, Family: cluster.IPv6,
		Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("2001:db8:244:1::11")}, NodeName: "node1", Ready: true, Serving: true}}})
	st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
	st.Nodes["node2"].Addresses = append(st.Nodes["node2"].Addresses, netip.MustParseAddr("2001:db8:1::12"))
	return st
}

func TestGatewaySourceRanges(t *testing.T) {
	const (
		vip4, vip6 = "203.0.113.50", "2001:db8:ff::50"
		in4, out4  = "198.51.100.10", "203.0.113.99"
		in6, out6  = "2001:db8:c::10", "2001:db8:d::10"
	)
	type flow struct {
		src, dst, want string
	}
	for _, c := range []struct {
		name   string
		cfg    Config
		ranges []string
		flows  []flow
	}{
		{"direct, both families", Config{Forwarding: cluster.ForwardDirect}, []string{"198.51.100.0/24", "2001:db8:c::/48"}, []flow{
			{in4, vip4, "10.244.1.11:8080, 10.244.2.11:8080"},
			{out4, vip4, "DROP"},
			{in6, vip6, "[2001:db8:244:1::11]:8080"},
			{out6, vip6, "DROP"},
		}},
		{"nodePort, both families", Config{Forwarding: cluster.ForwardNodePort}, []string{"198.51.100.0/24", "2001:db8:c::/48"}, []flow{
			{in4, vip4, "192.0.2.11:30080, 192.0.2.12:30080 masq"},
			{out4, vip4, "DROP"},
			{in6, vip6, "[2001:db8:1::11]:30080, [2001:db8:1::12]:30080 masq"},
			{out6, vip6, "DROP"},
		}},
		{"nodePort, IPv4 ranges only: IPv6 open", Config{Forwarding: cluster.ForwardNodePort}, []string{"198.51.100.0/24"}, []flow{
			{in4, vip4, "192.0.2.11:30080, 192.0.2.12:30080 masq"},
			{out4, vip4, "DROP"},
			{out6, vip6, "[2001:db8:1::11]:30080, [2001:db8:1::12]:30080 masq"},
		}},
		{"direct, IPv6 ranges only: IPv4 open", Config{Forwarding: cluster.ForwardDirect}, []string{"2001:db8:c::/48"}, []flow{
			{out4, vip4, "10.244.1.11:8080, 10.244.2.11:8080"},
			{in6, vip6, "[2001:db8:244:1::11]:8080"},
			{out6, vip6, "DROP"},
		}},
		{"direct, several ranges", Config{Forwarding: cluster.ForwardDirect}, []string{"192.0.2.128/25", "198.51.100.8/29"}, []flow{
			{in4, vip4, "10.244.1.11:8080, 10.244.2.11:8080"},
			{"198.51.100.16", vip4, "DROP"},
			{"192.0.2.200", vip4, "10.244.1.11:8080, 10.244.2.11:8080"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := gwRangesState(c.ranges...)
			flats := map[cluster.Family]*dataplane.Flat{}
			for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
				grs, err := BuildRuleset(c.cfg, f, st, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(grs.Conflicts) > 0 {
					t.Fatalf("IPv%d: conflicts %v", f, grs.Conflicts)
				}
				flats[f] = grs.Ruleset.Flatten()
			}
			for _, fl := range c.flows {
				dst := netip.MustParseAddr(fl.dst)
				r := dataplane.Trace(flats[cluster.FamilyOf(dst)], dataplane.HostInfo{}, dataplane.Packet{Src: netip.MustParseAddr(fl.src), Dst: dst, Proto: dataplane.ProtoTCP, Port: 80})
				if got := r.String(); got != fl.want {
					t.Errorf("%s -> %s:80: got %q, want %q\n%s", fl.src, fl.dst, got, fl.want, r.Explain())
				}
			}
		})
	}
}

// TestGatewaySourceRangesNotOnNATPath: a VIP port with source ranges of its family is not given to
// the NAT fast path (which does not know them and forwards before the family's table could drop);
// one without (the other family's, or another Service's) still is. Route forwarding leaves the
// ranges to the node: its table has no firewall.
func TestGatewaySourceRangesNotOnNATPath(t *testing.T) {
	st := gwRangesState("198.51.100.0/24")
	cfg := Config{Forwarding: cluster.ForwardDirect, NATPath: &NATPath{}}
	natVIPs := func(f cluster.Family) []string {
		grs, err := BuildRuleset(cfg, f, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ports := range grs.nat {
			for _, v := range ports {
				out = append(out, v.VIP.String())
			}
		}
		return out
	}
	if got := natVIPs(cluster.IPv4); len(got) != 2 || strings.Contains(strings.Join(got, " "), "203.0.113.50") {
		t.Errorf("IPv4 NAT fast path VIP ports: %v, want the two with backends and without ranges (not 203.0.113.50)", got)
	}
	if got := natVIPs(cluster.IPv6); len(got) != 1 || got[0] != "2001:db8:ff::50" {
		t.Errorf("IPv6 NAT fast path VIP ports: %v, want 2001:db8:ff::50 (no IPv6 ranges: open)", got)
	}
	grs, err := BuildRuleset(Config{Forwarding: cluster.ForwardRoute}, cluster.IPv4, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := grs.Ruleset.Flatten(); f.Chains[tablenames.ChainFirewallCheck] != nil {
		t.Errorf("route forwarding: the gateway's table has %s; the node enforces the ranges", tablenames.ChainFirewallCheck)
	}
}

// TestGatewaySourceRangesBudget: the fw- rules count against serviceLimits.maxElements.
func TestGatewaySourceRangesBudget(t *testing.T) {
	st := gwRangesState()
	web := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "web"}]
	cfg := Config{Forwarding: cluster.ForwardDirect, MaglevSize: 7}
	grs, err := BuildRuleset(cfg, cluster.IPv4, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := len(grs.Ruleset.Services[web.Key].Elements) + len(grs.Ruleset.Services[web.Key].Backends)
	// 40 ranges: 41 rules, 82 elements' worth, and a firewall-ips element.
	for i := range 40 {
		web.LoadBalancerSourceRanges = append(web.LoadBalancerSourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 32))
	}
	cfg.Limits = cluster.ServiceLimits{MaxElements: base + 50}
	grs, err = BuildRuleset(cfg, cluster.IPv4, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if grs.Ruleset.Services[web.Key] != nil || !strings.Contains(conflictText(grs.Conflicts), "gw/web") {
		t.Errorf("a Service whose fw- rules go over maxElements is programmed: conflicts %v", grs.Conflicts)
	}
	cfg.Limits = cluster.ServiceLimits{MaxElements: base + 2*41 + 1 + 10}
	if grs, err = BuildRuleset(cfg, cluster.IPv4, st, nil); err != nil {
		t.Fatal(err)
	}
	if grs.Ruleset.Services[web.Key] == nil {
		t.Errorf("a Service within maxElements is refused: %v", grs.Conflicts)
	}
}

func conflictText(cs []cluster.Rejection) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.Object + ": " + c.Reason + "\n")
	}
	return b.String()
}

// TestGatewaySourceRangesIncremental: ranges set on a Service of a running gateway, changed and
// removed again, in a throwaway namespace: each incremental sync leaves the kernel with exactly the
// table a fresh build gives (the firewall chains and map come and go with the base).
func TestGatewaySourceRangesIncremental(t *testing.T) {
	_, fd := testNetns(t)
	cfg := Config{Forwarding: cluster.ForwardDirect, MaglevSize: 7}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), cfg, prog)
	for _, ranges := range [][]string{nil, {"198.51.100.0/24"}, {"198.51.100.0/25", "2001:db8:c::/48"}, {"2001:db8:c::/48"}, nil} {
		st := gwRangesState(ranges...)
		if _, err := p.Sync(st, nil); err != nil {
			t.Fatalf("ranges %v: %v", ranges, err)
		}
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			grs, err := BuildRuleset(cfg, f, st, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := prog.ReadTable(f, "vipgate")
			if err != nil {
				t.Fatalf("ranges %v, IPv%d: reading the table back: %v", ranges, f, err)
			}
			if ok, diff := dataplane.FlatEqual(grs.Ruleset.Flatten(), got); !ok {
				t.Errorf("ranges %v, IPv%d: the kernel's table is not the built one: %s", ranges, f, diff)
			}
		}
	}
}
