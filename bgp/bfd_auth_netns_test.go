package bgp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/bgp/bfd"
	"github.com/vipgate/vipgate/test/routers"
)

const (
	bfdTestKey   = "vg-bfd-s3cret"
	bfdTestKeyID = 7
)

// birdBFDAuthConfig is birdBFDConfig with BIRD's BFD sessions authenticated by auth (a BIRD
// "authentication" value, empty for none) with bfdTestKey under bfdTestKeyID.
func birdBFDAuthConfig(routerID netip.Addr, auth string, peers ...routers.BIRDPeer) string {
	cfg := routers.BIRDConfig(routerID, peers...)
	cfg = strings.ReplaceAll(cfg, "  direct;\n", "  direct;\n  bfd on;\n")
	var a string
	if auth != "" {
		a = fmt.Sprintf("    authentication %s;\n    password %q { id %d; };\n", auth, bfdTestKey, bfdTestKeyID)
	}
	return cfg + "protocol bfd {\n  interface \"*\" {\n    min rx interval 300 ms;\n    min tx interval 300 ms;\n    multiplier 3;\n" + a + "  };\n}\n"
}

// forgedBFD is a BFD Control packet with the given discriminators, signed with key under the
// test's key ID when auth is set.
func forgedBFD(state bfd.State, diag bfd.Diag, my, your uint32, auth bfd.AuthType, seq uint32, key string) []byte {
	p := bfd.Packet{State: state, Diag: diag, DetectMult: 3, MyDiscr: my, YourDiscr: your,
		DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond}
	if auth == bfd.AuthNone {
		return p.Append(nil)
	}
	p.AuthPresent = true
	p.Auth = bfd.AuthSection{Type: auth, KeyID: bfdTestKeyID, Seq: seq}
	return p.AppendSigned(nil, key)
}

// captureBFD records count BFD packets (UDP payloads) from src to port 3784 on interface ifname of
// namespace ns, as an attacker on the link would, with tcpdump.
func captureBFD(t *testing.T, ns, ifname string, src netip.Addr, count int) [][]byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "bfd.pcap")
	argv := routers.InNetns(ns, "tcpdump", "-Z", "root", "-n", "-U", "-i", ifname, "-w", file, "-c", fmt.Sprint(count),
		"udp", "and", "src", "host", src.String(), "and", "dst", "port", fmt.Sprint(bfd.SingleHopPort))
	cmd := exec.Command(argv[0], argv[1:]...)
	done := make(chan error, 1)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tcpdump: %v: %s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("tcpdump did not see %d BFD packets in 20s: %s", count, out.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return pcapUDPPayloads(t, b)
}

// pcapUDPPayloads reads the UDP payloads of the IPv4-over-Ethernet frames of a pcap file
// (microsecond format, little-endian, as tcpdump writes it here).
func pcapUDPPayloads(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatalf("not a little-endian Ethernet pcap file: % x", b[:min(len(b), 24)])
	}
	var out [][]byte
	for b = b[24:]; len(b) >= 16; {
		n := int(binary.LittleEndian.Uint32(b[8:]))
		if len(b) < 16+n {
			break
		}
		frame := b[16 : 16+n]
		b = b[16+n:]
		if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ip := frame[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		out = append(out, append([]byte(nil), ip[ihl+8:]...))
	}
	return out
}

// bfdLabWithAuth starts BIRD with BFD authenticated by birdAuth and a Speaker whose BFD session
// with it uses auth, and waits for BGP and BFD to be up.
func bfdLabWithAuth(t *testing.T, birdAuth string, auth BFDAuth) (*routers.Pair, *routers.BIRD, *remoteSpeaker) {
	t.Helper()
	routers.RequireRoot(t, "bird", "birdc", "tcpdump")
	pair := routers.NewPair(t)
	bird := routers.StartBIRD(t, pair.Router, birdBFDAuthConfig(pair.RouterV4, birdAuth,
		routers.BIRDPeer{Name: "spk4", Local: pair.RouterV4, LocalASN: routerASN, Neighbor: pair.SpeakerV4, PeerASN: ibgpASN}))
	sp := startSpeaker(t, pair.Speaker, pair.SpeakerV4, -1)
	p4, _ := labPeers(pair)
	p4.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3, Auth: auth}
	if err := sp.SetPeers(p4); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if st, err := sp.waitStatus(30*time.Second, func(st []PeerStatus) bool {
		return len(st) == 1 && st[0].State == StateEstablished && st[0].BFD == BFDUp
	}); err != nil {
		out, _ := bird.Birdc("show", "bfd", "sessions")
		t.Fatalf("session with BFD up: %v (%+v)\n%s", err, st, out)
	}
	if err := routers.WaitFor(10*time.Second, func() (bool, error) {
		out, err := bird.Birdc("show", "bfd", "sessions")
		return strings.Contains(out, " Up "), err
	}); err != nil {
		t.Fatalf("BIRD's BFD session not up: %v", err)
	}
	// Let both sides settle (BIRD's BGP learns of BFD Up through its event loop; a Down before
	// that does not reset BGP) before the tests read discriminators and forge packets.
	time.Sleep(1500 * time.Millisecond)
	if est, up := birdSession(bird, pair.SpeakerV4); !est || !up {
		t.Fatalf("BIRD not settled: BGP established %v, BFD up %v", est, up)
	}
	return pair, bird, sp
}

