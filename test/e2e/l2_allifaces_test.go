package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestL2AllInterfaces: MetalLB's meaning of an L2Advertisement's interfaces, on the wire. One node
// runs `vipgate node` from a manifest directory; a raw ARP scanner asks from the LAN (the LAN
// client, on the node's eth0 segment) and from a pod (on the node's pod bridge cbr0).
//
//   - VIP 203.0.113.5 is routed on-link from another prefix (no node address is in 203.0.113.0/24;
//     the LAN client has `203.0.113.0/28 dev eth0`), with an advertisement naming no interface:
//     answered on the LAN with the node's eth0 MAC, and reachable by TCP — as under MetalLB, where
//     vipgate used to stay silent.
//   - VIP 203.0.113.20 with `interfaces: [cbr0]`: answered from the pod with cbr0's MAC, never on
//     the LAN; and 203.0.113.5 is not answered on cbr0 (a CNI bridge is not one of "all interfaces").
func TestL2AllInterfaces(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{{Name: "node1", Pods: []string{"aw1"}}}})
	x := newL2Lab(t, l)
	x.scanARP()
	pod := l.Pod("aw1")
	cbr0MAC, err := l.Exec("node1", "cat", "/sys/class/net/"+lab.NodePodBridge+"/address")
	if err != nil {
		t.Fatal(err)
	}
	cbr0MAC = strings.ToLower(strings.TrimSpace(cbr0MAC))

	x.w.write("nodes.yaml", fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: node1\n  labels: {kubernetes.io/hostname: node1}\n"+
		"status:\n  addresses: [{type: InternalIP, address: %q}]\n", l.Node("node1").IPv4))
	x.w.write("pools.yaml", `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: far, namespace: metallb-system}
spec:
  addresses: [203.0.113.0/28]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: far, namespace: metallb-system}
spec:
  ipAddressPools: [far]
`, `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: pinned, namespace: metallb-system}
spec:
  addresses: [203.0.113.16/28]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: pinned, namespace: metallb-system}
spec:
  ipAddressPools: [pinned]
  interfaces: [cbr0]
`)
	http := []ndPort{{"http", "TCP", 80, 0, "http"}}
	slicePorts := []ndSlicePort{{"http", "TCP", 8080}}
	far, pinned := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("203.0.113.20")
	x.w.write("svc.yaml",
		ndService("far", "LoadBalancer", "10.96.7.1", "Cluster", http, ndStatus(far.String())),
		ndSlice("far", "IPv4", slicePorts, ndEp(pod, "node1")),
		ndService("pinned", "LoadBalancer", "10.96.7.2", "Cluster", http, ndStatus(pinned.String())),
		ndSlice("pinned", "IPv4", slicePorts, ndEp(pod, "node1")))
	x.start("node1")

	t.Run("no interfaces: answered on-link from another prefix", func(t *testing.T) {
		waited, _ := x.waitOwners([]netip.Addr{far}, func(netip.Addr) string { return "node1" }, 20*time.Second)
		t.Logf("%s answered on the LAN by node1's eth0 %v after the wait started", far, waited.Round(time.Millisecond))
		if _, err := l.Exec(lab.RoleLANClient, "ip", "route", "add", "203.0.113.0/28", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		r := ndWait(t, l, lab.RoleLANClient, "tcp", far.String()+":80", func(r lab.ProbeResult) bool { return r.OK() })
		t.Logf("LAN client -> %s:80: %v", far, r)
	})

	t.Run("interfaces: [cbr0]: only on cbr0", func(t *testing.T) {
		podScan, err := newARPScanner(pod.NS, "eth0", pod.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		defer podScan.close()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := podScan.scan([]netip.Addr{pinned}, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(got[pinned], []string{cbr0MAC}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s from the pod: answered by %v, want cbr0's MAC %s alone", pinned, got[pinned], cbr0MAC)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for range 3 {
			if got := x.owners([]netip.Addr{pinned}, 200*time.Millisecond); len(got[pinned]) > 0 {
				t.Fatalf("%s (interfaces: [cbr0]) answered on the LAN by %v", pinned, got[pinned])
			}
		}
		t.Logf("%s answered on cbr0 only", pinned)

		// The VIP of the advertisement without interfaces is not answered on cbr0: a CNI bridge is
		// not one of "all interfaces" (MetalLB's ^cbr.* exclusion).
		got, err := podScan.scan([]netip.Addr{far}, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got[far], cbr0MAC) {
			t.Errorf("%s (no interfaces) answered on the excluded bridge cbr0: %v", far, got[far])
		}
		t.Logf("%s asked from the pod: answered by %v", far, got[far])
	})
}
