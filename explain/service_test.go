package explain

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/speaker"
)

// speakerFixture: four nodes (node4 excluded), an L2 pool announced from rack a (node1, node2)
// with a preference for node2, a BGP pool advertised from rack a to one router.
var speakerFixture = filepath.Join("testdata", "speaker")

const node1Config = `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11"]
clusterCIDRs: ["10.244.0.0/16"]
serviceCIDRs: ["10.96.0.0/16"]
`

func explainOffline(t *testing.T, q speaker.ExplainQuery) *ServiceReport {
	t.Helper()
	rep, err := ExplainService(ServiceOptions{Query: q, Config: loadConfig(t, node1Config), Manifests: speakerFixture})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "offline" || rep.Node != "node1" || !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "assumed alive") }) {
		t.Errorf("mode %q node %q notes %q: want offline, node1, the all-alive assumption", rep.Mode, rep.Node, rep.Notes)
	}
	return rep
}

// l2Nodes is each node's mark and the start of its reason.
func l2Nodes(l2 *speaker.L2Explanation) map[string]string {
	out := map[string]string{}
	for _, n := range l2.Nodes {
		mark := "-"
		switch {
		case n.Owner:
			mark = "owner"
		case n.Candidate:
			mark = "candidate"
		}
		out[n.Node] = mark + ": " + n.Reason
	}
	return out
}

