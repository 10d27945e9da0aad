package main

import (
	"errors"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

type okProgrammer struct{}

func (okProgrammer) Apply(*dataplane.Tx) error { return nil }

type fakeVIPs []VIPStatus

func (f fakeVIPs) VIPs() []VIPStatus { return f }

// TestAdminStatusAndMetrics serves /status and /metrics on a loopback port and reads them back the
// way `vipgate status` and Prometheus do.
func TestAdminStatusAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := newAdminServer(hclog.NewNullLogger(), netip.MustParseAddrPort("127.0.0.1:0"), reg,
		NodeStatus{Node: "node1", Table: "vipgate", Source: "manifests /x", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	addr := a.Addr().String()

	// Before any sync.
	_, st, err := fetchStatus(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st.LastSync != nil || st.Node != "node1" || st.VIPs == nil {
		t.Errorf("status before a sync: %+v", st)
	}

	key := cluster.ServiceKey{Namespace: "demo", Name: "web"}
	state := &cluster.State{
		Services: map[cluster.ServiceKey]*cluster.Service{key: {Key: key, Type: cluster.TypeClusterIP,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:      []cluster.ServicePort{{Protocol: cluster.TCP, Port: 80}}}},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: {{Namespace: "demo", Name: "web-1", Service: key, Family: cluster.IPv4,
			Ports:     []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 8080}},
			Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.244.1.11")}, Ready: true, Serving: true, NodeName: "node1"}}}}},
		Rejected: []cluster.Rejection{{Kind: "Service", Object: "demo/bad", Source: "file bad.yaml document 1", Reason: "no ports"}},
	}
	p := proxy.NewProxier(hclog.NewNullLogger(), proxy.Config{NodeName: "node1"}, okProgrammer{})
	rep, err := p.Sync(state)
	if err != nil {
		t.Fatal(err)
	}
	a.recordSync(state, rep, nil)
	a.recordSync(state, rep, errors.New("netlink: EPERM"))
	a.setVIPLister(fakeVIPs{{IP: "203.0.113.10", Service: "demo/web", Mode: "l2", Announcer: "node1", Announced: true}})
	// The source's warnings (the Kubernetes caches not synced) join the speaker's.
	a.addWarnings(func() []string {
		return []string{"the Kubernetes API caches have not synced after 1m0s: still waiting"}
	})

	_, st, err = fetchStatus("http://"+addr+"/", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st.LastSync == nil || !st.LastSync.Full || st.Services != 1 || st.Endpoints != 1 || len(st.Rejected) != 1 ||
		st.LastError != "netlink: EPERM" || len(st.VIPs) != 1 || len(st.Tables) != 2 ||
		!slices.Contains(st.Warnings, "the Kubernetes API caches have not synced after 1m0s: still waiting") {
		t.Errorf("status after syncs: %+v", st)
	}
	var b strings.Builder
	writeStatus(&b, st, time.Now())
	for _, want := range []string{"node:      node1", "last sync:", "full", "LAST SYNC FAILED", "services:  1   endpoints: 1",
		"Service demo/bad [file bad.yaml document 1]: no ports", "203.0.113.10", "announced here"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, b.String())
		}
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`vipgate_sync_duration_seconds_count{kind="full"} 1`, "vipgate_sync_errors_total 1", "vipgate_services 1",
		"vipgate_endpoints 1", `vipgate_nftables_elements{family="ipv4",set="service-ips"} 1`, "vipgate_rejected_objects 1", "vipgate_last_sync_timestamp_seconds"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestAdminProxyMode: the node's admin endpoint answers kube-proxy's /proxyMode (plain text, no
// newline: what upstream e2e's ProxyMode reads with curl) and the metrics port's ping /healthz; a
// gateway's (no mode set) answers 404 to both.
func TestAdminProxyMode(t *testing.T) {
	a, err := newAdminServer(hclog.NewNullLogger(), netip.MustParseAddrPort("127.0.0.1:0"), prometheus.NewRegistry(), NodeStatus{Node: "node1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	get := func(path string) (int, string, string) {
		t.Helper()
		resp, err := http.Get("http://" + a.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	for _, p := range []string{"/proxyMode", "/healthz"} {
		if code, _, _ := get(p); code != http.StatusNotFound {
			t.Errorf("%s without a mode (a gateway): %d, want 404", p, code)
		}
	}
	a.setProxyMode(NodeProxyMode)
	for p, want := range map[string]string{"/proxyMode": "nftables", "/healthz": "ok"} {
		code, ct, body := get(p)
		if code != http.StatusOK || ct != "text/plain; charset=utf-8" || body != want {
			t.Errorf("%s: %d %q %q, want 200 text/plain %q", p, code, ct, body, want)
		}
	}
}

func TestNodeRegistryIsNotGlobal(t *testing.T) {
	if prometheus.Registerer(nodeRegistry()) == prometheus.DefaultRegisterer {
		t.Fatal("nodeRegistry is the global registry")
	}
	if a, b := nodeRegistry(), nodeRegistry(); a != b {
		t.Fatal("nodeRegistry is not one registry")
	}
}
