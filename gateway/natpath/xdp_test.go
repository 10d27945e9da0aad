package natpath

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
)

// The XDP program's hand-over to the tc program behind it (crafted frames, BPF_PROG_TEST_RUN):
// what it cannot finish reaches the tc program untouched, with no state changed and no
// metadata; what it leaves to the stack carries its mark and nothing else.

// TestXDPHandsToTC: a new flow whose backend's next hop is not resolved (XDP has no MAC address
// to write: the neighbour layer must send it), one whose backend has no route, and a frame to
// another MAC address go to the tc program untouched, the XDP program writing no flow entry and
// counting nothing; the tc program then does what it does alone.
func TestXDPHandsToTC(t *testing.T) {
	r := newRunner(t)
	r.xdp = true
	r.path = newRunnerXDPPath(t, r)
	ap := netip.MustParseAddrPort
	vip, backend := ap("203.0.113.70:80"), ap("10.244.8.11:8080") // 10.244.8.0/24: next hop unresolved
	noRoute := ap("203.0.113.71:80")                              // to 10.1.2.3, which has no route
	if err := in(r.ns, func() error {
		return r.path.Sync(append(slices.Clone(runVIPs),
			VIPPort{VIP: vip.Addr(), Proto: 6, Port: vip.Port(), Table: []netip.AddrPort{backend}},
			VIPPort{VIP: noRoute.Addr(), Proto: 17, Port: noRoute.Port(), Table: []netip.AddrPort{ap("10.1.2.3:8080")}}))
	}); err != nil {
		t.Fatal(err)
	}
	client := ap("198.51.100.10:48000")
	syn := frame(pktSpec{src: client, dst: vip, proto: 6, tcpFlags: 0x02, seq: 1})
	unroutable := frame(pktSpec{src: ap("198.51.100.10:48001"), dst: noRoute, proto: 17})
	other := bytes.Clone(frame(pktSpec{src: ap("198.51.100.10:48002"), dst: ap("203.0.113.50:80"), proto: 17}))
	other[0] = 2
	before := r.counters(t)
	for name, pkt := range map[string][]byte{"unresolved next hop": syn, "no route": unroutable, "to another MAC": other} {
		ret, out, err := r.runXDP(pkt)
		if err != nil {
			t.Fatal(err)
		}
		if ret != xdpPassUnmarked || !bytes.Equal(out, pkt) {
			t.Errorf("%s: XDP verdict %#x, changed %v; want handed to tc untouched", name, ret, !bytes.Equal(out, pkt))
		}
	}
	if flows, _ := r.path.Flows(0); len(flows) != 0 {
		t.Errorf("the XDP program wrote flow entries for what it handed over: %+v", flows)
	}
	if after := r.counters(t); after != before {
		t.Errorf("the XDP program counted what it handed over: %+v -> %+v", before, after)
	}
	// Through both, as on a device: the tc program takes the flow through the neighbour layer.
	ret, out := r.run(t, syn)
	if ret != actRedirect || !r.byTC || readTuple(out).dst != backend {
		t.Errorf("the SYN through XDP and tc: verdict %d by tc %v to %s; want redirected by tc to %s", ret, r.byTC, readTuple(out).dst, backend)
	}
	if c := r.counters(t); c.Neigh != before.Neigh+1 || c.New != before.New+1 {
		t.Errorf("counters %+v: want one new flow through the neighbour layer", c)
	}
	if ret, _ := r.run(t, unroutable); ret != actPass || !r.byTC {
		t.Errorf("no route: verdict %d by tc %v, want passed by tc", ret, r.byTC)
	}
	if c := r.counters(t); c.NoRoute != before.NoRoute+1 {
		t.Errorf("counters %+v: want the unroutable packet counted once (by tc)", c)
	}
}

// TestXDPMetadata (the attack): a frame that arrives with metadata (another XDP program's, which
// redirected it here; or one that guessed the mark) does not carry it to the tc program: what
// XDP hands over has none, and what it leaves to the stack has exactly this load's mark.
func TestXDPMetadata(t *testing.T) {
	r := newRunner(t)
	r.xdp = true
	r.path = newRunnerXDPPath(t, r)
	ap := netip.MustParseAddrPort
	c, err := r.path.coll.Maps[mapConfig].LookupBytes(uint32(0))
	if err != nil {
		t.Fatal(err)
	}
	mark := c[36:40]
	forged := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4}
	toOther := frame(pktSpec{src: ap("198.51.100.10:48100"), dst: ap("203.0.113.50:80"), proto: 17})
	toOther[0] = 2
	notVIP := frame(pktSpec{src: ap("198.51.100.10:48101"), dst: ap("203.0.113.99:80"), proto: 17})
	for _, meta := range [][]byte{forged[:4], forged, mark} {
		ret, out, err := r.runXDPMeta(meta, toOther)
		if err != nil {
			t.Fatal(err)
		}
		if ret != xdpPassUnmarked || !bytes.Equal(out, toOther) {
			t.Errorf("metadata %x, a frame for tc: verdict %#x (want handed over without metadata)", meta, ret)
		}
		// runXDP checks that a marked XDP_PASS has exactly the mark (4 bytes).
		if ret, _, err := r.runXDPMeta(meta, notVIP); err != nil || ret != actPass {
			t.Errorf("metadata %x, a frame for the stack: verdict %#x, %v; want passed with the mark alone", meta, ret, err)
		}
	}
}

// newRunnerXDPPath loads a Path of the test's own in r's namespace (closed at its end).
func newRunnerXDPPath(t *testing.T, r *runner) *Path {
	t.Helper()
	p, err := loadRunnerPath(r.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
