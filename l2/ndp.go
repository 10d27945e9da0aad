package l2

import (
	"bytes"
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
//
// The answers go out on the same AF_PACKET socket, as frames to the
// solicitor's MAC, not through the kernel's ICMPv6 socket: the kernel would
// route them by the solicitor's source address, and a router probing from
// a global address in a prefix this host has no route for (a VIP routed
// on-link from a prefix no node address is in) would get no answer at all,
// or an answer through the default gateway; and a forged off-link source
// would make us send beyond the link.
type ndpSockets struct {
	frames net.PacketConn // every neighbor solicitation frame on the link; the answers
	icmp   ndpConn        // unsolicited advertisements; holds group memberships
	// linkLocal is the interface's link-local address, the source of
	// every advertisement.
	linkLocal netip.Addr
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

func mustAssemble(prog []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(fmt.Sprintf("assembling BPF filter: %v", err))
	}
	return raw
}

// listenNDP opens the NDP sockets on ifi. The ICMPv6 socket is bound to
// the interface's link-local address, the source of the unsolicited
// advertisements. Both need CAP_NET_RAW, and ndp.Listen fails while the
// link-local address is still tentative (duplicate address detection takes
// about a second after link up); the next SetOwned retries.
func listenNDP(ifi *net.Interface) (ndpSockets, error) {
	out, ll, err := ndp.Listen(ifi, ndp.LinkLocal)
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
	frames, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeIPv6), &packet.Config{Filter: nsFilter})
	if err != nil {
		out.Close()
		return ndpSockets{}, fmt.Errorf("opening NDP packet socket on %s: %w", ifi.Name, err)
	}
	return ndpSockets{frames: frames, icmp: out, linkLocal: ll.WithZone("")}, nil
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
	errIn := r.socks.frames.Close()
	<-r.done
	// Closing the ICMPv6 socket also drops its group memberships.
	errOut := r.socks.icmp.Close()
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
		if err := r.socks.icmp.JoinGroup(group); err != nil {
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
		if err := r.socks.icmp.LeaveGroup(group); err != nil {
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
		n, _, err := r.socks.frames.ReadFrom(buf)
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
	// The packet socket also sees what this host sends, including our own
	// kernel soliciting a VIP: it must not learn our own MAC for it.
	if len(frame) >= ethHeaderLen && bytes.Equal(frame[6:12], r.ifi.HardwareAddr) {
		return DropOwnFrame
	}
	ns, reason := parseSolicitation(frame)
	if reason != DropNone {
		return reason
	}
	if bytes.Equal(ns.sourceLL, r.ifi.HardwareAddr) {
		return DropOwnFrame
	}
	// Multicast frames (to the solicited-node group) are for everybody;
	// unicast ones only for us.
	if ns.ethDst[0]&1 == 0 && !bytes.Equal(ns.ethDst, r.ifi.HardwareAddr) {
		return DropOtherDestination
	}
	if reason := r.owner(ns.target, r.ifi.Name); reason != DropNone {
		return reason
	}
	na := answer(ns, r.ifi.HardwareAddr, r.socks.linkLocal)
	if _, err := r.socks.frames.WriteTo(na.marshal(), &packet.Addr{HardwareAddr: na.ethDst}); err != nil {
		r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
		r.log.Error("sending neighbor advertisement", "ip", ns.target, "to", na.dst, "mac", na.ethDst.String(), "err", err)
		return DropNone
	}
	r.m.replies.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
	r.log.Debug("answered neighbor solicitation", "ip", ns.target, "from", ns.src, "mac", na.ethDst.String(), "to", na.dst)
	return DropNone
}

// gratuitous sends an unsolicited neighbor advertisement for ip to all
// nodes, from the interface's link-local address through the ICMPv6
// socket (a multicast destination needs no route). Override tells
// receivers to replace a cached link-layer address (the previous owner's
// MAC) instead of only marking the entry stale; Solicited is clear, as in
// every advertisement to a multicast address (RFC 4861 section 7.2.6).
func (r *ndpResponder) gratuitous(ip netip.Addr) error {
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: ip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      r.ifi.HardwareAddr,
		}},
	}
	if err := r.socks.icmp.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
		r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
		return fmt.Errorf("sending unsolicited neighbor advertisement for %s on %s: %w", ip, r.ifi.Name, err)
	}
	r.m.gratuitous.WithLabelValues(r.ifi.Name, familyIPv6).Inc()
	return nil
}
