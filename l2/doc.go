// Package l2 is the I/O half of vipgate's layer-2 speaker: it answers ARP
// requests and IPv6 neighbor solicitations for the VIPs this host owns, and
// announces VIPs it takes over with gratuitous ARP and unsolicited neighbor
// advertisements.
//
// The package never decides which VIPs this host owns; speaker/ does, and
// hands the result to [Announcer.SetOwned]. l2 only makes sure that the
// network sees exactly that set: it answers for an owned VIP on the
// interfaces it was told to use, and for nothing else.
//
// Every received request ends in a [DropReason] (DropNone when it was
// answered), so tests and metrics can tell why a packet was ignored.
package l2
