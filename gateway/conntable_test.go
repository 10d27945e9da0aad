package gateway

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

// conntableNodes lists the nodes a VIP's elements of one gateway map lead to.
func conntableNodes(f *dataplane.Flat, set string, vip string) []netip.Addr {
	var out []netip.Addr
	for _, e := range f.Elements[set] {
		if e.Addr == netip.MustParseAddr(vip) && !slices.Contains(out, e.DataAddr) {
			out = append(out, e.DataAddr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// A route gateway's connection table: every backend in gateway-conns under its id, the Maglev table
// in gateway-route-ids with the same nodes as gateway-routes.
func TestGatewayConnTableElements(t *testing.T) {
	cfg := Config{Forwarding: cluster.ForwardRoute}
	f := gwFlat(t, cfg, gwState(), Health{{gwNode1, 32001}: true})
	both := []netip.Addr{gwNode1, gwNode2}
	for _, c := range []struct {
		set, vip string
		want     []netip.Addr
	}{
		{MapGatewayConns, "203.0.113.50", both},
		{MapGatewayRouteIDs, "203.0.113.50", both},
		{MapGatewayRoutes, "203.0.113.50", both},
		{MapGatewayConns, "203.0.113.51", []netip.Addr{gwNode1}},
	} {
		if diff := cmp.Diff(c.want, conntableNodes(f, c.set, c.vip), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s of %s (-want +got):\n%s", c.set, c.vip, diff)
		}
	}
	for _, e := range f.Elements[MapGatewayConns] {
		if id, _ := dataplane.GatewayNodeID(e.DataAddr); e.Index != id {
			t.Errorf("%+v: id %d, want %d", e, e.Index, id)
		}
	}
	// The same slot leads to the same node in both Maglev maps.
	routes := map[dataplane.Element]netip.Addr{}
	for _, e := range f.Elements[MapGatewayRoutes] {
		routes[e.Key()] = e.DataAddr
	}
	for _, e := range f.Elements[MapGatewayRouteIDs] {
		k := e.Key()
		k.Set = MapGatewayRoutes
		if routes[k] != e.DataAddr {
			t.Fatalf("slot %d of %s: ids map says %s, routes map %s", e.Index, e.Addr, e.DataAddr, routes[k])
		}
	}
}

// The tracer follows the connection table: a packet is traced as a new flow's, which Maglev deals
// and gateway-flows remembers.
func TestGatewayConnTableTrace(t *testing.T) {
	st := gwState()
	udp := gwService("dns", "203.0.113.60", false, 53, 30053, 0)
	udp.Ports[0].Protocol = cluster.UDP
	st.Services[udp.Key] = udp
	st.EndpointSlices[udp.Key] = []*cluster.EndpointSlice{gwSlice(udp, gwEp("10.244.1.11", "node1"))}
	f := gwFlat(t, Config{Forwarding: cluster.ForwardRoute}, st, nil)
	for _, c := range []struct {
		proto   uint8
		dst     string
		port    uint16
		want    string
		explain string
	}{
		{dataplane.ProtoTCP, "203.0.113.50", 80, "ROUTE via 192.0.2.11:80, 192.0.2.12:80", "Maglev picks node 192.0.2.11"},
		{dataplane.ProtoUDP, "203.0.113.60", 53, "ROUTE via 192.0.2.11:53, 192.0.2.12:53", "a new flow is not in @gateway-flows"},
	} {
		r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr(c.dst), Proto: c.proto, Port: c.port})
		if got := r.String(); got != c.want {
			t.Errorf("%s %s:%d: got %q, want %q\n%s", dataplane.ProtoName(c.proto), c.dst, c.port, got, c.want, r.Explain())
		}
		if !strings.Contains(r.Explain(), c.explain) {
			t.Errorf("%s %s:%d: explanation lacks %q:\n%s", dataplane.ProtoName(c.proto), c.dst, c.port, c.explain, r.Explain())
		}
	}
	text := dataplane.RenderString(f)
	for _, want := range []string{
		// Refreshed only after the lookup of its node succeeded (the dup): a stale entry expires.
		"meta mark set ip saddr . th sport . ip daddr . th dport map @gateway-flows dup to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns update @gateway-flows { ip saddr . th sport . ip daddr . th dport : meta mark } drop",
		// A pick adds: it neither overwrites nor refreshes a stale entry.
		"meta mark set ip daddr . meta l4proto . th dport . jhash ip saddr . th sport . ip daddr . th dport mod 1021 seed 0x76697067 map @gateway-route-ids dup to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns add @gateway-flows { ip saddr . th sport . ip daddr . th dport : meta mark } drop",
		"timeout 3600s",
		"flags dynamic,timeout",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("render lacks %q", want)
		}
	}
}

// A draining node leaves the Maglev tables of every mode and stays in the connection table (route)
// or among the Part's backends (its conntrack entries are not stale) until its deadline.
func TestGatewayDrain(t *testing.T) {
	for _, fwd := range []cluster.Forwarding{cluster.ForwardRoute, cluster.ForwardNodePort, cluster.ForwardDirect} {
		t.Run(string(fwd), func(t *testing.T) {
			st := gwState()
			st.Nodes["node2"].Labels = map[string]string{DrainLabel: "true"}
			grs, err := BuildRuleset(Config{Forwarding: fwd}, cluster.IPv4, st, nil)
			if err != nil {
				t.Fatal(err)
			}
			var web Entry
			for _, e := range grs.Entries {
				if e.VIP == netip.MustParseAddr("203.0.113.50") {
					web = e
				}
			}
			node2 := slices.ContainsFunc(web.Backends, func(b netip.AddrPort) bool {
				return b.Addr() == gwNode2 || b.Addr() == netip.MustParseAddr("10.244.2.11")
			})
			if node2 || len(web.Backends) != 1 || len(web.Draining) != 1 {
				t.Fatalf("web: backends %v draining %v: want node2 (or its pod) draining only", web.Backends, web.Draining)
			}
			f := grs.Ruleset.Flatten()
			if fwd == cluster.ForwardRoute {
				if got := conntableNodes(f, MapGatewayConns, "203.0.113.50"); !slices.Contains(got, gwNode2) {
					t.Errorf("gateway-conns of web %v: the draining node must stay", got)
				}
				if got := conntableNodes(f, MapGatewayRoutes, "203.0.113.50"); slices.Contains(got, gwNode2) {
					t.Errorf("gateway-routes of web %v: the draining node takes no new flows", got)
				}
			}
		})
	}
}

// Drain deadlines: counted from the first sync that saw the node draining; past it the node is gone
// from the connection table, and in nodePort forwarding its flows' conntrack entries are stale (TCP
// too). The deadline is reported so the caller syncs again then.
func TestGatewayDrainDeadline(t *testing.T) {
	for _, fwd := range []cluster.Forwarding{cluster.ForwardRoute, cluster.ForwardNodePort} {
		t.Run(string(fwd), func(t *testing.T) {
			now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
			p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: fwd, DrainTimeout: time.Minute, Families: []cluster.Family{cluster.IPv4}}, &mtProgrammer{})
			p.now = func() time.Time { return now }
			st := gwState()
			if _, err := p.Sync(st, nil); err != nil {
				t.Fatal(err)
			}
			st2 := gwState()
			st2.Nodes["node2"].Labels = map[string]string{DrainLabel: "true"}
			rep, err := p.Sync(st2, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.NextDrainDeadline.Equal(now.Add(time.Minute)) || !slices.Equal(rep.Draining, []string{"node2"}) {
				t.Errorf("draining %v until %v, want node2 until %v", rep.Draining, rep.NextDrainDeadline, now.Add(time.Minute))
			}
			if len(rep.StaleFlows) != 0 {
				t.Errorf("stale flows while draining: %v", rep.StaleFlows)
			}
			if fwd == cluster.ForwardRoute && !slices.Contains(conntableNodes(p.Flatten(cluster.IPv4), MapGatewayConns, "203.0.113.50"), gwNode2) {
				t.Errorf("draining node2 left gateway-conns before its deadline")
			}
			now = now.Add(30 * time.Second)
			if rep, _ = p.Sync(st2, nil); !rep.NextDrainDeadline.Equal(now.Add(30 * time.Second)) {
				t.Errorf("deadline moved to %v: it counts from the first sync that saw the drain", rep.NextDrainDeadline)
			}
			now = now.Add(31 * time.Second)
			rep, err = p.Sync(st2, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.NextDrainDeadline.IsZero() || len(rep.Draining) != 0 {
				t.Errorf("after the deadline: draining %v until %v, want none", rep.Draining, rep.NextDrainDeadline)
			}
			if fwd == cluster.ForwardRoute {
				if got := conntableNodes(p.Flatten(cluster.IPv4), MapGatewayConns, "203.0.113.50"); slices.Contains(got, gwNode2) {
					t.Errorf("gateway-conns %v after the deadline: node2 must be gone", got)
				}
				return
			}
			want := conntrack.StaleFlow{Proto: dataplane.ProtoTCP, ReplySrc: gwNode2, ReplySrcPort: 30080}
			if !slices.Contains(rep.StaleFlows, want) {
				t.Errorf("stale flows after the deadline %v: want %v", rep.StaleFlows, want)
			}
		})
	}
}

// eTP=Local: a node whose local endpoints are all terminating (its healthCheckNodePort says 503)
// drains instead of dropping its connections; when every node with endpoints terminates, they keep
// taking flows (else the VIP port would have no node and its established flows would be cut).
func TestGatewayDrainTerminating(t *testing.T) {
	st := gwState()
	loc := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "loc"}]
	ep := gwEp("10.244.1.12", "node1")
	ep.Ready, ep.Terminating = false, true
	ep2 := gwEp("10.244.2.12", "node2")
	st.EndpointSlices[loc.Key] = []*cluster.EndpointSlice{gwSlice(loc, ep, ep2)}
	n1, n2 := netip.AddrPortFrom(gwNode1, 80), netip.AddrPortFrom(gwNode2, 80)
	for _, c := range []struct {
		name              string
		health            Health
		backends, drainin []netip.AddrPort
	}{
		{"node2 ready", Health{{gwNode1, 32001}: false, {gwNode2, 32001}: true}, []netip.AddrPort{n2}, []netip.AddrPort{n1}},
		{"every node terminating", Health{{gwNode1, 32001}: false}, []netip.AddrPort{n1}, nil},
	} {
		if c.name == "every node terminating" {
			st.EndpointSlices[loc.Key] = []*cluster.EndpointSlice{gwSlice(loc, ep)}
		}
		grs, err := BuildRuleset(Config{Forwarding: cluster.ForwardRoute}, cluster.IPv4, st, c.health)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range grs.Entries {
			if e.Service == loc.Key {
				found = true
				if !slices.Equal(e.Backends, c.backends) || !slices.Equal(e.Draining, c.drainin) {
					t.Errorf("%s: backends %v draining %v; want %v, %v", c.name, e.Backends, e.Draining, c.backends, c.drainin)
				}
			}
		}
		if !found {
			t.Errorf("%s: no entry of loc", c.name)
		}
	}
}

