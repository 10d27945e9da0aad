package ctsync

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestRender(t *testing.T) {
	got, err := Render(Config{Interface: "eth1", LocalAddress: addr("192.0.2.11"), Peer: addr("192.0.2.12"), Port: 3780,
		Dir: "/var/lib/vipgate/ctsync", Ignore: []netip.Addr{addr("192.0.2.11"), addr("2001:db8::11")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Mode FTFW {\n\t\tDisableExternalCache on\n\t\tStartupResync on\n\t}",
		// On loopback only: the relay carries the datagrams to the peer (package relay).
		"IPv4_address 127.0.0.1\n\t\tIPv4_Destination_Address 127.0.0.2\n\t\tPort 3780\n\t\tInterface eth1\n",
		"LockFile /var/lib/vipgate/ctsync/conntrackd.lock\n",
		"Path /var/lib/vipgate/ctsync/conntrackd.ctl\n",
		"LogFile /var/lib/vipgate/ctsync/conntrackd.log\n",
		"Systemd off\n",
		"Filter From Kernelspace {",
		"\t\t\tIPv4_address 127.0.0.1\n\t\t\tIPv4_address 127.0.0.2\n\t\t\tIPv6_address ::1\n\t\t\tIPv4_address 192.0.2.11\n\t\t\tIPv4_address 192.0.2.12\n\t\t\tIPv6_address 2001:db8::11\n\t\t}",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
	// Nothing of the machine's own /etc or /var/run.
	if strings.Contains(got, "/var/run") || strings.Contains(got, "/etc") || strings.Contains(got, "/var/lock") {
		t.Errorf("config points outside its directory:\n%s", got)
	}
	v6, err := Render(Config{Interface: "eth1", LocalAddress: addr("2001:db8::11"), Peer: addr("2001:db8::12"), Port: 4000, Dir: "/tmp/x"})
	// An IPv6 sync link: conntrackd still talks to its relay over IPv4 loopback (it carries both
	// families' entries on either).
	if err != nil || !strings.Contains(v6, "IPv4_address 127.0.0.1\n\t\tIPv4_Destination_Address 127.0.0.2\n\t\tPort 4000\n") ||
		!strings.Contains(v6, "IPv6_address 2001:db8::12\n") || strings.Contains(v6, "IPv6_Destination_Address") {
		t.Errorf("IPv6: %v\n%s", err, v6)
	}
}

func TestRenderRejects(t *testing.T) {
	ok := Config{Interface: "eth1", LocalAddress: addr("192.0.2.11"), Peer: addr("192.0.2.12"), Port: 3780, Dir: "/tmp/ct"}
	for name, c := range map[string]func(*Config){
		"interface with a brace":    func(c *Config) { c.Interface = "eth1}" },
		"interface with a space":    func(c *Config) { c.Interface = "eth 1" },
		"empty interface":           func(c *Config) { c.Interface = "" },
		"no peer":                   func(c *Config) { c.Peer = netip.Addr{} },
		"families differ":           func(c *Config) { c.Peer = addr("2001:db8::12") },
		"peer is local":             func(c *Config) { c.Peer = c.LocalAddress },
		"port 0":                    func(c *Config) { c.Port = 0 },
		"port too big":              func(c *Config) { c.Port = 70000 },
		"relative dir":              func(c *Config) { c.Dir = "ct" },
		"dir with a newline":        func(c *Config) { c.Dir = "/tmp/a\nLockFile /etc/x" },
		"dir with ..":               func(c *Config) { c.Dir = "/tmp/../etc" },
		"dir too long for a socket": func(c *Config) { c.Dir = "/" + strings.Repeat("a", 100) },
	} {
		c2 := ok
		c(&c2)
		if out, err := Render(c2); err == nil {
			t.Errorf("%s: no error; rendered\n%s", name, out)
		}
	}
}

func TestOwnedSNAT(t *testing.T) {
	by := map[string][]netip.Addr{"gw1": {addr("192.0.2.240")}, "gw2": {addr("192.0.2.241"), addr("2001:db8::241")}}
	for _, tc := range []struct {
		name     string
		self     string
		alive    map[string]bool
		takeover bool
		want     []netip.Addr
	}{
		{"both alive: each its own", "gw1", map[string]bool{"gw1": true, "gw2": true}, true, []netip.Addr{addr("192.0.2.240")}},
		{"both alive, gw2", "gw2", map[string]bool{"gw1": true, "gw2": true}, true, []netip.Addr{addr("192.0.2.241"), addr("2001:db8::241")}},
		{"peer dead: taken over", "gw1", map[string]bool{"gw1": true}, true, []netip.Addr{addr("192.0.2.240"), addr("192.0.2.241"), addr("2001:db8::241")}},
		// The two-member tie-break leaves gw2 not ready (no candidates at all): it still takes over.
		{"peer dead, self not a candidate", "gw2", map[string]bool{}, true, []netip.Addr{addr("192.0.2.240"), addr("192.0.2.241"), addr("2001:db8::241")}},
		{"at start: nothing taken over", "gw2", map[string]bool{}, false, []netip.Addr{addr("192.0.2.241"), addr("2001:db8::241")}},
		{"unknown self owns nothing", "gw3", map[string]bool{"gw1": true, "gw2": true}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, OwnedSNAT(tc.self, by, tc.alive, tc.takeover), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
	// Three gateways, one dead: exactly one survivor takes each of its addresses.
	by3 := map[string][]netip.Addr{"gw1": {addr("192.0.2.240"), addr("192.0.2.243")}, "gw2": {addr("192.0.2.241")}, "gw3": {addr("192.0.2.242")}}
	alive := map[string]bool{"gw2": true, "gw3": true}
	count := map[netip.Addr]int{}
	for _, self := range []string{"gw2", "gw3"} {
		for _, a := range OwnedSNAT(self, by3, alive, true) {
			count[a]++
		}
	}
	for _, a := range []netip.Addr{addr("192.0.2.240"), addr("192.0.2.241"), addr("192.0.2.242"), addr("192.0.2.243")} {
		if count[a] != 1 {
			t.Errorf("%s answered by %d survivors, want 1", a, count[a])
		}
	}
}

// TestSupervisorRestarts runs a stand-in that exits at once: the supervisor restarts it with
// backoff, reports it down between runs, and stops on cancel. (The real conntrackd runs in the e2e
// test, test/e2e/gateway_ctsync_test.go.)
func TestSupervisorRestarts(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fake-conntrackd")
	// Runs 0.2 s, or forever once asked to send a bulk update (-B): exits 3 otherwise.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\ncase \"$3\" in -B) exit 0;; esac\nsleep 0.2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := NewSupervisor(hclog.NewNullLogger(), Config{Interface: "eth0", LocalAddress: addr("192.0.2.11"), Peer: addr("192.0.2.12"), Port: 3780, Dir: filepath.Join(dir, "state")}, bin, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "conntrackd.conf")); err != nil {
		t.Fatalf("config not written: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for s.Status().Restarts < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no two restarts: %+v", s.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := s.Status()
	if st.LastExit != "exit status 3" {
		t.Errorf("last exit %q, want exit status 3", st.LastExit)
	}
	cancel()
	<-done
	if st := s.Status(); st.Up || gaugeValue(t, reg, "vipgate_gateway_conntrack_sync_up") != 0 {
		t.Errorf("after stop: %+v, gauge %v", st, gaugeValue(t, reg, "vipgate_gateway_conntrack_sync_up"))
	}
	if !strings.Contains(s.Status().String(), "conntrackd down since") {
		t.Errorf("status line %q", s.Status().String())
	}
}

// TestAnswerResyncsBounded: a peer that asks for resyncs without end (a request every 100 ms, as
// the finding's 20 forged ones, which got 20 dumps) gets the whole table (conntrackd -R, -B) once
// at once and once more for all the others, after the gap; nothing more.
func TestAnswerResyncsBounded(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fake-conntrackd")
	record := filepath.Join(dir, "calls")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$3\" >> "+record+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewSupervisor(hclog.NewNullLogger(), Config{Interface: "eth0", LocalAddress: addr("192.0.2.11"), Peer: addr("192.0.2.12"), Port: 3780, Dir: filepath.Join(dir, "state")}, bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.resyncGap = 2 * time.Second
	logPath := PathsOf(s.cfg.Dir).Log
	request := func() {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "[Mon Dec  7 06:00:00 2026] (pid=1) [notice] %s\n", resyncRequested)
		f.Close()
	}
	dumps := func() int {
		b, _ := os.ReadFile(record)
		return strings.Count(string(b), "-R")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.answerResyncs(ctx, logPath); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond) // answerResyncs starts at the log's end
	for range 15 {
		request()
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(10 * time.Second); dumps() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d table dumps, want 2", dumps())
		}
	}
	time.Sleep(s.resyncGap + time.Second)
	if n := dumps(); n != 2 {
		t.Errorf("15 resync requests got %d table dumps, want 2", n)
	}
}

func TestNewSupervisorNoBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := NewSupervisor(hclog.NewNullLogger(), Config{Interface: "eth0", LocalAddress: addr("192.0.2.11"), Peer: addr("192.0.2.12"), Port: 3780, Dir: t.TempDir()}, "", nil)
	if err == nil || !strings.Contains(err.Error(), "conntrackd not found") {
		t.Errorf("err = %v, want conntrackd not found", err)
	}
}

// gaugeValue reads a gauge without labels from reg (-1 if it is missing).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
