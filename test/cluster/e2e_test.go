package testcluster

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// junitFixture is shaped like the report e2e.test writes with --report-dir (Ginkgo v2's JUnit
// reporter with the e2e framework's settings): every spec of the suite is listed, the unselected
// ones as skipped without a reason.
const junitFixture = `<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="7" disabled="4" errors="0" failures="2" time="95.5">
      <testsuite name="Kubernetes e2e suite" package="/work/main/bin" tests="9" disabled="0" skipped="4" errors="0" failures="2" time="95.5" timestamp="2026-11-24T06:30:00">
          <properties>
              <property name="SuiteSucceeded" value="false"></property>
          </properties>
          <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.25"></testcase>
          <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
          <testcase name="[It] [sig-network] Services should be able to up and down services" classname="Kubernetes e2e suite" status="failed" time="40">
              <failure message="" type="failed">[FAILED] service up-down-1 is not up&#xA;In [It] at: k8s.io/kubernetes/test/e2e/network/service.go:1147 @ 11/24/26 06:31:00.000&#xA;</failure>
              <system-err>timeline</system-err>
          </testcase>
          <testcase name="[It] [sig-network] Services should have session affinity timeout work for NodePort service [LinuxOnly]" classname="Kubernetes e2e suite" status="timedout" time="30">
              <failure message="" type="timedout">[TIMEDOUT] A suite timeout occurred</failure>
          </testcase>
          <testcase name="[It] [sig-network] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes" classname="Kubernetes e2e suite" status="skipped" time="0.5">
              <skipped message="skipped - Need at least 3 schedulable nodes for this test"></skipped>
          </testcase>
          <testcase name="[It] [sig-storage] Volumes should store data" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
          <testcase name="[It] [sig-network] Services should work after restarting apiserver [Disruptive]" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
          <testcase name="[It] [sig-network] Services should have a | in its name" classname="Kubernetes e2e suite" status="panicked" time="1">
              <error message="" type="panicked">nil pointer</error>
          </testcase>
          <testcase name="[ReportAfterSuite] Kubernetes e2e JUnit report" classname="Kubernetes e2e suite" status="passed" time="0.01"></testcase>
      </testsuite>
  </testsuites>
`

func TestParseJUnit(t *testing.T) {
	got, err := ParseJUnit(strings.NewReader(junitFixture))
	if err != nil {
		t.Fatal(err)
	}
	want := []E2EResult{
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", State: E2EPassed, Duration: 12500 * time.Millisecond},
		{Name: "[sig-network] Services should be able to up and down services", State: E2EFailed, Duration: 40 * time.Second,
			Message: "[FAILED] service up-down-1 is not up\nIn [It] at: k8s.io/kubernetes/test/e2e/network/service.go:1147 @ 11/24/26 06:31:00.000"},
		{Name: "[sig-network] Services should have session affinity timeout work for NodePort service [LinuxOnly]", State: E2EFailed, Duration: 30 * time.Second,
			Message: "[timedout] [TIMEDOUT] A suite timeout occurred"},
		{Name: "[sig-network] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes", State: E2ESkipped, Duration: 500 * time.Millisecond,
			Message: "Need at least 3 schedulable nodes for this test"},
		{Name: "[sig-network] Services should have a | in its name", State: E2EFailed, Duration: time.Second, Message: "[panicked] nil pointer"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseJUnit:\n got %+v\nwant %+v", got, want)
	}
	if tot := Totals(got); tot != (E2ETotals{Passed: 1, Failed: 3, Skipped: 1}) {
		t.Errorf("Totals = %v", tot)
	}
}

// TestParseJUnitFile parses a real report when E2E_JUNIT names one, e.g. from a dry run:
//
//	e2e.test --provider=skeleton --kubeconfig=/dev/null --report-dir=/tmp/r --ginkgo.dry-run \
//	  --ginkgo.focus='\[sig-network\] (Services|LoadBalancers)' --ginkgo.skip='\[Disruptive\]|\[Serial\]'
func TestParseJUnitFile(t *testing.T) {
	path := os.Getenv("E2E_JUNIT")
	if path == "" {
		t.Skip("E2E_JUNIT not set")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := ParseJUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if strings.HasPrefix(r.Name, "[") && !strings.HasPrefix(r.Name, "[sig-") && r.State != E2EFailed {
			t.Errorf("suite node kept: %+v", r)
		}
	}
	t.Logf("%d results: %v", len(res), Totals(res))
}

func TestParseJUnitSetupFailure(t *testing.T) {
	const report = `<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" status="failed" time="300"><failure type="failed">[FAILED] Error waiting for all pods to be running and ready</failure></testcase>
<testcase name="[It] [sig-network] Services should serve multiport endpoints from pods [Conformance]" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>`
	got, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "[SynchronizedBeforeSuite]" || got[0].State != E2EFailed {
		t.Errorf("got %+v, want only the failed suite setup", got)
	}
}

func TestParseJUnitGarbage(t *testing.T) {
	if _, err := ParseJUnit(strings.NewReader("no xml here")); err == nil {
		t.Error("no error for a report that is not XML")
	}
}

func TestCompareAndRegressions(t *testing.T) {
	kp := []E2EResult{
		{Name: "b", State: E2EPassed},
		{Name: "a", State: E2EPassed},
		{Name: "c", State: E2EFailed},
		{Name: "d", State: E2EPassed},
		{Name: "x|y", State: E2ESkipped},
	}
	vg := []E2EResult{
		{Name: "a", State: E2EPassed},
		{Name: "b", State: E2EFailed},
		{Name: "c", State: E2EPassed},
		{Name: "e", State: E2EPassed},
		{Name: "x|y", State: E2ESkipped},
	}
	want := `| test | kube-proxy | vipgate |
|---|---|---|
| a | passed | passed |
| b | passed | **failed** |
| c | failed | **passed** |
| d | passed | **-** |
| e | - | **passed** |
| x\|y | skipped | skipped |

Totals: kube-proxy 3 passed, 1 failed, 1 skipped; vipgate 3 passed, 1 failed, 1 skipped.
`
	if got := CompareTable(kp, vg); got != want {
		t.Errorf("CompareTable:\n%s\nwant:\n%s", got, want)
	}
	if got := Regressions(kp, vg); !slices.Equal(got, []string{"b", "d"}) {
		t.Errorf("Regressions = %q, want [b d]", got)
	}
	if got := Regressions(kp, kp); len(got) != 0 {
		t.Errorf("Regressions of a run against itself = %q", got)
	}
}

func TestE2EArgs(t *testing.T) {
	args := E2EArgs(E2EOptions{
		Kubeconfig: "/k/admin.conf", ReportDir: "/r", NumNodes: 2,
		Focus: `\[sig-network\] Services`, Skip: `\[Disruptive\]`, LabelFilter: "!Slow",
		Kubectl: "/bin/kubectl", ExtraArgs: []string{"--ginkgo.v"},
	}, 2*time.Hour)
	for _, want := range []string{
		"--provider=skeleton", "--kubeconfig=/k/admin.conf", "--report-dir=/r", "--e2e-output-dir=/r",
		"--num-nodes=2", `--ginkgo.focus=\[sig-network\] Services`, `--ginkgo.skip=\[Disruptive\]`,
		"--ginkgo.label-filter=!Slow", "--kubectl-path=/bin/kubectl", "--ginkgo.timeout=2h0m0s",
		"--disable-log-dump=true", "--dump-logs-on-failure=false",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("E2EArgs lacks %q: %q", want, args)
		}
	}
	if args[len(args)-1] != "--ginkgo.v" {
		t.Errorf("extra args not last: %q", args)
	}
	args = E2EArgs(E2EOptions{Kubeconfig: "k", ReportDir: "r"}, time.Hour)
	for _, a := range args {
		if strings.HasPrefix(a, "--num-nodes") || strings.HasPrefix(a, "--ginkgo.focus") || strings.HasPrefix(a, "--kubectl-path") {
			t.Errorf("unset option produced %q", a)
		}
	}
}

