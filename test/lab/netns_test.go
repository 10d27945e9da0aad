package lab

import (
	"net/netip"
	"strings"
	"testing"
)

// TestIPv4OnlyLabWithoutServers builds the small variant: no IPv6, servers
// started by hand, and an ECMP route in the router.
func TestIPv4OnlyLabWithoutServers(t *testing.T) {
	l := NewForTest(t, Spec{
		IPv4Only:  true,
		NoServers: true,
		Nodes:     []NodeSpec{{Name: "a", Pods: []string{"a1"}}, {Name: "b"}},
	})
	out, err := l.Exec("a", "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("IPv4-only node has global IPv6 addresses: %q %v", out, err)
	}
	if l.Server("a1") != nil {
		t.Error("a server runs although NoServers is set")
	}
	if r, err := l.Probe("b", "tcp", "10.244.1.11:8080"); err != nil || r.Err != "refused" {
		t.Errorf("probe before StartServers: %v %v, want refused", r, err)
	}
	if err := l.StartServers(); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Probe("b", "udp", "10.244.1.11:8081"); err != nil || r.Pod != "a1" || r.Src.Addr() != l.Node("b").IPv4 {
		t.Errorf("probe from node b: %v %v", r, err)
	}

	vip := netip.MustParsePrefix("203.0.113.10/32")
	if err := l.AddRoute(vip, "a", "b"); err != nil {
		t.Fatal(err)
	}
	out, err = l.Exec(RoleRouter, "ip", "route", "show", vip.String())
	if err != nil || !strings.Contains(out, "nexthop via 192.0.2.11") || !strings.Contains(out, "nexthop via 192.0.2.12") {
		t.Errorf("ECMP route: %q %v", out, err)
	}
	if err := l.AddRoute(netip.MustParsePrefix("2001:db8:ff::10/128"), "a"); err == nil {
		t.Error("AddRoute accepted an IPv6 prefix in an IPv4-only lab")
	}
	if _, err := l.Exec("nope", "true"); err == nil {
		t.Error("Exec in an unknown role succeeded")
	}
}
