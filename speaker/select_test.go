package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// allocatorPools are the pools of TestSpeakerFindsEveryAllocatedIP, in MetalLBConfig's order
// (namespace/name): every form the allocator accepts, and pools it rejects around them.
var allocatorPools = []struct {
	name       string
	avoidBuggy bool
	addrs      []string
}{
	{"a-v4-cidr", false, []string{"192.0.2.0/29"}},
	{"b-range-avoid-buggy", true, []string{"198.51.100.253-198.51.101.2"}}, // across .255 and .0
	{"c-singles", false, []string{"203.0.113.7/32", "203.0.113.9-203.0.113.9"}},
	{"d-v6", false, []string{"2001:db8::/126", " 2001:db8:1::fffe - 2001:db8:1::1:1 "}},
	{"e-host-bits", false, []string{"192.0.2.77/30"}},
	{"f-dual", true, []string{"192.0.2.128/31", "2001:db8:2::/127"}},
	// Read in order: h is accepted, i overlaps h and is rejected, j overlaps only i and is accepted.
	{"h-first", false, []string{"10.0.0.0/30"}},
	{"i-overlaps-h", false, []string{"10.0.0.2-10.0.0.5"}},
	{"j-overlaps-i", false, []string{"10.0.0.4/30"}},
	// k overlaps itself and is rejected; l overlaps only k.
	{"k-overlaps-itself", false, []string{"10.1.0.0/30", "10.1.0.2/31"}},
	{"l-overlaps-k", false, []string{"10.1.0.0/29"}},
	// m has an entry that does not parse and is rejected; n holds m's other entry.
	{"m-bad-entry", false, []string{"garbage", "10.2.0.0/30"}},
	{"n-same-as-m", false, []string{"10.2.0.0/30"}},
	{"o-mapped", false, []string{"::ffff:192.0.2.200/126"}},
	{"p-zone", false, []string{"fe80::1%eth0-fe80::3%eth0"}},
}

func poolName(p *metallbv1beta1.IPAddressPool) string {
	if p == nil {
		return "<none>"
	}
	return p.Name
}

func buildAllocatorPools() []*metallbv1beta1.IPAddressPool {
	var out []*metallbv1beta1.IPAddressPool
	for _, p := range allocatorPools {
		out = append(out, &metallbv1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: mlbNS},
			Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: p.addrs, AvoidBuggyIPs: p.avoidBuggy}})
	}
	return out
}

// roundTrip is what a speaker reads back of an IP the controller wrote to a Service's status: the
// Service through cluster.ServiceFromAPI, as the Kubernetes source converts it.
func roundTrip(t *testing.T, ip netip.Addr) (netip.Addr, bool) {
	t.Helper()
	fam, clusterIP := corev1.IPv4Protocol, "10.96.0.10"
	if ip.Is6() {
		fam, clusterIP = corev1.IPv6Protocol, "fd00:96::10"
	}
	svc, err := cluster.ServiceFromAPI(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "lb"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			IPFamilies: []corev1.IPFamily{fam}, Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: ip.String()}}}},
	})
	if err != nil {
		t.Errorf("%s: the speaker's source rejects the Service: %v", ip, err)
		return netip.Addr{}, false
	}
	if len(svc.LoadBalancerIPs) != 1 {
		t.Errorf("%s: read back as %v", ip, svc.LoadBalancerIPs)
		return netip.Addr{}, false
	}
	return svc.LoadBalancerIPs[0], true
}

// TestSpeakerFindsEveryAllocatedIP: every IP the controller's allocator can hand out — each pool
// drained by automatic allocation, per family, and every address of its ranges requested by
// annotation — is found by the speaker's pool look-up (poolFor) in the pool the allocator named,
// after the round trip through the Service's status. So the speaker never misses an allocated IP,
// nor announces it by another pool's advertisements.
func TestSpeakerFindsEveryAllocatedIP(t *testing.T) {
	objs := buildAllocatorPools()
	pools, rejected := cluster.ParseLBPools(objs)
	var accepted, rejectedNames []string
	for _, p := range pools {
		accepted = append(accepted, p.Name)
	}
	for _, r := range rejected {
		rejectedNames = append(rejectedNames, strings.TrimPrefix(r.Object, mlbNS+"/"))
	}
	wantRejected := []string{"i-overlaps-h", "k-overlaps-itself", "m-bad-entry", "o-mapped", "p-zone"}
	if !slices.Equal(rejectedNames, wantRejected) {
		t.Fatalf("rejected %v, want %v (accepted %v)", rejectedNames, wantRejected, accepted)
	}

	check := func(how string, ip netip.Addr, pool string) {
		t.Helper()
		read, ok := roundTrip(t, ip)
		if !ok {
			return
		}
		got := "<none>"
		if p := poolFor(objs, read); p != nil {
			got = p.Namespace + "/" + p.Name
		}
		if got != pool {
			t.Errorf("%s: the allocator hands out %s from %s, the speaker finds %s in %s", how, ip, pool, read, got)
		}
	}
	svc := func(name, pool string, fam cluster.Family) *cluster.Service {
		return &cluster.Service{Key: cluster.ServiceKey{Namespace: "default", Name: name}, Type: cluster.TypeLoadBalancer,
			IPFamilies: []cluster.Family{fam}, Annotations: map[string]string{"metallb.io/address-pool": pool}}
	}

	handedOut := 0
	for _, p := range pools {
		// Drain the pool by automatic allocation, one family at a time.
		a := cluster.NewAllocator(pools)
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			for i := 0; ; i++ {
				if i > 64 {
					t.Fatalf("pool %s: more than 64 IPv%d addresses handed out", p.Name, fam)
				}
				ips, from, err := a.Assign(cluster.LBRequest{Service: svc(fmt.Sprintf("%s-v%d-%d", p.Name, fam, i), p.Name, fam)})
				if err != nil {
					break
				}
				for _, ip := range ips {
					check("auto", ip, from)
					handedOut++
				}
			}
		}
		// Request every address of the pool's ranges (avoided ones too: a request may name them).
		for _, s := range objs[slices.IndexFunc(objs, func(o *metallbv1beta1.IPAddressPool) bool { return o.Name == p.Name })].Spec.Addresses {
			r, err := cluster.ParseAddressRange(s)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			for ip := r.First(); ip.IsValid() && ip.Compare(r.Last()) <= 0; ip = ip.Next() {
				fam := cluster.FamilyOf(ip)
				s := svc("req-"+ip.String(), "", fam)
				s.Annotations = map[string]string{"metallb.io/loadBalancerIPs": ip.String()}
				ips, from, err := cluster.NewAllocator(pools).Assign(cluster.LBRequest{Service: s})
				if err != nil {
					t.Errorf("requesting %s of pool %s: %v", ip, p.Name, err)
					continue
				}
				check("requested", ips[0], from)
				handedOut++
			}
		}
	}
	t.Logf("%d IPs handed out, all found in their pool", handedOut)
	if handedOut < 80 {
		t.Errorf("only %d IPs handed out: the test checks too little", handedOut)
	}
}

