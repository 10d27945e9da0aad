package natpath

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The program run on crafted packets (BPF_PROG_TEST_RUN): every malformed or foreign shape is
// left to the stack untouched, and what it takes comes out rewritten with checksums exactly as
// valid as they came in. The runs happen in a namespace of the test's own with routes to the
// backends (over a veth whose neighbours are known), so new flows are taken; 10.244.8.0/24's next
// hop is not resolved (the tc program hands such packets to the neighbour layer, TC_ACT_REDIRECT;
// the XDP program hands them to the tc program).
//
// Each test runs against both attach points (eachProg): "tc", the tc program alone, and "xdp",
// the XDP program with the tc program behind it, as on a device (runner.tryRun: what XDP passes
// unmarked, the tc program runs on). The verdicts are given as the tc program's.

const (
	actPass     = 0xffffffff // TC_ACT_UNSPEC (-1): the next tc program, then the stack
	actRedirect = 7
)

var runVIPs = []VIPPort{
	{VIP: vipV4, Proto: 6, Port: 80, Table: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.11:8080")}},
	{VIP: vipV4, Proto: 17, Port: 80, Table: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.11:8080")}},
	{VIP: vipV4, Proto: 17, Port: 81, SNAT: true, Table: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.11:30080")}},
	{VIP: vipV6, Proto: 6, Port: 80, Table: []netip.AddrPort{netip.MustParseAddrPort("[2001:db8:d::11]:8080")}},
	{VIP: vipV6, Proto: 17, Port: 81, SNAT: true, Table: []netip.AddrPort{netip.MustParseAddrPort("[2001:db8:b::11]:30080")}},
	// Behind a route of MTU 600.
	{VIP: netip.MustParseAddr("203.0.113.62"), Proto: 17, Port: 80, Table: []netip.AddrPort{netip.MustParseAddrPort("10.244.9.1:8080")}},
}

// runner runs the program on packets in its namespace.
type runner struct {
	ns   string
	path *Path
	// xdp: the XDP program runs first, the tc program on what it passes unmarked.
	xdp bool
	// byTC: the last run's verdict was the tc program's (xdp: XDP handed the packet over).
	byTC bool
}

// eachProg runs test against each attach point, as subtests "tc" and "xdp" (newRunner tells
// them apart by name).
func eachProg(t *testing.T, test func(t *testing.T)) {
	t.Run("tc", test)
	t.Run("xdp", test)
}

// isXDP says whether t is (in) eachProg's "xdp" subtest.
func isXDP(t testing.TB) bool {
	return strings.Contains(t.Name()+"/", "/xdp/")
}

// derive is a runner like r on path p (its XDP devices registered).
func (r *runner) derive(t testing.TB, p *Path) *runner {
	t.Helper()
	if err := in(r.ns, func() error { return prepareXDP(p) }); err != nil {
		t.Fatal(err)
	}
	return &runner{ns: r.ns, path: p, xdp: r.xdp}
}

// prepareXDP tells p's XDP program about the runner namespace's devices, as Attach would: lo
// (where the test runs arrive; MAC zero) and x0, which takes XDP frames.
func prepareXDP(p *Path) error {
	if p.xdpDevs == nil {
		return fmt.Errorf("no XDP program: %v", p.xdpErr)
	}
	x0, err := net.InterfaceByName("x0")
	if err != nil {
		return err
	}
	if err := p.xdpDevs.Put(uint32(1), xdpDevBytes(make(net.HardwareAddr, 6), false)); err != nil {
		return err
	}
	return p.xdpDevs.Put(uint32(x0.Index), xdpDevBytes(x0.HardwareAddr, true))
}

var (
	runnerOnce sync.Once
	theRunner  *runner
	runnerErr  error
)

// newRunner sets up (once per test binary) the namespace and the loaded program; it skips
// without root.
// syncTCPPort makes the program take runVIPs and TCP port vip with the single backend to; the
// test's end puts runVIPs back.
func (r *runner) syncTCPPort(t *testing.T, vip, to netip.AddrPort) {
	t.Helper()
	if err := in(r.ns, func() error {
		return r.path.Sync(append(slices.Clone(runVIPs), VIPPort{VIP: vip.Addr(), Proto: 6, Port: vip.Port(), Table: []netip.AddrPort{to}}))
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in(r.ns, func() error { return r.path.Sync(runVIPs) }) })
}

func newRunner(t testing.TB) *runner {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, BPF)")
	}
	runnerOnce.Do(func() { theRunner, runnerErr = setupRunner() })
	if runnerErr != nil {
		t.Fatal(runnerErr)
	}
	if isXDP(t) {
		// A Path of its own: the tests' flows (fixed tuples) are not the tc subtest's.
		xdpRunnerOnce.Do(func() {
			xdpRunnerPath, runnerErr = loadRunnerPath(theRunner.ns)
		})
		if runnerErr != nil {
			t.Fatal(runnerErr)
		}
		return &runner{ns: theRunner.ns, path: xdpRunnerPath, xdp: true}
	}
	return &runner{ns: theRunner.ns, path: theRunner.path}
}

var (
	xdpRunnerOnce sync.Once
	xdpRunnerPath *Path
)

// loadRunnerPath loads a Path in the runner's namespace ns, given runVIPs.
func loadRunnerPath(ns string) (*Path, error) {
	var p *Path
	err := in(ns, func() error {
		var err error
		if p, err = Load(Config{}); err != nil {
			return err
		}
		if err := prepareXDP(p); err != nil {
			return err
		}
		return p.Sync(runVIPs)
	})
	return p, err
}

func setupRunner() (*runner, error) {
	ns := fmt.Sprintf("vgt%d-nprun", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	// Removed when the test binary ends (TestMain).
	runnerNS = ns
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		"link set lo up",
		"link add x0 type veth peer name x1", "link set x0 up", "link set x1 up",
		"addr add 10.99.0.1/24 dev x0", "addr add 2001:db8:99::1/64 dev x0 nodad",
		"neigh add 10.99.0.2 lladdr 02:00:00:00:99:02 dev x0 nud permanent",
		"neigh add 2001:db8:99::2 lladdr 02:00:00:00:99:02 dev x0 nud permanent",
		"route add 10.244.8.0/24 via 10.99.0.3",
		"route add 10.244.0.0/16 via 10.99.0.2", "route add 192.0.2.0/24 via 10.99.0.2",
		"route add 10.244.9.0/24 via 10.99.0.2 mtu 600",
		"route add 198.51.100.0/24 via 10.99.0.2",
		"route add 2001:db8:d::/64 via 2001:db8:99::2", "route add 2001:db8:b::/64 via 2001:db8:99::2",
		"route add 2001:db8:c::/64 via 2001:db8:99::2",
	}, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip -batch: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1",
		"net.ipv4.conf.lo.forwarding=1", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sysctl: %v: %s", err, out)
	}
	r := &runner{ns: ns}
	var err error
	r.path, err = loadRunnerPath(ns)
	return r, err
}

