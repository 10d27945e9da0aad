package ctsync

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/gateway/ctsync/relay"
	"github.com/vipgate/vipgate/test/lab"
)

// testKey is the membership key of the relays in the tests.
var testKey = []byte("ctsync-test-key-0123456789abcdef")

// startRelay runs, in namespace ns, the relay between the conntrackd there (on loopback, as Render
// puts it) and the peer's relay at peer, as cmd/vipgate does; the function returned stops it (also
// at the test's end).
func startRelay(t *testing.T, ns string, local, peer netip.Addr, port uint16, keys [][]byte) (*relay.Relay, func()) {
	t.Helper()
	var r *relay.Relay
	err := lab.InNetns(ns, func() error {
		var err error
		r, err = relay.New(hclog.NewNullLogger(), relay.Config{Local: netip.AddrPortFrom(local, port), Peer: netip.AddrPortFrom(peer, port),
			Listen: netip.AddrPortFrom(RelayAddress, port), Daemon: netip.AddrPortFrom(DaemonAddress, port), Keys: keys}, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return r, stop
}

// syncLab is two network namespaces joined by a veth pair, on one LAN: the gateway "gw" at
// 192.0.2.11 and, at 192.0.2.12, the address of its peer, which the test gives to the real peer or
// to an attacker.
type syncLab struct {
	t              *testing.T
	gwNS, peerNS   string
	gwDev, peerDev string
	dir            string
}

var (
	labGW   = netip.MustParseAddr("192.0.2.11")
	labPeer = netip.MustParseAddr("192.0.2.12")
)

func newSyncLab(t *testing.T, suffix string) *syncLab {
	t.Helper()
	for _, bin := range []string{"conntrackd", "conntrack", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s", bin)
		}
	}
	_, gw := netnsOrSkip(t, suffix+"g")
	_, peer := netnsOrSkip(t, suffix+"p")
	veth := fmt.Sprintf("vga%d", os.Getpid()%100000)
	x := &syncLab{t: t, gwNS: gw, peerNS: peer, gwDev: veth + "g", peerDev: veth + "p", dir: t.TempDir()}
	x.sh("ip", "link", "add", x.gwDev, "netns", gw, "type", "veth", "peer", "name", x.peerDev, "netns", peer)
	for _, side := range []struct {
		ns, dev string
		a       netip.Addr
	}{{gw, x.gwDev, labGW}, {peer, x.peerDev, labPeer}} {
		x.sh("ip", "-n", side.ns, "addr", "add", side.a.String()+"/24", "dev", side.dev, "nodad")
		x.sh("ip", "-n", side.ns, "link", "set", side.dev, "up")
		x.sh("ip", "-n", side.ns, "link", "set", "lo", "up")
	}
	return x
}

func (x *syncLab) sh(args ...string) string {
	x.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// in runs a command in namespace ns.
func (x *syncLab) in(ns string, args ...string) string {
	x.t.Helper()
	return x.sh(append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// flows lists ns's TCP and UDP conntrack entries (one line each) whose original source is src.
func (x *syncLab) flows(ns, src string) []string {
	out, _ := exec.Command("ip", "netns", "exec", ns, "conntrack", "-L", "-s", src).CombinedOutput()
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "tcp ") || strings.HasPrefix(l, "udp ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// supervise runs a Supervisor of conntrackd in ns with cfg; edit, if set, rewrites the config it
// rendered before conntrackd starts (today's config, an attacker's). The function returned stops it.
func (x *syncLab) supervise(ns, name string, cfg Config, edit func(string) string) (*Supervisor, func()) {
	t := x.t
	t.Helper()
	dir := filepath.Join(x.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(dir, "conntrackd")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec ip netns exec "+ns+" conntrackd \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Dir, cfg.Port = filepath.Join(dir, "state"), 3780
	s, err := NewSupervisor(hclog.NewNullLogger(), cfg, wrapper, nil)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		conf := PathsOf(cfg.Dir).Config
		b, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(edit(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return s, stop
}

// onLAN is the config conntrackd had before the relay (Render's output then): listening on the
// LAN address and sending to the peer's, with nothing in between.
func onLAN(local, peer netip.Addr) func(string) string {
	return func(conf string) string {
		return strings.Replace(conf, fmt.Sprintf("IPv4_address %s\n\t\tIPv4_Destination_Address %s\n", DaemonAddress, RelayAddress),
			fmt.Sprintf("IPv4_address %s\n\t\tIPv4_Destination_Address %s\n", local, peer), 1)
	}
}

// attackerConf is the attacker's own conntrackd: on the LAN at the peer's address, sending to the
// gateway, replicating everything (no filter).
func attackerConf(conf string) string {
	conf = onLAN(labPeer, labGW)(conf)
	if i := strings.Index(conf, "\tFilter From Kernelspace {"); i >= 0 {
		conf = conf[:i] + "}\n"
	}
	return conf
}

// gwFlowCount is how many flows the gateway holds before the attack (a dump would carry them).
const gwFlowCount = 20

// startGateway starts the gateway's conntrackd (with its relay unless legacy: then today's
// config, on the LAN) and puts gwFlowCount flows from 203.0.113.7 into its kernel.
func (x *syncLab) startGateway(legacy bool) (*Supervisor, *relay.Relay) {
	x.t.Helper()
	for i := range gwFlowCount {
		x.in(x.gwNS, "conntrack", "-I", "-p", "tcp", "-s", "203.0.113.7", "-d", "10.244.1.5", "--sport", strconv.Itoa(30000+i),
			"--dport", "8080", "--state", "ESTABLISHED", "-t", "600", "-u", "ASSURED")
	}
	cfg := Config{Interface: x.gwDev, LocalAddress: labGW, Peer: labPeer}
	if legacy {
		s, _ := x.supervise(x.gwNS, "gw", cfg, onLAN(labGW, labPeer))
		return s, nil
	}
	r, _ := startRelay(x.t, x.gwNS, labGW, labPeer, 3780, [][]byte{testKey})
	s, _ := x.supervise(x.gwNS, "gw", cfg, nil)
	return s, r
}

// attack is the finding's attack, from the peer's address while the peer is down: the attacker's
// own conntrackd replicates a DNAT entry that leads 192.0.2.66:5555 -> 192.0.2.11:53 to the inside
// service 10.0.0.10:9999, pushes its table (conntrackd -R, -B) and asks for 20 resyncs
// (conntrackd -n), each of which would make the gateway send its whole table; before, it sends
// crafted resync requests from the peer's own port. It returns once the attacker's conntrackd has
// sent it all.
func (x *syncLab) attack() {
	x.t.Helper()
	// First crafted datagrams from the peer's address and port (conntrackd's own come from an
	// ephemeral port): FTFW resync requests as they are, and in the relay's framing with a
	// guessed MAC.
	resync := []byte{10 | 1<<4, 1 << 1, 0, 16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}
	framed := append(append([]byte("VGCS\x01\x02\x00\x00"), bytes.Repeat([]byte{1}, 32)...), resync...)
	framed = append(framed, make([]byte, 16)...)
	err := lab.InNetns(x.peerNS, func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(labPeer, 3780)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range 20 {
			for _, d := range [][]byte{resync, framed} {
				if _, err := c.WriteToUDPAddrPort(d, netip.AddrPortFrom(labGW, 3780)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		x.t.Fatal(err)
	}
	att, _ := x.supervise(x.peerNS, "attacker", Config{Interface: x.peerDev, LocalAddress: labPeer, Peer: labGW}, attackerConf)
	conf := PathsOf(att.cfg.Dir).Config
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(PathsOf(att.cfg.Dir).Socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			x.t.Fatal("the attacker's conntrackd never opened its control socket")
		}
	}
	x.in(x.peerNS, "conntrack", "-I", "-p", "udp", "-s", "192.0.2.66", "-d", "192.0.2.11", "--sport", "5555", "--dport", "53",
		"--dst-nat", "10.0.0.10:9999", "-t", "600")
	if err := att.SendTable(context.Background()); err != nil {
		x.t.Fatal(err)
	}
	for range 20 {
		x.in(x.peerNS, "conntrackd", "-C", conf, "-n")
	}
}

// planted waits up to d for the attacker's entry in the gateway's kernel.
func (x *syncLab) planted(d time.Duration) []string {
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if f := x.flows(x.gwNS, "192.0.2.66"); len(f) > 0 || time.Now().After(deadline) {
			return f
		}
	}
}

// resyncsServed counts the resync requests the gateway's conntrackd took (each one answered with
// its cache, and by vipgate with the whole kernel table).
func resyncsServed(s *Supervisor) int {
	b, _ := os.ReadFile(PathsOf(s.cfg.Dir).Log)
	return strings.Count(string(b), string(resyncRequested))
}

// TestSyncChannelAttack rebuilds the finding of issue #27: a LAN host that holds the address of
// the gateway's absent peer runs its own conntrackd against the gateway. With today's config
// (conntrackd on the LAN address: the control, which shows that the attack works in this lab) the
// DNAT entry lands in the gateway's kernel and the forged resync requests are served; behind the
// relay nothing is planted and nothing is dumped.
func TestSyncChannelAttack(t *testing.T) {
	t.Run("on-LAN", func(t *testing.T) {
		x := newSyncLab(t, "al")
		gw, _ := x.startGateway(true)
		x.attack()
		got := x.planted(15 * time.Second)
		t.Logf("planted in the gateway's kernel: %q; resync requests served: %d; the gateway's flows in the attacker's kernel: %d",
			got, resyncsServed(gw), len(x.flows(x.peerNS, "203.0.113.7")))
		// The lab reproduces the finding: the entry with its DNAT to the inside service, and the
		// dumps.
		if len(got) == 0 || !strings.Contains(got[0], "src=10.0.0.10 ") {
			t.Errorf("the control attack did not plant the DNAT entry (%q): the lab does not reproduce the finding", got)
		}
		if resyncsServed(gw) == 0 || len(x.flows(x.peerNS, "203.0.113.7")) == 0 {
			t.Errorf("the control attack got no dump: the lab does not reproduce the finding")
		}
	})
	t.Run("relay", func(t *testing.T) {
		x := newSyncLab(t, "ar")
		gw, r := x.startGateway(false)
		x.attack()
		// The control plants within a second; this waits far longer.
		if got := x.planted(8 * time.Second); len(got) > 0 {
			t.Errorf("the attacker planted %q in the gateway's kernel", got)
		}
		if n := resyncsServed(gw); n > 0 {
			t.Errorf("the gateway's conntrackd took %d forged resync requests", n)
		}
		if f := x.flows(x.peerNS, "203.0.113.7"); len(f) > 0 {
			t.Errorf("the gateway dumped %d of its flows to the attacker", len(f))
		}
		in := r.Counts()[relay.In]
		t.Logf("the gateway's relay, datagrams from the peer's address: %v", in)
		if in[relay.Forwarded] > 0 || in[relay.WrongSource] == 0 || in[relay.Malformed] < 20 || in[relay.BadMAC] < 20 {
			t.Errorf("the relay forwarded %d of the attacker's datagrams; want none, and some refused for each of wrong source, malformed, bad MAC", in[relay.Forwarded])
		}
	})
}

// capture records, with tcpdump in ns on dev, the UDP payloads sent from src to port 3780 until
// the function returned is called, which returns them. --immediate-mode: without it, packets wait
// in the capture ring's current block until its timeout (1 s), and those still waiting at the
// interrupt are never written (a quick run recorded nothing).
func (x *syncLab) capture(ns, dev string, src netip.Addr) func() [][]byte {
	t := x.t
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("needs tcpdump")
	}
	file := filepath.Join(x.dir, "capture.pcap")
	cmd := exec.Command("ip", "netns", "exec", ns, "tcpdump", "-i", dev, "-U", "--immediate-mode", "-n", "-w", file,
		fmt.Sprintf("udp and src host %s and dst port 3780", src))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(file); err == nil && fi.Size() >= 24 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tcpdump did not start")
		}
	}
	time.Sleep(200 * time.Millisecond) // the filter attached after the header was written
	return func() [][]byte {
		t.Helper()
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return pcapUDPPayloads(t, b)
	}
}

// pcapUDPPayloads returns the UDP payloads of a classic pcap file of Ethernet frames carrying IPv4.
func pcapUDPPayloads(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatalf("not a little-endian pcap file of Ethernet frames (%d bytes)", len(b))
	}
	var out [][]byte
	for p := b[24:]; len(p) >= 16; {
		n := int(binary.LittleEndian.Uint32(p[8:]))
		if len(p) < 16+n {
			break
		}
		frame := p[16 : 16+n]
		p = p[16+n:]
		if len(frame) < 14+20+8 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ip := frame[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		out = append(out, bytes.Clone(ip[ihl+8:]))
	}
	return out
}

// TestSyncChannelReplay: the real peer syncs a flow to the gateway through the relays while its
// datagrams are recorded (its resync request and bulk send among them); the peer goes down, the
// gateway forgets the flow, and an attacker at the peer's address and port replays the recording,
// three times. Nothing comes back, and no resync request is served again.
func TestSyncChannelReplay(t *testing.T) {
	x := newSyncLab(t, "rp")
	gw, r := x.startGateway(false)
	stopCapture := x.capture(x.gwNS, x.gwDev, labPeer)
	_, stopPeerRelay := startRelay(t, x.peerNS, labPeer, labGW, 3780, [][]byte{testKey})
	_, stopPeer := x.supervise(x.peerNS, "peer", Config{Interface: x.peerDev, LocalAddress: labPeer, Peer: labGW}, nil)
	for i := range 10 {
		x.in(x.peerNS, "conntrack", "-I", "-p", "tcp", "-s", "198.51.100.9", "-d", "10.244.2.2", "--sport", strconv.Itoa(40000+i),
			"--dport", "8080", "--state", "ESTABLISHED", "-t", "600", "-u", "ASSURED")
	}
	for deadline := time.Now().Add(20 * time.Second); len(x.flows(x.gwNS, "198.51.100.9")) < 10; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the real peer's flows never reached the gateway through the relays: %d of 10", len(x.flows(x.gwNS, "198.51.100.9")))
		}
	}
	served := resyncsServed(gw)
	stopPeer()
	stopPeerRelay()
	recorded := stopCapture()
	if len(recorded) == 0 || served == 0 {
		t.Fatalf("recorded %d datagrams of the peer, %d resync requests served: nothing to replay", len(recorded), served)
	}
	x.in(x.gwNS, "conntrack", "-D", "-s", "198.51.100.9")
	before := r.Counts()[relay.In]
	// The attacker, at the peer's address and port.
	err := lab.InNetns(x.peerNS, func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(labPeer, 3780)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range 3 {
			for _, d := range recorded {
				if _, err := c.WriteToUDPAddrPort(d, netip.AddrPortFrom(labGW, 3780)); err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replayed %d recorded datagrams of the peer 3 times", len(recorded))
	time.Sleep(5 * time.Second) // the real sync took well under a second
	if f := x.flows(x.gwNS, "198.51.100.9"); len(f) > 0 {
		t.Errorf("the replay put %d of the peer's flows back into the gateway's kernel", len(f))
	}
	if n := resyncsServed(gw); n != served {
		t.Errorf("the replay had %d more resync requests served", n-served)
	}
	after := r.Counts()[relay.In]
	t.Logf("the gateway's relay: before the replay %v, after %v", before, after)
	if after[relay.Forwarded] != before[relay.Forwarded] {
		t.Errorf("the relay forwarded %d replayed datagrams to conntrackd", after[relay.Forwarded]-before[relay.Forwarded])
	}
}
