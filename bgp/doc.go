// Package bgp is the I/O half of vipgate's BGP speaker: it runs an embedded GoBGP v4 server, keeps its
// peers and its announced VIP routes equal to what the caller asks for, and reports session state.
//
// It never decides what to announce. The speaker/ package decides (which VIPs, to which peers, with
// which attributes) and hands this package plain values: a list of PeerConfig and a list of
// Advertisement. Both setters diff against what GoBGP currently holds, so calling them again with
// the same values sends nothing on the wire.
//
// Mapping to MetalLB's BGPPeer (v1beta2) fields: myASN, peerASN, peerAddress, peerPort, sourceAddress,
// routerID, holdTime, keepaliveTime, connectTime, ebgpMultiHop, password (TCP MD5), bfdProfile
// (receiveInterval, transmitInterval, detectMultiplier, passiveMode, minimumTtl; no echo mode) and
// enableGracefulRestart.
//
// BFD is vipgate's own (package bfd, RFC 5880/5881/5883), run beside GoBGP rather than inside it:
// a BFD failure resets the peer's Established BGP session (bfd.go says exactly when).
//
// See README.md in this directory for what GoBGP does underneath, how BFD behaves with FRR and BIRD,
// and how the netns tests run real routers (BIRD 2, FRR) against it.
package bgp
