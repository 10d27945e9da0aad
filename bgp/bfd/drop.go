package bfd

import "sync/atomic"

// DropReason says why a received datagram was discarded. Every discarded datagram is counted under
// exactly one reason (Server.Drops), so a hostile or broken sender shows up in the metrics without
// a log line per packet.
type DropReason uint8

// The drop reasons, in the order the checks run.
const (
	DropNone DropReason = iota
	// DropTruncated: the datagram was larger than any Control packet can be.
	DropTruncated
	// DropTTL: the TTL (IPv4) or hop limit (IPv6) was not 255 on a single-hop session, or below
	// the minimum on a multi-hop one, or the kernel did not report it (RFC 5881 section 5, GTSM).
	DropTTL
	// DropUnknownPeer: the source address is not a configured peer.
	DropUnknownPeer
	DropShort
	DropVersion
	// DropLength: the Length field is below 24 (26 with the A bit) or above the datagram.
	DropLength
	DropDetectMult
	DropMultipoint
	DropZeroMyDiscr
	// DropAuthMalformed: the Authentication Section is shorter than its header, or its Auth Len
	// is not its type's or does not end where the packet does.
	DropAuthMalformed
	// DropAuthType: the Authentication Section is Simple Password or of an undefined type.
	DropAuthType
	// DropPollFinal: both Poll and Final set.
	DropPollFinal
	// DropUnknownDiscr: Your Discriminator names no session of ours.
	DropUnknownDiscr
	// DropWrongSource: Your Discriminator names the session of another peer.
	DropWrongSource
	// DropZeroYourDiscr: Your Discriminator is zero although the sender is in Init or Up.
	DropZeroYourDiscr
	// DropLocalAdminDown: our session is administratively down (being removed).
	DropLocalAdminDown
	// DropHeld: our session is held (not started yet: its BGP session was never Established).
	DropHeld
	// DropAuth: the packet's authentication does not match its session's: the A bit on a
	// session without authentication, none on a session with it, or another Auth Type.
	DropAuth
	// DropAuthKeyID: the Auth Key ID is not the session's.
	DropAuthKeyID
	// DropAuthDigest: the digest is wrong (another key, or a packet changed on the way).
	DropAuthDigest
	// DropAuthSeq: the sequence number is outside the window of RFC 5880 6.7.3/6.7.4: a replayed
	// or too old packet (meticulous: not above the last one).
	DropAuthSeq
	// DropStaleRemote: the packet comes from a remote session other than the one ours is bound
	// to, and is not a new remote session starting (Down, Your Discriminator zero); typically the
	// last packets of a session the router has just replaced.
	DropStaleRemote
	// DropSuccessorHeld: a new remote session announced itself (Down, Your Discriminator zero)
	// while ours is Up with another, without authentication: remembered, not acted on until the
	// current remote session goes away (a blind sender on the link can send this packet).
	DropSuccessorHeld
	numDropReasons
)

var dropNames = [numDropReasons]string{
	DropNone:           "none",
	DropTruncated:      "truncated",
	DropTTL:            "ttl",
	DropUnknownPeer:    "unknown_peer",
	DropShort:          "short",
	DropVersion:        "version",
	DropLength:         "length",
	DropDetectMult:     "zero_detect_mult",
	DropMultipoint:     "multipoint",
	DropZeroMyDiscr:    "zero_my_discriminator",
	DropAuthMalformed:  "auth_malformed",
	DropAuthType:       "auth_type",
	DropAuth:           "authentication",
	DropAuthKeyID:      "auth_key_id",
	DropAuthDigest:     "auth_digest",
	DropAuthSeq:        "auth_sequence",
	DropPollFinal:      "poll_and_final",
	DropUnknownDiscr:   "unknown_discriminator",
	DropWrongSource:    "wrong_source",
	DropZeroYourDiscr:  "zero_your_discriminator",
	DropLocalAdminDown: "local_admin_down",
	DropHeld:           "session_not_started",
	DropStaleRemote:    "stale_remote_session",
	DropSuccessorHeld:  "successor_held",
}

// String is the reason as used in the metric label.
func (r DropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return "invalid"
}

// DropReasons lists every reason a datagram can be dropped for.
func DropReasons() []DropReason {
	rs := make([]DropReason, 0, numDropReasons-1)
	for r := DropNone + 1; r < numDropReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}

// dropCounters counts drops by reason; written by the readers and the loop, read by metrics.
type dropCounters [numDropReasons]atomic.Uint64

func (c *dropCounters) add(r DropReason) {
	if r != DropNone && r < numDropReasons {
		c[r].Add(1)
	}
}
