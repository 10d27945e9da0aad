package gateway

import (
	"errors"
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
	"github.com/vipgate/vipgate/dataplane"
)

// Test helpers of the dataplane package the gateway's tests use too (copies: a package's test
// files are its own).

// mtProgrammer accepts every transaction unless fail is set.
type mtProgrammer struct{ fail bool }

func (p *mtProgrammer) Apply(*dataplane.Tx) error {
	if p.fail {
		return errors.New("refused")
	}
	return nil
}

// testNetns creates a throwaway network namespace and returns its name and an open fd to it.
func testNetns(t testing.TB) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates a network namespace)")
	}
	sweepStaleNetns.Do(sweepDeadOwnersNetns)
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

// sweepDeadOwnersNetns deletes the namespaces this helper named after a test process that no longer
// runs ("vgt<pid>-dp…"): a test binary killed by a timeout or a signal runs no t.Cleanup.
func sweepDeadOwnersNetns() {
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

func nftList(t testing.TB, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	return string(out)
}

// nftCheckOrSkip skips the test where `nft -c` cannot run.
func nftCheckOrSkip(t *testing.T) {
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

// nftCheck runs `nft -c -f` over text in a throwaway network namespace and fails with nft's message.
func nftCheck(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".nft")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-n", "nft", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f of %s: %v\n%s\n--- rendered:\n%s", name, err, out, text)
	}
}

func rdFamilyName(f cluster.Family) string { return fmt.Sprintf("ipv%d", f) }

func trAddrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// trEp is a ready endpoint on node.
func trEp(addr, node string) cluster.Endpoint {
	return cluster.Endpoint{Addresses: trAddrs(addr), Ready: true, Serving: true, NodeName: node}
}

func slicesContainsReason(rs []cluster.Rejection, sub string) bool {
	for _, r := range rs {
		if strings.Contains(r.Reason, sub) {
			return true
		}
	}
	return false
}

// maxDeviation is the largest |count/even - 1| over the backends.
func maxDeviation(counts map[netip.Addr]int, even float64) float64 {
	d := 0.0
	for _, c := range counts {
		d = math.Max(d, math.Abs(float64(c)/even-1))
	}
	return d
}

// hostileShape is one Service of the corpus.
type hostileShape struct {
	name        string
	ports       int
	externalIPs int
	lbIPs       int
	ranges      int // loadBalancerSourceRanges
	endpoints   int
	alg         string // vipgate.io/lb-algorithm ("" default)
	local       bool   // externalTrafficPolicy: Local
	affinity    bool
}

// hostileService builds the Service and its one EndpointSlice (IPv4; endpoints on node1 and
// node2 alternately) of shape h.
func hostileService(h hostileShape) (*cluster.Service, []*cluster.EndpointSlice) {
	svc := &cluster.Service{
		Key:        cluster.ServiceKey{Namespace: "tenant", Name: h.name},
		Type:       cluster.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.77.1")},
		Created:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		UID:        "uid-" + h.name,
	}
	if h.lbIPs > 0 {
		svc.Type = cluster.TypeLoadBalancer
	}
	if h.alg != "" {
		svc.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: h.alg}
	}
	svc.ExternalPolicyLocal = h.local
	if h.local && h.lbIPs > 0 {
		svc.HealthCheckNodePort = 32500
	}
	if h.affinity {
		svc.AffinityTimeout = 3 * time.Hour
	}
	es := &cluster.EndpointSlice{Namespace: "tenant", Name: h.name + "-1", Service: svc.Key, Family: cluster.IPv4}
	for i := range h.ports {
		name := fmt.Sprintf("p%d", i)
		sp := cluster.ServicePort{Name: name, Protocol: cluster.TCP, Port: uint16(1000 + i)}
		if svc.Type == cluster.TypeLoadBalancer {
			sp.NodePort = uint16(30000 + i)
		}
		svc.Ports = append(svc.Ports, sp)
		es.Ports = append(es.Ports, cluster.EndpointPort{Name: name, Protocol: cluster.TCP, Port: uint16(8000 + i)})
	}
	for i := range h.externalIPs {
		svc.ExternalIPs = append(svc.ExternalIPs, netip.AddrFrom4([4]byte{198, 51, 100 + byte(i/250), byte(1 + i%250)}))
	}
	for i := range h.lbIPs {
		svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + i%250)}))
	}
	for i := range h.ranges {
		svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	for i := range h.endpoints {
		node := "node1"
		if i%2 == 1 {
			node = "node2"
		}
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(1 + i/250), byte(1 + i%250)})},
			Ready: true, Serving: true, NodeName: node})
	}
	return svc, []*cluster.EndpointSlice{es}
}

// kernelBytesPerElement is what one map element costs the kernel, measured on 6.18 (slab growth
// of a 50,500-element endpoint map: 101-115 bytes; maglev.MaxSize says ~95 for the gateway's); a
// rule counts cluster.RuleCost elements.
const kernelBytesPerElement = 115

// maxKernelState is issue #27's bound on what any single object may cost the kernel.
const maxKernelState = 16 << 20
