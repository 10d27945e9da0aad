package bgp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/bgp/bfd"
	"github.com/vipgate/vipgate/test/routers"
)

// metricValue returns the value of the metric line that starts with prefix (name and labels).
func metricValue(text, prefix string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, prefix)), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestBIRDBFDBothFamiliesAndTimers: BFD with BIRD over IPv4 and IPv6; then new timers for both
// peers are applied in place (Poll Sequence): neither the BFD sessions nor the BGP sessions go down.
func TestBIRDBFDBothFamiliesAndTimers(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	pair := routers.NewPair(t)
	bird := routers.StartBIRD(t, pair.Router, birdBFDConfig(pair.RouterV4, "",
		routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN},
		routers.BIRDPeer{Name: "spk6", Local: pair.RouterV6, LocalASN: routerASN, Neighbor: pair.SpeakerV6, PeerASN: ebgpASN}))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, p6 := labPeers(pair)
	for _, p := range []*PeerConfig{&p4, &p6} {
		p.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	}
	if err := sp.SetPeers(p4, p6); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	bothUp := func(what string) {
		t.Helper()
		if st, err := sp.waitStatus(30*time.Second, func(st []PeerStatus) bool {
			return len(st) == 2 && st[0].State == StateEstablished && st[0].BFD == BFDUp && st[1].State == StateEstablished && st[1].BFD == BFDUp
		}); err != nil {
			out, _ := bird.Birdc("show", "bfd", "sessions")
			t.Fatalf("%s: %v (%+v)\n%s", what, err, st, out)
		}
	}
	bothUp("IPv4 and IPv6 sessions with BFD up")
	out, err := bird.Birdc("show", "bfd", "sessions")
	if err != nil || strings.Count(out, " Up ") != 2 {
		t.Errorf("BIRD's BFD sessions (want two Up): %v\n%s", err, out)
	}
	// BIRD's table of BFD sessions shows the intervals it uses towards us.
	t.Logf("BIRD:\n%s", out)

	before := sp.Metrics()
	for _, p := range []*PeerConfig{&p4, &p6} {
		p.BFD = &BFDProfile{ReceiveInterval: 200 * time.Millisecond, TransmitInterval: 100 * time.Millisecond, DetectMultiplier: 5}
	}
	if err := sp.SetPeers(p4, p6); err != nil {
		t.Fatalf("SetPeers with new BFD timers: %v", err)
	}
	time.Sleep(3 * time.Second)
	bothUp("after new BFD timers")
	after := sp.Metrics()
	for _, name := range []string{"bird4", "bird6"} {
		for _, state := range []string{"down", "up"} {
			key := fmt.Sprintf(`vipgate_bgp_bfd_transitions_total{peer=%q,state=%q}`, name, state)
			b, _ := metricValue(before, key)
			a, ok := metricValue(after, key)
			if !ok || a != b {
				t.Errorf("%s: %v before the timer change, %v after (present %v): the BFD session went down", key, b, a, ok)
			}
		}
		key := fmt.Sprintf(`vipgate_bgp_session_up{peer=%q}`, name)
		if v, _ := metricValue(after, key); v != 1 {
			t.Errorf("%s = %v after the BFD timer change", key, v)
		}
	}
	// The BGP sessions were not restarted for a BFD change: BIRD still counts one session each.
	out, _ = bird.Birdc("show", "protocols", "all", "spk4")
	if !strings.Contains(out, "Established") {
		t.Errorf("BIRD's spk4 after the BFD timer change:\n%s", out)
	}
	out, _ = bird.Birdc("show", "bfd", "sessions")
	t.Logf("BIRD after the timer change:\n%s", out)
}

