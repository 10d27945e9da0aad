package bgp

import (
	"net/netip"
	"time"
)

// PeerConfig is one BGP session. Field names follow MetalLB's BGPPeer v1beta2.
type PeerConfig struct {
	// Name identifies the peer in Advertisement.Peers, in Status, in metrics and in logs. Unique.
	Name string
	// MyASN is the local AS number for this session; PeerASN the remote one. Equal means iBGP.
	MyASN, PeerASN uint32
	// LocalASN, when not 0, is the AS number this session shows the peer instead of MyASN (MetalLB
	// v0.16's BGPPeer localASN, FRR's "local-as LocalASN no-prepend replace-as"): it is the AS in
	// our OPEN and the only AS in the AS_PATH of our routes, and whether the session is iBGP or eBGP
	// is decided by comparing it with PeerASN. GoBGP has a local AS per neighbor, so nothing else
	// changes.
	LocalASN uint32
	// PeerAddress is the router's address (IPv4 or IPv6). IPv4 peers carry IPv4 VIPs, IPv6 peers
	// carry IPv6 VIPs.
	PeerAddress netip.Addr
	// PeerPort is the router's TCP port; 0 means 179.
	PeerPort uint16
	// SourceAddress is the local address to connect from; zero lets the kernel choose. It is also
	// the next hop the router sees, since VIP routes are sent with "next hop self".
	SourceAddress netip.Addr
	// RouterID must be zero or equal to the Speaker's router ID: GoBGP has one router ID per server.
	RouterID netip.Addr
	// HoldTime (>= 3s, or 0 for 90s), KeepaliveTime (0 for HoldTime/3) and ConnectTime (the wait
	// between connection attempts; 0 for 10s) are rounded down to whole seconds, as on the wire.
	HoldTime, KeepaliveTime, ConnectTime time.Duration
	// EBGPMultiHop allows an eBGP router that is not on a directly connected network (TTL 255).
	EBGPMultiHop bool
	// Password enables TCP MD5 signatures (RFC 2385) with this key.
	Password string
	// BFD, when set, runs a BFD session to PeerAddress and resets the BGP session when it fails.
	// Changing only BFD updates the BFD session in place; the BGP session stays up.
	BFD *BFDProfile
	// GracefulRestart advertises the graceful restart capability (RFC 4724), so the router keeps
	// our routes while vipgate restarts (see Speaker.Stop).
	GracefulRestart bool
}

// BFDProfile holds the BFD settings of a peer (MetalLB's BFDProfile). Zero intervals mean 1s and
// a zero multiplier 3. vipgate runs BFD itself (package bfd: RFC 5880 asynchronous mode, RFC 5881
// single hop, RFC 5883 multi-hop for EBGPMultiHop peers).
type BFDProfile struct {
	// ReceiveInterval is the minimum interval at which we can receive control packets.
	ReceiveInterval time.Duration
	// TransmitInterval is the interval at which we would like to send control packets.
	TransmitInterval time.Duration
	// DetectMultiplier is how many packets may be missed before the session is declared down.
	DetectMultiplier uint32
	// EchoMode is accepted for MetalLB compatibility but ignored (with a warning in the log):
	// only asynchronous mode is implemented.
	EchoMode bool
	// PassiveMode waits for the router's first packet before sending any.
	PassiveMode bool
	// MinimumTTL is the lowest TTL accepted on a multi-hop session (a peer with EBGPMultiHop);
	// 0 means 254. Single-hop sessions accept only 255 (RFC 5881 section 5).
	MinimumTTL uint32
	// MaxDetectTime (vipgate's, not MetalLB's) bounds the detection time the router's packets can
	// ask for; 0 means 5s. It is never below ReceiveInterval x DetectMultiplier. See bfd.Config.
	MaxDetectTime time.Duration
	// Auth (vipgate's, not MetalLB's) authenticates the session's packets (RFC 5880 6.7); the
	// zero value is none.
	Auth BFDAuth
}

// BFDAuth is RFC 5880 keyed authentication of a BFD session. The router must have the same type,
// key ID and key (BIRD: "authentication meticulous keyed sha1; password "..." { id N; };").
type BFDAuth struct {
	// Type is keyed-md5, meticulous-keyed-md5, keyed-sha1 or meticulous-keyed-sha1 (empty: no
	// authentication). The meticulous types also stop replayed packets; prefer them.
	Type string
	// KeyID is the Auth Key ID both sides use for Key.
	KeyID uint8
	// Key is the shared secret: at most 16 bytes with MD5, 20 with SHA1.
	Key string
}

// Advertisement is one VIP route to announce.
type Advertisement struct {
	// Prefix is the route, usually a /32 or /128 VIP.
	Prefix netip.Prefix
	// LocalPref is sent to iBGP peers (eBGP peers never see LOCAL_PREF); 0 means GoBGP's default 100.
	LocalPref uint32
	// Communities are standard communities "ASN:VALUE" (for example "65000:100") or one of the
	// well-known names no-export, no-advertise, no-export-subconfed, graceful-shutdown, blackhole.
	Communities []string
	// LargeCommunities are RFC 8092 communities "ASN:DATA1:DATA2" (for example "65000:1:2").
	LargeCommunities []string
	// Peers restricts the route to the named peers; empty means every peer.
	Peers []string
	// ASPathPrepend is how many times the AS is prepended to the AS path towards eBGP peers, on
	// top of the one BGP adds (MetalLB v0.16.2's BGPAdvertisement asPathPrepend, 0-MaxASPathPrepend;
	// 0: none). See prepend.go.
	ASPathPrepend uint8
	// LinkBandwidth is sent as the BGP link bandwidth extended community, for weighted ECMP at the
	// router (zero: none). See linkbw.go.
	LinkBandwidth LinkBandwidth
}

// SessionState is the BGP finite state machine state of a peer.
type SessionState string

// The BGP FSM states (RFC 4271 section 8.2.2).
const (
	StateIdle        SessionState = "idle"
	StateConnect     SessionState = "connect"
	StateActive      SessionState = "active"
	StateOpenSent    SessionState = "opensent"
	StateOpenConfirm SessionState = "openconfirm"
	StateEstablished SessionState = "established"
	StateUnknown     SessionState = "unknown"
)

// BFDState is the state of a peer's BFD session; empty when BFD is not configured.
type BFDState string

// The BFD session states (RFC 5880 section 4.1).
const (
	BFDDisabled  BFDState = ""
	BFDAdminDown BFDState = "admindown"
	BFDDown      BFDState = "down"
	BFDInit      BFDState = "init"
	BFDUp        BFDState = "up"
)

// PeerStatus reports one configured peer.
type PeerStatus struct {
	Name    string
	Address netip.Addr
	State   SessionState
	// Uptime is how long the session has been established; 0 when it is not.
	Uptime time.Duration
	// Advertised counts the routes currently sent to this peer.
	Advertised int
	// UpdatesSent counts UPDATE messages sent in the current GoBGP peer's life.
	UpdatesSent uint64
	BFD         BFDState
}
