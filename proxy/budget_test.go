package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/tablenames"
)

// kernelBytesPerElement is what one map element costs the kernel, measured on 6.18 (slab growth
// of a 50,500-element endpoint map: 101-115 bytes; maglev.MaxSize says ~95 for the gateway's); a
// rule counts cluster.RuleCost elements.
const kernelBytesPerElement = 115

// maxKernelState is issue #27's bound on what any single object may cost the kernel.
const maxKernelState = 16 << 20

// goodService is a Service of another namespace that must be programmed whatever the tenant does.
func goodService() (*cluster.Service, []*cluster.EndpointSlice) {
	svc := &cluster.Service{Key: cluster.ServiceKey{Namespace: "other", Name: "web"}, Type: cluster.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.50")},
		Ports:      []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}}
	es := &cluster.EndpointSlice{Namespace: "other", Name: "web-1", Service: svc.Key, Family: cluster.IPv4,
		Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.244.9.9")}, Ready: true, Serving: true, NodeName: "node2"}}}
	return svc, []*cluster.EndpointSlice{es}
}

// TestHostileServiceCost is issue #27's hostile corpus on a node: every Service a namespace tenant
// can write (ports x addresses x endpoints x algorithm) costs the node at most its limit, within
// 16 MiB of kernel state, or is refused as a whole with the reason, and the other Services are
// programmed. The shapes the issue reproduced: 500 ports x 1 endpoint with maglev (511,501 elements
// before), 400 externalIPs x 200 ports (80,200 entries, 18-29 s in the claims before).
func TestHostileServiceCost(t *testing.T) {
	limits := cluster.ServiceLimits{}.WithDefaults()
	cases := []struct {
		h       hostileShape
		refused bool
	}{
		{hostileShape{Name: "maglev-500p-1ep", Ports: 500, Endpoints: 1, Alg: "maglev"}, false}, // 500 x 101 slots
		{hostileShape{Name: "maglev-500p-1ep-lb", Ports: 500, LBIPs: 1, Endpoints: 1, Alg: "maglev"}, true},
		{hostileShape{Name: "maglev-100p-10ep", Ports: 100, Endpoints: 10, Alg: "maglev"}, false},
		{hostileShape{Name: "maglev-1p-1000ep-lb-local", Ports: 1, LBIPs: 1, Endpoints: 1000, Alg: "maglev", Local: true}, true},
		{hostileShape{Name: "maglev-1p-1000ep", Ports: 1, Endpoints: 1000, Alg: "maglev"}, false}, // one 65,537-slot table
		{hostileShape{Name: "ext-400x200p", Ports: 200, ExternalIPs: 400, Endpoints: 1}, true},
		{hostileShape{Name: "ext-200x200p", Ports: 200, ExternalIPs: 200, Endpoints: 1}, true},
		{hostileShape{Name: "ext-50x200p", Ports: 200, ExternalIPs: 50, Endpoints: 1}, false},
		{hostileShape{Name: "ext-50x200p-local", Ports: 200, ExternalIPs: 50, Endpoints: 2, Local: true}, false},
		{hostileShape{Name: "ext-50x200p-maglev", Ports: 200, ExternalIPs: 50, Endpoints: 1, Alg: "maglev"}, true},
		{hostileShape{Name: "ext-400x50p-source-hash", Ports: 50, ExternalIPs: 400, Endpoints: 1, Alg: "source-hash"}, true},
		{hostileShape{Name: "ranges-1000x200p", Ports: 200, LBIPs: 1, Ranges: 1000, Endpoints: 1}, true},
		{hostileShape{Name: "ranges-100x20p", Ports: 20, LBIPs: 2, Ranges: 100, Endpoints: 1}, false},
		{hostileShape{Name: "eps-1000x100p", Ports: 100, Endpoints: 1000}, true},
		{hostileShape{Name: "eps-1000x10p", Ports: 10, Endpoints: 1000}, false},
		{hostileShape{Name: "affinity-1000x100p", Ports: 100, Endpoints: 1000, Affinity: true}, true},
		{hostileShape{Name: "round-robin-1000x100p", Ports: 100, LBIPs: 1, Endpoints: 1000, Alg: "round-robin"}, true},
		{hostileShape{Name: "ports-20000", Ports: 20000, Endpoints: 1}, false},
		{hostileShape{Name: "ports-20000-lb", Ports: 20000, LBIPs: 1, Endpoints: 1}, true},
	}
	for _, c := range cases {
		t.Run(c.h.Name, func(t *testing.T) {
			svc, eps := hostileService(c.h)
			good, goodEps := goodService()
			st := &cluster.State{
				Services:       map[cluster.ServiceKey]*cluster.Service{svc.Key: svc, good.Key: good},
				EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{svc.Key: eps, good.Key: goodEps},
			}
			cfg := Config{NodeName: "node1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")},
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Families: []cluster.Family{cluster.IPv4},
				ExternalIPs: cluster.ExternalIPPolicy{AllowedCIDRs: allowAnyExternalIP}}
			cpu0 := cpuTime()
			rs, conflicts, err := BuildRuleset(cfg, cluster.IPv4, st)
			cpu := cpuTime() - cpu0 // logged, not asserted: the limits are counts
			if err != nil {
				t.Fatal(err)
			}
			if p := rs.Services[good.Key]; p == nil || len(p.Entries) != 1 || !p.Entries[0].HasEndpoints {
				t.Fatalf("the other namespace's Service is not programmed: %+v", p)
			}
			p := rs.Services[svc.Key]
			if p == nil {
				t.Fatal("the tenant's Service has no part")
			}
			elements, rules := partCost(p)
			cost := elements + len(p.Sets) + cluster.RuleCost*rules
			if cost > limits.MaxElements || cost*kernelBytesPerElement > maxKernelState {
				t.Errorf("the Service costs %d elements (%d rules, ~%d MiB of kernel state), over the limit %d", cost, rules, cost*kernelBytesPerElement>>20, limits.MaxElements)
			}
			var why []string
			for _, r := range conflicts {
				if r.Object == svc.Key.String() && strings.Contains(r.Reason, "serviceLimits.max") {
					why = append(why, r.Reason)
				} else if r.Object != svc.Key.String() {
					t.Errorf("another object is refused: %v", r)
				}
			}
			refused := len(why) > 0
			if refused != c.refused {
				t.Errorf("refused: %v %q, want refused %v (cost %d elements, %d entries)", refused, why, c.refused, cost, len(p.Entries))
			}
			if refused && (len(p.Entries) != 0 || elements != 1 || len(p.Chains) != 0) {
				t.Errorf("a refused Service keeps %d entries, %d elements, %d chains: want its cluster IP alone", len(p.Entries), elements, len(p.Chains))
			}
			if !refused && len(p.Entries) == 0 {
				t.Errorf("a Service within its limits has no entries")
			}
			t.Logf("%s: %d entries, %d elements, %d rules (~%.1f MiB), built in %v of CPU, refused %v %q", c.h.Name, len(p.Entries), elements, rules,
				float64(cost*kernelBytesPerElement)/(1<<20), cpu.Round(time.Millisecond), refused, why)
		})
	}
}

