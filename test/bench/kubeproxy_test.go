package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// kube-proxy must get the very Services vipgate's rows program: the objects the driver reads have the
// same mix, node ports and endpoints as the synthetic state.
func TestKubeObjectsMix(t *testing.T) {
	const n = 1000
	file := filepath.Join(t.TempDir(), "objects.json")
	if err := writeKubeObjects(file, n, 10); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got mix
	nodePorts := map[string]int32{}
	slices := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var kind struct{ Kind string }
		if err := json.Unmarshal(sc.Bytes(), &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "Service":
			var s corev1.Service
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			switch s.Spec.Type {
			case corev1.ServiceTypeClusterIP:
				got.ClusterIP++
			case corev1.ServiceTypeNodePort:
				got.NodePort++
			case corev1.ServiceTypeLoadBalancer:
				got.LoadBalancer++
				if len(s.Status.LoadBalancer.Ingress) != 1 {
					t.Errorf("%s: LoadBalancer ingress %v", s.Name, s.Status.LoadBalancer.Ingress)
				}
			}
			if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
				got.LocalPolicy++
			}
			if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				got.Affinity++
			}
			nodePorts[s.Name] = s.Spec.Ports[0].NodePort
		case "EndpointSlice":
			var es discoveryv1.EndpointSlice
			if err := json.Unmarshal(sc.Bytes(), &es); err != nil {
				t.Fatal(err)
			}
			if es.Labels[discoveryv1.LabelServiceName] == "" {
				t.Errorf("%s: no %s label", es.Name, discoveryv1.LabelServiceName)
			}
			for _, p := range es.Ports {
				if p.Name == nil { // kube-proxy would ignore the port (the API server defaults it to "")
					t.Errorf("%s: a port without a name", es.Name)
				}
			}
			got.Endpoints += len(es.Endpoints)
			slices++
		default:
			t.Fatalf("unexpected kind %q", kind.Kind)
		}
	}
	if diff := cmp.Diff(mixOf(synthState(n, 10)), got); diff != "" {
		t.Errorf("mix of the kube-proxy objects (-synthetic +objects):\n%s", diff)
	}
	if slices != n {
		t.Errorf("%d EndpointSlices, want %d", slices, n)
	}
	for i := 0; i < n; i++ {
		svc, _ := synthService(i, 10)
		if got, want := nodePorts[svc.Key.Name], int32(svc.Ports[0].NodePort); got != want {
			t.Errorf("%s: NodePort %d, want %d", svc.Key.Name, got, want)
		}
	}
}

func TestParseFlagsKubeProxy(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"v1.37.2"}},
		{[]string{"--quick"}, []string{"v1.37.2"}},
		{[]string{"--no-kube-proxy"}, nil},
		{[]string{"--kube-proxy", "0"}, nil},
		{[]string{"--kube-proxy", ""}, nil},
		{[]string{"--kube-proxy", "v1.37.2, v1.36.3"}, []string{"v1.37.2", "v1.36.3"}},
	} {
		o, err := parseFlags(c.args)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if diff := cmp.Diff(c.want, o.kubeProxy.versions); diff != "" {
			t.Errorf("%q: kube-proxy versions (-want +got):\n%s", c.args, diff)
		}
	}
	if _, err := parseFlags([]string{"--kube-proxy", "v1.20.0"}); err == nil {
		t.Errorf("--kube-proxy v1.20.0 accepted (there is no driver for it)")
	}
}

func TestSummarize(t *testing.T) {
	f := summarize("v1.37.2", []kubeProxyResult{
		{FullSyncMs: 300, ChangeMs: []float64{40, 50}, ChangesPartial: 2, PeakKiB: 40 << 10, RSSAfterKiB: 30 << 10, NftChildKiB: 9 << 10, RulesetLines: 7000},
		{FullSyncMs: 100, ChangeMs: []float64{60}, ChangesPartial: 1, PeakKiB: 50 << 10, RSSAfterKiB: 32 << 10, NftChildKiB: 11 << 10, RulesetLines: 7000},
		{FullSyncMs: 200, PeakKiB: 60 << 10, RSSAfterKiB: 31 << 10, NftChildKiB: 10 << 10, RulesetLines: 7000},
	})
	if f.full != 200*time.Millisecond || f.peakMiB != 50 || f.afterMiB != 31 || f.nftChildMiB != 11 || f.partial != 3 || len(f.changes) != 3 || f.runs != 3 {
		t.Errorf("summarize: %+v", f)
	}
	if got := quantile(f.changes, 0.5); got != 50*time.Millisecond {
		t.Errorf("p50 of the changes = %v, want 50ms", got)
	}
}

// The plots are SVG files gonum/plot drew, one per kind with points, naming every curve.
func TestScalingDraw(t *testing.T) {
	var s scaling
	for _, n := range []int{1000, 3000, 10000} {
		s.add(plotSync, "vipgate", n, float64(n)/12000)
		s.add(plotSync, "kube-proxy v1.37.2", n, float64(n)/700)
		s.add(plotPeak, "vipgate, peak during the sync", n, 30+float64(n)/60)
	}
	s.add(plotSync, "vipgate", 30000, 2.5)
	s.add(plotSync, "nothing measured", 30000, 0) // left out: no point on a log scale
	dir := t.TempDir()
	files, err := s.draw(dir, "2026-11-24")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "full-sync.svg"), filepath.Join(dir, "memory.svg")}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Fatalf("files (-want +got):\n%s", diff)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, w := range []string{"<svg", "vipgate", "kube-proxy v1.37.2", "30k", "Services (log scale)"} {
		if !strings.Contains(svg, w) {
			t.Errorf("full-sync.svg has no %q", w)
		}
	}
	if strings.Contains(svg, "nothing measured") {
		t.Errorf("full-sync.svg has a curve without points")
	}
}

// One point whose value is a tick value (a --quick run with nothing to compare) still draws.
func TestScalingDrawOnePoint(t *testing.T) {
	var s scaling
	s.add(plotSync, "vipgate", 1000, 0.2)
	if _, err := s.draw(t.TempDir(), "2026-11-24"); err != nil {
		t.Fatal(err)
	}
}