var runnerNS string

func TestMain(m *testing.M) {
	code := m.Run()
	if runnerNS != "" {
		_ = exec.Command("ip", "netns", "del", runnerNS).Run()
	}
	os.Exit(code)
}

// run runs the program once on pkt (an Ethernet frame) arriving on lo, and returns its verdict
// and the frame after it.
func (r *runner) run(t testing.TB, pkt []byte) (uint32, []byte) {
	t.Helper()
	ret, out, err := r.tryRun(pkt)
	if err != nil {
		t.Fatalf("running the program on %x: %v", pkt, err)
	}
	return ret, out
}

// tryRun is run, with the kernel's refusal of a frame (EINVAL: a frame its test run cannot make
// a packet of, such as an IPv6 ethertype with less than an IPv6 header) as an error.
func (r *runner) tryRun(pkt []byte) (uint32, []byte, error) {
	r.byTC = !r.xdp
	if r.xdp {
		ret, out, err := r.runXDP(pkt)
		if err != nil || ret != xdpPassUnmarked {
			return ret, out, err
		}
		if !bytes.Equal(out, pkt) {
			return 0, out, fmt.Errorf("the XDP program handed the tc program a changed packet:\nin  %x\nout %x", pkt, out)
		}
		r.byTC = true
	}
	return r.runTC(pkt)
}

// XDP verdicts (enum xdp_action), and runXDP's for an XDP_PASS without the mark.
const (
	xdpDrop         = 1
	xdpPass         = 2
	xdpRedirect     = 4
	xdpPassUnmarked = 0x10000
)

// runXDP runs the XDP program once on pkt arriving on lo and returns its verdict as the tc
// program's (marked XDP_PASS: actPass; XDP_PASS unmarked: xdpPassUnmarked) and the frame after it.
func (r *runner) runXDP(pkt []byte) (uint32, []byte, error) {
	return r.runXDPMeta(nil, pkt)
}

// runXDPMeta is runXDP on a frame that comes with metadata meta (as from another XDP program).
func (r *runner) runXDPMeta(metaIn, pkt []byte) (uint32, []byte, error) {
	out := make([]byte, len(pkt)+256)
	// struct xdp_md: data (the metadata's length), data_end, data_meta 0, ingress_ifindex (lo:
	// 1), rx_queue_index 0, egress_ifindex 0.
	ctx := make([]byte, 24)
	binary.LittleEndian.PutUint32(ctx[0:], uint32(len(metaIn)))
	binary.LittleEndian.PutUint32(ctx[4:], uint32(len(metaIn)+len(pkt)))
	binary.LittleEndian.PutUint32(ctx[12:], 1)
	pkt = append(slices.Clone(metaIn), pkt...)
	ctxOut := make([]byte, 24)
	var ret uint32
	var runOut []byte
	err := in(r.ns, func() error {
		opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx, ContextOut: ctxOut}
		var err error
		ret, err = r.path.xdp.Run(opts)
		runOut = opts.DataOut
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	// The output starts with the metadata (ctx data: its length).
	meta := int(binary.LittleEndian.Uint32(ctxOut[0:]))
	if meta > len(runOut) {
		return 0, nil, fmt.Errorf("metadata of %d bytes in an output of %d", meta, len(runOut))
	}
	frame := runOut[meta:]
	switch ret {
	case xdpDrop:
		return actShot, frame, nil
	case xdpRedirect:
		return actRedirect, frame, nil
	case xdpPass:
		if meta == 0 {
			return xdpPassUnmarked, frame, nil
		}
		c, err := r.path.coll.Maps[mapConfig].LookupBytes(uint32(0))
		if err != nil {
			return 0, nil, err
		}
		if meta != 4 || !bytes.Equal(runOut[:4], c[36:40]) {
			return 0, nil, fmt.Errorf("XDP_PASS with metadata %x, not the mark %x", runOut[:meta], c[36:40])
		}
		return actPass, frame, nil
	}
	return ret | 0x100, frame, nil // no verdict of the tc program's
}

// runTC runs the tc program once on pkt arriving on lo.
func (r *runner) runTC(pkt []byte) (uint32, []byte, error) {
	out := make([]byte, len(pkt)+256)
	// struct __sk_buff up to ingress_ifindex (offset 36): lo, index 1 in a new namespace.
	ctx := make([]byte, 40)
	binary.LittleEndian.PutUint32(ctx[36:], 1)
	var ret uint32
	var runOut []byte
	err := in(r.ns, func() error {
		opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx}
		var err error
		ret, err = r.path.prog.Run(opts)
		runOut = opts.DataOut
		return err
	})
	return ret, runOut, err
}

// Packet building: an Ethernet frame to us (destination MAC zero: lo's address, so PACKET_HOST).

type pktSpec struct {
	src, dst netip.AddrPort
	proto    uint8
	ttl      uint8
	tcpFlags uint8 // 0: PSH ACK
	seq, ack uint32
	window   uint16 // 0: 512
	options  []byte // TCP options (a multiple of 4 bytes)
	payload  []byte
}