func TestGatewayNodeID(t *testing.T) {
	for _, c := range []struct {
		addr string
		id   uint32
		ok   bool
	}{
		{"192.0.2.11", 0xc000020b, true},
		{"2001:db8::1:2", 0x00010002, true},
		{"2001:db8:1::", 0, false},
	} {
		id, ok := dataplane.GatewayNodeID(netip.MustParseAddr(c.addr))
		if id != c.id || ok != c.ok {
			t.Errorf("%s: id %#x %v, want %#x %v", c.addr, id, ok, c.id, c.ok)
		}
	}
	ids := ConnIDs([]netip.Addr{netip.MustParseAddr("2001:db8:1::5"), netip.MustParseAddr("2001:db8:2::5")})
	if len(ids) != 1 {
		t.Errorf("two nodes with one id: %v, want the first only", ids)
	}
}

// Daisy chaining: after a node is added, gateway-route-prev sends the slots that moved (to node3,
// and Maglev's few extra moves between the others) to their previous node (while it is still a node of the VIP port); a SYN is traced past it.
func TestGatewayDaisyChain(t *testing.T) {
	p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{cluster.IPv4}}, &mtProgrammer{})
	p.settle = 0 // a gateway that has settled: its table changes are chained
	st := gwState()
	if _, err := p.Sync(st, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]); n != 0 {
		t.Errorf("%d previous-table elements before any change", n)
	}
	node3 := netip.MustParseAddr("192.0.2.13")
	st3 := gwState()
	st3.Nodes["node3"] = &cluster.Node{Name: "node3", Addresses: []netip.Addr{node3}}
	if _, err := p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	f := p.Flatten(cluster.IPv4)
	cur := map[dataplane.Element]netip.Addr{}
	for _, e := range f.Elements[MapGatewayRouteIDs] {
		k := e.Key()
		k.Set = ""
		cur[k] = e.DataAddr
	}
	moved := 0
	for _, e := range f.Elements[MapGatewayPrevIDs] {
		if e.Addr != netip.MustParseAddr("203.0.113.50") {
			continue
		}
		moved++
		k := e.Key()
		k.Set = ""
		if cur[k] == e.DataAddr || e.DataAddr == node3 {
			t.Errorf("slot %d: previous node %s, current %s: only slots that moved are chained", e.Index, e.DataAddr, cur[k])
		}
	}
	if moved < 1021/3-30 || moved > 1021*2/5 {
		t.Errorf("%d slots chained to their previous node, want about a third of 1021 (1.2/N)", moved)
	}
	// node1 leaves: its previous slots are no longer chained to it.
	st4 := gwState()
	st4.Nodes["node3"] = &cluster.Node{Name: "node3", Addresses: []netip.Addr{node3}}
	delete(st4.Nodes, "node1")
	if _, err := p.Sync(st4, nil); err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs] {
		if e.DataAddr == gwNode1 {
			t.Fatalf("slot %d chained to node1, which left", e.Index)
		}
	}
	r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr("203.0.113.50"), Proto: dataplane.ProtoTCP, Port: 80})
	if !strings.Contains(r.Explain(), "a new connection starts with a SYN") {
		t.Errorf("trace does not pass the daisy-chain rule:\n%s", r.Explain())
	}
}

