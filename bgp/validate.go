package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied to zero PeerConfig fields.
const (
	defaultConnectTime = 10 * time.Second
	// tcpMD5MaxKeyLen is TCP_MD5SIG_MAXKEYLEN in linux/tcp.h.
	tcpMD5MaxKeyLen = 80
)

// validatePeers checks every peer on its own and returns the valid ones by name. Errors name the
// peer; a bad or duplicate peer never prevents the others from being returned.
func validatePeers(peers []PeerConfig, routerID netip.Addr) (map[string]PeerConfig, error) {
	valid := make(map[string]PeerConfig, len(peers))
	byAddr := make(map[netip.Addr]string, len(peers))
	var errs []error
	for i, p := range peers {
		name := p.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i)
		}
		if err := validatePeer(p, routerID); err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", name, err))
			continue
		}
		if _, dup := valid[p.Name]; dup {
			errs = append(errs, fmt.Errorf("peer %s: duplicate name", name))
			continue
		}
		if other, dup := byAddr[p.PeerAddress]; dup {
			// GoBGP keys neighbors by address, so two sessions to one address cannot coexist.
			errs = append(errs, fmt.Errorf("peer %s: address %s already used by peer %s", name, p.PeerAddress, other))
			continue
		}
		byAddr[p.PeerAddress] = p.Name
		valid[p.Name] = p
	}
	return valid, errors.Join(errs...)
}

func validatePeer(p PeerConfig, routerID netip.Addr) error {
	if p.Name == "" {
		return errors.New("empty name")
	}
	if p.MyASN == 0 {
		return errors.New("myASN must not be 0")
	}
	if p.PeerASN == 0 {
		return errors.New("peerASN must not be 0")
	}
	if !p.PeerAddress.IsValid() || p.PeerAddress.IsUnspecified() || p.PeerAddress.IsMulticast() {
		return fmt.Errorf("invalid peerAddress %q", p.PeerAddress)
	}
	if p.PeerAddress.Is4In6() {
		return fmt.Errorf("peerAddress %s: use the plain IPv4 form", p.PeerAddress)
	}
	if p.SourceAddress.IsValid() && p.SourceAddress.Is4() != p.PeerAddress.Is4() {
		return fmt.Errorf("sourceAddress %s and peerAddress %s are of different families", p.SourceAddress, p.PeerAddress)
	}
	if p.RouterID.IsValid() && p.RouterID != routerID {
		return fmt.Errorf("routerID %s differs from the speaker's %s (GoBGP has one router ID)", p.RouterID, routerID)
	}
	if p.HoldTime != 0 && p.HoldTime < 3*time.Second {
		return fmt.Errorf("holdTime %s is below 3s", p.HoldTime)
	}
	if p.HoldTime > 65535*time.Second {
		return fmt.Errorf("holdTime %s is above 65535s", p.HoldTime)
	}
	if p.KeepaliveTime < 0 || p.ConnectTime < 0 {
		return errors.New("negative keepaliveTime or connectTime")
	}
	if p.KeepaliveTime != 0 && p.HoldTime != 0 && p.KeepaliveTime > p.HoldTime {
		return fmt.Errorf("keepaliveTime %s is above holdTime %s", p.KeepaliveTime, p.HoldTime)
	}
	if p.ConnectTime != 0 && p.ConnectTime < time.Second {
		return fmt.Errorf("connectTime %s is below 1s", p.ConnectTime)
	}
	if len(p.Password) > tcpMD5MaxKeyLen {
		return fmt.Errorf("password longer than %d bytes", tcpMD5MaxKeyLen)
	}
	if b := p.BFD; b != nil {
		if b.ReceiveInterval < 0 || b.TransmitInterval < 0 {
			return errors.New("negative BFD interval")
		}
		if b.DetectMultiplier > 255 {
			return fmt.Errorf("BFD detectMultiplier %d is above 255", b.DetectMultiplier)
		}
		// Intervals go on the wire in microseconds as uint32.
		if b.ReceiveInterval > time.Hour || b.TransmitInterval > time.Hour {
			return errors.New("BFD interval above 1h")
		}
		if b.ReceiveInterval > 0 && b.ReceiveInterval < time.Millisecond || b.TransmitInterval > 0 && b.TransmitInterval < time.Millisecond {
			return errors.New("BFD interval below 1ms")
		}
		if b.MinimumTTL > 254 {
			return fmt.Errorf("BFD minimumTtl %d is above 254", b.MinimumTTL)
		}
		if b.MaxDetectTime < 0 || b.MaxDetectTime > time.Hour {
			return fmt.Errorf("BFD maximum detection time %s is negative or above 1h", b.MaxDetectTime)
		}
		if _, err := bfdAuth(b.Auth); err != nil {
			return err
		}
	}
	return nil
}

// route is a validated, normalized Advertisement: what one local path in GoBGP carries.
type route struct {
	prefix      netip.Prefix
	localPref   uint32
	communities []uint32 // sorted, unique
	large       [][3]uint32
	prepend     uint8 // Advertisement.ASPathPrepend
	linkBW      LinkBandwidth
	// peers is the sorted set of peer names; nil means every peer.
	peers []string
}

