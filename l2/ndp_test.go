package l2

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/bpf"
)

// naView is a sent neighbor advertisement in readable form, for diffs.
type naView struct {
	Dst                 string
	Target              string
	Solicited, Override bool
	TargetLL            string
}

func viewNA(t *testing.T, s ndpSent) naView {
	t.Helper()
	na, ok := s.msg.(*ndp.NeighborAdvertisement)
	if !ok {
		t.Fatalf("sent %T, want *ndp.NeighborAdvertisement", s.msg)
	}
	v := naView{Dst: s.dst.String(), Target: na.TargetAddress.String(), Solicited: na.Solicited, Override: na.Override}
	for _, o := range na.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
			v.TargetLL = lla.Addr.String()
		}
	}
	return v
}

// nsFrame describes a neighbor solicitation frame; zero fields get the
// values of a client resolving target by multicast.
type nsFrame struct {
	target   netip.Addr
	sourceLL net.HardwareAddr // source link-layer address option, if any
	msg      ndp.Message      // sent instead of an NS when set
	rawOpts  []byte           // appended to the message as they are
	ethDst   net.HardwareAddr // default: the destination group's MAC, or ourMAC for a unicast destination
	ethSrc   net.HardwareAddr // default: clientMAC
	src, dst netip.Addr       // default: client6LL, the solicited-node group
	hopLimit uint8            // default: 255
	code     uint8            // ICMPv6 code
	badSum   bool             // corrupt the ICMPv6 checksum
	truncate int              // bytes to cut off the end of the ICMPv6 message (checksum over what is left)
	cutFrame int              // bytes to cut off the end of the frame
}

func buildNSFrame(t testing.TB, f nsFrame) []byte {
	t.Helper()
	msg := f.msg
	if msg == nil {
		ns := &ndp.NeighborSolicitation{TargetAddress: f.target}
		if f.sourceLL != nil {
			ns.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: f.sourceLL}}
		}
		msg = ns
	}
	if !f.src.IsValid() {
		f.src = client6LL
	}
	if !f.dst.IsValid() {
		f.dst = solicitedNodeGroup(f.target)
	}
	if f.ethDst == nil {
		f.ethDst = ourMAC
		if f.dst.IsMulticast() {
			f.ethDst = multicastMAC(f.dst)
		}
	}
	if f.ethSrc == nil {
		f.ethSrc = clientMAC
	}
	if f.hopLimit == 0 {
		f.hopLimit = 255
	}
	icmp, err := ndp.MarshalMessage(msg)
	if err != nil {
		t.Fatal(err)
	}
	icmp = append(icmp, f.rawOpts...)
	icmp = icmp[:len(icmp)-f.truncate]
	icmp[1] = f.code
	binary.BigEndian.PutUint16(icmp[2:4], icmpv6Checksum(f.src, f.dst, icmp))
	if f.badSum {
		icmp[2] ^= 0xff
	}
	ip := make([]byte, ipv6HeaderLen, ipv6HeaderLen+len(icmp))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(icmp)))
	ip[6], ip[7] = icmpv6Proto, f.hopLimit
	src, dst := f.src.As16(), f.dst.As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	ip = append(ip, icmp...)
	frame := ethernet.Frame{Destination: f.ethDst, Source: f.ethSrc, EtherType: ethernet.EtherTypeIPv6, Payload: ip}
	b, err := frame.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b[:len(b)-f.cutFrame]
}

// naFrame is a neighbor advertisement frame in readable form, for diffs.
type naFrame struct {
	EthDst, EthSrc    string
	Src, Dst          string
	HopLimit          uint8
	Target            string
	Router, Solicited bool
	Override          bool
	TargetLL          string
}

// parseNAFrame decodes a sent advertisement with mdlayher/ndp, a parser
// independent of ours, and checks its ICMPv6 checksum.
func parseNAFrame(t testing.TB, b []byte) naFrame {
	t.Helper()
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		t.Fatalf("sent frame: %v", err)
	}
	ip := f.Payload
	if len(ip) < ipv6HeaderLen || ip[6] != icmpv6Proto {
		t.Fatalf("sent frame is not ICMPv6: % x", b)
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	icmp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if icmpv6Checksum(src, dst, icmp) != 0 {
		t.Errorf("sent advertisement has a bad ICMPv6 checksum")
	}
	msg, err := ndp.ParseMessage(icmp)
	if err != nil {
		t.Fatalf("sent message: %v", err)
	}
	na, ok := msg.(*ndp.NeighborAdvertisement)
	if !ok {
		t.Fatalf("sent %T, want *ndp.NeighborAdvertisement", msg)
	}
	v := naFrame{
		EthDst: f.Destination.String(), EthSrc: f.Source.String(),
		Src: src.String(), Dst: dst.String(), HopLimit: ip[7],
		Target: na.TargetAddress.String(), Router: na.Router, Solicited: na.Solicited, Override: na.Override,
	}
	for _, o := range na.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
			v.TargetLL = lla.Addr.String()
		}
	}
	return v
}

