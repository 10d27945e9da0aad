package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The flow generator and echo server of the gateway flow-table row (gateway_flows.go), run inside
// the lab's namespaces as `bench flowgen` and `bench udpecho`. A flow is a UDP 5-tuple: flow k of
// a run comes from source address srcBase+(k mod srcs) and source port portBase+(k div srcs),
// so 16 addresses give a million flows without a socket each. The generator writes the datagrams
// itself on a raw socket (IP_HDRINCL): a million sockets would cost the sender gigabytes and
// measure nothing of the gateway. A flow is opened by an "ask" datagram ('a': the server answers)
// and confirmed by a "note" ('n': no answer) after the answer, which is what makes a UDP flow
// established for the NAT fast path (the client speaking again after an answer) and assured for
// conntrack. The answers are dropped in the sender namespace before any socket (an nft rule that
// counts them), so the sender sends no ICMP back.
//
// Threat model: bench tools, not part of vipgate, run only inside namespaces the bench created and
// for a bounded time. The echo server answers any ask with a datagram of the same size to its
// source (no amplification), reachable only from the lab's namespaces; the generator sends only
// to its --dst, from the lab's addresses, at most --pps datagrams a second.

const (
	flowPayload = 18 // 64-byte frames, as the small-packet row's
	flowPortMin = 1024
	maxFlows    = 16 * (65536 - flowPortMin)
)

// flowTuple is flow k's source address and port.
func flowTuple(base netip.Addr, srcs, k int) (netip.Addr, uint16) {
	a := base.As4()
	v := binary.BigEndian.Uint32(a[:]) + uint32(k%srcs)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a), uint16(flowPortMin + k/srcs)
}

// udpDatagram writes an IPv4 UDP datagram with payload into b (len(b) >= 28+len(payload)) and
// returns its length; the UDP checksum is computed (the kernel fills in the IP header's).
func udpDatagram(b []byte, src, dst netip.AddrPort, payload []byte) int {
	n := 28 + len(payload)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	b[0], b[1] = 0x45, 0
	binary.BigEndian.PutUint16(b[2:], uint16(n))
	binary.BigEndian.PutUint32(b[4:], 0) // id 0 (the kernel sets one), no fragment flags
	b[8], b[9] = 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(b[10:], 0)
	copy(b[12:16], s4[:])
	copy(b[16:20], d4[:])
	u := b[20:n]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	binary.BigEndian.PutUint16(u[6:], 0)
	copy(u[8:], payload)
	// The checksum over the pseudo header and the datagram; 0 is sent as 0xffff.
	sum := uint32(0)
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(s4[:])
	add(d4[:])
	sum += unix.IPPROTO_UDP + uint32(len(u))
	add(u)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	cs := ^uint16(sum)
	if cs == 0 {
		cs = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], cs)
	return n
}

