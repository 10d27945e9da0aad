package l2

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
)

// ndpConn is the part of *ndp.Conn the NDP responder uses to send and to
// manage multicast membership. It is a seam for unit tests: ndp.Conn cannot
// be built on a fake socket.
type ndpConn interface {
	WriteTo(m ndp.Message, cm *ipv6.ControlMessage, dst netip.Addr) error
	JoinGroup(group netip.Addr) error
	LeaveGroup(group netip.Addr) error
	Close() error
}

// ndpSockets are the two sockets of one NDP responder.
//
// Solicitations are read from an AF_PACKET socket, not from the ICMPv6
// socket: the kernel delivers an ICMPv6 message to raw sockets only if its
// destination is local, and a VIP is not an interface address. Multicast
// solicitations (address resolution) would still arrive, but unicast ones
// (neighbor unreachability detection probes, sent to the VIP itself once a
// cache entry goes stale) would not, and every client would drop the entry
// and lose traffic for a few seconds each reachable-time cycle (the bug
// reported against MetalLB as metallb/metallb#2920).
type ndpSockets struct {
	in  net.PacketConn // every neighbor solicitation frame on the link
	out ndpConn        // sends advertisements; holds group memberships
}

// nsFilter passes only IPv6 frames carrying ICMPv6 (next header 58, no
// extension headers, as RFC 4861 messages have) of type 135, neighbor
// solicitation, so the socket does not copy every IPv6 frame to us.
var nsFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},                                 // EtherType
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x86dd, SkipTrue: 5},       // IPv6?
	bpf.LoadAbsolute{Off: ethHeaderLen + 6, Size: 1},                   // next header
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: icmpv6Proto, SkipTrue: 3},  // ICMPv6?
	bpf.LoadAbsolute{Off: ethHeaderLen + ipv6HeaderLen, Size: 1},       // ICMPv6 type
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: icmpv6TypeNS, SkipTrue: 1}, // NS?
	bpf.RetConstant{Val: 1 << 16},                                      // accept
	bpf.RetConstant{Val: 0},                                            // drop
})

const (
	ethHeaderLen  = 14
	ipv6HeaderLen = 40
	icmpv6Proto   = 58
	icmpv6TypeNS  = 135
)

func mustAssemble(prog []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(fmt.Sprintf("assembling BPF filter: %v", err))
	}
	return raw
}

// listenNDP opens the NDP sockets on ifi. The sending socket is bound to
// the interface's link-local address, the source RFC 4861 expects for
// advertisements. Both need CAP_NET_RAW, and ndp.Listen fails while the
// link-local address is still tentative (duplicate address detection takes
// about a second after link up); the next SetOwned retries.
func listenNDP(ifi *net.Interface) (ndpSockets, error) {
	out, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return ndpSockets{}, fmt.Errorf("opening ICMPv6 socket on %s: %w", ifi.Name, err)
	}
	// We never read from this socket: block every type so its receive
	// queue stays empty.
	var f ipv6.ICMPFilter
	f.SetAll(true)
	if err := out.SetICMPFilter(&f); err != nil {
		out.Close()
		return ndpSockets{}, fmt.Errorf("filtering ICMPv6 socket on %s: %w", ifi.Name, err)
	}
	in, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeIPv6), &packet.Config{Filter: nsFilter})
	if err != nil {
		out.Close()
		return ndpSockets{}, fmt.Errorf("opening NDP packet socket on %s: %w", ifi.Name, err)
	}
	return ndpSockets{in: in, out: out}, nil
}

// ndpResponder answers neighbor solicitations for owned IPv6 VIPs on one
// interface and sends unsolicited neighbor advertisements.
type ndpResponder struct {
	ifi    *net.Interface
	socks  ndpSockets
	owner  ownerFunc
	m      *metrics
	log    hclog.Logger
	closed chan struct{}
	done   chan struct{}

	// targets are the VIPs we joined the solicited-node group for, and
	// groups counts the targets behind each group: VIPs that share their
	// last 24 bits share a group. Only the Announcer's reconcile touches
	// them, under the Announcer lock.
	targets map[netip.Addr]struct{}
	groups  map[netip.Addr]int
}

