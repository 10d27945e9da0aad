// Package dptest holds the test helpers the nftables engine's tests and the gateway's share: a
// throwaway network namespace, `nft -c` checks, the hostile-Service corpus of the cost budgets,
// and small statistics. It imports only cluster (a dataplane leaf), so both dataplane's own
// (internal) tests and gateway's can use it.
package dptest

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// Netns creates a throwaway network namespace and returns its name and an open fd to it; removed
// when the test ends. Skips without root.
func Netns(t testing.TB) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates a network namespace)")
	}
	sweepStaleNetns.Do(SweepDeadOwnersNetns)
	name := fmt.Sprintf("vgt%d-dp%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		exec.Command("ip", "netns", "del", name).Run()
	})
	return name, int(f.Fd())
}

var sweepStaleNetns sync.Once

// SweepDeadOwnersNetns deletes the namespaces Netns named after a test process that no longer runs
// ("vgt<pid>-dp…"): a test binary killed by a timeout or a signal runs no t.Cleanup.
func SweepDeadOwnersNetns() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "vgt%d-dp", &pid); err != nil || pid <= 0 || !strings.HasPrefix(e.Name(), fmt.Sprintf("vgt%d-dp", pid)) {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its test is still running (or the pid was reused: then leave it)
		}
		exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}

// NftList is `nft list ruleset` in namespace ns.
func NftList(t testing.TB, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	return string(out)
}

// NftCheckOrSkip skips the test where `nft -c` cannot run.
func NftCheckOrSkip(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root (a network namespace of its own)")
	}
	for _, bin := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
}

// NftCheck runs `nft -c -f` over text in a throwaway network namespace (`unshare -n`: one that
// exists only for that command) and fails with nft's message.
func NftCheck(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f of %s: %v\n%s\n--- rendered:\n%s", name, err, out, text)
	}
}

// ContainsReason says whether a rejection's reason contains sub.
func ContainsReason(rs []cluster.Rejection, sub string) bool {
	for _, r := range rs {
		if strings.Contains(r.Reason, sub) {
			return true
		}
	}
	return false
}

// MaxDeviation is the largest |count/even - 1| over the backends.
func MaxDeviation(counts map[netip.Addr]int, even float64) float64 {
	d := 0.0
	for _, c := range counts {
		d = math.Max(d, math.Abs(float64(c)/even-1))
	}
	return d
}

// HostileShape is one Service of the cost-budget corpus: what a namespace tenant can write.
type HostileShape struct {
	Name        string
	Ports       int
	ExternalIPs int
	LBIPs       int
	Ranges      int // loadBalancerSourceRanges
	Endpoints   int
	Alg         string // vipgate.io/lb-algorithm ("" default)
	Local       bool   // externalTrafficPolicy: Local
	Affinity    bool
}

// HostileService builds the Service and its one EndpointSlice (IPv4; endpoints on node1 and node2
// alternately) of shape h.
func HostileService(h HostileShape) (*cluster.Service, []*cluster.EndpointSlice) {
	svc := &cluster.Service{
		Key:        cluster.ServiceKey{Namespace: "tenant", Name: h.Name},
		Type:       cluster.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.77.1")},
		Created:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		UID:        "uid-" + h.Name,
	}
	if h.LBIPs > 0 {
		svc.Type = cluster.TypeLoadBalancer
	}
	if h.Alg != "" {
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: h.Alg}
	}
	svc.ExternalPolicyLocal = h.Local
	if h.Local && h.LBIPs > 0 {
		svc.HealthCheckNodePort = 32500
	}
	if h.Affinity {
		svc.AffinityTimeout = 3 * time.Hour
	}
	es := &cluster.EndpointSlice{Namespace: "tenant", Name: h.Name + "-1", Service: svc.Key, Family: cluster.IPv4}
	for i := range h.Ports {
		name := fmt.Sprintf("p%d", i)
		sp := cluster.ServicePort{Name: name, Protocol: cluster.TCP, Port: uint16(1000 + i)}
		if svc.Type == cluster.TypeLoadBalancer {
			sp.NodePort = uint16(30000 + i)
		}
		svc.Ports = append(svc.Ports, sp)
		es.Ports = append(es.Ports, cluster.EndpointPort{Name: name, Protocol: cluster.TCP, Port: uint16(8000 + i)})
	}
	for i := range h.ExternalIPs {
		svc.ExternalIPs = append(svc.ExternalIPs, netip.AddrFrom4([4]byte{198, 51, 100 + byte(i/250), byte(1 + i%250)}))
	}
	for i := range h.LBIPs {
		svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + i%250)}))
	}
	for i := range h.Ranges {
		svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	for i := range h.Endpoints {
		node := "node1"
		if i%2 == 1 {
			node = "node2"
		}
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(1 + i/250), byte(1 + i%250)})},
			Ready: true, Serving: true, NodeName: node})
	}
	return svc, []*cluster.EndpointSlice{es}
}
