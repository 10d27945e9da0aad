package bgp

import (
	"fmt"
	"math"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// The BGP link bandwidth extended community (RFC 10005, draft-ietf-idr-link-bandwidth):
// non-transitive, type 0x40, subtype 0x04, then a 2-octet AS number and the bandwidth in bytes per
// second as an IEEE 754 single-precision float. A router doing weighted ECMP over paths that all
// carry it splits flows over them in proportion to it (FRR: "Weighted ECMP using BGP link
// bandwidth"; it computes each next hop's weight as bandwidth x 100 / the sum, and installs the
// weights in the kernel); a path without it makes FRR fall back to equal weights.
//
// The route is one GoBGP path sent to every peer, so the community is the same on every session;
// GoBGP sends it to eBGP peers too (it strips no extended community on export).

// ASTrans is the 2-octet stand-in for a 4-octet AS number (RFC 6793), used in the link bandwidth
// community's 2-octet AS field, as FRR does.
const ASTrans = 23456

// LinkBandwidth is the link bandwidth community of a route; the zero value is none.
type LinkBandwidth struct {
	// AS is the AS of the advertising speaker; above 65535 it is sent as ASTrans.
	AS uint32
	// BytesPerSecond is the bandwidth; 0 means no community. Receivers only compare the values of
	// the paths of one prefix, so the unit is a choice of the sender (speaker/ uses one Mbit/s per
	// endpoint).
	BytesPerSecond float32
}

// IsZero reports whether no community is sent.
func (l LinkBandwidth) IsZero() bool { return l.BytesPerSecond == 0 }

func (l LinkBandwidth) validate() error {
	f := float64(l.BytesPerSecond)
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return fmt.Errorf("link bandwidth %v: want a finite value >= 0", l.BytesPerSecond)
	}
	return nil
}

// extCommunity is the community as GoBGP encodes it (Serialize: 40 04 AS AS BW BW BW BW).
func (l LinkBandwidth) extCommunity() *bgp.LinkBandwidthExtended {
	as := uint16(ASTrans)
	if l.AS <= math.MaxUint16 {
		as = uint16(l.AS)
	}
	return bgp.NewLinkBandwidthExtended(as, l.BytesPerSecond)
}