func frame(s pktSpec) []byte {
	l4 := make([]byte, 8)
	if s.proto == 6 {
		l4 = append(make([]byte, 20), s.options...)
		l4[12] = byte(len(l4)/4) << 4
		l4[13] = cmp.Or(s.tcpFlags, 0x18) // PSH ACK
		binary.BigEndian.PutUint32(l4[4:], s.seq)
		binary.BigEndian.PutUint32(l4[8:], s.ack)
		binary.BigEndian.PutUint16(l4[14:], cmp.Or(s.window, 512))
	}
	binary.BigEndian.PutUint16(l4[0:], s.src.Port())
	binary.BigEndian.PutUint16(l4[2:], s.dst.Port())
	l4 = append(l4, s.payload...)
	if s.proto == 17 {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	ttl := s.ttl
	if ttl == 0 {
		ttl = 64
	}
	eth := make([]byte, 14)
	var ip []byte
	if s.src.Addr().Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8], ip[9] = ttl, s.proto
		a, b := s.src.Addr().As4(), s.dst.Addr().As4()
		copy(ip[12:], a[:])
		copy(ip[16:], b[:])
		binary.BigEndian.PutUint16(ip[10:], ^sum16(ip, 0))
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = s.proto, ttl
		a, b := s.src.Addr().As16(), s.dst.Addr().As16()
		copy(ip[8:], a[:])
		copy(ip[24:], b[:])
	}
	csumOff := 6
	if s.proto == 6 {
		csumOff = 16
	}
	binary.BigEndian.PutUint16(l4[csumOff:], ^sum16(l4, pseudo(ip, s.proto, len(l4))))
	out := append(eth, ip...)
	return append(out, l4...)
}

// sum16 is the one's complement sum of b's 16-bit words, with initial sum init (not complemented).
func sum16(b []byte, init uint32) uint16 {
	s := init
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// pseudo is the transport checksum's pseudo-header sum of the IP header ip.
func pseudo(ip []byte, proto uint8, l4len int) uint32 {
	var addrs []byte
	if ip[0]>>4 == 4 {
		addrs = ip[12:20]
	} else {
		addrs = ip[8:40]
	}
	return uint32(sum16(addrs, 0)) + uint32(proto) + uint32(l4len)
}

// checksums says whether a frame's IPv4 header checksum and transport checksum verify (true for
// what a frame does not have or cannot be read from it), for the property tests.
func checksums(f []byte) (ipOK, l4OK bool) {
	ipOK, l4OK = true, true
	if len(f) < 14 {
		return
	}
	et := binary.BigEndian.Uint16(f[12:])
	var ip, l4 []byte
	var proto uint8
	switch {
	case et == 0x0800 && len(f) >= 34 && f[14]>>4 == 4:
		ihl := int(f[14]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(f[16:]))
		if ihl < 20 || len(f) < 14+ihl || tot < ihl || len(f) < 14+tot {
			return
		}
		ip = f[14 : 14+ihl]
		ipOK = sum16(ip, 0) == 0xffff
		if binary.BigEndian.Uint16(f[20:])&0x3fff != 0 {
			return // a fragment: the transport checksum covers the whole datagram
		}
		proto, l4 = f[23], f[14+ihl:14+tot]
	case et == 0x86dd && len(f) >= 54 && f[14]>>4 == 6:
		pl := int(binary.BigEndian.Uint16(f[18:]))
		if len(f) < 54+pl {
			return
		}
		ip = f[14:54]
		proto, l4 = f[20], f[54:54+pl]
	default:
		return
	}
	switch {
	case proto == 1 && ip[0]>>4 == 4:
		l4OK = sum16(l4, 0) == 0xffff // ICMP: no pseudo-header
		return
	case proto == 58:
		l4OK = sum16(l4, pseudo(ip, proto, len(l4))) == 0xffff
		return
	case proto == 17 && len(l4) >= 8:
		if binary.BigEndian.Uint16(l4[6:]) == 0 {
			// IPv4: no checksum. IPv6: invalid whatever the sum (RFC 8200, 8.1), and the
			// program leaves it 0 (BPF_F_MARK_MANGLED_0), which stays invalid.
			l4OK = ip[0]>>4 == 4
			return
		}
	case proto == 6 && len(l4) >= 20:
	default:
		return
	}
	l4OK = sum16(l4, pseudo(ip, proto, len(l4))) == 0xffff
	return
}

// TestHostileShapes: what the program must leave to the stack, byte for byte.
func TestHostileShapes(t *testing.T) { eachProg(t, testHostileShapes) }

func testHostileShapes(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	v4 := frame(pktSpec{src: ap("198.51.100.10:40000"), dst: ap("203.0.113.50:80"), proto: 17, payload: []byte("hi")})
	v6 := frame(pktSpec{src: ap("[2001:db8:c::10]:40000"), dst: ap("[2001:db8:f::50]:80"), proto: 6, tcpFlags: 0x02, payload: []byte("hi")})
	mod := func(b []byte, f func([]byte) []byte) []byte { return f(bytes.Clone(b)) }
	cases := map[string][]byte{
		"ethernet and one byte":  v4[:15],
		"IPv4 header cut":        v4[:30],
		"ports cut":              v4[:36],
		"IHL 4 (shorter than 5)": mod(v4, func(b []byte) []byte { b[14] = 0x44; return b }),
		"IP options (IHL 6)": mod(v4, func(b []byte) []byte {
			b = append(b[:34:34], append([]byte{1, 1, 1, 1}, b[34:]...)...)
			b[14] = 0x46
			return b
		}),
		"TCP first fragment":         mod(frame(pktSpec{src: ap("198.51.100.10:40010"), dst: ap("203.0.113.50:80"), proto: 6, tcpFlags: 0x02}), func(b []byte) []byte { b[20] |= 0x20; return b }),
		"a later fragment, no first": mod(v4, func(b []byte) []byte { b[18], b[19], b[21] = 0x77, 0x77, 1; return b }),
		"TTL 1":                      frame(pktSpec{src: ap("198.51.100.10:40001"), dst: ap("203.0.113.50:80"), proto: 17, ttl: 1}),
		"ICMP to the VIP":            mod(v4, func(b []byte) []byte { b[23] = 1; return b }),
		"SCTP to the VIP":            mod(v4, func(b []byte) []byte { b[23] = 132; return b }),
		"VLAN tagged":                mod(v4, func(b []byte) []byte { return append(append(b[:12:12], 0x81, 0, 0, 5), b[12:]...) }),
		"to another host's MAC":      mod(v4, func(b []byte) []byte { b[0] = 2; return b }),
		"broadcast":                  mod(v4, func(b []byte) []byte { copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}); return b }),
		"not a VIP port":             frame(pktSpec{src: ap("198.51.100.10:40002"), dst: ap("203.0.113.50:8080"), proto: 17}),
		"not a VIP":                  frame(pktSpec{src: ap("198.51.100.10:40003"), dst: ap("203.0.113.99:80"), proto: 17}),
		"TCP to a UDP-only port":     frame(pktSpec{src: ap("198.51.100.10:40004"), dst: ap("203.0.113.50:81"), proto: 6}),
		"IPv6 ports cut":             v6[:56],
		"IPv6 hop-by-hop header":     mod(v6, func(b []byte) []byte { b[20] = 0; return b }),
		"IPv6 fragment header":       mod(v6, func(b []byte) []byte { b[20] = 44; return b }),
		"IPv6 hop limit 1":           mod(v6, func(b []byte) []byte { b[21] = 1; return b }),
		"IP version 6 in IPv4":       mod(v4, func(b []byte) []byte { b[14] = 0x65; return b }),
		"IP version 2":               mod(v4, func(b []byte) []byte { b[14] = 0x25; return b }),
		"total length > frame":       mod(v4, func(b []byte) []byte { b[17] += 10; return b }),
		"UDP header cut":             mod(v4, func(b []byte) []byte { b[17] = 20 + 6; return b[:14+26] }),
		"TCP header cut":             frame(pktSpec{src: ap("198.51.100.10:40005"), dst: ap("203.0.113.50:80"), proto: 6})[:14+20+16],
		"IPv6 payload > frame":       mod(v6, func(b []byte) []byte { b[19] += 10; return b }),
		"IPv6 version 4":             mod(v6, func(b []byte) []byte { b[14] = 0x40; return b }),
	}
	for name, pkt := range cases {
		ret, out, err := r.tryRun(pkt)
		if errors.Is(err, unix.EINVAL) {
			t.Logf("%s: the kernel's test run takes no such frame (less than an IP header)", name)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if ret != actPass || !bytes.Equal(out, pkt) {
			t.Errorf("%s: verdict %d, changed %v; want passed on (-1), untouched", name, ret, !bytes.Equal(out, pkt))
		}
	}
	// The control: the same packets well formed are taken.
	small := frame(pktSpec{src: ap("198.51.100.10:40009"), dst: ap("203.0.113.62:80"), proto: 17, payload: make([]byte, 500)})
	for name, pkt := range map[string][]byte{"IPv4 UDP": v4, "IPv6 TCP": v6, "within the route's MTU": small} {
		if ret, _ := r.run(t, pkt); ret != actRedirect {
			t.Errorf("%s to a VIP port: verdict %d, want taken (redirect, 7)", name, ret)
		}
	}
}

