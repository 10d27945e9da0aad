package healthprobe

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// healthTarget starts a listener on an ephemeral loopback port that answers each connection with
// serve, and returns its target. Loopback listeners only: nothing is added to the namespace.
func healthTarget(t *testing.T, serve func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(ln.Addr().(*net.TCPAddr).Port))
}

// TestProberOutcomes: a node whose health check answers 200 is used; 503, garbage, a closed port and
// silence each take it out (silence only after Fall probes), and nothing else is disturbed.
func TestProberOutcomes(t *testing.T) {
	ok := healthTarget(t, func(c net.Conn) {
		buf := make([]byte, 1024)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
	})
	noEps := healthTarget(t, func(c net.Conn) {
		buf := make([]byte, 1024)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
	})
	garbage := healthTarget(t, func(c net.Conn) {
		buf := make([]byte, 1024)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("\x00\x01 this is not HTTP at all\r\n\r\n"))
	})
	silent := healthTarget(t, func(c net.Conn) { time.Sleep(2 * time.Second) })
	// A port that was open and is closed now: connections are refused.
	closedLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(closedLn.Addr().(*net.TCPAddr).Port))
	closedLn.Close()

	p := New[netip.AddrPort](hclog.NewNullLogger(), Options{Interval: 100 * time.Millisecond})
	defer p.Close()
	all := []netip.AddrPort{ok, noEps, garbage, silent, closed}
	p.SetTargets(all)
	want := map[netip.AddrPort]Outcome{ok: Healthy, noEps: NoEndpoints, garbage: BadAnswer, silent: Unreachable, closed: Refused}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		got := p.Outcomes()
		done := true
		for tg, o := range want {
			done = done && got[tg] == o
		}
		// Unreachable needs Fall probes before the target is out.
		if done && !p.Snapshot()[silent] {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h := p.Snapshot()
	for _, tg := range all {
		if h[tg] != (tg == ok) {
			t.Errorf("%s (%s): usable %v, want %v", tg, want[tg], h[tg], tg == ok)
		}
	}
}

// TestProberRecord: the usability rules on a sequence of outcomes, without probes: one unreachable
// probe does not take a usable target out, Fall in a row do, a healthy answer in between resets the
// count, definitive answers take it out at once, and OnChange is called on every change only.
func TestProberRecord(t *testing.T) {
	changes := 0
	p := New[netip.AddrPort](hclog.NewNullLogger(), Options{OnChange: func() { changes++ }})
	tg := netip.MustParseAddrPort("192.0.2.11:32001")
	p.targets[tg] = &probeState{cancel: func() {}, since: time.Now()}
	steps := []struct {
		o       Outcome
		usable  bool
		changes int
	}{
		{Healthy, true, 1},
		{Unreachable, true, 1},
		{Healthy, true, 1}, // the unreachable count starts again
		{Unreachable, true, 1},
		{Unreachable, false, 2}, // Fall in a row
		{Unreachable, false, 2},
		{Healthy, true, 3},
		{Refused, false, 4},
		{Healthy, true, 5},
		{NoEndpoints, false, 6},
		{Healthy, true, 7},
		{BadAnswer, false, 8},
	}
	for i, s := range steps {
		p.record(tg, s.o)
		if got := p.Snapshot()[tg]; got != s.usable || changes != s.changes {
			t.Fatalf("step %d (%s): usable %v, %d changes; want %v, %d", i, s.o, got, changes, s.usable, s.changes)
		}
		if p.Outcomes()[tg] != s.o {
			t.Fatalf("step %d: outcome %s, want %s", i, p.Outcomes()[tg], s.o)
		}
	}
	// An outcome for a target that is no longer probed changes nothing.
	p.record(netip.MustParseAddrPort("192.0.2.12:32001"), Healthy)
	if len(p.Snapshot()) != 0 || changes != 8 {
		t.Errorf("an unknown target's outcome was recorded: %v, %d changes", p.Snapshot(), changes)
	}
}

// badTarget is a Target whose String is no address:port.
type badTarget string

func (b badTarget) String() string { return string(b) }

// TestProberBadTarget: a target that does not say an address and port is not probed (so never
// usable) and does not keep WaitProbed waiting.
func TestProberBadTarget(t *testing.T) {
	p := New[badTarget](hclog.NewNullLogger(), Options{Interval: time.Hour})
	defer p.Close()
	p.SetTargets([]badTarget{"node1", "192.0.2.11", "192.0.2.11:http"})
	if o := p.Outcomes(); len(o) != 0 {
		t.Errorf("bad targets probed: %v", o)
	}
	p.WaitProbed(context.Background(), time.Minute) // returns at once: nothing to wait for
}
