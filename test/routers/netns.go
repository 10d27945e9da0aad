// Package routers runs real BGP routers (BIRD 2 and FRR) inside network namespaces for vipgate's
// tests, and reads back the routes they learned. Everything it creates (namespaces, veths, daemons,
// temp dirs) is removed in t.Cleanup, also when the test fails.
//
// Tests using it need root and the Debian packages bird2 and frr; call RequireRoot first.
package routers

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

// RequireRoot skips the test unless it runs as root with the ip tool and the named binaries
// (for example "bird", "/usr/lib/frr/bgpd").
func RequireRoot(t testing.TB, binaries ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, b := range append([]string{"ip"}, binaries...) {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s: %v", b, err)
		}
	}
}

var nsCounter atomic.Int32

// Pair is two network namespaces joined by a veth: the vipgate side (Speaker) and the router side
// (Router), with 192.0.2.0/24 and 2001:db8:1::/64 on the link.
type Pair struct {
	Speaker, Router     string     // namespace names
	SpeakerIf, RouterIf string     // veth names inside each namespace
	SpeakerV4, RouterV4 netip.Addr // 192.0.2.2, 192.0.2.1
	SpeakerV6, RouterV6 netip.Addr // 2001:db8:1::2, 2001:db8:1::1
}

// NewPair creates namespaces vgt<pid>-<n>-spk and vgt<pid>-<n>-rtr joined by a veth and removes
// them when the test ends. IPv6 addresses skip duplicate address detection so they are usable at once.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	n := nsCounter.Add(1)
	base := fmt.Sprintf("vgt%d-%d", os.Getpid(), n)
	p := &Pair{
		Speaker:   base + "-spk",
		Router:    base + "-rtr",
		SpeakerIf: "vgspk",
		RouterIf:  "vgrtr",
		SpeakerV4: netip.MustParseAddr("192.0.2.2"),
		RouterV4:  netip.MustParseAddr("192.0.2.1"),
		SpeakerV6: netip.MustParseAddr("2001:db8:1::2"),
		RouterV6:  netip.MustParseAddr("2001:db8:1::1"),
	}
	// The veth is created in the speaker namespace straight away: nothing ever exists in the root
	// namespace, not even for an instant.
	for _, ns := range []string{p.Speaker, p.Router} {
		MustRun(t, "ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := Run("ip", "netns", "del", ns); err != nil {
				t.Logf("deleting netns %s: %v: %s", ns, err, out)
			}
		})
		MustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	MustRun(t, "ip", "-n", p.Speaker, "link", "add", p.SpeakerIf, "type", "veth", "peer", "name", p.RouterIf, "netns", p.Router)
	for _, side := range []struct {
		ns, ifname string
		v4, v6     netip.Addr
	}{{p.Speaker, p.SpeakerIf, p.SpeakerV4, p.SpeakerV6}, {p.Router, p.RouterIf, p.RouterV4, p.RouterV6}} {
		MustRun(t, "ip", "-n", side.ns, "addr", "add", side.v4.String()+"/24", "dev", side.ifname)
		MustRun(t, "ip", "-n", side.ns, "addr", "add", side.v6.String()+"/64", "dev", side.ifname, "nodad")
		MustRun(t, "ip", "-n", side.ns, "link", "set", side.ifname, "up")
	}
	return p
}

// Run runs a command and returns its combined output.
func Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// MustRun runs a command and fails the test if it fails.
func MustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := Run(name, args...)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return out
}

// InNetns returns the argv that runs a command inside a namespace.
func InNetns(ns string, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}