// TestRewrite: what the program makes of a packet it takes, each VIP port kind: the backend's
// address and port (the masquerade address and a port of the range for SNAT), TTL one less, and
// checksums that verify; then the reply, rewritten back.
func TestRewrite(t *testing.T) { eachProg(t, testRewrite) }

func testRewrite(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		src, vip, backend netip.AddrPort
		proto             uint8
		snatFrom          netip.Addr // the masquerade address (the route's source: x0's), or none
	}{
		{ap("198.51.100.10:41000"), ap("203.0.113.50:80"), ap("10.244.1.11:8080"), 17, netip.Addr{}},
		{ap("198.51.100.10:41000"), ap("203.0.113.50:80"), ap("10.244.1.11:8080"), 6, netip.Addr{}},
		{ap("198.51.100.10:41001"), ap("203.0.113.50:81"), ap("192.0.2.11:30080"), 17, netip.MustParseAddr("10.99.0.1")},
		{ap("[2001:db8:c::10]:41000"), ap("[2001:db8:f::50]:80"), ap("[2001:db8:d::11]:8080"), 6, netip.Addr{}},
		{ap("[2001:db8:c::10]:41001"), ap("[2001:db8:f::50]:81"), ap("[2001:db8:b::11]:30080"), 17, netip.MustParseAddr("2001:db8:99::1")},
	} {
		in := frame(pktSpec{src: c.src, dst: c.vip, proto: c.proto, tcpFlags: 0x02, payload: []byte("payload")}) // TCP: a SYN opens it
		ret, out := r.run(t, in)
		if ret != actRedirect {
			t.Errorf("%s -> %s: verdict %d, want taken", c.src, c.vip, ret)
			continue
		}
		if r.byTC && r.xdp {
			t.Errorf("%s -> %s: the XDP program handed it to the tc program, want it forwarded by XDP", c.src, c.vip)
		}
		got := readTuple(out)
		wantSrc := c.src
		if c.snatFrom.IsValid() {
			if got.src.Addr() != c.snatFrom || got.src.Port() < DefaultSNATPortMin {
				t.Errorf("%s -> %s: masqueraded to %s, want %s and a port from %d", c.src, c.vip, got.src, c.snatFrom, DefaultSNATPortMin)
			}
			wantSrc = got.src
		}
		if got.src != wantSrc || got.dst != c.backend || got.ttl != 63 {
			t.Errorf("%s -> %s: out %s -> %s TTL %d, want %s -> %s TTL 63", c.src, c.vip, got.src, got.dst, got.ttl, wantSrc, c.backend)
		}
		if ipOK, l4OK := checksums(out); !ipOK || !l4OK {
			t.Errorf("%s -> %s: checksums after the rewrite: IP %v, transport %v", c.src, c.vip, ipOK, l4OK)
		}
		// The reply, from the backend to what it saw.
		reply := frame(pktSpec{src: c.backend, dst: got.src, proto: c.proto, payload: []byte("answer")})
		ret, out = r.run(t, reply)
		back := readTuple(out)
		if ret != actRedirect || back.src != c.vip || back.dst != c.src {
			t.Errorf("reply %s -> %s: verdict %d, out %s -> %s; want %s -> %s", c.backend, got.src, ret, back.src, back.dst, c.vip, c.src)
		}
		if r.byTC && r.xdp {
			t.Errorf("reply %s -> %s: the XDP program handed it to the tc program", c.backend, got.src)
		}
		if ipOK, l4OK := checksums(out); !ipOK || !l4OK {
			t.Errorf("reply %s -> %s: checksums after the rewrite: IP %v, transport %v", c.backend, got.src, ipOK, l4OK)
		}
	}
}

