package ctsync

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// TestProgramSNATInNetns loads the SNAT table into a fresh network namespace, both families, and
// reads it back with nft: the kernel takes it, and nft prints what the doc comments say.
func TestProgramSNATInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
	name := fmt.Sprintf("vgt%d-ctsync", os.Getpid())
	run := func(fn func() error) error {
		errc := make(chan error)
		go func() {
			// The thread stays locked (and is discarded) if it cannot go back.
			runtime.LockOSThread()
			orig, err := netns.Get()
			if err != nil {
				errc <- err
				return
			}
			defer orig.Close()
			ns, err := netns.GetFromName(name)
			if err != nil {
				errc <- err
				return
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				errc <- err
				return
			}
			err = fn()
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
		}()
		return <-errc
	}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	list := func(fam string) string {
		out, _ := exec.Command("ip", "netns", "exec", name, "nft", "list", "table", fam, SNATTable).CombinedOutput()
		return string(out)
	}
	own := []netip.Addr{netip.MustParseAddr("192.0.2.240"), netip.MustParseAddr("2001:db8::240")}
	all := append(own, netip.MustParseAddr("192.0.2.241"), netip.MustParseAddr("2001:db8::241"))
	if err := run(func() error { return ProgramSNAT(own, all, 0x4000) }); err != nil {
		t.Fatal(err)
	}
	// Twice: replacing the table must work too.
	if err := run(func() error { return ProgramSNAT(own, all, 0x4000) }); err != nil {
		t.Fatal(err)
	}
	for fam, want := range map[string][]string{
		"ip": {"type nat hook postrouting priority srcnat - 1", "meta mark & 0x00004000 != 0x00000000", "meta mark set meta mark & 0xffffbfff snat to 192.0.2.240 fully-random",
			"type filter hook prerouting priority mangle", "ip daddr 192.0.2.240 ct state invalid,new drop", "ip daddr 192.0.2.241 ct state invalid,new drop"},
		"ip6": {"snat to 2001:db8::240 fully-random", "ip6 daddr 2001:db8::241 ct state invalid,new drop"},
	} {
		got := list(fam)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("table %s %s lacks %q:\n%s", fam, SNATTable, w, got)
			}
		}
		if !strings.Contains(got, "drop") {
			t.Errorf("table %s %s has no guard drop:\n%s", fam, SNATTable, got)
		}
	}
	// No addresses: the tables go.
	if err := run(func() error { return ProgramSNAT(nil, nil, 0x4000) }); err != nil {
		t.Fatal(err)
	}
	if got := list("ip"); strings.Contains(got, "chain") {
		t.Errorf("table still there:\n%s", got)
	}
}
