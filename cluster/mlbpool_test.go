package cluster

import (
	"net/netip"
	"strings"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestParseAddressRange: the forms of spec.addresses MetalLB accepts, and why the others are refused
// (in, first and last address held; or the refusal).
func TestParseAddressRange(t *testing.T) {
	for _, tc := range []struct {
		in, first, last string
		wantErr         string
	}{
		{in: "192.0.2.0/30", first: "192.0.2.0", last: "192.0.2.3"},
		{in: "192.0.2.7/30", first: "192.0.2.4", last: "192.0.2.7"}, // host bits ignored
		{in: " 192.0.2.9/32 ", first: "192.0.2.9", last: "192.0.2.9"},
		{in: "192.0.2.10-192.0.2.20", first: "192.0.2.10", last: "192.0.2.20"},
		{in: "192.0.2.10 - 192.0.2.10", first: "192.0.2.10", last: "192.0.2.10"},
		{in: "2001:db8::/126", first: "2001:db8::", last: "2001:db8::3"},
		{in: "2001:db8::fffe-2001:db8::1:1", first: "2001:db8::fffe", last: "2001:db8::1:1"},
		{in: "0.0.0.0/0", first: "0.0.0.0", last: "255.255.255.255"},
		{in: "192.0.2.20-192.0.2.10", wantErr: "starts after it ends"},
		{in: "192.0.2.0/33", wantErr: "neither a CIDR nor a range"},
		{in: "192.0.2.0", wantErr: "neither a CIDR nor a range"},
		{in: "", wantErr: "neither a CIDR nor a range"},
		{in: "192.0.2.1-", wantErr: "not a valid address range"},
		{in: "192.0.2.1-2001:db8::1", wantErr: "mixes IPv4 and IPv6"},
		{in: "192.0.2.01-192.0.2.5", wantErr: "not a valid address range"},
		{in: "fe80::1%eth0-fe80::3%eth0", wantErr: "zones are not allowed"},
		{in: "fe80::%eth0/64", wantErr: "neither a CIDR nor a range"},
		{in: "::ffff:192.0.2.0/120", wantErr: "IPv4-mapped"},
		{in: "::ffff:192.0.2.1-::ffff:192.0.2.5", wantErr: "IPv4-mapped"},
		{in: "::fffe:ffff:ffff-::1:0:0:0", wantErr: "IPv4-mapped"}, // spans ::ffff:0:0/96
		{in: "::/64", wantErr: "IPv4-mapped"},
	} {
		r, err := ParseAddressRange(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err %v, want one mentioning %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		first, last := netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)
		if r.First() != first || r.Last() != last {
			t.Errorf("%q: %v-%v, want %v-%v", tc.in, r.First(), r.Last(), first, last)
		}
		if !r.Contains(first) || !r.Contains(last) || (first.Prev().IsValid() && r.Contains(first.Prev())) || (last.Next().IsValid() && r.Contains(last.Next())) {
			t.Errorf("%q: Contains wrong at the edges", tc.in)
		}
	}
	// An IPv4 range never holds an IPv6 address and the other way round.
	r, _ := ParseAddressRange("0.0.0.0/0")
	if r.Contains(netip.MustParseAddr("::1")) || r.Contains(netip.MustParseAddr("::ffff:192.0.2.1")) {
		t.Error("0.0.0.0/0 holds an IPv6 address")
	}
}

// TestPoolIndex: the accepted pools first (they never overlap), then the rejected pools' parsable
// entries in order; an index describes exactly the pool objects and addresses it was built from.
func TestPoolIndex(t *testing.T) {
	pools := []*metallbv1beta1.IPAddressPool{
		lbPool("a", true, "10.0.0.0/30"),
		lbPool("b-overlaps-a", true, "10.0.0.2-10.0.0.5", "10.9.0.0/30"),
		lbPool("c-overlaps-b", true, "10.0.0.4/30"),
		lbPool("d-bad-entry", true, "garbage", "10.8.0.0/30"),
	}
	x := NewPoolIndex(pools)
	for ip, want := range map[string]string{
		"10.0.0.2": "a", "10.0.0.4": "c-overlaps-b", "10.0.0.5": "c-overlaps-b", "10.0.0.7": "c-overlaps-b",
		"10.9.0.1": "b-overlaps-a", "10.8.0.3": "d-bad-entry", "10.0.0.8": "",
	} {
		got := ""
		if p := x.PoolOf(netip.MustParseAddr(ip)); p != nil {
			got = p.Name
		}
		if got != want {
			t.Errorf("%s: pool %q, want %q", ip, got, want)
		}
	}
}

func TestMatchesAny(t *testing.T) {
	set := map[string]string{"tier": "web"}
	web := metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}
	db := metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}
	bad := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Bogus"}}}
	for _, tc := range []struct {
		name string
		sels []metav1.LabelSelector
		want bool
	}{
		{"none selects everything", nil, true},
		{"one that matches", []metav1.LabelSelector{web}, true},
		{"ORed", []metav1.LabelSelector{db, web}, true},
		{"none matches", []metav1.LabelSelector{db}, false},
		{"one that does not parse matches nothing", []metav1.LabelSelector{bad}, false},
		{"an empty selector matches everything", []metav1.LabelSelector{{}}, true},
	} {
		if got := MatchesAny(tc.sels, set); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
