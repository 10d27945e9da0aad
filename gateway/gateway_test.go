package gateway

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// The gateway's flows as a specification, traced through the model (trace.go): which backends a
// client's connection to a VIP may reach, and whether it is masqueraded.

var (
	gwNode1  = netip.MustParseAddr("192.0.2.11")
	gwNode2  = netip.MustParseAddr("192.0.2.12")
	gwClient = netip.MustParseAddr("198.51.100.10")
)

func gwService(name string, vip string, local bool, port, nodePort, hc uint16) *cluster.Service {
	return &cluster.Service{
		Key:                 cluster.ServiceKey{Namespace: "gw", Name: name},
		Type:                cluster.TypeLoadBalancer,
		ClusterIPs:          []netip.Addr{netip.MustParseAddr("10.96.7.1")},
		Ports:               []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: port, NodePort: nodePort}},
		LoadBalancerIPs:     []netip.Addr{netip.MustParseAddr(vip)},
		ExternalPolicyLocal: local,
		HealthCheckNodePort: hc,
	}
}

func gwSlice(svc *cluster.Service, eps ...cluster.Endpoint) *cluster.EndpointSlice {
	return &cluster.EndpointSlice{Namespace: "gw", Name: svc.Key.Name + "-1", Service: svc.Key, Family: cluster.IPv4,
		Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}, Endpoints: eps}
}

func gwEp(addr, node string) cluster.Endpoint {
	return cluster.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ready: true, Serving: true, NodeName: node}
}

// gwState: web (eTP=Cluster, pods on both nodes), loc (eTP=Local, pod on node1 only), nonp (no
// NodePort), empty (no endpoints), and two nodes.
func gwState() *cluster.State {
	web := gwService("web", "203.0.113.50", false, 80, 30080, 0)
	loc := gwService("loc", "203.0.113.51", true, 80, 30081, 32001)
	nonp := gwService("nonp", "203.0.113.52", false, 80, 0, 0)
	empty := gwService("empty", "203.0.113.53", false, 80, 30083, 0)
	st := &cluster.State{
		Services: map[cluster.ServiceKey]*cluster.Service{web.Key: web, loc.Key: loc, nonp.Key: nonp, empty.Key: empty},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{
			web.Key:  {gwSlice(web, gwEp("10.244.1.11", "node1"), gwEp("10.244.2.11", "node2"))},
			loc.Key:  {gwSlice(loc, gwEp("10.244.1.12", "node1"))},
			nonp.Key: {gwSlice(nonp, gwEp("10.244.1.11", "node1"))},
		},
		Nodes: map[string]*cluster.Node{
			"node1": {Name: "node1", Addresses: []netip.Addr{gwNode1}},
			"node2": {Name: "node2", Addresses: []netip.Addr{gwNode2}},
		},
	}
	return st
}

func gwFlat(t *testing.T, cfg Config, st *cluster.State, h Health) *dataplane.Flat {
	t.Helper()
	grs, err := BuildRuleset(cfg, cluster.IPv4, st, h)
	if err != nil {
		t.Fatal(err)
	}
	return grs.Ruleset.Flatten()
}

type gwFlow struct {
	name string
	dst  string
	port uint16
	want string
}

func gwRun(t *testing.T, f *dataplane.Flat, flows []gwFlow) {
	t.Helper()
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: gwClient, Dst: netip.MustParseAddr(fl.dst), Proto: dataplane.ProtoTCP, Port: fl.port})
			if got := r.String(); got != fl.want {
				t.Errorf("client -> %s:%d: got %q, want %q\n%s", fl.dst, fl.port, got, fl.want, r.Explain())
			}
		})
	}
}

func TestGatewayFlowsDirect(t *testing.T) {
	for _, c := range []struct {
		snat cluster.SNATMode
		masq string
	}{{cluster.SNATAuto, ""}, {cluster.SNATNever, ""}, {cluster.SNATAlways, " masq"}} {
		t.Run(string(c.snat), func(t *testing.T) {
			f := gwFlat(t, Config{Forwarding: cluster.ForwardDirect, SNAT: c.snat}, gwState(), nil)
			gwRun(t, f, []gwFlow{
				{"eTP=Cluster to every ready pod", "203.0.113.50", 80, "10.244.1.11:8080, 10.244.2.11:8080" + c.masq},
				{"eTP=Local to every ready pod too (the gateway is the load balancer)", "203.0.113.51", 80, "10.244.1.12:8080" + c.masq},
				{"no NodePort does not matter when direct", "203.0.113.52", 80, "10.244.1.11:8080" + c.masq},
				{"no endpoints: rejected", "203.0.113.53", 80, "REJECT"},
				{"undefined port of a VIP: rejected", "203.0.113.50", 81, "REJECT"},
				{"not a VIP: untouched", "198.51.100.99", 80, "ACCEPT"},
			})
		})
	}
}

