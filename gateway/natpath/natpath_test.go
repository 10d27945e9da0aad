package natpath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/test/lab"
)

// The real-kernel tests: a client, a gateway and a backend host, each a network namespace of the
// test's own, the program loaded and attached in the gateway's, real datagrams and connections.
//
//	client  eth0 198.51.100.10/24, 2001:db8:c::10/64 (default via the gateway)
//	  |
//	gateway s0 198.51.100.1/24, 2001:db8:c::1/64 | n0 192.0.2.1/24, 2001:db8:b::1/64; forwarding on
//	  |
//	backend eth0 192.0.2.11/24, 2001:db8:b::11/64; pods on lo: 10.244.1.11-13, 2001:db8:d::11-13;
//	        routes to the client's subnet via the gateway
//
// The gateway routes the pods' addresses via the backend host.

var (
	clientV4 = netip.MustParseAddr("198.51.100.10")
	clientV6 = netip.MustParseAddr("2001:db8:c::10")
	gwNodeV4 = netip.MustParseAddr("192.0.2.1")
	gwNodeV6 = netip.MustParseAddr("2001:db8:b::1")
	nodeV4   = netip.MustParseAddr("192.0.2.11")
	nodeV6   = netip.MustParseAddr("2001:db8:b::11")
	vipV4    = netip.MustParseAddr("203.0.113.50")
	vipV6    = netip.MustParseAddr("2001:db8:f::50")
	podsV4   = []netip.Addr{netip.MustParseAddr("10.244.1.11"), netip.MustParseAddr("10.244.1.12"), netip.MustParseAddr("10.244.1.13")}
	podsV6   = []netip.Addr{netip.MustParseAddr("2001:db8:d::11"), netip.MustParseAddr("2001:db8:d::12"), netip.MustParseAddr("2001:db8:d::13")}
)

type testLab struct {
	client, gw, backend string
	router              string // "" without one (newTestLabWith)
}

func newTestLab(t testing.TB) *testLab { return newTestLabWith(t, false) }

