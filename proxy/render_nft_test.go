package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// This file checks that everything vipgate programs, node and gateway, both families and both
// together, is printed by render in a form that Debian's nft (1.0.6) accepts with `nft -c -f`: an
// operator must be able to check and load what `vipgate render` prints. nft -c needs a network
// namespace of its own (it still opens a netlink socket), so every check runs under `unshare -n`:
// a namespace that exists only for that one command.

// withAlgorithm returns the fixture with every Service annotated with alg ("" leaves them as they
// are): each rule kind (affinity, eTP Local, NodePorts, source ranges, ...) meets each algorithm.
func withAlgorithm(svcs []trService, alg cluster.LBAlgorithm) []trService {
	if alg == "" {
		return svcs
	}
	out := make([]trService, len(svcs))
	for i, s := range svcs {
		c := *s.svc
		c.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: string(alg)}
		out[i] = trService{svc: &c, slices: s.slices}
	}
	return out
}

func TestRenderNftAcceptsNode(t *testing.T) {
	nftCheckOrSkip(t)
	for _, alg := range append([]cluster.LBAlgorithm{""}, cluster.LBAlgorithms...) {
		for _, masqAll := range []bool{false, true} {
			name := fmt.Sprintf("node/%s/masqueradeAll=%v", cmpOr(string(alg), "default"), masqAll)
			t.Run(name, func(t *testing.T) {
				svcs := withAlgorithm(trFixture(), alg)
				var both strings.Builder
				for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
					text := dataplane.RenderString(trFlat(t, fam, masqAll, svcs))
					nftCheck(t, name+"/"+rdFamilyName(fam), text)
					both.WriteString(text)
				}
				nftCheck(t, name+"/dual-stack", both.String()) // as `vipgate render` prints a dual-stack node
			})
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
