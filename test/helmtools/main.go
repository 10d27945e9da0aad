// Command helmrender renders a Helm chart the way `helm template` does, with Helm's own Go library,
// so that vipgate's tests can check deploy/helm/vipgate without a helm binary. It lives in its own
// module so that the main module does not take on Helm's dependency tree.
//
//	go run . -chart ../../deploy/helm/vipgate -namespace vipgate-system [-f values.yaml]... [-lint]
//
// The rendered manifests go to standard output as one multi-document YAML stream, ordered by
// template path; NOTES.txt is left out (it is not a manifest). With -lint, Helm's chart linter runs
// first and any error-level finding fails the command.
package main

import (
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// valueFiles collects repeated -f flags.
type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "helmrender:", err)
		os.Exit(1)
	}
}

func run() error {
	var files valueFiles
	chartDir := flag.String("chart", "", "chart directory")
	namespace := flag.String("namespace", "default", "release namespace")
	name := flag.String("name", "vipgate", "release name")
	doLint := flag.Bool("lint", false, "run Helm's chart linter first; error-level findings fail")
	flag.Var(&files, "f", "values file (repeatable; later files win)")
	flag.Parse()
	if *chartDir == "" {
		return fmt.Errorf("-chart is required")
	}

	vals := map[string]any{}
	for _, f := range files {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			return fmt.Errorf("reading values %s: %w", f, err)
		}
		vals = chartutil.CoalesceTables(v, vals) // the later file (already in vals) wins
	}

	if *doLint {
		res := lint.All(*chartDir, vals, *namespace, false)
		failed := false
		for _, m := range res.Messages {
			fmt.Fprintln(os.Stderr, "lint:", m)
			if m.Severity >= support.ErrorSev {
				failed = true
			}
		}
		if failed {
			return fmt.Errorf("chart %s: lint errors", *chartDir)
		}
	}

	chrt, err := loader.Load(*chartDir)
	if err != nil {
		return fmt.Errorf("loading chart %s: %w", *chartDir, err)
	}
	opts := chartutil.ReleaseOptions{Name: *name, Namespace: *namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return fmt.Errorf("composing values: %w", err)
	}
	out, err := engine.Render(chrt, rv)
	if err != nil {
		return fmt.Errorf("rendering chart %s: %w", *chartDir, err)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		base := path.Base(n)
		if base == "NOTES.txt" || strings.HasPrefix(base, "_") || strings.TrimSpace(out[n]) == "" {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, strings.TrimSpace(out[n]))
	}
	_, err = os.Stdout.WriteString(b.String())
	return err
}
