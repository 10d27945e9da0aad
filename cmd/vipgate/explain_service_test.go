package main

import (
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/speaker"
)

// speakerFixture is explain's fixture of --service/--vip (explain/testdata/speaker).
var speakerFixture = filepath.Join("..", "..", "explain", "testdata", "speaker")

func writeNode1Config(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node1
nodeIPs: ["192.0.2.11"]
clusterCIDRs: ["10.244.0.0/16"]
serviceCIDRs: ["10.96.0.0/16"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestExplainServiceOffline: `vipgate explain --service` and `--vip` with --manifests and --config
// print both halves of each VIP: the L2 owner and every node's reason, the BGP routes and peers,
// each port's trace with the backends' shares; the flags that trace one packet are refused.
func TestExplainServiceOffline(t *testing.T) {
	cfg := writeNode1Config(t)
	for _, c := range []struct {
		name string
		ef   explainFlags
		want []string
	}{
		{"L2 eTP=Local", explainFlags{service: "demo/web-local"}, []string{
			"explain:  service demo/web-local (offline, as node node1 sees it)",
			"L2:  owner node1 (L2Advertisements metallb-system/rack-a)",
			"node2            -         externalTrafficPolicy Local and no endpoint that can serve on this node",
			"port 80/TCP of demo/web-local: tcp 203.0.113.254 -> 192.0.2.200:80",
			"-> 10.244.1.11:8080         100.0%  source kept"}},
		{"BGP by VIP, own client", explainFlags{vip: "198.51.100.201", from: "198.51.100.9"}, []string{
			"node3            -         BGPAdvertisement to-tor does not select this node",
			"-> peer metallb-system/tor 192.0.2.1 AS 64513, eBGP",
			"port 53/UDP of demo/web-bgp: udp 198.51.100.9 -> 198.51.100.201:53"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ef := c.ef
			ef.config, ef.manifests = cfg, speakerFixture
			rep, err := explainServiceFor(&ef)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.WriteText(&b)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
	for _, ef := range []explainFlags{
		{service: "demo/web-local", to: "192.0.2.200:80", config: cfg, manifests: speakerFixture},
		{service: "demo/web-local", manifests: speakerFixture},
		{service: "web-local", config: cfg, manifests: speakerFixture},
		{service: "demo/web-local", vip: "192.0.2.200", config: cfg, manifests: speakerFixture},
		{vip: "192.0.2.200", from: "not-an-address", config: cfg, manifests: speakerFixture},
	} {
		if _, err := explainServiceFor(&ef); err == nil {
			t.Errorf("%+v: no error", ef)
		}
	}
}

// fakeL2 takes the owned VIPs and announces nothing.
type fakeL2 struct{}

func (fakeL2) SetOwned(map[netip.Addr]speaker.L2Where) error { return nil }
func (fakeL2) Close() error                                  { return nil }

// fakeMembers is a membership in which the alive members are candidates in every segment.
type fakeMembers struct {
	mu    sync.Mutex
	alive map[string]bool
	segs  [][]string
}

func (m *fakeMembers) SetSegments(_ map[string][]netip.Addr, segs [][]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.segs = segs
}
func (m *fakeMembers) SetWilling(bool)           {}
func (m *fakeMembers) SetWithdrawn(_ [][]string) {}
func (m *fakeMembers) View() speaker.View {
	return speaker.View{Candidates: m.alive, Total: len(m.alive)}
}
func (m *fakeMembers) SegmentViews() map[string]speaker.View {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]speaker.View{}
	for _, s := range m.segs {
		v := speaker.View{Candidates: map[string]bool{}, Total: len(s)}
		for _, n := range s {
			if m.alive[n] {
				v.Candidates[n] = true
			}
		}
		out[speaker.SegmentKey(s)] = v
	}
	return out
}

// TestAdminExplainLive: the admin endpoint's /explain answers a running speaker's decisions, with
// its membership's view (node2, the preferred node, is dead: node1 owns the VIP) and why BGP
// sends nothing here; explain's client reads it. Hostile or malformed requests change nothing and
// get a 4xx.
func TestAdminExplainLive(t *testing.T) {
	st, err := cluster.NewFileSource(speakerFixture, hclog.NewNullLogger()).Load()
	if err != nil {
		t.Fatal(err)
	}
	mem := &fakeMembers{alive: map[string]bool{"node1": true, "node3": true}}
	ctrl := speaker.NewController(speaker.ControllerOptions{Self: "node1", L2: fakeL2{}, Members: mem, Resync: time.Hour})
	defer ctrl.Stop()
	ctrl.Update(st)

	a, err := newAdminServer(hclog.NewNullLogger(), netip.MustParseAddrPort("127.0.0.1:0"), prometheus.NewRegistry(), NodeStatus{Node: "node1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	addr := netip.MustParseAddrPort(a.Addr().String())
	base := "http://" + addr.String() + explain.ExplainPath

	// No speaker yet: 404.
	if code := get(t, base+"?vip=192.0.2.201"); code != http.StatusNotFound {
		t.Errorf("without a speaker: %d, want 404", code)
	}
	a.setVIPLister(&l2Speaker{ctrl: ctrl})

	e, err := explain.FetchSpeaker(addr, speaker.ExplainQuery{Service: cluster.ServiceKey{Namespace: "demo", Name: "web-cluster"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Live || e.Node != "node1" || len(e.VIPs) != 1 || e.VIPs[0].L2 == nil {
		t.Fatalf("explanation %+v", e)
	}
	l2 := e.VIPs[0].L2
	if l2.Owner != "node1" || !slices.Equal(l2.Interfaces, []string{"eth0"}) {
		t.Errorf("L2 owner %q interfaces %q: want node1 on eth0", l2.Owner, l2.Interfaces)
	}
	for _, n := range l2.Nodes {
		if n.Node == "node2" && (n.Candidate || !strings.Contains(n.Reason, "not a candidate in node1's view of the IP's L2 segment")) {
			t.Errorf("node2: %+v", n)
		}
	}
	eb, err := explain.FetchSpeaker(addr, speaker.ExplainQuery{VIP: netip.MustParseAddr("198.51.100.201")}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var self speaker.BGPNode
	for _, n := range eb.VIPs[0].BGP.Nodes {
		if n.Node == "node1" {
			self = n
		}
	}
	if !self.Advertised || !slices.ContainsFunc(self.Reasons, func(r string) bool { return strings.Contains(r, "BGP is not running") }) {
		t.Errorf("node1's BGP: %+v: want advertised, and that BGP does not run here", self)
	}

	// Hostile and malformed requests.
	for _, c := range []struct {
		method, query string
		code          int
	}{
		{http.MethodPost, "?vip=192.0.2.201", http.StatusMethodNotAllowed},
		{http.MethodDelete, "?service=demo/web-cluster", http.StatusMethodNotAllowed},
		{http.MethodGet, "", http.StatusBadRequest},
		{http.MethodGet, "?vip=192.0.2.999", http.StatusBadRequest},
		{http.MethodGet, "?service=demo", http.StatusBadRequest},
		{http.MethodGet, "?vip=192.0.2.201&vip=192.0.2.200", http.StatusBadRequest},
		{http.MethodGet, "?service=demo/web-cluster&vip=192.0.2.200", http.StatusBadRequest},
		{http.MethodGet, "?service=demo/" + strings.Repeat("x", 600), http.StatusBadRequest},
		{http.MethodGet, "?service=demo/nope", http.StatusNotFound},
	} {
		req, _ := http.NewRequest(c.method, base+c.query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s %s: %d, want %d", c.method, c.query, resp.StatusCode, c.code)
		}
	}
	// Nothing changed: the same owner.
	if vs := ctrl.VIPs(); !slices.ContainsFunc(vs, func(v speaker.VIPStatus) bool {
		return v.IP == netip.MustParseAddr("192.0.2.201") && v.Announcer == "node1"
	}) {
		t.Errorf("after the requests: %+v", vs)
	}
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