// birdSession reads BIRD's BGP state of spk4 and whether its BFD session is Up.
func birdSession(bird *routers.BIRD, speaker netip.Addr) (established, bfdUp bool) {
	established, _ = bird.Established(speaker)
	out, _ := bird.Birdc("show", "bfd", "sessions")
	return established, strings.Contains(out, " Up ")
}

var meticulousSHA1 = BFDAuth{Type: "meticulous-keyed-sha1", KeyID: bfdTestKeyID, Key: bfdTestKey}

// TestBIRDBFDAuth: BFD with BIRD authenticated by meticulous keyed SHA1 on both sides comes Up.
// Then an attacker on the link, who sees the discriminators but has not the key, sends:
//   - to vipgate, as the router (source address, TTL 255, the right discriminators): a Down
//     without authentication, a Down signed with a wrong key, and BIRD's own packets recorded
//     earlier on the link (replays). vipgate drops every one, counts it under its reason, and
//     its session stays Up;
//   - to BIRD, as vipgate: a Down without authentication and one with a wrong key. Without
//     authentication that one packet takes BIRD's BFD session down and BIRD resets BGP
//     (TestBIRDBFDSpoofedDownWithoutAuth); here BIRD drops them: BFD and BGP stay up.
//
// Before authentication existed, BIRD's authenticated packets were all dropped (the A bit) and
// the sessions never came Up.
func TestBIRDBFDAuth(t *testing.T) {
	pair, bird, sp := bfdLabWithAuth(t, "meticulous keyed sha1", meticulousSHA1)
	ss := sp.BFDSessions()
	if len(ss) != 1 || ss[0].Auth != bfd.AuthMeticulousKeyedSHA1 || !ss[0].AuthSeqKnown {
		t.Fatalf("vipgate's BFD session: %+v; want meticulous keyed SHA1 with BIRD's sequence known", ss)
	}
	ours, birds := ss[0].LocalDiscr, ss[0].RemoteDiscr
	recorded := captureBFD(t, pair.Speaker, pair.SpeakerIf, pair.RouterV4, 4)
	before := sp.Metrics()

	const n = 5
	toUs := netip.AddrPortFrom(pair.SpeakerV4, bfd.SingleHopPort)
	ds := []datagram{
		{From: pair.RouterV4, To: toUs, TTL: 255, Count: n, Payload: forgedBFD(bfd.StateDown, bfd.DiagPathDown, birds, ours, bfd.AuthNone, 0, "")},
		{From: pair.RouterV4, To: toUs, TTL: 255, Count: n, Payload: forgedBFD(bfd.StateDown, bfd.DiagPathDown, birds, ours, bfd.AuthMeticulousKeyedSHA1, ss[0].RcvAuthSeq+1, "guessed")},
	}
	for _, r := range recorded {
		ds = append(ds, datagram{From: pair.RouterV4, To: toUs, TTL: 255, Count: 1, Payload: r})
	}
	toBIRD := netip.AddrPortFrom(pair.RouterV4, bfd.SingleHopPort)
	ds = append(ds,
		datagram{From: pair.SpeakerV4, To: toBIRD, TTL: 255, Count: n, Payload: forgedBFD(bfd.StateDown, bfd.DiagPathDown, ours, birds, bfd.AuthNone, 0, "")},
		datagram{From: pair.SpeakerV4, To: toBIRD, TTL: 255, Count: n, Payload: forgedBFD(bfd.StateDown, bfd.DiagPathDown, ours, birds, bfd.AuthMeticulousKeyedSHA1, 1<<31, "guessed")})
	var toSpeaker, toRouter []datagram
	for _, d := range ds {
		if d.To == toUs {
			toSpeaker = append(toSpeaker, d)
		} else {
			toRouter = append(toRouter, d)
		}
	}
	sendDatagrams(t, pair.Router, toSpeaker)
	sendDatagrams(t, pair.Speaker, toRouter)
	// BIRD's detection time of us is 900 ms: had a forged Down been taken, its BFD session and
	// then BGP would be down by now.
	time.Sleep(2 * time.Second)

	after := sp.Metrics()
	for reason, want := range map[string]float64{"authentication": n, "auth_digest": n, "auth_sequence": float64(len(recorded))} {
		key := fmt.Sprintf(`vipgate_bgp_bfd_dropped_packets_total{reason=%q}`, reason)
		b, _ := metricValue(before, key)
		a, ok := metricValue(after, key)
		if !ok || a-b < want {
			t.Errorf("%s went from %v to %v (present %v), want +%v", key, b, a, ok, want)
		}
	}
	for _, key := range []string{`vipgate_bgp_bfd_failures_total{peer="bird4"}`, `vipgate_bgp_bfd_transitions_total{peer="bird4",state="down"}`} {
		b, _ := metricValue(before, key)
		if a, _ := metricValue(after, key); a != b {
			t.Errorf("%s went from %v to %v: a forged packet took vipgate's session down", key, b, a)
		}
	}
	if st := sp.Status(); len(st) != 1 || st[0].State != StateEstablished || st[0].BFD != BFDUp {
		t.Errorf("vipgate after the forged packets: %+v", st)
	}
	if est, up := birdSession(bird, pair.SpeakerV4); !est || !up {
		out, _ := bird.Birdc("show", "bfd", "sessions")
		t.Errorf("BIRD after the forged packets: BGP established %v, BFD up %v\n%s", est, up, out)
	}
	log, _ := os.ReadFile(filepath.Join(bird.Dir, "bird.log"))
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(strings.ToLower(line), "auth") {
			t.Logf("BIRD: %s", line)
		}
	}
}

