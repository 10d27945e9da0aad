// Package bfd is vipgate's Bidirectional Forwarding Detection: RFC 5880 in asynchronous mode over
// UDP, single hop (RFC 5881: port 3784) and multi-hop (RFC 5883: port 4784), IPv4 and IPv6, without
// authentication, Demand mode or Echo. It knows nothing of BGP: package bgp creates one session per
// peer and resets BGP on the failures a session reports.
//
// Layout, by responsibility:
//
//   - packet.go: the Control packet, its wire format and the checks of RFC 5880 6.8.6 that need no
//     session (version, lengths, Detect Mult, Multipoint, discriminators, authentication).
//   - session.go: one session's state machine, pure (time is an argument, packets and events go
//     out as values): RFC 5880 6.8 (states, timers, Poll Sequence, jitter, detection time), plus
//     what the client is told (Failure).
//   - engine.go: every session, and the demultiplexing of received packets (RFC 5880 6.8.6: by Your
//     Discriminator, else by source address while the sender is Down).
//   - server.go, socket.go: the I/O: one goroutine owning the engine, one reader per listening
//     socket, one sending socket per session; drop counters.
//
// What a session reports as a failure (RFC 5882): its detection time expiring while Up; the remote
// session it was Up with signalling Down with a diagnostic that names a failure; or the peer tearing
// that session down ("neighbor signaled session down" while we were Up, which FRR's bfdd sends when
// it deletes a session) or replacing it by a new one (another discriminator starting in Down), and
// the session not being Up again within one detection time at the 1 s slow rate. AdminDown from
// the peer is never a failure (RFC 5882 section 3.2), nor is removing a session (it sends AdminDown).
//
// A receiver that falls behind (a loaded machine not running our goroutines) neither loses a session
// nor keeps one for it: the detection time runs from each packet's arrival, the kernel's receive
// timestamp (a packet that arrived after it expired does not rescue the session), and a detection
// time about to expire while datagrams are still queued on a listening socket, or on their way to
// the session goroutine, waits for them a few milliseconds (at most 5 ms from the first wait, so no
// sender can put a failure off for longer; packets due go out meanwhile). A timestamp the wall
// clock's steps may have made wrong is not used: the packet counts from when it was read.
// SO_TIMESTAMPNS is a per-socket option, set on the listening sockets only (best effort: without
// it packets count from their read), but it enables the kernel's global netstamp_needed_key static
// key, so while such a socket is open the kernel timestamps every packet the machine receives, in
// every network namespace: one clock read per packet.
//
// Hostile input costs the same whatever it is: the readers drop datagrams with a TTL other than 255
// (single hop, GTSM: RFC 5881 section 5) or below the session's minimum (multi-hop), from addresses
// that are no peer, or malformed, before they reach the session goroutine; every drop is counted by
// DropReason.
package bfd