type tuple struct {
	src, dst netip.AddrPort
	ttl      uint8
}

func readTuple(f []byte) tuple {
	if len(f) < 14 {
		return tuple{}
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		if len(f) < 38 {
			return tuple{}
		}
		p := 14 + int(f[14]&0xf)*4
		if len(f) < p+4 {
			return tuple{}
		}
		return tuple{netip.AddrPortFrom(netip.AddrFrom4([4]byte(f[26:30])), binary.BigEndian.Uint16(f[p:])),
			netip.AddrPortFrom(netip.AddrFrom4([4]byte(f[30:34])), binary.BigEndian.Uint16(f[p+2:])), f[22]}
	case 0x86dd:
		if len(f) < 58 {
			return tuple{}
		}
		return tuple{netip.AddrPortFrom(netip.AddrFrom16([16]byte(f[22:38])), binary.BigEndian.Uint16(f[54:])),
			netip.AddrPortFrom(netip.AddrFrom16([16]byte(f[38:54])), binary.BigEndian.Uint16(f[56:])), f[21]}
	}
	return tuple{}
}

// FuzzPacket feeds the program arbitrary frames (seeded with well-formed ones to each VIP port
// kind, which the fuzzer mutates: headers, lengths, checksums, addresses). Whatever comes in:
// never dropped by the program itself but from a martian source (TestMartians), and then
// untouched; left untouched unless taken; and taken, it comes out with
// its checksums exactly as valid as they came in (the rewrite keeps a bad checksum bad, a good
// one good) and its TTL one less.
func FuzzPacket(f *testing.F) {
	ap := netip.MustParseAddrPort
	for _, s := range []pktSpec{
		{src: ap("198.51.100.10:42000"), dst: ap("203.0.113.50:80"), proto: 17, payload: []byte("x")},
		{src: ap("198.51.100.10:42000"), dst: ap("203.0.113.50:80"), proto: 6, tcpFlags: 0x02, payload: []byte("xy")},
		{src: ap("198.51.100.10:42001"), dst: ap("203.0.113.50:81"), proto: 17},
		{src: ap("[2001:db8:c::10]:42000"), dst: ap("[2001:db8:f::50]:80"), proto: 6, tcpFlags: 0x02, payload: []byte("xyz")},
		{src: ap("[2001:db8:c::10]:42001"), dst: ap("[2001:db8:f::50]:81"), proto: 17, payload: []byte("z")},
		{src: ap("10.244.1.11:8080"), dst: ap("198.51.100.10:42000"), proto: 17}, // a reply
	} {
		f.Add(frame(s))
	}
	// An ICMP error about the first seed's reply, and a datagram in two fragments.
	reply := frame(pktSpec{src: ap("203.0.113.50:80"), dst: ap("198.51.100.10:42000"), proto: 17, payload: make([]byte, 40)})
	f.Add(icmpFrame(netip.MustParseAddr("198.51.100.1"), vipV4, reply))
	first, second := fragments(frame(pktSpec{src: ap("198.51.100.10:42002"), dst: ap("203.0.113.50:80"), proto: 17, payload: make([]byte, 200)}), 10)
	f.Add(first)
	f.Add(second)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) <= 14 || len(pkt) > 1500 {
			return // the kernel's test run takes no frame without a byte after the Ethernet header
		}
		for _, xdp := range []bool{false, true} {
			r := newRunner(t)
			r.xdp = xdp
			fuzzOne(t, r, pkt)
		}
	})
}

// fuzzOne is FuzzPacket's check of one attach point.
func fuzzOne(t *testing.T, r *runner, pkt []byte) {
	ret, out, err := r.tryRun(pkt)
	if errors.Is(err, unix.EINVAL) {
		return // not a frame the kernel's test run makes a packet of
	}
	if err != nil {
		t.Fatalf("xdp %v: %v", r.xdp, err)
	}
	switch ret {
	case actPass:
		if !bytes.Equal(out, pkt) {
			t.Fatalf("left to the stack but changed:\nin  %x\nout %x", pkt, out)
		}
	case actRedirect:
		inIP, inL4 := checksums(pkt)
		outIP, outL4 := checksums(out)
		if inIP != outIP || inL4 != outL4 {
			t.Fatalf("checksums in IP %v transport %v, out IP %v transport %v:\nin  %x\nout %x", inIP, inL4, outIP, outL4, pkt, out)
		}
		if a, b := ttlOf(pkt), ttlOf(out); b != a-1 {
			t.Fatalf("TTL %d -> %d", a, b)
		}
	case actShot:
		if !martianSource(pkt) || !bytes.Equal(out, pkt) {
			t.Fatalf("dropped (changed %v), but not from a martian source:\nin %x", !bytes.Equal(out, pkt), pkt)
		}
	default:
		t.Fatalf("verdict %d (the program never drops but martians: it takes a packet or leaves it)\nin %x", ret, pkt)
	}
}

// TestTCPReuse: a flow keeps its backend while its connection lives (a retransmitted SYN too, and
// after its VIP port's table changed), and a connection that reuses the tuple after a FIN or RST
// is a new one, dealt by the current table, as conntrack does.
func TestTCPReuse(t *testing.T) { eachProg(t, testTCPReuse) }

