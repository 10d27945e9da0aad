package gateway

import (
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// The pieces the gateway's namespace tests (gateway_flowcopy_test.go; gateway_netdev_test.go's
// are alike) share: what they need to run, the cluster they sync, the gateway they sync it with
// and the sync itself.

// needNetnsTools skips the test unless it runs as root (it creates network namespaces) and finds
// each of bins (ip, and python3 and nft where the test sends packets or reads the tables back).
func needNetnsTools(t *testing.T, bins ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
}

// gatewayUDPState is the cluster of a gateway namespace test: one Service (gw/udp) whose VIP vip
// has UDP port 5000 (node port 30500), no EndpointSlices, and node1 at nodeAddr, where all the
// VIP port's slots lead.
func gatewayUDPState(vip, nodeAddr string) *cluster.State {
	svc := gwService("udp", vip, false, 5000, 30500, 0)
	svc.Ports[0].Protocol = cluster.UDP
	return &cluster.State{
		Services:       map[cluster.ServiceKey]*cluster.Service{svc.Key: svc},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{},
		Nodes:          map[string]*cluster.Node{"node1": {Name: "node1", Addresses: []netip.Addr{netip.MustParseAddr(nodeAddr)}}},
	}
}

// routeGateway is a route-forwarding gateway of family f with the fast path fast (nil: none),
// programming through prog.
func routeGateway(f cluster.Family, fast *FastPath, prog dataplane.Programmer) *Proxier {
	return NewProxier(hclog.NewNullLogger(), Config{Forwarding: cluster.ForwardRoute, Families: []cluster.Family{f}, FastPath: fast}, prog)
}

// syncFastPath syncs st through p and returns the flow copies the sync made, logged. The test
// fails if the sync does, if a copy does, or if the fast path is not on (wantOn) or off as wanted;
// what names the step in the messages.
func syncFastPath(t *testing.T, what string, p *Proxier, st *cluster.State, wantOn bool) []FlowCopy {
	t.Helper()
	rep, err := p.Sync(st, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if off := len(rep.NoFastPath) > 0; off == wantOn {
		t.Fatalf("%s: fast path off %v, want %v: %v", what, off, !wantOn, rep.NoFastPath)
	}
	for _, c := range rep.FlowCopies {
		t.Logf("%s: copy %s", what, c)
		if c.Err != nil {
			t.Errorf("%s: copy %s: %v", what, c, c.Err)
		}
	}
	return rep.FlowCopies
}
