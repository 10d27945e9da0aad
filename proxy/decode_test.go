package proxy

import (
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// dcState is the flow-test fixture plus a synthetic bulk of Services, as one snapshot.
func dcState() *cluster.State {
	st := SyntheticState(60, 3)
	for _, s := range trFixture() {
		st.Services[s.svc.Key] = s.svc
		st.EndpointSlices[s.svc.Key] = s.slices
	}
	return st
}

// dcConfig is the flow-test node as a proxier Config.
func dcConfig() Config {
	b := trBaseConfig(cluster.IPv4, false)
	return Config{NodeName: trNode, Zone: "zone-a", NodeIPs: []netip.Addr{trNodeIP4, trNodeIP6},
		ClusterCIDRs: b.ClusterCIDRs, ServiceCIDRs: b.ServiceCIDRs, NodePortIPs: b.NodePortIPs}
}

// dcCheckRoundTrip reads both tables back and compares them with the proxier's model, then traces
// every Service entry from several sources through both and wants the same outcome.
func dcCheckRoundTrip(t *testing.T, prog *dataplane.NetlinkProgrammer, p *Proxier) {
	t.Helper()
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		want := p.Flatten(fam)
		start := time.Now()
		got, err := prog.ReadTable(fam, "vipgate")
		if err != nil {
			t.Fatalf("IPv%d: ReadTable: %v", fam, err)
		}
		t.Logf("IPv%d: read and decoded %d chains, %d sets in %v", fam, len(got.Chains), len(got.Sets), time.Since(start))
		if ok, diff := dataplane.FlatEqual(want, got); !ok {
			t.Fatalf("IPv%d: decode(program(model)) != model: %s", fam, diff)
		}
		// Rule comments come back from the rules' userdata.
		dcCompareComments(t, "userdata", want, got)
		// A table written before comments went into userdata: build.go's comments are put back.
		kt, err := prog.ReadKernelTable(fam, "vipgate")
		if err != nil {
			t.Fatalf("IPv%d: ReadKernelTable: %v", fam, err)
		}
		for _, rules := range kt.Rules {
			for _, r := range rules {
				r.UserData = nil
			}
		}
		legacy, err := dataplane.DecodeTable(kt, DecodeOptions())
		if err != nil {
			t.Fatalf("IPv%d: DecodeTable without userdata: %v", fam, err)
		}
		dcCompareComments(t, "legacy", want, legacy)
		dcCompareTraces(t, want, got)
	}
}

// dcCompareComments wants the rule comments of want in got.
func dcCompareComments(t *testing.T, what string, want, got *dataplane.Flat) {
	t.Helper()
	n := 0
	for name, c := range want.Chains {
		g := got.Chains[name]
		for i, r := range c.Rules {
			if g == nil || i >= len(g.Rules) {
				continue // FlatEqual reports it
			}
			if g.Rules[i].Comment != r.Comment {
				t.Errorf("%s: IPv%d chain %s rule %d: comment %q, want %q", what, want.Family, name, i, g.Rules[i].Comment, r.Comment)
			}
			if r.Comment != "" {
				n++
			}
		}
	}
	if n == 0 {
		t.Errorf("%s: IPv%d: no rule with a comment in the model", what, want.Family)
	}
}