// newNDPResponder wraps socks and starts its read loop.
func newNDPResponder(logger hclog.Logger, ifi *net.Interface, socks ndpSockets, owner ownerFunc, m *metrics) *ndpResponder {
	r := &ndpResponder{
		ifi:     ifi,
		socks:   socks,
		owner:   owner,
		m:       m,
		log:     logger.With("interface", ifi.Name, "family", familyIPv6),
		closed:  make(chan struct{}),
		done:    make(chan struct{}),
		targets: map[netip.Addr]struct{}{},
		groups:  map[netip.Addr]int{},
	}
	go r.run()
	return r
}

func (r *ndpResponder) iface() *net.Interface { return r.ifi }

func (r *ndpResponder) close() error {
	close(r.closed)
	errIn := r.socks.in.Close()
	<-r.done
	// Closing the ICMPv6 socket also drops its group memberships.
	errOut := r.socks.out.Close()
	if err := errors.Join(errIn, errOut); err != nil {
		return fmt.Errorf("closing NDP sockets on %s: %w", r.ifi.Name, err)
	}
	return nil
}

// join makes the interface receive solicitations for ip: they are sent to
// ip's solicited-node multicast group, which the NIC filters out unless
// someone joined it. The kernel has not joined it for us because ip is
// not an interface address. join is idempotent per ip.
func (r *ndpResponder) join(ip netip.Addr) error {
	if _, ok := r.targets[ip]; ok {
		return nil
	}
	group, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return fmt.Errorf("solicited-node group of %s: %w", ip, err)
	}
	if r.groups[group] == 0 {
		if err := r.socks.out.JoinGroup(group); err != nil {
			return fmt.Errorf("joining %s for %s on %s: %w", group, ip, r.ifi.Name, err)
		}
	}
	r.groups[group]++
	r.targets[ip] = struct{}{}
	return nil
}

// leave undoes join.
func (r *ndpResponder) leave(ip netip.Addr) error {
	if _, ok := r.targets[ip]; !ok {
		return nil
	}
	delete(r.targets, ip)
	group, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return fmt.Errorf("solicited-node group of %s: %w", ip, err)
	}
	switch r.groups[group] {
	case 0:
		return nil
	case 1:
		delete(r.groups, group)
		if err := r.socks.out.LeaveGroup(group); err != nil {
			return fmt.Errorf("leaving %s for %s on %s: %w", group, ip, r.ifi.Name, err)
		}
	default:
		r.groups[group]--
	}
	return nil
}

func (r *ndpResponder) run() {
	defer close(r.done)
	buf := make([]byte, max(r.ifi.MTU, 1500)+ethHeaderLen)
	limiter := errorLimiter{interval: 10 * time.Second}
	for {
		n, _, err := r.socks.in.ReadFrom(buf)
		if err != nil {
			select {
			case <-r.closed:
				return
			default:
			}
			limiter.log(r.log, "reading NDP socket", "err", err)
			time.Sleep(readErrorPause)
			continue
		}
		countOutcome(r.m, r.ifi.Name, familyIPv6, r.handle(buf[:n]))
	}
}

