package ctsync

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// statsOut is `conntrackd -s` of Debian's conntrackd 1.4.7 on a gateway that received two entries
// from its peer (external inject) in two packets.
const statsOut = `cache internal:
current active connections:	           0
connections created:		           0	failed:	           0
connections updated:		           0	failed:	           0
connections destroyed:		           0	failed:	           0

external inject:
connections created:		           2	failed:	           1
connections updated:		           4	failed:	           0
connections destroyed:		           0	failed:	           0

traffic processed:
                   0 Bytes                         0 Pckts

UDP traffic (active device=h5vb):
                  32 Bytes sent                  184 Bytes recv
                   2 Pckts sent                    3 Pckts recv
                   0 Error send                    0 Error recv

message tracking:
                   0 Malformed msgs                    0 Lost msgs
`

func TestParseStats(t *testing.T) {
	recv, inj, err := parseStats(statsOut)
	if err != nil || recv != 3 || inj != 7 {
		t.Errorf("parseStats = %d received, %d injected, %v; want 3, 7 (the internal cache's counters are not the peer's)", recv, inj, err)
	}
	for name, out := range map[string]string{
		"empty":              "",
		"no external inject": statsOut[:140],
		"garbled count":      "external inject:\nconnections created:\t\t x\tfailed:\t 0\nUDP traffic (active device=eth0):\n 1 Pckts sent 1 Pckts recv\n",
	} {
		if _, _, err := parseStats(out); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestResyncTracker feeds the tracker samples every 100 ms (the default poll) and checks when and
// how it ends the wait.
func TestResyncTracker(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	type step struct {
		received, injected uint64
		ok                 bool
	}
	// run feeds samples made by f(i) for i = 1, 2, ... and returns the outcome and when it came.
	run := func(f func(i int) step) (ResyncOutcome, time.Duration) {
		tr := newResyncTracker(DefaultResyncWait)
		for i := 1; i < 1000; i++ {
			s := f(i)
			at := ms(100 * i)
			if o := tr.add(resyncSample{at: at, received: s.received, injected: s.injected}, s.ok); o != ResyncWaiting {
				return o, at
			}
		}
		return ResyncWaiting, 0
	}
	for _, tc := range []struct {
		name string
		f    func(i int) step
		want ResyncOutcome
		at   time.Duration
	}{
		// The peer answers at once with nothing to send: done once MinWait passed since it was heard.
		{"idle peer", func(i int) step { return step{received: uint64(i), ok: true} }, ResyncDone, ms(1100)},
		// 5000 entries over 0.6 s, then the peer's new flows trickle in (a few per poll): done
		// Quiet after the burst.
		{"burst then trickle", func(i int) step {
			switch {
			case i <= 6:
				return step{received: uint64(i) * 50, injected: uint64(i) * 833, ok: true}
			default:
				return step{received: 300 + uint64(i), injected: 4998 + uint64(i)*3, ok: true}
			}
		}, ResyncDone, ms(1100)},
		// A small table with light churn: one or two new flows a poll and nothing bigger ever. A
		// sixteenth of that peak is 0; the floor keeps it a trickle, not a burst without end.
		{"small table, light churn", func(i int) step {
			return step{received: uint64(i), injected: uint64(i) * 2, ok: true}
		}, ResyncDone, ms(1100)},
		{"long burst", func(i int) step {
			return step{received: uint64(i), injected: uint64(min(i, 25)) * 1000, ok: true}
		}, ResyncDone, ms(3000)},
		// A second answer (vipgate's full table on the peer) after a pause: the wait covers both.
		{"two answers", func(i int) step {
			inj := uint64(min(i, 2)) * 100
			if i >= 9 {
				inj += uint64(min(i-8, 2)) * 100
			}
			return step{received: uint64(i), injected: inj, ok: true}
		}, ResyncDone, ms(1500)},
		{"peer never heard", func(i int) step { return step{ok: true} }, ResyncNoPeer, ms(3000)},
		{"conntrackd never answers", func(i int) step { return step{} }, ResyncNoPeer, ms(3000)},
		// Heard, but entries pour in without end (or far more than a trickle): the deadline.
		{"never quiet", func(i int) step { return step{received: uint64(i), injected: uint64(i) * 1000, ok: true} }, ResyncDeadline, ms(10000)},
		// conntrackd restarted mid-wait: its counters start over, which is no burst by itself.
		{"counters reset", func(i int) step {
			if i <= 3 {
				return step{received: uint64(i), injected: uint64(i) * 100, ok: true}
			}
			return step{received: 1, injected: 0, ok: true}
		}, ResyncDone, ms(1100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, at := run(tc.f)
			if o != tc.want || at != tc.at {
				t.Errorf("outcome %q at %v, want %q at %v", o, at, tc.want, tc.at)
			}
		})
	}
}

// TestHold: values are kept (the last one) until the release, which hands the last one on; later
// ones pass straight through, in order; a Hold whose context ends is never released.
func TestHold(t *testing.T) {
	var mu sync.Mutex
	var got []int
	out := func(v int) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, v)
	}
	seen := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	release := make(chan struct{})
	h := NewHold(context.Background(), release, out)
	h.Put(1)
	h.Put(2)
	if !h.Held() || len(seen()) != 0 {
		t.Fatalf("before the release: held %v, handed on %v", h.Held(), seen())
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); h.Held(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not released")
		}
	}
	h.Put(3)
	if want := []int{2, 3}; !slices.Equal(seen(), want) {
		t.Errorf("handed on %v, want %v", seen(), want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	got = nil
	h2 := NewHold(ctx, make(chan struct{}), out)
	h2.Put(4)
	cancel()
	time.Sleep(10 * time.Millisecond)
	if !h2.Held() || len(seen()) != 0 {
		t.Errorf("after its context ended: held %v, handed on %v", h2.Held(), seen())
	}
}

// TestResyncWithConntrackd runs two supervisors of Debian's conntrackd, each in a network
// namespace of its own joined by a veth pair: "a" holds 100 flows; "b" starts with an empty table,
// and its wait for the initial resync must end as done only once b's kernel holds a's flows. Then
// b starts again alone (a stopped): its wait ends because the peer says nothing. Both families:
// the IPv6 run syncs IPv6 flows over an IPv6 sync link (conntrackd takes Render's IPv6 config).
func TestResyncWithConntrackd(t *testing.T) {
	for _, bin := range []string{"conntrackd", "conntrack", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s", bin)
		}
	}
	for _, fam := range []struct {
		name, a, b, bits, family, src, dst string
	}{
		{"IPv4", "198.51.100.1", "198.51.100.2", "24", "ipv4", "10.1.1.1", "10.2.2.2"},
		{"IPv6", "2001:db8:1::1", "2001:db8:1::2", "64", "ipv6", "2001:db8:a::1", "2001:db8:b::2"},
	} {
		t.Run(fam.name, func(t *testing.T) { testResyncWithConntrackd(t, fam.a, fam.b, fam.bits, fam.family, fam.src, fam.dst) })
	}
}