// TestServiceLimitsConfigured: configured limits replace the defaults, and the refusal names the
// configured value; a Service just within them is programmed.
func TestServiceLimitsConfigured(t *testing.T) {
	svc, eps := hostileService(hostileShape{Name: "maglev-20p", Ports: 20, Endpoints: 1, Alg: "maglev"})
	n := hostileNodeInfo()
	n.NodeName = "node9" // no local endpoint, so no hairpin elements
	// 20 entries of 101 slots, one vmap element each, and the cluster IP: 2,041 elements.
	for _, c := range []struct {
		limits cluster.ServiceLimits
		reason string
	}{
		{cluster.ServiceLimits{MaxElements: 2041}, ""},
		{cluster.ServiceLimits{MaxElements: 2040}, "more nftables elements than serviceLimits.maxElements 2040"},
		{cluster.ServiceLimits{MaxEntries: 20}, ""},
		{cluster.ServiceLimits{MaxEntries: 19}, "its 20 ports make 20 entries (ports x addresses), more than serviceLimits.maxEntries 19"},
	} {
		n.Limits = c.limits
		p := BuildService(n, svc, eps)
		var got string
		for _, r := range p.Refused {
			got += r.String()
		}
		if c.reason == "" && (got != "" || len(p.Entries) != 20 || p.NumElements() != 2041) {
			t.Errorf("limits %+v: refused %q, %d entries, %d elements; want all programmed", c.limits, got, len(p.Entries), p.NumElements())
		}
		if c.reason != "" && (!strings.Contains(got, c.reason) || !strings.HasPrefix(got, "spec: the Service is not programmed") || len(p.Entries) != 0) {
			t.Errorf("limits %+v: refused %q with %d entries; want %q", c.limits, got, len(p.Entries), c.reason)
		}
	}
}

