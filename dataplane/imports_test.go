package dataplane_test

// The module's layering, checked like kube-proxy's .import-restrictions: for each package, which of
// the module's packages it may depend on (directly or through others). Only non-test Go files count,
// for the build's GOOS and GOARCH. The test reads the source with go/build, so it needs neither the
// go command nor root, and runs in milliseconds.
//
// When it fails, the change just made crosses a layer boundary: move the code to the layer it
// belongs to (usually: the lower package exports a type or an interface, the upper one adapts)
// rather than widening a rule. A new package needs a rule here; say why it exists.

import (
	"errors"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/vipgate/vipgate"

// importRule says what a package may import from the module: only packages within one of allowed
// (a path relative to the module, matching itself and everything below it). A package matches the
// rule with the longest pkg that is itself or a parent of it. Packages outside the module (the
// standard library, dependencies) are not restricted here.
type importRule struct {
	pkg     string
	allowed []string
	why     string
}

var importRules = []importRule{
	// The leaves of the dataplane. They must never import the dataplane itself (which imports them)
	// nor anything above it, so that they build, test and can be reused on their own and the
	// dataplane package does not grow back into one blob.
	{"dataplane/conntrack", []string{"cluster"},
		"conntrack cleanup: dataplane.ConntrackView adapts a cluster.State; the leaf knows only views and StaleFlow"},
	{"dataplane/dptest", []string{"cluster"},
		"test helpers the engine's tests and the gateway's share (a network namespace, nft -c, the hostile-Service corpus): only cluster, so dataplane's own tests can import it"},
	// The in-memory nftables kernel: it applies the engine's transactions (dataplane.Tx), so it
	// imports the dataplane; the dataplane never imports it (its own tests cannot: a cycle), the
	// tests of the packages above it do.
	{"dataplane/memtable", []string{"cluster", "dataplane"},
		"an in-memory nftables kernel for tests: a dataplane.Programmer over the engine's model, with the kernel's checks"},
	{"dataplane/maglev", nil,
		"Maglev table construction: pure, the same on every gateway and node; the dataplane programs its tables"},
	// Any other package under dataplane/ is a leaf too: it may use other leaves, never the dataplane
	// package.
	{"dataplane/", []string{"cluster", "dataplane/"},
		"a dataplane leaf must not import the dataplane package, which imports it"},
	// The dataplane turns desired state into nftables rules. It must not know how addresses are
	// announced (speaker, l2, bgp): the node wires both to the same snapshots in cmd/vipgate.
	{"dataplane", []string{"cluster", "dataplane/"},
		"the dataplane programs the kernel from cluster.State; announcing is the speaker's job, and the gateway (gateway/) builds its tables on the dataplane's exported API, never the other way round"},
	// The node's Service proxy: it builds the node's table (schema, Services, claims, the address
	// screen) and keeps it in sync through the engine's exported API (Diff, Part, Tx, the netlink
	// edge), as the gateway does; neither the engine nor the gateway imports it.
	{"proxy", []string{"cluster", "dataplane", "dataplane/", "proxy/", "tablenames"},
		"the node's Service proxy (kube-proxy's role) on the nftables engine's exported API; the engine knows no role, and the gateway does not need the node's proxy"},
	// The proxy's leaves: they must never import the proxy (which imports them) nor the engine.
	{"proxy/healthcheck", []string{"cluster"},
		"healthCheckNodePort and /healthz servers: they take the counts the sync reports, not the Proxier"},
	{"proxy/", []string{"cluster", "proxy/"},
		"a proxy leaf must not import the proxy package, which imports it, nor the engine"},
	// The names the node's and the gateway's tables share (base chains, services, firewall-check,
	// service-ips, the fw- chains): above the engine, which names none of them, and below both
	// roles, so that the gateway needs no node's proxy for them.
	{"tablenames", []string{"cluster", "dataplane"},
		"the chain and set names both roles' tables share (kube-proxy's where the job is the same): the engine never imports it, each role's own names are its own"},
	// The gateway: a host in front of the cluster. It builds its tables with the dataplane's model
	// and programs them through the dataplane's exported API (Programmer, DiffRulesets, the netlink
	// edge), so the nftables engine stays one; the dataplane never imports it. Its runtime (sync
	// loop, SNAT addresses' owners, conntrack sync) hears the membership and answers ARP/NDP
	// through its own PeerView and Announcer interfaces, which cmd/vipgate adapts: no speaker,
	// membership or l2 here.
	{"gateway", []string{"cluster", "dataplane", "dataplane/", "gateway/", "keyreload", "tablenames"},
		"the gateway's config, entries, tables, proxier and runtime: it uses the nftables engine's exported API, not the speaker's, the membership's or l2's (cmd/vipgate adapts them to gateway.PeerView and gateway.Announcer)"},
	// The gateway's leaves: kernel and protocol pieces only the gateway uses. They must never import
	// the gateway (which imports them) nor the dataplane, so that they build and test on their own.
	{"gateway/ctsync", nil,
		"the gateway's SNAT table and conntrackd supervision: standalone, driven by the gateway's runtime"},
	{"gateway/ctsync/relay", nil,
		"the signed relay between the gateways' conntrackds (on loopback) over the LAN: sockets and a wire format only; the gateway's runtime runs it next to ctsync's supervisor"},
	{"gateway/natpath", nil,
		"the gateway's NAT fast path (a tc BPF program and its maps): VIP ports, Maglev tables and flows, no Services; the gateway gives it each sync's VIP ports"},
	{"gateway/healthprobe", nil,
		"the gateway's healthCheckNodePort prober: HTTP and targets only, generic in the gateway's target type; the gateway's runtime wires it to the proxier"},
	// Any other package under gateway/ is a leaf too: it may use the cluster model and other leaves,
	// never the gateway package.
	{"gateway/", []string{"cluster", "gateway/"},
		"a gateway leaf must not import the gateway package, which imports it, nor the dataplane"},
	// explain traces a packet through the node's or the gateway's ruleset, read from the kernel or
	// built for manifests with their own builders: it sits above both, and only cmd imports it.
	{"explain", []string{"cluster", "dataplane", "dataplane/", "proxy", "proxy/", "gateway", "gateway/", "keyreload", "tablenames", "speaker", "bgp", "bgp/"},
		"vipgate explain's trace and report, and the offline ruleset render prints: it uses the proxy's and the gateway's builders, the engine's Explain and the speaker's pure deciders (speaker.ExplainVIPs, explain --service; bgp comes with them), never membership or l2"},
	// The desired-state model and its sources sit under everything that consumes them.
	{"cluster", []string{"cluster"},
		"cluster is the model every layer reads; it must not depend on any of them"},
	// The speaker decides what to announce from the State; l2 and bgp are its protocol engines.
	{"speaker", []string{"cluster", "bgp"},
		"the speaker reads cluster.State and drives bgp; it does not need the dataplane (cmd passes what it needs), and it reads the membership through its own Membership interface (cmd adapts membership.Members)"},
	// The L2 membership protocol: heartbeats and gossip, their socket, keys and wire format, and
	// the views they give. The speaker decides with those views; the protocol never decides.
	{"membership", nil,
		"the speakers' UDP membership protocol: sockets, keys, wire format and views only; it knows no State and no owner (the speaker decides, cmd/vipgate wires the two)"},
	{"l2", nil,
		"ARP/NDP engine: protocol only, reusable and testable without the cluster model"},
	// The key file reload both the membership's keys (cmd/vipgate) and the gateway's conntrack
	// sync relay's keys (gateway/) use: one copy, knowing no key format and no user.
	{"keyreload", nil,
		"reloads a key file on a period and hands changed keys on: generic in what reads and applies them, so the speaker's wiring and the gateway share it"},
	{"bgp", []string{"bgp"},
		"BGP/BFD engine: protocol only, it must not learn about Services (that is the speaker's job)"},
	// Programs: they may import anything in the module, and nothing may import them (Go forbids
	// importing a main package anyway).
	{"cmd", []string{""}, "the binaries wire every layer together"},
	{"deploy", []string{"deploy"}, "deployment helpers (image, dashboards), built apart from the daemon"},
	{"test", []string{""}, "end-to-end tests and labs drive everything"},
}

// within reports whether path is prefix or below it ("" matches everything; "x/" only below x).
func within(path, prefix string) bool {
	switch {
	case prefix == "":
		return true
	case strings.HasSuffix(prefix, "/"):
		return strings.HasPrefix(path, prefix)
	default:
		return path == prefix || strings.HasPrefix(path, prefix+"/")
	}
}

// ruleFor returns the most specific rule for pkg.
func ruleFor(pkg string) (importRule, bool) {
	var best importRule
	found := false
	for _, r := range importRules {
		if within(pkg, r.pkg) && (!found || len(r.pkg) > len(best.pkg)) {
			best, found = r, true
		}
	}
	return best, found
}

// modulePackages returns the module's packages (relative paths) and their direct imports within the
// module (relative paths), read from the non-test files of each directory.
func modulePackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		p, err := build.Default.ImportDir(path, 0)
		if err != nil {
			var noGo *build.NoGoError
			if errors.As(err, &noGo) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		var deps []string
		for _, imp := range p.Imports {
			if imp == modulePath {
				deps = append(deps, "")
			} else if dep, ok := strings.CutPrefix(imp, modulePath+"/"); ok {
				deps = append(deps, dep)
			}
		}
		pkgs[rel] = deps
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's packages: %v", err)
	}
	return pkgs
}

