package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/routers"
)

// frrExtCommunity is the "Extended Community:" line of FRR's best path for prefix ("" when the
// path has none).
func frrExtCommunity(f *routers.FRR, prefix netip.Prefix) (string, error) {
	afi := "ipv4"
	if prefix.Addr().Is6() {
		afi = "ipv6"
	}
	out, err := f.Vtysh(fmt.Sprintf("show bgp %s unicast %s", afi, prefix))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Extended Community: "); ok {
			return v, nil
		}
	}
	return "", nil
}

// TestFRRLinkBandwidth: FRR reads the link bandwidth community as sent, over iBGP (IPv4) and eBGP
// (IPv6, a 4-octet AS sent as AS_TRANS); a change of the bandwidth alone replaces the route in
// place (FRR never loses it) and dropping it removes the community.
func TestFRRLinkBandwidth(t *testing.T) {
	pair, frr, sp := frrLab(t, false)
	p4, p6 := labPeers(pair)
	p4.Name, p6.Name = "frr4", "frr6"
	if err := sp.SetPeers(p4, p6); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	for _, a := range []netip.Addr{pair.SpeakerV4, pair.SpeakerV6} {
		if err := routers.WaitEstablished(frr, a, 30*time.Second); err != nil {
			t.Fatalf("session with %s: %v", a, err)
		}
	}
	set := func(bw4, bw6 float32) {
		t.Helper()
		if err := sp.SetAdvertisements(
			Advertisement{Prefix: vip4, LinkBandwidth: LinkBandwidth{AS: ibgpASN, BytesPerSecond: bw4}},
			Advertisement{Prefix: vip6, LinkBandwidth: LinkBandwidth{AS: 4200000000, BytesPerSecond: bw6}},
		); err != nil {
			t.Fatalf("SetAdvertisements: %v", err)
		}
	}
	wait := func(prefix netip.Prefix, want string) {
		t.Helper()
		var got string
		err := routers.WaitFor(10*time.Second, func() (bool, error) {
			var err error
			got, err = frrExtCommunity(frr, prefix)
			return got == want, err
		})
		if err != nil {
			t.Fatalf("%s: FRR's extended community %q, want %q: %v", prefix, got, want, err)
		}
	}
	set(375000, 125000)
	wait(vip4, "LB:64512:375000 (3.000 Mbps)")
	wait(vip6, "LB:23456:125000 (1.000 Mbps)")

	stop := watchRoute(frr, vip4)
	set(125000, 125000)
	wait(vip4, "LB:64512:125000 (1.000 Mbps)")
	set(0, 0)
	wait(vip4, "")
	wait(vip6, "")
	if gaps := stop(); len(gaps) > 0 {
		t.Errorf("%s left FRR's table while only its link bandwidth changed: %v", vip4, gaps)
	}
}
