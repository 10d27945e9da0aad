package testcluster

// Running the upstream Kubernetes e2e suite (e2e.test) against the cluster, and comparing runs.
// E2E-NOTES.md explains the flags chosen here and which tests need what.

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// E2EResult is the outcome of one e2e spec.
type E2EResult struct {
	// Name is the spec's full text, e.g. "[sig-network] Services should serve a basic endpoint
	// from pods [Conformance]" (the leading "[It] " of the JUnit report removed). Failed suite
	// setup and teardown nodes are reported under their node type, e.g. "[SynchronizedBeforeSuite]".
	Name string
	// State is "passed", "failed" or "skipped". Ginkgo's timedout, interrupted, aborted and panicked
	// are failures; pending is skipped.
	State    string
	Duration time.Duration
	// Message is the skip reason or the failure description (shortened).
	Message string
}

// Result states.
const (
	E2EPassed  = "passed"
	E2EFailed  = "failed"
	E2ESkipped = "skipped"
)

// E2EOptions configures one run of e2e.test.
type E2EOptions struct {
	Binary     string // path of e2e.test
	Netns      string // network namespace to run it in (ip netns exec); "" runs it where we are
	Kubeconfig string // admin kubeconfig
	// Focus, Skip and LabelFilter select the specs (--ginkgo.focus, --ginkgo.skip,
	// --ginkgo.label-filter). Focus and Skip are regular expressions on the full spec text.
	Focus, Skip, LabelFilter string
	ReportDir                string // junit_01.xml and other output go here (created if missing)
	NumNodes                 int    // --num-nodes; 0 lets the suite count schedulable nodes
	// Kubectl is the kubectl binary the suite runs for `kubectl exec` (most Services tests need it).
	// "" uses a kubectl next to Binary if there is one, else "kubectl" from PATH.
	Kubectl string
	// Timeout is the whole suite's limit (--ginkgo.timeout; Ginkgo's default is 1h, too short for
	// all Services tests in series). 0 uses the context's deadline if it has one, else 3h.
	Timeout   time.Duration
	ExtraArgs []string  // appended last, so they override the flags above
	Log       io.Writer // e2e.test's stdout and stderr; nil discards them
}

// E2EJUnitFile is the report e2e.test writes into --report-dir (junit_<report-prefix>01.xml).
const E2EJUnitFile = "junit_01.xml"

// E2EArgs returns e2e.test's command line arguments for opt (without the binary).
func E2EArgs(opt E2EOptions, timeout time.Duration) []string {
	args := []string{
		// A cluster without a cloud provider: "skeleton" (the NullProvider; also the default when
		// --provider is unset). Not "local": that one claims SSH access to nodes.
		"--provider=skeleton",
		"--kubeconfig=" + opt.Kubeconfig,
		"--report-dir=" + opt.ReportDir,
		"--e2e-output-dir=" + opt.ReportDir,
		// No cluster/log-dump/log-dump.sh after the suite, no namespace dumps on failures (the
		// failure itself is in the report; the harness collects node logs itself).
		"--disable-log-dump=true",
		"--dump-logs-on-failure=false",
		// Wait for kube-system pods (CoreDNS, vipgate or kube-proxy) and daemonsets, but not for
		// Ginkgo's default 10 minutes.
		"--system-pods-startup-timeout=5m",
		"--system-daemonsets-startup-timeout=5m",
		"--node-schedulable-timeout=5m",
		"--ginkgo.timeout=" + timeout.String(),
		"--ginkgo.no-color",
		"--ginkgo.silence-skips",
	}
	if opt.Kubectl != "" {
		args = append(args, "--kubectl-path="+opt.Kubectl)
	}
	if opt.NumNodes > 0 {
		args = append(args, "--num-nodes="+strconv.Itoa(opt.NumNodes))
	}
	if opt.Focus != "" {
		args = append(args, "--ginkgo.focus="+opt.Focus)
	}
	if opt.Skip != "" {
		args = append(args, "--ginkgo.skip="+opt.Skip)
	}
	if opt.LabelFilter != "" {
		args = append(args, "--ginkgo.label-filter="+opt.LabelFilter)
	}
	return append(args, opt.ExtraArgs...)
}

