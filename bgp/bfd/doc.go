// Package bfd is vipgate's Bidirectional Forwarding Detection: RFC 5880 in asynchronous mode over
// UDP, single hop (RFC 5881: port 3784) and multi-hop (RFC 5883: port 4784), IPv4 and IPv6, with
// optional keyed MD5/SHA1 authentication (RFC 5880 6.7), without Demand mode or Echo. It knows nothing of BGP: package bgp creates one session per
// peer and resets BGP on the failures a session reports.
//
// Layout, by responsibility:
//
//   - packet.go: the Control packet, its wire format and the checks of RFC 5880 6.8.6 that need no
//     session (version, lengths, Detect Mult, Multipoint, discriminators, the shape of the
//     Authentication Section).
//   - auth.go: the Authentication Section (keyed MD5 and SHA1, plain and meticulous): its digest
//     and the sequence number window of RFC 5880 6.7.3/6.7.4, checked per session by the engine.
//     A window set by a packet with Your Discriminator zero (replayable by anyone on the link) is
//     tentative until a packet names our discriminator, and an authenticated session takes a new
//     local discriminator whenever its detection time expires or its key changes, so recorded
//     packets can neither lock the peer out nor bring a dead peer's session back (authenticate).
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
// the session not being Up again within one detection time at the 1 s slow rate. Without
// authentication, a new remote session starting while ours is Up with a live one is only
// remembered, and taken when the live one says goodbye or times out: its first packet carries no
// discriminator, so anyone on the link could send it. AdminDown from
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
// The peer's packets set the detection time (its Detect Mult times its Desired Min TX Interval), so
// it is bounded by Config.MaxDetectTime (default 5 s, never below our own receive interval times
// our multiplier): an unauthenticated packet claiming the largest timers cannot keep a dead peer's
// session Up for days.
//
// Hostile input costs the same whatever it is: the readers drop datagrams with a TTL other than 255
// (single hop, GTSM: RFC 5881 section 5) or below the session's minimum (multi-hop), from addresses
// that are no peer, or malformed, before they reach the session goroutine; every drop is counted by
// DropReason.
package bfd
