package grafana

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/l2"
	"github.com/vipgate/vipgate/membership"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/speaker"
)

// dashboardFile is the one copy of the dashboard: the Helm chart embeds it with .Files.Get, which
// cannot reach outside the chart.
const dashboardFile = "../helm/vipgate/dashboards/vipgate.json"

// component is one set of collectors of a vipgate process, registered by the constructor the binary
// calls (wiredBy, a call in cmd/vipgate).
type component struct {
	name     string
	wiredBy  string
	register func(t *testing.T, reg prometheus.Registerer)
}

var components = []component{
	{"process (nodeRegistry)", "collectors.NewGoCollector", func(t *testing.T, reg prometheus.Registerer) {
		must(t, reg.Register(collectors.NewGoCollector()))
		must(t, reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})))
	}},
	{"dataplane", "proxy.NewMetrics", func(t *testing.T, reg prometheus.Registerer) {
		_, err := proxy.NewMetrics(reg)
		must(t, err)
	}},
	{"dataplane changes", "proxy.NewChangeMetrics", func(t *testing.T, reg prometheus.Registerer) {
		_, err := proxy.NewChangeMetrics(reg)
		must(t, err)
	}},
	{"l2", "l2.New", func(t *testing.T, reg prometheus.Registerer) {
		a, err := l2.New(nil, reg, l2.Options{})
		must(t, err)
		t.Cleanup(func() { a.Close() })
	}},
	{"membership", "RegisterMetrics", func(t *testing.T, reg prometheus.Registerer) {
		m := newMembersInNetns(t)
		must(t, m.RegisterMetrics(reg))
	}},
	{"l2 owners", "speaker.RegisterOwnerMetrics", func(t *testing.T, reg prometheus.Registerer) {
		must(t, speaker.RegisterOwnerMetrics(reg))
	}},
	{"bgp", "bgp.New", func(t *testing.T, reg prometheus.Registerer) {
		// Port -1: GoBGP listens nowhere; BFD opens sockets only with its first session.
		s, err := bgp.New(hclog.NewNullLogger(), reg, netip.MustParseAddr("192.0.2.1"), -1)
		must(t, err)
		t.Cleanup(func() { _ = s.Stop(context.Background()) })
	}},
	{"controller pools", "cluster.NewPoolMetrics", func(t *testing.T, reg prometheus.Registerer) {
		_, err := cluster.NewPoolMetrics(reg)
		must(t, err)
	}},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newMembersInNetns creates the membership in a network namespace of its own: membership.New binds
// its UDP port, which must not happen in the machine's namespace. The thread that entered the
// namespace stays locked and exits with its goroutine, so nothing else runs in it.
func newMembersInNetns(t *testing.T) *membership.Members {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace (membership.New binds a UDP port)")
	}
	type result struct {
		m   *membership.Members
		err error
	}
	ch := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: err}
			return
		}
		m, err := membership.New(hclog.NewNullLogger(), "node1", membership.Options{Insecure: true})
		ch <- result{m, err}
	}()
	r := <-ch
	must(t, r.err)
	t.Cleanup(func() { r.m.Close() })
	return r.m
}

