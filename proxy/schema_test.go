package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// maxChainNameLen is the longest chain name the kernel takes: NFT_CHAIN_MAXNAMELEN is 256 bytes
// with the terminating NUL.
const maxChainNameLen = 255

// longestNames returns trFixture with every Service renamed to the longest namespace and name
// Kubernetes allows (63 characters each): the longest chain names a node table can hold.
func longestNames(svcs []trService) []trService {
	out := make([]trService, len(svcs))
	for i, s := range svcs {
		suffix := fmt.Sprintf("-%02d", i)
		key := cluster.ServiceKey{Namespace: strings.Repeat("n", 63-len(suffix)) + suffix, Name: "s" + strings.Repeat("e", 62-len(suffix)) + suffix}
		svc := *s.svc
		svc.Key = key
		var slices []*cluster.EndpointSlice
		for _, sl := range s.slices {
			c := *sl
			c.Namespace, c.Service = key.Namespace, key
			slices = append(slices, &c)
		}
		out[i] = trService{svc: &svc, slices: slices}
	}
	return out
}

// TestChainNamesNftAcceptsLongest: nft 1.0.6 loads (nft -c -f) what render prints for Services with
// the longest names, every chain role among them, and the longest name of each role, SCTP port
// 65535 and policy "cluster" included, is within the kernel's limit.
func TestChainNamesNftAcceptsLongest(t *testing.T) {
	key := cluster.ServiceKey{Namespace: strings.Repeat("n", 63), Name: "s" + strings.Repeat("e", 62)}
	longest := 0
	for r := ChainRoleFirewall; r <= ChainRoleRoundRobin; r++ {
		name := ChainName{Role: r, Service: key, Proto: dataplane.ProtoSCTP, Port: 65535, Policy: PolicyCluster}.String()
		longest = max(longest, len(name))
		if len(name) > maxChainNameLen {
			t.Errorf("%s: %q is %d bytes, more than the kernel's %d", r, name, len(name), maxChainNameLen)
		}
	}
	t.Logf("longest per-Service chain name: %d bytes (limit %d)", longest, maxChainNameLen)

	nftCheckOrSkip(t)
	svcs := longestNames(trFixture())
	roles := map[ChainRole]bool{}
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		f := trFlat(t, fam, false, svcs)
		for _, name := range f.ChainOrder {
			if c, ok := ParseChainName(name); ok {
				roles[c.Role] = true
			} else {
				t.Errorf("%s: chain %q does not parse", rdFamilyName(fam), name)
			}
		}
		nftCheck(t, "longest-names/"+rdFamilyName(fam), dataplane.RenderString(f))
	}
	for _, r := range []ChainRole{ChainRoleFirewall, ChainRoleExternalLocalIP, ChainRoleExternalLocalNodePort, ChainRoleAffinity} {
		if !roles[r] {
			t.Errorf("the fixture has no chain of role %s", r)
		}
	}
}
