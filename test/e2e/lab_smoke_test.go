package e2e

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// smokeSpec is the lab of the smoke test: two nodes, pods spread unevenly.
var smokeSpec = lab.Spec{Nodes: []lab.NodeSpec{
	{Name: "node1", Pods: []string{"web-1", "web-2"}},
	{Name: "node2", Pods: []string{"web-3"}},
}}

// TestLabSmoke checks the lab itself, before anything of vipgate runs in it:
// the flat pod network, the router's view of the world, AddRoute, the probe
// modes, and that Close leaves nothing behind.
func TestLabSmoke(t *testing.T) {
	lab.SkipUnlessRoot(t)
	start := time.Now()
	l, err := lab.New(smokeSpec, t.Logf)
	if err != nil {
		t.Fatalf("building lab: %v", err)
	}
	// Close is checked explicitly at the end; the cleanup covers failures.
	t.Cleanup(func() { l.Close() })
	t.Logf("lab with servers up in %v", time.Since(start).Round(time.Millisecond))

	web1, web2, web3 := l.Pod("web-1"), l.Pod("web-2"), l.Pod("web-3")
	t.Run("addresses", func(t *testing.T) {
		want := map[string]string{
			"web-1": "10.244.1.11 2001:db8:244:1::11",
			"web-2": "10.244.1.12 2001:db8:244:1::12",
			"web-3": "10.244.2.11 2001:db8:244:2::11",
		}
		for name, addrs := range want {
			p := l.Pod(name)
			if got := p.IPv4.String() + " " + p.IPv6.String(); got != addrs {
				t.Errorf("pod %s: addresses %q, want %q", name, got, addrs)
			}
		}
		if n := l.Node("node2"); n.IPv4.String() != "192.0.2.12" || n.IPv6.String() != "2001:db8:1::12" || n.Index != 2 {
			t.Errorf("node2 = %+v", n)
		}
		out, err := l.Exec("web-3", "ip", "-br", "addr", "show", "eth0")
		if err != nil || !strings.Contains(out, "10.244.2.11/24") || !strings.Contains(out, "2001:db8:244:2::11/64") {
			t.Errorf("web-3 eth0: %q, %v", out, err)
		}
	})

	t.Run("sysctls", func(t *testing.T) {
		for key, want := range map[string]string{
			"net.ipv4.ip_forward":                  "1",
			"net.ipv6.conf.all.forwarding":         "1",
			"net.ipv4.conf.all.rp_filter":          "0",
			"net.ipv4.conf.eth0.rp_filter":         "0",
			"net.ipv4.conf.all.route_localnet":     "0",
			"net.ipv6.conf.eth0.accept_dad":        "0",
			"net.ipv4.conf.default.route_localnet": "0",
		} {
			out, err := l.Exec("node1", "sysctl", "-n", key)
			if err != nil || strings.TrimSpace(out) != want {
				t.Errorf("node1 %s = %q (%v), want %s", key, strings.TrimSpace(out), err, want)
			}
		}
	})

	// A pod reaches a pod on the other node directly (routed by the nodes),
	// and the server sees the real pod address: no NAT anywhere yet.
	t.Run("pod to pod across nodes", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			for _, v6 := range []bool{false, true} {
				dst, src := web3.IPv4, web1.IPv4
				if v6 {
					dst, src = web3.IPv6, web1.IPv6
				}
				r := smokeProbe(t, l, "web-1", proto, dst, 8080)
				if r.Pod != "web-3" || r.Src.Addr() != src || r.Dst.Addr() != dst {
					t.Errorf("%s web-1 -> %s: %v, want web-3 seeing src %s", proto, dst, r, src)
				}
			}
		}
		// HTTP on the pods' HTTP port.
		for _, dst := range []netip.Addr{web3.IPv4, web3.IPv6} {
			if r := smokeProbe(t, l, "web-1", "http", dst, lab.DefaultHTTPPort); r.Pod != "web-3" || r.Dst.Addr() != dst {
				t.Errorf("http web-1 -> %s: %v", dst, r)
			}
		}
		// The second server port and the same-node path work too.
		if r := smokeProbe(t, l, "web-2", "tcp", web1.IPv4, 8081); r.Pod != "web-1" || r.Src.Addr() != web2.IPv4 {
			t.Errorf("web-2 -> web-1:8081: %v", r)
		}
	})

	t.Run("rejects and drops are told apart", func(t *testing.T) {
		// Nothing listens on the nodes: the kernel answers RST.
		if r := smokeProbe(t, l, "lanclient", "tcp", l.Node("node1").IPv4, 8080); r.Err != "refused" {
			t.Errorf("lanclient -> node1:8080: %v, want refused", r)
		}
		// UDP to a closed port: ICMP port unreachable.
		if r := smokeProbe(t, l, "lanclient", "udp", l.Node("node1").IPv6, 8080); r.Err != "refused" {
			t.Errorf("udp lanclient -> node1:8080: %v, want refused", r)
		}
		// The router has no route to pods: ICMP network unreachable.
		if r := smokeProbe(t, l, "client", "tcp", web3.IPv4, 8080); r.Err != "unreachable" {
			t.Errorf("client -> web-3 without a route: %v, want unreachable", r)
		}
	})

	t.Run("AddRoute", func(t *testing.T) {
		for _, pfx := range []netip.Prefix{lab.PodCIDRv4(2), lab.PodCIDRv6(2)} {
			if err := l.AddRoute(pfx, "node2"); err != nil {
				t.Fatal(err)
			}
		}
		for _, dst := range []netip.Addr{web3.IPv4, web3.IPv6} {
			want := lab.Clientv4
			if dst.Is6() {
				want = lab.Clientv6
			}
			if r := smokeProbe(t, l, "client", "tcp", dst, 8080); r.Pod != "web-3" || r.Src.Addr() != want {
				t.Errorf("client -> %s routed to node2: %v, want web-3 seeing %s", dst, r, want)
			}
		}
		for _, pfx := range []netip.Prefix{lab.PodCIDRv4(2), lab.PodCIDRv6(2)} {
			if err := l.DelRoute(pfx); err != nil {
				t.Fatal(err)
			}
		}
		if r := smokeProbe(t, l, "client", "tcp", web3.IPv4, 8080); r.Err != "unreachable" {
			t.Errorf("client -> web-3 after DelRoute: %v, want unreachable", r)
		}
	})

	t.Run("ProbeMany", func(t *testing.T) {
		s, err := l.ProbeMany("web-1", "udp", smokeHostPort(web3.IPv6, 8080), 50, 2*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.Sent != 50 || s.OK != 50 || s.Pods["web-3"] != 50 || s.Sources[web1.IPv6.String()] != 50 {
			t.Errorf("summary %+v", s)
		}
		t.Logf("%s", strings.TrimSpace(s.Output))
	})

	t.Run("hold", func(t *testing.T) {
		h, err := l.StartHold("web-2", smokeHostPort(web3.IPv4, 8080), 3, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		pods, err := h.WaitOpened(5 * time.Second)
		if err != nil || pods["web-3"] != 3 {
			t.Fatalf("opened: %v %v", pods, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := h.Wait(ctx)
		if err != nil || r.Opened != 3 || r.Broken != 0 {
			t.Errorf("hold: %+v %v", r, err)
		}
	})

	// Close must leave no namespace and no process behind.
	server := l.Server("web-1")
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	names, err := lab.Namespaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, l.Prefix()) {
			t.Errorf("namespace %s left after Close", n)
		}
	}
	if exited, _ := server.Exited(); !exited {
		t.Errorf("web-1's server still runs after Close")
	}
}

func smokeHostPort(a netip.Addr, port int) string {
	return net.JoinHostPort(a.String(), strconv.Itoa(port))
}

func smokeProbe(t *testing.T, l *lab.Lab, from, proto string, dst netip.Addr, port int) lab.ProbeResult {
	t.Helper()
	r, err := l.Probe(from, proto, smokeHostPort(dst, port))
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return r
}