// TestBIRDBFDDeadPeerReplayed: with meticulous keyed SHA1, BIRD dies and an attacker on the link
// keeps sending, as BIRD, Up packets with the right discriminators (unauthenticated, signed with
// a guessed key, and BIRD's own packets recorded before it died). vipgate's session still goes
// Down within the detection time and resets BGP. (Without authentication, such packets would
// keep the session Up for as long as they come: the TTL of 255 and the discriminators are all an
// attacker on the link needs.)
func TestBIRDBFDDeadPeerReplayed(t *testing.T) {
	pair, bird, sp := bfdLabWithAuth(t, "meticulous keyed sha1", meticulousSHA1)
	ss := sp.BFDSessions()
	if len(ss) != 1 {
		t.Fatalf("BFD sessions %+v", ss)
	}
	ours, birds := ss[0].LocalDiscr, ss[0].RemoteDiscr
	recorded := captureBFD(t, pair.Speaker, pair.SpeakerIf, pair.RouterV4, 10)
	before := sp.Metrics()
	toUs := netip.AddrPortFrom(pair.SpeakerV4, bfd.SingleHopPort)
	const every = 50 * time.Millisecond
	// BIRD's recorded packets first, newest first (the best chance of the window), then Up
	// packets signed with a guessed key, then unauthenticated ones: 3.5 s of packets in all.
	var ds []datagram
	for i := len(recorded) - 1; i >= 0; i-- {
		ds = append(ds, datagram{From: pair.RouterV4, To: toUs, TTL: 255, Count: 2, Interval: every, Payload: recorded[i]})
	}
	ds = append(ds,
		datagram{From: pair.RouterV4, To: toUs, TTL: 255, Count: 10, Interval: every,
			Payload: forgedBFD(bfd.StateUp, bfd.DiagNone, birds, ours, bfd.AuthMeticulousKeyedSHA1, ss[0].RcvAuthSeq+100, "guessed")},
		datagram{From: pair.RouterV4, To: toUs, TTL: 255, Count: 40, Interval: every,
			Payload: forgedBFD(bfd.StateUp, bfd.DiagNone, birds, ours, bfd.AuthNone, 0, "")})
	bird.Stop()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		sendDatagrams(t, pair.Router, ds)
	}()
	// The deadline is the bound, not a measurement: 900 ms of detection time plus the reset.
	_, err := sp.waitStatus(10*time.Second, func(st []PeerStatus) bool { return len(st) == 1 && st[0].BFD == BFDDown })
	<-sent
	if err != nil {
		t.Fatalf("vipgate's BFD session with a dead BIRD, whose packets an attacker replays: %v (%+v)", err, sp.Status())
	}
	after := sp.Metrics()
	key := `vipgate_bgp_bfd_failures_total{peer="bird4"}`
	if b, _ := metricValue(before, key); func() bool { a, _ := metricValue(after, key); return a != b+1 }() {
		a, _ := metricValue(after, key)
		t.Errorf("%s went from %v to %v, want one failure", key, b, a)
	}
	// BIRD's recorded packets arrive within the detection time: out of the window. The forgeries
	// after them may arrive once the session is Down with a new discriminator (an authenticated
	// session renews it at every expiry), so they are dropped as unknown.
	sum := func(m string, reasons ...string) (n float64) {
		for _, r := range reasons {
			v, _ := metricValue(m, fmt.Sprintf(`vipgate_bgp_bfd_dropped_packets_total{reason=%q}`, r))
			n += v
		}
		return n
	}
	for _, reasons := range [][]string{{"auth_sequence"}, {"authentication", "auth_digest", "unknown_discriminator"}} {
		if b, a := sum(before, reasons...), sum(after, reasons...); a <= b {
			t.Errorf("%v: %v before, %v after: the attacker's packets were not dropped", reasons, b, a)
		}
	}
}

