package natpath

import (
	"bytes"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// The attacks of issue #27 on crafted frames (BPF_PROG_TEST_RUN): a flow's packets never go to
// another flow, a flood of new flows evicts no established one, a blind RST or FIN changes
// nothing, and sources no client can have are dropped.

const actShot = 2 // TC_ACT_SHOT

// with loads another Path with cfg in r's namespace, given runVIPs (closed at the test's end).
func (r *runner) with(t *testing.T, cfg Config) *runner {
	t.Helper()
	var p *Path
	if err := in(r.ns, func() error {
		var err error
		if p, err = Load(cfg); err != nil {
			return err
		}
		return p.Sync(runVIPs)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return r.derive(t, p)
}

func (r *runner) counters(t *testing.T) Counters {
	t.Helper()
	c, err := r.path.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPortOwnedWhileServerSends: a masquerade port stays its flow's while either side talks. The
// client goes quiet for twice the timeout (2 s: entries note their use to a second) while its
// server goes on sending: another client finds no free port (the only one is held), and the
// server's datagrams keep reaching their own client. Before, the port was free as soon as the
// client side idled out, and the next flow on it received the server's packets. Once both sides
// are quiet, the port is free again.
func TestPortOwnedWhileServerSends(t *testing.T) { eachProg(t, testPortOwnedWhileServerSends) }

func testPortOwnedWhileServerSends(t *testing.T) {
	one := newRunner(t).with(t, Config{UDPTimeout: 2 * time.Second, SNATPortMin: 61000, SNATPortMax: 61000})
	ap := netip.MustParseAddrPort
	vip, backend := ap("203.0.113.50:81"), ap("192.0.2.11:30080")
	a, b := ap("198.51.100.10:44100"), ap("198.51.100.20:44100")
	ret, out := one.run(t, frame(pktSpec{src: a, dst: vip, proto: 17}))
	masq := readTuple(out).src
	if ret != actRedirect || masq.Port() != 61000 {
		t.Fatalf("the first flow: verdict %d from %s, want the one port", ret, masq)
	}
	serverSends := func() {
		t.Helper()
		ret, out := one.run(t, frame(pktSpec{src: backend, dst: masq, proto: 17, payload: []byte("for a")}))
		if got := readTuple(out); ret != actRedirect || got.dst != a || got.src != vip {
			t.Fatalf("the server's datagram: verdict %d, %s -> %s; want %s -> %s (its own client)", ret, got.src, got.dst, vip, a)
		}
	}
	serverSends()
	for range 11 {
		time.Sleep(400 * time.Millisecond)
		serverSends()
		if ret, out := one.run(t, frame(pktSpec{src: b, dst: vip, proto: 17})); ret != actPass {
			t.Fatalf("another client took the port of a flow whose server still sends (verdict %d, from %s)", ret, readTuple(out).src)
		}
	}
	time.Sleep(2500 * time.Millisecond)
	if ret, got := one.run(t, frame(pktSpec{src: b, dst: vip, proto: 17})); ret != actRedirect || readTuple(got).src.Port() != 61000 {
		t.Fatalf("after both sides idled out: verdict %d, want the port", ret)
	}
}

// TestEstablishedNotEvicted: a table of 8 flows holds 8 answered (established) flows; a SYN flood
// of 2,000 connections that never complete (SYN, the backend's SYN-ACK, the flooder's RST: every
// entry used, as a real flood's are) evicts none of them (they take the unconfirmed flows' room),
// and each established flow's packets still go both ways to the right place. A ninth answered
// flow finds the established table full: it goes on unconfirmed, and new flows are left to the
// stack for a while rather than evict anything.
func TestEstablishedNotEvicted(t *testing.T) { eachProg(t, testEstablishedNotEvicted) }

func testEstablishedNotEvicted(t *testing.T) {
	r := newRunner(t).with(t, Config{FlowEntries: 16, NewFlowEntries: 64})
	ap := netip.MustParseAddrPort
	vip, backend := ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	client := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.50"), uint16(1000+i))
	}
	both := func(what string, c netip.AddrPort) {
		t.Helper()
		ret, out := r.run(t, frame(pktSpec{src: c, dst: vip, proto: 17}))
		if got := readTuple(out); ret != actRedirect || got.dst != backend || got.src != c {
			t.Fatalf("%s: the client's datagram: verdict %d, %s -> %s", what, ret, got.src, got.dst)
		}
		ret, out = r.run(t, frame(pktSpec{src: backend, dst: c, proto: 17}))
		if got := readTuple(out); ret != actRedirect || got.src != vip || got.dst != c {
			t.Fatalf("%s: the answer: verdict %d, %s -> %s; want %s -> %s", what, ret, got.src, got.dst, vip, c)
		}
		// The client's next datagram confirms the flow (an answer alone does not).
		if ret, _ := r.run(t, frame(pktSpec{src: c, dst: vip, proto: 17})); ret != actRedirect {
			t.Fatalf("%s: the client's second datagram: verdict %d", what, ret)
		}
	}
	for i := range 8 {
		both("establishing", client(i))
	}
	flows, _ := r.path.Flows(0)
	if n := len(slices.DeleteFunc(flows, func(f Flow) bool { return f.Unconfirmed })); n != 16 {
		t.Fatalf("%d established entries, want 16", n)
	}
	for j := range 2000 {
		src := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.60"), uint16(2000+j))
		isn := uint32(j) * 7919
		if ret, _ := r.run(t, frame(pktSpec{src: src, dst: vip, proto: 6, tcpFlags: 0x02, seq: isn})); ret != actRedirect {
			t.Fatalf("flood flow %d: verdict %d (room for unconfirmed flows)", j, ret)
		}
		r.run(t, frame(pktSpec{src: backend, dst: src, proto: 6, tcpFlags: 0x12, seq: 1, ack: isn + 1}))
		r.run(t, frame(pktSpec{src: src, dst: vip, proto: 6, tcpFlags: 0x04, seq: isn + 1}))
	}
	for i := range 8 {
		both("after the flood", client(i))
	}
	// The ninth answered flow: no room.
	before := r.counters(t)
	both("a ninth flow (unconfirmed)", client(8))
	if ret, _ := r.run(t, frame(pktSpec{src: ap("198.51.100.61:3000"), dst: vip, proto: 17})); ret != actPass {
		t.Errorf("a new flow right after the established table was full: verdict %d, want left to the stack", ret)
	}
	if after := r.counters(t); after.Full < before.Full+2 {
		t.Errorf("counters %+v: want the refused confirmation and the refused flow counted as full", after)
	}
	for i := range 8 {
		both("at the end", client(i))
	}
}

// tcpOpts are a SYN's options with window scale 7 (MSS, SACK permitted, NOP, window scale).
var tcpOpts = []byte{2, 4, 5, 0xb4, 4, 2, 1, 3, 3, 7}

func padOpts(o []byte) []byte { return append(slices.Clone(o), make([]byte, (4-len(o)%4)%4)...) }

// TestBlindRST: a RST or FIN that is not within the window conntrack would accept (RFC 5961: the
// receiver's window around the sender's next sequence number) changes nothing: the connection's
// SYNs keep its backend and its entry keeps its 1 h idle timeout. Before, any RST moved the next
// SYN to the current table's backend (breaking the connection) and cut the timeout to 2 min. The
// real ones (in the window) still close it.
func TestBlindRST(t *testing.T) { eachProg(t, testBlindRST) }

func testBlindRST(t *testing.T) {
	r := newRunner(t)
	ap := netip.MustParseAddrPort
	client, vip := ap("198.51.100.10:43100"), ap("203.0.113.64:80")
	a, b := ap("10.244.1.11:8080"), ap("10.244.1.12:8080")
	sync := func(to netip.AddrPort) { t.Helper(); r.syncTCPPort(t, vip, to) }
	fromClient := func(what string, s pktSpec, want netip.AddrPort) {
		t.Helper()
		s.src, s.dst, s.proto = client, vip, 6
		ret, out := r.run(t, frame(s))
		if got := readTuple(out).dst; ret != actRedirect || got != want {
			t.Errorf("%s: verdict %d to %s, want %s", what, ret, got, want)
		}
	}
	fromServer := func(what string, s pktSpec) {
		t.Helper()
		s.src, s.dst, s.proto = a, client, 6
		if ret, _ := r.run(t, frame(s)); ret != actRedirect {
			t.Errorf("%s: verdict %d, want forwarded", what, ret)
		}
	}
	entry := func() Flow {
		t.Helper()
		flows, _ := r.path.Flows(0)
		for _, f := range flows {
			if f.Src == client && f.Dst == vip {
				return f
			}
		}
		t.Fatal("the connection has no entry")
		return Flow{}
	}
	sync(a)
	fromClient("SYN", pktSpec{tcpFlags: 0x02, seq: 1000, window: 64240, options: padOpts(tcpOpts)}, a)
	fromServer("SYN-ACK", pktSpec{tcpFlags: 0x12, seq: 7000, ack: 1001, window: 65160, options: padOpts(tcpOpts)})
	fromClient("ACK", pktSpec{tcpFlags: 0x10, seq: 1001, ack: 7001, window: 502}, a)
	if f := entry(); f.Unconfirmed {
		t.Fatalf("after the handshake: %+v, want established", f)
	}
	fromClient("data", pktSpec{tcpFlags: 0x18, seq: 1001, ack: 7001, window: 502, payload: bytes.Repeat([]byte("x"), 100)}, a)
	fromServer("data back", pktSpec{tcpFlags: 0x18, seq: 7001, ack: 1101, window: 509, payload: bytes.Repeat([]byte("y"), 1000)})
	sync(b)
	before := r.counters(t)
	// Blind: sequence numbers an attacker who does not see the connection guesses.
	fromClient("a blind RST", pktSpec{tcpFlags: 0x04, seq: 1101 + 1<<30}, a)
	fromClient("a blind FIN", pktSpec{tcpFlags: 0x11, seq: 1101 + 3<<29, ack: 8001}, a)
	fromServer("a blind RST from the server's side", pktSpec{tcpFlags: 0x14, seq: 8001 + 3<<30, ack: 1101})
	// A SYN-ACK spoofed from the server's side to move what a RST is checked against, then the RST.
	fromServer("a spoofed SYN-ACK", pktSpec{tcpFlags: 0x12, seq: 1 << 31, ack: 1101, options: padOpts(tcpOpts)})
	fromServer("a RST right after it", pktSpec{tcpFlags: 0x14, seq: 1<<31 + 1, ack: 1101})
	fromClient("then a SYN (the attacker's, to move the connection)", pktSpec{tcpFlags: 0x02, seq: 555}, a)
	if f := entry(); f.Closing {
		t.Errorf("after blind RSTs and FINs: %+v, want the connection open (its 1 h timeout)", f)
	}
	if after := r.counters(t); after.Window != before.Window+4 {
		t.Errorf("out-of-window RST/FIN counted %d, want 4", after.Window-before.Window)
	}
	fromClient("more data", pktSpec{tcpFlags: 0x18, seq: 1101, ack: 8001, window: 502, payload: []byte("z")}, a)
	// The real close: the client's RST at its next sequence number.
	fromClient("the client's RST", pktSpec{tcpFlags: 0x04, seq: 1102}, a)
	if f := entry(); !f.Closing {
		t.Errorf("after the real RST: %+v, want closing", f)
	}
	fromClient("a new connection's SYN on the tuple", pktSpec{tcpFlags: 0x02, seq: 90000}, b)
}

// TestMartians: a new flow from a source no client can have is dropped (IP input drops them as
// martians: 0.0.0.0/8, 127.0.0.0/8, multicast, the broadcast address; IPv6 ::, ::1, multicast),
// one from an IPv4-mapped IPv6 address (no IPv6 host has one on the wire), one from the VIP
// itself (a packet from its own destination), and one from the cluster's pod networks (Config.DenySources): only spoofing gives a
// packet from outside such an address. A link-local source is not dropped (the route lookup
// leaves it to the stack: a router does not forward it), and others are taken. Before, the fast
// path forwarded all of them to the backends.
func TestMartians(t *testing.T) { eachProg(t, testMartians) }

func testMartians(t *testing.T) {
	r := newRunner(t).with(t, Config{DenySources: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2001:db8:d::/64")}})
	vip4, vip6 := netip.AddrPortFrom(vipV4, 80), netip.AddrPortFrom(vipV6, 80)
	before := r.counters(t)
	n := 0
	for _, src := range []string{"0.0.0.0", "0.1.2.3", "127.0.0.1", "127.9.9.9", "224.0.0.1", "239.1.1.1", "255.255.255.255", "10.244.7.7",
		"::", "::1", "ff02::1", "ff05::2", "2001:db8:d::99", "::ffff:198.51.100.7", vipV4.String(), vipV6.String()} {
		s := netip.MustParseAddr(src)
		dst := vip4
		if s.Is6() {
			dst = vip6
		}
		for _, proto := range []uint8{6, 17} {
			if s.Is6() && proto == 17 {
				continue // no UDP VIP port 80 for IPv6 in runVIPs
			}
			in := frame(pktSpec{src: netip.AddrPortFrom(s, 40000), dst: dst, proto: proto, tcpFlags: 0x02})
			if ret, out := r.run(t, in); ret != actShot || !bytes.Equal(out, in) {
				t.Errorf("from %s (protocol %d): verdict %d, want dropped (2)", src, proto, ret)
			}
			n++
		}
	}
	if after := r.counters(t); after.Martian != before.Martian+uint64(n) {
		t.Errorf("martians counted %d, want %d", after.Martian-before.Martian, n)
	}
	for _, src := range []string{"fe80::1", "198.51.100.77", "10.243.0.1"} {
		s := netip.MustParseAddr(src)
		dst := vip4
		if s.Is6() {
			dst = vip6
		}
		want := uint32(actRedirect)
		if s.IsLinkLocalUnicast() {
			want = actPass
		}
		if ret, _ := r.run(t, frame(pktSpec{src: netip.AddrPortFrom(s, 40000), dst: dst, proto: 6, tcpFlags: 0x02})); ret != want {
			t.Errorf("from %s: verdict %d, want %d", src, ret, want)
		}
	}
}

// martianSource says whether a frame's IP source is one of the program's built-in martians (for
// FuzzPacket: those it drops).
func martianSource(f []byte) bool {
	t := readTuple(f)
	a := t.src.Addr()
	if !a.IsValid() {
		return false
	}
	if a.Is4() {
		b := a.As4()
		return b[0] == 0 || b[0] == 127 || b[0]&0xf0 == 0xe0 || a == netip.IPv4Unspecified() || b == [4]byte{255, 255, 255, 255} ||
			a == t.dst.Addr()
	}
	return a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.Is4In6() || a == t.dst.Addr()
}

// TestSweep: nothing evicts from the established table, so the sweep deletes the flows that
// ended: both entries of a flow idle on both sides, an entry whose partner is gone once idle
// itself; a flow whose server alone still talks keeps both its entries.
func TestSweep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF maps)")
	}
	p, err := Load(Config{FlowEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	now, _ := coarseNow()
	old := now - uint64(10*time.Minute) // past UDP's 2 min, within TCP's 1 h
	vip := netip.AddrPortFrom(vipV4, 80)
	backend := netip.MustParseAddrPort("10.244.1.11:8080")
	var keys [][flowKeySize]byte
	var vals [][flowValSize]byte
	flow := func(proto uint8, client netip.AddrPort, fwdSeen, repSeen uint64, reply bool) {
		fk, fv := flowEntry(proto, client, vip, client, backend, flowReplied, fwdSeen)
		keys, vals = append(keys, fk), append(vals, fv)
		if reply {
			rk, rv := flowEntry(proto, backend, client, vip, client, flowReply|flowReplied, repSeen)
			keys, vals = append(keys, rk), append(vals, rv)
		}
	}
	ap := netip.MustParseAddrPort
	flow(17, ap("198.51.100.1:1000"), old, old, true) // ended: both go
	flow(17, ap("198.51.100.1:1001"), old, now, true) // the server still sends: kept
	flow(17, ap("198.51.100.1:1002"), now, old, true) // the client still sends: kept
	flow(6, ap("198.51.100.1:1003"), old, old, true)  // TCP, 10 min idle, established: kept
	flow(17, ap("198.51.100.1:1004"), old, 0, false)  // no partner, idle: goes
	if _, err := p.flows.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
	n, err := p.Sweep()
	if err != nil || n != 3 {
		t.Fatalf("swept %d entries, %v; want 3", n, err)
	}
	left, _ := p.Flows(0)
	var ports []uint16
	for _, f := range left {
		if !f.Reply {
			ports = append(ports, f.Src.Port())
		}
	}
	slices.Sort(ports)
	if len(left) != 6 || !slices.Equal(ports, []uint16{1001, 1002, 1003}) {
		t.Errorf("left %d entries, forward ones from ports %v; want 6, of 1001-1003", len(left), ports)
	}
}

// TestLayouts: the binary layouts natpath.go writes and reads are the program's (its maps' key
// and value sizes, from the object's BTF).
func TestLayouts(t *testing.T) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(object))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m          string
		key, value uint32
	}{
		{mapVIPs, vipKeySize, vipValSize}, {mapFlows, flowKeySize, flowValSize}, {mapNew, flowKeySize, flowValSize},
		{mapConfig, 4, configSize}, {mapDeny, denyKeySize, 4},
	} {
		ms := spec.Maps[c.m]
		if ms == nil || ms.KeySize != c.key || ms.ValueSize != c.value {
			t.Errorf("map %s: %+v, want key %d value %d bytes", c.m, ms, c.key, c.value)
		}
	}
}
