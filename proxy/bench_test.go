package proxy

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
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
				if _, _, err := BuildRuleset(testConfig(), cluster.IPv4, st); err != nil {
					b.Fatal(err)
				}
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
				p = NewProxier(hclog.NewNullLogger(), cfg, &dataplane.NetlinkProgrammer{NetNSFd: fd})
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
type txCapture struct{ txs []*dataplane.Tx }

func (c *txCapture) Apply(tx *dataplane.Tx) error { c.txs = append(c.txs, tx); return nil }

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
		if _, _, err := dataplane.EncodedSize(tx); err != nil {
			b.Fatal(err)
		}
	}
}

// commentsProgrammer applies transactions through a NetlinkProgrammer, with the rule comments
// removed when strip is set (the batch vipgate sent before comments went into the rules' userdata).
// Both arms copy the transaction's chains, so they pay the same Go work besides the comments.
type commentsProgrammer struct {
	prog  *dataplane.NetlinkProgrammer
	strip bool
}

func (c commentsProgrammer) Apply(tx *dataplane.Tx) error {
	return c.prog.Apply(txComments(tx, c.strip))
}

// txComments copies tx's chains and rules, without comments when strip is set.
func txComments(tx *dataplane.Tx, strip bool) *dataplane.Tx {
	cp := *tx
	clone := func(chains []*dataplane.Chain) []*dataplane.Chain {
		out := make([]*dataplane.Chain, len(chains))
		for i, ch := range chains {
			c := *ch
			c.Rules = slices.Clone(ch.Rules)
			if strip {
				for j := range c.Rules {
					c.Rules[j].Comment = ""
				}
			}
			out[i] = &c
		}
		return out
	}
	cp.AddChains, cp.FlushChains = clone(tx.AddChains), clone(tx.FlushChains)
	return &cp
}

// batchBytes encodes tx and returns the size of its batch and its number of commented rules.
func batchBytes(tb testing.TB, tx *dataplane.Tx) (int, int) {
	size, _, err := dataplane.EncodedSize(tx)
	if err != nil {
		tb.Fatal(err)
	}
	comments := 0
	for _, ch := range append(slices.Clone(tx.AddChains), tx.FlushChains...) {
		for _, r := range ch.Rules {
			if r.Comment != "" {
				comments++
			}
		}
	}
	return size, comments
}

// BenchmarkKernelFullSyncComments: a full sync of 10,000 Services with the rule comments in the
// rules' userdata and without them (as before), alternating within one run so both arms see the
// same machine. Reports both times and both batch sizes.
func BenchmarkKernelFullSyncComments(b *testing.B) {
	_, fd := testNetns(b)
	st := SyntheticState(10000, 10)
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	capture := &txCapture{}
	if _, err := NewProxier(hclog.NewNullLogger(), cfg, capture).Sync(st); err != nil {
		b.Fatal(err)
	}
	with, comments := batchBytes(b, txComments(capture.txs[0], false))
	without, _ := batchBytes(b, txComments(capture.txs[0], true))
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	defer prog.Close()
	var spent [2]time.Duration // [with, without]
	runtime.GC()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := 0; k < 2; k++ {
			arm := (i + k) % 2 // alternate which arm goes first
			p := NewProxier(hclog.NewNullLogger(), cfg, commentsProgrammer{prog: prog, strip: arm == 1})
			start := time.Now()
			if _, err := p.Sync(st); err != nil {
				b.Fatal(err)
			}
			spent[arm] += time.Since(start)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(spent[0].Microseconds())/1000/float64(b.N), "ms/sync-comments")
	b.ReportMetric(float64(spent[1].Microseconds())/1000/float64(b.N), "ms/sync-no-comments")
	b.ReportMetric(float64(with), "batch-B-comments")
	b.ReportMetric(float64(without), "batch-B-no-comments")
	b.ReportMetric(float64(comments), "commented-rules")
}