// recorder registers on a real registry (so name clashes fail as in the binary) and keeps the
// collectors to describe them.
type recorder struct {
	*prometheus.Registry
	cs []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.cs = append(r.cs, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredNames returns every metric name the collectors describe. Describe rather than Gather:
// a vector with no series yet (no BGP peer, no rejected Service) gathers nothing but exists.
func registeredNames(t *testing.T, r *recorder) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// Dashboard is the part of Grafana's dashboard model the test reads.
type Dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []Panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *Datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type Panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *Datasource              `json:"datasource"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Targets    []struct {
		Expr       string      `json:"expr"`
		RefID      string      `json:"refId"`
		Datasource *Datasource `json:"datasource"`
	} `json:"targets"`
	Panels []Panel `json:"panels"`
}

type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func loadDashboard(t *testing.T) Dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	must(t, err)
	var d Dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows (a collapsed row holds its panels).
func allPanels(ps []Panel) []Panel {
	var out []Panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboardSchema checks what Grafana needs to import the dashboard anywhere: a current schema,
// a stable uid, the data source as a variable (no data source uid of ours baked in), every panel and
// query on it, unique panel ids, and panels on the 24-column grid.
func TestDashboardSchema(t *testing.T) {
	d := loadDashboard(t)
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q: want ≥ 36 and both set", d.SchemaVersion, d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s does not query ${datasource}", v.Name)
		}
	}
	if vars["datasource"] != "datasource" || vars["instance"] != "query" {
		t.Errorf("variables %v: want datasource (a data source) and instance (the nodes)", vars)
	}
	ids := map[int]bool{}
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v off the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" || q.RefID == "" || q.Datasource == nil || q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: query %q (ref %q) without an expression, a refId or ${datasource}", p.Title, q.Expr, q.RefID)
			}
		}
	}
}

// TestDashboardMetricsExist checks that every metric the dashboard queries is one that vipgate's
// collectors register, as the binary registers them (the same constructors, on one registry per
// process kind so that clashing names fail here too).
func TestDashboardMetricsExist(t *testing.T) {
	r := &recorder{Registry: prometheus.NewRegistry()}
	for _, c := range components {
		c.register(t, r)
	}
	registered := registeredNames(t, r)

	d := loadDashboard(t)
	used := map[string][]string{} // metric -> panels
	for _, p := range allPanels(d.Panels) {
		for _, q := range p.Targets {
			names, err := promqlMetrics(q.Expr)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
			}
			for _, n := range names {
				used[n] = append(used[n], p.Title)
			}
		}
	}
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			used[m[1]] = append(used[m[1]], "variable "+v.Name)
		}
	}
	if len(used) < 20 {
		t.Fatalf("found only %d metrics in the dashboard: is the expression reader broken?", len(used))
	}
	for n, panels := range used {
		if !exists(registered, n) {
			t.Errorf("%s (panels %q) is not a metric vipgate registers", n, panels)
		}
	}
	var unused []string
	for n := range registered {
		if strings.HasPrefix(n, "vipgate_") && len(used[n]) == 0 && len(used[n+"_bucket"]) == 0 && len(used[n+"_count"]) == 0 {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	t.Logf("vipgate metrics not on the dashboard: %v", unused)
}

// exists reports whether n is a registered name, or a histogram's or summary's series of one.
func exists(registered map[string]bool, n string) bool {
	if registered[n] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, suf); ok && registered[b] {
			return true
		}
	}
	return false
}

// TestDashboardCollectorsWired checks that cmd/vipgate calls each constructor the test registers,
// so the metrics exist in the binary and not only here. A constructor not called yet is reported as
// a skip that names it.
func TestDashboardCollectorsWired(t *testing.T) {
	calls := callsIn(t, "../../cmd/vipgate")
	for _, c := range components {
		t.Run(c.name, func(t *testing.T) {
			if !calls[c.wiredBy] {
				t.Skipf("pending: cmd/vipgate does not call %s yet, so its metrics are not served", c.wiredBy)
			}
		})
	}
}

// callsIn lists the functions called in the non-test files of dir, as "pkg.Func" and, for method
// calls, "Method".
func callsIn(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	must(t, err)
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		must(t, err)
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
				out[sel.Sel.Name] = true
				if id, ok := sel.X.(*ast.Ident); ok {
					out[id.Name+"."+sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	return out
}

var (
	labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	// What is not a metric name: strings, label matchers, ranges and the label lists of by(),
	// without(), on(), ignoring(), group_left() and group_right().
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\[\]]*\]`)
	promLabelSel = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promTokens   = regexp.MustCompile(`\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[a-zA-Z_:][a-zA-Z0-9_:]*|\S`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "inf", "nan", "Inf", "NaN"}
)

// promqlMetrics returns the metric names a PromQL expression selects: every identifier that is not
// a function or aggregation (followed by "("), a keyword or a label name.
func promqlMetrics(expr string) ([]string, error) {
	s := promStrings.ReplaceAllString(expr, `""`)
	if strings.Count(s, "(") != strings.Count(s, ")") || strings.Count(s, "{") != strings.Count(s, "}") {
		return nil, &exprError{expr, "unbalanced brackets"}
	}
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	s = promLabelSel.ReplaceAllString(s, " ")
	toks := promTokens.FindAllString(s, -1)
	var out []string
	for i, tok := range toks {
		if !regexp.MustCompile(`^[a-zA-Z_:]`).MatchString(tok) || slices.Contains(promKeywords, tok) {
			continue
		}
		if i+1 < len(toks) && toks[i+1] == "(" {
			continue // a function or an aggregation
		}
		out = append(out, tok)
	}
	if len(out) == 0 {
		return nil, &exprError{expr, "selects no metric"}
	}
	return out, nil
}

type exprError struct{ expr, why string }

func (e *exprError) Error() string { return "expression " + e.expr + ": " + e.why }

func TestPromqlMetrics(t *testing.T) {
	for expr, want := range map[string]string{
		`histogram_quantile(0.99, sum by (le, instance) (rate(vipgate_sync_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`: "vipgate_sync_duration_seconds_bucket",
		`time() - vipgate_last_sync_timestamp_seconds{instance=~"a|b"}`:                                                                         "vipgate_last_sync_timestamp_seconds",
		`sum by (pool) (a_in_use) / on(pool) group_left sum by (pool) (a_total)`:                                                                "a_in_use a_total",
		`vipgate_bgp_session_state{state="established"} == 1`:                                                                                   "vipgate_bgp_session_state",
		`sum(increase(x_total{change="taken",reason="moved"}[5m])) or vector(0)`:                                                                "x_total",
	} {
		got, err := promqlMetrics(expr)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("promqlMetrics(%s) = %v, %v; want %s", expr, got, err, want)
		}
	}
}
