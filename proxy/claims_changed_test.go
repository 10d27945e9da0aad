package proxy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// TestClaimsOfServicesChangedTogether: when the holder of a contested LoadBalancer IP and the next
// in line change in the same sync (the holder edited, the next one deleted), the entry must not stay
// with the deleted Service. It did: withdrawing the holder's claim handed the entry to the deleted
// one and took it off that one's lost entries, so its own withdrawal, listed afterwards, missed it.
// The ghost then took the entry again when the holder left, and the Service that really claimed
// it, with its own loadBalancerSourceRanges, was never programmed (until a full sync).
func TestClaimsOfServicesChangedTogether(t *testing.T) {
	const vip = "203.0.113.7"
	t0 := time.Unix(1_700_000_000, 0)
	st := newClaimState()
	ranges := func(svc *cluster.Service, r ...string) {
		svc.LoadBalancerSourceRanges = nil
		for _, s := range r {
			svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
	// a holds the VIP (oldest); b and c claim it too and wait, b first.
	ranges(claimSvc(st, "a", t0, "u1", "10.96.0.1", nil, []string{vip}, "TCP/80"), "198.51.100.0/24")
	claimSvc(st, "b", t0.Add(time.Hour), "u2", "10.96.0.2", nil, []string{vip}, "TCP/80")
	ranges(claimSvc(st, "c", t0.Add(2*time.Hour), "u3", "10.96.0.3", nil, []string{vip}, "TCP/80"), "192.0.2.0/24")
	cfg := claimConfig()
	p := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
	sync := func(what string) {
		t.Helper()
		if _, err := p.Sync(st); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for key := range p.fams[cluster.IPv4].claims.lost {
			if st.Services[key] == nil {
				t.Errorf("%s: the claim table still has the lost entries of %s, which is gone", what, key)
			}
		}
		for k, cs := range p.fams[cluster.IPv4].claims.others {
			for _, c := range cs {
				if st.Services[c.svc.Key] == nil {
					t.Errorf("%s: %s still claims %s:%d, and is gone", what, c.svc.Key, k.addr, k.port)
				}
			}
		}
		// Incremental or not, the table must be the one a full sync builds.
		rs, _, err := BuildRuleset(cfg, cluster.IPv4, st)
		if err != nil {
			t.Fatal(err)
		}
		if ok, why := flatEqualInUse(p.Flatten(cluster.IPv4), rs.Flatten()); !ok {
			t.Errorf("%s: the incremental table differs from a full build: %s", what, why)
		}
	}
	sync("first sync")
	if got := holder(t, p, st, vip, dataplane.ProtoTCP, 80); got != "a" {
		t.Fatalf("first sync: %s:80 goes to %q, want a", vip, got)
	}

	// a edited, b deleted, in one sync.
	st = &cluster.State{Services: cloneMap(st.Services), EndpointSlices: mapsSlices(st.EndpointSlices)}
	a := *st.Services[cluster.ServiceKey{Namespace: "claims", Name: "a"}]
	ranges(&a, "255.0.0.0/32")
	st.Services[a.Key] = &a
	delete(st.Services, cluster.ServiceKey{Namespace: "claims", Name: "b"})
	delete(st.EndpointSlices, cluster.ServiceKey{Namespace: "claims", Name: "b"})
	sync("a edited, b deleted")
	if got := holder(t, p, st, vip, dataplane.ProtoTCP, 80); got != "" {
		// 255.0.0.0/32 admits nobody: the tracer's client is dropped before DNAT.
		t.Errorf("a edited: %s:80 goes to %q, want a's drop", vip, got)
	}

	// a leaves: c, the only claimant left, gets the VIP with its own source ranges.
	st = &cluster.State{Services: cloneMap(st.Services), EndpointSlices: mapsSlices(st.EndpointSlices)}
	delete(st.Services, a.Key)
	delete(st.EndpointSlices, a.Key)
	sync("a deleted")
	flat := p.Flatten(cluster.IPv4)
	fw := dataplane.Element{Set: tablenames.MapFirewallIPs, Addr: netip.MustParseAddr(vip), Proto: dataplane.ProtoTCP, Port: 80, Verdict: dataplane.VerdictGoto,
		Chain: PerPortChain(ChainRoleFirewall, tablenames.ServicePortName(cluster.ServiceKey{Namespace: "claims", Name: "c"}, dataplane.ProtoTCP, 80), "")}
	found := false
	for _, e := range flat.Elements[tablenames.MapFirewallIPs] {
		found = found || e == fw
	}
	if !found {
		t.Errorf("a deleted: no %s element for c's source ranges: %v", tablenames.MapFirewallIPs, flat.Elements[tablenames.MapFirewallIPs])
	}
}

// flatEqualInUse is FlatEqual, less the shared pickers neither table uses: an incremental table
// keeps a picker that fell out of use (diffState.finish), a full build lists the ones in use only.
func flatEqualInUse(a, b *dataplane.Flat) (bool, string) {
	return dataplane.FlatEqual(WithoutUnusedPickers(a), WithoutUnusedPickers(b))
}