// moduleRoot returns the directory of go.mod, checking that it is this module.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatalf("reading go.mod: %v", err)
	}
	if !strings.Contains(string(b), "module "+modulePath+"\n") {
		t.Fatalf("%s is not the module %s", root, modulePath)
	}
	return root
}

func TestImportRules(t *testing.T) {
	pkgs := modulePackages(t, moduleRoot(t))
	for _, want := range []string{"dataplane", "proxy", "proxy/healthcheck", "dataplane/conntrack", "gateway/ctsync", "dataplane/maglev", "gateway/healthprobe", "gateway", "gateway/natpath", "cluster", "speaker", "membership", "l2", "bgp", "cmd/vipgate"} {
		if _, ok := pkgs[want]; !ok {
			t.Fatalf("package %s not found: the walk is broken", want)
		}
	}
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	slices.Sort(names)
	for _, pkg := range names {
		rule, ok := ruleFor(pkg)
		if !ok {
			t.Errorf("package %s has no import rule: add one to importRules, with why", pkg)
			continue
		}
		// Every module package pkg depends on, directly or not, with the chain that pulls it in.
		via := map[string]string{}
		queue := []string{pkg}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, dep := range pkgs[p] {
				if _, seen := via[dep]; seen || dep == pkg {
					continue
				}
				via[dep] = p
				queue = append(queue, dep)
			}
		}
		for dep := range via {
			if slices.ContainsFunc(rule.allowed, func(a string) bool { return within(dep, a) }) {
				continue
			}
			chain := []string{dep}
			for p := via[dep]; p != pkg; p = via[p] {
				chain = append(chain, p)
			}
			chain = append(chain, pkg)
			slices.Reverse(chain)
			t.Errorf("%s imports %s (%s), which its rule %q forbids: %s",
				pkg, dep, strings.Join(chain, " -> "), rule.pkg, rule.why)
		}
	}
}

