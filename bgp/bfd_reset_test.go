package bgp

import (
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/routers"
)

// birdBFDConfig is BIRDConfig with BFD on every BGP session (300ms x3, as the speaker's profile).
// extra is added to every BGP protocol.
func birdBFDConfig(routerID netip.Addr, extra string, peers ...routers.BIRDPeer) string {
	cfg := routers.BIRDConfig(routerID, peers...)
	cfg = strings.ReplaceAll(cfg, "  direct;\n", "  direct;\n  bfd on;\n"+extra)
	return cfg + "protocol bfd {\n  interface \"*\" {\n    min rx interval 300 ms;\n    min tx interval 300 ms;\n    multiplier 3;\n  };\n}\n"
}

// TestBIRDBFDSessionReset: after a BGP session with BFD is reset, it must come back and stay up.
// This was the regression test of a GoBGP bug that vipgate worked around while it used GoBGP's BFD
// (a BFD failure while the session was not Established left a NOTIFICATION queued that killed the
// next session as soon as it was Established, and the one after it). vipgate's BFD resets only an
// Established session (bfd.go); these cases make BFD fail at every moment around a reset.
func TestBIRDBFDSessionReset(t *testing.T) {
	for _, tc := range []struct {
		reset string
		// extra BIRD BGP options; bound is how long the session may take to be stable again.
		extra string
		bound time.Duration
	}{
		// BIRD's config reload (or restart of the protocol): the session goes down first, and
		// BIRD's BFD session with it; ours fails ~1 detection time later, while BGP is Idle.
		{reset: "restart", bound: time.Minute},
		// One second of lost BFD: our BFD fails while the session is up (we reset it), BIRD's
		// too; BIRD waits out its error wait time (60s by default), and our BFD fails again
		// meanwhile, while the BGP session is down. The bound allows BIRD's doubled wait (BIRD
		// doubles it for each error within its forget time, 300s: its BFD's and our Cease can
		// be two): a CI run under load came back after ~110s, an idle machine after ~70s.
		{reset: "drop-bfd", bound: 3 * time.Minute},
		// The same with a short error wait: our reconnect races BIRD's BFD.
		{reset: "drop-bfd-short-wait", extra: "  error wait time 1, 5;\n", bound: time.Minute},
		// BFD failing while the session is down, then the session coming back: BIRD's protocol
		// is disabled (its BFD session goes away), ours fails while BGP is not Established,
		// then the protocol is enabled.
		{reset: "bfd-fails-while-down", bound: time.Minute},
	} {
		reset := tc.reset
		t.Run(reset, func(t *testing.T) {
			routers.RequireRoot(t, "bird", "birdc", "nft")
			pair := routers.NewPair(t)
			bird := routers.StartBIRD(t, pair.Router, birdBFDConfig(pair.RouterV4, tc.extra,
				routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN}))
			sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
			p4, _ := labPeers(pair)
			p4.GracefulRestart = true
			p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
			if err := sp.SetPeers(p4); err != nil {
				t.Fatalf("SetPeers: %v", err)
			}
			if err := sp.SetAdvertisements(Advertisement{Prefix: vip4}); err != nil {
				t.Fatalf("SetAdvertisements: %v", err)
			}
			bfdUp := func() {
				t.Helper()
				if _, err := sp.waitStatus(30*time.Second, func(st []PeerStatus) bool {
					return len(st) == 1 && st[0].State == StateEstablished && st[0].BFD == BFDUp
				}); err != nil {
					t.Fatalf("session with BFD up: %v (%+v)", err, sp.Status())
				}
			}
			bfdUp()

			switch reset {
			case "restart":
				// What a BIRD config reload that touches the protocol does: BIRD closes the
				// session and drops its BFD session with it.
				if out, err := bird.Birdc("restart", "spk4"); err != nil {
					t.Fatalf("birdc restart: %v: %s", err, out)
				}
			case "bfd-fails-while-down":
				if out, err := bird.Birdc("disable", "spk4"); err != nil {
					t.Fatalf("birdc disable: %v: %s", err, out)
				}
				if _, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool {
					return len(st) == 1 && st[0].State != StateEstablished
				}); err != nil {
					t.Fatalf("session still up after disabling it in BIRD: %v", err)
				}
				// Past our BFD's detection time: it fails (or BIRD said AdminDown) while BGP is down.
				if _, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool {
					return len(st) == 1 && st[0].BFD != BFDUp
				}); err != nil {
					t.Fatalf("BFD still up with BIRD's protocol disabled: %v", err)
				}
				time.Sleep(time.Second)
				if out, err := bird.Birdc("enable", "spk4"); err != nil {
					t.Fatalf("birdc enable: %v: %s", err, out)
				}
			default:
				// One second of lost BFD packets (300ms x3 detection): both sides reset.
				nft := func(args ...string) {
					t.Helper()
					argv := routers.InNetns(pair.Router, append([]string{"nft"}, args...)...)
					routers.MustRun(t, argv[0], argv[1:]...)
				}
				nft("add", "table", "inet", "bfddrop")
				nft("add", "chain", "inet", "bfddrop", "in", "{ type filter hook input priority 0; }")
				nft("add", "rule", "inet", "bfddrop", "in", "udp", "dport", "3784", "drop")
				time.Sleep(time.Second)
				nft("delete", "table", "inet", "bfddrop")
			}
			waitStable(t, bird, sp, pair.SpeakerV4, tc.bound)
			bfdUp()
			// What BFD did, for the record.
			if b, err := os.ReadFile(sp.log); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if strings.Contains(line, "BFD") {
						t.Logf("speaker: %s", line)
					}
				}
			}
			if _, err := routers.WaitRoute(bird, vip4, 10*time.Second); err != nil {
				t.Errorf("route after the reset: %v", err)
			}
		})
	}
}

// waitStable waits (bounded) until the session with addr has been Established, on both sides,
// without interruption for 10s.
func waitStable(t *testing.T, bird *routers.BIRD, sp *remoteSpeaker, addr netip.Addr, bound time.Duration) {
	t.Helper()
	const stable = 10 * time.Second
	var since time.Time
	downs := 0
	err := routers.WaitFor(bound, func() (bool, error) {
		up, err := bird.Established(addr)
		st := sp.Status()
		if err != nil || !up || len(st) != 1 || st[0].State != StateEstablished {
			if !since.IsZero() {
				downs++
			}
			since = time.Time{}
			return false, nil
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= stable, nil
	})
	if err != nil {
		out, _ := bird.Birdc("show", "protocols", "all", "spk4")
		t.Fatalf("session not stable for %s after the reset (%d drops seen after it was up): %v\nspeaker %+v\n%s",
			stable, downs, err, sp.Status(), out)
	}
	t.Logf("session stable for %s after the reset (%d drops seen after it was up)", stable, downs)
}
