package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/proxy"
)

func TestSynthMix(t *testing.T) {
	got := mixOf(synthState(1000, 10))
	want := mix{ClusterIP: 850, NodePort: 100, LoadBalancer: 50, LocalPolicy: 20, Affinity: 20, Endpoints: 10000}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Service mix (-want +got):\n%s", diff)
	}
}

// The generator must never make two Services claim one entry: the proxier would refuse one and
// retry it on every sync, and the bench would measure that instead of syncing.
func TestSynthNoConflicts(t *testing.T) {
	sizes := []int{1000, 17000, maxServices}
	if testing.Short() {
		sizes = []int{1000, 17000}
	}
	for _, n := range sizes {
		st := synthState(n, 10)
		p := proxy.NewProxier(hclog.NewNullLogger(), benchConfig(benchNodeIP), discardProgrammer{})
		rep, err := p.Sync(st)
		if err != nil {
			t.Fatalf("%d Services: %v", n, err)
		}
		if len(rep.Conflicts) > 0 {
			t.Errorf("%d Services: %d conflicts, first %+v", n, len(rep.Conflicts), rep.Conflicts[0])
		}
		if n > 17000 {
			continue
		}
		// Up to 17,000 Services every node port is in Kubernetes' default range (vipgate node checks).
		for k, svc := range st.Services {
			for _, port := range append([]uint16{svc.HealthCheckNodePort}, svc.Ports[0].NodePort) {
				if port != 0 && !cluster.NodePortRange.Contains(int32(port)) {
					t.Fatalf("%d Services: %s has node port %d outside %s", n, k, port, cluster.NodePortRange)
				}
			}
		}
	}
}

// The control-plane test writes the synthetic Services as manifests: they must load through the real
// file source into the same Services the library benchmarks program.
func TestManifestsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	const n = 200
	for i := 0; i < n; i++ {
		svc, es := synthService(i, 3)
		b.WriteString(serviceYAML(svc, 8080))
		b.WriteString(sliceYAML(es))
	}
	if err := os.WriteFile(filepath.Join(dir, "bg.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := cluster.NewFileSource(dir, nil).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Rejected) > 0 {
		t.Fatalf("%d manifests rejected, first %+v", len(st.Rejected), st.Rejected[0])
	}
	if len(st.Services) != n {
		t.Fatalf("loaded %d Services, want %d", len(st.Services), n)
	}
	type svcView struct {
		Type                cluster.ServiceType
		ClusterIPs          string
		Ports               string
		LBIPs               string
		Local               bool
		HealthCheckNodePort uint16
		Affinity            time.Duration
		Endpoints           string
	}
	view := func(svc *cluster.Service, slices []*cluster.EndpointSlice) svcView {
		v := svcView{Type: svc.Type, ClusterIPs: fmt.Sprint(svc.ClusterIPs), LBIPs: fmt.Sprint(svc.LoadBalancerIPs),
			Local: svc.ExternalPolicyLocal, HealthCheckNodePort: svc.HealthCheckNodePort, Affinity: svc.AffinityTimeout}
		for _, p := range svc.Ports {
			v.Ports += fmt.Sprint(p.Protocol, p.Port, p.NodePort)
		}
		for _, es := range slices {
			for _, ep := range es.Endpoints {
				v.Endpoints += fmt.Sprint(ep.Addresses, ep.NodeName, ep.Ready, ep.Serving) + ";"
			}
		}
		return v
	}
	for i := 0; i < n; i++ {
		want, es := synthService(i, 3)
		got := st.Services[want.Key]
		if got == nil {
			t.Fatalf("%s not loaded", want.Key)
		}
		if diff := cmp.Diff(view(want, []*cluster.EndpointSlice{es}), view(got, st.EndpointSlices[want.Key])); diff != "" {
			t.Errorf("%s (-synthetic +loaded):\n%s", want.Key, diff)
		}
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := quantile(ds, c.q); got != c.want {
			t.Errorf("quantile(1..100 ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile(ds[:20], 0.99); got != 100*time.Millisecond {
		t.Errorf("p99 of 20 samples = %v, want the largest (100ms)", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median(1..4) = %v, want 2.5", got)
	}
}

func TestPairedRatio(t *testing.T) {
	got := pairedRatio([]float64{90, 200, 99}, []float64{100, 200, 100}, 0.95)
	want := "0.99 (rounds 0.90-1.00), target >= 0.95: meets"
	if got != want {
		t.Errorf("pairedRatio = %q, want %q", got, want)
	}
}

func TestParseIperf(t *testing.T) {
	got, err := parseIperf(`{"start": {}, "end": {"sum_sent": {"bits_per_second": 9.1e9}, "sum_received": {"bits_per_second": 8.5e9}}}`)
	if err != nil || got != 8.5 {
		t.Errorf("parseIperf = %v, %v; want 8.5 Gbit/s", got, err)
	}
	if _, err := parseIperf(`{"error": "unable to connect to server"}`); err == nil {
		t.Errorf("parseIperf accepted an iperf3 error")
	}
}

func TestLastKV(t *testing.T) {
	got := lastKV("some warning\nrate=123.4 conns=5 errors=0\n")
	if got["rate"] != "123.4" || got["conns"] != "5" || got["errors"] != "0" {
		t.Errorf("lastKV = %v", got)
	}
}

func TestParseFlagsQuick(t *testing.T) {
	o, err := parseFlags([]string{"--quick", "--changes", "7"})
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Diff([]int{1000}, o.sizes) != "" || o.changes != 7 || o.packets.many != 1000 || o.cpBackground != 1000 {
		t.Errorf("--quick --changes 7: sizes %v changes %d many %d cp-services %d", o.sizes, o.changes, o.packets.many, o.cpBackground)
	}
	o, err = parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.packets.many != 10000 || len(o.sizes) != 4 {
		t.Errorf("defaults: sizes %v, many %d; want the per-packet figures at 10,000", o.sizes, o.packets.many)
	}
	if _, err := parseFlags([]string{"--sizes", "0"}); err == nil {
		t.Errorf("--sizes 0 accepted")
	}
}
