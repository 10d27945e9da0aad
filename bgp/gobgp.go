package bgp

import (
	"fmt"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Values vipgate sets on every GoBGP neighbor.
const (
	// idleHoldAfterReset replaces GoBGP's 30s wait before reconnecting after a session reset (a BFD
	// failure, a hold timer expiry): a VIP speaker wants its routes back soon, and 5s still damps
	// a flapping link.
	idleHoldAfterReset = 5 * time.Second
	// gracefulRestartTime is how long a router keeps our routes after the session drops while
	// graceful restart is negotiated; it covers a vipgate pod restart.
	gracefulRestartTime = 120 * time.Second
	// gracefulDeferralTime bounds how long a restarted speaker holds back its routes waiting for
	// End-of-RIB from every graceful-restart peer (one may be down). The routers keep forwarding
	// on the routes they retained meanwhile, so only changes are delayed.
	gracefulDeferralTime = 15 * time.Second
	// ebgpMultiHopTTL is the TTL used for eBGP multi-hop, as MetalLB and FRR do.
	ebgpMultiHopTTL = 255
)

var (
	familyIPv4 = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	familyIPv6 = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

// seconds rounds a duration down to whole seconds, the unit of BGP timers.
func seconds(d time.Duration) uint64 { return uint64(d / time.Second) }

// apiPeer builds GoBGP's neighbor configuration from a validated PeerConfig. restarting marks the
// first session after a vipgate restart (see Speaker.SetPeers).
func apiPeer(p PeerConfig, restarting bool) *api.Peer {
	connect := p.ConnectTime
	if connect == 0 {
		connect = defaultConnectTime
	}
	family := familyIPv4
	if p.PeerAddress.Is6() {
		family = familyIPv6
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.PeerAddress.String(),
			PeerAsn:         p.PeerASN,
			LocalAsn:        p.localASN(),
			AuthPassword:    p.Password,
			Description:     p.Name,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           seconds(connect),
			HoldTime:               seconds(p.HoldTime),
			KeepaliveInterval:      seconds(p.KeepaliveTime),
			IdleHoldTimeAfterReset: seconds(idleHoldAfterReset),
		}},
		Transport: &api.Transport{RemotePort: uint32(p.PeerPort)},
		AfiSafis: []*api.AfiSafi{{
			Config:            &api.AfiSafiConfig{Family: family, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: p.GracefulRestart}},
		}},
	}
	if p.SourceAddress.IsValid() {
		peer.Transport.LocalAddress = p.SourceAddress.String()
	}
	if p.EBGPMultiHop {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: ebgpMultiHopTTL}
	}
	if p.GracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{
			Enabled:     true,
			RestartTime: uint32(seconds(gracefulRestartTime)),
			// RFC 4724 4.1: a restarting speaker sets the Restart State bit and the Forwarding
			// State bit of each family; without the F bit the router flushes the routes it kept.
			// GoBGP then holds back UPDATEs until every graceful-restart peer has sent End-of-RIB
			// (or DeferralTime passes) and sends the whole table at once.
			LocalRestarting: restarting,
			DeferralTime:    uint32(seconds(gracefulDeferralTime)),
		}
	}
	// No BFD here: vipgate runs BFD itself (bfd.go), independently of GoBGP's neighbor.
	return peer
}

// apiPath builds the local GoBGP path for a route. The next hop is left unspecified so that GoBGP
// fills in each session's local address ("next hop self"), which is the node's address on the
// router's network. drain marks the route for graceful shutdown (RFC 8326): GRACEFUL_SHUTDOWN
// community and LOCAL_PREF 0, so routers prefer any other path before the session closes.
func apiPath(r route, drain bool) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(r.prefix)
	if err != nil {
		return nil, fmt.Errorf("building NLRI for %s: %w", r.prefix, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if r.prefix.Addr().Is4() {
		nh, err := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
		if err != nil {
			return nil, fmt.Errorf("building next hop for %s: %w", r.prefix, err)
		}
		attrs = append(attrs, nh)
	} else {
		family = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
		if err != nil {
			return nil, fmt.Errorf("building MP_REACH for %s: %w", r.prefix, err)
		}
		attrs = append(attrs, mp)
	}
	localPref, communities := r.localPref, r.communities
	if drain {
		localPref = 0
		gshut, _ := ParseCommunity(GracefulShutdownCommunity)
		communities = sortedUnique(append([]uint32{gshut}, communities...))
	}
	if localPref != 0 || drain {
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(localPref))
	}
	if len(communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(communities))
	}
	if len(r.large) > 0 {
		lc := make([]*bgp.LargeCommunity, len(r.large))
		for i, v := range r.large {
			lc[i] = bgp.NewLargeCommunity(v[0], v[1], v[2])
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(lc))
	}
	if !r.linkBW.IsZero() {
		attrs = append(attrs, bgp.NewPathAttributeExtendedCommunities([]bgp.ExtendedCommunityInterface{r.linkBW.extCommunity()}))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs}, nil
}

func sessionState(s api.PeerState_SessionState) SessionState {
	switch s {
	case api.PeerState_SESSION_STATE_IDLE:
		return StateIdle
	case api.PeerState_SESSION_STATE_CONNECT:
		return StateConnect
	case api.PeerState_SESSION_STATE_ACTIVE:
		return StateActive
	case api.PeerState_SESSION_STATE_OPENSENT:
		return StateOpenSent
	case api.PeerState_SESSION_STATE_OPENCONFIRM:
		return StateOpenConfirm
	case api.PeerState_SESSION_STATE_ESTABLISHED:
		return StateEstablished
	}
	return StateUnknown
}

// localASN is the AS number the session uses on the wire: LocalASN when set, else MyASN.
func (p PeerConfig) localASN() uint32 {
	if p.LocalASN != 0 {
		return p.LocalASN
	}
	return p.MyASN
}