func TestGatewayFlowsNodePort(t *testing.T) {
	both := Health{{gwNode1, 32001}: true, {gwNode2, 32001}: true}
	one := Health{{gwNode1, 32001}: true}
	cfg := Config{Forwarding: cluster.ForwardNodePort}
	t.Run("auto", func(t *testing.T) {
		gwRun(t, gwFlat(t, cfg, gwState(), one), []gwFlow{
			{"eTP=Cluster: every node, masqueraded (the node masquerades anyway)", "203.0.113.50", 80, "192.0.2.11:30080, 192.0.2.12:30080 masq"},
			{"eTP=Local: only healthy nodes, client address kept", "203.0.113.51", 80, "192.0.2.11:30081"},
			{"no NodePort: rejected", "203.0.113.52", 80, "REJECT"},
			{"eTP=Cluster without endpoints still goes to the nodes (they reject)", "203.0.113.53", 80, "192.0.2.11:30083, 192.0.2.12:30083 masq"},
		})
		gwRun(t, gwFlat(t, cfg, gwState(), both), []gwFlow{
			{"eTP=Local: both healthy", "203.0.113.51", 80, "192.0.2.11:30081, 192.0.2.12:30081"},
		})
		gwRun(t, gwFlat(t, cfg, gwState(), nil), []gwFlow{
			{"eTP=Local: no probe answered yet", "203.0.113.51", 80, "REJECT"},
		})
	})
	t.Run("never", func(t *testing.T) {
		c := cfg
		c.SNAT = cluster.SNATNever
		gwRun(t, gwFlat(t, c, gwState(), one), []gwFlow{
			{"eTP=Cluster not masqueraded", "203.0.113.50", 80, "192.0.2.11:30080, 192.0.2.12:30080"},
		})
	})
	t.Run("nodes from the config when the State has none", func(t *testing.T) {
		st := gwState()
		st.Nodes = nil
		c := cfg
		c.Nodes = []cluster.Node{{Name: "n9", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.19")}}}
		gwRun(t, gwFlat(t, c, st, nil), []gwFlow{
			{"eTP=Cluster", "203.0.113.50", 80, "192.0.2.19:30080 masq"},
		})
	})
}

func TestGatewayHealthTargetsAndExpectedHealth(t *testing.T) {
	cfg := Config{Forwarding: cluster.ForwardNodePort}
	got := HealthTargets(cfg, gwState())
	want := []HealthTarget{{gwNode1, 32001}, {gwNode2, 32001}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("health targets %v, want %v", got, want)
	}
	if d := HealthTargets(Config{Forwarding: cluster.ForwardDirect}, gwState()); len(d) != 0 {
		t.Errorf("direct forwarding probes %v, want nothing", d)
	}
	h := ExpectedHealth(cfg, gwState())
	if !h[HealthTarget{gwNode1, 32001}] || h[HealthTarget{gwNode2, 32001}] {
		t.Errorf("expected health %v, want node1 only", h)
	}
}

func TestGatewayConflictAndMaglevElements(t *testing.T) {
	st := gwState()
	dup := gwService("zdup", "203.0.113.50", false, 80, 30099, 0)
	st.Services[dup.Key] = dup
	grs, err := BuildRuleset(Config{Forwarding: cluster.ForwardNodePort, MaglevSize: 251}, cluster.IPv4, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(grs.Conflicts) != 1 || grs.Conflicts[0].Object != "gw/zdup" {
		t.Errorf("conflicts %v, want gw/zdup refused", grs.Conflicts)
	}
	n := 0
	for _, e := range grs.Ruleset.Flatten().Elements[MapGatewayBackends] {
		if e.Addr == netip.MustParseAddr("203.0.113.50") {
			n++
		}
	}
	if n != 251 {
		t.Errorf("VIP 203.0.113.50:80 has %d slots, want 251", n)
	}
}

// The proxier sends only the difference: a backend leaving moves its slots (about M/N elements
// replaced), nothing else.
func TestGatewayProxierIncremental(t *testing.T) {
	rec := &gwRecorder{}
	cfg := Config{Forwarding: cluster.ForwardNodePort, Families: []cluster.Family{cluster.IPv4}}
	p := NewProxier(hclog.NewNullLogger(), cfg, rec)
	both := Health{{gwNode1, 32001}: true, {gwNode2, 32001}: true}
	rep, err := p.Sync(gwState(), both)
	if err != nil {
		t.Fatal(err)
	}
	// .52 has no NodePort and so no backends, but the gateway still owns it (and rejects its traffic).
	if !rep.Full || len(rep.VIPs) != 4 {
		t.Errorf("first sync: full=%v VIPs=%v, want full with 4 VIPs", rep.Full, rep.VIPs)
	}
	rep, err = p.Sync(gwState(), Health{{gwNode1, 32001}: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Txs) != 1 || rep.Txs[0].Full {
		t.Fatalf("node2 unhealthy: want one incremental tx, got %v", rep.Txs)
	}
	tx := rep.Txs[0]
	t.Logf("node2 leaves eTP=Local VIP: %s", tx)
	if len(tx.DelElements) != len(tx.AddElements) || len(tx.DelElements) < maglev.DefaultSize/3 || len(tx.DelElements) > maglev.DefaultSize*2/3 {
		t.Errorf("want about half of %d slots replaced, got -%d +%d", maglev.DefaultSize, len(tx.DelElements), len(tx.AddElements))
	}
	rep, err = p.Sync(gwState(), Health{{gwNode1, 32001}: true})
	if err != nil || len(rep.Txs) != 0 {
		t.Errorf("unchanged input: %v txs, err %v; want none", len(rep.Txs), err)
	}
}

type gwRecorder struct{ txs []*dataplane.Tx }

func (r *gwRecorder) Apply(tx *dataplane.Tx) error { r.txs = append(r.txs, tx); return nil }

// Rendered IPv4 gateway tables load with nft -c (in a throwaway namespace).
func TestGatewayRenderNftCheck(t *testing.T) {
	f := gwFlat(t, Config{Forwarding: cluster.ForwardNodePort}, gwState(), Health{{gwNode1, 32001}: true})
	text := dataplane.RenderString(f)
	if !strings.Contains(text, "jhash ip saddr . th sport . ip daddr . th dport mod 1021 seed 0x76697067 map @gateway-backends") {
		t.Fatalf("rendered table lacks the jhash DNAT:\n%s", text)
	}
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft binary")
	}
	path := filepath.Join(t.TempDir(), "gw.nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s", err, out)
	}
}

// Programmed through netlink into a namespace, both families; nft lists the tables back with the rule
// as vipgate renders it.
func TestGatewayNetlinkInNetns(t *testing.T) {
	ns, fd := testNetns(t)
	st := gwState()
	v6 := gwService("web6", "2001:db8:ff::50", false, 80, 30090, 0)
	st.Services[v6.Key] = v6
	st.Nodes["node1"].Addresses = append(st.Nodes["node1"].Addresses, netip.MustParseAddr("2001:db8:1::11"))
	p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardNodePort}, &dataplane.NetlinkProgrammer{NetNSFd: fd})
	rep, err := p.Sync(st, Health{{gwNode1, 32001}: true})
	if err != nil {
		t.Fatalf("first sync: %v", err)
	}
	t.Logf("full gateway sync: %v", rep.Duration)
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "vipgate").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	for _, want := range []string{
		"jhash ip saddr . th sport . ip daddr . th dport mod 1021 seed 0x76697067 map @gateway-backends",
		"203.0.113.51 . tcp . 80 : goto gateway-pick",
		"203.0.113.50 . tcp . 80 : goto gateway-masq-pick",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nft list lacks %q", want)
		}
	}
	rep, err = p.Sync(st, Health{{gwNode1, 32001}: true, {gwNode2, 32001}: true})
	if err != nil {
		t.Fatalf("incremental sync: %v", err)
	}
	t.Logf("node2 joins an eTP=Local VIP: %s in %v", rep.Txs[0], rep.Duration)
	out6, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip6", "vipgate").CombinedOutput()
	t.Logf("nft list table ip6 vipgate: err=%v, gateway-pick as nft prints it: %s", err, grepLine(string(out6), "jhash"))
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return "(none)"
}