// The previous table is chained to only for the flow timeout after the change: a flow that starts
// later is remembered by the current table and must never be chained to the old node. The sync
// report says when to sync again; that sync (an unchanged State) removes the elements.
func TestGatewayDaisyWindow(t *testing.T) {
	p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{cluster.IPv4}, FlowTimeout: time.Hour}, &mtProgrammer{})
	p.settle = 0 // a gateway that has settled: its table changes are chained
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return now }
	if _, err := p.Sync(gwState(), nil); err != nil {
		t.Fatal(err)
	}
	st3 := gwState()
	st3.Nodes["node3"] = &cluster.Node{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13")}}
	now = now.Add(time.Minute)
	changed := now
	rep, err := p.Sync(st3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := changed.Add(time.Hour); !rep.NextDaisyEnd.Equal(want) {
		t.Errorf("NextDaisyEnd %v, want %v", rep.NextDaisyEnd, want)
	}
	if len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]) == 0 {
		t.Fatal("no previous-table elements right after the change")
	}
	now = changed.Add(time.Hour - time.Second)
	if rep, err = p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	if len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]) == 0 || rep.NextDaisyEnd.IsZero() {
		t.Error("previous-table elements gone before the window ended")
	}
	now = changed.Add(time.Hour)
	if rep, err = p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]); n != 0 || !rep.NextDaisyEnd.IsZero() {
		t.Errorf("%d previous-table elements (next end %v) after the window", n, rep.NextDaisyEnd)
	}
	if len(rep.Txs) == 0 {
		t.Error("the sync at the window's end sent nothing")
	}
}

