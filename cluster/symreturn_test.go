package cluster

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const symReturnBase = `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node-a
nodeIPs: ["192.0.2.11"]
`

func TestSymmetricReturnConfig(t *testing.T) {
	c, err := ParseNodeConfig([]byte(symReturnBase))
	if err != nil {
		t.Fatal(err)
	}
	if c.SymmetricReturn.Enabled() {
		t.Errorf("on by default: %+v", c.SymmetricReturn)
	}
	c, err = ParseNodeConfig([]byte(symReturnBase + `symmetricReturn:
  interfaces:
  - {name: eth1, gateways: ["203.0.113.1", "2001:db8:3::1"]}
  - {name: bond0.20}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := SymmetricReturn{
		Interfaces: []ReturnInterface{
			{Name: "eth1", Gateways: []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8:3::1")}},
			{Name: "bond0.20"},
		},
		MarkMask: 0x3000, RouteTable: 1700, RulePriority: 1700,
	}
	if diff := cmp.Diff(want, c.SymmetricReturn, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if m0, m1 := c.SymmetricReturn.Mark(0), c.SymmetricReturn.Mark(1); m0 != 0x1000 || m1 != 0x2000 {
		t.Errorf("marks %#x %#x", m0, m1)
	}
	c, err = ParseNodeConfig([]byte(symReturnBase + `symmetricReturn: {interfaces: [{name: eth1}], markMask: "0xf0000", routeTable: 300, rulePriority: 90}
`))
	if err != nil {
		t.Fatal(err)
	}
	if s := c.SymmetricReturn; s.MarkMask != 0xf0000 || s.RouteTable != 300 || s.RulePriority != 90 || s.Mark(0) != 0x10000 {
		t.Errorf("got %+v", s)
	}
}

func TestSymmetricReturnConfigErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{interfaces: [{name: eth1}], markMask: "0x4000"}`, "overlaps masqueradeBit"},
		{`{interfaces: [{name: eth1}], markMask: "0x5000"}`, "contiguous"},
		{`{interfaces: [{name: eth1}], markMask: "0"}`, "no bits"},
		{`{interfaces: [{name: eth1}], markMask: "lots"}`, "markMask"},
		{`{interfaces: [{name: a}, {name: b}, {name: c}, {name: d}]}`, "values for 3"},
		{`{interfaces: [{name: eth1}, {name: eth1}]}`, "twice"},
		{`{interfaces: [{name: "eth1\"x"}]}`, "name"},
		{`{interfaces: [{name: averyveryverylongname}]}`, "IFNAMSIZ"},
		{`{interfaces: [{name: eth1, gateways: ["203.0.113.1", "203.0.113.2"]}]}`, "two of IPv4"},
		{`{interfaces: [{name: eth1, gateways: ["0.0.0.0"]}]}`, "next hop"},
		{`{interfaces: [{name: eth1, gateways: ["nope"]}]}`, "gateways"},
		{`{interfaces: [{name: eth1}], routeTable: 254}`, "routeTable"},
		{`{interfaces: [{name: eth1}, {name: eth2}], routeTable: 252}`, "routeTable"},
		{`{interfaces: [{name: eth1}], routeTable: 0}`, "routeTable"},
		{`{interfaces: [{name: eth1}], rulePriority: 32766}`, "rulePriority"},
		{`{interfaces: [{name: eth1}], rulePriority: 0}`, "rulePriority"},
		{`{interfaces: [{name: eth1}], tenant: x}`, "unknown field"},
	} {
		_, err := ParseNodeConfig([]byte(symReturnBase + "symmetricReturn: " + tc.in + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.in, err, tc.want)
		}
	}
}