// newTestLabWith builds the lab; withRouter puts a router between the client and the gateway
// whose link to the client has an MTU of 1280 (the client's own is 1500), so packets to the client
// larger than that draw an ICMP error from it (path MTU discovery):
//
//	client  eth0 198.51.100.10/24, 2001:db8:c::10/64 (default via the router)
//	router  c0 198.51.100.1/24, 2001:db8:c::1/64, MTU 1280 | g0 203.0.113.241/30, 2001:db8:e::1/64
//	gateway s0 203.0.113.242/30, 2001:db8:e::2/64 | n0 as without the router
func newTestLabWith(t testing.TB, withRouter bool) *testLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, BPF)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip")
	}
	p := fmt.Sprintf("vgt%d-np%d-", os.Getpid(), labSeq.Add(1))
	l := &testLab{client: p + "c", gw: p + "g", backend: p + "b"}
	all := []string{l.client, l.gw, l.backend}
	if withRouter {
		l.router = p + "r"
		all = append(all, l.router)
	}
	for _, ns := range all {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	batch := func(ns string, cmds ...string) {
		t.Helper()
		cmd := exec.Command("ip", "-n", ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("netns %s: ip -batch: %v: %s", ns, err, out)
		}
	}
	sysctl := func(ns string, kv ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "sysctl", "-qw"}, kv...)...).CombinedOutput(); err != nil {
			t.Fatalf("sysctl in %s: %v: %s", ns, err, out)
		}
	}
	batch(l.gw, "link add n0 type veth peer name eth0 netns "+l.backend)
	if withRouter {
		batch(l.client, "link add eth0 type veth peer name c0 netns "+l.router)
		batch(l.router, "link add g0 type veth peer name s0 netns "+l.gw)
		batch(l.router,
			"addr add 198.51.100.1/24 dev c0", "addr add 2001:db8:c::1/64 dev c0 nodad", "link set c0 mtu 1280",
			"addr add 203.0.113.241/30 dev g0", "addr add 2001:db8:e::1/64 dev g0 nodad",
			"link set c0 up", "link set g0 up", "link set lo up",
			"route add 203.0.113.0/25 via 203.0.113.242", "route add 2001:db8:f::/64 via 2001:db8:e::2")
		batch(l.gw, "addr add 203.0.113.242/30 dev s0", "addr add 2001:db8:e::2/64 dev s0 nodad")
		sysctl(l.router, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	} else {
		batch(l.client, "link add eth0 type veth peer name s0 netns "+l.gw)
		batch(l.gw, "addr add 198.51.100.1/24 dev s0", "addr add 2001:db8:c::1/64 dev s0 nodad")
	}
	batch(l.client,
		"addr add 198.51.100.10/24 dev eth0", "addr add 2001:db8:c::10/64 dev eth0 nodad",
		"link set eth0 up", "link set lo up",
		"route add default via 198.51.100.1", "route add default via 2001:db8:c::1")
	batch(l.gw,
		"addr add 192.0.2.1/24 dev n0", "addr add 2001:db8:b::1/64 dev n0 nodad",
		"link set s0 up", "link set n0 up", "link set lo up",
		"route add 10.244.1.0/24 via 192.0.2.11", "route add 2001:db8:d::/64 via 2001:db8:b::11")
	batch(l.backend,
		"addr add 192.0.2.11/24 dev eth0", "addr add 2001:db8:b::11/64 dev eth0 nodad",
		"addr add 10.244.1.11/32 dev lo", "addr add 10.244.1.12/32 dev lo", "addr add 10.244.1.13/32 dev lo",
		"addr add 2001:db8:d::11/128 dev lo", "addr add 2001:db8:d::12/128 dev lo", "addr add 2001:db8:d::13/128 dev lo",
		"link set eth0 up", "link set lo up",
		"route add 198.51.100.0/24 via 192.0.2.1", "route add 2001:db8:c::/64 via 2001:db8:b::1")
	if withRouter {
		batch(l.gw, "route add 198.51.100.0/24 via 203.0.113.241", "route add 2001:db8:c::/64 via 2001:db8:e::1")
	}
	sysctl(l.gw, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	sysctl(l.backend, "net.ipv4.conf.all.rp_filter=0")
	return l
}

var labSeq atomic.Int32

// in runs fn on a thread in network namespace ns (sockets it opens stay there).
var in = lab.InNetns

// load loads the program in the gateway's namespace and attaches it to both its devices.
func (l *testLab) load(t testing.TB, cfg Config) *Path {
	t.Helper()
	p := l.loadQuiet(t, cfg)
	t.Cleanup(func() { _ = in(l.gw, p.Detach); p.Close() })
	return p
}

// udpEcho listens on addr in ns and answers every datagram with "<its source> <payload>".
func udpEcho(t *testing.T, ns string, addr netip.AddrPort) {
	t.Helper()
	var c *net.UDPConn
	if err := in(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte(from.String()+" "+string(buf[:n])), from)
		}
	}()
}

// udpAsk sends msg from the client namespace (source port sport, 0: any) to dst and returns the
// answer and who sent it.
func udpAsk(ns string, sport uint16, dst netip.AddrPort, msg string) (string, netip.AddrPort, error) {
	var c *net.UDPConn
	if err := in(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: int(sport)})
		return err
	}); err != nil {
		return "", netip.AddrPort{}, err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for try := 0; try < 20; try++ {
		if _, err := c.WriteToUDPAddrPort([]byte(msg), dst); err != nil {
			return "", netip.AddrPort{}, err
		}
		_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err == nil {
			return string(buf[:n]), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return "", netip.AddrPort{}, err
		}
	}
	return "", netip.AddrPort{}, fmt.Errorf("no answer from %s", dst)
}

