package bgp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"google.golang.org/protobuf/testing/protocmp"
)

var testRouterID = netip.MustParseAddr("192.0.2.2")

func goodPeer(name, addr string) PeerConfig {
	return PeerConfig{Name: name, MyASN: 64512, PeerASN: 64513, PeerAddress: netip.MustParseAddr(addr)}
}

func TestValidatePeers(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*PeerConfig)
		wantErr string // "" = valid
	}{
		{"valid", func(*PeerConfig) {}, ""},
		{"iBGP with all options", func(p *PeerConfig) {
			p.PeerASN = p.MyASN
			p.HoldTime, p.KeepaliveTime, p.ConnectTime = 9*time.Second, 3*time.Second, 5*time.Second
			p.Password, p.EBGPMultiHop, p.GracefulRestart = "s3cret", true, true
			p.RouterID = testRouterID
			p.SourceAddress = netip.MustParseAddr("192.0.2.9")
			p.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3, EchoMode: true}
		}, ""},
		{"empty name", func(p *PeerConfig) { p.Name = "" }, "empty name"},
		{"myASN 0", func(p *PeerConfig) { p.MyASN = 0 }, "myASN"},
		{"peerASN 0", func(p *PeerConfig) { p.PeerASN = 0 }, "peerASN"},
		{"no address", func(p *PeerConfig) { p.PeerAddress = netip.Addr{} }, "invalid peerAddress"},
		{"unspecified address", func(p *PeerConfig) { p.PeerAddress = netip.IPv4Unspecified() }, "invalid peerAddress"},
		{"multicast address", func(p *PeerConfig) { p.PeerAddress = netip.MustParseAddr("224.0.0.5") }, "invalid peerAddress"},
		{"mapped address", func(p *PeerConfig) { p.PeerAddress = netip.MustParseAddr("::ffff:192.0.2.1") }, "plain IPv4"},
		{"source of other family", func(p *PeerConfig) { p.SourceAddress = netip.MustParseAddr("2001:db8::1") }, "different families"},
		{"other router ID", func(p *PeerConfig) { p.RouterID = netip.MustParseAddr("192.0.2.99") }, "routerID"},
		{"hold time too small", func(p *PeerConfig) { p.HoldTime = 2 * time.Second }, "below 3s"},
		{"keepalive above hold", func(p *PeerConfig) { p.HoldTime, p.KeepaliveTime = 9*time.Second, 10*time.Second }, "above holdTime"},
		{"connect time too small", func(p *PeerConfig) { p.ConnectTime = time.Millisecond }, "connectTime"},
		{"password too long", func(p *PeerConfig) { p.Password = strings.Repeat("x", 81) }, "password"},
		{"BFD multiplier too big", func(p *PeerConfig) { p.BFD = &BFDProfile{DetectMultiplier: 256} }, "detectMultiplier"},
		{"BFD interval below 1ms", func(p *PeerConfig) { p.BFD = &BFDProfile{TransmitInterval: time.Microsecond} }, "below 1ms"},
		{"BFD minimum TTL above 254", func(p *PeerConfig) { p.BFD = &BFDProfile{MinimumTTL: 255} }, "minimumTtl"},
		{"BFD auth type unknown", func(p *PeerConfig) { p.BFD = &BFDProfile{Auth: BFDAuth{Type: "simple-password", Key: "x"}} }, "unknown BFD authentication type"},
		{"BFD auth key too long", func(p *PeerConfig) {
			p.BFD = &BFDProfile{Auth: BFDAuth{Type: "keyed-sha1", Key: "123456789012345678901"}}
		}, "at most 20"},
		{"BFD auth without key", func(p *PeerConfig) { p.BFD = &BFDProfile{Auth: BFDAuth{Type: "keyed-md5"}} }, "without a key"},
		{"BFD maximum detection time negative", func(p *PeerConfig) { p.BFD = &BFDProfile{MaxDetectTime: -1} }, "maximum detection time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := goodPeer("r1", "192.0.2.1")
			tt.mutate(&p)
			other := goodPeer("r2", "2001:db8:1::1")
			valid, err := validatePeers([]PeerConfig{p, other}, testRouterID)
			if _, ok := valid["r2"]; !ok {
				t.Errorf("the good peer r2 was dropped: %v", err)
			}
			if tt.wantErr == "" {
				if err != nil || len(valid) != 2 {
					t.Errorf("want both peers valid, got %d, err %v", len(valid), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tt.wantErr)
			}
			if len(valid) != 1 {
				t.Errorf("want only r2 valid, got %v", valid)
			}
		})
	}
}

