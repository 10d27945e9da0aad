package l2

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// The wire format of the neighbor solicitations the NDP responder reads
// and of the solicited advertisements it writes, both whole Ethernet
// frames on the AF_PACKET socket.
//
// Threat model: anybody on the link can send the responder any frame, with
// any source MAC, source IP and options; nothing on the wire is
// authenticated (SEND, RFC 3971, is supported neither here nor by Linux).
// What a sender can obtain is bounded by what the responder answers:
//   - only for a target the Announcer owns on the interface the frame came
//     in on (ownerFunc); the answer is our MAC for it, which is true;
//   - one advertisement per valid solicitation, of the same size: no
//     amplification;
//   - the advertisement stays on the link: it is a frame to the MAC the
//     solicitation came from, never routed by our kernel, so a forged
//     off-link source address cannot make us send anything to a router;
//     not to the MAC the source link-layer address option names, so the
//     option cannot aim the answer at a third host (a router that would
//     forward it to the forged destination). Its source is our link-local
//     address, which no router forwards (RFC 4291 section 2.5.6) even if
//     one received it;
//   - a solicitation with a multicast or zero MAC (frame source or option)
//     or a multicast or loopback source address is dropped, so a solicited
//     (S=1) advertisement is never multicast; a duplicate address detection probe (source ::) is
//     answered to ff02::1, as RFC 4861 requires, never to ::.
//
// parseSolicitation runs on every such frame, so it must never panic and
// must bound its work by the frame's length (FuzzParseSolicitation).

// The header sizes and protocol numbers the responder uses.
const (
	ethHeaderLen  = 14
	ipv6HeaderLen = 40
	icmpv6Proto   = 58
	icmpv6TypeNS  = 135
	icmpv6TypeNA  = 136
	// nsLen is the smallest valid solicitation: ICMPv6 type, code and
	// checksum, 4 reserved bytes, the target (RFC 4861 section 7.1.1:
	// "ICMP length (derived from the IP length) is 24 or more octets").
	nsLen = 24
	// ndpHopLimit is the hop limit of every NDP message; a receiver that
	// sees another value knows a router forwarded it.
	ndpHopLimit = 255

	optSourceLL = 1
	optTargetLL = 2
)

var etherTypeIPv6 = [2]byte{0x86, 0xdd}

// solicitation is a neighbor solicitation that passed the checks of RFC
// 4861 section 7.1.1, with what the responder needs to answer it.
type solicitation struct {
	ethSrc, ethDst net.HardwareAddr
	src, dst       netip.Addr
	target         netip.Addr
	// sourceLL is the source link-layer address option, nil if absent.
	sourceLL net.HardwareAddr
}

// isDAD reports whether s is a duplicate address detection probe.
func (s solicitation) isDAD() bool { return s.src.IsUnspecified() }