// The table history forgets VIP ports the build no longer has: a Service deleted and created again
// does not inherit its old previous table.
func TestGatewayHistoryPrune(t *testing.T) {
	p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{cluster.IPv4}}, &mtProgrammer{})
	p.settle = 0 // a gateway that has settled: its table changes are chained
	st := gwState()
	if _, err := p.Sync(st, nil); err != nil {
		t.Fatal(err)
	}
	before := len(p.hist)
	if before == 0 {
		t.Fatal("no history after a sync")
	}
	st2 := gwState()
	web := cluster.ServiceKey{Namespace: "gw", Name: "web"}
	delete(st2.Services, web)
	delete(st2.EndpointSlices, web)
	if _, err := p.Sync(st2, nil); err != nil {
		t.Fatal(err)
	}
	if len(p.hist) >= before {
		t.Errorf("history of %d VIP ports after a Service left, had %d", len(p.hist), before)
	}
	for k := range p.hist {
		found := false
		for _, f := range p.cfg.Families {
			for _, e := range p.fams[f].Entries {
				found = found || (gwTableKey{e.VIP, e.Proto, e.Port} == k)
			}
		}
		if !found {
			t.Errorf("history keeps %v, which the table no longer has", k)
		}
	}
}

func TestDaisyWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := []netip.Addr{gwNode1}
	for _, c := range []struct {
		name    string
		prev    []netip.Addr
		changed time.Time
		now     time.Time
		ok      bool
	}{
		{"no previous table", nil, t0, t0, false},
		{"never changed", prev, time.Time{}, t0, false},
		{"within", prev, t0, t0.Add(59 * time.Minute), true},
		{"at the end", prev, t0, t0.Add(time.Hour), false},
	} {
		got, end := daisyWindow(c.prev, c.changed, c.now, time.Hour)
		if (got != nil) != c.ok || (c.ok && !end.Equal(t0.Add(time.Hour))) || (!c.ok && !end.IsZero()) {
			t.Errorf("%s: %v until %v", c.name, got, end)
		}
	}
}