// ourLL is the link-local address of the fake interface.
var ourLL = netip.MustParseAddr("fe80::1")

func newTestNDP(t *testing.T) (*ndpResponder, *fakePacketConn, *fakeNDPConn) {
	t.Helper()
	m, _ := testMetrics(t)
	in, out := newFakePacketConn(), newFakeNDPConn()
	r := newNDPResponder(hclog.NewNullLogger(), eth0, ndpSockets{frames: in, icmp: out, linkLocal: ourLL}, testOwner, m)
	t.Cleanup(func() { r.close() })
	return r, in, out
}

// TestNDPResponderHandle is the specification of the NDP responder: which
// frames are answered, how, and why the others are not (RFC 4861 sections
// 7.1.1 and 7.2.4).
func TestNDPResponderHandle(t *testing.T) {
	global := netip.MustParseAddr("2001:db8:1::2")
	offLink := netip.MustParseAddr("2001:db8:99::7")
	// solicited is the solicited advertisement to dst at mac.
	solicited := func(dst netip.Addr, mac net.HardwareAddr) []naFrame {
		return []naFrame{{
			EthDst: mac.String(), EthSrc: ourMAC.String(), Src: ourLL.String(), Dst: dst.String(), HopLimit: 255,
			Target: vip6.String(), Solicited: true, Override: true, TargetLL: ourMAC.String(),
		}}
	}
	toAllNodes := []naFrame{{
		EthDst: "33:33:00:00:00:01", EthSrc: ourMAC.String(), Src: ourLL.String(), Dst: "ff02::1", HopLimit: 255,
		Target: vip6.String(), Solicited: false, Override: true, TargetLL: ourMAC.String(),
	}}
	zeroLenOpt := []byte{14, 0, 0, 0, 0, 0, 0, 0}
	nonce := []byte{14, 1, 1, 2, 3, 4, 5, 6} // RFC 7527, sent by Linux in DAD probes
	tests := []struct {
		name   string
		frame  nsFrame
		raw    []byte
		reason DropReason
		want   []naFrame
	}{
		{
			name:   "multicast solicitation from link-local source (address resolution)",
			frame:  nsFrame{target: vip6, sourceLL: clientMAC},
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "multicast solicitation from global source",
			frame:  nsFrame{target: vip6, sourceLL: clientMAC, src: global},
			reason: DropNone, want: solicited(global, clientMAC),
		},
		{
			name:   "unicast solicitation from global source (unreachability detection)",
			frame:  nsFrame{target: vip6, dst: vip6, src: global, sourceLL: clientMAC},
			reason: DropNone, want: solicited(global, clientMAC),
		},
		{
			name:   "unicast solicitation from link-local source without source link-layer option",
			frame:  nsFrame{target: vip6, dst: vip6},
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "the answer goes to the frame's source MAC, not to the one the option names",
			frame:  nsFrame{target: vip6, dst: vip6, sourceLL: otherMAC},
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "solicitation from a source we have no route to goes to the solicitor's MAC, not routed",
			frame:  nsFrame{target: vip6, dst: vip6, src: offLink, sourceLL: clientMAC},
			reason: DropNone, want: solicited(offLink, clientMAC),
		},
		{
			name:   "multicast solicitation in a unicast frame (multicast-to-unicast bridges)",
			frame:  nsFrame{target: vip6, sourceLL: clientMAC, ethDst: ourMAC},
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "unknown options are skipped",
			frame:  nsFrame{target: vip6, sourceLL: clientMAC, rawOpts: nonce},
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "Ethernet padding after the packet",
			raw:    append(buildNSFrame(t, nsFrame{target: vip6, sourceLL: clientMAC}), 0, 0, 0, 0),
			reason: DropNone, want: solicited(client6LL, clientMAC),
		},
		{
			name:   "duplicate address detection probe: to all nodes, Solicited clear",
			frame:  nsFrame{target: vip6, src: netip.IPv6Unspecified()},
			reason: DropNone, want: toAllNodes,
		},
		{
			name:   "duplicate address detection probe with a nonce option (Linux)",
			frame:  nsFrame{target: vip6, src: netip.IPv6Unspecified(), rawOpts: nonce},
			reason: DropNone, want: toAllNodes,
		},
		{name: "solicitation for an address that is not ours", frame: nsFrame{target: notOurs6, sourceLL: clientMAC}, reason: DropNotOurs},
		{name: "solicitation for the node's own address", frame: nsFrame{target: netip.MustParseAddr("2001:db8:1::1"), sourceLL: clientMAC}, reason: DropNotOurs},
		{name: "solicitation for a VIP owned on another interface", frame: nsFrame{target: vip6Eth1, sourceLL: clientMAC}, reason: DropWrongInterface},
		{
			name:   "neighbor advertisement",
			frame:  nsFrame{target: vip6, msg: &ndp.NeighborAdvertisement{TargetAddress: vip6, Override: true}},
			reason: DropNotRequest,
		},
		{name: "router solicitation", frame: nsFrame{target: vip6, msg: &ndp.RouterSolicitation{}}, reason: DropNotRequest},

		// RFC 4861 section 7.1.1.
		{name: "forwarded solicitation (hop limit 64)", frame: nsFrame{target: vip6, sourceLL: clientMAC, hopLimit: 64}, reason: DropHopLimit},
		{name: "forwarded unicast probe (hop limit 254)", frame: nsFrame{target: vip6, dst: vip6, src: global, hopLimit: 254}, reason: DropHopLimit},
		{name: "bad ICMPv6 checksum", frame: nsFrame{target: vip6, sourceLL: clientMAC, badSum: true}, reason: DropMalformed},
		{name: "ICMPv6 code 1", frame: nsFrame{target: vip6, sourceLL: clientMAC, code: 1}, reason: DropBadCode},
		{name: "ICMP length 23", frame: nsFrame{target: vip6, truncate: 1}, reason: DropMalformed},
		{name: "multicast target", frame: nsFrame{target: netip.MustParseAddr("ff02::1"), dst: solicitedNodeGroup(netip.MustParseAddr("ff02::1"))}, reason: DropMulticastTarget},
		{name: "option of length 0", frame: nsFrame{target: vip6, sourceLL: clientMAC, rawOpts: zeroLenOpt}, reason: DropBadOption},
		{name: "option running past the message", frame: nsFrame{target: vip6, rawOpts: []byte{14, 2, 0, 0, 0, 0, 0, 0}}, reason: DropBadOption},
		{name: "option header cut", frame: nsFrame{target: vip6, rawOpts: []byte{14}}, reason: DropBadOption},
		{name: "source link-layer option of 14 bytes", frame: nsFrame{target: vip6, rawOpts: append([]byte{1, 2}, make([]byte, 14)...)}, reason: DropBadOption},
		{name: "DAD probe with source link-layer option", frame: nsFrame{target: vip6, sourceLL: clientMAC, src: netip.IPv6Unspecified()}, reason: DropBadDAD},
		{name: "DAD probe to the target itself", frame: nsFrame{target: vip6, src: netip.IPv6Unspecified(), dst: vip6}, reason: DropBadDAD},
		{name: "DAD probe to all nodes", frame: nsFrame{target: vip6, src: netip.IPv6Unspecified(), dst: netip.IPv6LinkLocalAllNodes()}, reason: DropBadDAD},
		{name: "truncated frame", frame: nsFrame{target: vip6, sourceLL: clientMAC, cutFrame: 10}, reason: DropMalformed},
		{name: "not even an IPv6 header", raw: []byte{0x33, 0x33, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x86, 0xdd, 0x60}, reason: DropMalformed},

		// Where an answer would go.
		{name: "multicast source", frame: nsFrame{target: vip6, src: netip.IPv6LinkLocalAllNodes(), sourceLL: clientMAC}, reason: DropBadSource},
		{name: "loopback source", frame: nsFrame{target: vip6, src: netip.IPv6Loopback(), sourceLL: clientMAC}, reason: DropBadSource},
		{name: "broadcast source link-layer address", frame: nsFrame{target: vip6, sourceLL: ethernet.Broadcast}, reason: DropBadSource},
		{name: "multicast frame source, no option", frame: nsFrame{target: vip6, dst: vip6, ethSrc: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}}, reason: DropBadSource},
		{name: "zero source link-layer address", frame: nsFrame{target: vip6, sourceLL: make(net.HardwareAddr, 6)}, reason: DropBadSource},
		{name: "sent to another solicited-node group", frame: nsFrame{target: vip6, sourceLL: clientMAC, dst: solicitedNodeGroup(notOurs6)}, reason: DropOtherDestination},
		{name: "sent to all nodes", frame: nsFrame{target: vip6, sourceLL: clientMAC, dst: netip.IPv6LinkLocalAllNodes()}, reason: DropOtherDestination},
		{name: "unicast to another VIP of ours", frame: nsFrame{target: vip6, sourceLL: clientMAC, dst: vip6Eth1}, reason: DropOtherDestination},
		{
			name:   "our own kernel soliciting the VIP",
			frame:  nsFrame{target: vip6, sourceLL: ourMAC, ethSrc: ourMAC, src: netip.MustParseAddr("2001:db8:1::1")},
			reason: DropOwnFrame,
		},
		{
			name:   "our MAC in the source link-layer option",
			frame:  nsFrame{target: vip6, sourceLL: ourMAC},
			reason: DropOwnFrame,
		},
		{
			name:   "unicast to another host",
			frame:  nsFrame{target: vip6, ethDst: otherMAC, dst: vip6},
			reason: DropOtherDestination,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, in, icmp := newTestNDP(t)
			raw := tt.raw
			if raw == nil {
				raw = buildNSFrame(t, tt.frame)
			}
			if got := r.handle(raw); got != tt.reason {
				t.Errorf("handle() = %v, want %v", got, tt.reason)
			}
			var got []naFrame
			for _, b := range in.frames() {
				got = append(got, parseNAFrame(t, b))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("sent advertisements (-want +got):\n%s", diff)
			}
			if n := len(icmp.messages()); n != 0 {
				t.Errorf("%d messages sent through the ICMPv6 socket, want answers on the packet socket only", n)
			}
		})
	}
}

