package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	testcluster "github.com/vipgate/vipgate/test/cluster"
)

// conformance runs the same e2e test list against each proxy, each in a fresh cluster built the
// same way, and writes the comparison table.
func conformance(args []string) error {
	fs := flag.NewFlagSet("conformance", flag.ExitOnError)
	dir := fs.String("dir", filepath.Join(defaultDir(), "..", "conformance"), "work directory (reports, logs)")
	focus := fs.String("focus", `\[sig-network\] (Services|LoadBalancers)`, "ginkgo focus")
	kpFocus := fs.String("kube-proxy-focus", `\[sig-network\] Services`, "ginkgo focus of the kube-proxy run: kube-proxy alone allocates and announces no LoadBalancer IPs, so the LoadBalancers tests cannot pass there")
	skip := fs.String("skip", `\[Disruptive\]`, "ginkgo skip (Disruptive: the API server here is not a pod, and the kube-proxy restart test restarts kube-proxy's pods)")
	proxies := fs.String("proxies", "vipgate,kube-proxy", "proxies to compare, in order")
	nodes := fs.Int("nodes", 3, "worker nodes (one Services test needs 3)")
	cni := fs.String("cni", "", "pod network of every cluster: bridge (default) or flannel")
	bin := fs.String("bin", "", "directory of the binaries and images (default: the module's bin/)")
	out := fs.String("out", "", "markdown file for the comparison table (default: stdout only)")
	var from multiFlag
	fs.Var(&from, "from", "PROXY=results.json: start from an earlier run's results for PROXY (repeatable); tests run now replace them by name")
	run := fs.String("run", "", "proxies to run now (default: every one of --proxies without --from)")
	_ = fs.Parse(args)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logf := func(format string, a ...any) {
		fmt.Printf("%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
	results := map[string][]testcluster.E2EResult{}
	order := strings.Split(*proxies, ",")
	for _, f := range from {
		proxy, file, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("--from %q: want PROXY=FILE", f)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var res []testcluster.E2EResult
		if err := json.Unmarshal(b, &res); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		results[proxy] = res
	}
	toRun := order
	if *run != "" {
		toRun = strings.Split(*run, ",")
	} else if len(from) > 0 {
		toRun = nil
		for _, p := range order {
			if _, ok := results[p]; !ok {
				toRun = append(toRun, p)
			}
		}
	}
	for _, proxy := range toRun {
		work := filepath.Join(*dir, proxy)
		_ = os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o755); err != nil {
			return err
		}
		f := *focus
		if proxy == testcluster.ProxyKubeProxy {
			f = *kpFocus
		}
		res, err := runOne(ctx, testcluster.Spec{Nodes: *nodes, Proxy: proxy, CNI: *cni, BinDir: *bin, WorkDir: filepath.Join(work, "cluster"), Logf: logf},
			f, *skip, work)
		if err != nil {
			return fmt.Errorf("%s: %w", proxy, err)
		}
		results[proxy] = mergeResults(results[proxy], res)
		b, _ := json.MarshalIndent(res, "", "  ")
		_ = os.WriteFile(filepath.Join(work, "results.json"), b, 0o644)
		logf("%s: %s", proxy, summary(res))
	}
	var table string
	if len(order) == 2 {
		table = testcluster.CompareTable(results[order[0]], results[order[1]])
		if order[0] != testcluster.ProxyKubeProxy {
			table = testcluster.CompareTable(results[order[1]], results[order[0]])
		}
	}
	fmt.Println(table)
	if *out != "" {
		cniNote := ""
		if *cni != "" && *cni != testcluster.CNIBridge {
			cniNote = fmt.Sprintf(", pod network %s (`make conformance CNI=%s`)", *cni, *cni)
		}
		header := fmt.Sprintf("# Upstream e2e: `%s`\n\nMeasured %s with `make conformance` (Kubernetes %s, e2e.test of the same version, %d nodes%s; a fresh cluster per proxy, built the same way; skipped: `%s`).\n\n"+
			"- kube-proxy ran `%s`: on its own it allocates and announces no LoadBalancer IPs, so the LoadBalancers tests cannot pass with it and show \"-\".\n"+
			"- \"skipped\" is the suite's own skip (e.g. a test that needs more nodes or a cloud provider).\n\n",
			*focus, time.Now().UTC().Format("2006-01-02"), k8sVersion(), *nodes, cniNote, *skip, *kpFocus)
		if err := os.WriteFile(*out, []byte(header+table+"\n"), 0o644); err != nil {
			return err
		}
	}
	if len(order) == 2 {
		kp, vg := results[testcluster.ProxyKubeProxy], results[testcluster.ProxyVipgate]
		if reg := testcluster.Regressions(kp, vg); len(reg) > 0 {
			return fmt.Errorf("vipgate fails %d tests kube-proxy passes:\n  %s", len(reg), strings.Join(reg, "\n  "))
		}
	}
	return nil
}

func runOne(ctx context.Context, spec testcluster.Spec, focus, skip, work string) ([]testcluster.E2EResult, error) {
	c, err := testcluster.Up(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	logFile, err := os.Create(filepath.Join(work, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	return c.RunE2E(ctx, testcluster.E2EOptions{Focus: focus, Skip: skip, ReportDir: filepath.Join(work, "report"), Log: logFile})
}

func summary(res []testcluster.E2EResult) string {
	n := map[string]int{}
	for _, r := range res {
		n[r.State]++
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", n["passed"], n["failed"], n["skipped"])
}

func k8sVersion() string {
	if v := os.Getenv("K8S_VERSION"); v != "" {
		return v
	}
	return "v1.36.3"
}

// mergeResults overlays newer results on older ones, by test name.
func mergeResults(old, newer []testcluster.E2EResult) []testcluster.E2EResult {
	idx := map[string]int{}
	out := append([]testcluster.E2EResult(nil), old...)
	for i, r := range out {
		idx[r.Name] = i
	}
	for _, r := range newer {
		if i, ok := idx[r.Name]; ok {
			out[i] = r
		} else {
			out = append(out, r)
		}
	}
	return out
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }
