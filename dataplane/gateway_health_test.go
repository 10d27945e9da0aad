package dataplane

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
func healthTarget(t *testing.T, serve func(net.Conn)) HealthTarget {
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
	return HealthTarget{Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(ln.Addr().(*net.TCPAddr).Port)}
}

// TestProberOutcomes: a node whose health check answers 200 is used; 503, garbage, a closed port and
// silence each take it out (silence only after ProbeFall probes), and nothing else is disturbed.
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
	closed := HealthTarget{Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(closedLn.Addr().(*net.TCPAddr).Port)}
	closedLn.Close()

	p := NewProber(hclog.NewNullLogger(), ProberOptions{Interval: 100 * time.Millisecond})
	defer p.Close()
	all := []HealthTarget{ok, noEps, garbage, silent, closed}
	p.SetTargets(all)
	want := map[HealthTarget]ProbeOutcome{ok: ProbeHealthy, noEps: ProbeNoEndpoints, garbage: ProbeBadAnswer, silent: ProbeUnreachable, closed: ProbeRefused}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		got := p.Outcomes()
		done := true
		for tg, o := range want {
			done = done && got[tg] == o
		}
		// Unreachable needs ProbeFall probes before the target is out.
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
