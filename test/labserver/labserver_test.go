package main

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// These tests run the server and the probes over loopback; they need no root.

func listenTCP(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("%s listen: %v", network, err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveTCP("pod-a", ln)
	return ln
}

func TestTCPProbe(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		ln := listenTCP(t, tc.network, tc.addr)
		r := probeOnce(target{"tcp", ln.Addr().String()}, time.Second)
		f := fields(r.reply)
		if r.kind != "" || f["name"] != "pod-a" || f["dst"] != ln.Addr().String() || !strings.HasPrefix(f["src"], strings.Split(tc.addr, ":0")[0]) {
			t.Errorf("%s probe: %+v", tc.network, r)
		}
	}
}

func TestUDPProbe(t *testing.T) {
	for _, tc := range []struct {
		network, addr string
		v6            bool
	}{{"udp4", "127.0.0.1:0", false}, {"udp6", "[::1]:0", true}} {
		pc, err := net.ListenPacket(tc.network, tc.addr)
		if err != nil {
			t.Skipf("%s: %v", tc.network, err)
		}
		defer pc.Close()
		if err := startUDP("pod-u", pc, tc.v6); err != nil {
			t.Fatal(err)
		}
		r := probeOnce(target{"udp", pc.LocalAddr().String()}, time.Second)
		f := fields(r.reply)
		// dst comes from IP_PKTINFO, so it is the concrete address, not the wildcard.
		if r.kind != "" || f["name"] != "pod-u" || f["dst"] != pc.LocalAddr().String() {
			t.Errorf("%s probe: %+v", tc.network, r)
		}
	}
}

func TestErrorKinds(t *testing.T) {
	// A port nobody listens on: TCP gets a RST, UDP an ICMP port unreachable.
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	for _, proto := range []string{"tcp", "udp"} {
		if r := probeOnce(target{proto, closed}, time.Second); r.kind != "refused" {
			t.Errorf("%s to a closed port: %+v, want refused", proto, r)
		}
	}
	// A TCP server that accepts but never speaks: timeout.
	silent, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer silent.Close()
	if r := probeOnce(target{"tcp", silent.Addr().String()}, 100*time.Millisecond); r.kind != "timeout" {
		t.Errorf("silent server: %+v, want timeout", r)
	}
}

func TestHoldEcho(t *testing.T) {
	ln := listenTCP(t, "tcp4", "127.0.0.1:0")
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if greeting, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(greeting, "name=pod-a ") {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	c.Write([]byte("hold\nping 1\n"))
	if echo, err := r.ReadString('\n'); err != nil || echo != "ping 1\n" {
		t.Errorf("echo %q, %v", echo, err)
	}
}

func TestProbeManySummary(t *testing.T) {
	ln := listenTCP(t, "tcp4", "127.0.0.1:0")
	got := fields(probeMany(target{"tcp", ln.Addr().String()}, time.Second, 20, time.Millisecond))
	if got["sent"] != "20" || got["ok"] != "20" || got["lost"] != "0" || got["pods"] != "pod-a:20" || got["srcs"] != "127.0.0.1:20" {
		t.Errorf("summary %v", got)
	}

	// All lost: the gap spans the whole run.
	ln2, _ := net.Listen("tcp4", "127.0.0.1:0")
	closed := ln2.Addr().String()
	ln2.Close()
	got = fields(probeMany(target{"tcp", closed}, time.Second, 5, 10*time.Millisecond))
	if got["ok"] != "0" || got["lost"] != "5" || got["max_gap_probes"] != "5" || got["errors"] != "refused:5" {
		t.Errorf("summary %v", got)
	}
	t.Logf("all-lost gap: %sms for 5 probes at 10ms", got["max_gap_ms"])
}

func TestHTTPProbe(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serveHTTP("pod-h", ln)
	r := probeOnce(target{"http", ln.Addr().String()}, time.Second)
	if f := fields(r.reply); r.kind != "" || f["name"] != "pod-h" || f["dst"] != ln.Addr().String() {
		t.Errorf("http probe: %+v", r)
	}
}