func testResyncWithConntrackd(t *testing.T, addrA, addrB, bits, family, src, dst string) {
	_, nsA := netnsOrSkip(t, "rsa")
	_, nsB := netnsOrSkip(t, "rsb")
	sh := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	veth := fmt.Sprintf("vgr%d", os.Getpid()%100000)
	sh("ip", "link", "add", veth+"a", "netns", nsA, "type", "veth", "peer", "name", veth+"b", "netns", nsB)
	for _, side := range []struct{ ns, dev, addr string }{{nsA, veth + "a", addrA}, {nsB, veth + "b", addrB}} {
		// nodad: the address is usable at once (conntrackd binds it when it starts).
		sh("ip", "-n", side.ns, "addr", "add", side.addr+"/"+bits, "dev", side.dev, "nodad")
		sh("ip", "-n", side.ns, "link", "set", side.dev, "up")
		sh("ip", "-n", side.ns, "link", "set", "lo", "up")
	}
	for i := range 100 {
		sh("ip", "netns", "exec", nsA, "conntrack", "-I", "-p", "tcp", "-s", src, "-d", dst, "--sport", strconv.Itoa(20000+i),
			"--dport", "80", "--state", "ESTABLISHED", "-t", "600", "-u", "ASSURED")
	}
	flowsIn := func(ns string) int {
		out, _ := exec.Command("ip", "netns", "exec", ns, "conntrack", "-L", "-f", family, "-p", "tcp", "-d", dst).CombinedOutput()
		return strings.Count(string(out), "tcp ")
	}
	// Each daemon runs in its namespace through a wrapper: the supervisor's client commands too.
	start := func(ns, dev, local, peer string) (*Supervisor, func()) {
		t.Helper()
		dir := t.TempDir()
		wrapper := filepath.Join(dir, "conntrackd")
		if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec ip netns exec "+ns+" conntrackd \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		s, err := NewSupervisor(hclog.NewNullLogger(), Config{Interface: dev, LocalAddress: addr(local), Peer: addr(peer), Port: 3780,
			Dir: filepath.Join(dir, "state")}, wrapper, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		_, stopRelay := startRelay(t, ns, addr(local), addr(peer), 3780, [][]byte{testKey})
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		stop := func() { cancel(); <-done; stopRelay() }
		t.Cleanup(stop)
		return s, stop
	}
	wait := func(s *Supervisor) Status {
		t.Helper()
		select {
		case <-s.Resynced():
		case <-time.After(20 * time.Second):
			t.Fatalf("the wait for the initial resync never ended: %+v", s.Status())
		}
		return s.Status()
	}
	a, stopA := start(nsA, veth+"a", addrA, addrB)
	// a's own wait: b is not there yet.
	if st := wait(a); st.Resync != ResyncNoPeer {
		t.Errorf("a alone: initial resync %q after %v, want %q", st.Resync, st.ResyncAfter, ResyncNoPeer)
	}
	b, stopB := start(nsB, veth+"b", addrB, addrA)
	st := wait(b)
	got := flowsIn(nsB)
	t.Logf("b: initial resync %s after %v, %d of a's 100 flows in b's kernel then", st.Resync, st.ResyncAfter, got)
	if st.Resync != ResyncDone || got != 100 {
		t.Errorf("b: initial resync %q with %d of a's 100 flows in its kernel, want %q with all", st.Resync, got, ResyncDone)
	}
	if !strings.Contains(st.String(), "initial resync: done after") {
		t.Errorf("status line %q", st.String())
	}
	stopB()
	stopA()
	sh("ip", "netns", "exec", nsB, "conntrack", "-F")
	b, _ = start(nsB, veth+"b", addrB, addrA)
	if st := wait(b); st.Resync != ResyncNoPeer {
		t.Errorf("b alone: initial resync %q after %v, want %q", st.Resync, st.ResyncAfter, ResyncNoPeer)
	}
}
