package proxy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

func testConfig() Config {
	return Config{
		NodeName:     "node1",
		NodeIPs:      []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8:1::11")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2001:db8:244::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("2001:db8:96::/108")},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8:1::11")},
		// externalIPs anywhere, as kube-proxy (the default allows none): the tests cover them.
		ExternalIPs: cluster.ExternalIPPolicy{AllowedCIDRs: allowAnyExternalIP},
	}
}

func TestNetlinkSyncInNetns(t *testing.T) {
	ns, fd := testNetns(t)
	p := NewProxier(hclog.NewNullLogger(), testConfig(), &dataplane.NetlinkProgrammer{NetNSFd: fd})
	st := SyntheticState(100, 3)
	rep, err := p.Sync(st)
	if err != nil {
		t.Fatalf("first sync: %v", err)
	}
	t.Logf("full sync of 100 Services: %v, %d txs", rep.Duration, len(rep.Txs))
	out := nftList(t, ns)
	for _, want := range []string{"table ip vipgate", "table ip6 vipgate", "service-ips", "pick-endpoints-3", "10.96.0.1 . tcp . 80"} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	// One endpoint removed from one Service: a small incremental transaction.
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00001"}
	st2 := *st
	st2.EndpointSlices = map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	for k, v := range st.EndpointSlices {
		st2.EndpointSlices[k] = v
	}
	es := *st.EndpointSlices[key][0]
	es.Endpoints = es.Endpoints[:2]
	st2.EndpointSlices[key] = []*cluster.EndpointSlice{&es}
	rep, err = p.Sync(&st2)
	if err != nil {
		t.Fatalf("incremental sync: %v", err)
	}
	if len(rep.Txs) != 1 || rep.Txs[0].Full {
		t.Fatalf("want one incremental tx, got %v", rep.Txs)
	}
	t.Logf("incremental: %s in %v", rep.Txs[0], rep.Duration)
	out = nftList(t, ns)
	if !strings.Contains(out, "pick-endpoints-2") {
		t.Errorf("pick-endpoints-2 missing after shrinking a Service to 2 endpoints")
	}
	// Delete everything: no Service is left in the dispatch map.
	if _, err = p.Sync(&cluster.State{}); err != nil {
		t.Fatalf("deleting all: %v", err)
	}
	out = nftList(t, ns)
	if strings.Contains(out, "10.96.0.1 . tcp . 80") {
		t.Errorf("Service elements left after deleting all Services:\n%s", out)
	}
}
