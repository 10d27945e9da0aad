package proxy

import (
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy/healthcheck"
)

// The health-check servers' own tests are in proxy/healthcheck. This one joins them to a real
// Proxier sync, so it lives here.

var hcLoopback = netip.MustParseAddr("127.0.0.1")

// hcFreePort returns a TCP port from the NodePort range that is free on 127.0.0.1 right now (below
// the ephemeral range, so that no outgoing connection takes it meanwhile).
func hcFreePort(t *testing.T) uint16 {
	t.Helper()
	for range 200 {
		port := uint16(30000 + rand.IntN(2768))
		ln, err := net.Listen("tcp", netip.AddrPortFrom(hcLoopback, port).String())
		if err != nil {
			continue // in use: try another
		}
		if err := ln.Close(); err != nil {
			t.Fatalf("closing probe listener: %v", err)
		}
		return port
	}
	t.Fatalf("no free port in 30000-32767 after 200 tries")
	return 0
}

// hcProbe GETs a health check and returns its status and the localEndpoints of its body.
func hcProbe(t *testing.T, addr netip.Addr, port uint16) (status, localEndpoints int) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + netip.AddrPortFrom(addr, port).String() + "/")
	if err != nil {
		t.Fatalf("probing health check: %v", err)
	}
	defer resp.Body.Close()
	var doc struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatalf("decoding health check body: %v", err)
	}
	return resp.StatusCode, doc.LocalEndpoints
}

// TestHealthCheckOnlyTerminatingLocalEndpoints is the upstream e2e "should fail health check node port
// if there are only terminating endpoints": an externalTrafficPolicy=Local Service whose endpoints on
// this node all terminate answers 503 with localEndpoints 0 on its healthCheckNodePort (kube-proxy
// counts local READY endpoints), while the traffic that still arrives keeps falling back to the
// serving-terminating endpoint. The count comes from a real Proxier sync, the answer from the real
// HTTP server.
func TestHealthCheckOnlyTerminatingLocalEndpoints(t *testing.T) {
	logger := hclog.NewNullLogger()
	hc := healthcheck.NewServiceHealthServer(logger, []netip.Addr{hcLoopback}, nil)
	t.Cleanup(func() { _ = hc.Close() })
	key := cluster.ServiceKey{Namespace: "ns1", Name: "lb-local"}
	hcPort := hcFreePort(t)
	svc := &cluster.Service{Key: key, Type: cluster.TypeLoadBalancer, ClusterIPs: trAddrs("10.96.0.40"),
		Ports:           []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: 30040}},
		LoadBalancerIPs: trAddrs("198.51.100.40"), ExternalPolicyLocal: true, HealthCheckNodePort: hcPort}
	ready := trEp("10.244.1.40", trNode)
	servingTerm := cluster.Endpoint{Addresses: trAddrs("10.244.1.41"), Serving: true, Terminating: true, NodeName: trNode}
	notServingTerm := cluster.Endpoint{Addresses: trAddrs("10.244.1.42"), Terminating: true, NodeName: trNode}
	remote := trEp("10.244.2.40", "node2")

	prog := &txCapture{}
	p := NewProxier(logger, Config{NodeName: trNode, Zone: "zone-a", NodeIPs: []netip.Addr{trNodeIP4},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Families: []cluster.Family{cluster.IPv4}}, prog)
	steps := []struct {
		name   string
		eps    []cluster.Endpoint
		count  int
		status int
		// fromOutside is where traffic to the LoadBalancer IP from beyond the node goes.
		fromOutside string
	}{
		{"a local ready endpoint", []cluster.Endpoint{ready, servingTerm, remote}, 1, 200, "10.244.1.40:8080"},
		{"only terminating local endpoints, one serving", []cluster.Endpoint{servingTerm, notServingTerm, remote}, 0, 503, "10.244.1.41:8080"},
		{"only a terminating, not serving, local endpoint", []cluster.Endpoint{notServingTerm, remote}, 0, 503, "DROP"},
		{"ready again", []cluster.Endpoint{ready, remote}, 1, 200, "10.244.1.40:8080"},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{key: svc},
				EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: {trSlice(key, cluster.IPv4, trHTTP, step.eps...)}}}
			rep, err := p.Sync(st)
			if err != nil {
				t.Fatalf("Sync: %v", err)
			}
			if got := rep.LocalEndpoints[key]; got != step.count {
				t.Errorf("LocalEndpoints = %d, want %d", got, step.count)
			}
			if err := hc.SyncServices(rep.HealthChecks); err != nil {
				t.Fatalf("SyncServices: %v", err)
			}
			hc.SyncEndpoints(rep.LocalEndpoints)
			if status, count := hcProbe(t, hcLoopback, hcPort); status != step.status || count != step.count {
				t.Errorf("health check answered %d with localEndpoints %d, want %d with %d", status, count, step.status, step.count)
			}
			// The traffic semantics are not the health check's: terminating fallback still serves.
			res := dataplane.Trace(p.Flatten(cluster.IPv4), trHost, dataplane.Packet{Src: netip.MustParseAddr(outside), Dst: netip.MustParseAddr("198.51.100.40"), Proto: dataplane.ProtoTCP, Port: 80})
			if diff := cmp.Diff(step.fromOutside, res.String()); diff != "" {
				t.Errorf("LoadBalancer IP from outside (-want +got):\n%s\n%s", diff, res.Explain())
			}
		})
	}
}