func TestUDPDirectAndSNAT(t *testing.T) {
	l := newTestLab(t)
	for _, a := range append(append([]netip.Addr{}, podsV4...), podsV6...) {
		udpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
	}
	udpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv4Unspecified(), 30080))
	udpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30081))
	p := l.load(t, Config{})
	table := func(bs ...netip.AddrPort) []netip.AddrPort {
		out := make([]netip.AddrPort, 7)
		for i := range out {
			out[i] = bs[i%len(bs)]
		}
		return out
	}
	ap := netip.AddrPortFrom
	if err := p.Sync([]VIPPort{
		{VIP: vipV4, Proto: 17, Port: 5000, Table: table(ap(podsV4[0], 8080), ap(podsV4[1], 8080))},
		{VIP: vipV6, Proto: 17, Port: 5000, Table: table(ap(podsV6[0], 8080), ap(podsV6[1], 8080))},
		{VIP: vipV4, Proto: 17, Port: 5001, SNAT: true, Table: table(ap(nodeV4, 30080))},
		{VIP: vipV6, Proto: 17, Port: 5001, SNAT: true, Table: table(ap(nodeV6, 30081))},
	}); err != nil {
		t.Fatal(err)
	}
	if n, tabs := p.Ports(); n != 4 || tabs != 4 {
		t.Fatalf("ports %d, tables %d, want 4, 4", n, tabs)
	}
	for _, c := range []struct {
		client, vip netip.Addr
		port        uint16
		wantSrc     netip.Addr // what the backend sees
		snat        bool
	}{
		{clientV4, vipV4, 5000, clientV4, false},
		{clientV6, vipV6, 5000, clientV6, false},
		{clientV4, vipV4, 5001, gwNodeV4, true},
		{clientV6, vipV6, 5001, gwNodeV6, true},
	} {
		for sport := uint16(40000); sport < 40004; sport++ {
			dst := ap(c.vip, c.port)
			got, from, err := udpAsk(l.client, sport, dst, "hello")
			if err != nil {
				t.Fatalf("%s from port %d: %v", dst, sport, err)
			}
			if from != dst {
				t.Errorf("%s: answer from %s, want the VIP port (the reply's source rewritten back)", dst, from)
			}
			seen, _, _ := strings.Cut(got, " ")
			src, err := netip.ParseAddrPort(seen)
			if err != nil {
				t.Fatalf("%s: answer %q", dst, got)
			}
			if src.Addr().Unmap() != c.wantSrc {
				t.Errorf("%s: the backend saw %s, want %s", dst, src, c.wantSrc)
			}
			if c.snat && (src.Port() < DefaultSNATPortMin) || !c.snat && src.Port() != sport {
				t.Errorf("%s: the backend saw port %d (client's %d, SNAT %v)", dst, src.Port(), sport, c.snat)
			}
		}
	}
	cnt, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counters %+v", cnt)
	if cnt.New != 16 || cnt.Replies < 16 {
		t.Errorf("counters %+v: want 16 new flows and their replies taken by the program", cnt)
	}
	flows, err := p.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 32 {
		t.Errorf("%d flow entries, want 32 (16 flows, 2 each)", len(flows))
	}
	// Stale: the flows to the first IPv4 pod end (both entries).
	n, err := p.DeleteFlows(func(f Flow) bool { return f.NewDst.Addr() == podsV4[0] })
	if err != nil {
		t.Fatal(err)
	}
	after, _ := p.Flows(0)
	if n == 0 || len(after) != 32-2*n {
		t.Errorf("deleted %d flows, %d entries left of 32", n, len(after))
	}
	// A VIP port removed: the program no longer takes it (the stack has no rule for it here:
	// no answer).
	if err := p.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if n, tabs := p.Ports(); n != 0 || tabs != 0 {
		t.Fatalf("after removing all: ports %d, tables %d", n, tabs)
	}
}

