package symreturn

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/cluster"
)

func twoInterfaces() cluster.SymmetricReturn {
	return cluster.SymmetricReturn{
		Interfaces: []cluster.ReturnInterface{
			{Name: "eth1", Gateways: []netip.Addr{netip.MustParseAddr("203.0.113.1")}},
			{Name: "bond0.20"},
		},
		MarkMask:     cluster.DefaultSymmetricReturnMarkMask,
		RouteTable:   cluster.DefaultSymmetricReturnTable,
		RulePriority: cluster.DefaultSymmetricReturnPriority,
	}
}

func TestRender(t *testing.T) {
	got := NewPlan(twoInterfaces(), "vipgate").Render()
	want := `table inet vipgate-return {
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		iifname "eth1" ct state new ct mark set ct mark & 0xffffdfff | 0x00001000 comment "new connection from eth1"
		iifname "bond0.20" ct state new ct mark set ct mark & 0xffffefff | 0x00002000 comment "new connection from bond0.20"
		ct direction reply ct mark & 0x00003000 == 0x00001000 meta mark set meta mark & 0xffffdfff | 0x00001000 comment "reply to eth1"
		ct direction reply ct mark & 0x00003000 == 0x00002000 meta mark set meta mark & 0xffffefff | 0x00002000 comment "reply to bond0.20"
	}

	chain output {
		type route hook output priority mangle; policy accept;
		ct direction reply ct mark & 0x00003000 == 0x00001000 meta mark set meta mark & 0xffffdfff | 0x00001000 comment "reply to eth1"
		ct direction reply ct mark & 0x00003000 == 0x00002000 meta mark set meta mark & 0xffffefff | 0x00002000 comment "reply to bond0.20"
	}
}
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("render (-want +got):\n%s", diff)
	}
	if s := NewPlan(cluster.SymmetricReturn{}, "vipgate").Render(); s != "" {
		t.Errorf("an empty plan renders %q", s)
	}
}

// TestMarksStayInMask: whatever the mask, every interface's value is non-zero, inside the mask
// and distinct, so the rules of two interfaces never match each other's connections and no bit
// outside the mask is touched.
func TestMarksStayInMask(t *testing.T) {
	for _, mask := range []uint32{0x3000, 0x1, 0x0f00_0000, 0x8000_0000, 0x00f0} {
		c := cluster.SymmetricReturn{MarkMask: mask, RouteTable: 100, RulePriority: 100}
		low := mask & -mask
		for i := 0; uint64(i+1)*uint64(low) <= uint64(mask) && i < 20; i++ {
			c.Interfaces = append(c.Interfaces, cluster.ReturnInterface{Name: "eth" + string(rune('a'+i))})
		}
		p := NewPlan(c, "t")
		seen := map[uint32]bool{}
		for _, ifc := range p.Interfaces {
			if ifc.Mark == 0 || ifc.Mark&^mask != 0 || seen[ifc.Mark] {
				t.Errorf("mask %#x: %s has mark %#x", mask, ifc.Name, ifc.Mark)
			}
			seen[ifc.Mark] = true
		}
		for _, r := range p.nftRules() {
			if r.mask != mask {
				t.Errorf("mask %#x: rule %q uses mask %#x", mask, r.text(), r.mask)
			}
		}
	}
}

func TestRules(t *testing.T) {
	got := NewPlan(twoInterfaces(), "vipgate").Rules()
	want := []Rule{
		{cluster.IPv4, 1700, 0x1000, 0x3000, 1700},
		{cluster.IPv4, 1700, 0x2000, 0x3000, 1701},
		{cluster.IPv6, 1700, 0x1000, 0x3000, 1700},
		{cluster.IPv6, 1700, 0x2000, 0x3000, 1701},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func TestRoutes(t *testing.T) {
	links := map[string]int{"lo": 1, "eth0": 2, "eth1": 3, "bond0.20": 7}
	main := []Route{
		{Dst: pfx("0.0.0.0/0"), Gw: addr("192.0.2.1"), LinkIndex: 2},
		{Dst: pfx("192.0.2.0/24"), Src: addr("192.0.2.11"), LinkIndex: 2, Scope: 253},
		{Dst: pfx("203.0.113.0/26"), Src: addr("203.0.113.11"), LinkIndex: 3, Scope: 253},
		// eth1's own DHCP default: replaced by the configured gateway.
		{Dst: pfx("0.0.0.0/0"), Gw: addr("203.0.113.2"), LinkIndex: 3},
		{Dst: pfx("2001:db8:3::/64"), LinkIndex: 3},
		{Dst: pfx("::/0"), Gw: addr("fe80::1"), LinkIndex: 3},
		// bond0.20 has a default route of its own (a second DHCP lease) and no configured gateway.
		{Dst: pfx("198.51.100.0/24"), Src: addr("198.51.100.5"), LinkIndex: 7, Scope: 253},
		{Dst: pfx("0.0.0.0/0"), Gw: addr("198.51.100.1"), LinkIndex: 7},
	}
	got := NewPlan(twoInterfaces(), "vipgate").Routes(links, main)
	want := []Route{
		{Table: 1700, Dst: pfx("0.0.0.0/0"), Gw: addr("203.0.113.1"), LinkIndex: 3},
		{Table: 1700, Dst: pfx("203.0.113.0/26"), Src: addr("203.0.113.11"), LinkIndex: 3, Scope: 253},
		{Table: 1700, Dst: pfx("::/0"), Gw: addr("fe80::1"), LinkIndex: 3},
		{Table: 1700, Dst: pfx("2001:db8:3::/64"), LinkIndex: 3},
		{Table: 1701, Dst: pfx("0.0.0.0/0"), Gw: addr("198.51.100.1"), LinkIndex: 7},
		{Table: 1701, Dst: pfx("198.51.100.0/24"), Src: addr("198.51.100.5"), LinkIndex: 7, Scope: 253},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	// An interface that does not exist (yet) has no routes; the others keep theirs.
	delete(links, "eth1")
	for _, r := range NewPlan(twoInterfaces(), "vipgate").Routes(links, main) {
		if r.Table == 1700 {
			t.Errorf("route %s for an absent interface", r)
		}
	}
}

// fakeKernel records what Sync does to a kernel that starts with the given state.
type fakeKernel struct {
	links  map[string]int
	main   []Route
	routes []Route
	rules  []Rule
	table  string // the programmed nftables table ("" none)
	calls  []string
	fail   error
}

func (k *fakeKernel) ApplyTable(p Plan) error {
	k.table = ""
	if p.Enabled() {
		k.table = p.Render()
	}
	return nil
}
func (k *fakeKernel) Links() (map[string]int, error) { return k.links, nil }
func (k *fakeKernel) MainRoutes() ([]Route, error)   { return k.main, nil }
func (k *fakeKernel) OwnRoutes() ([]Route, error)    { return slices.Clone(k.routes), nil }
func (k *fakeKernel) OwnRules() ([]Rule, error)      { return slices.Clone(k.rules), nil }
func (k *fakeKernel) AddRoute(r Route) error {
	k.calls = append(k.calls, "add route "+r.String())
	k.routes = append(k.routes, r)
	return k.fail
}
func (k *fakeKernel) DelRoute(r Route) error {
	k.calls = append(k.calls, "del route "+r.String())
	k.routes = slices.DeleteFunc(k.routes, func(x Route) bool { return x == r })
	return nil
}
func (k *fakeKernel) AddRule(r Rule) error {
	k.calls = append(k.calls, "add "+r.String())
	k.rules = append(k.rules, r)
	return nil
}
func (k *fakeKernel) DelRule(r Rule) error {
	k.calls = append(k.calls, "del "+r.String())
	k.rules = slices.DeleteFunc(k.rules, func(x Rule) bool { return x == r })
	return nil
}

// TestSyncLifecycle: on, then again (nothing to do), then a changed config (the old interface's
// rules and routes go), then off (everything goes). Rules come after their routes and go before.
func TestSyncLifecycle(t *testing.T) {
	k := &fakeKernel{
		links: map[string]int{"eth0": 2, "eth1": 3, "eth2": 4},
		main: []Route{
			{Dst: pfx("0.0.0.0/0"), Gw: addr("192.0.2.1"), LinkIndex: 2},
			{Dst: pfx("203.0.113.0/26"), Src: addr("203.0.113.11"), LinkIndex: 3, Scope: 253},
			{Dst: pfx("198.51.100.0/24"), Src: addr("198.51.100.11"), LinkIndex: 4, Scope: 253},
		},
		// A rule of someone else's is never listed as ours (OwnRules filters by protocol).
	}
	cfg := cluster.SymmetricReturn{Interfaces: []cluster.ReturnInterface{{Name: "eth1", Gateways: []netip.Addr{addr("203.0.113.1")}}},
		MarkMask: 0x3000, RouteTable: 1700, RulePriority: 1700}
	p := NewPlan(cfg, "vipgate")
	if err := Apply(k, p); err != nil {
		t.Fatal(err)
	}
	wantCalls := []string{
		"add route table 1700 0.0.0.0/0 via 203.0.113.1 dev#3",
		"add route table 1700 203.0.113.0/26 dev#3 src 203.0.113.11",
		"add ipv4 rule 1700: fwmark 0x1000/0x3000 lookup 1700",
		"add ipv6 rule 1700: fwmark 0x1000/0x3000 lookup 1700",
	}
	if diff := cmp.Diff(wantCalls, k.calls); diff != "" {
		t.Errorf("first sync (-want +got):\n%s", diff)
	}
	if k.table == "" {
		t.Error("no table programmed")
	}
	k.calls = nil
	if n, err := SyncRoutes(k, p); n != 0 || err != nil || len(k.calls) > 0 {
		t.Errorf("second sync: %d changes, %v, %q", n, err, k.calls)
	}

	cfg.Interfaces = []cluster.ReturnInterface{{Name: "eth2"}}
	k.calls = nil
	if err := Apply(k, NewPlan(cfg, "vipgate")); err != nil {
		t.Fatal(err)
	}
	// eth2 takes eth1's place: the same mark and table, so the rules stay; the routes change.
	wantCalls = []string{
		"del route table 1700 0.0.0.0/0 via 203.0.113.1 dev#3",
		"del route table 1700 203.0.113.0/26 dev#3 src 203.0.113.11",
		"add route table 1700 198.51.100.0/24 dev#4 src 198.51.100.11",
	}
	if diff := cmp.Diff(wantCalls, k.calls); diff != "" {
		t.Errorf("changed config (-want +got):\n%s", diff)
	}
	if k.table == "" || len(k.rules) != 2 || len(k.routes) != 1 || k.routes[0].LinkIndex != 4 {
		t.Errorf("after the change: rules %v, routes %v", k.rules, k.routes)
	}

	k.calls = nil
	if err := Apply(k, NewPlan(cluster.SymmetricReturn{}, "vipgate")); err != nil {
		t.Fatal(err)
	}
	if k.table != "" || len(k.rules) != 0 || len(k.routes) != 0 {
		t.Errorf("after turning it off: table %q, rules %v, routes %v", k.table, k.rules, k.routes)
	}
	if !slices.Equal(k.calls[:2], []string{"del ipv4 rule 1700: fwmark 0x1000/0x3000 lookup 1700", "del ipv6 rule 1700: fwmark 0x1000/0x3000 lookup 1700"}) {
		t.Errorf("rules did not go first: %q", k.calls)
	}
}

// TestSyncGoesOn: a failing change does not stop the others, and the error names it.
func TestSyncGoesOn(t *testing.T) {
	k := &fakeKernel{links: map[string]int{"eth1": 3}, main: []Route{{Dst: pfx("203.0.113.0/26"), LinkIndex: 3, Scope: 253}}, fail: errors.New("boom")}
	cfg := cluster.SymmetricReturn{Interfaces: []cluster.ReturnInterface{{Name: "eth1"}}, MarkMask: 0x3000, RouteTable: 1700, RulePriority: 1700}
	_, err := SyncRoutes(k, NewPlan(cfg, "vipgate"))
	if err == nil || len(k.rules) != 2 {
		t.Errorf("err %v, rules %v", err, k.rules)
	}
}
