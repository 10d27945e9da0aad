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
// reports each datagram's TTL (IP_RECVTTL) or hop limit (IPV6_RECVHOPLIMIT).
func listen(v6 bool, port int) (*net.UDPConn, error) {
	network, addr := "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port))
	set := func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTTL, 1) }
	if v6 {
		network, addr = "udp6", netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port))
		set = func(fd int) error {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return err
			}
			return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
		}
	}
	lc := net.ListenConfig{Control: control(set)}
	pc, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
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
