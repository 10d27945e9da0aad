package l2

import (
	"net/netip"
	"testing"
	"time"
)

// TestAnnouncerQuietInterfaces: a VIP answered on two interfaces but announced on one sends its
// takeover announcement there only, and answers requests on both.
func TestAnnouncerQuietInterfaces(t *testing.T) {
	h := newFakeHost(eth0, eth1)
	a, _ := newTestAnnouncer(t, Options{Repeats: []time.Duration{time.Millisecond}}, h)
	if err := a.SetOwnedWhere(map[netip.Addr]Where{vip4: {Answer: []string{"eth0", "eth1"}, Announce: []string{"eth0"}}}); err != nil {
		t.Fatal(err)
	}
	for _, iface := range []string{"eth0", "eth1"} {
		if got := a.owns(vip4, iface); got != DropNone {
			t.Errorf("owns(%s, %s) = %v, want answered", vip4, iface, got)
		}
	}
	// The immediate announcement (2 frames) and one repeat (2 more) on eth0; nothing on eth1.
	eventually(t, "the repeat on eth0", func() bool { return len(h.lastARP(t, "eth0").frames()) == 4 })
	a.Close() // waits for the repeats
	if n := len(h.lastARP(t, "eth1").frames()); n != 0 {
		t.Errorf("eth1 (answer only): %d ARP frames sent, want none", n)
	}
	if n := len(h.lastARP(t, "eth0").frames()); n != 4 {
		t.Errorf("eth0: %d ARP frames, want 4", n)
	}
}

// TestAnnouncerAnnounceNilMeansAll: SetOwned (no Announce list) announces on every interface.
func TestAnnouncerAnnounceNilMeansAll(t *testing.T) {
	h := newFakeHost(eth0, eth1)
	a, _ := newTestAnnouncer(t, noRepeats, h)
	if err := a.SetOwnedWhere(map[netip.Addr]Where{vip4: {Answer: []string{"eth0", "eth1"}}}); err != nil {
		t.Fatal(err)
	}
	for _, iface := range []string{"eth0", "eth1"} {
		if n := len(h.lastARP(t, iface).frames()); n != 2 {
			t.Errorf("%s: %d ARP frames, want 2", iface, n)
		}
	}
}