// bfdPacket builds a BFD Control packet for the hostile-input test.
func bfdPacket(mod func(b []byte)) []byte {
	p := bfd.Packet{State: bfd.StateDown, DetectMult: 3, MyDiscr: 0x1234, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	b := p.Append(nil)
	if mod != nil {
		mod(b)
	}
	return b
}

// TestBFDHostileDatagrams sends malformed, off-link and stray datagrams to the speaker's BFD port
// while its session with BIRD is up: each is dropped and counted under its reason, and the session
// neither goes down nor reports a failure.
func TestBFDHostileDatagrams(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	pair := routers.NewPair(t)
	bird := routers.StartBIRD(t, pair.Router, birdBFDConfig(pair.RouterV4, "",
		routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN}))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, _ := labPeers(pair)
	p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if _, err := sp.waitStatus(30*time.Second, func(st []PeerStatus) bool {
		return len(st) == 1 && st[0].State == StateEstablished && st[0].BFD == BFDUp
	}); err != nil {
		t.Fatalf("session with BFD up: %v", err)
	}
	stranger := netip.MustParseAddr("192.0.2.9")
	routers.MustRun(t, "ip", "-n", pair.Router, "addr", "add", stranger.String()+"/24", "dev", pair.RouterIf)
	to := netip.AddrPortFrom(pair.SpeakerV4, bfd.SingleHopPort)
	const n = 5
	cases := []struct {
		reason  string
		from    netip.Addr
		ttl     int
		payload []byte
	}{
		{"ttl", pair.RouterV4, 64, bfdPacket(nil)},
		{"unknown_peer", stranger, 255, bfdPacket(nil)},
		{"short", pair.RouterV4, 255, bfdPacket(nil)[:20]},
		{"version", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[0] = 2<<5 | b[0]&0x1f })},
		{"length", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[3] = 200 })},
		{"zero_detect_mult", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[2] = 0 })},
		{"multipoint", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[1] |= 0x01 })},
		{"zero_my_discriminator", pair.RouterV4, 255, bfdPacket(func(b []byte) { binary.BigEndian.PutUint32(b[4:], 0) })},
		{"auth_type", pair.RouterV4, 255, append(bfdPacket(func(b []byte) { b[1] |= 0x04; b[3] = 26 }), 1, 2)},
		{"auth_malformed", pair.RouterV4, 255, append(bfdPacket(func(b []byte) { b[1] |= 0x04; b[3] = 26 }), 4, 28)},
		// A well-formed keyed SHA1 packet on a session without authentication.
		{"authentication", pair.RouterV4, 255, forgedBFD(bfd.StateDown, bfd.DiagNone, 0x1234, 0, bfd.AuthKeyedSHA1, 1, "k")},
		{"poll_and_final", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[1] |= 0x30 })},
		{"unknown_discriminator", pair.RouterV4, 255, bfdPacket(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 0xdeadbeef) })},
		{"zero_your_discriminator", pair.RouterV4, 255, bfdPacket(func(b []byte) { b[1] = byte(bfd.StateUp) << 6 })},
		{"truncated", pair.RouterV4, 255, make([]byte, 2000)},
	}
	var ds []datagram
	for _, c := range cases {
		ds = append(ds, datagram{From: c.from, To: to, TTL: c.ttl, Payload: c.payload, Count: n})
	}
	sendDatagrams(t, pair.Router, ds)
	time.Sleep(time.Second)
	m := sp.Metrics()
	for _, c := range cases {
		key := fmt.Sprintf(`vipgate_bgp_bfd_dropped_packets_total{reason=%q}`, c.reason)
		if v, ok := metricValue(m, key); !ok || v < n {
			t.Errorf("%s = %v (present %v), want >= %d", key, v, ok, n)
		}
	}
	st := sp.Status()
	if len(st) != 1 || st[0].BFD != BFDUp || st[0].State != StateEstablished {
		t.Errorf("status after the hostile datagrams: %+v", st)
	}
	if v, _ := metricValue(m, `vipgate_bgp_bfd_failures_total{peer="bird4"}`); v != 0 {
		t.Errorf("BFD failures after hostile datagrams: %v", v)
	}
	if out, _ := bird.Birdc("show", "bfd", "sessions"); !strings.Contains(out, " Up ") {
		t.Errorf("BIRD's BFD session after the hostile datagrams:\n%s", out)
	}
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "vipgate_bgp_bfd_dropped_packets_total") && !strings.HasSuffix(line, " 0") {
			t.Logf("%s", line)
		}
	}
}

// blockBGP drops TCP port 179 in namespace ns until the returned function is called.
func blockBGP(t *testing.T, ns string) (unblock func()) {
	t.Helper()
	nft := func(args ...string) {
		t.Helper()
		argv := routers.InNetns(ns, append([]string{"nft"}, args...)...)
		routers.MustRun(t, argv[0], argv[1:]...)
	}
	nft("add", "table", "inet", "bgpblock")
	for _, hook := range []string{"input", "output"} {
		nft("add", "chain", "inet", "bgpblock", hook, "{ type filter hook "+hook+" priority 0; }")
		nft("add", "rule", "inet", "bgpblock", hook, "tcp", "dport", "179", "drop")
		nft("add", "rule", "inet", "bgpblock", hook, "tcp", "sport", "179", "drop")
	}
	return func() { nft("delete", "table", "inet", "bgpblock") }
}