func TestNodeDraining(t *testing.T) {
	for _, tc := range []struct {
		name string
		node *cluster.Node
		want bool
	}{
		{"nil", nil, false},
		{"plain", &cluster.Node{Name: "n1"}, false},
		{"cordoned", &cluster.Node{Name: "n1", Unschedulable: true}, true},
		{"annotation", &cluster.Node{Name: "n1", Annotations: map[string]string{DrainLabel: ""}}, true},
		{"annotation false", &cluster.Node{Name: "n1", Annotations: map[string]string{DrainLabel: "false"}}, false},
		{"label", &cluster.Node{Name: "n1", Labels: map[string]string{DrainLabel: "true"}}, true},
	} {
		if got := NodeDraining(tc.node); got != tc.want {
			t.Errorf("%s: NodeDraining = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A table that was current for less than historySettle is a gateway's own transient (its health
// checks converging a node at a time when it starts, or when its link comes back): the other
// gateways never had it, so chaining to it would send the flows a dead peer moved here to other
// nodes than the peer did (the real-cluster test TestGatewaysInFront lost a quarter of its held
// connections that way, at a gateway's death and at its peer's restart). A change away from it
// keeps the last settled table as the previous one; settled tables are chained as before.
func TestGatewayNoDaisyToTransients(t *testing.T) {
	p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{cluster.IPv4}, FlowTimeout: time.Hour}, &mtProgrammer{})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return now }
	if _, err := p.Sync(gwState(), nil); err != nil {
		t.Fatal(err)
	}
	st3 := gwState()
	st3.Nodes["node3"] = &cluster.Node{Name: "node3", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.13")}}
	now = now.Add(historySettle / 2)
	if _, err := p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]); n != 0 {
		t.Errorf("%d previous-table elements for a change while the gateway was starting, want none", n)
	}
	// Settled: node3 leaves, and once that table has settled comes back: the slots it takes are
	// chained to their previous nodes.
	now = now.Add(historySettle)
	if _, err := p.Sync(gwState(), nil); err != nil {
		t.Fatal(err)
	}
	now = now.Add(historySettle)
	if _, err := p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs]); n == 0 {
		t.Errorf("no previous-table elements for a change after the gateway settled")
	}
	// node3 goes and comes back within historySettle (a transient without it): back to the table
	// chained to, so nothing moved and nothing is chained to the transient.
	now = now.Add(historySettle)
	if _, err := p.Sync(gwState(), nil); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if _, err := p.Sync(st3, nil); err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs] {
		t.Errorf("slot %d chained to %s after a transient", e.Index, e.DataAddr)
		break
	}
	// The gateway's own outage (its link down: every node unreachable, no backend for a while)
	// ends its VIP ports' history: the nodes come back one at a time, and the table from before
	// the outage is not chained to.
	now = now.Add(time.Hour)
	st0 := gwState()
	st0.Nodes = map[string]*cluster.Node{} // no node reachable: no backend
	if _, err := p.Sync(st0, nil); err != nil {
		t.Fatal(err)
	}
	now = now.Add(20 * time.Second)
	if _, err := p.Sync(gwState(), nil); err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Flatten(cluster.IPv4).Elements[MapGatewayPrevIDs] {
		t.Errorf("slot %d chained to %s after the gateway's outage", e.Index, e.DataAddr)
		break
	}
}