// noChecksumOffload turns transmit checksum offload off on the client's and the backend's
// devices: their packets then carry complete checksums, which the receivers verify in software
// (over veth with offload on, a receiver trusts a CHECKSUM_PARTIAL packet unchecked, so a wrong
// update would go unseen).
func (l *testLab) noChecksumOffload(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("needs ethtool")
	}
	for _, ns := range []string{l.client, l.backend} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off").CombinedOutput(); err != nil {
			t.Fatalf("ethtool in %s: %v: %s", ns, err, out)
		}
	}
}

// csumErrors reads a namespace's transport checksum error counters (/proc/net/snmp's Tcp and Udp
// InCsumErrors, snmp6's Udp6InCsumErrors).
func csumErrors(t *testing.T, ns string) map[string]string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-c", "cat /proc/net/snmp /proc/net/snmp6").CombinedOutput()
	if err != nil {
		t.Fatalf("reading counters in %s: %v: %s", ns, err, out)
	}
	got := map[string]string{}
	var header []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && strings.HasSuffix(f[0], "InCsumErrors"):
			got[f[0]] = f[1]
		case len(f) > 1 && (f[0] == "Tcp:" || f[0] == "Udp:"):
			if header == nil || header[0] != f[0] {
				header = f // the names; the next line of that prefix holds the values
				continue
			}
			for j, name := range header {
				if name == "InCsumErrors" && j < len(f) {
					got[f[0]+name] = f[j]
				}
			}
			header = nil
		}
	}
	if len(got) < 3 {
		t.Fatalf("checksum error counters not found in %s: %v", ns, got)
	}
	return got
}

// tcpListen listens on addr in ns and runs handle on each connection (which it then closes).
func tcpListen(t *testing.T, ns string, addr netip.AddrPort, handle func(net.Conn)) {
	t.Helper()
	var ln *net.TCPListener
	if err := in(ns, func() error {
		var err error
		ln, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// tcpEcho listens on addr in ns and echoes each connection's bytes, prefixed once by its peer.
func tcpEcho(t *testing.T, ns string, addr netip.AddrPort) {
	t.Helper()
	tcpListen(t, ns, addr, func(c net.Conn) {
		if _, err := c.Write([]byte(c.RemoteAddr().String() + "\n")); err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	})
}

// tcpServe listens on addr in ns and sends payload to each connection, then closes it.
func tcpServe(t *testing.T, ns string, addr netip.AddrPort, payload []byte) {
	t.Helper()
	tcpListen(t, ns, addr, func(c net.Conn) { _, _ = c.Write(payload) })
}

// dialTCP connects from namespace ns to dst.
func dialTCP(t *testing.T, ns string, dst netip.AddrPort) *net.TCPConn {
	t.Helper()
	var c *net.TCPConn
	if err := in(ns, func() error {
		d, err := net.DialTimeout("tcp", dst.String(), 5*time.Second)
		if err == nil {
			c = d.(*net.TCPConn)
		}
		return err
	}); err != nil {
		t.Fatalf("connecting to %s: %v", dst, err)
	}
	return c
}

// TestTCPChecksums: TCP connections through the program, both families, direct and masqueraded,
// with complete checksums everywhere (no offload), 1 MB each way per connection: every segment's
// rewrite is verified by a receiver, and the streams come back intact.
func TestTCPChecksums(t *testing.T) {
	l := newTestLab(t)
	l.noChecksumOffload(t)
	for _, a := range []netip.Addr{podsV4[0], podsV6[0]} {
		tcpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
		udpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
	}
	tcpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30080))
	udpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30080))
	p := l.load(t, Config{})
	ap := netip.AddrPortFrom
	var ports []VIPPort
	for _, proto := range []uint8{6, 17} {
		ports = append(ports,
			VIPPort{VIP: vipV4, Proto: proto, Port: 80, Table: []netip.AddrPort{ap(podsV4[0], 8080)}},
			VIPPort{VIP: vipV6, Proto: proto, Port: 80, Table: []netip.AddrPort{ap(podsV6[0], 8080)}},
			VIPPort{VIP: vipV4, Proto: proto, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV4, 30080)}},
			VIPPort{VIP: vipV6, Proto: proto, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV6, 30080)}})
	}
	if err := p.Sync(ports); err != nil {
		t.Fatal(err)
	}
	before := csumErrors(t, l.backend)
	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, dst := range []netip.AddrPort{ap(vipV4, 80), ap(vipV6, 80), ap(vipV4, 81), ap(vipV6, 81)} {
		// UDP with a complete checksum (IPv4 and IPv6), then TCP.
		if _, from, err := udpAsk(l.client, 0, dst, "sum"); err != nil || from != dst {
			t.Errorf("UDP %s: answer from %s, %v", dst, from, err)
		}
		tcpRoundTrip(t, l.client, dst, payload)
	}
	if after := csumErrors(t, l.backend); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("checksum errors at the backend: %v, before %v", after, before)
	}
	if got := csumErrors(t, l.client); len(got) > 0 {
		for k, v := range got {
			if v != "0" {
				t.Errorf("checksum errors at the client: %s %s", k, v)
			}
		}
	}
	cnt, _ := p.Counters()
	t.Logf("counters %+v", cnt)
	if cnt.New != 8 {
		t.Errorf("counters %+v: want 8 flows taken (4 UDP, 4 TCP)", cnt)
	}
}

