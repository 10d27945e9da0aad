package proxy

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// (maxChainNameLen: schema_test.go.)

// TestChainNamePrefixesPrefixFree: no chain-name prefix begins another, the property that makes a
// name's role its prefix whatever namespace follows it (the old ext-ip- began with ext-).
func TestChainNamePrefixesPrefixFree(t *testing.T) {
	prefixes := []string{prefixPick, prefixMasqPick}
	for _, pp := range perPortPrefixes {
		prefixes = append(prefixes, pp.prefix)
	}
	for i, a := range prefixes {
		for j, b := range prefixes {
			if i != j && strings.HasPrefix(b, a) {
				t.Errorf("prefix %q begins prefix %q: a name starting with %q has two readings", a, b, b)
			}
		}
	}
	// Every per-Service role has its prefix.
	for r := ChainRoleFirewall; r <= ChainRoleRoundRobin; r++ {
		n := 0
		for _, pp := range perPortPrefixes {
			if pp.role == r {
				n++
			}
		}
		if n != 1 {
			t.Errorf("role %s has %d prefixes, want 1", r, n)
		}
	}
}

// rnDNSLabel returns a random DNS label of 1 to max characters ([a-z0-9-], alphanumeric at both
// ends; with letterFirst, a letter first as DNS-1035 wants for Service names). Half of them begin
// with something that is also the start of a chain name or of its role part ("ip-", "np-",
// "local-ip-", "ext-", ...): the inputs that made the old names ambiguous.
func rnDNSLabel(rng *rand.Rand, max int, letterFirst bool) string {
	const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b strings.Builder
	if rng.IntN(2) == 0 {
		tricky := []string{"ip-", "np-", "ip", "np", "local-ip-", "local-np-", "local-", "ext-", "ext-ip-", "fw-", "aff-", "rr-", "pick-", "masq-pick-", "cluster-", "local"}
		b.WriteString(tricky[rng.IntN(len(tricky))])
	}
	n := 1 + rng.IntN(max)
	for b.Len() < n || b.Len() == 0 {
		c := alnum[rng.IntN(len(alnum))]
		if b.Len() > 0 && b.Len() < n-1 && rng.IntN(5) == 0 {
			c = '-'
		}
		if b.Len() == 0 && letterFirst {
			c = alnum[rng.IntN(26)]
		}
		b.WriteByte(c)
	}
	s := b.String()
	if len(s) > max {
		s = s[:max]
	}
	// A label ends alphanumeric.
	if strings.HasSuffix(s, "-") {
		s = s[:len(s)-1] + "x"
	}
	return s
}

// TestChainNameRoundTrip is a property test: for random namespaces, Service names, protocols and
// ports, every chain name ChainName.String builds parses back to exactly that ChainName, so no two
// roles (or Service ports) share a name; and every name fits the kernel's limit.
func TestChainNameRoundTrip(t *testing.T) {
	seed := uint64(20261124)
	rng := rand.New(rand.NewPCG(seed, seed))
	protos := []uint8{dataplane.ProtoTCP, dataplane.ProtoUDP, dataplane.ProtoSCTP}
	built := 0
	seen := map[string]ChainName{}
	check := func(c ChainName) {
		t.Helper()
		name := c.String()
		built++
		if len(name) > maxChainNameLen {
			t.Errorf("%+v: name %q is %d bytes, more than the kernel's %d", c, name, len(name), maxChainNameLen)
		}
		got, ok := ParseChainName(name)
		if !ok {
			t.Errorf("ParseChainName(%q) (built from %+v): not ok", name, c)
			return
		}
		if got != c {
			t.Errorf("ParseChainName(%q) = %+v, built from %+v", name, got, c)
		}
		if prev, dup := seen[name]; dup && prev != c {
			t.Errorf("%q is the name of both %+v and %+v", name, prev, c)
		}
		seen[name] = c
	}
	for i := 0; i < 20000; i++ {
		key := cluster.ServiceKey{Namespace: rnDNSLabel(rng, 63, false), Name: rnDNSLabel(rng, 63, true)}
		proto, port := protos[rng.IntN(len(protos))], uint16(1+rng.IntN(65535))
		for r := ChainRoleFirewall; r <= ChainRoleRoundRobin; r++ {
			c := ChainName{Role: r, Service: key, Proto: proto, Port: port}
			if r == ChainRoleAffinity || r == ChainRoleRoundRobin {
				for _, pol := range []string{PolicyCluster, PolicyLocal} {
					c.Policy = pol
					check(c)
				}
				continue
			}
			check(c)
		}
	}
	// The shared pickers: every map, algorithm and a few sizes.
	for _, m := range []string{MapEndpoints, MapEndpointsCluster, MapNodePortEndpoints, MapNodePortEndpointsCluster} {
		for _, alg := range []cluster.LBAlgorithm{cluster.LBRandom, cluster.LBSourceHash, cluster.LBMaglev} {
			sizes := []int{1, 2, 3, 10, 1000}
			if alg == cluster.LBMaglev {
				sizes = maglev.Sizes
			}
			for _, n := range sizes {
				for _, r := range []ChainRole{ChainRolePick, ChainRoleMasqPick} {
					check(ChainName{Role: r, Map: m, Size: n, Algorithm: alg})
				}
			}
		}
	}
	for _, c := range baseChains {
		check(ChainName{Role: ChainRoleFixed, Fixed: c.name})
	}
	t.Logf("seed %d: %d names built, %d distinct, all parse back", seed, built, len(seen))

	// The case that was ambiguous: namespace "ip-web" (an ext- chain) against namespace "web" (a
	// local-ip- chain) of a Service of the same name and port.
	a := ChainName{Role: ChainRoleExternal, Service: cluster.ServiceKey{Namespace: "ip-web", Name: "lb"}, Proto: dataplane.ProtoTCP, Port: 80}
	b := ChainName{Role: ChainRoleExternalLocalIP, Service: cluster.ServiceKey{Namespace: "web", Name: "lb"}, Proto: dataplane.ProtoTCP, Port: 80}
	if a.String() == b.String() {
		t.Errorf("%+v and %+v are both %q", a, b, a.String())
	}
	for _, c := range []ChainName{a, b} {
		if got, ok := ParseChainName(c.String()); !ok || got != c {
			t.Errorf("ParseChainName(%q) = %+v, %v; want %+v", c.String(), got, ok, c)
		}
	}
}
