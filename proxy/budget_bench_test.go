package proxy

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// BenchmarkServiceObjectSize builds one Service of growing size as a sync does (buildService and
// the claims of its entries, and the claims alone; claimsOfLinear in claims_test.go is the old,
// quadratic claimsOf, 4x the time per doubling: 39, 147, 558, 2162 ms of CPU for n=50..400), with the limits lifted so that the whole object is built: n
// externalIPs x 100 ports (entries 100·(n+1)), and n ports of a maglev Service with one endpoint.
// ns/op divided by the entries (ns/entry) must stay flat as n doubles: linear scaling. cpu-ns/entry
// is the same from the process's CPU time (user + system, GC included), which other load on the
// machine does not inflate as it does the wall clock.
func BenchmarkServiceObjectSize(b *testing.B) {
	n0 := hostileNodeInfo()
	n0.Limits = cluster.ServiceLimits{MaxEntries: 1 << 24, MaxElements: 1 << 24}
	for _, n := range []int{50, 100, 200, 400} {
		for _, shape := range []hostileShape{
			{Name: "externalIPs", Ports: 100, ExternalIPs: n, Endpoints: 1},
			{Name: "maglev-ports", Ports: n, Endpoints: 1, Alg: "maglev"},
		} {
			svc, eps := hostileService(shape)
			part := buildService(n0, svc, eps, true)
			entries := len(part.Entries)
			b.Run(fmt.Sprintf("build/%s/n=%d", shape.Name, n), func(b *testing.B) {
				cpu := cpuTime()
				for b.Loop() {
					p := buildService(n0, svc, eps, true)
					claimsOf(nil, svc, p)
				}
				reportPerEntry(b, cpu, entries)
				b.ReportMetric(float64(part.NumElements()), "elements")
			})
			b.Run(fmt.Sprintf("claims/%s/n=%d", shape.Name, n), func(b *testing.B) {
				cpu := cpuTime()
				for b.Loop() {
					claimsOf(nil, svc, part)
				}
				reportPerEntry(b, cpu, entries)
			})
		}
	}
}

// cpuTime is the process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportPerEntry reports the wall and CPU time per op and per entry since cpu0.
func reportPerEntry(b *testing.B, cpu0 time.Duration, entries int) {
	cpu := float64((cpuTime() - cpu0).Nanoseconds()) / float64(b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(entries), "ns/entry")
	b.ReportMetric(cpu, "cpu-ns/op")
	b.ReportMetric(cpu/float64(entries), "cpu-ns/entry")
}
