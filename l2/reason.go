package l2

// DropReason is the outcome of handling one received ARP or NDP packet:
// DropNone when the packet was answered, otherwise why it was ignored.
// Responders count every outcome in the vipgate_l2_requests_dropped_total
// metric, and tests assert on it instead of scraping logs.
type DropReason int

// The possible outcomes of handling a received packet.
const (
	// DropNone means the packet was a request for an owned VIP on the
	// interface it arrived on, and a reply was sent.
	DropNone DropReason = iota
	// DropMalformed means the frame or message could not be parsed: too
	// short, truncated, not IPv6 where it should be, or a bad ICMPv6
	// checksum.
	DropMalformed
	// DropNotRequest means the packet was valid but not a question: an ARP
	// reply, or an ICMPv6 message other than a neighbor solicitation.
	DropNotRequest
	// DropAnnouncement means another host announced the target address
	// (gratuitous ARP, sender IP == target IP). Answering would not help
	// anybody; if the address is ours it is logged as a conflict.
	DropAnnouncement
	// DropOwnFrame means the raw socket saw a frame sent from this
	// interface's own MAC address.
	DropOwnFrame
	// DropOtherDestination means the Ethernet frame was unicast to another
	// MAC address (seen in promiscuous mode, or flooded by a switch), or a
	// neighbor solicitation's IPv6 destination was neither its target nor
	// the target's solicited-node group (RFC 4861 section 4.3).
	DropOtherDestination
	// DropNotOurs means the target address is not a VIP this host owns.
	DropNotOurs
	// DropWrongInterface means the target is an owned VIP, but not on the
	// interface the request arrived on.
	DropWrongInterface

	// The reasons below are neighbor solicitations that RFC 4861 section
	// 7.1.1 says to discard silently, and solicitations whose answer would
	// go nowhere sensible. They are not counted as requests.

	// DropHopLimit means the hop limit was not 255: a router forwarded the
	// solicitation, so it did not come from this link.
	DropHopLimit
	// DropBadCode means the ICMPv6 code was not 0.
	DropBadCode
	// DropBadOption means an option had length 0, ran past the end of the
	// message, or was a source link-layer address of the wrong length.
	DropBadOption
	// DropMulticastTarget means the target address was multicast.
	DropMulticastTarget
	// DropBadDAD means a solicitation from the unspecified address (a
	// duplicate address detection probe) was not sent to a solicited-node
	// group or carried a source link-layer address option.
	DropBadDAD
	// DropBadSource means the source address was multicast or loopback, or
	// the solicitor's link-layer address (option, or frame source) was
	// multicast or zero: a unicast answer could not go back to it.
	DropBadSource
)

var dropReasonNames = [...]string{
	DropNone:             "none",
	DropMalformed:        "malformed",
	DropNotRequest:       "not_request",
	DropAnnouncement:     "announcement",
	DropOwnFrame:         "own_frame",
	DropOtherDestination: "other_destination",
	DropNotOurs:          "not_ours",
	DropWrongInterface:   "wrong_interface",
	DropHopLimit:         "hop_limit",
	DropBadCode:          "bad_code",
	DropBadOption:        "bad_option",
	DropMulticastTarget:  "multicast_target",
	DropBadDAD:           "bad_dad",
	DropBadSource:        "bad_source",
}

// isRequest reports whether a packet dropped for r still counts as a
// received request: it was a valid question, only not one for us.
func (r DropReason) isRequest() bool {
	switch r {
	case DropMalformed, DropNotRequest, DropOwnFrame,
		DropHopLimit, DropBadCode, DropBadOption, DropMulticastTarget, DropBadDAD, DropBadSource:
		return false
	}
	return true
}

// String returns the reason as used in the "reason" metric label.
func (r DropReason) String() string {
	if r < 0 || int(r) >= len(dropReasonNames) {
		return "unknown"
	}
	return dropReasonNames[r]
}
