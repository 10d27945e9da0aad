package dataplane

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
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
func dcCheckRoundTrip(t *testing.T, prog *NetlinkProgrammer, p *Proxier) {
	t.Helper()
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		want := p.Flatten(fam)
		start := time.Now()
		got, err := prog.ReadTable(fam, "vipgate")
		if err != nil {
			t.Fatalf("IPv%d: ReadTable: %v", fam, err)
		}
		t.Logf("IPv%d: read and decoded %d chains, %d sets in %v", fam, len(got.Chains), len(got.Sets), time.Since(start))
		if ok, diff := FlatEqual(want, got); !ok {
			t.Fatalf("IPv%d: decode(program(model)) != model: %s", fam, diff)
		}
		dcCompareTraces(t, want, got)
	}
}

// dcCompareTraces traces a packet to every entry of the table from several sources, through the
// model and through the decoded table.
func dcCompareTraces(t *testing.T, want, got *Flat) {
	t.Helper()
	srcs := []string{outside, podHere, podAway, bad, trNodeIP4.String()}
	if want.Family == cluster.IPv6 {
		srcs = []string{"2001:db8:ff::5", "2001:db8:244:1::99", "2001:db8:244:3::5", trNodeIP6.String()}
	}
	var pkts []Packet
	for _, e := range want.Elements[MapServiceIPs] {
		pkts = append(pkts, Packet{Dst: e.Addr, Proto: e.Proto, Port: e.Port}, Packet{Dst: e.Addr, Proto: e.Proto, Port: e.Port + 1})
	}
	for _, e := range want.Elements[MapServiceNodePorts] {
		node := trNodeIP4
		if want.Family == cluster.IPv6 {
			node = trNodeIP6
		}
		pkts = append(pkts, Packet{Dst: node, Proto: e.Proto, Port: e.Port})
	}
	n := 0
	for _, p := range pkts {
		for _, s := range srcs {
			p.Src = netip.MustParseAddr(s)
			p.FromHost = p.Src == trNodeIP4 || p.Src == trNodeIP6
			a, b := Trace(want, trHost, p), Trace(got, trHost, p)
			if a.String() != b.String() || a.Reason != b.Reason {
				t.Errorf("%s -> %s:%d/%s: model says %q (%s), kernel table says %q (%s)", p.Src, p.Dst, p.Port, ProtoName(p.Proto), a, a.Reason, b, b.Reason)
			}
			if b.Outcome == OutcomeError {
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
	prog := &NetlinkProgrammer{NetNSFd: fd}
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
	prog := &NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	if _, err := p.Sync(dcState()); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "rule", "ip", "vipgate", "services", "tcp", "dport", "22", "counter", "accept").CombinedOutput(); err != nil {
		t.Skipf("nft not usable here: %v: %s", err, out)
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
	if _, err := prog.ReadTable(cluster.IPv4, "nosuchtable"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing table: err = %v", err)
	}
}

// TestDecodeRuleUnknownShape exercises the pure decoder without a kernel.
func TestDecodeRuleUnknownShape(t *testing.T) {
	kt := &KernelTable{Family: cluster.IPv4, Name: "vipgate",
		Chains: []*nftables.Chain{{Name: "services"}},
		Rules: map[string][]*nftables.Rule{"services": {{Handle: 7, Exprs: []expr.Any{
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept},
		}}}},
	}
	_, err := DecodeTable(kt)
	if err == nil || !strings.Contains(err.Error(), "chain services rule 0 (handle 7)") {
		t.Fatalf("err = %v", err)
	}
}

func TestRangePrefix(t *testing.T) {
	for _, tc := range []struct{ start, end, want string }{
		{"10.244.0.0", "10.245.0.0", "10.244.0.0/16"},
		{"2001:db8:96::", "2001:db8:96::10:0", "2001:db8:96::/108"},
		{"10.0.0.1", "10.0.0.2", "10.0.0.1/32"},
		{"255.255.255.0", "", "255.255.255.0/24"},
		{"10.0.0.0", "10.0.0.3", ""},
	} {
		var end netip.Addr
		if tc.end != "" {
			end = netip.MustParseAddr(tc.end)
		}
		p, err := rangePrefix(netip.MustParseAddr(tc.start), end)
		got := ""
		if err == nil {
			got = p.String()
		}
		if got != tc.want {
			t.Errorf("rangePrefix(%s, %s) = %q (%v), want %q", tc.start, tc.end, got, err, tc.want)
		}
	}
}

// BenchmarkReadTable reads back and decodes the IPv4 table of 10,000 Services (3 endpoints each):
// what `vipgate explain` pays before it traces.
func BenchmarkReadTable(b *testing.B) {
	_, fd := testNetns(b)
	prog := &NetlinkProgrammer{NetNSFd: fd}
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
