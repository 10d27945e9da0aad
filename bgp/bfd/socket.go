package bfd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The UDP ports of RFC 5881 section 4 and RFC 5883 section 3.
const (
	SingleHopPort = 3784
	MultihopPort  = 4784
	// Our packets leave from one source port per session in 49152-65535 (RFC 5881 section 4).
	minSourcePort = 49152
	numSourcePort = 65536 - minSourcePort
	// ttl is what every packet is sent with, and what a single-hop packet must arrive with
	// (RFC 5881 section 5, the Generalized TTL Security Mechanism of RFC 5082).
	ttl = 255
	// readBuffer holds any Control packet (the Length field is one byte); a larger datagram is
	// reported truncated by the kernel and dropped.
	readBuffer = 512
	// oobBuffer holds the control messages a listening socket gets: the TTL (hop limit) and the
	// receive timestamp.
	oobBuffer = 128
	// maxQueueAge bounds how long before it was read a datagram can be taken to have arrived:
	// the kernel stamps it with the wall clock, which can be stepped between arrival and read;
	// an older timestamp (or one from the future) is not believed.
	maxQueueAge = 2 * time.Second
	// maxClockStep is how far the wall clock may move against the monotonic one between two
	// reads of a socket before the timestamps of the second read are not believed: they may be
	// on either side of a step (both clocks are slewed alike, so only a step moves them apart).
	maxClockStep = time.Millisecond
)

// control returns a ListenConfig.Control that sets socket options before bind.
func control(set func(fd int) error) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = set(int(fd)) }); err != nil {
			return err
		}
		return serr
	}
}

// listen opens the receiving socket of one family and port: wildcard address, and the kernel
// reports each datagram's TTL (IP_RECVTTL) or hop limit (IPV6_RECVHOPLIMIT), and when it arrived
// (SO_TIMESTAMPNS), so that the detection time runs from the arrival of a packet even when we
// read it late. The timestamps are best effort: noStamps says why the socket has none (its
// datagrams are then dated by their read).
func listen(v6 bool, port int) (conn *net.UDPConn, noStamps, err error) {
	network, addr := "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port))
	recvTTL := func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTTL, 1) }
	if v6 {
		network, addr = "udp6", netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port))
		recvTTL = func(fd int) error {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return err
			}
			return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
		}
	}
	set := func(fd int) error {
		if err := recvTTL(fd); err != nil {
			return err
		}
		noStamps = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		return nil
	}
	lc := net.ListenConfig{Control: control(set)}
	pc, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, nil, err
	}
	return pc.(*net.UDPConn), noStamps, nil
}

// dial opens a session's sending socket: a random source port in 49152-65535, bound to local
// when it is set, TTL (hop limit) 255. It is never read; its receive buffer is the smallest the
// kernel allows, so nothing sent to it can pile up.
func dial(peer, local netip.Addr) (*net.UDPConn, error) {
	network := "udp4"
	if peer.Is6() {
		network = "udp6"
	}
	if !local.IsValid() {
		local = netip.IPv4Unspecified()
		if peer.Is6() {
			local = netip.IPv6Unspecified()
		}
	}
	set := func(fd int) error {
		var err error
		if peer.Is6() {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, ttl)
		} else {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, ttl)
		}
		if err != nil {
			return err
		}
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1)
	}
	lc := net.ListenConfig{Control: control(set)}
	var lastErr error
	for range 32 {
		port := minSourcePort + rand.IntN(numSourcePort)
		pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(local, uint16(port)).String())
		if err == nil {
			return pc.(*net.UDPConn), nil
		}
		lastErr = err
		if !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("opening a UDP socket from %s: %w", local, lastErr)
}

// hopLimit finds the TTL or hop limit in a datagram's control messages.
func hopLimit(oob []byte) (int, bool) {
	for len(oob) > 0 {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0, false
		}
		if (h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL || h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT) && len(data) >= 4 {
			return int(int32(binary.NativeEndian.Uint32(data))), true
		}
		oob = rest
	}
	return 0, false
}

// arrival is when a datagram read at now arrived, on now's (monotonic) clock: now less the age the
// kernel's receive timestamp (SCM_TIMESTAMPNS, wall clock) gives it. Without a timestamp, or with
// an age below zero or above maxQueueAge (the wall clock was stepped), it is now.
func arrival(oob []byte, now time.Time) time.Time {
	for len(oob) > 0 {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			break
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS {
			var sec, nsec int64
			switch len(data) {
			case 16: // struct timespec with 64-bit fields
				sec, nsec = int64(binary.NativeEndian.Uint64(data)), int64(binary.NativeEndian.Uint64(data[8:]))
			case 8:
				sec, nsec = int64(int32(binary.NativeEndian.Uint32(data))), int64(int32(binary.NativeEndian.Uint32(data[4:])))
			default:
				return now
			}
			age := now.Round(0).Sub(time.Unix(sec, nsec))
			if age < 0 || age > maxQueueAge {
				return now
			}
			return now.Add(-age)
		}
		oob = rest
	}
	return now
}

// arrivals dates the datagrams read from one socket, in order: by arrival, but never before the
// socket was opened nor before the previous datagram (the packets of a session come through one
// socket, in order, and a stepped wall clock could make arrivals go back), and by its read when
// the wall clock was stepped since the previous read (the timestamp may be on either side of the
// step).
type arrivals struct {
	// last is the latest arrival so far (at first, when the socket was opened), prev the
	// previous read.
	last, prev time.Time
}

// at is the arrival of a datagram read at now with the control messages oob.
func (r *arrivals) at(oob []byte, now time.Time) time.Time {
	at := arrival(oob, now)
	if clockStepped(now.Round(0).Sub(r.prev.Round(0)), now.Sub(r.prev)) {
		at = now
	}
	r.prev = now
	if at.Before(r.last) {
		at = r.last
	}
	r.last = at
	return at
}

// clockStepped reports whether the wall clock was stepped between two reads: it moved by wall
// while the monotonic clock moved by mono (for reads at base and now: now.Round(0).Sub(base.Round(0))
// and now.Sub(base)).
func clockStepped(wall, mono time.Duration) bool {
	d := wall - mono
	return d > maxClockStep || d < -maxClockStep
}

// queued reports whether a datagram waits in conn's receive queue: a peek that does not block (a
// zero-length datagram counts too, which SIOCINQ would miss). It takes no read lock, so it does
// not wait for the reader blocked on conn.
func queued(conn *net.UDPConn) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	var b [1]byte
	if rc.Control(func(fd uintptr) { _, _, err = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT) }) != nil {
		return false
	}
	return err == nil
}
