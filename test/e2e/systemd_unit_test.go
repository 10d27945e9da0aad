package e2e

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestSystemdUnitGateway runs `vipgate gateway` under the sandbox of deploy/systemd/
// vipgate-gateway.service, replayed without systemd (systemd_replay_test.go: its capability
// bounding set, NoNewPrivileges, its SystemCallFilter and the argument checks of
// RestrictAddressFamilies, MemoryDenyWriteExecute, LockPersonality and RestrictNamespaces as a
// seccomp filter, ProtectSystem=strict with its StateDirectory, ProtectHome, ProcSubset=pid), and
// checks that every default feature of the gateway works in it, in the lab of TestGateway
// (forwarding direct to the pods):
//
//   - the NAT fast path loads (the bpf syscall; CAP_BPF; CAP_PERFMON, without which the verifier
//     refuses the program's pointer arithmetic), attaches (tcx: CAP_NET_ADMIN) and takes the flows;
//   - a restart under the unit adopts the previous run's program and flow table and replaces the
//     program: new flows are this run's program's, not a stale program's left in front of it
//     (opening a program or map by id is CAP_SYS_ADMIN's);
//   - conntrack sync: conntrackd, executed by vipgate, writes its config, socket and pid file in
//     the unit's state directory (/var/lib/vipgate) and runs.
func TestSystemdUnitGateway(t *testing.T) {
	lab.SkipUnlessRoot(t)
	for _, tool := range []string{"systemd-analyze", "conntrackd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	// VIPGATE_UNIT: another unit file (to see which setting a feature needs).
	unit, err := readSystemdUnit(cmp.Or(os.Getenv("VIPGATE_UNIT"), "../../deploy/systemd/vipgate-gateway.service"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state") // what the unit's /var/lib/vipgate is in the replay
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	replay, err := replayOf(unit, func(target string) string {
		d := filepath.Join(dir, "dirs", strings.ReplaceAll(strings.Trim(target, "/"), "/", "-"))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if target == "/var/lib/vipgate" {
			return state
		}
		return d
	})
	if err != nil {
		t.Fatalf("replaying the unit: %v", err)
	}
	t.Logf("unit sandbox: %d capabilities %v, %d system calls allowed, families %v, state dirs %v, writable %v",
		len(replay.Caps), capNamesOf(replay.Caps), len(replay.Syscalls), replay.Families, replay.Binds, replay.Writable)

	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := gwBinary(t)
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	node1, node2 := l.Node("node1"), l.Node("node2")
	gwIP := lab.LANClientv4
	gwSh(t, l, lab.RoleRouter, "ip", "route", "add", "203.0.113.0/24", "via", gwIP.String())
	gwSh(t, l, lab.RoleLANClient, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for _, n := range l.Nodes() {
		gwSh(t, l, lab.RoleLANClient, "ip", "route", "add", n.PodCIDRv4.String(), "via", n.IPv4.String())
		gwSh(t, l, n.Name, "ip", "route", "add", lab.ClientNetv4.String(), "via", gwIP.String())
	}
	w := &gwWriter{t: t, dir: manifests}
	w.write("web.yaml",
		gwService("web", "LoadBalancer", "10.96.5.1", "Cluster", []gwPort{{"http", "TCP", 80, 30080, "http"}}, gwStatus("203.0.113.50")),
		gwSlice("web", "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, gwEp(a1, "node1"), gwEp(a2, "node1"), gwEp(b1, "node2")))

	var gw *lab.Proc
	starts := 0
	// start runs the gateway with config under the unit's sandbox and waits for its first sync.
	start := func(t *testing.T, config string) {
		t.Helper()
		if gw != nil {
			if err := gw.Stop(); err != nil {
				t.Logf("stopping the previous gateway: %v", err)
			}
		}
		starts++
		cfg := filepath.Join(dir, fmt.Sprintf("gateway-%d.yaml", starts))
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		argv, err := replayCommand(replay, dir, bin, "gateway", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		if gw, err = l.Start(lab.RoleLANClient, filepath.Join(dir, fmt.Sprintf("gateway-%d.log", starts)), argv...); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(gw.Log(), "synced") {
			if exited, _ := gw.Exited(); exited || time.Now().After(deadline) {
				t.Fatalf("the gateway under the unit's sandbox did not sync (exited: %v):\n%s", exited, gw.Tail(30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Cleanup(func() {
		if gw != nil {
			if t.Failed() {
				t.Logf("--- vipgate gateway (last run):\n%s", gw.Tail(40))
			}
			_ = gw.Stop()
		}
		// The program stays attached when the gateway ends; the lab's namespaces go with it.
	})
	metric := func(t *testing.T, name string) float64 {
		t.Helper()
		code, body := ndHTTP(t, l, lab.RoleLANClient, "http://127.0.0.1:10249/metrics")
		if code != 200 {
			t.Fatalf("gateway /metrics: HTTP %d", code)
		}
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				var f float64
				fmt.Sscan(v, &f)
				return f
			}
		}
		return -1
	}
	// probes sends n connections to the VIP and returns how many the pods answered.
	probes := func(t *testing.T, n int) int {
		t.Helper()
		ok := 0
		for range n {
			r, err := l.Probe(lab.RoleClient, "tcp", "203.0.113.50:80")
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() {
				ok++
			}
		}
		return ok
	}
	newFlows := `vipgate_gateway_nat_fast_path_packets_total{what="new"}`
	base := gwConfig("direct", gwIP, node1, node2)

	t.Run("NAT fast path loads, attaches and takes the flows", func(t *testing.T) {
		start(t, base)
		checkSandboxed(t, gw.Pid(), replay)
		if on := metric(t, "vipgate_gateway_nat_fast_path"); on != 1 {
			t.Fatalf("vipgate_gateway_nat_fast_path = %v under the unit's sandbox, want 1:\n%s", on, grepLines(gw.Log(), "fast path"))
		}
		gwWait(t, l, lab.RoleClient, "tcp", "203.0.113.50:80", func(r lab.ProbeResult) bool { return r.OK() })
		before := metric(t, newFlows)
		if ok := probes(t, 10); ok != 10 {
			t.Errorf("%d of 10 connections to the VIP answered", ok)
		}
		if n := metric(t, newFlows) - before; n < 10 {
			t.Errorf("the program took %v of 10 new flows", n)
		}
	})

	t.Run("a restart adopts the program and replaces it", func(t *testing.T) {
		start(t, base)
		if !strings.Contains(gw.Log(), "flow table adopted") {
			t.Errorf("the restarted gateway did not adopt the previous run's flow table:\n%s", grepLines(gw.Log(), "fast path"))
		}
		// A previous program left attached in front of this run's would take every packet, and
		// this run's counters would stay at 0.
		before := metric(t, newFlows)
		if ok := probes(t, 10); ok != 10 {
			t.Errorf("%d of 10 connections to the VIP answered", ok)
		}
		if n := metric(t, newFlows) - before; n < 10 {
			t.Errorf("this run's program took %v of 10 new flows: a previous run's program is still in front of it", n)
		}
	})

	t.Run("conntrackd runs in the state directory", func(t *testing.T) {
		// snat: never, so that conntrack sync needs no SNAT addresses; the peer need not exist.
		// Its key file is read-only to the gateway, as /etc/vipgate is.
		key := filepath.Join(dir, "ctsync.key")
		if err := os.WriteFile(key, []byte(strings.Repeat("5a17", 16)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := strings.Replace(base, "snat: auto", "snat: never", 1) +
			fmt.Sprintf("conntrackSync: {peer: \"192.0.2.99\", stateDir: /var/lib/vipgate/ctsync, keyFile: %q}\n", key)
		start(t, cfg)
		deadline := time.Now().Add(15 * time.Second)
		for {
			code, body := ndHTTP(t, l, lab.RoleLANClient, "http://127.0.0.1:10249/status")
			if code == 200 && strings.Contains(body, "conntrackd up") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("conntrackd is not up under the unit's sandbox: /status (HTTP %d):\n%s\n%s", code, grepLines(body, "conntrack"), grepLines(gw.Log(), "conntrack"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, f := range []string{"conntrackd.conf"} {
			if _, err := os.Stat(filepath.Join(state, "ctsync", f)); err != nil {
				t.Errorf("the state directory lacks %s: %v", f, err)
			}
		}
		if ok := probes(t, 5); ok != 5 {
			t.Errorf("with conntrack sync: %d of 5 connections to the VIP answered", ok)
		}
	})
}

// checkSandboxed checks that process pid runs with the replay's restrictions (so that a passing
// test is not one that ran unconfined): its seccomp filter, no_new_privs and capability sets.
func checkSandboxed(t *testing.T, pid int, r *unitReplay) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var mask uint64
	for _, c := range r.Caps {
		mask |= 1 << c
	}
	want := map[string]string{"CapBnd": fmt.Sprintf("%016x", mask), "CapEff": fmt.Sprintf("%016x", mask), "CapAmb": "0000000000000000"}
	if r.NoNewPrivs {
		want["NoNewPrivs"] = "1"
	}
	if r.Syscalls != nil {
		want["Seccomp"] = "2"
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("the gateway (pid %d) runs with %s %s, want %s", pid, k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("/proc/%d/status lacks %v", pid, want)
	}
}

// capNamesOf names capability numbers.
func capNamesOf(caps []int) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		out = append(out, strings.TrimPrefix(capNames[c], "CAP_"))
	}
	return out
}

// grepLines returns the lines of s that contain sub (case-insensitive), or the last lines of s.
func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(line), strings.ToLower(sub)) {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		lines := strings.Split(s, "\n")
		out = lines[max(0, len(lines)-20):]
	}
	return strings.Join(out, "\n")
}
