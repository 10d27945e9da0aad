package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// replyLine is the one line every server answer consists of.
func replyLine(name string, src, dst netip.AddrPort) string {
	return fmt.Sprintf("name=%s src=%s dst=%s\n", name, unmap(src), unmap(dst))
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort()
	case *net.UDPAddr:
		return a.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// errorKind turns a network error into the word tests match on. The mapping
// follows the kernel: a TCP RST or an ICMP port unreachable is ECONNREFUSED,
// ICMP host/net unreachable (and v4 "administratively prohibited") is
// EHOSTUNREACH/ENETUNREACH, ICMPv6 "administratively prohibited" is EACCES,
// and a local netfilter drop on output is EPERM.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, syscall.EACCES):
		return "prohibited"
	case errors.Is(err, syscall.EPERM):
		return "blocked"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	}
	return "failed"
}