// dcCompareTraces traces a packet to every entry of the table from several sources, through the
// model and through the decoded table.
func dcCompareTraces(t *testing.T, want, got *dataplane.Flat) {
	t.Helper()
	srcs := []string{outside, podHere, podAway, bad, trNodeIP4.String()}
	if want.Family == cluster.IPv6 {
		srcs = []string{"2001:db8:ff::5", "2001:db8:244:1::99", "2001:db8:244:3::5", trNodeIP6.String()}
	}
	var pkts []dataplane.Packet
	for _, e := range want.Elements[tablenames.MapServiceIPs] {
		pkts = append(pkts, dataplane.Packet{Dst: e.Addr, Proto: e.Proto, Port: e.Port}, dataplane.Packet{Dst: e.Addr, Proto: e.Proto, Port: e.Port + 1})
	}
	for _, e := range want.Elements[MapServiceNodePorts] {
		node := trNodeIP4
		if want.Family == cluster.IPv6 {
			node = trNodeIP6
		}
		pkts = append(pkts, dataplane.Packet{Dst: node, Proto: e.Proto, Port: e.Port})
	}
	n := 0
	for _, p := range pkts {
		for _, s := range srcs {
			p.Src = netip.MustParseAddr(s)
			p.FromHost = p.Src == trNodeIP4 || p.Src == trNodeIP6
			a, b := dataplane.Trace(want, trHost, p), dataplane.Trace(got, trHost, p)
			if a.String() != b.String() || a.Reason != b.Reason {
				t.Errorf("%s -> %s:%d/%s: model says %q (%s), kernel table says %q (%s)", p.Src, p.Dst, p.Port, dataplane.ProtoName(p.Proto), a, a.Reason, b, b.Reason)
			}
			if b.Outcome == dataplane.OutcomeError {
				t.Errorf("%s -> %s:%d: %s", p.Src, p.Dst, p.Port, b.Reason)
			}
			n++
		}
	}
	t.Logf("IPv%d: %d traces agree", want.Family, n)
}

// TestDecodeRoundTripInNetns programs varied Services into a fresh network namespace, reads the
// tables back over netlink and wants exactly the model again: after the first (full) sync, after
// incremental changes, and after everything is gone.
func TestDecodeRoundTripInNetns(t *testing.T) {
	_, fd := testNetns(t)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	st := dcState()
	if _, err := p.Sync(st); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	t.Run("full", func(t *testing.T) { dcCheckRoundTrip(t, prog, p) })

	// Incremental: one Service loses an endpoint, one is deleted, one gains a source range.
	st2 := *st
	st2.Services = map[cluster.ServiceKey]*cluster.Service{}
	st2.EndpointSlices = map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	for k, v := range st.Services {
		st2.Services[k] = v
		st2.EndpointSlices[k] = st.EndpointSlices[k]
	}
	shrink := cluster.ServiceKey{Namespace: "bench", Name: "svc-00003"}
	es := *st.EndpointSlices[shrink][0]
	es.Endpoints = es.Endpoints[:1]
	st2.EndpointSlices[shrink] = []*cluster.EndpointSlice{&es}
	delete(st2.Services, cluster.ServiceKey{Namespace: "ns1", Name: "np"})
	lbKey := cluster.ServiceKey{Namespace: "ns1", Name: "lb"}
	lb := *st.Services[lbKey]
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("0.0.0.0/0")}
	st2.Services[lbKey] = &lb
	rep, err := p.Sync(&st2)
	if err != nil {
		t.Fatalf("incremental sync: %v", err)
	}
	if rep.Full {
		t.Fatalf("second sync was full")
	}
	t.Run("incremental", func(t *testing.T) { dcCheckRoundTrip(t, prog, p) })

	if _, err := p.Sync(&cluster.State{}); err != nil {
		t.Fatalf("emptying: %v", err)
	}
	t.Run("empty", func(t *testing.T) { dcCheckRoundTrip(t, prog, p) })
}