// fakeE2E writes a shell script that behaves like e2e.test as far as RunE2E can tell: it writes
// the fixture report into --report-dir (unless told not to) and exits 1 like a run with failures.
func fakeE2E(t *testing.T, writeReport bool) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "report.xml"), []byte(junitFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"fake e2e.test $*\"\n"
	if writeReport {
		script += `for a in "$@"; do case "$a" in --report-dir=*) cp "` + filepath.Join(dir, "report.xml") + `" "${a#--report-dir=}/junit_01.xml";; esac; done` + "\n"
	}
	script += "exit 1\n"
	bin := filepath.Join(dir, "e2e.test")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestRunE2E(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	reportDir := filepath.Join(t.TempDir(), "report")
	var log strings.Builder
	res, err := RunE2E(context.Background(), E2EOptions{
		Binary: fakeE2E(t, true), Kubeconfig: "/nonexistent/admin.conf", ReportDir: reportDir,
		Focus: "Services", Log: &log,
	})
	if err != nil {
		t.Fatalf("RunE2E: %v\n%s", err, log.String())
	}
	if len(res) != 5 || res[0].State != E2EPassed {
		t.Errorf("results: %+v", res)
	}
	if !strings.Contains(log.String(), "fake e2e.test --provider=skeleton") || !strings.Contains(log.String(), "--ginkgo.focus=Services") {
		t.Errorf("log lacks the command's output:\n%s", log.String())
	}

	// No report: an error, also when an old report was left in the directory.
	_, err = RunE2E(context.Background(), E2EOptions{Binary: fakeE2E(t, false), Kubeconfig: "k", ReportDir: reportDir})
	if err == nil {
		t.Error("no error from a run that wrote no report")
	}
	if _, err := RunE2E(context.Background(), E2EOptions{Binary: "/nonexistent/e2e.test", Kubeconfig: "k", ReportDir: reportDir}); err == nil {
		t.Error("no error for a missing binary")
	}
}

// TestRunE2EDryRun runs the real e2e.test (E2E_BINARY) as a Ginkgo dry run: no cluster needed,
// every selected spec "passes". It checks the flags are accepted and the selection.
func TestRunE2EDryRun(t *testing.T) {
	bin := os.Getenv("E2E_BINARY")
	if bin == "" {
		t.Skip("E2E_BINARY not set")
	}
	var log strings.Builder
	res, err := RunE2E(context.Background(), E2EOptions{
		Binary: bin, Kubeconfig: "/dev/null", ReportDir: t.TempDir(), NumNodes: 2,
		Focus: `\[sig-network\] (Services|LoadBalancers)`, Skip: `\[Disruptive\]|\[Serial\]`,
		ExtraArgs: []string{"--ginkgo.dry-run"}, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// v1.36.3: 51 Services + 17 LoadBalancers specs, 2 [Disruptive] and 1 [Serial] skipped.
	if tot := Totals(res); tot != (E2ETotals{Passed: 65}) {
		t.Errorf("dry run: %v, want 65 passed\n%s", tot, log.String())
	}
}
