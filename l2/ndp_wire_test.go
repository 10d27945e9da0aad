package l2

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/ndp"
)

// TestAdvertisementMarshal checks our advertisement frames against
// mdlayher/ndp's parser, field by field.
func TestAdvertisementMarshal(t *testing.T) {
	for _, s := range []solicitation{
		{ethSrc: clientMAC, src: client6LL, dst: vip6, target: vip6},
		{ethSrc: clientMAC, src: netip.IPv6Unspecified(), dst: solicitedNodeGroup(vip6), target: vip6},
	} {
		a := answer(s, ourMAC, ourLL)
		got := parseNAFrame(t, a.marshal())
		want := naFrame{
			EthDst: a.ethDst.String(), EthSrc: ourMAC.String(), Src: ourLL.String(), Dst: a.dst.String(), HopLimit: 255,
			Target: vip6.String(), Solicited: !s.isDAD(), Override: true, TargetLL: ourMAC.String(),
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("advertisement for %+v (-want +got):\n%s", s, diff)
		}
	}
}

func TestSolicitedNodeGroup(t *testing.T) {
	for _, ip := range []netip.Addr{vip6, notOurs6, netip.MustParseAddr("2001:db8::12:3456")} {
		want, err := ndp.SolicitedNodeMulticast(ip)
		if err != nil {
			t.Fatal(err)
		}
		if got := solicitedNodeGroup(ip); got != want {
			t.Errorf("solicitedNodeGroup(%s) = %s, want %s", ip, got, want)
		}
		if !isSolicitedNodeGroup(want) || isSolicitedNodeGroup(ip) {
			t.Errorf("isSolicitedNodeGroup wrong for %s or %s", want, ip)
		}
	}
}

// FuzzParseSolicitation feeds arbitrary frames to the parser. Whatever it
// accepts must be a solicitation RFC 4861 calls valid, and the answer to it
// must go to the solicitor (or to all nodes for a DAD probe), never to a
// multicast MAC with Solicited set, never to ::.
func FuzzParseSolicitation(f *testing.F) {
	global := netip.MustParseAddr("2001:db8:1::2")
	for _, fr := range []nsFrame{
		{target: vip6, sourceLL: clientMAC},
		{target: vip6, dst: vip6, src: global, sourceLL: clientMAC},
		{target: vip6, dst: vip6},
		{target: vip6, src: netip.IPv6Unspecified()},
		{target: vip6, src: netip.IPv6Unspecified(), rawOpts: []byte{14, 1, 1, 2, 3, 4, 5, 6}},
		{target: vip6, sourceLL: clientMAC, hopLimit: 64},
		{target: vip6, sourceLL: clientMAC, code: 1},
		{target: vip6, rawOpts: []byte{14, 0, 0, 0, 0, 0, 0, 0}},
		{target: vip6, sourceLL: clientMAC, truncate: 8},
		{target: vip6, msg: &ndp.NeighborAdvertisement{TargetAddress: vip6}},
	} {
		f.Add(buildNSFrame(f, fr), false)
		f.Add(buildNSFrame(f, fr), true)
	}
	f.Fuzz(func(t *testing.T, frame []byte, fixSum bool) {
		if fixSum {
			// Mutations almost always break the checksum; put a right
			// one in so the fuzzer gets past it to the rules behind it.
			fixChecksum(frame)
		}
		s, reason := parseSolicitation(frame)
		if reason != DropNone {
			if s.target.IsValid() {
				t.Fatalf("dropped (%v) but returned a solicitation", reason)
			}
			return
		}
		// Cross-check the fixed part with mdlayher/ndp, which parses it
		// independently. (Not the options: ndp rejects, for example, a
		// captive portal option that is not valid UTF-8, which an NS
		// must ignore.)
		ip := frame[ethHeaderLen:]
		icmp := ip[ipv6HeaderLen : ipv6HeaderLen+int(binary.BigEndian.Uint16(ip[4:6]))]
		msg, err := ndp.ParseMessage(icmp[:nsLen])
		if err != nil {
			t.Fatalf("accepted a solicitation mdlayher/ndp rejects: %v", err)
		}
		ns, ok := msg.(*ndp.NeighborSolicitation)
		if !ok || ns.TargetAddress != s.target {
			t.Fatalf("accepted %T for %s, ndp sees %+v", msg, s.target, msg)
		}
		switch {
		case ip[7] != 255:
			t.Fatalf("accepted hop limit %d", ip[7])
		case icmp[1] != 0:
			t.Fatalf("accepted code %d", icmp[1])
		case icmpv6Checksum(s.src, s.dst, icmp) != 0:
			t.Fatal("accepted a bad checksum")
		case s.target.IsMulticast():
			t.Fatalf("accepted multicast target %s", s.target)
		case s.dst != s.target && s.dst != solicitedNodeGroup(s.target):
			t.Fatalf("accepted destination %s for target %s", s.dst, s.target)
		case s.isDAD() && (s.sourceLL != nil || !s.dst.IsMulticast()):
			t.Fatalf("accepted DAD probe to %s with source option %v", s.dst, s.sourceLL)
		}
		a := answer(s, ourMAC, ourLL)
		if a.target != s.target || !a.override {
			t.Fatalf("answer %+v to %+v", a, s)
		}
		if s.isDAD() {
			if a.solicited || a.dst != netip.IPv6LinkLocalAllNodes() || !bytes.Equal(a.ethDst, multicastMAC(a.dst)) {
				t.Fatalf("DAD answer %+v", a)
			}
		} else {
			if !a.solicited || a.dst != s.src || a.dst.IsMulticast() || a.dst.IsUnspecified() {
				t.Fatalf("answer %+v to solicitation from %s", a, s.src)
			}
			if a.ethDst[0]&1 != 0 || isZeroMAC(a.ethDst) || !bytes.Equal(a.ethDst, frame[6:12]) {
				t.Fatalf("answer to MAC %v, solicitation from %v", a.ethDst, net.HardwareAddr(frame[6:12]))
			}
		}
		if a.src != ourLL {
			t.Fatalf("answer from %s", a.src)
		}
		if got := parseNAFrame(t, a.marshal()); got.Target != s.target.String() || got.HopLimit != 255 {
			t.Fatalf("marshalled answer %+v", got)
		}
	})
}

// fixChecksum writes the right ICMPv6 checksum into frame, if it is long
// enough to hold one where the IPv6 header says.
func fixChecksum(frame []byte) {
	if len(frame) < ethHeaderLen+ipv6HeaderLen+4 {
		return
	}
	ip := frame[ethHeaderLen:]
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if plen < 4 || ipv6HeaderLen+plen > len(ip) {
		return
	}
	icmp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	icmp[2], icmp[3] = 0, 0
	src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	binary.BigEndian.PutUint16(icmp[2:4], icmpv6Checksum(src, dst, icmp))
}
