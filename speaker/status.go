package speaker

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// AdvertisedPeers returns, per Service, the BGPPeers this node is configured to advertise the
// Service's LoadBalancer IPs to — what MetalLB's ServiceBGPStatus reports (status.peers: "the BGP
// peers for which the service is configured to be advertised to"; whether the session is up is not
// part of it). A Service's IP goes to a peer when this node advertises it (decisions owned by self),
// the route's Peers list (BGPAdvertisement peers) is empty or names the peer, and the peer carries
// the IP's family. Names are the BGPPeer object names, as MetalLB writes them; sorted, once each.
func AdvertisedPeers(self string, peers []bgp.PeerConfig, ads []bgp.Advertisement, decisions []VIPDecision) map[cluster.ServiceKey][]string {
	out := map[cluster.ServiceKey][]string{}
	for _, d := range decisions {
		if d.Owner != self {
			continue
		}
		for _, a := range ads {
			if !a.Prefix.Contains(d.IP) {
				continue
			}
			for _, p := range peers {
				if (len(a.Peers) > 0 && !slices.Contains(a.Peers, p.Name)) || !carries(p, d.IP) {
					continue
				}
				out[d.Service] = append(out[d.Service], bgpPeerObjectName(p.Name))
			}
		}
	}
	for k, v := range out {
		slices.Sort(v)
		out[k] = slices.Compact(v)
	}
	return out
}

// carries says whether peer p receives routes of ip's family (IPv4 peers carry IPv4 VIPs, IPv6
// peers IPv6 VIPs).
func carries(p bgp.PeerConfig, ip netip.Addr) bool {
	return p.PeerAddress.Is4() == ip.Is4()
}

// bgpPeerObjectName turns DecideBGP's peer name ("namespace/name") into the BGPPeer's name.
func bgpPeerObjectName(n string) string {
	if i := strings.LastIndexByte(n, '/'); i >= 0 {
		return n[i+1:]
	}
	return n
}
