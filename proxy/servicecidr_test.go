package proxy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestSyncFollowsServiceCIDRs: the ServiceCIDR objects of the State extend the configured service
// CIDRs in the cluster-IPs check (set service-cidrs), a change rebuilds the table in one full
// transaction, and a State without them falls back to the configured base.
func TestSyncFollowsServiceCIDRs(t *testing.T) {
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	rec := &txCapture{}
	p := NewProxier(hclog.NewNullLogger(), cfg, rec)
	extra := netip.MustParsePrefix("203.0.113.64/26")
	cidrsOf := func() []netip.Prefix {
		var out []netip.Prefix
		for _, e := range p.fams[cluster.IPv4].rs.Base.Elements {
			if e.Set == SetServiceCIDRs {
				out = append(out, e.Prefix)
			}
		}
		slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		return out
	}
	sync := func(st *cluster.State) *dataplane.SyncReport {
		t.Helper()
		rep, err := p.Sync(st)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	base := SyntheticState(3, 1)
	sync(base)
	if got, want := cidrsOf(), []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}; !slices.Equal(got, want) {
		t.Fatalf("service-cidrs after the first sync = %v, want %v", got, want)
	}
	if rep := sync(base); rep.Full || len(rep.Txs) != 0 {
		t.Fatalf("an unchanged State: Full=%v, %d transactions; want nothing", rep.Full, len(rep.Txs))
	}

	withExtra := *base
	withExtra.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), extra}
	if rep := sync(&withExtra); !rep.Full {
		t.Fatalf("a new ServiceCIDR: Full=%v, want a full (atomic) rebuild", rep.Full)
	}
	if got, want := cidrsOf(), []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), extra}; !slices.Equal(got, want) {
		t.Fatalf("service-cidrs with a ServiceCIDR object = %v, want %v", got, want)
	}
	if rep := sync(&withExtra); rep.Full {
		t.Fatalf("the same ServiceCIDRs again rebuilt the table")
	}
	if rep := sync(base); !rep.Full {
		t.Fatalf("a ServiceCIDR gone: Full=%v, want a full rebuild", rep.Full)
	}
	if got, want := cidrsOf(), []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}; !slices.Equal(got, want) {
		t.Fatalf("service-cidrs after the ServiceCIDR went = %v, want %v", got, want)
	}
}
