package tablenames

import (
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestFirewallChainRoundTrip: a fw- chain's name parses back to its Service port, and names that
// are not a fw- chain's do not parse (the node's ChainName tests cover the whole grammar).
func TestFirewallChainRoundTrip(t *testing.T) {
	for _, c := range []struct {
		key   cluster.ServiceKey
		proto uint8
		port  uint16
		want  string
	}{
		{cluster.ServiceKey{Namespace: "ns1", Name: "lb-fw"}, dataplane.ProtoTCP, 80, "fw-ns1/lb-fw/tcp/80"},
		{cluster.ServiceKey{Namespace: "ip-x", Name: "web"}, dataplane.ProtoUDP, 53, "fw-ip-x/web/udp/53"},
		{cluster.ServiceKey{Namespace: "a", Name: "b"}, dataplane.ProtoSCTP, 65535, "fw-a/b/sctp/65535"},
	} {
		name := FirewallChain(c.key, c.proto, c.port)
		if name != c.want {
			t.Errorf("FirewallChain(%v, %d, %d) = %q, want %q", c.key, c.proto, c.port, name, c.want)
		}
		key, proto, port, ok := ParseFirewallChain(name)
		if !ok || key != c.key || proto != c.proto || port != c.port {
			t.Errorf("ParseFirewallChain(%q) = %v %d %d %v", name, key, proto, port, ok)
		}
	}
	if got := ServicePort(cluster.ServiceKey{Namespace: "ns1", Name: "lb-fw"}, dataplane.ProtoTCP, 80); got != "ns1/lb-fw port 80/tcp" {
		t.Errorf("ServicePort = %q", got)
	}
	for _, name := range []string{ChainFirewallCheck, "ext-ns/a/tcp/80", "fw-ns/a/tcp/0", "fw-ns/a/tcp", "fw-/a/tcp/80", "fw-ns/a/bogus/80"} {
		if _, _, _, ok := ParseFirewallChain(name); ok {
			t.Errorf("ParseFirewallChain(%q): ok", name)
		}
	}
}