// TestDecodeRejectsForeignRules: a rule vipgate did not write (here added with nft) is an error that
// names the chain and rule, not something the decoder skips.
func TestDecodeRejectsForeignRules(t *testing.T) {
	ns, fd := testNetns(t)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	if _, err := p.Sync(dcState()); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "rule", "ip", "vipgate", "services", "tcp", "dport", "22", "counter", "accept").CombinedOutput(); err != nil {
		t.Skipf("nft not usable here: %v: %s", err, out)
	}
	// nft reads vipgate's rule comments (rule userdata) as its own.
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "ip", "vipgate", tablenames.ChainMasquerading).CombinedOutput(); err != nil || !strings.Contains(string(out), `comment "hairpin"`) {
		t.Errorf("nft list chain %s: %v\n%s", tablenames.ChainMasquerading, err, out)
	}
	_, err := prog.ReadTable(cluster.IPv4, "vipgate")
	if err == nil || !strings.Contains(err.Error(), "chain services rule") {
		t.Fatalf("ReadTable with a foreign rule: err = %v, want an error naming chain services", err)
	}
	t.Logf("error: %v", err)
	// The other family's table is untouched and still decodes.
	if _, err := prog.ReadTable(cluster.IPv6, "vipgate"); err != nil {
		t.Errorf("IPv6 table: %v", err)
	}
	var notFound *dataplane.TableNotFoundError
	if _, err := prog.ReadTable(cluster.IPv4, "nosuchtable"); !errors.As(err, &notFound) || notFound.Table != "nosuchtable" || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing table: err = %v", err)
	}
}

// BenchmarkReadTable reads back and decodes the IPv4 table of 10,000 Services (3 endpoints each):
// what `vipgate explain` pays before it traces.
func BenchmarkReadTable(b *testing.B) {
	_, fd := testNetns(b)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), testConfig(), prog)
	if _, err := p.Sync(SyntheticState(10000, 3)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := prog.ReadTable(cluster.IPv4, "vipgate")
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			n := 0
			for _, els := range f.Elements {
				n += len(els)
			}
			b.ReportMetric(float64(n), "elements")
		}
	}
}

// TestParseChainName: every chain a node table holds parses, and builds back to its name.
func TestParseChainName(t *testing.T) {
	st := dcState()
	roles := map[ChainRole]int{}
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, _, err := BuildRuleset(dcConfig(), fam, st)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range rs.Flatten().ChainOrder {
			c, ok := ParseChainName(name)
			if !ok {
				t.Errorf("ParseChainName(%q): not ok", name)
				continue
			}
			roles[c.Role]++
			if got := c.String(); got != name {
				t.Errorf("ParseChainName(%q) = %+v, which builds %q", name, c, got)
			}
			if (c.Role == ChainRolePick || c.Role == ChainRoleMasqPick) != (SharedChain(name) != nil) {
				t.Errorf("%s: role %s, SharedChain %v", name, c.Role, SharedChain(name))
			}
		}
	}
	for r := ChainRoleFixed; r <= ChainRoleMasqPick; r++ {
		if roles[r] == 0 && r != ChainRoleRoundRobin && r != ChainRoleExternal {
			t.Errorf("no chain of role %s in the fixture", r)
		}
	}
	t.Logf("roles: %v", roles)
	c, ok := ParseChainName("aff-ns1/web/tcp/443-local")
	if !ok || c.Role != ChainRoleAffinity || c.Service != (cluster.ServiceKey{Namespace: "ns1", Name: "web"}) || c.Proto != dataplane.ProtoTCP || c.Port != 443 || c.Policy != "local" || c.ServicePort() != "ns1/web port 443/tcp" {
		t.Errorf("aff chain: %+v, %v", c, ok)
	}
	c, ok = ParseChainName("masq-pick-mg-endpoints-cluster-13")
	if !ok || c.Role != ChainRoleMasqPick || c.Algorithm != cluster.LBMaglev || c.Map != MapEndpointsCluster || c.Size != 13 {
		t.Errorf("masq-pick chain: %+v, %v", c, ok)
	}
	for _, bad := range []string{"", "fw-", "fw-ns/name/tcp", "fw-ns/name/tcp/0", "fw-ns/name/tcp/80/x", "aff-ns/n/tcp/80",
		"aff-ns/n/tcp/80-sideways", "pick-endpoints-0", "pick-mg-endpoints-12", "pick-nosuchmap-3", "masq-pick-x", "gateway-pick", "ext-"} {
		if c, ok := ParseChainName(bad); ok {
			t.Errorf("ParseChainName(%q) = %+v, want not ok", bad, c)
		}
	}
}
