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
	// DropMalformed means the frame or message could not be parsed, or
	// broke a protocol rule (an NS with a hop limit other than 255 or a bad
	// ICMPv6 checksum).
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
	// MAC address (seen in promiscuous mode, or flooded by a switch).
	DropOtherDestination
	// DropNotOurs means the target address is not a VIP this host owns.
	DropNotOurs
	// DropWrongInterface means the target is an owned VIP, but not on the
	// interface the request arrived on.
	DropWrongInterface
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
}

// String returns the reason as used in the "reason" metric label.
func (r DropReason) String() string {
	if r < 0 || int(r) >= len(dropReasonNames) {
		return "unknown"
	}
	return dropReasonNames[r]
}