// TestFRRBFDRouterReplacesSession: FRR 8.4's bgpd creates its BFD session for a neighbor before BGP
// is up (local address 0.0.0.0) and replaces it once BGP is Established (the old session sends Down,
// "neighbor signaled session down", and goes; a new one with a new discriminator starts). The
// speaker normally holds BFD until BGP is Established, which avoids this; here the hold ends after
// 1 s while TCP 179 is blocked for 4 s, so BFD is Up with FRR's first session when BGP comes up.
// The speaker must take the replacement for what it is: no BGP reset from our side, BFD Up with
// the new session. (FRR's bgpd resets the session once by itself in that case: the new BFD
// session's first state, Down, follows the old one's Up in bgpd's bookkeeping. That one reset is
// FRR's and is allowed; any other is not.)
func TestFRRBFDRouterReplacesSession(t *testing.T) {
	routers.RequireRoot(t, "vtysh", "nft", "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "/usr/lib/frr/zebra")
	pair := routers.NewPair(t)
	cfg := routers.FRRConfig{
		BFDD: routers.FRRBFDConfig("fast", 100*time.Millisecond, 100*time.Millisecond, 3),
		// eBGP: bgpd registers the BFD session of an eBGP neighbor before BGP is up.
		BGPD: routers.FRRBGPConfig(pair.RouterV4, routerASN, routers.FRRPeer{Neighbor: pair.SpeakerV4, PeerASN: ebgpASN, BFDProfile: "fast"}),
	}
	frr := routers.StartFRR(t, pair.Router, cfg)
	unblock := blockBGP(t, pair.Router)
	sp := startSpeakerWith(t, pair.Speaker, helperRequest{Op: "start", RouterID: pair.SpeakerV4, ListenPort: -1, BFDFallback: time.Second})
	p4, _ := labPeers(pair)
	p4.MyASN = ebgpASN
	p4.BFD = &BFDProfile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond, DetectMultiplier: 3}
	start := time.Now()
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := routers.WaitFor(10*time.Second, func() (bool, error) { return frr.BFDUp(pair.SpeakerV4) }); err != nil {
		t.Fatalf("BFD with FRR's first session while BGP is blocked: %v", err)
	}
	first, err := frr.BFDPeers()
	if err != nil || len(first) != 1 {
		t.Fatalf("FRR's BFD sessions: %v %+v", err, first)
	}
	time.Sleep(time.Until(start.Add(4 * time.Second)))
	unblock()
	if err := routers.WaitEstablished(frr, pair.SpeakerV4, 30*time.Second); err != nil {
		t.Fatalf("BGP after the unblock: %v", err)
	}
	time.Sleep(8 * time.Second)
	peers, err := frr.BFDPeers()
	if err != nil || len(peers) != 1 || peers[0].Status != "up" || peers[0].ID == first[0].ID {
		t.Errorf("FRR's BFD sessions after BGP came up: %v %+v (first %+v); want one up, a new one", err, peers, first)
	}
	nbrs, err := frr.Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	nb := nbrs[pair.SpeakerV4]
	log, _ := os.ReadFile(sp.log)
	resets := strings.Count(string(log), "BFD failure: BGP session reset")
	t.Logf("FRR: %s, established %d, dropped %d (last reset %q); speaker resets for BFD: %d",
		nb.BGPState, nb.ConnectionsEstablished, nb.ConnectionsDropped, nb.LastResetDueTo, resets)
	if resets != 0 {
		t.Errorf("the speaker reset BGP for FRR's BFD session replacement")
	}
	// FRR's own reset is a Cease with subcode 10, "BFD down" (RFC 9384).
	frrResets := len(regexp.MustCompile(`Peer Down:.*notification-received code 6\(cease\) subcode 10`).FindAllString(string(log), -1))
	downs := strings.Count(string(log), "Peer Down")
	if nb.BGPState != "Established" || downs > 1 || downs != frrResets {
		t.Errorf("BGP with FRR: %s; %d sessions lost, %d of them by FRR's BFD-down Cease; want established, at most FRR's own reset",
			nb.BGPState, downs, frrResets)
	}
	if st := sp.Status(); len(st) != 1 || st[0].BFD != BFDUp || st[0].State != StateEstablished {
		t.Errorf("speaker: %+v", st)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if regexp.MustCompile(`BFD[ :]|Peer (Up|Down)`).MatchString(line) {
			t.Logf("speaker: %s", line)
		}
	}
}

