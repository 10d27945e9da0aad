package natpath

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// xdpPeers makes the client's and the backend's veth ends take XDP frames (GRO on: the veth then
// receives through NAPI), which an XDP redirect to the gateway's ends needs, and has them send
// complete checksums (tx checksum offload off: a veth's peer otherwise sends CHECKSUM_PARTIAL
// packets, whose checksum field XDP cannot update as a complete one).
func (l *testLab) xdpPeers(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("needs ethtool")
	}
	for _, ns := range []string{l.client, l.backend} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "gro", "on", "tx", "off").CombinedOutput(); err != nil {
			t.Fatalf("ethtool in %s: %v: %s", ns, err, out)
		}
	}
	l.noRxVLAN(t)
}

// noRxVLAN turns the gateway's devices' VLAN tag stripping off (else the XDP program may not run
// there: rxVLANStripped).
func (l *testLab) noRxVLAN(t testing.TB) {
	t.Helper()
	for _, d := range []string{"s0", "n0"} {
		if out, err := exec.Command("ip", "netns", "exec", l.gw, "ethtool", "-K", d, "rxvlan", "off", "rx-vlan-stag-hw-parse", "off").CombinedOutput(); err != nil {
			t.Fatalf("ethtool -K %s rxvlan off: %v: %s", d, err, out)
		}
	}
}

// xdpRedirects reads how many frames XDP redirected from device dev of namespace ns (the veth's
// rx_queue_0_xdp_redirect).
func xdpRedirects(t testing.TB, ns, dev string) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-S", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ethtool -S %s in %s: %v: %s", dev, ns, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == "rx_queue_0_xdp_redirect" {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatalf("no rx_queue_0_xdp_redirect in ethtool -S %s", dev)
	return 0
}

// TestXDPOnVeth: the XDP program forwards real traffic on veths (native XDP), both ways, both
// families, direct and masqueraded: a TCP connection carrying 1 MiB each way and UDP through the
// VIP ports, checksums intact at both ends, the frames redirected by XDP (the veths' own
// counters), the first packets of each flow (neighbours not resolved yet) by the tc program.
func TestXDPOnVeth(t *testing.T) {
	l := newTestLab(t)
	l.xdpPeers(t)
	for _, a := range []netip.Addr{podsV4[0], podsV6[0]} {
		tcpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
		udpEcho(t, l.backend, netip.AddrPortFrom(a, 8080))
	}
	tcpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30080))
	udpEcho(t, l.backend, netip.AddrPortFrom(netip.IPv6Unspecified(), 30080))
	p := l.load(t, Config{Attach: AttachXDP})
	on, tcOnly := p.AttachedXDP()
	if len(on) != 2 || len(tcOnly) != 0 {
		t.Fatalf("XDP on interfaces %v, tc alone on %v; want both devices", on, tcOnly)
	}
	ap := netip.AddrPortFrom
	var ports []VIPPort
	for _, proto := range []uint8{6, 17} {
		ports = append(ports,
			VIPPort{VIP: vipV4, Proto: proto, Port: 80, Table: []netip.AddrPort{ap(podsV4[0], 8080)}},
			VIPPort{VIP: vipV6, Proto: proto, Port: 80, Table: []netip.AddrPort{ap(podsV6[0], 8080)}},
			VIPPort{VIP: vipV4, Proto: proto, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV4, 30080)}},
			VIPPort{VIP: vipV6, Proto: proto, Port: 81, SNAT: true, Table: []netip.AddrPort{ap(nodeV6, 30080)}})
	}
	if err := p.Sync(ports); err != nil {
		t.Fatal(err)
	}
	csumBefore := csumErrors(t, l.backend)
	redirBefore := xdpRedirects(t, l.gw, "s0") + xdpRedirects(t, l.gw, "n0")
	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, dst := range []netip.AddrPort{ap(vipV4, 80), ap(vipV6, 80), ap(vipV4, 81), ap(vipV6, 81)} {
		for i := range 3 {
			msg := fmt.Sprintf("udp %d", i)
			got, from, err := udpAsk(l.client, 0, dst, msg)
			if err != nil || from != dst || !strings.HasSuffix(got, " "+msg) {
				t.Errorf("UDP %s: answer %q from %s, %v", dst, got, from, err)
			}
		}
		tcpRoundTrip(t, l.client, dst, payload)
	}
	if after := csumErrors(t, l.backend); fmt.Sprint(after) != fmt.Sprint(csumBefore) {
		t.Errorf("checksum errors at the backend: %v, before %v", after, csumBefore)
	}
	for k, v := range csumErrors(t, l.client) {
		if v != "0" {
			t.Errorf("checksum errors at the client: %s %s", k, v)
		}
	}
	redirected := xdpRedirects(t, l.gw, "s0") + xdpRedirects(t, l.gw, "n0") - redirBefore
	cnt, _ := p.Counters()
	t.Logf("XDP redirected %d frames; counters %+v", redirected, cnt)
	if cnt.New != 16 {
		t.Errorf("counters %+v: want 16 flows taken (12 UDP, 4 TCP)", cnt)
	}
	// 2 MiB each TCP connection, in segments of at most 1448 bytes: thousands of frames.
	if redirected < 4*1000 {
		t.Errorf("XDP redirected %d frames, want the connections' (thousands)", redirected)
	}
}