// TestImportRulesCatch checks the checker: a dataplane leaf importing the dataplane, or the cluster
// model importing the speaker, is refused.
func TestImportRulesCatch(t *testing.T) {
	for _, c := range []struct{ pkg, dep string }{
		{"proxy/healthcheck", "dataplane"},
		{"proxy/healthcheck", "proxy"},
		{"dataplane", "proxy"},
		{"gateway", "proxy"},
		{"dataplane/conntrack", "dataplane"},
		{"dataplane/maglev", "dataplane"},
		{"gateway/healthprobe", "dataplane"},
		{"gateway/healthprobe", "cluster"},
		{"gateway/ctsync", "cluster"},
		{"gateway/natpath", "dataplane"},
		{"gateway/natpath", "gateway"},
		{"dataplane", "gateway"},
		{"dataplane", "gateway/natpath"},
		{"gateway", "speaker"},
		{"gateway", "l2"},
		{"gateway", "membership"},
		{"cluster", "dataplane"},
		{"cluster/mlbstatus", "speaker"},
		{"dataplane", "speaker"},
		{"speaker", "dataplane"},
		{"speaker", "membership"},
		{"membership", "speaker"},
		{"membership", "cluster"},
		{"l2", "cluster"},
		{"bgp/bfd", "speaker"},
	} {
		rule, ok := ruleFor(c.pkg)
		if !ok {
			t.Errorf("no rule for %s", c.pkg)
			continue
		}
		if slices.ContainsFunc(rule.allowed, func(a string) bool { return within(c.dep, a) }) {
			t.Errorf("rule %q lets %s import %s", rule.pkg, c.pkg, c.dep)
		}
	}
}