func readAll(c net.Conn) ([]byte, error) {
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

// TestMaglevAgreement: the program deals each new flow to the backend of the slot the nftables
// rules compute (maglev.FlowSlot over a maglev.Table), both families, with the seed the gateways
// derive from their shared key: the same flow gets the same backend from the program, from the
// family's table and from every other gateway.
func TestMaglevAgreement(t *testing.T) {
	l := newTestLab(t)
	for _, a := range append(append([]netip.Addr{}, podsV4...), podsV6...) {
		udpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
	}
	seed := maglev.DeriveHashSeed([]byte("the gateways' shared key, 32 bytes"))
	p := l.load(t, Config{HashSeed: seed})
	const m = 1021
	tables := map[netip.Addr][]netip.AddrPort{}
	var ports []VIPPort
	for vip, pods := range map[netip.Addr][]netip.Addr{vipV4: podsV4, vipV6: podsV6} {
		names := make([]string, len(pods))
		for i, a := range pods {
			names[i] = netip.AddrPortFrom(a, 8080).String()
		}
		idx, err := maglev.Table(names, m)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range idx {
			tables[vip] = append(tables[vip], netip.AddrPortFrom(pods[i], 8080))
		}
		ports = append(ports, VIPPort{VIP: vip, Proto: 17, Port: 53, Table: tables[vip]})
	}
	if err := p.Sync(ports); err != nil {
		t.Fatal(err)
	}
	seen := map[netip.AddrPort]int{}
	for _, vip := range []netip.Addr{vipV4, vipV6} {
		for sport := uint16(41000); sport < 41060; sport++ {
			got, _, err := udpAsk(l.client, sport, netip.AddrPortFrom(vip, 53), "which")
			if err != nil {
				t.Fatal(err)
			}
			_ = got
		}
	}
	flows, err := p.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Reply {
			continue
		}
		n++
		want := tables[f.Dst.Addr()][maglev.FlowSlot(f.Src, f.Dst, m, seed)]
		if f.NewDst != want {
			t.Errorf("flow %s -> %s: dealt to %s, the slot holds %s", f.Src, f.Dst, f.NewDst, want)
		}
		seen[f.NewDst]++
	}
	if n != 120 || len(seen) != 6 {
		t.Errorf("%d flows over %d backends (%v), want 120 over all 6", n, len(seen), seen)
	}
}