func testTCPReuse(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	client, vip := ap("198.51.100.10:43000"), ap("203.0.113.60:80")
	a, b := ap("10.244.1.11:8080"), ap("10.244.1.12:8080")
	sync := func(to netip.AddrPort) { t.Helper(); r.syncTCPPort(t, vip, to) }
	send := func(what string, flags uint8, seq uint32, want netip.AddrPort) {
		t.Helper()
		ret, out := r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: flags, seq: seq}))
		if got := readTuple(out).dst; ret != actRedirect || got != want {
			t.Errorf("%s: verdict %d to %s, want %s", what, ret, got, want)
		}
	}
	sync(a)
	send("SYN", 0x02, 1000, a)
	sync(b)
	send("SYN again (a retransmission)", 0x02, 1000, a)
	send("data", 0x18, 1001, a)
	send("FIN", 0x11, 1001, a)
	send("the last ACK", 0x10, 1002, a)
	send("a new connection's SYN on the tuple", 0x02, 5000, b)
	send("its data", 0x18, 5001, b)
	// The reply side closes it this time (RST from the backend, acknowledging the SYN: the
	// backend's answer to it), then the tuple is reused again.
	ret, _ := r.run(t, frame(pktSpec{src: b, dst: client, proto: 6, tcpFlags: 0x14, ack: 5001}))
	if ret != actRedirect {
		t.Fatalf("the backend's RST: verdict %d, want taken", ret)
	}
	sync(a)
	send("a third connection's SYN", 0x02, 9000, a)
}

// TestMasqueradePorts: a masquerade port belongs to a flow while its forward entry lives, however
// one-way its traffic (a client's UDP stream its server never answers); a flow that finds no free
// port is left to the stack; once the owner idles out, the port is another flow's. One port in
// the range and a 1 s UDP timeout make it exact.
func TestMasqueradePorts(t *testing.T) { eachProg(t, testMasqueradePorts) }

func testMasqueradePorts(t *testing.T) {
	r := newRunner(t)
	var p *Path
	if err := in(r.ns, func() error {
		var err error
		if p, err = Load(Config{UDPTimeout: time.Second, SNATPortMin: 61000, SNATPortMax: 61000}); err != nil {
			return err
		}
		return p.Sync(runVIPs)
	}); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	one := r.derive(t, p)
	ap := netip.MustParseAddrPort
	vip := ap("203.0.113.50:81") // masqueraded, to 192.0.2.11:30080
	a, b := ap("198.51.100.10:44000"), ap("198.51.100.20:44000")
	send := func(from netip.AddrPort) (uint32, tuple) {
		ret, out := one.run(t, frame(pktSpec{src: from, dst: vip, proto: 17}))
		return ret, readTuple(out)
	}
	if ret, got := send(a); ret != actRedirect || got.src.Port() != 61000 {
		t.Fatalf("first flow: verdict %d from %s, want the one port, 61000", ret, got.src)
	}
	// a goes on sending, never answered, for twice the UDP timeout: its port stays its own.
	for range 6 {
		time.Sleep(400 * time.Millisecond)
		if ret, got := send(a); ret != actRedirect || got.src.Port() != 61000 {
			t.Fatalf("the one-way flow: verdict %d from %s", ret, got.src)
		}
		if ret, _ := send(b); ret != actPass {
			t.Fatalf("another flow took the live flow's port (verdict %d)", ret)
		}
	}
	c, _ := p.Counters()
	if c.SNATFull != 6 {
		t.Errorf("counters %+v: want the 6 refused flows counted as snat_full", c)
	}
	// a stops: once it idled out, the port is b's.
	time.Sleep(1500 * time.Millisecond)
	if ret, got := send(b); ret != actRedirect || got.src.Port() != 61000 {
		t.Fatalf("after the owner idled out: verdict %d from %s, want the port", ret, got.src)
	}
}

// TestReplyClash: one client port through two VIP ports to one backend would share a reply tuple
// (and be one connection to the backend): the second flow keeps the client's address with another
// port, one of the masquerade ports, as conntrack's NAT would; each flow keeps its own replies.
// (The second flow was once left to the stack: conntrack, which never saw the first, kept the
// port, and the backend's replies went to the first flow's client port as the first VIP's.)
func TestReplyClash(t *testing.T) { eachProg(t, testReplyClash) }

func testReplyClash(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	client, backend := ap("198.51.100.30:45000"), ap("10.244.1.11:8080")
	second := VIPPort{VIP: netip.MustParseAddr("203.0.113.61"), Proto: 17, Port: 80, Table: []netip.AddrPort{backend}}
	if err := in(r.ns, func() error { return r.path.Sync(append(slices.Clone(runVIPs), second)) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in(r.ns, func() error { return r.path.Sync(runVIPs) }) })
	before, _ := r.path.Counters()
	if ret, out := r.run(t, frame(pktSpec{src: client, dst: ap("203.0.113.50:80"), proto: 17})); ret != actRedirect || readTuple(out).src != client {
		t.Fatalf("first flow: verdict %d from %s, want the client's own tuple", ret, readTuple(out).src)
	}
	ret, out := r.run(t, frame(pktSpec{src: client, dst: ap("203.0.113.61:80"), proto: 17}))
	remapped := readTuple(out).src
	if ret != actRedirect || remapped.Addr() != client.Addr() || remapped.Port() < DefaultSNATPortMin {
		t.Fatalf("the clashing flow: verdict %d from %s, want the client's address with a masquerade port", ret, remapped)
	}
	after, _ := r.path.Counters()
	if after.Clash != before.Clash+1 || after.SNATFull != before.SNATFull {
		t.Errorf("clashes counted %d -> %d (snat_full %d -> %d)", before.Clash, after.Clash, before.SNATFull, after.SNATFull)
	}
	// The second flow's packets go on from its port; each flow's replies go to its own client port.
	if ret, out := r.run(t, frame(pktSpec{src: client, dst: ap("203.0.113.61:80"), proto: 17})); ret != actRedirect || readTuple(out).src != remapped {
		t.Errorf("the second flow's next packet: verdict %d from %s, want %s", ret, readTuple(out).src, remapped)
	}
	for _, c := range []struct {
		to      netip.AddrPort
		wantSrc string
	}{{client, "203.0.113.50:80"}, {remapped, "203.0.113.61:80"}} {
		ret, out := r.run(t, frame(pktSpec{src: backend, dst: c.to, proto: 17}))
		if got := readTuple(out); ret != actRedirect || got.src != ap(c.wantSrc) || got.dst != client {
			t.Errorf("a reply to %s: verdict %d, %s -> %s, want %s -> %s", c.to, ret, got.src, got.dst, c.wantSrc, client)
		}
	}
}