// parseSolicitation decodes an Ethernet frame carrying an IPv6 neighbor
// solicitation and validates it as RFC 4861 section 7.1.1 says (hop limit
// 255, correct checksum, code 0, length, target not multicast, options of
// non-zero length, a probe from :: only to a solicited-node group and
// without a source link-layer address option), plus what answering needs:
// the destination is the target or its solicited-node group (section 4.3),
// and the solicitor has unicast source and link-layer addresses (frame
// source and option). It returns DropNone and the solicitation, or why the
// frame is dropped.
func parseSolicitation(frame []byte) (solicitation, DropReason) {
	if len(frame) < ethHeaderLen+ipv6HeaderLen || [2]byte(frame[12:14]) != etherTypeIPv6 {
		return solicitation{}, DropMalformed
	}
	s := solicitation{
		ethDst: net.HardwareAddr(frame[0:6]),
		ethSrc: net.HardwareAddr(frame[6:12]),
	}
	ip := frame[ethHeaderLen:]
	if ip[0]>>4 != 6 {
		return solicitation{}, DropMalformed
	}
	if ip[6] != icmpv6Proto {
		// Extension headers included: NDP messages carry none.
		return solicitation{}, DropNotRequest
	}
	// The frame may be longer than the packet (Ethernet padding), never
	// shorter.
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if ipv6HeaderLen+plen > len(ip) || plen < 4 {
		return solicitation{}, DropMalformed
	}
	hopLimit := ip[7]
	s.src = netip.AddrFrom16([16]byte(ip[8:24]))
	s.dst = netip.AddrFrom16([16]byte(ip[24:40]))
	icmp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if icmp[0] != icmpv6TypeNS {
		return solicitation{}, DropNotRequest
	}
	// Nobody checked the checksum yet: the packet socket sees frames
	// before the IP stack does.
	if icmpv6Checksum(s.src, s.dst, icmp) != 0 {
		return solicitation{}, DropMalformed
	}
	if hopLimit != ndpHopLimit {
		return solicitation{}, DropHopLimit
	}
	if icmp[1] != 0 {
		return solicitation{}, DropBadCode
	}
	if len(icmp) < nsLen {
		return solicitation{}, DropMalformed
	}
	s.target = netip.AddrFrom16([16]byte(icmp[8:24]))
	if s.target.IsMulticast() {
		return solicitation{}, DropMulticastTarget
	}
	var ok bool
	if s.sourceLL, ok = parseNSOptions(icmp[nsLen:]); !ok {
		return solicitation{}, DropBadOption
	}
	if s.src.IsMulticast() || s.src.IsLoopback() {
		return solicitation{}, DropBadSource
	}
	group := solicitedNodeGroup(s.target)
	if s.isDAD() {
		if !isSolicitedNodeGroup(s.dst) || s.sourceLL != nil {
			return solicitation{}, DropBadDAD
		}
	}
	if s.dst != s.target && s.dst != group {
		return solicitation{}, DropOtherDestination
	}
	for _, mac := range []net.HardwareAddr{s.ethSrc, s.sourceLL} {
		if mac != nil && (mac[0]&1 != 0 || isZeroMAC(mac)) {
			return solicitation{}, DropBadSource
		}
	}
	return s, DropNone
}

// parseNSOptions walks the options of a solicitation. It returns the first
// source link-layer address option (later ones are ignored, as Linux does),
// or false if an option has length 0 (RFC 4861 section 7.1.1), runs past
// the message, or is a source link-layer address not 6 bytes long (the
// option's length for Ethernet, RFC 2464 section 8). Other options are
// skipped (section 4.6: unrecognized options are ignored).
func parseNSOptions(b []byte) (net.HardwareAddr, bool) {
	var sourceLL net.HardwareAddr
	for len(b) > 0 {
		if len(b) < 2 || b[1] == 0 {
			return nil, false
		}
		n := int(b[1]) * 8
		if n > len(b) {
			return nil, false
		}
		if b[0] == optSourceLL {
			if n != 8 {
				return nil, false
			}
			if sourceLL == nil {
				sourceLL = net.HardwareAddr(b[2:8])
			}
		}
		b = b[n:]
	}
	return sourceLL, true
}

// solicitedNodeGroup is ip's solicited-node multicast address,
// ff02::1:ffXX:XXXX with the low 24 bits of ip (RFC 4291 section 2.7.1).
func solicitedNodeGroup(ip netip.Addr) netip.Addr {
	a := ip.As16()
	return netip.AddrFrom16([16]byte{0: 0xff, 1: 0x02, 11: 0x01, 12: 0xff, 13: a[13], 14: a[14], 15: a[15]})
}

// isSolicitedNodeGroup reports whether ip is some solicited-node multicast
// address.
func isSolicitedNodeGroup(ip netip.Addr) bool {
	return ip.Is6() && solicitedNodeGroup(ip) == ip
}

func isZeroMAC(mac net.HardwareAddr) bool {
	for _, b := range mac {
		if b != 0 {
			return false
		}
	}
	return true
}

