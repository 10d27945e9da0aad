package l2

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
)

// arpResponder answers ARP requests for owned IPv4 VIPs on one interface and
// sends gratuitous ARP.
//
// It speaks Ethernet frames on a plain net.PacketConn (an AF_PACKET socket
// in production, a fake in unit tests) and uses mdlayher/arp only for the
// ARP wire format. arp.Client is not used because it insists on an IPv4
// address on the interface (it needs one only to send requests of its own)
// and its Read returns parse errors and socket errors alike, which would
// hide the DropMalformed outcome.
type arpResponder struct {
	ifi    *net.Interface
	conn   net.PacketConn
	owner  ownerFunc
	m      *metrics
	log    hclog.Logger
	closed chan struct{}
	done   chan struct{}

	// conflicts rate-limits the conflict warning; only run uses it.
	conflicts errorLimiter
}

// listenARP opens the AF_PACKET socket for ARP on ifi. It needs
// CAP_NET_RAW. The socket stays in the network namespace of the calling
// thread.
func listenARP(ifi *net.Interface) (net.PacketConn, error) {
	c, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
	if err != nil {
		return nil, fmt.Errorf("opening ARP socket on %s: %w", ifi.Name, err)
	}
	return c, nil
}

// newARPResponder wraps conn and starts its read loop.
func newARPResponder(logger hclog.Logger, ifi *net.Interface, conn net.PacketConn, owner ownerFunc, m *metrics) *arpResponder {
	r := &arpResponder{
		ifi:       ifi,
		conn:      conn,
		owner:     owner,
		m:         m,
		log:       logger.With("interface", ifi.Name, "family", familyIPv4),
		closed:    make(chan struct{}),
		done:      make(chan struct{}),
		conflicts: errorLimiter{interval: 10 * time.Second},
	}
	go r.run()
	return r
}

func (r *arpResponder) iface() *net.Interface { return r.ifi }

func (r *arpResponder) close() error {
	close(r.closed)
	err := r.conn.Close()
	<-r.done
	if err != nil {
		return fmt.Errorf("closing ARP socket on %s: %w", r.ifi.Name, err)
	}
	return nil
}

func (r *arpResponder) run() {
	defer close(r.done)
	// 128 bytes hold any Ethernet ARP frame; longer frames are not ARP for
	// IPv4 over Ethernet and parse as malformed anyway.
	buf := make([]byte, 128)
	limiter := errorLimiter{interval: 10 * time.Second}
	for {
		n, _, err := r.conn.ReadFrom(buf)
		if err != nil {
			select {
			case <-r.closed:
				return
			default:
			}
			limiter.log(r.log, "reading ARP socket", "err", err)
			time.Sleep(readErrorPause)
			continue
		}
		countOutcome(r.m, r.ifi.Name, familyIPv4, r.handle(buf[:n]))
	}
}

// handle decides about one received frame and sends the reply if the
// request is for an owned VIP on this interface.
func (r *arpResponder) handle(frame []byte) DropReason {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil || f.EtherType != ethernet.EtherTypeARP {
		return DropMalformed
	}
	var req arp.Packet
	if err := req.UnmarshalBinary(f.Payload); err != nil {
		return DropMalformed
	}
	// An AF_PACKET socket also sees frames this host sends, for example the
	// kernel's own ARP requests.
	if bytes.Equal(f.Source, r.ifi.HardwareAddr) {
		return DropOwnFrame
	}
	if req.Operation != arp.OperationRequest {
		return DropNotRequest
	}
	if !bytes.Equal(f.Destination, ethernet.Broadcast) && !bytes.Equal(f.Destination, r.ifi.HardwareAddr) {
		return DropOtherDestination
	}
	if req.SenderIP == req.TargetIP {
		if r.owner(req.TargetIP, r.ifi.Name) == DropNone {
			// Another host claims one of our VIPs: two speakers disagree
			// about ownership. We keep answering; the log says why
			// clients may flap.
			r.conflicts.log(r.log, "another host announces an owned VIP", "ip", req.TargetIP, "mac", req.SenderHardwareAddr.String())
		}
		return DropAnnouncement
	}
	if reason := r.owner(req.TargetIP, r.ifi.Name); reason != DropNone {
		return reason
	}

	reply, err := arp.NewPacket(arp.OperationReply, r.ifi.HardwareAddr, req.TargetIP, req.SenderHardwareAddr, req.SenderIP)
	if err == nil {
		err = r.write(reply, req.SenderHardwareAddr)
	}
	if err != nil {
		r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv4).Inc()
		r.log.Error("sending ARP reply", "ip", req.TargetIP, "to", req.SenderIP, "err", err)
		return DropNone
	}
	r.m.replies.WithLabelValues(r.ifi.Name, familyIPv4).Inc()
	r.log.Debug("answered ARP request", "ip", req.TargetIP, "from", req.SenderIP, "mac", req.SenderHardwareAddr.String())
	return DropNone
}

// gratuitous broadcasts a gratuitous ARP request and reply for ip, both with
// sender = target = ip. Some stacks only update their caches from one of
// the two, so we send both (as arping -U / -A and MetalLB do). The reply
// carries our MAC as target hardware address because Linux treats a reply
// as gratuitous only then (arp_is_garp), which lets it override an entry
// updated less than locktime ago.
func (r *arpResponder) gratuitous(ip netip.Addr) error {
	mac := r.ifi.HardwareAddr
	for _, p := range []struct {
		op  arp.Operation
		tha net.HardwareAddr
	}{
		{arp.OperationRequest, ethernet.Broadcast},
		{arp.OperationReply, mac},
	} {
		pkt, err := arp.NewPacket(p.op, mac, ip, p.tha, ip)
		if err != nil {
			return fmt.Errorf("building gratuitous ARP %s for %s: %w", p.op, ip, err)
		}
		if err := r.write(pkt, ethernet.Broadcast); err != nil {
			r.m.sendErrors.WithLabelValues(r.ifi.Name, familyIPv4).Inc()
			return fmt.Errorf("sending gratuitous ARP %s for %s on %s: %w", p.op, ip, r.ifi.Name, err)
		}
		r.m.gratuitous.WithLabelValues(r.ifi.Name, familyIPv4).Inc()
	}
	return nil
}

// write frames p for Ethernet and sends it to dst.
func (r *arpResponder) write(p *arp.Packet, dst net.HardwareAddr) error {
	payload, err := p.MarshalBinary()
	if err != nil {
		return fmt.Errorf("marshaling ARP packet: %w", err)
	}
	f := ethernet.Frame{
		Destination: dst,
		Source:      r.ifi.HardwareAddr,
		EtherType:   ethernet.EtherTypeARP,
		Payload:     payload,
	}
	b, err := f.MarshalBinary()
	if err != nil {
		return fmt.Errorf("marshaling Ethernet frame: %w", err)
	}
	if _, err := r.conn.WriteTo(b, &packet.Addr{HardwareAddr: dst}); err != nil {
		return err
	}
	return nil
}