// handle decides about one received frame and sends the solicited
// advertisement if it asks for an owned VIP on this interface.
func (r *ndpResponder) handle(frame []byte) DropReason {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil || f.EtherType != ethernet.EtherTypeIPv6 {
		return DropMalformed
	}
	// The packet socket also sees what this host sends, including our own
	// kernel soliciting a VIP: it must not learn our own MAC for it.
	if bytes.Equal(f.Source, r.ifi.HardwareAddr) {
		return DropOwnFrame
	}
	p, ok := parseICMPv6(f.Payload)
	if !ok {
		return DropMalformed
	}
	msg, err := ndp.ParseMessage(p.icmp)
	if err != nil {
		return DropMalformed
	}
	ns, ok := msg.(*ndp.NeighborSolicitation)
	if !ok {
		return DropNotRequest
	}
	// A hop limit of 255 proves the solicitation was not forwarded by a
	// router (RFC 4861 section 7.1.1).
	if p.hopLimit != ndp.HopLimit {
		return DropMalformed
	}
	var sourceLL net.HardwareAddr
	for _, o := range ns.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Source {
			sourceLL = lla.Addr
		}
	}
	if p.src.IsUnspecified() && sourceLL != nil {
		// RFC 4861 section 7.1.1: a DAD probe carries no source address.
		return DropMalformed
	}
	if bytes.Equal(sourceLL, r.ifi.HardwareAddr) {
		return DropOwnFrame
	}
	// Multicast frames (to the solicited-node group) are for everybody;
	// unicast ones only for us.
	if f.Destination[0]&1 == 0 && !bytes.Equal(f.Destination, r.ifi.HardwareAddr) {
		return DropOtherDestination
	}
	if reason := r.owner(ns.TargetAddress, r.ifi.Name); reason != DropNone {
		return reason
	}

	// Answer the solicitor directly. A duplicate address detection probe
	// (unspecified source) has nobody to answer to, so it gets an
	// unsolicited advertisement to all nodes, which defends the VIP
	// (RFC 4861 section 7.2.4).
	dst, solicited := p.src, true
	if p.src.IsUnspecified() {
		dst, solicited = netip.IPv6LinkLocalAllNodes(), false
	}
	if err := r.advertise(dst, ns.TargetAddress, solicited); err != nil {
		r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
		r.log.Error("sending neighbor advertisement", "ip", ns.TargetAddress, "to", dst, "err", err)
		return DropNone
	}
	r.m.replies.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
	r.log.Debug("answered neighbor solicitation", "ip", ns.TargetAddress, "from", p.src, "mac", sourceLL.String())
	return DropNone
}

// icmpv6Packet is the part of an IPv6 packet carrying ICMPv6 that the
// responder needs.
type icmpv6Packet struct {
	src, dst netip.Addr
	hopLimit uint8
	icmp     []byte
}

// parseICMPv6 checks that b is an IPv6 packet carrying one ICMPv6 message
// with a correct checksum (nobody checked it yet: the packet socket sees
// frames before the IP stack does) and returns its parts.
func parseICMPv6(b []byte) (icmpv6Packet, bool) {
	if len(b) < ipv6HeaderLen || b[0]>>4 != 6 || b[6] != icmpv6Proto {
		return icmpv6Packet{}, false
	}
	plen := int(binary.BigEndian.Uint16(b[4:6]))
	if ipv6HeaderLen+plen > len(b) || plen < 4 {
		return icmpv6Packet{}, false
	}
	p := icmpv6Packet{
		src:      netip.AddrFrom16([16]byte(b[8:24])),
		dst:      netip.AddrFrom16([16]byte(b[24:40])),
		hopLimit: b[7],
		icmp:     b[ipv6HeaderLen : ipv6HeaderLen+plen],
	}
	if icmpv6Checksum(p.src, p.dst, p.icmp) != 0 {
		return icmpv6Packet{}, false
	}
	return p, true
}

// icmpv6Checksum is the Internet checksum over the IPv6 pseudo-header and
// msg (RFC 4443 section 2.3). It is 0 for a message whose checksum field
// is correct.
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

// gratuitous sends an unsolicited neighbor advertisement for ip to all
// nodes. Override tells receivers to replace a cached link-layer address
// (the previous owner's MAC) instead of only marking the entry stale.
func (r *ndpResponder) gratuitous(ip netip.Addr) error {
	if err := r.advertise(netip.IPv6LinkLocalAllNodes(), ip, false); err != nil {
		r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
		return fmt.Errorf("sending unsolicited neighbor advertisement for %s on %s: %w", ip, r.ifi.Name, err)
	}
	r.m.gratuitous.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
	return nil
}

// advertise sends a neighbor advertisement for target with our MAC. The
// Override flag is always set: we own the VIP, so a receiver must replace
// whatever MAC it cached for it, solicited or not (RFC 4861 section 7.2.4;
// only proxies and anycast leave it clear).
func (r *ndpResponder) advertise(dst, target netip.Addr, solicited bool) error {
	na := &ndp.NeighborAdvertisement{
		Solicited:     solicited,
		Override:      true,
		TargetAddress: target,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      r.ifi.HardwareAddr,
		}},
	}
	return r.socks.out.WriteTo(na, nil, dst)
}
