package symreturn

import (
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/dptest"
)

// inNetns runs f on a thread inside the namespace fd.
func inNetns(t *testing.T, fd int, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			t.Errorf("setns: %v", err)
			return
		}
		f()
	}()
	<-done
}

func ipIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestRenderParses(t *testing.T) {
	dptest.NftCheckOrSkip(t)
	dptest.NftCheck(t, "symreturn", NewPlan(twoInterfaces(), "vipgate").Render())
}

// TestKernelRoundTrip programs a plan into a throwaway namespace: nft lists the table render.go
// prints; the ip rules and routes are there with vipgate's protocol; a second sync changes
// nothing (what is read back equals what was wanted, so the periodic sync does not churn);
// someone else's rule in the same table range survives; an empty plan removes everything.
func TestKernelRoundTrip(t *testing.T) {
	ns, fd := dptest.Netns(t)
	ipIn(t, ns, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p")
	ipIn(t, ns, "link", "set", "eth1p", "up")
	ipIn(t, ns, "link", "set", "eth1", "up")
	ipIn(t, ns, "addr", "add", "203.0.113.11/26", "dev", "eth1")
	ipIn(t, ns, "addr", "add", "2001:db8:3::11/64", "dev", "eth1", "nodad")
	ipIn(t, ns, "route", "add", "default", "via", "203.0.113.2", "dev", "eth1", "metric", "200")
	ipIn(t, ns, "-6", "route", "add", "default", "via", "2001:db8:3::1", "dev", "eth1", "metric", "200")
	// Someone else's rule: left alone.
	ipIn(t, ns, "rule", "add", "priority", "1700", "fwmark", "0x4000/0x4000", "lookup", "1700")

	cfg := cluster.SymmetricReturn{
		Interfaces: []cluster.ReturnInterface{
			{Name: "eth1", Gateways: []netip.Addr{netip.MustParseAddr("203.0.113.1")}},
			{Name: "eth9"}, // absent: rules, no routes
		},
		MarkMask: 0x3000, RouteTable: 1700, RulePriority: 1700,
	}
	p := NewPlan(cfg, "vipgate")
	k := Kernel{}
	var second int
	var err1, err2 error
	inNetns(t, fd, func() {
		err1 = Apply(k, p)
		second, err2 = SyncRoutes(k, p)
	})
	if err1 != nil || err2 != nil {
		t.Fatalf("apply: %v; second sync: %v", err1, err2)
	}
	if second != 0 {
		t.Errorf("the second sync made %d changes", second)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "vipgate-return").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	want := p.Render()
	if got := string(out); got != want {
		t.Errorf("nft lists:\n%s\nrender says:\n%s", got, want)
	}
	rules := ipIn(t, ns, "rule") + ipIn(t, ns, "-6", "rule")
	for _, w := range []string{
		"1700:\tfrom all fwmark 0x1000/0x3000 lookup 1700 proto 118",
		"1700:\tfrom all fwmark 0x2000/0x3000 lookup 1701 proto 118",
		"1700:\tfrom all fwmark 0x4000/0x4000 lookup 1700",
	} {
		if strings.Count(rules, w) < 1 {
			t.Errorf("no %q in\n%s", w, rules)
		}
	}
	routes := ipIn(t, ns, "route", "show", "table", "1700") + ipIn(t, ns, "-6", "route", "show", "table", "1700")
	for _, w := range []string{
		"default via 203.0.113.1 dev eth1 proto 118",
		"203.0.113.0/26 dev eth1 proto 118 scope link src 203.0.113.11",
		"2001:db8:3::/64 dev eth1 proto 118",
		"default via 2001:db8:3::1 dev eth1 proto 118",
	} {
		if !strings.Contains(routes, w) {
			t.Errorf("no %q in table 1700:\n%s", w, routes)
		}
	}
	if strings.Contains(routes, "203.0.113.2") {
		t.Errorf("the copied default route was not replaced by the configured gateway:\n%s", routes)
	}

	inNetns(t, fd, func() { err1 = Apply(k, NewPlan(cluster.SymmetricReturn{}, "vipgate")) })
	if err1 != nil {
		t.Fatal(err1)
	}
	rules = ipIn(t, ns, "rule") + ipIn(t, ns, "-6", "rule")
	if strings.Contains(rules, "proto 118") || !strings.Contains(rules, "fwmark 0x4000/0x4000 lookup 1700") {
		t.Errorf("after removal, rules:\n%s", rules)
	}
	if out, _ := exec.Command("ip", "-n", ns, "route", "show", "table", "all", "proto", "118").CombinedOutput(); strings.Contains(string(out), "dev") {
		t.Errorf("after removal, routes:\n%s", out)
	}
	if out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), "vipgate-return") {
		t.Errorf("after removal, tables:\n%s", out)
	}
}
