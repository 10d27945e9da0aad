package cluster

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestServiceCIDRPrefixes(t *testing.T) {
	now := metav1.Now()
	obj := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	terminating := obj("old", "203.0.113.0/26")
	terminating.DeletionTimestamp = &now
	got, rej := ServiceCIDRPrefixes([]*networkingv1.ServiceCIDR{
		obj("kubernetes", "10.96.0.0/16", "2001:db8:96::/108"),
		obj("extra", "203.0.113.77/26"), // not masked: masked here
		obj("dup", "10.96.0.0/16"),
		terminating,                                    // kept until it is gone
		obj("bad", "10.97.0.0/33", "203.0.113.128/26"), // the bad range alone is refused
		obj("mapped", "::ffff:10.0.0.0/104"),
		nil,
	})
	want := []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("203.0.113.0/26"),
		netip.MustParsePrefix("203.0.113.64/26"), netip.MustParsePrefix("203.0.113.128/26"),
		netip.MustParsePrefix("2001:db8:96::/108"),
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("prefixes (-want +got):\n%s", d)
	}
	wantRej := []Rejection{
		{Kind: "ServiceCIDR", Object: "bad", Source: "kubernetes", Reason: `spec.cidrs: not a CIDR: "10.97.0.0/33"`},
		{Kind: "ServiceCIDR", Object: "mapped", Source: "kubernetes", Reason: `spec.cidrs: not a CIDR: "::ffff:10.0.0.0/104"`},
	}
	if d := cmp.Diff(wantRej, rej); d != "" {
		t.Errorf("rejections (-want +got):\n%s", d)
	}
	if got := ServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.1.2/16")}, &State{ServiceCIDRs: want[:2]}); !cmp.Equal(got, want[:2], cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })) {
		t.Errorf("union = %v, want %v", got, want[:2])
	}
	if got := ServiceCIDRs(nil, nil); len(got) != 0 {
		t.Errorf("union of nothing = %v", got)
	}
}