// TestGatewayScaleInNetns measures what the Maglev table size costs in the kernel: a full sync of
// 100 VIP ports (3 backends each) and one backend change, for several sizes. Opt-in
// (VIPGATE_GATEWAY_SCALE=1): it only reports figures.
func TestGatewayScaleInNetns(t *testing.T) {
	if os.Getenv("VIPGATE_GATEWAY_SCALE") == "" {
		t.Skip("set VIPGATE_GATEWAY_SCALE=1 to measure")
	}
	for _, m := range []int{251, 1021, 4093, 16381} {
		_, fd := testNetns(t)
		st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
		for i := 0; i < 100; i++ {
			svc := gwService(fmt.Sprintf("s%03d", i), fmt.Sprintf("203.0.113.%d", i+1), false, 80, 0, 0)
			st.Services[svc.Key] = svc
			st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{gwSlice(svc,
				gwEp(fmt.Sprintf("10.244.1.%d", i+1), "node1"), gwEp(fmt.Sprintf("10.244.2.%d", i+1), "node2"), gwEp(fmt.Sprintf("10.244.3.%d", i+1), "node3"))}
		}
		p := NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardDirect, MaglevSize: m, Families: []cluster.Family{cluster.IPv4}}, &dataplane.NetlinkProgrammer{NetNSFd: fd})
		start := time.Now()
		if _, err := p.Sync(st, nil); err != nil {
			t.Fatal(err)
		}
		full := time.Since(start)
		svc := st.Services[cluster.ServiceKey{Namespace: "gw", Name: "s000"}]
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{gwSlice(svc, gwEp("10.244.1.1", "node1"), gwEp("10.244.2.1", "node2"))}
		start = time.Now()
		rep, err := p.Sync(st, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("M=%5d: 100 VIP ports = %6d elements: full sync %v; one backend leaves one VIP: %s in %v",
			m, 100*m, full.Round(time.Millisecond), rep.Txs[0], time.Since(start).Round(time.Millisecond))
	}
}