// multicastMAC is the Ethernet address of IPv6 multicast group ip:
// 33:33 and the group's low 32 bits (RFC 2464 section 7).
func multicastMAC(ip netip.Addr) net.HardwareAddr {
	a := ip.As16()
	return net.HardwareAddr{0x33, 0x33, a[12], a[13], a[14], a[15]}
}

// advertisement is a neighbor advertisement the responder sends for one of
// its VIPs.
type advertisement struct {
	ethSrc, ethDst net.HardwareAddr
	src, dst       netip.Addr
	target         netip.Addr
	solicited      bool
	// override is the O flag: set for an address we own, clear for an
	// anycast address or one we answer for as a proxy (RFC 4861 section
	// 7.2.4).
	override bool
}

// answer is the advertisement that answers s for its target, with our MAC
// and from our link-local address ll:
//   - a duplicate address detection probe (source ::) gets an advertisement
//     to all nodes, ff02::1, with Solicited clear: there is nobody to
//     unicast to (RFC 4861 section 7.2.4);
//   - any other solicitation, multicast (address resolution) or unicast
//     (unreachability detection), gets one unicast to its source, with
//     Solicited set, in a frame to the MAC the solicitation came from.
//     RFC 4861 finds that MAC through the neighbor cache, which the source
//     link-layer address option fills; for a host that follows it the two
//     are the same, behind a bridge that rewrites source MACs only the
//     frame's source works, and only it is sure to be the solicitor.
//
// Override is set: a VIP has one owner (the speaker elects it), so a
// receiver must replace the MAC it cached, the previous owner's. Anycast
// addresses and proxied ones would clear it (section 7.2.4); a VIP is
// neither. The target link-layer address option is always included.
func answer(s solicitation, ourMAC net.HardwareAddr, ll netip.Addr) advertisement {
	a := advertisement{
		ethSrc:   ourMAC,
		src:      ll,
		target:   s.target,
		override: true,
	}
	if s.isDAD() {
		a.dst = netip.IPv6LinkLocalAllNodes()
		a.ethDst = multicastMAC(a.dst)
		return a
	}
	a.dst, a.ethDst, a.solicited = s.src, s.ethSrc, true
	return a
}

// naLen is the length of our advertisements' ICMPv6 message: header,
// flags, target, and the 8-byte target link-layer address option.
const naLen = 4 + 4 + 16 + 8

// marshal returns a as an Ethernet frame: hop limit 255, ICMPv6 checksum
// computed, the target link-layer address option carrying ethSrc.
func (a advertisement) marshal() []byte {
	b := make([]byte, ethHeaderLen+ipv6HeaderLen+naLen)
	copy(b[0:6], a.ethDst)
	copy(b[6:12], a.ethSrc)
	copy(b[12:14], etherTypeIPv6[:])

	ip := b[ethHeaderLen:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], naLen)
	ip[6], ip[7] = icmpv6Proto, ndpHopLimit
	src, dst, target := a.src.As16(), a.dst.As16(), a.target.As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])

	icmp := ip[ipv6HeaderLen:]
	icmp[0] = icmpv6TypeNA
	if a.solicited {
		icmp[4] |= 0x40
	}
	if a.override {
		icmp[4] |= 0x20
	}
	copy(icmp[8:24], target[:])
	icmp[24], icmp[25] = optTargetLL, 1
	copy(icmp[26:32], a.ethSrc)
	binary.BigEndian.PutUint16(icmp[2:4], icmpv6Checksum(a.src, a.dst, icmp))
	return b
}

// icmpv6Checksum is the Internet checksum over the IPv6 pseudo-header and
// msg (RFC 4443 section 2.3). It is 0 for a message whose checksum field
// is correct, and the value to put in a message whose checksum field is 0.
func icmpv6Checksum(src, dst netip.Addr, msg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	sum += uint32(len(msg)) + icmpv6Proto
	add(msg)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