// sameAttrs reports whether two routes would produce the same BGP path attributes.
func (r route) sameAttrs(o route) bool {
	return r.localPref == o.localPref && slices.Equal(r.communities, o.communities) && slices.Equal(r.large, o.large) &&
		r.prepend == o.prepend && r.linkBW == o.linkBW
}

// equal reports whether nothing about the route changed, peers included.
func (r route) equal(o route) bool {
	return r.prefix == o.prefix && r.sameAttrs(o) && (r.peers == nil) == (o.peers == nil) && slices.Equal(r.peers, o.peers)
}

// sendsTo reports whether the route goes to the named peer.
func (r route) sendsTo(peer string) bool {
	if r.peers == nil {
		return true
	}
	_, found := slices.BinarySearch(r.peers, peer)
	return found
}

// normalizeAds turns advertisements into routes keyed by prefix. Two advertisements of one prefix
// with the same attributes are merged (their peer lists joined); with different attributes the later
// one is an error, because GoBGP holds one local path per prefix.
func normalizeAds(ads []Advertisement) (map[netip.Prefix]route, error) {
	routes := make(map[netip.Prefix]route, len(ads))
	var errs []error
	for _, ad := range ads {
		r, err := toRoute(ad)
		if err != nil {
			errs = append(errs, fmt.Errorf("advertisement %s: %w", ad.Prefix, err))
			continue
		}
		old, dup := routes[r.prefix]
		if !dup {
			routes[r.prefix] = r
			continue
		}
		if !old.sameAttrs(r) {
			errs = append(errs, fmt.Errorf("advertisement %s: conflicts with another advertisement of the same prefix (different localPref, communities, AS path prepend or link bandwidth)", ad.Prefix))
			continue
		}
		if old.peers == nil || r.peers == nil {
			old.peers = nil
		} else {
			old.peers = sortedUnique(append(slices.Clone(old.peers), r.peers...))
		}
		routes[r.prefix] = old
	}
	return routes, errors.Join(errs...)
}

func toRoute(ad Advertisement) (route, error) {
	if !ad.Prefix.IsValid() {
		return route{}, errors.New("invalid prefix")
	}
	pfx := ad.Prefix.Masked()
	if pfx.Addr().Is4In6() {
		return route{}, errors.New("IPv4-mapped IPv6 prefix: use the IPv4 form")
	}
	if ad.ASPathPrepend > MaxASPathPrepend {
		return route{}, fmt.Errorf("AS path prepend %d: at most %d", ad.ASPathPrepend, MaxASPathPrepend)
	}
	if err := ad.LinkBandwidth.validate(); err != nil {
		return route{}, err
	}
	r := route{prefix: pfx, localPref: ad.LocalPref, prepend: ad.ASPathPrepend, linkBW: ad.LinkBandwidth}
	for _, c := range ad.Communities {
		v, err := ParseCommunity(c)
		if err != nil {
			return route{}, err
		}
		r.communities = append(r.communities, v)
	}
	r.communities = sortedUnique(r.communities)
	for _, c := range ad.LargeCommunities {
		v, err := ParseLargeCommunity(c)
		if err != nil {
			return route{}, err
		}
		r.large = append(r.large, v)
	}
	slices.SortFunc(r.large, func(a, b [3]uint32) int { return slices.Compare(a[:], b[:]) })
	r.large = slices.Compact(r.large)
	if len(ad.Peers) > 0 {
		for _, p := range ad.Peers {
			if p == "" {
				return route{}, errors.New("empty peer name")
			}
		}
		r.peers = sortedUnique(slices.Clone(ad.Peers))
	}
	return r, nil
}

func sortedUnique[T interface{ ~string | ~uint32 }](s []T) []T {
	slices.Sort(s)
	return slices.Compact(s)
}

// Well-known communities (RFC 1997, RFC 8326, RFC 7999) by the names routers print.
var wellKnownCommunities = map[string]uint32{
	"graceful-shutdown":   0xFFFF0000,
	"blackhole":           0xFFFF029A,
	"no-export":           0xFFFFFF01,
	"no-advertise":        0xFFFFFF02,
	"no-export-subconfed": 0xFFFFFF03,
	"no-peer":             0xFFFFFF04,
}

// GracefulShutdownCommunity is the GRACEFUL_SHUTDOWN community 65535:0 (RFC 8326).
const GracefulShutdownCommunity = "65535:0"

// ParseCommunity parses a standard community "ASN:VALUE" (each 0..65535) or a well-known name.
func ParseCommunity(s string) (uint32, error) {
	if v, ok := wellKnownCommunities[strings.ToLower(s)]; ok {
		return v, nil
	}
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("community %q: want ASN:VALUE", s)
	}
	a, err1 := strconv.ParseUint(hi, 10, 16)
	b, err2 := strconv.ParseUint(lo, 10, 16)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("community %q: both parts must be 0..65535", s)
	}
	return uint32(a)<<16 | uint32(b), nil
}

// ParseLargeCommunity parses a large community "ASN:DATA1:DATA2" (each 0..4294967295).
func ParseLargeCommunity(s string) ([3]uint32, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return [3]uint32{}, fmt.Errorf("large community %q: want ASN:DATA1:DATA2", s)
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return [3]uint32{}, fmt.Errorf("large community %q: each part must be 0..4294967295", s)
		}
		v[i] = uint32(n)
	}
	return v, nil
}
