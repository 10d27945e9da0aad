package dataplane_test

// The engine knows no role (issue #29): the names of the node's table are the node's proxy's to
// spell (proxy/names.go, and tablenames for those it shares with the gateway), the gateway's the
// gateway's (gateway/names.go), not the engine's. These tests check that no source file of the
// engine (the dataplane package and its leaves) spells one of them as a string literal, but for
// the names the engine owns itself (engineNames).

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/tablenames"
)

// engineNames are names of the node's table that are the engine's own, and why.
var engineNames = map[string]string{
	dataplane.ChainReject: "the engine's spelling of a verdict map's reject (model.go), which the kernel cannot hold; the node builds the chain",
}

// nodeChainPrefixes are the prefixes of the node's per-Service and shared chains (proxy/names.go,
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

// engineLiteral is a string literal of the engine's source (not its tests).
type engineLiteral struct {
	pos   token.Position
	value string
}

// engineLiterals returns the string literals of the engine's source files: the dataplane package
// and its leaves, tests left out.
func engineLiterals(t *testing.T) []engineLiteral {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Fatalf("found %d source files of the engine: the walk is broken", len(files))
	}
	fset := token.NewFileSet()
	var out []engineLiteral
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out = append(out, engineLiteral{fset.Position(lit.Pos()), s})
			}
			return true
		})
	}
	return out
}

func TestEngineSpellsNoNodeNames(t *testing.T) {
	names := nodeNames(t)
	if len(names) < 10 {
		t.Fatalf("the node's tables have only %d fixed names: the fixture is broken", len(names))
	}
	owned := 0
	for _, l := range engineLiterals(t) {
		switch s := l.value; {
		case engineNames[s] != "":
			owned++
		case names[s] || hasNodePrefix(s):
			t.Errorf("%s: %q is a name of the node's table: the engine takes it from the node's proxy (an option), or it is shared with the gateway (tablenames)", l.pos, s)
		}
	}
	// A scan that finds none of the engine's own names is broken.
	if owned == 0 {
		t.Errorf("found none of the engine's own names: the scan is broken")
	}
}

// roleNames reads the names a role's names file declares (path, relative to the engine): the
// string constants whose identifier begins with Chain, Set or Map (names), or Prefix (the
// beginnings of names). Read from the source, the list is the file's as it is now: a name added
// there is checked here without a copy to keep.
func roleNames(t *testing.T, path string) (names map[string]string, prefixes map[string]string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names, prefixes = map[string]string{}, map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				where := path + " " + id.Name
				switch {
				case strings.HasPrefix(id.Name, "Prefix"):
					prefixes[v] = where
				case strings.HasPrefix(id.Name, "Chain"), strings.HasPrefix(id.Name, "Set"), strings.HasPrefix(id.Name, "Map"):
					names[v] = where
				}
			}
		}
	}
	return names, prefixes
}

// TestEngineSpellsNoGatewayNames: the engine spells none of the gateway's chain, set and map names
// (gateway/names.go) nor those the roles share (tablenames): its gateway kinds take them from the
// rules the gateway builds (the connection table's maps: Action.Set, Conns, Map), and the gateway
// names its netdev chains itself (gateway.IngressChainName). A literal that is such a name, begins
// with such a prefix, or refers to such a name as nft does (@name) fails.
func TestEngineSpellsNoGatewayNames(t *testing.T) {
	names, prefixes := roleNames(t, filepath.Join("..", "gateway", "names.go"))
	shared, sharedPrefixes := roleNames(t, filepath.Join("..", "tablenames", "tablenames.go"))
	maps.Copy(names, shared)
	maps.Copy(prefixes, sharedPrefixes)
	// The reading is checked against the packages themselves: it must find these.
	for _, n := range []string{gateway.MapGatewayFlows, gateway.MapGatewayConns, gateway.MapGatewayRouteIDs, gateway.MapGatewayPrevIDs,
		gateway.ChainGatewayRoute, gateway.SetGatewayVIPs, tablenames.ChainServices, tablenames.MapServiceIPs} {
		if names[n] == "" {
			t.Fatalf("%q is not among the names read from gateway/names.go and tablenames: the reading is broken", n)
		}
	}
	for _, p := range []string{gateway.PrefixGatewayIngress, tablenames.PrefixFirewall} {
		if prefixes[p] == "" {
			t.Fatalf("prefix %q is not among those read: the reading is broken", p)
		}
	}
	if !strings.HasPrefix(gateway.IngressChainName("eth0"), gateway.PrefixGatewayIngress) {
		t.Fatalf("gateway.IngressChainName does not begin with gateway.PrefixGatewayIngress")
	}
	for _, l := range engineLiterals(t) {
		s := l.value
		if engineNames[s] != "" {
			continue
		}
		if where := names[s]; where != "" {
			t.Errorf("%s: %q is a name of the gateway's table or of both roles' (%s): the engine takes it from the rule or an option", l.pos, s, where)
			continue
		}
		for p, where := range prefixes {
			if strings.HasPrefix(s, p) {
				t.Errorf("%s: %q begins with %q (%s): the gateway names these chains", l.pos, s, p, where)
			}
		}
		for n, where := range names {
			if strings.Contains(s, "@"+n+" ") || strings.HasSuffix(s, "@"+n) {
				t.Errorf("%s: %q refers to @%s (%s): the engine spells the name the rule carries", l.pos, s, n, where)
			}
		}
	}
}

// The decoder orders base chains by type, priority and hook (dataplane.CompareBaseChains), and the
// node's schema builds them in that order, so that a node table reads back as rendered.
func TestBaseChainOrderIsTheNodes(t *testing.T) {
	var built []*dataplane.Chain
	for _, c := range proxy.BuildBase(proxy.BaseConfig{Family: cluster.IPv4}).Chains {
		if c.IsBase() {
			built = append(built, c)
		}
	}
	if len(built) != 8 || !slices.IsSortedFunc(built, dataplane.CompareBaseChains) {
		var names []string
		for _, c := range built {
			names = append(names, c.Name)
		}
		t.Errorf("the node's %d base chains are built in the order %v, not the decoder's", len(built), names)
	}
}
