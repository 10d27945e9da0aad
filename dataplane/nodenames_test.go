package dataplane_test

// The engine knows no role (issue #29): the names of the node's table are the node's proxy's to
// spell, not the engine's. This test checks that the engine's source spells none of them as a
// string literal, outside the files listed in nodeNameFiles, which are the node's schema still in
// the engine (its names are shared with the gateway's tables, which use the same base chains and
// the firewall-check chain and maps).

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

// nodeNameFiles are the engine's files that may spell the node table's names, and why.
var nodeNameFiles = map[string]string{
	"schema.go": "the node's schema (base chains, fixed sets, chain names) is still in the engine; the gateway's tables use its base chain names and ChainFirewallCheck, MapServiceIPs, MapFirewallIPs",
}

// nodeChainPrefixes are the prefixes of the node's per-Service and shared chains (schema.go,
// ChainName): a literal that starts with one spells a node chain.
var nodeChainPrefixes = []string{"fw-", "ext-", "local-ip-", "local-np-", "aff-", "rr-", "pick-", "masq-pick-"}

// nodeNames returns the names of the chains and sets of the node's tables for a synthetic cluster,
// both families: every name the proxy programs but the per-Service ones.
func nodeNames(t *testing.T) map[string]bool {
	t.Helper()
	cfg := proxy.Config{NodeName: "node-0",
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/108")}}
	names := map[string]bool{}
	st := proxy.SyntheticState(50, 3)
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, _, err := proxy.BuildRuleset(cfg, fam, st)
		if err != nil {
			t.Fatal(err)
		}
		f := rs.Flatten()
		for name := range f.Chains {
			if !hasNodePrefix(name) {
				names[name] = true
			}
		}
		for name := range f.Sets {
			if !hasNodePrefix(name) {
				names[name] = true
			}
		}
	}
	return names
}

func hasNodePrefix(s string) bool {
	for _, p := range nodeChainPrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func TestEngineSpellsNoNodeNames(t *testing.T) {
	names := nodeNames(t)
	if len(names) < 10 {
		t.Fatalf("the node's tables have only %d fixed names: the fixture is broken", len(names))
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	// exempt counts the names each file of nodeNameFiles spells: one that spells none is no
	// exception any more (and a scan that finds none there is broken).
	exempt := map[string]int{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if !names[s] && !hasNodePrefix(s) {
				return true
			}
			if _, ok := nodeNameFiles[path]; ok {
				exempt[path]++
			} else {
				t.Errorf("%s: %q is a name of the node's table: the engine takes it from the node's proxy (an option), or it is the node's schema (nodeNameFiles)", fset.Position(lit.Pos()), s)
			}
			return true
		})
	}
	for path := range nodeNameFiles {
		if exempt[path] == 0 {
			t.Errorf("%s spells no name of the node's table: remove it from nodeNameFiles", path)
		}
	}
}

// The decoder orders base chains as the node's schema builds them (decode.go's baseChainOrder, kept
// in the engine because the gateway's tables use the same base chains), so that a node table reads
// back as rendered.
func TestBaseChainOrderIsTheNodes(t *testing.T) {
	var built []string
	for _, c := range proxy.BuildBase(proxy.BaseConfig{Family: cluster.IPv4}).Chains {
		if c.IsBase() {
			built = append(built, c.Name)
		}
	}
	if !slices.Equal(built, dataplane.BaseChainOrder) {
		t.Errorf("the node's base chains are %v, the decoder orders them %v", built, dataplane.BaseChainOrder)
	}
}