// RunE2E runs e2e.test (in opt.Netns), streams its output to opt.Log and returns the results from
// its JUnit report. Failed tests make e2e.test exit non-zero; that is not an error here. The error
// is for a run that could not start or did not write a report.
func RunE2E(ctx context.Context, opt E2EOptions) ([]E2EResult, error) {
	if opt.Binary == "" || opt.ReportDir == "" || opt.Kubeconfig == "" {
		return nil, errors.New("e2e: Binary, Kubeconfig and ReportDir are required")
	}
	if _, err := os.Stat(opt.Binary); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	if err := os.MkdirAll(opt.ReportDir, 0o755); err != nil {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	report := filepath.Join(opt.ReportDir, E2EJUnitFile)
	// A report left by an earlier run must not pass for this run's.
	if err := os.Remove(report); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("e2e: %w", err)
	}
	if opt.Kubectl == "" {
		if k := filepath.Join(filepath.Dir(opt.Binary), "kubectl"); isExecutable(k) {
			opt.Kubectl = k
		}
	}
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = 3 * time.Hour
		if dl, ok := ctx.Deadline(); ok {
			// Leave Ginkgo a minute to clean up and write the report before we interrupt it.
			timeout = max(time.Until(dl)-time.Minute, time.Minute)
		}
	}
	args := E2EArgs(opt, timeout)
	name := opt.Binary
	if opt.Netns != "" {
		args = append([]string{"netns", "exec", opt.Netns, opt.Binary}, args...)
		name = "ip"
	}
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = opt.ReportDir
	// On cancellation interrupt rather than kill: Ginkgo then runs the cleanup nodes (deleting the
	// test namespaces) and still writes the report. `ip netns exec` execs the binary, so the
	// signal reaches e2e.test itself.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 90 * time.Second
	fmt.Fprintf(log, "e2e: %s %s\n", name, strings.Join(args, " "))
	runErr := cmd.Run()
	var exitErr *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exitErr) {
		return nil, fmt.Errorf("e2e: running %s: %w", opt.Binary, runErr)
	}
	f, err := os.Open(report)
	if err != nil {
		if runErr != nil {
			return nil, fmt.Errorf("e2e: %s failed (%v) without writing a report: %w", opt.Binary, runErr, err)
		}
		return nil, fmt.Errorf("e2e: no report: %w", err)
	}
	defer f.Close()
	res, err := ParseJUnit(f)
	if err != nil {
		return nil, fmt.Errorf("e2e: %s: %w", report, err)
	}
	return res, nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// The parts of Ginkgo's JUnit report (reporters.JUnitTestSuites) that we read.
type junitTestSuites struct {
	XMLName    xml.Name         `xml:"testsuites"`
	TestSuites []junitTestSuite `xml:"testsuite"`
}

type junitTestSuite struct {
	TestCases []junitTestCase `xml:"testcase"`
}

type junitTestCase struct {
	Name    string        `xml:"name,attr"`
	Status  string        `xml:"status,attr"`
	Time    float64       `xml:"time,attr"`
	Skipped *junitMessage `xml:"skipped"`
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
}

type junitMessage struct {
	Message     string `xml:"message,attr"`
	Type        string `xml:"type,attr"`
	Description string `xml:",chardata"`
}

// maxE2EMessage bounds E2EResult.Message (a failure description can hold a whole timeline).
const maxE2EMessage = 2000

// ParseJUnit reads the JUnit XML report Ginkgo writes (e2e.test's junit_01.xml) and returns one
// result per spec, in report order. Specs that were not selected (the focus, skip and label
// filters) appear in the report as skipped without a reason; they are left out. Suite nodes
// ([SynchronizedBeforeSuite], [ReportAfterSuite] ...) are kept only when they did not pass.
func ParseJUnit(r io.Reader) ([]E2EResult, error) {
	var doc junitTestSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("parsing JUnit report: %w", err)
	}
	var out []E2EResult
	for _, s := range doc.TestSuites {
		for _, tc := range s.TestCases {
			res, keep := junitResult(tc)
			if keep {
				out = append(out, res)
			}
		}
	}
	return out, nil
}

