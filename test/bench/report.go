package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// row is one line of the results table: what was measured, vipgate's figure, the figure it is
// compared with (the kernel on its own, a direct path, or kube-proxy on this VM) and how they relate.
type row struct {
	Sub     bool // a detail of the row above
	What    string
	Vipgate string
	Ref     string // "" when there is nothing to compare with
	Ratio   string
}

// table collects rows and prints each one as soon as it is measured, so a long run shows progress
// and an interrupted one still shows what it got.
type table struct {
	rows    []row
	failed  bool
	scaling scaling // the points of the scaling plots
	// extra are markdown blocks printed after the table (the gateway rows' side-by-side tables).
	extra []string
	// gwCPS is the gateway connection-rate row's figures for its plot (nil: not measured).
	gwCPS *gwCPSPlot
}

func (t *table) add(r row) {
	t.rows = append(t.rows, r)
	indent := "  "
	if r.Sub {
		indent = "      "
	}
	fmt.Printf("%s%s: %s", indent, r.What, r.Vipgate)
	if r.Ref != "" {
		fmt.Printf("  | %s", r.Ref)
	}
	if r.Ratio != "" {
		fmt.Printf("  | %s", r.Ratio)
	}
	fmt.Println()
}

// fail records a measurement that could not be made; the run goes on with the others.
func (t *table) fail(what string, err error) {
	t.failed = true
	t.add(row{What: what, Vipgate: "FAILED: " + oneLine(err.Error())})
}

// skip records a measurement that was not made, and why.
func (t *table) skip(what, why string) {
	t.add(row{What: what, Vipgate: "skipped: " + why})
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return strings.ReplaceAll(s, "|", "/")
}

// markdown renders the table.
func (t *table) markdown() string {
	var b strings.Builder
	b.WriteString("| measurement | vipgate | compared with | ratio |\n|---|---|---|---|\n")
	for _, r := range t.rows {
		what := r.What
		if r.Sub {
			what = "↳ " + what
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", what, r.Vipgate, r.Ref, r.Ratio)
	}
	for _, e := range t.extra {
		b.WriteString("\n" + e)
	}
	return b.String()
}

// machineInfo describes where the figures come from: they only compare within one machine.
func machineInfo() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	load, _ := os.ReadFile("/proc/loadavg")
	loadavg := strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " ")
	nft := "nft not installed"
	if out, err := exec.Command("nft", "--version").Output(); err == nil {
		nft = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s, %d CPUs, kernel %s, %s, %s, load average before the run %s",
		cpu, runtime.NumCPU(), strings.TrimSpace(string(kernel)), runtime.Version(), nft, loadavg)
}

// quantile returns the q-quantile (0..1) of ds by the nearest-rank method: for 100 samples p99 is
// the 99th smallest, for 20 samples it is the largest.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// median of float samples (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianDuration of duration samples.
func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(median(xs))
}

// fmtDuration prints a duration with three significant digits in ms or s.
func fmtDuration(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
}

// faster says how many times faster (or slower) vipgate was than the reference (both times).
func faster(vipgate, ref time.Duration) string {
	if vipgate <= 0 || ref <= 0 {
		return ""
	}
	if vipgate > ref {
		return fmt.Sprintf("%.1fx slower", float64(vipgate)/float64(ref))
	}
	return fmt.Sprintf("%.1fx faster", float64(ref)/float64(vipgate))
}

// ratioTarget prints got/ref against a minimum target.
func ratioTarget(got, ref, target float64) string {
	if ref <= 0 {
		return "n/a"
	}
	r := got / ref
	verdict := "meets"
	if r < target {
		verdict = "BELOW"
	}
	return fmt.Sprintf("%.2f, target >= %.2f: %s", r, target, verdict)
}

// thousands prints n with thousands separators: 10000 -> 10,000.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