// TestBIRDBFDSpoofedDownWithoutAuth is the attack the authentication stops, run without it: one
// Down with the right discriminators, sent from the link with vipgate's address and TTL 255,
// takes BIRD's BFD session down (BIRD tells us with its own Down, which vipgate counts as a
// transition to down). Whether BIRD then resets BGP depends on whether its BGP protocol sees the
// Down before the sessions are Up again (about half of the runs here). It checks that the forged
// packets of TestBIRDBFDAuth are the real thing, and documents what an unauthenticated session
// is exposed to.
func TestBIRDBFDSpoofedDownWithoutAuth(t *testing.T) {
	pair, bird, sp := bfdLabWithAuth(t, "", BFDAuth{})
	ss := sp.BFDSessions()
	if len(ss) != 1 {
		t.Fatalf("BFD sessions %+v", ss)
	}
	ours, birds := ss[0].LocalDiscr, ss[0].RemoteDiscr
	downs := func() float64 {
		v, _ := metricValue(sp.Metrics(), `vipgate_bgp_bfd_transitions_total{peer="bird4",state="down"}`)
		return v
	}
	before := downs()
	sendDatagrams(t, pair.Speaker, []datagram{{From: pair.SpeakerV4, To: netip.AddrPortFrom(pair.RouterV4, bfd.SingleHopPort), TTL: 255, Count: 1,
		Payload: forgedBFD(bfd.StateDown, bfd.DiagPathDown, ours, birds, bfd.AuthNone, 0, "")}})
	if err := routers.WaitFor(5*time.Second, func() (bool, error) { return downs() > before, nil }); err != nil {
		out, _ := bird.Birdc("show", "bfd", "sessions")
		t.Fatalf("BIRD's BFD session after one spoofed BFD Down, without authentication: not taken down (%v)\n%s", err, out)
	}
	_ = routers.WaitFor(2*time.Second, func() (bool, error) {
		est, _ := birdSession(bird, pair.SpeakerV4)
		return !est, nil
	})
	est, _ := birdSession(bird, pair.SpeakerV4)
	t.Logf("BIRD's BGP session reset by the spoofed Down: %v", !est)
}

// TestBIRDBFDForgedTimers: BIRD dies and, right after its last packet, one forged packet from the
// link (BIRD's address, TTL 255, the right discriminators, no authentication) claims the largest
// timers: Detect Mult 255 and a Desired Min TX Interval of 2^32-1 us, 12.7 days of detection time.
// vipgate's session still goes Down, within the 5 s bound, and resets BGP. Before the bound it
// stayed Up (the deadline below expired).
func TestBIRDBFDForgedTimers(t *testing.T) {
	pair, bird, sp := bfdLabWithAuth(t, "", BFDAuth{})
	ss := sp.BFDSessions()
	if len(ss) != 1 {
		t.Fatalf("BFD sessions %+v", ss)
	}
	p := bfd.Packet{State: bfd.StateUp, DetectMult: 255, MyDiscr: ss[0].RemoteDiscr, YourDiscr: ss[0].LocalDiscr,
		DesiredMinTx: time.Duration(1<<32-1) * time.Microsecond, RequiredMinRx: 300 * time.Millisecond}
	bird.Stop()
	sendDatagrams(t, pair.Router, []datagram{{From: pair.RouterV4, To: netip.AddrPortFrom(pair.SpeakerV4, bfd.SingleHopPort), TTL: 255, Count: 1, Payload: p.Append(nil)}})
	sent := time.Now()
	if _, err := sp.waitStatus(15*time.Second, func(st []PeerStatus) bool { return len(st) == 1 && st[0].BFD == BFDDown }); err != nil {
		t.Fatalf("vipgate's BFD session with a dead BIRD after a packet claiming 12.7 days of detection time: %v (%+v)", err, sp.BFDSessions())
	}
	t.Logf("down %v after the forged packet (bound %v)", time.Since(sent).Round(10*time.Millisecond), bfd.DefaultMaxDetectTime)
	if v, _ := metricValue(sp.Metrics(), `vipgate_bgp_bfd_failures_total{peer="bird4"}`); v != 1 {
		t.Errorf("BFD failures %v, want 1", v)
	}
}
