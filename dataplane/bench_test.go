package dataplane

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// The kernel benchmarks program a throwaway network namespace (never the root one) and report
// milliseconds per operation; run them with `make bench`. Figures are in the README.

func vmRSSKiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			n, _ := strconv.Atoi(strings.Fields(l)[1])
			return n
		}
	}
	return 0
}

// BenchmarkBuild measures the pure part: desired state to ruleset model (what a full sync computes).
func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		st := SyntheticState(n, 10)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				BuildRuleset(testConfig(), cluster.IPv4, st)
			}
		})
	}
}

func BenchmarkKernelFullSync(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			_, fd := testNetns(b)
			st := SyntheticState(n, 10)
			cfg := testConfig()
			cfg.Families = []cluster.Family{cluster.IPv4}
			runtime.GC()
			b.ResetTimer()
			var p *Proxier
			for i := 0; i < b.N; i++ {
				p = NewProxier(hclog.NewNullLogger(), cfg, &NetlinkProgrammer{NetNSFd: fd})
				if _, err := p.Sync(st); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/sync")
			b.ReportMetric(float64(vmRSSKiB())/1024, "RSS-MiB")
			elements := 0
			for _, els := range p.Flatten(cluster.IPv4).Elements {
				elements += len(els)
			}
			b.ReportMetric(float64(elements), "elements")
		})
	}
}

// BenchmarkKernelEndpointChange: one endpoint removed from / added back to one Service, with 10,000
// Services x 10 endpoints programmed. Time from the model change to the kernel's ack.
func BenchmarkKernelEndpointChange(b *testing.B) {
	_, fd := testNetns(b)
	st := SyntheticState(10000, 10)
	p, _ := syncedIPv4(b, fd, st)
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00001"}
	full := st.EndpointSlices[key]
	short := *full[0]
	short.Endpoints = short.Endpoints[:9]
	shortSlices := []*cluster.EndpointSlice{&short}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			st.EndpointSlices[key] = shortSlices
		} else {
			st.EndpointSlices[key] = full
		}
		rep, err := p.Sync(st)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Full || len(rep.Txs) != 1 {
			b.Fatalf("expected one incremental transaction, got %d (full=%v)", len(rep.Txs), rep.Full)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/change")
}

// BenchmarkIncrementalModel is the Go side of an endpoint change at 10,000 Services (no kernel).
func BenchmarkIncrementalModel(b *testing.B) {
	st := SyntheticState(10000, 10)
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	p := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
	if _, err := p.Sync(st); err != nil {
		b.Fatal(err)
	}
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00001"}
	full := st.EndpointSlices[key]
	short := *full[0]
	short.Endpoints = short.Endpoints[:9]
	shortSlices := []*cluster.EndpointSlice{&short}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			st.EndpointSlices[key] = shortSlices
		} else {
			st.EndpointSlices[key] = full
		}
		if _, err := p.Sync(st); err != nil {
			b.Fatal(err)
		}
	}
}

// txCapture keeps the transactions a sync would apply.
type txCapture struct{ txs []*Tx }

func (c *txCapture) Apply(tx *Tx) error { c.txs = append(c.txs, tx); return nil }

// BenchmarkEncode is the Go side of the netlink edge for a full sync of 10,000 Services: the
// transaction to the batch's message bytes (rules, chains and sets through google/nftables, the
// elements written directly), without a socket.
func BenchmarkEncode(b *testing.B) {
	st := SyntheticState(10000, 10)
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	capture := &txCapture{}
	if _, err := NewProxier(hclog.NewNullLogger(), cfg, capture).Sync(st); err != nil {
		b.Fatal(err)
	}
	tx := capture.txs[0]
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bt, err := newBatch(tx.Family, tx.Table)
		if err != nil {
			b.Fatal(err)
		}
		if err := newEncoder(tx, bt).encode(tx); err != nil {
			b.Fatal(err)
		}
	}
}