// TestFRRBFDMultihop: an eBGP multi-hop peer gets a multi-hop BFD session (RFC 5883, UDP 4784),
// which FRR's bfdd runs for a neighbor with ebgp-multihop; a minimum TTL of 250 is accepted from a
// peer one hop away (TTL 255).
func TestFRRBFDMultihop(t *testing.T) {
	routers.RequireRoot(t, "vtysh", "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "/usr/lib/frr/zebra")
	pair := routers.NewPair(t)
	cfg := routers.FRRConfig{
		BFDD: routers.FRRBFDConfig("fast", 300*time.Millisecond, 300*time.Millisecond, 3),
		BGPD: routers.FRRBGPConfig(pair.RouterV4, routerASN, routers.FRRPeer{Neighbor: pair.SpeakerV4, PeerASN: ebgpASN, BFDProfile: "fast", EBGPMultihop: true}),
	}
	frr := routers.StartFRR(t, pair.Router, cfg)
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, _ := labPeers(pair)
	p4.MyASN = ebgpASN
	p4.EBGPMultiHop = true
	p4.SourceAddress = pair.SpeakerV4
	p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3, MinimumTTL: 250}
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := routers.WaitFor(30*time.Second, func() (bool, error) { return frr.BFDUp(pair.SpeakerV4) }); err != nil {
		out, _ := frr.Vtysh("show bfd peers")
		t.Fatalf("multi-hop BFD with FRR: %v\n%s\nspeaker %+v", err, out, sp.Status())
	}
	out, _ := frr.Vtysh("show bfd peers")
	if !strings.Contains(out, "multihop") {
		t.Errorf("FRR's session is not multi-hop:\n%s", out)
	}
	if _, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool { return len(st) == 1 && st[0].BFD == BFDUp }); err != nil {
		t.Errorf("speaker BFD: %v", err)
	}
}

// TestBFDCPUPerSession runs 50 BFD sessions at 100 ms x 3 between two standalone BFD servers (one
// per namespace, 50 addresses on each side) and reports the CPU time one side uses per session.
func TestBFDCPUPerSession(t *testing.T) {
	routers.RequireRoot(t)
	const sessions, window = 50, 10 * time.Second
	pair := routers.NewPair(t)
	var a, b []bfd.Config
	for i := range sessions {
		sa := netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)})
		ra := netip.AddrFrom4([4]byte{192, 0, 2, byte(200 + i)})
		routers.MustRun(t, "ip", "-n", pair.Speaker, "addr", "add", sa.String()+"/24", "dev", pair.SpeakerIf)
		routers.MustRun(t, "ip", "-n", pair.Router, "addr", "add", ra.String()+"/24", "dev", pair.RouterIf)
		a = append(a, bfd.Config{Peer: ra, Local: sa, DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond, DetectMult: 3})
		b = append(b, bfd.Config{Peer: sa, Local: ra, DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond, DetectMult: 3})
	}
	sa := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	sb := startSpeaker(t, pair.Router, pair.RouterV4, -1)
	if _, err := sa.call(helperRequest{Op: "bfd", BFD: a}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.call(helperRequest{Op: "bfd", BFD: b}); err != nil {
		t.Fatal(err)
	}
	allUp := func(r *remoteSpeaker) (bool, error) {
		resp, err := r.call(helperRequest{Op: "bfdstatus"})
		if err != nil {
			return false, err
		}
		up := 0
		for _, s := range resp.BFD {
			if s.State == bfd.StateUp && s.TxInterval == 100*time.Millisecond {
				up++
			}
		}
		return up == sessions, nil
	}
	if err := routers.WaitFor(20*time.Second, func() (bool, error) { return allUp(sa) }); err != nil {
		t.Fatalf("%d sessions up at 100 ms: %v", sessions, err)
	}
	r0, err := sa.call(helperRequest{Op: "rusage"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(window)
	r1, err := sa.call(helperRequest{Op: "rusage"})
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := sa.call(helperRequest{Op: "bfdstatus"})
	var fails uint64
	for _, s := range resp.BFD {
		fails += s.Failures
	}
	cpu := r1.CPU - r0.CPU
	// Each session sends and receives ~10 packets a second (jitter: 10-13).
	pkts := float64(sessions) * window.Seconds() * 2 * 10 / 0.875
	t.Logf("%d sessions at 100 ms x 3 for %v: %v CPU (%.2f%% of a core), %.1f µs per session-second, ~%.1f µs per packet sent or received; %d failures",
		sessions, window, cpu.Round(time.Millisecond), 100*cpu.Seconds()/window.Seconds(),
		float64(cpu.Microseconds())/sessions/window.Seconds(), float64(cpu.Microseconds())/pkts, fails)
	if fails != 0 {
		b, _ := os.ReadFile(sa.log)
		t.Errorf("%d BFD failures between two idle namespaces:\n%s", fails, tail(string(b), 40))
	}
}
