package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/test/lab"
)

// Helpers every end-to-end test shares.

// vipgateBinary returns $VIPGATE_BIN (as `make test` sets it), or builds vipgate for this test.
func vipgateBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("VIPGATE_BIN"); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			t.Fatalf("VIPGATE_BIN: %v", err)
		}
		return abs
	}
	out := filepath.Join(t.TempDir(), "vipgate")
	if err := lab.BuildBinary("github.com/vipgate/vipgate/cmd/vipgate", out); err != nil {
		t.Fatal(err)
	}
	return out
}

// labNodeConfig is the plain NodeConfig of a lab node: its LAN addresses (IPv4, and IPv6 in a
// dual-stack lab) and the lab's pod and service CIDRs of the same families.
func labNodeConfig(n *lab.Node) string {
	ips, cidrs, svcs := []string{n.IPv4.String()}, []string{lab.ClusterCIDRv4.String()}, []string{lab.ServiceCIDRv4.String()}
	if n.IPv6.IsValid() {
		ips = append(ips, n.IPv6.String())
		cidrs = append(cidrs, lab.ClusterCIDRv6.String())
		svcs = append(svcs, lab.ServiceCIDRv6.String())
	}
	quote := func(items []string) string {
		q := make([]string, len(items))
		for i, s := range items {
			q[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: %s
nodeIPs: %s
clusterCIDRs: %s
serviceCIDRs: %s
`, n.Name, quote(ips), quote(cidrs), quote(svcs))
}
