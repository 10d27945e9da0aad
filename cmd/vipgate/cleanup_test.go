package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestCleanupDeletesFastPathTables: --cleanup deletes the gateway's tables of every family, the
// fast path's netdev tables (with their ingress chains) too, in a throwaway namespace; a second run
// finds nothing to delete and succeeds.
func TestCleanupDeletesFastPathTables(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s binary", bin)
		}
	}
	ns := fmt.Sprintf("vgt%d-cl%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "s0", "type", "veth", "peer", "name", "s1").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	nft := func(script string) string {
		t.Helper()
		c := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		c.Stdin = strings.NewReader(script)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
		return string(out)
	}
	nft(`table ip vipgate { chain c { }; }
table ip6 vipgate { chain c { }; }
table netdev vipgate-fwd4 { chain gateway-ingress-s0 { type filter hook ingress device "s0" priority filter; policy accept; }; }
table netdev vipgate-fwd6 { chain gateway-ingress-s0 { type filter hook ingress device "s0" priority filter; policy accept; }; }
table netdev other { chain c { }; }
`)
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for run := 1; run <= 2; run++ {
		prog := &dataplane.NetlinkProgrammer{NetNSFd: int(f.Fd())}
		_, done, err := startCommand(&nodeFlags{cleanup: true}, &cluster.Logging{}, "vipgate", prog)
		prog.Close()
		if err != nil || !done {
			t.Fatalf("cleanup run %d: done %v, err %v", run, done, err)
		}
		out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput()
		if got := strings.TrimSpace(string(out)); got != "table netdev other" {
			t.Fatalf("cleanup run %d: tables left:\n%s\nwant only the table vipgate does not own", run, got)
		}
	}
}