// TestStackFlowAfterClose: a client port whose connection through one of the program's VIP ports
// closed opens a connection through a VIP port the program does not take (source-hash or source
// ranges: the stack's, with conntrack) to the same backend; the backend's SYN-ACK is the stack's
// (the closed flow goes with it), and so is everything after it. A SYN-ACK to an open flow is
// still the flow's.
func TestStackFlowAfterClose(t *testing.T) { eachProg(t, testStackFlowAfterClose) }

func testStackFlowAfterClose(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	client, vip, a := ap("198.51.100.10:43112"), ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	establish(t, r, client, vip, a)
	if ret, _ := r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 0x9abcdef0, ack: 0x12345679, window: 65160, options: padOpts(tcpOpts)})); ret != actRedirect {
		t.Errorf("a SYN-ACK retransmitted to the open flow: verdict %d, want the flow's", ret)
	}
	// Both FINs.
	r.run(t, frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x11, seq: 0x12345679, ack: 0x9abcdef1, window: 502}))
	r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x11, seq: 0x9abcdef1, ack: 0x1234567a, window: 509}))
	if f := findFlow(t, r, client, vip); f == nil || !f.Closing {
		t.Fatalf("after the FINs: %+v, want closing", f)
	}
	// The stack's connection from the same client port: its SYN never reaches the program's
	// flows (another VIP port), its SYN-ACK does.
	if ret, _ := r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, tcpFlags: 0x12, seq: 0x11111111, ack: 0x55555556, window: 65160, options: padOpts(tcpOpts)})); ret != actPass {
		t.Errorf("the stack's SYN-ACK: verdict %d, want passed to the stack", ret)
	}
	if ret, _ := r.run(t, frame(pktSpec{src: a, dst: client, proto: 6, seq: 0x11111112, ack: 0x55555556, payload: []byte("hi")})); ret != actPass {
		t.Errorf("the stack's next reply: verdict %d, want passed to the stack", ret)
	}
	if f := findFlow(t, r, client, vip); f != nil {
		t.Errorf("the closed flow's entry is still there: %+v", f)
	}
}

// icmpFrame is an ICMP error (IPv4: type 3 code 4, fragmentation needed; IPv6: type 2, packet too
// big) from src to dst about the packet inner (a frame, whose IP packet is quoted after its
// Ethernet header, at most 64 bytes of it).
func icmpFrame(src, dst netip.Addr, inner []byte) []byte {
	quoted := inner[14:]
	if len(quoted) > 64 {
		quoted = quoted[:64]
	}
	eth := make([]byte, 14)
	msg := append([]byte{3, 4, 0, 0, 0, 0, 0x05, 0x00}, quoted...) // next-hop MTU 1280
	if src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		binary.BigEndian.PutUint16(msg[2:], ^sum16(msg, 0))
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(msg)))
		ip[8], ip[9] = 64, 1
		a, b := src.As4(), dst.As4()
		copy(ip[12:], a[:])
		copy(ip[16:], b[:])
		binary.BigEndian.PutUint16(ip[10:], ^sum16(ip, 0))
		return append(append(eth, ip...), msg...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	msg[0], msg[1] = 2, 0
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(msg)))
	ip[6], ip[7] = 58, 64
	a, b := src.As16(), dst.As16()
	copy(ip[8:], a[:])
	copy(ip[24:], b[:])
	binary.BigEndian.PutUint16(msg[2:], ^sum16(msg, pseudo(ip, 58, len(msg))))
	return append(append(eth, ip...), msg...)
}

// icmpView reads an ICMP error frame: its outer addresses, the quoted packet's tuple, and whether
// the outer IPv4, the ICMP and the quoted IPv4 header checksums verify.
func icmpView(f []byte) (src, dst netip.Addr, inner tuple, ok bool) {
	if binary.BigEndian.Uint16(f[12:]) == 0x0800 {
		ip, msg := f[14:34], f[34:]
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		in := msg[8:]
		inner = tuple{netip.AddrPortFrom(netip.AddrFrom4([4]byte(in[12:16])), binary.BigEndian.Uint16(in[20:])),
			netip.AddrPortFrom(netip.AddrFrom4([4]byte(in[16:20])), binary.BigEndian.Uint16(in[22:])), in[8]}
		ok = sum16(ip, 0) == 0xffff && sum16(msg, 0) == 0xffff && sum16(in[:20], 0) == 0xffff
		return
	}
	ip, msg := f[14:54], f[54:]
	src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	in := msg[8:]
	inner = tuple{netip.AddrPortFrom(netip.AddrFrom16([16]byte(in[8:24])), binary.BigEndian.Uint16(in[40:])),
		netip.AddrPortFrom(netip.AddrFrom16([16]byte(in[24:40])), binary.BigEndian.Uint16(in[42:])), in[7]}
	ok = sum16(msg, pseudo(ip, 58, len(msg))) == 0xffff
	return
}

// TestICMPErrors: an ICMP error about one of the program's flows is translated as conntrack
// translates a related error, both ways, direct and masqueraded, both families: one about a reply
// (a router on the client's side: fragmentation needed, sent to the VIP) goes to the backend,
// quoting what the backend sent; one about a packet to the backend (from the backend itself) goes
// to the client from the VIP, quoting what the client sent. An error about no flow is left alone.
func TestICMPErrors(t *testing.T) { eachProg(t, testICMPErrors) }