func wantReasons(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for n, w := range want {
		if !strings.HasPrefix(got[n], w) && !strings.Contains(got[n], w) {
			t.Errorf("node %s: %q, want it to say %q", n, got[n], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("nodes %v, want %d", got, len(want))
	}
}

// TestExplainServiceL2Local: an eTP=Local VIP is owned by the one rack-a node with a local
// endpoint; every other node says which of the decider's filters left it out; the trace on
// node1 DNATs to its local endpoint only, with the source kept.
func TestExplainServiceL2Local(t *testing.T) {
	rep := explainOffline(t, speaker.ExplainQuery{Service: cluster.ServiceKey{Namespace: "demo", Name: "web-local"}})
	if len(rep.VIPs) != 1 {
		t.Fatalf("VIPs %+v, want 1", rep.VIPs)
	}
	v := rep.VIPs[0]
	if v.IP != netip.MustParseAddr("192.0.2.200") || v.Pool != "metallb-system/lan" || v.NotAnnounced != "" {
		t.Errorf("VIP %s pool %q notAnnounced %q", v.IP, v.Pool, v.NotAnnounced)
	}
	if v.L2 == nil || v.L2.Owner != "node1" || !slices.Equal(v.L2.Interfaces, []string{"eth0"}) ||
		!slices.Equal(v.L2.Advertisements, []string{"metallb-system/rack-a"}) {
		t.Fatalf("L2 %+v: want owner node1 on eth0 by metallb-system/rack-a", v.L2)
	}
	wantReasons(t, l2Nodes(v.L2), map[string]string{
		"node1": "owner: owner: the only candidate",
		"node2": "-: externalTrafficPolicy Local and no endpoint",
		"node3": "-: no L2Advertisement of pool metallb-system/lan selects this node",
		"node4": "-: labelled node.kubernetes.io/exclude-from-external-load-balancers",
	})
	if v.BGP == nil || v.BGP.Reason != "pool metallb-system/lan has no BGPAdvertisement" || len(v.BGP.Nodes) != 0 {
		t.Errorf("BGP %+v: want none (no BGPAdvertisement)", v.BGP)
	}
	if len(v.Ports) != 1 {
		t.Fatalf("ports %+v, want 80/TCP", v.Ports)
	}
	p := v.Ports[0]
	want := []Candidate{{Endpoint: "10.244.1.11:8080", Probability: 1}}
	if diff := cmp.Diff(want, p.Backends); diff != "" || p.Outcome != "DNAT" || p.Service != "demo/web-local" || p.Trace.Source != DefaultClient4.String() {
		t.Errorf("port %d/%s %s from %s (-want +got backends):\n%s", p.Port, p.Protocol, p.Outcome, p.Trace.Source, diff)
	}
}

// TestExplainServicePreferred: an eTP=Cluster VIP goes to the preferred node2 although node1 is
// a candidate too; the trace spreads over both endpoints, half each, masqueraded.
func TestExplainServicePreferred(t *testing.T) {
	rep := explainOffline(t, speaker.ExplainQuery{Service: cluster.ServiceKey{Namespace: "demo", Name: "web-cluster"}})
	v := rep.VIPs[0]
	if v.L2.Owner != "node2" || !strings.Contains(v.L2.Preference, "top weight 50") {
		t.Errorf("L2 owner %q preference %q: want node2 by its weight 50", v.L2.Owner, v.L2.Preference)
	}
	wantReasons(t, l2Nodes(v.L2), map[string]string{
		"node1": "candidate: candidate, but preferredNodeSelectors weigh it 0, below the top weight 50",
		"node2": "owner: owner: the only candidate of the top preferredNodeSelectors weight 50",
		"node3": "-: no L2Advertisement",
		"node4": "-: labelled",
	})
	// node2's links are not known on node1: the named interface, and no note (it names one).
	if !slices.Equal(v.L2.Interfaces, []string{"eth0"}) || v.L2.InterfacesNote != "" {
		t.Errorf("interfaces %q note %q", v.L2.Interfaces, v.L2.InterfacesNote)
	}
	b := v.Ports[0].Backends
	if len(b) != 2 || b[0].Probability != 0.5 || b[1].Probability != 0.5 || !b[0].Masquerade {
		t.Errorf("backends %+v: want two, half each, masqueraded", b)
	}
}

// TestExplainVIPBGP: a BGP VIP by --vip: the rack-a nodes advertise it to the router with the
// advertisement's localPref, community and prepend; node3 is not selected; both ports traced,
// a third of the connections to each endpoint.
func TestExplainVIPBGP(t *testing.T) {
	rep := explainOffline(t, speaker.ExplainQuery{VIP: netip.MustParseAddr("198.51.100.201")})
	v := rep.VIPs[0]
	if v.Pool != "metallb-system/routed" || v.L2 == nil || v.L2.Owner != "" || v.L2.Reason != "pool metallb-system/routed has no L2Advertisement" {
		t.Errorf("pool %q L2 %+v", v.Pool, v.L2)
	}
	route := speaker.BGPRoute{Prefix: netip.MustParsePrefix("198.51.100.201/32"), LocalPref: 150, Communities: []string{"65000:100"}, ASPathPrepend: 2,
		Peers: []speaker.BGPPeer{{Name: "metallb-system/tor", Address: netip.MustParseAddr("192.0.2.1"), MyASN: 64512, PeerASN: 64513}}}
	got := map[string]speaker.BGPNode{}
	for _, n := range v.BGP.Nodes {
		got[n.Node] = n
	}
	for _, n := range []string{"node1", "node2"} {
		if diff := cmp.Diff([]speaker.BGPRoute{route}, got[n].Routes, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); !got[n].Advertised || diff != "" {
			t.Errorf("%s: advertised %v (-want +got routes):\n%s", n, got[n].Advertised, diff)
		}
	}
	if n := got["node3"]; n.Advertised || !slices.Contains(n.Reasons, "BGPAdvertisement to-tor does not select this node") {
		t.Errorf("node3: %+v", n)
	}
	if len(v.Ports) != 2 {
		t.Fatalf("ports %+v: want 80/TCP and 53/UDP", v.Ports)
	}
	for _, p := range v.Ports {
		if len(p.Backends) != 3 || p.Outcome != "DNAT" {
			t.Errorf("port %d/%s: %s %+v", p.Port, p.Protocol, p.Outcome, p.Backends)
		}
		for _, b := range p.Backends {
			if b.Probability < 0.333 || b.Probability > 0.334 {
				t.Errorf("port %d/%s backend %s: probability %v, want 1/3", p.Port, p.Protocol, b.Endpoint, b.Probability)
			}
		}
	}
	// The JSON names both halves.
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"mode":"offline"`, `"asPathPrepend":2`, `"localPref":150`, `"probability":0.333`, `"steps":[`, `"advertised":true`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("JSON lacks %s", want)
		}
	}
	var text strings.Builder
	rep.WriteText(&text)
	for _, want := range []string{"VIP 198.51.100.201  (pool metallb-system/routed)", "route 198.51.100.201/32 localPref 150, communities 65000:100, AS path prepend 2",
		"-> peer metallb-system/tor 192.0.2.1 AS 64513, eBGP", "33.3%"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

// TestExplainServiceErrors: an unknown Service is an error; an IP no Service uses is explained as
// not announced, with nothing to trace.
func TestExplainServiceErrors(t *testing.T) {
	if _, err := ExplainService(ServiceOptions{Query: speaker.ExplainQuery{Service: cluster.ServiceKey{Namespace: "demo", Name: "nope"}},
		Config: loadConfig(t, node1Config), Manifests: speakerFixture}); err == nil || !strings.Contains(err.Error(), "no Service demo/nope") {
		t.Errorf("unknown Service: %v", err)
	}
	rep := explainOffline(t, speaker.ExplainQuery{VIP: netip.MustParseAddr("192.0.2.203")})
	if len(rep.VIPs) != 1 || !strings.Contains(rep.VIPs[0].NotAnnounced, "no LoadBalancer Service has this IP") || len(rep.VIPs[0].Ports) != 0 {
		t.Errorf("unused IP: %+v", rep.VIPs)
	}
	for _, c := range []struct{ svc, vip string }{{"demo/web", "192.0.2.200"}, {"web", ""}, {"a/b/c", ""}, {"", "x"}, {"", ""}} {
		if _, err := ParseQuery(c.svc, c.vip); err == nil {
			t.Errorf("ParseQuery(%q, %q): no error", c.svc, c.vip)
		}
	}
}
