package ctsync

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/test/lab"
)

// netnsOrSkip creates a network namespace for the test (removed at its end) and returns a function
// that runs fn in it, on a thread of its own, and the namespace's name; it skips without root or nft.
func netnsOrSkip(t *testing.T, suffix string) (func(fn func() error) error, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
	name := fmt.Sprintf("vgt%d-%s", os.Getpid(), suffix)
	run := func(fn func() error) error { return lab.InNetns(name, fn) }
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return run, name
}

// TestProgramSNATInNetns loads the SNAT table into a fresh network namespace, both families, and
// reads it back with nft: the kernel takes it, and nft prints what the doc comments say.
func TestProgramSNATInNetns(t *testing.T) {
	run, name := netnsOrSkip(t, "ctsync")
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

// TestRenderSNATLoadsAsProgrammed loads what RenderSNAT prints with `nft -f` and what ProgramSNAT
// programs into the same namespace in turn, and compares nft's listings of both: `vipgate render`
// shows exactly the SNAT tables a gateway programs (IPv4 only, IPv6 only, both, a guard without a
// SNAT address of its own, none at all).
func TestRenderSNATLoadsAsProgrammed(t *testing.T) {
	run, name := netnsOrSkip(t, "ctrender")
	a := netip.MustParseAddr
	listAll := func() string {
		var b strings.Builder
		for _, fam := range []string{"ip", "ip6"} {
			// A missing table is an error for nft: its listing is then the empty string.
			out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "table", fam, SNATTable).CombinedOutput()
			if err == nil {
				b.Write(out)
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		name     string
		own, all []netip.Addr
	}{
		{"both families", []netip.Addr{a("192.0.2.240"), a("2001:db8::240")}, []netip.Addr{a("192.0.2.240"), a("192.0.2.241"), a("2001:db8::240"), a("2001:db8::241")}},
		{"IPv4 only", []netip.Addr{a("192.0.2.240")}, []netip.Addr{a("192.0.2.240"), a("192.0.2.241")}},
		{"IPv6 only", []netip.Addr{a("2001:db8::241")}, []netip.Addr{a("2001:db8::240"), a("2001:db8::241")}},
		{"guard only (no address of its own)", nil, []netip.Addr{a("192.0.2.240")}},
		{"none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const mark = 0x4000
			if err := run(func() error { return ProgramSNAT(tc.own, tc.all, mark) }); err != nil {
				t.Fatal(err)
			}
			programmed := listAll()
			if err := run(func() error { return ProgramSNAT(nil, nil, mark) }); err != nil {
				t.Fatal(err)
			}
			text := RenderSNAT(tc.own, tc.all, mark)
			if (text == "") != (len(tc.all) == 0) {
				t.Fatalf("rendered %q for own %v, all %v", text, tc.own, tc.all)
			}
			path := filepath.Join(t.TempDir(), "snat.nft")
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("ip", "netns", "exec", name, "nft", "-c", "-f", path).CombinedOutput(); err != nil {
				t.Fatalf("nft -c -f: %v\n%s\n--- rendered:\n%s", err, out, text)
			}
			if out, err := exec.Command("ip", "netns", "exec", name, "nft", "-f", path).CombinedOutput(); err != nil {
				t.Fatalf("nft -f: %v\n%s\n--- rendered:\n%s", err, out, text)
			}
			if diff := cmp.Diff(programmed, listAll()); diff != "" {
				t.Errorf("rendered tables differ from the programmed ones (-programmed +rendered):\n%s\n--- rendered:\n%s", diff, text)
			}
			// Programming over the rendered tables replaces them (what a gateway does at start).
			if err := run(func() error { return ProgramSNAT(nil, nil, mark) }); err != nil {
				t.Fatal(err)
			}
		})
	}
}