func testICMPErrors(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	router4, router6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:c::1")
	for _, c := range []struct {
		name                 string
		client, vip, backend netip.AddrPort
		router               netip.Addr
	}{
		{"IPv4 direct", ap("198.51.100.10:46000"), ap("203.0.113.50:80"), ap("10.244.1.11:8080"), router4},
		{"IPv4 masqueraded", ap("198.51.100.10:46001"), ap("203.0.113.50:81"), ap("192.0.2.11:30080"), router4},
		{"IPv6 masqueraded", ap("[2001:db8:c::10]:46002"), ap("[2001:db8:f::50]:81"), ap("[2001:db8:b::11]:30080"), router6},
	} {
		ret, out := r.run(t, frame(pktSpec{src: c.client, dst: c.vip, proto: 17, payload: []byte("q")}))
		if ret != actRedirect {
			t.Fatalf("%s: the flow's first packet: verdict %d", c.name, ret)
		}
		sent := readTuple(out).src // what the backend sees as the client
		// About a reply: the backend answered sent, the program rewrote it to VIP -> client, a
		// router on the client's side could not forward it.
		reply := frame(pktSpec{src: c.vip, dst: c.client, proto: 17, payload: make([]byte, 100)})
		ret, out = r.run(t, icmpFrame(c.router, c.vip.Addr(), reply))
		if r.xdp && r.byTC {
			t.Errorf("%s, error about a reply: handed to the tc program, want translated by XDP", c.name)
		}
		src, dst, in, ok := icmpView(out)
		if ret != actRedirect || src != c.router || dst != c.backend.Addr() || in.src != c.backend || in.dst != sent || !ok {
			t.Errorf("%s, error about a reply: verdict %d, %s -> %s quoting %s -> %s, checksums %v; want %s -> %s quoting %s -> %s",
				c.name, ret, src, dst, in.src, in.dst, ok, c.router, c.backend.Addr(), c.backend, sent)
		}
		// About a packet to the backend: the backend itself says its port is unreachable.
		fwd := frame(pktSpec{src: sent, dst: c.backend, proto: 17, payload: []byte("q")})
		ret, out = r.run(t, icmpFrame(c.backend.Addr(), sent.Addr(), fwd))
		src, dst, in, ok = icmpView(out)
		if ret != actRedirect || src != c.vip.Addr() || dst != c.client.Addr() || in.src != c.client || in.dst != c.vip || !ok {
			t.Errorf("%s, error about a packet to the backend: verdict %d, %s -> %s quoting %s -> %s, checksums %v; want %s -> %s quoting %s -> %s",
				c.name, ret, src, dst, in.src, in.dst, ok, c.vip.Addr(), c.client.Addr(), c.client, c.vip)
		}
	}
	// No flow: untouched.
	stray := icmpFrame(router4, vipV4, frame(pktSpec{src: ap("203.0.113.50:80"), dst: ap("198.51.100.99:1"), proto: 17}))
	if ret, out := r.run(t, stray); ret != actPass || !bytes.Equal(out, stray) {
		t.Errorf("an error about no flow: verdict %d, changed %v", ret, !bytes.Equal(out, stray))
	}
}

// fragments splits a UDP datagram frame (IPv4) into two fragments, id 0x4321: the first with the
// UDP header and 8*k bytes of data (MF), the second with the rest.
func fragments(f []byte, k int) (first, second []byte) {
	hdr := f[:34]
	payload := f[34:] // UDP header and data
	cut := 8 * k
	mk := func(part []byte, off int, more bool) []byte {
		b := append(bytes.Clone(hdr), part...)
		binary.BigEndian.PutUint16(b[16:], uint16(20+len(part)))
		binary.BigEndian.PutUint16(b[18:], 0x4321)
		fo := uint16(off / 8)
		if more {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(b[20:], fo)
		b[24], b[25] = 0, 0
		binary.BigEndian.PutUint16(b[24:], ^sum16(b[14:34], 0))
		return b
	}
	return mk(payload[:cut], 0, true), mk(payload[cut:], cut, false)
}

// TestFragments: the first fragment of a UDP datagram goes with its flow (a new one here) and the
// later ones follow it, addresses rewritten; put back together, the datagram's checksum verifies
// with its new addresses. A later fragment whose first the program did not take is left alone.
func TestFragments(t *testing.T) { eachProg(t, testFragments) }

func testFragments(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	for _, vip := range []netip.AddrPort{ap("203.0.113.50:80"), ap("203.0.113.50:81")} {
		client := ap("198.51.100.40:47000")
		whole := frame(pktSpec{src: client, dst: vip, proto: 17, payload: bytes.Repeat([]byte("fragment"), 150)})
		first, second := fragments(whole, 100)
		ret1, out1 := r.run(t, first)
		byTC := r.byTC
		ret2, out2 := r.run(t, second)
		if r.xdp && (byTC || r.byTC) {
			t.Errorf("%s: a fragment handed to the tc program, want both forwarded by XDP", vip)
		}
		a, b := readTuple(out1), tuple{}
		if len(out2) >= 34 {
			b.src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(out2[26:30])), 0)
			b.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(out2[30:34])), 0)
		}
		if ret1 != actRedirect || ret2 != actRedirect || a.src.Addr() != b.src.Addr() || a.dst.Addr() != b.dst.Addr() {
			t.Errorf("%s: verdicts %d, %d; first to %s -> %s, second to %s -> %s", vip, ret1, ret2, a.src, a.dst, b.src, b.dst)
			continue
		}
		// Put back together: the first's IP header, its UDP header and data, the second's data.
		joined := append(bytes.Clone(out1[:14+20]), out1[34:]...)
		joined = append(joined, out2[34:]...)
		binary.BigEndian.PutUint16(joined[16:], uint16(len(joined)-14))
		joined[20], joined[21] = 0, 0
		joined[24], joined[25] = 0, 0
		binary.BigEndian.PutUint16(joined[24:], ^sum16(joined[14:34], 0))
		if ipOK, l4OK := checksums(joined); !ipOK || !l4OK {
			t.Errorf("%s: the datagram put back together: checksums IP %v, UDP %v", vip, ipOK, l4OK)
		}
		if ipOK, _ := checksums(out2); !ipOK {
			t.Errorf("%s: the second fragment's IP header checksum", vip)
		}
	}
	c, _ := r.path.Counters()
	if c.Frag < 2 {
		t.Errorf("counters %+v: want the later fragments counted", c)
	}
}

// ttlOf is a frame's IPv4 TTL or IPv6 hop limit (0 without an IP header).
func ttlOf(f []byte) uint8 {
	switch {
	case len(f) >= 34 && binary.BigEndian.Uint16(f[12:]) == 0x0800:
		return f[22]
	case len(f) >= 54 && binary.BigEndian.Uint16(f[12:]) == 0x86dd:
		return f[21]
	}
	return 0
}