// TestXDPAutoOnVeth: AttachAuto keeps veths on the tc program alone (their peers may send
// partial checksums), and says so; the traffic goes through tc.
func TestXDPAutoOnVeth(t *testing.T) {
	l := newTestLab(t)
	l.noRxVLAN(t)
	udpEcho(t, l.backend, netip.AddrPortFrom(podsV4[0], 8080))
	p := l.load(t, Config{})
	on, tcOnly := p.AttachedXDP()
	if len(on) != 0 || len(tcOnly) != 2 {
		t.Fatalf("XDP on %v, tc alone on %v; want tc alone on both veths", on, tcOnly)
	}
	for i, why := range tcOnly {
		if !strings.Contains(why, "veth") {
			t.Errorf("interface %d: tc alone because %q, want: a veth", i, why)
		}
	}
	vip := netip.AddrPortFrom(vipV4, 80)
	if err := p.Sync([]VIPPort{{VIP: vipV4, Proto: 17, Port: 80, Table: []netip.AddrPort{netip.AddrPortFrom(podsV4[0], 8080)}}}); err != nil {
		t.Fatal(err)
	}
	if _, from, err := udpAsk(l.client, 0, vip, "hi"); err != nil || from != vip {
		t.Errorf("UDP %s: answer from %s, %v", vip, from, err)
	}
}

// TestXDPNotOverVLANStripping: where the device strips VLAN tags on receive (a veth's default),
// the XDP program would see a tagged frame as untagged and forward it, where the tc program sees
// vlan_present and the stack drops a frame of a VLAN it has no device for: AttachXDP refuses the
// device (its tc program forwards), AttachAuto leaves it on tc, saying why.
func TestXDPNotOverVLANStripping(t *testing.T) {
	l := newTestLab(t)
	for _, mode := range []AttachMode{AttachXDP, AttachAuto} {
		var p *Path
		var attachErr error
		if err := in(l.gw, func() error {
			var err error
			if p, err = Load(Config{Attach: mode}); err != nil {
				return err
			}
			s0, err := net.InterfaceByName("s0")
			if err != nil {
				return err
			}
			attachErr = p.Attach([]int{s0.Index})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		on, tcOnly := p.AttachedXDP()
		_ = in(l.gw, p.Detach)
		p.Close()
		if len(on) != 0 {
			t.Errorf("%s: XDP on %v over VLAN stripping", mode, on)
		}
		switch mode {
		case AttachXDP:
			if attachErr == nil || !strings.Contains(attachErr.Error(), "rxvlan off") {
				t.Errorf("%s: Attach: %v, want an error naming rxvlan", mode, attachErr)
			}
		case AttachAuto:
			if attachErr != nil || len(tcOnly) != 1 {
				t.Errorf("%s: Attach: %v, tc alone on %v; want tc alone, no error", mode, attachErr, tcOnly)
			}
			for _, why := range tcOnly {
				if !strings.Contains(why, "rxvlan off") {
					t.Errorf("%s: tc alone because %q, want the VLAN stripping named", mode, why)
				}
			}
		}
	}
}

// TestXDPRestart: as the tc program, the XDP program stays attached when its process ends; the
// next run's replaces it in one step (and adopts the flow table); a run in attach mode tc takes
// it away, leaving its own tc program; Cleanup leaves nothing.
func TestXDPRestart(t *testing.T) {
	l := newTestLab(t)
	l.noRxVLAN(t)
	xdpID := func() (ids []uint32) {
		t.Helper()
		_ = in(l.gw, func() error {
			for _, d := range []string{"s0", "n0"} {
				lk, err := netlink.LinkByName(d)
				if err != nil {
					return err
				}
				if x := lk.Attrs().Xdp; x != nil && x.Attached {
					ids = append(ids, x.ProgId)
				}
			}
			return nil
		})
		return ids
	}
	start := func(mode AttachMode) *Path {
		t.Helper()
		var p *Path
		if err := in(l.gw, func() error {
			var err error
			if p, err = Load(Config{Attach: mode}); err != nil {
				return err
			}
			var idx []int
			for _, d := range []string{"s0", "n0"} {
				ifi, err := net.InterfaceByName(d)
				if err != nil {
					return err
				}
				idx = append(idx, ifi.Index)
			}
			return p.Attach(idx)
		}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	progID := func(p *Path) uint32 {
		info, err := p.xdp.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return uint32(id)
	}
	first := start(AttachXDP)
	firstID := progID(first)
	first.Close()
	if ids := xdpID(); len(ids) != 2 || ids[0] != firstID || ids[1] != firstID {
		t.Fatalf("after the first run: XDP programs %v, want %d on both devices", ids, firstID)
	}
	second := start(AttachXDP)
	secondID := progID(second)
	if ids := xdpID(); len(ids) != 2 || ids[0] != secondID || ids[1] != secondID || !second.Adopted {
		t.Errorf("the second run: XDP programs %v, want its own %d on both (adopted %v)", ids, secondID, second.Adopted)
	}
	second.Close()
	third := start(AttachTC)
	if ids := xdpID(); len(ids) != 0 || len(third.Attached()) != 2 {
		t.Errorf("a run in attach mode tc: XDP programs %v left, tc on %v", ids, third.Attached())
	}
	third.Close()
	fourth := start(AttachXDP)
	fourth.Close()
	var n int
	if err := in(l.gw, func() (err error) { n, err = Cleanup(); return err }); err != nil || n != 2 {
		t.Errorf("Cleanup: %d, %v; want 2 interfaces", n, err)
	}
	if ids := xdpID(); len(ids) != 0 {
		t.Errorf("after Cleanup: XDP programs %v", ids)
	}
}