// The package's default seed is maglev's (natpath imports nothing of the module).
func TestDefaultHashSeed(t *testing.T) {
	if DefaultHashSeed != maglev.DefaultHashSeed {
		t.Fatalf("natpath.DefaultHashSeed %#x, maglev.DefaultHashSeed %#x", DefaultHashSeed, maglev.DefaultHashSeed)
	}
}

// TestRestart: a run ends without detaching (as `vipgate gateway` does), the program keeps
// forwarding; the next run adopts its flow table and replaces it on each interface in one step.
// A masqueraded TCP connection opened before goes on after (its port kept), and one program is
// left per interface.
func TestRestart(t *testing.T) {
	l := newTestLab(t)
	tcpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv4Unspecified(), 30080))
	ports := []VIPPort{{VIP: vipV4, Proto: 6, Port: 80, SNAT: true, Table: []netip.AddrPort{netip.AddrPortFrom(nodeV4, 30080)}}}
	var first *Path
	if err := in(l.gw, func() error {
		var err error
		if first, err = Load(Config{}); err != nil {
			return err
		}
		if err := first.Sync(ports); err != nil {
			return err
		}
		return first.Attach(gwIndexes())
	}); err != nil {
		t.Fatal(err)
	}
	c := dialTCP(t, l.client, netip.AddrPortFrom(vipV4, 80))
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	echo := func(msg string) {
		t.Helper()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, buf, err)
		}
	}
	peer, err := bufioLine(c)
	if err != nil {
		t.Fatal(err)
	}
	echo("before")
	first.Close() // the process ends; the program stays
	echo("between runs")

	var second *Path
	if err := in(l.gw, func() error {
		var err error
		if second, err = Load(Config{}); err != nil {
			return err
		}
		if err := second.Sync(ports); err != nil {
			return err
		}
		return second.Attach(gwIndexes())
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in(l.gw, second.Detach); second.Close() })
	if !second.Adopted {
		t.Fatal("the second run did not adopt the flow table")
	}
	echo("after the restart")
	flows, _ := second.Flows(0)
	t.Logf("the backend saw %s; flows after the restart: %v", peer, flows)
	if len(flows) != 2 {
		t.Errorf("%d flow entries, want the connection's 2", len(flows))
	}
	cnt, _ := second.Counters()
	if cnt.New != 0 || cnt.Forwarded == 0 {
		t.Errorf("second run's counters %+v: want the connection's packets forwarded as a known flow", cnt)
	}
	if err := in(l.gw, func() error {
		found, err := attachedPrograms()
		if err == nil && len(found) != 2 {
			err = fmt.Errorf("programs attached: %v, want one on each of the 2 interfaces", found)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
	// Cleanup takes them away.
	if err := in(l.gw, func() error {
		n, err := Cleanup()
		if err == nil && n != 2 {
			err = fmt.Errorf("cleanup detached %d programs, want 2", n)
		}
		if found, _ := attachedPrograms(); len(found) != 0 {
			err = errors.Join(err, fmt.Errorf("after cleanup: %v", found))
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}

// gwIndexes are the gateway's two interfaces (call in its namespace).
func gwIndexes() []int {
	var out []int
	for _, d := range []string{"s0", "n0"} {
		if ifi, err := net.InterfaceByName(d); err == nil {
			out = append(out, ifi.Index)
		}
	}
	return out
}

// bufioLine reads one line (the echo server's greeting) byte by byte.
func bufioLine(c net.Conn) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		if _, err := c.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
}

// fillFlows writes n flows (2n entries) into p's flow table as the program would, to n/backends
// flows per backend; the clients are 198.51.x.y, ports from 1024.
func fillFlows(t testing.TB, p *Path, n, backends int) {
	t.Helper()
	keys := make([][flowKeySize]byte, 0, 2*n)
	vals := make([][flowValSize]byte, 0, 2*n)
	now, _ := coarseNow()
	vip := netip.AddrPortFrom(vipV4, 80)
	for i := range n {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 16), byte(i >> 8)}), uint16(1024+i%50000))
		backend := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(1 + i%backends)}), 8080)
		fk, fv := flowEntry(17, client, vip, client, backend, 0, now)
		rk, rv := flowEntry(17, backend, client, vip, client, flowReply, now)
		keys, vals = append(keys, fk, rk), append(vals, fv, rv)
	}
	if _, err := p.flows.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
}