// TestMaglevNodeTableSized: a node's maglev tables are sized to the Service port's endpoints (a
// prime >= 100 x N, the sizes doubling), and the tracer still finds every endpoint in them.
func TestMaglevNodeTableSized(t *testing.T) {
	for _, c := range []struct{ n, want int }{{1, 101}, {2, 211}, {3, 421}, {4, 421}, {5, 1021}, {10, 1021}, {11, 2039}, {700, maglev.MaxSize}} {
		if got := maglev.NodeSizeFor(c.n); got != c.want || !maglev.IsPrime(got) {
			t.Errorf("NodeSizeFor(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	for _, n := range []int{1, 2, 3} {
		svc, eps := hostileService(hostileShape{Name: fmt.Sprintf("mg%d", n), Ports: 2, Endpoints: n, Alg: "maglev"})
		ni := hostileNodeInfo()
		ni.NodeName = "node9" // no local endpoint, so no hairpin elements
		p := BuildService(ni, svc, eps)
		// The cluster IP, and per port its vmap element and its table.
		if want := 1 + 2*(1+maglev.NodeSizeFor(n)); p.NumElements() != want {
			t.Errorf("%d endpoints: %d elements, want %d", n, p.NumElements(), want)
		}
	}
}

// TestServiceLimitsSync: through the proxier's incremental sync, a Service that grows over its
// limit is withdrawn (its entries leave the kernel, none kept), reported, and comes back when it
// shrinks; the other Service is untouched.
func TestServiceLimitsSync(t *testing.T) {
	svc, eps := hostileService(hostileShape{Name: "grows", Ports: 10, ExternalIPs: 2, Endpoints: 1})
	good, goodEps := goodService()
	st := &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{svc.Key: svc, good.Key: good},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{svc.Key: eps, good.Key: goodEps},
	}
	p := NewProxier(hclog.NewNullLogger(), Config{NodeName: "node1", Families: []cluster.Family{cluster.IPv4}, Limits: cluster.ServiceLimits{MaxEntries: 100},
		ExternalIPs: cluster.ExternalIPPolicy{AllowedCIDRs: allowAnyExternalIP}}, nopProgrammer{})
	entries := func() int {
		n := 0
		for _, els := range p.Flatten(cluster.IPv4).Elements {
			for _, e := range els {
				if e.Set == tablenames.MapServiceIPs && (e.Addr.Is4() && e.Addr.As4()[0] == 198 || e.Addr == svc.ClusterIPs[0]) {
					n++
				}
			}
		}
		return n
	}
	sync := func(wantEntries int, wantRefused bool) {
		t.Helper()
		rep, err := p.Sync(st)
		if err != nil {
			t.Fatal(err)
		}
		refused := false
		for _, r := range rep.Conflicts {
			refused = refused || (r.Object == svc.Key.String() && strings.Contains(r.Reason, "serviceLimits.maxEntries 100"))
		}
		if refused != wantRefused || entries() != wantEntries {
			t.Errorf("refused %v with %d entries programmed, want %v and %d: %v", refused, entries(), wantRefused, wantEntries, rep.Conflicts)
		}
		if p.Flatten(cluster.IPv4).Elements[tablenames.MapServiceIPs] == nil {
			t.Errorf("the other Service lost its entry")
		}
	}
	sync(30, false)
	grown := *svc
	for i := range 40 {
		grown.ExternalIPs = append(grown.ExternalIPs, netip.AddrFrom4([4]byte{198, 51, 101, byte(1 + i)}))
	}
	st.Services[svc.Key] = &grown
	sync(0, true)
	st.Services[svc.Key] = svc
	sync(30, false)
}