// TestNSFilter runs the BPF filter of the packet socket over frames: it
// must pass every solicitation and nothing else.
func TestNSFilter(t *testing.T) {
	vm, err := bpf.NewVM(mustDisassemble(t, nsFilter))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		frame []byte
		pass  bool
	}{
		{"neighbor solicitation", buildNSFrame(t, nsFrame{target: vip6, sourceLL: clientMAC}), true},
		{"neighbor advertisement", buildNSFrame(t, nsFrame{target: vip6, msg: &ndp.NeighborAdvertisement{TargetAddress: vip6}}), false},
		{"router solicitation", buildNSFrame(t, nsFrame{target: vip6, msg: &ndp.RouterSolicitation{}}), false},
		{"ARP", buildARPFrame(t, request(vip4)), false},
	} {
		n, err := vm.Run(c.frame)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (n > 0) != c.pass {
			t.Errorf("%s: filter returned %d, want pass=%v", c.name, n, c.pass)
		}
	}
}

func mustDisassemble(t *testing.T, raw []bpf.RawInstruction) []bpf.Instruction {
	t.Helper()
	prog, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("nsFilter does not disassemble")
	}
	return prog
}

// TestNDPGratuitous checks the unsolicited advertisement: to all nodes,
// Override set, Solicited clear, our MAC as target link-layer address.
func TestNDPGratuitous(t *testing.T) {
	r, _, conn := newTestNDP(t)
	if err := r.gratuitous(vip6); err != nil {
		t.Fatal(err)
	}
	want := []naView{{Dst: "ff02::1", Target: vip6.String(), Solicited: false, Override: true, TargetLL: ourMAC.String()}}
	var got []naView
	for _, s := range conn.messages() {
		got = append(got, viewNA(t, s))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unsolicited advertisements (-want +got):\n%s", diff)
	}
}

// TestNDPGroups checks solicited-node group membership: VIPs sharing their
// low 24 bits share one group, which is left with the last of them.
func TestNDPGroups(t *testing.T) {
	r, _, conn := newTestNDP(t)
	a := netip.MustParseAddr("2001:db8:1::12:3456")
	b := netip.MustParseAddr("2001:db8:2::12:3456") // same group as a
	c := netip.MustParseAddr("2001:db8:1::50")
	groupAB := netip.MustParseAddr("ff02::1:ff12:3456")
	groupC := netip.MustParseAddr("ff02::1:ff00:50")

	for _, ip := range []netip.Addr{a, b, c, a} { // joining twice is a no-op
		if err := r.join(ip); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[netip.Addr]bool{groupAB: true, groupC: true}, conn.groups(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("joined groups (-want +got):\n%s", diff)
	}
	for _, ip := range []netip.Addr{a, c, c} {
		if err := r.leave(ip); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[netip.Addr]bool{groupAB: true}, conn.groups(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("groups after leaving a and c (-want +got):\n%s", diff)
	}
	if err := r.leave(b); err != nil {
		t.Fatal(err)
	}
	if g := conn.groups(); len(g) != 0 {
		t.Errorf("groups after leaving all: %v, want none", g)
	}
}
