package l2

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNetnsInterfaces: Interfaces reads, in the calling thread's namespace, what the "all interfaces"
// rule needs (speaker.ExcludedInterface): up links only, no loopback, prefixes masked without
// link-local ones, the bridge a port is enslaved to, IFF_NOARP, and the link kind.
func TestNetnsInterfaces(t *testing.T) {
	l := newLab(t)
	for _, args := range [][]string{
		{"link", "add", "cbr9", "type", "bridge"},
		{"link", "add", "vx1", "type", "veth", "peer", "name", "vx2"},
		{"link", "set", "vx1", "master", "cbr9"},
		// veths stand in for kube-proxy's dummy and a NOARP tunnel (no dummy module loaded here).
		{"link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kv1"},
		{"link", "add", "t0", "type", "veth", "peer", "name", "t1"},
		{"link", "set", "t0", "arp", "off"},
		{"link", "add", "dn0", "type", "veth", "peer", "name", "dn1"}, // stay down
		{"addr", "add", "10.244.9.1/24", "dev", "cbr9"},
	} {
		run(t, append([]string{"ip", "-n", l.a}, args...)...)
	}
	for _, name := range []string{"cbr9", "vx1", "vx2", "kube-ipvs0", "t0"} {
		run(t, "ip", "-n", l.a, "link", "set", name, "up")
	}
	var got []Interface
	var err error
	l.inA(t, func() { got, err = Interfaces() })
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b Interface) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	want := []Interface{
		{Name: "cbr9", Kind: "bridge", Prefixes: pfx("10.244.9.0/24")},
		{Name: "kube-ipvs0", Kind: "veth"},
		{Name: "t0", Kind: "veth", NoARP: true},
		{Name: "va", Kind: "veth", Prefixes: pfx("192.0.2.0/24", "2001:db8:1::/64")},
		{Name: "va2", Kind: "veth", Prefixes: pfx("198.51.100.0/24")},
		{Name: "vx1", Kind: "veth", Master: "cbr9"},
		{Name: "vx2", Kind: "veth"},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("Interfaces() in a (-want +got):\n%s", diff)
	}
}