// TestSpeakerFindsNoRejectedForm: an address form the allocator refuses is matched by the speaker
// for none of the IPs it might be read as; a pool the allocator rejects as a whole (an overlap, or a
// bad entry beside good ones) is found for the IPs of its good entries that no accepted pool holds,
// so that a pool made invalid by an edit keeps announcing the IPs its Services were given before.
func TestSpeakerFindsNoRejectedForm(t *testing.T) {
	for _, tc := range []struct {
		form string
		ips  []string
	}{
		{"192.0.2.20-192.0.2.10", []string{"192.0.2.10", "192.0.2.15", "192.0.2.20"}},
		{"192.0.2.0/33", []string{"192.0.2.0"}},
		{"192.0.2.0", []string{"192.0.2.0"}},
		{"192.0.2.1-2001:db8::1", []string{"192.0.2.1", "2001:db8::1"}},
		{"192.0.2.01-192.0.2.5", []string{"192.0.2.1", "192.0.2.5"}},
		{"::ffff:192.0.2.0/126", []string{"192.0.2.0", "192.0.2.3", "::ffff:192.0.2.1"}},
		{"fe80::1%eth0-fe80::3%eth0", []string{"fe80::1", "fe80::2"}},
		{"", []string{"0.0.0.0", "::"}},
	} {
		objs := []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: mlbNS},
			Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{tc.form}}}}
		if pools, rej := cluster.ParseLBPools(objs); len(pools) != 0 || len(rej) != 1 {
			t.Errorf("%q: the allocator accepts it", tc.form)
		}
		for _, s := range tc.ips {
			if p := poolFor(objs, netip.MustParseAddr(s)); p != nil {
				t.Errorf("%q: the speaker finds %s in it", tc.form, s)
			}
		}
	}

	objs := buildAllocatorPools()
	for ip, want := range map[string]string{
		"10.0.0.3": "h-first",
		"10.0.0.4": "j-overlaps-i", // not i-overlaps-h, rejected, which comes first
		"10.1.0.1": "l-overlaps-k",
		"10.2.0.1": "n-same-as-m",
	} {
		if got := poolName(poolFor(objs, netip.MustParseAddr(ip))); got != want {
			t.Errorf("%s: found in %s, want %s", ip, got, want)
		}
	}
	// Without the accepted pools, the rejected pools' good entries still count.
	var onlyRejected []*metallbv1beta1.IPAddressPool
	for _, o := range objs {
		if slices.Contains([]string{"i-overlaps-h", "k-overlaps-itself", "m-bad-entry"}, o.Name) {
			onlyRejected = append(onlyRejected, o)
		}
	}
	// Fresh objects: i no longer overlaps anything, so make it overlap itself to keep it rejected.
	onlyRejected[0] = &metallbv1beta1.IPAddressPool{ObjectMeta: onlyRejected[0].ObjectMeta,
		Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"10.0.0.2-10.0.0.5", "10.0.0.5/32"}}}
	if pools, _ := cluster.ParseLBPools(onlyRejected); len(pools) != 0 {
		t.Fatalf("accepted: %v", pools)
	}
	for ip, want := range map[string]string{"10.0.0.4": "i-overlaps-h", "10.1.0.3": "k-overlaps-itself", "10.2.0.2": "m-bad-entry"} {
		if got := poolName(poolFor(onlyRejected, netip.MustParseAddr(ip))); got != want {
			t.Errorf("%s: found in %s, want %s", ip, got, want)
		}
	}
}