func TestValidatePeersDuplicates(t *testing.T) {
	valid, err := validatePeers([]PeerConfig{
		goodPeer("a", "192.0.2.1"),
		goodPeer("a", "192.0.2.3"),  // same name
		goodPeer("b", "192.0.2.1"),  // same address as a
		goodPeer("c", "192.0.2.10"), // fine
	}, testRouterID)
	if got := slices.Sorted(func(yield func(string) bool) {
		for k := range valid {
			if !yield(k) {
				return
			}
		}
	}); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("valid peers %v, want [a c]", got)
	}
	for _, want := range []string{"peer a: duplicate name", "peer b: address 192.0.2.1 already used by peer a"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

func TestNormalizeAds(t *testing.T) {
	p := netip.MustParsePrefix
	routes, err := normalizeAds([]Advertisement{
		{Prefix: p("203.0.113.10/32"), LocalPref: 150, Communities: []string{"65000:2", "65000:1", "65000:1"}, Peers: []string{"b"}},
		// Same prefix and attributes: peers are merged.
		{Prefix: p("203.0.113.10/32"), LocalPref: 150, Communities: []string{"65000:1", "65000:2"}, Peers: []string{"a"}},
		// Same prefix, other attributes: rejected.
		{Prefix: p("203.0.113.10/32"), LocalPref: 200},
		// Host bits are masked; no peer list means all peers, which wins over a list.
		{Prefix: p("198.51.100.7/24"), LargeCommunities: []string{"65000:1:2"}, Peers: []string{"a"}},
		{Prefix: p("198.51.100.0/24"), LargeCommunities: []string{"65000:1:2"}},
		{Prefix: p("2001:db8:ff::10/128"), Communities: []string{"no-export"}},
		{Prefix: p("203.0.113.11/32"), Communities: []string{"65536:1"}},
		{Prefix: p("203.0.113.12/32"), LargeCommunities: []string{"1:2"}},
		{Prefix: netip.Prefix{}},
	})
	want := map[netip.Prefix]route{
		p("203.0.113.10/32"):     {prefix: p("203.0.113.10/32"), localPref: 150, communities: []uint32{65000<<16 | 1, 65000<<16 | 2}, peers: []string{"a", "b"}},
		p("198.51.100.0/24"):     {prefix: p("198.51.100.0/24"), large: [][3]uint32{{65000, 1, 2}}},
		p("2001:db8:ff::10/128"): {prefix: p("2001:db8:ff::10/128"), communities: []uint32{0xFFFFFF01}},
	}
	if diff := cmp.Diff(want, routes, cmp.AllowUnexported(route{}), cmpNet); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	for _, e := range []string{"203.0.113.10/32: conflicts", "203.0.113.11/32: community", "203.0.113.12/32: large community", "invalid prefix"} {
		if err == nil || !strings.Contains(err.Error(), e) {
			t.Errorf("error %v lacks %q", err, e)
		}
	}
}

func TestParseCommunity(t *testing.T) {
	for in, want := range map[string]uint32{"65000:100": 65000<<16 | 100, "0:0": 0, "graceful-shutdown": 0xFFFF0000, "NO-EXPORT": 0xFFFFFF01} {
		if got, err := ParseCommunity(in); err != nil || got != want {
			t.Errorf("ParseCommunity(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, in := range []string{"", "65000", "65536:1", "1:65536", "a:b", "1:2:3"} {
		if _, err := ParseCommunity(in); err == nil {
			t.Errorf("ParseCommunity(%q) succeeded", in)
		}
	}
	if got, err := ParseLargeCommunity("4294967295:1:2"); err != nil || got != [3]uint32{4294967295, 1, 2} {
		t.Errorf("ParseLargeCommunity = %v, %v", got, err)
	}
	for _, in := range []string{"1:2", "1:2:3:4", "4294967296:1:2", "a:1:2"} {
		if _, err := ParseLargeCommunity(in); err == nil {
			t.Errorf("ParseLargeCommunity(%q) succeeded", in)
		}
	}
}

func TestAPIPath(t *testing.T) {
	r := route{prefix: netip.MustParsePrefix("203.0.113.10/32"), localPref: 150,
		communities: []uint32{65000<<16 | 100}, large: [][3]uint32{{65000, 1, 2}}}
	tests := []struct {
		name   string
		r      route
		drain  bool
		family bgp.Family
		want   []string
	}{
		{"IPv4", r, false, bgp.RF_IPv4_UC, []string{"{Origin: i}", "{Nexthop: 0.0.0.0}", "{LocalPref: 150}", "{Communities: 65000:100}", "{LargeCommunity: [ 65000:1:2]}"}},
		{"IPv4 draining", r, true, bgp.RF_IPv4_UC, []string{"{Origin: i}", "{Nexthop: 0.0.0.0}", "{LocalPref: 0}", "{Communities: 65000:100, planned-shut}", "{LargeCommunity: [ 65000:1:2]}"}},
		{"IPv6 defaults", route{prefix: netip.MustParsePrefix("2001:db8:ff::10/128")}, false, bgp.RF_IPv6_UC, []string{"{Origin: i}", "{MpReach(ipv6-unicast): {Nexthop: ::, NLRIs: [2001:db8:ff::10/128:0]}}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := apiPath(tt.r, tt.drain)
			if err != nil {
				t.Fatal(err)
			}
			if p.Family != tt.family || p.Nlri.String() != tt.r.prefix.String() {
				t.Errorf("family %v NLRI %v, want %v %v", p.Family, p.Nlri, tt.family, tt.r.prefix)
			}
			var got []string
			for _, a := range p.Attrs {
				got = append(got, a.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("attributes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAPIPeer(t *testing.T) {
	p := PeerConfig{Name: "r1", MyASN: 64512, PeerASN: 64513, PeerAddress: netip.MustParseAddr("2001:db8:1::1"), PeerPort: 1179,
		SourceAddress: netip.MustParseAddr("2001:db8:1::2"), HoldTime: 9500 * time.Millisecond, Password: "pw", EBGPMultiHop: true,
		GracefulRestart: true, BFD: &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 200 * time.Millisecond, DetectMultiplier: 5}}
	want := &api.Peer{
		Conf:         &api.PeerConf{NeighborAddress: "2001:db8:1::1", PeerAsn: 64513, LocalAsn: 64512, AuthPassword: "pw", Description: "r1"},
		Timers:       &api.Timers{Config: &api.TimersConfig{ConnectRetry: 10, HoldTime: 9, IdleHoldTimeAfterReset: 5}},
		Transport:    &api.Transport{RemotePort: 1179, LocalAddress: "2001:db8:1::2"},
		EbgpMultihop: &api.EbgpMultihop{Enabled: true, MultihopTtl: 255},
		AfiSafis: []*api.AfiSafi{{
			Config:            &api.AfiSafiConfig{Family: familyIPv6, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		}},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: 120, DeferralTime: 15, LocalRestarting: true},
	}
	if diff := cmp.Diff(want, apiPeer(p, true), protocmp.Transform()); diff != "" {
		t.Errorf("apiPeer (-want +got):\n%s", diff)
	}
}