func flowEntry(proto uint8, src, dst, nsrc, ndst netip.AddrPort, flags uint32, seen uint64) (k [flowKeySize]byte, v [flowValSize]byte) {
	a := func(x netip.Addr) []byte { b := addrBytes(x); return b[:] }
	kb, _ := flowEntryKey(proto, src, dst)
	k = [flowKeySize]byte(kb)
	copy(v[0:], a(nsrc.Addr()))
	copy(v[16:], a(ndst.Addr()))
	binary.BigEndian.PutUint16(v[32:], nsrc.Port())
	binary.BigEndian.PutUint16(v[34:], ndst.Port())
	binary.LittleEndian.PutUint32(v[36:], flags)
	binary.LittleEndian.PutUint64(v[40:], seen)
	return k, v
}

// BenchmarkDeleteFlows: ending the flows of one backend of 10 in a table of 100,000 flows
// (200,000 entries): a walk of the whole table in batches and one batch delete of a tenth.
func BenchmarkDeleteFlows(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (BPF maps)")
	}
	p, err := Load(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	gone := netip.AddrFrom4([4]byte{10, 244, 1, 1})
	for b.Loop() {
		b.StopTimer()
		fillFlows(b, p, 100_000, 10)
		b.StartTimer()
		n, err := p.DeleteFlows(func(f Flow) bool { return f.NewDst.Addr() == gone })
		if err != nil || n != 10_000 {
			b.Fatalf("deleted %d, %v", n, err)
		}
	}
}

func TestDeleteFlowsBatch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF maps)")
	}
	p, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fillFlows(t, p, 20_000, 4)
	all, err := p.Flows(0)
	if err != nil || len(all) != 40_000 {
		t.Fatalf("%d entries, %v", len(all), err)
	}
	gone := netip.AddrFrom4([4]byte{10, 244, 1, 2})
	n, err := p.DeleteFlows(func(f Flow) bool { return f.NewDst.Addr() == gone })
	if err != nil || n != 5_000 {
		t.Fatalf("deleted %d flows, %v; want 5,000", n, err)
	}
	left, _ := p.Flows(0)
	for _, f := range left {
		if !f.Reply && f.NewDst.Addr() == gone || f.Reply && f.Src.Addr() == gone {
			t.Fatalf("entry of an ended flow left: %+v", f)
		}
	}
	if len(left) != 30_000 {
		t.Errorf("%d entries left, want 30,000", len(left))
	}
}

