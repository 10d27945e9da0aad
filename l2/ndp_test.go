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
	ethDst   net.HardwareAddr // default: the solicited-node group's MAC
	ethSrc   net.HardwareAddr // default: clientMAC
	src, dst netip.Addr       // default: client6LL, the solicited-node group
	hopLimit uint8            // default: 255
	badSum   bool             // corrupt the ICMPv6 checksum
	truncate int              // bytes to cut off the end
}

func buildNSFrame(t *testing.T, f nsFrame) []byte {
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
		group, err := ndp.SolicitedNodeMulticast(f.target)
		if err != nil {
			t.Fatal(err)
		}
		f.dst = group
	}
	if f.ethDst == nil {
		d := f.dst.As16()
		f.ethDst = net.HardwareAddr{0x33, 0x33, d[12], d[13], d[14], d[15]}
	}
	if f.ethSrc == nil {
		f.ethSrc = clientMAC
	}
	if f.hopLimit == 0 {
		f.hopLimit = 255
	}
	icmp, err := ndp.MarshalMessageChecksum(msg, f.src, f.dst)
	if err != nil {
		t.Fatal(err)
	}
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
	ip = ip[:len(ip)-f.truncate]
	frame := ethernet.Frame{Destination: f.ethDst, Source: f.ethSrc, EtherType: ethernet.EtherTypeIPv6, Payload: ip}
	b, err := frame.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestNDP(t *testing.T) (*ndpResponder, *fakePacketConn, *fakeNDPConn) {
	t.Helper()
	m, _ := testMetrics(t)
	in, out := newFakePacketConn(), newFakeNDPConn()
	r := newNDPResponder(hclog.NewNullLogger(), eth0, ndpSockets{in: in, out: out}, testOwner, m)
	t.Cleanup(func() { r.close() })
	return r, in, out
}

// TestNDPResponderHandle is the specification of the NDP responder: which
// frames are answered, and why the others are not.
func TestNDPResponderHandle(t *testing.T) {
	answer := func(dst netip.Addr) []naView {
		return []naView{{Dst: dst.String(), Target: vip6.String(), Solicited: true, Override: true, TargetLL: ourMAC.String()}}
	}
	tests := []struct {
		name   string
		frame  nsFrame
		raw    []byte
		reason DropReason
		want   []naView
	}{
		{
			name:   "multicast solicitation for owned VIP (address resolution)",
			frame:  nsFrame{target: vip6, sourceLL: clientMAC},
			reason: DropNone, want: answer(client6LL),
		},
		{
			name:   "unicast solicitation for owned VIP (unreachability detection)",
			frame:  nsFrame{target: vip6, ethDst: ourMAC, dst: vip6, src: netip.MustParseAddr("2001:db8:1::2")},
			reason: DropNone, want: answer(netip.MustParseAddr("2001:db8:1::2")),
		},
		{
			name:   "duplicate address detection probe for owned VIP",
			frame:  nsFrame{target: vip6, src: netip.IPv6Unspecified()},
			reason: DropNone,
			want:   []naView{{Dst: "ff02::1", Target: vip6.String(), Solicited: false, Override: true, TargetLL: ourMAC.String()}},
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
		{name: "forwarded solicitation (hop limit 64)", frame: nsFrame{target: vip6, sourceLL: clientMAC, hopLimit: 64}, reason: DropMalformed},
		{name: "DAD probe with source link-layer option", frame: nsFrame{target: vip6, sourceLL: clientMAC, src: netip.IPv6Unspecified()}, reason: DropMalformed},
		{name: "bad ICMPv6 checksum", frame: nsFrame{target: vip6, sourceLL: clientMAC, badSum: true}, reason: DropMalformed},
		{name: "truncated packet", frame: nsFrame{target: vip6, sourceLL: clientMAC, truncate: 10}, reason: DropMalformed},
		{name: "not even an IPv6 header", raw: []byte{0x33, 0x33, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x86, 0xdd, 0x60}, reason: DropMalformed},
		{
			name:   "our own kernel soliciting the VIP",
			frame:  nsFrame{target: vip6, sourceLL: ourMAC, ethSrc: ourMAC, src: netip.MustParseAddr("2001:db8:1::1")},
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
			r, _, out := newTestNDP(t)
			raw := tt.raw
			if raw == nil {
				raw = buildNSFrame(t, tt.frame)
			}
			if got := r.handle(raw); got != tt.reason {
				t.Errorf("handle() = %v, want %v", got, tt.reason)
			}
			var got []naView
			for _, s := range out.messages() {
				got = append(got, viewNA(t, s))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("sent advertisements (-want +got):\n%s", diff)
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
