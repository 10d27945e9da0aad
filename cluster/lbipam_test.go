package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func lbPool(name string, auto bool, addrs ...string) *metallbv1beta1.IPAddressPool {
	return &metallbv1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "metallb-system"},
		Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: addrs, AutoAssign: &auto}}
}

func lbSvc(name string, ann map[string]string, ports ...uint16) *Service {
	s := &Service{Key: ServiceKey{Namespace: "default", Name: name}, Type: TypeLoadBalancer, Annotations: ann, IPFamilies: []Family{IPv4}}
	for _, p := range ports {
		s.Ports = append(s.Ports, ServicePort{Protocol: TCP, Port: p})
	}
	return s
}

func TestParseLBPoolsRejectsAlone(t *testing.T) {
	pools, rej := ParseLBPools([]*metallbv1beta1.IPAddressPool{
		lbPool("good", true, "192.0.2.0/28", "2001:db8::/124"),
		lbPool("overlap", true, "192.0.2.8-192.0.2.20"),
		lbPool("badcidr", true, "192.0.2.0/33"),
		lbPool("backwards", true, "198.51.100.20-198.51.100.10"),
		lbPool("empty", true),
		lbPool("other", true, "198.51.100.0/24"),
	})
	if len(pools) != 2 || pools[0].Name != "good" || pools[1].Name != "other" {
		t.Fatalf("pools kept: %v", pools)
	}
	want := map[string]string{"overlap": "overlaps pool", "badcidr": "neither a CIDR", "backwards": "starts after it ends", "empty": "empty"}
	for _, r := range rej {
		name := strings.TrimPrefix(r.Object, "metallb-system/")
		if !strings.Contains(r.Reason, want[name]) {
			t.Errorf("%s rejected with %q, want it to mention %q", name, r.Reason, want[name])
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Errorf("not rejected: %v", want)
	}
}

func TestAllocator(t *testing.T) {
	pools, _ := ParseLBPools([]*metallbv1beta1.IPAddressPool{
		lbPool("small", true, "192.0.2.0/31"),
		lbPool("manual", false, "198.51.100.10-198.51.100.12"),
		lbPool("v6", true, "2001:db8::/127"),
	})
	a := NewAllocator(pools)
	ips, pool, err := a.Assign(LBRequest{Service: lbSvc("a", nil, 80)})
	if err != nil || fmt.Sprint(ips) != "[192.0.2.0]" || pool != "metallb-system/small" {
		t.Fatalf("a: %v %s %v", ips, pool, err)
	}
	// Requested IP from a non-auto pool works; outside every pool stays pending.
	if ips, _, err := a.Assign(LBRequest{Service: lbSvc("b", map[string]string{"metallb.io/loadBalancerIPs": "198.51.100.11"}, 80)}); err != nil || fmt.Sprint(ips) != "[198.51.100.11]" {
		t.Fatalf("b: %v %v", ips, err)
	}
	for name, tc := range map[string]struct {
		svc  *Service
		want string
	}{
		"outside every pool": {lbSvc("c", map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.1"}, 80), "in no address pool"},
		"used, not shared":   {lbSvc("d", map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.0"}, 443), "does not share it"},
		"missing pool":       {lbSvc("e", map[string]string{"metallb.io/address-pool": "nope"}, 80), "does not exist"},
		"bad annotation":     {lbSvc("f", map[string]string{"metallb.io/loadBalancerIPs": "not-an-ip"}, 80), "not an IP"},
		"v6 from v4 pool": {func() *Service {
			s := lbSvc("g", map[string]string{"metallb.io/address-pool": "small"}, 80)
			s.IPFamilies = []Family{IPv6}
			return s
		}(), "no IPv6 addresses"},
	} {
		ips, _, err := a.Assign(LBRequest{Service: tc.svc})
		if !errors.Is(err, ErrPending) || !strings.Contains(err.Error(), tc.want) || ips != nil {
			t.Errorf("%s: %v %v, want pending with %q", name, ips, err, tc.want)
		}
		// The reason is a value (what the controller's events say), and the text is "pending: <reason>".
		var pe *PendingError
		if !errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.want) || err.Error() != "pending: "+pe.Reason ||
			allocationFailureReason(err) != pe.Reason {
			t.Errorf("%s: %#v, want a *PendingError with %q", name, err, tc.want)
		}
		if len(a.Assigned(tc.svc.Key)) != 0 {
			t.Errorf("%s: a failed request took IPs", name)
		}
	}
	// Exhaustion: /31 has two addresses; the third Service waits.
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("h", nil, 80)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("i", nil, 80)}); !errors.Is(err, ErrPending) || !strings.Contains(err.Error(), "no free") {
		t.Fatalf("exhausted pool: %v", err)
	}
	// Sharing with the same key and different ports works; a port clash does not.
	share := map[string]string{"metallb.io/allow-shared-ip": "k", "metallb.io/loadBalancerIPs": "198.51.100.12"}
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("s1", share, 80)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("s2", share, 443)}); err != nil {
		t.Fatalf("sharing: %v", err)
	}
	if _, _, err := a.Assign(LBRequest{Service: lbSvc("s3", share, 443)}); !errors.Is(err, ErrPending) {
		t.Fatalf("port clash shared: %v", err)
	}
	// Release frees; the current IP is kept on a restart.
	a.Release(ServiceKey{Namespace: "default", Name: "a"})
	if ips, _, err := a.Assign(LBRequest{Service: lbSvc("i", nil, 80)}); err != nil || fmt.Sprint(ips) != "[192.0.2.0]" {
		t.Fatalf("after release: %v %v", ips, err)
	}
	b := NewAllocator(pools)
	if ips, _, err := b.Assign(LBRequest{Service: lbSvc("h", nil, 80), Current: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}); err != nil || fmt.Sprint(ips) != "[192.0.2.1]" {
		t.Fatalf("restart keeps the current IP: %v %v", ips, err)
	}
	// Dual-stack.
	pools2, _ := ParseLBPools([]*metallbv1beta1.IPAddressPool{lbPool("ds", true, "192.0.2.64/30", "2001:db8:1::/126")})
	c := NewAllocator(pools2)
	ds := lbSvc("ds", nil, 80)
	ds.IPFamilies, ds.IPFamilyPolicy = []Family{IPv4, IPv6}, "RequireDualStack"
	if ips, _, err := c.Assign(LBRequest{Service: ds}); err != nil || len(ips) != 2 {
		t.Fatalf("dual-stack: %v %v", ips, err)
	}
}

func BenchmarkAllocate5000(b *testing.B) {
	for i := 0; i < b.N; i++ {
		pools, _ := ParseLBPools([]*metallbv1beta1.IPAddressPool{lbPool("big", true, "10.200.0.0/18")})
		a := NewAllocator(pools)
		for j := 0; j < 5000; j++ {
			if _, _, err := a.Assign(LBRequest{Service: lbSvc(fmt.Sprintf("s%d", j), nil, 80)}); err != nil {
				b.Fatal(err)
			}
		}
	}
}