// flowGenMain is the generator (`bench flowgen`): for the flows [--from, --to) (every --stride-th),
// --kind pair: in chunks of --chunk flows, an ask datagram each, a pause of --gap for the answers,
// then a note each; --kind ask: asks only; --kind note: notes only (a second confirmation pass for
// flows whose answer came after their note); at most --pps datagrams a second. It prints
// "sent=N elapsed_ns=T".
func flowGenMain(args []string) int {
	fs := flag.NewFlagSet("flowgen", flag.ContinueOnError)
	dst := fs.String("dst", "", "ip:port")
	srcBase := fs.String("src-base", "", "the first source address")
	srcs := fs.Int("srcs", 16, "source addresses (1-256)")
	from := fs.Int("from", 0, "first flow")
	to := fs.Int("to", 0, "end of the flows (exclusive)")
	stride := fs.Int("stride", 1, "every n-th flow")
	chunk := fs.Int("chunk", 20000, "flows asked before they are confirmed")
	gap := fs.Duration("gap", 200*time.Millisecond, "pause between a chunk's asks and its notes")
	kind := fs.String("kind", "pair", "pair | ask | note")
	pps := fs.Int("pps", 50000, "datagrams per second at most")
	maxTime := fs.Duration("max-time", 2*time.Minute, "give up after (at most 5m)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err1 := netip.ParseAddrPort(*dst)
	base, err2 := netip.ParseAddr(*srcBase)
	if err1 != nil || err2 != nil || !ap.Addr().Is4() || !base.Is4() || *srcs < 1 || *srcs > 256 || *from < 0 || *to > min(maxFlows, *srcs*(65536-flowPortMin)) ||
		*from >= *to || *stride < 1 || *chunk < 1 || *gap < 0 || *gap > 10*time.Second || *pps < 1 || *pps > 1_000_000 || (*kind != "pair" && *kind != "ask" && *kind != "note") || *maxTime <= 0 || *maxTime > 5*time.Minute {
		fmt.Fprintln(os.Stderr, "flowgen: bad arguments")
		return 2
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flowgen: raw socket:", err)
		return 1
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	const batch = 64
	var name unix.RawSockaddrInet4
	name.Family = unix.AF_INET
	name.Addr = ap.Addr().As4()
	bufs := make([][64]byte, batch)
	iovs := make([]unix.Iovec, batch)
	msgs := make([]mmsghdr, batch)
	for i := range msgs {
		iovs[i].Base = &bufs[i][0]
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
		msgs[i].hdr.Name = (*byte)(unsafe.Pointer(&name))
		msgs[i].hdr.Namelen = unix.SizeofSockaddrInet4
	}
	ask, note := make([]byte, flowPayload), make([]byte, flowPayload)
	for i := range ask {
		ask[i], note[i] = 'a', 'n'
	}
	start := time.Now()
	deadline := start.Add(*maxTime)
	sent := 0
	// send writes one datagram per flow of [lo, hi) (every stride-th), paced.
	send := func(lo, hi int, payload []byte) error {
		k := lo
		for k < hi {
			n := 0
			for ; n < batch && k < hi; k += *stride {
				src, port := flowTuple(base, *srcs, k)
				l := udpDatagram(bufs[n][:], netip.AddrPortFrom(src, port), ap, payload)
				iovs[n].SetLen(l)
				n++
			}
			for off := 0; off < n; {
				r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[off])), uintptr(n-off), 0, 0, 0)
				if errno != 0 {
					if errno == unix.ENOBUFS || errno == unix.EAGAIN {
						time.Sleep(100 * time.Microsecond)
						continue
					}
					return errno
				}
				off += int(r)
			}
			sent += n
			if time.Now().After(deadline) {
				return errors.New("--max-time reached")
			}
			// Pace: sent datagrams may not run ahead of pps.
			if ahead := time.Duration(float64(sent)/float64(*pps)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		return nil
	}
	// Chunks start on a stride boundary so that every chunk sends the same flows' asks and notes.
	step := max(*chunk, 1) * *stride
	for lo := *from; lo < *to; lo += step {
		hi := min(lo+step, *to)
		if *kind != "note" {
			if err := send(lo, hi, ask); err != nil {
				fmt.Fprintln(os.Stderr, "flowgen:", err)
				return 1
			}
		}
		if *kind == "ask" {
			continue
		}
		if *kind == "pair" {
			time.Sleep(*gap)
		}
		if err := send(lo, hi, note); err != nil {
			fmt.Fprintln(os.Stderr, "flowgen:", err)
			return 1
		}
	}
	fmt.Printf("sent=%d elapsed_ns=%d\n", sent, time.Since(start).Nanoseconds())
	return 0
}

// udpEchoMain is the server (`bench udpecho`): bound to --addr, it answers every ask datagram
// ('a' first) with the same datagram, and drops the rest, until --max-time. It prints "ready" once
// bound. Bound to the backend's own address, its answers leave from the address the client's flow
// was sent to (the NAT's reply tuple).
func udpEchoMain(args []string) int {
	fs := flag.NewFlagSet("udpecho", flag.ContinueOnError)
	addr := fs.String("addr", "", "ip:port to bind")
	maxTime := fs.Duration("max-time", time.Minute, "exit after this long (at most 1h)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil || !ap.Addr().Is4() || *maxTime <= 0 || *maxTime > time.Hour {
		fmt.Fprintln(os.Stderr, "udpecho: bad arguments")
		return 2
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpecho:", err)
		return 1
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		fmt.Fprintln(os.Stderr, "udpecho: bind:", err)
		return 1
	}
	fmt.Println("ready")
	const batch = 64
	bufs := make([][2048]byte, batch)
	names := make([]unix.RawSockaddrInet4, batch)
	iovs := make([]unix.Iovec, batch)
	msgs := make([]mmsghdr, batch)
	out := make([]mmsghdr, batch)
	outIovs := make([]unix.Iovec, batch)
	for i := range msgs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
		msgs[i].hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
	}
	end := time.Now().Add(*maxTime)
	for time.Now().Before(end) {
		for i := range msgs {
			msgs[i].hdr.Namelen = unix.SizeofSockaddrInet4
		}
		r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), batch, unix.MSG_WAITFORONE, 0, 0)
		if errno != 0 || r == 0 {
			continue
		}
		n := 0
		for i := range int(r) {
			if msgs[i].n == 0 || bufs[i][0] != 'a' {
				continue
			}
			outIovs[n].Base = &bufs[i][0]
			outIovs[n].SetLen(int(msgs[i].n))
			out[n].hdr.Iov = &outIovs[n]
			out[n].hdr.SetIovlen(1)
			out[n].hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
			out[n].hdr.Namelen = unix.SizeofSockaddrInet4
			n++
		}
		for off := 0; off < n; {
			w, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&out[off])), uintptr(n-off), 0, 0, 0)
			if errno != 0 {
				if errno == unix.ENOBUFS || errno == unix.EAGAIN {
					time.Sleep(50 * time.Microsecond)
					continue
				}
				break
			}
			off += int(w)
		}
	}
	return 0
}