func junitResult(tc junitTestCase) (E2EResult, bool) {
	name, isIt := strings.CutPrefix(tc.Name, "[It] ")
	res := E2EResult{
		Name:     strings.TrimSpace(name),
		Duration: time.Duration(tc.Time * float64(time.Second)),
	}
	switch {
	case tc.Status == "passed" || (tc.Status == "" && tc.Skipped == nil && tc.Failure == nil && tc.Error == nil):
		res.State = E2EPassed
	case tc.Status == "skipped" || tc.Status == "pending" || (tc.Status == "" && tc.Skipped != nil):
		res.State = E2ESkipped
		msg := ""
		if tc.Skipped != nil {
			msg = tc.Skipped.Message
		}
		if msg == "skipped" || msg == "" {
			return res, false // not selected by the filters (or not run after a suite failure)
		}
		res.Message = shorten(strings.TrimPrefix(msg, "skipped - "))
	default: // failed, timedout, interrupted, aborted, panicked
		res.State = E2EFailed
		var msg string
		for _, m := range []*junitMessage{tc.Failure, tc.Error} {
			if m == nil {
				continue
			}
			msg = strings.TrimSpace(m.Description)
			if msg == "" {
				msg = m.Message
			}
			if tc.Status != "failed" && tc.Status != "" {
				msg = "[" + tc.Status + "] " + msg
			}
			break
		}
		res.Message = shorten(msg)
	}
	// Suite nodes ([SynchronizedBeforeSuite], [ReportAfterSuite] [sig-testing] Log Check ...) are
	// not tests; they matter only when they failed.
	if !isIt && res.State != E2EFailed {
		return res, false
	}
	return res, true
}

func shorten(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= maxE2EMessage {
		return s
	}
	return s[:maxE2EMessage] + " …"
}

// E2ETotals counts results by state.
type E2ETotals struct{ Passed, Failed, Skipped int }

// Totals counts results by state.
func Totals(rs []E2EResult) E2ETotals {
	var t E2ETotals
	for _, r := range rs {
		switch r.State {
		case E2EPassed:
			t.Passed++
		case E2EFailed:
			t.Failed++
		default:
			t.Skipped++
		}
	}
	return t
}

func (t E2ETotals) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", t.Passed, t.Failed, t.Skipped)
}

func byName(rs []E2EResult) map[string]E2EResult {
	m := make(map[string]E2EResult, len(rs))
	for _, r := range rs {
		m[r.Name] = r
	}
	return m
}

// CompareTable renders a markdown table of both runs, one row per test sorted by name, followed
// by each run's totals. A test missing from a run shows as "-". A vipgate state that differs from
// kube-proxy's is in bold.
func CompareTable(kubeProxy, vipgate []E2EResult) string {
	kp, vg := byName(kubeProxy), byName(vipgate)
	names := make([]string, 0, len(kp)+len(vg))
	for n := range kp {
		names = append(names, n)
	}
	for n := range vg {
		if _, ok := kp[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	state := func(m map[string]E2EResult, n string) string {
		if r, ok := m[n]; ok {
			return r.State
		}
		return "-"
	}
	var b strings.Builder
	b.WriteString("| test | kube-proxy | vipgate |\n|---|---|---|\n")
	for _, n := range names {
		k, v := state(kp, n), state(vg, n)
		if v != k {
			v = "**" + v + "**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", mdEscape(n), k, v)
	}
	fmt.Fprintf(&b, "\nTotals: kube-proxy %s; vipgate %s.\n", Totals(kubeProxy), Totals(vipgate))
	return b.String()
}

func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Regressions lists, sorted, the tests kube-proxy passed and vipgate did not (failed, skipped or
// not run).
func Regressions(kubeProxy, vipgate []E2EResult) []string {
	vg := byName(vipgate)
	var out []string
	for n, r := range byName(kubeProxy) {
		if r.State == E2EPassed && vg[n].State != E2EPassed {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
