package bgp

import (
	"bytes"
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// TestLinkBandwidthWire checks the bytes of the community against RFC 10005 section 2: type 0x40
// (non-transitive two-octet AS specific), subtype 0x04, the AS (AS_TRANS for a 4-octet AS), the
// bandwidth in bytes per second as an IEEE 754 float.
func TestLinkBandwidthWire(t *testing.T) {
	tests := []struct {
		name string
		lb   LinkBandwidth
		want []byte
	}{
		// 125000 B/s (1 Mbit/s) = 0x47F42400.
		{"one endpoint", LinkBandwidth{AS: 64513, BytesPerSecond: 125000}, []byte{0x40, 0x04, 0xFC, 0x01, 0x47, 0xF4, 0x24, 0x00}},
		// 375000 B/s = 0x48B71B00.
		{"three endpoints", LinkBandwidth{AS: 64513, BytesPerSecond: 375000}, []byte{0x40, 0x04, 0xFC, 0x01, 0x48, 0xB7, 0x1B, 0x00}},
		{"4-octet AS", LinkBandwidth{AS: 4200000000, BytesPerSecond: 125000}, []byte{0x40, 0x04, 0x5B, 0xA0, 0x47, 0xF4, 0x24, 0x00}},
		{"largest 2-octet AS", LinkBandwidth{AS: 65535, BytesPerSecond: 125000}, []byte{0x40, 0x04, 0xFF, 0xFF, 0x47, 0xF4, 0x24, 0x00}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.lb.extCommunity().Serialize()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("community % x, want % x", got, tt.want)
			}
		})
	}
}

// TestLinkBandwidthPath: the route's path carries the community only when set, next to the other
// attributes; a change of bandwidth alone is a change of the route (SetAdvertisements sends it).
func TestLinkBandwidthPath(t *testing.T) {
	pfx := netip.MustParsePrefix("203.0.113.10/32")
	with := route{prefix: pfx, linkBW: LinkBandwidth{AS: 64513, BytesPerSecond: 375000}}
	p, err := apiPath(with, false)
	if err != nil {
		t.Fatal(err)
	}
	var ext *bgp.PathAttributeExtendedCommunities
	for _, a := range p.Attrs {
		if e, ok := a.(*bgp.PathAttributeExtendedCommunities); ok {
			ext = e
		}
	}
	if ext == nil || len(ext.Value) != 1 {
		t.Fatalf("path attributes %v: want one extended community", p.Attrs)
	}
	if lb, ok := ext.Value[0].(*bgp.LinkBandwidthExtended); !ok || lb.AS != 64513 || lb.Bandwidth != 375000 {
		t.Errorf("extended community %v, want link bandwidth 64513:375000", ext.Value[0])
	}
	p, err = apiPath(route{prefix: pfx}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Attrs {
		if _, ok := a.(*bgp.PathAttributeExtendedCommunities); ok {
			t.Errorf("route without link bandwidth carries %v", a)
		}
	}
	other := with
	other.linkBW.BytesPerSecond = 125000
	if with.equal(other) {
		t.Error("routes differing only in link bandwidth compare equal")
	}
}

func TestLinkBandwidthValidate(t *testing.T) {
	pfx := netip.MustParsePrefix("203.0.113.10/32")
	for _, bw := range []float32{float32(math.NaN()), float32(math.Inf(1)), -1} {
		if _, err := toRoute(Advertisement{Prefix: pfx, LinkBandwidth: LinkBandwidth{AS: 1, BytesPerSecond: bw}}); err == nil || !strings.Contains(err.Error(), "link bandwidth") {
			t.Errorf("bandwidth %v: error %v, want a link bandwidth error", bw, err)
		}
	}
	r, err := toRoute(Advertisement{Prefix: pfx, LinkBandwidth: LinkBandwidth{AS: 1, BytesPerSecond: 125000}})
	if err != nil || r.linkBW.BytesPerSecond != 125000 {
		t.Errorf("toRoute = %+v, %v", r, err)
	}
	// Two advertisements of one prefix with different bandwidths conflict (one path per prefix).
	_, err = normalizeAds([]Advertisement{{Prefix: pfx, LinkBandwidth: LinkBandwidth{AS: 1, BytesPerSecond: 125000}}, {Prefix: pfx}})
	if err == nil || !strings.Contains(err.Error(), "conflicts") {
		t.Errorf("normalizeAds error %v, want a conflict", err)
	}
}
