package proxy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/dataplane"
)

// TestSourceRangesPerFamily: loadBalancerSourceRanges are per family, as kube-proxy filters them
// (newBaseServiceInfo maps them by family): a family with ranges admits only them, a family without
// ranges of its own is open. So [0.0.0.0/0, 2001:db8::/32] (the /0 opens IPv4; cluster.ServiceFromAPI
// drops a family's ranges when it has a /0) leaves the IPv4 LoadBalancer IP open to everyone, as
// docs/configuration.md says; it used to build a drop-only firewall chain for IPv4 (no IPv4 range
// left), which denied every IPv4 client.
func TestSourceRangesPerFamily(t *testing.T) {
	const vip = "203.0.113.9"
	for _, tc := range []struct {
		name   string
		ranges []string
		open   bool // the tracer's client (198.51.100.10) reaches the Service
	}{
		{"IPv6 ranges only", []string{"2001:db8::/32"}, true},
		{"an IPv4 range without the client", []string{"192.0.2.0/24", "2001:db8::/32"}, false},
		{"an IPv4 range with the client", []string{"198.51.100.0/24", "2001:db8::/32"}, true},
		{"deny all", []string{"255.0.0.0/32"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newClaimState()
			svc := claimSvc(st, "a", time.Unix(1_700_000_000, 0), "u1", "10.96.0.1", nil, []string{vip}, "TCP/80")
			for _, r := range tc.ranges {
				svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
			p := NewProxier(hclog.NewNullLogger(), claimConfig(), nopProgrammer{})
			if _, err := p.Sync(st); err != nil {
				t.Fatal(err)
			}
			got := holder(t, p, st, vip, dataplane.ProtoTCP, 80)
			if tc.open && got != "a" {
				t.Errorf("%s:80 from 198.51.100.10 goes to %q, want a (open)", vip, got)
			}
			if !tc.open && got != "" {
				t.Errorf("%s:80 from 198.51.100.10 goes to %q, want dropped", vip, got)
			}
		})
	}
}
