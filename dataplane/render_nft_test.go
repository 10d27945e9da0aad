package dataplane

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
)

// This file checks that everything vipgate programs, node and gateway, both families and both
// together, is printed by render in a form that Debian's nft (1.0.6) accepts with `nft -c -f`: an
// operator must be able to check and load what `vipgate render` prints. nft -c needs a network
// namespace of its own (it still opens a netlink socket), so every check runs under `unshare -n`:
// a namespace that exists only for that one command.

// nftCheckOrSkip skips the test where `nft -c` cannot run.
func nftCheckOrSkip(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root (a network namespace of its own)")
	}
	for _, bin := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
}

// nftCheck runs `nft -c -f` over text in a throwaway network namespace and fails with nft's message.
func nftCheck(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f of %s: %v\n%s\n--- rendered:\n%s", name, err, out, text)
	}
}

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
					text := RenderString(trFlat(t, fam, masqAll, svcs))
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
