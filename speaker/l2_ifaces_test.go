package speaker

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/cluster"
)

// TestDecideL2AllInterfaces: an L2Advertisement without interfaces answers on every interface that
// is not excluded, as MetalLB does, and announces the takeover on the interfaces whose subnet holds
// the IP (or on all of them when none does); one with interfaces uses exactly those.
func TestDecideL2AllInterfaces(t *testing.T) {
	links := []Link{
		{Name: "eth0", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		{Name: "eth1", Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{Name: "bond0"},
		{Name: "cni0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}},
		{Name: "veth1"},
		{Name: "p1", Master: "cni0"},
		{Name: "wg0", NoARP: true},
	}
	type result struct{ Answer, Announce []string }
	for _, tc := range []struct {
		name   string
		ad     metallbv1beta1.L2AdvertisementSpec
		ip     string
		links  []Link
		want   result
		reason string
	}{{
		name: "on a subnet: answered everywhere eligible, announced on the subnet's interface",
		ip:   "192.0.2.200", links: links,
		want: result{[]string{"bond0", "eth0", "eth1"}, []string{"eth0"}},
	}, {
		name: "routed on-link from another prefix: answered and announced on every eligible interface",
		ip:   "203.0.113.9", links: links,
		want: result{[]string{"bond0", "eth0", "eth1"}, []string{"bond0", "eth0", "eth1"}},
	}, {
		name: "an excluded interface whose subnet holds the IP is still used (the old rule)",
		ip:   "10.244.1.200", links: links,
		want: result{[]string{"bond0", "cni0", "eth0", "eth1"}, []string{"cni0"}},
	}, {
		name: "named interfaces only, excluded ones too",
		ad:   metallbv1beta1.L2AdvertisementSpec{Interfaces: []string{"eth1", "veth1"}},
		ip:   "203.0.113.9", links: links,
		want: result{[]string{"eth1", "veth1"}, []string{"eth1", "veth1"}},
	}, {
		name:   "every interface excluded and no subnet: reported, not announced",
		ip:     "203.0.113.9",
		links:  []Link{{Name: "cni0"}, {Name: "eth3", Master: "br0"}},
		reason: "no interface to answer on: the IP is on no subnet attached to this node and every interface is excluded (name the interface in the L2Advertisement)",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newL2World().pool("lan", nil, "0.0.0.0/0").ad("lan", tc.ad).svc("web", false, []string{tc.ip}, "n1")
			owned, ds := DecideL2(L2Input{Self: "n1", Live: map[string]bool{"n1": true}, Links: tc.links, State: w.st})
			if len(ds) != 1 {
				t.Fatalf("decisions: %+v", ds)
			}
			got := result{ds[0].Interfaces, ds[0].Announce}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("interfaces (-want +got):\n%s", diff)
			}
			if ds[0].Reason != tc.reason || ds[0].Problem != (tc.reason != "") {
				t.Errorf("reason %q (problem %v), want %q", ds[0].Reason, ds[0].Problem, tc.reason)
			}
			if diff := cmp.Diff(tc.want.Answer, owned[netip.MustParseAddr(tc.ip)]); diff != "" {
				t.Errorf("owned (-want +got):\n%s", diff)
			}
			wantStatus := map[cluster.ServiceKey][]string{}
			if tc.want.Answer != nil {
				wantStatus[cluster.ServiceKey{Namespace: "default", Name: "web"}] = tc.want.Answer
			}
			if diff := cmp.Diff(wantStatus, AnnouncedInterfaces(ds)); diff != "" {
				t.Errorf("AnnouncedInterfaces (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExcludedInterface is MetalLB v0.16.1's rule for "all interfaces" (announcer.go
// updateInterfaces and the default announcedInterfacesToExclude), plus vipgate's CNI names.
func TestExcludedInterface(t *testing.T) {
	for _, c := range []struct {
		l    Link
		want string
	}{
		{Link{Name: "eth0"}, ""},
		{Link{Name: "ens3"}, ""},
		{Link{Name: "br0"}, ""},     // a bridge holding the uplink answers (its ports do not)
		{Link{Name: "bond0"}, ""},   // same for a bond
		{Link{Name: "vlan100"}, ""}, // and a VLAN
		{Link{Name: "eth1", Master: "br0"}, "enslaved to br0"},
		{Link{Name: "wg0", NoARP: true}, "NOARP"},
		{Link{Name: "lo"}, "name matches ^lo$"},
		{Link{Name: "cni0"}, "name matches ^cni.*"},
		{Link{Name: "cbr0"}, "name matches ^cbr.*"},
		{Link{Name: "docker0"}, "name matches ^docker.*"},
		{Link{Name: "veth1234abcd"}, "name matches ^veth.*"},
		{Link{Name: "cali12345"}, "name matches ^cali.*"},
		{Link{Name: "flannel.1"}, "name matches ^flannel.*"},
		{Link{Name: "kube-ipvs0"}, "name matches ^kube-ipvs.*"},
		{Link{Name: "nodelocaldns"}, "name matches ^nodelocaldns.*"},
		{Link{Name: "lxc_health"}, "name matches ^lxc.*"},
		{Link{Name: "tunl0"}, "name matches ^tunl.*"},
		{Link{Name: "dummy0"}, "name matches ^dummy.*"},
		{Link{Name: "cilium_host"}, "name matches ^cilium_.*"},
		{Link{Name: "vxlan.calico"}, "name matches ^vxlan[.-]calico$"},
		{Link{Name: "kube-bridge"}, "name matches ^kube-bridge$"},
		{Link{Name: "antrea-gw0"}, "name matches ^antrea-.*"},
	} {
		if got := ExcludedInterface(c.l); got != c.want {
			t.Errorf("ExcludedInterface(%+v) = %q, want %q", c.l, got, c.want)
		}
	}
}