// TestPathMTU: path MTU discovery through the program. A router between the client and the
// gateway has a 1280-byte link to the client, whose own MTU is 1500: the backend's full-size
// segments draw "fragmentation needed" (IPv6: "packet too big") from the router, sent to the VIP.
// The program hands the error to the backend, quoting what the backend sent, and the backend
// sends smaller segments: 1 MB echoed back, direct and masqueraded, both families. Without the
// translation the backend never learns the path's MTU and the transfers stall.
func TestPathMTU(t *testing.T) {
	l := newTestLabWith(t, true)
	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	// A download (the client sends only ACKs: its own full-size segments would meet the
	// router's smaller link on the way in, where a veth drops them without an error).
	tcpServe(t, l.backend, netip.AddrPortFrom(podsV4[0], 8080), payload)
	tcpServe(t, l.backend, netip.AddrPortFrom(podsV6[0], 8080), payload)
	tcpServe(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30080), payload)
	p := l.load(t, Config{})
	ap := netip.AddrPortFrom
	if err := p.Sync([]VIPPort{
		{VIP: vipV4, Proto: 6, Port: 80, Table: []netip.AddrPort{ap(podsV4[0], 8080)}},
		{VIP: vipV4, Proto: 6, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV4, 30080)}},
		{VIP: vipV6, Proto: 6, Port: 80, Table: []netip.AddrPort{ap(podsV6[0], 8080)}},
		{VIP: vipV6, Proto: 6, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV6, 30080)}},
	}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []netip.AddrPort{ap(vipV4, 80), ap(vipV4, 81), ap(vipV6, 80), ap(vipV6, 81)} {
		before, _ := p.Counters()
		c := dialTCP(t, l.client, dst)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		got, err := readAll(c)
		c.Close()
		after, _ := p.Counters()
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("%s: %d bytes of %d (%v): the backend did not learn the path's MTU", dst, len(got), len(payload), err)
		} else {
			t.Logf("%s: 1 MB downloaded, %d ICMP errors translated", dst, after.ICMP-before.ICMP)
		}
		if after.ICMP == before.ICMP {
			t.Errorf("%s: no ICMP error translated: the router's MTU was not met?", dst)
		}
	}
}

// TestUDPFragments: 3,000-byte datagrams both ways through the program, direct and masqueraded:
// the client's kernel fragments the request and the backend's the answer; each datagram's first
// fragment goes with its flow and the later ones follow it, so both arrive whole, from and to the
// VIP port. (Without that, the later fragments would reach a conntrack that never saw the flow,
// and neither datagram would arrive.)
func TestUDPFragments(t *testing.T) {
	l := newTestLab(t)
	udpEcho(t, l.backend, netip.AddrPortFrom(podsV4[0], 8080))
	udpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv4Unspecified(), 30080))
	p := l.load(t, Config{})
	ap := netip.AddrPortFrom
	if err := p.Sync([]VIPPort{
		{VIP: vipV4, Proto: 17, Port: 53, Table: []netip.AddrPort{ap(podsV4[0], 8080)}},
		{VIP: vipV4, Proto: 17, Port: 54, SNAT: true, Table: []netip.AddrPort{ap(nodeV4, 30080)}},
	}); err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("0123456789"), 300)
	for _, dst := range []netip.AddrPort{ap(vipV4, 53), ap(vipV4, 54)} {
		var c *net.UDPConn
		if err := in(l.client, func() error {
			var err error
			c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16<<10)
		var got []byte
		for try := 0; try < 10 && got == nil; try++ {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if n, err := c.Read(buf); err == nil {
				got = buf[:n]
			}
		}
		c.Close()
		if _, rest, _ := bytes.Cut(got, []byte(" ")); !bytes.Equal(rest, msg) {
			t.Errorf("%s: %d bytes back, want the 3,000 echoed", dst, len(got))
		}
	}
	cnt, _ := p.Counters()
	t.Logf("counters %+v", cnt)
	if cnt.Frag < 4 {
		t.Errorf("counters %+v: want the later fragments of each request and answer followed", cnt)
	}
}

// tcpRoundTrip sends payload to dst over TCP from namespace ns and checks that the backend's echo
// server sends it back whole (after its line naming the peer it saw, which is logged).
func tcpRoundTrip(t *testing.T, ns string, dst netip.AddrPort, payload []byte) {
	t.Helper()
	c := dialTCP(t, ns, dst)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() { _, _ = c.Write(payload); _ = c.CloseWrite() }()
	got, err := readAll(c)
	c.Close()
	if err != nil {
		t.Errorf("TCP %s: %v", dst, err)
		return
	}
	peer, rest, _ := strings.Cut(string(got), "\n")
	if rest != string(payload) {
		t.Errorf("TCP %s: %d bytes back of %d, or not the same", dst, len(rest), len(payload))
	}
	t.Logf("TCP %s: the backend saw %s", dst, peer)
}
