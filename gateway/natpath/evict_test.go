package natpath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// forgetEntry deletes the entry of the flow tables that match picks, as the unconfirmed flows'
// LRU evicts one entry of a flow and leaves the other.
func forgetEntry(t *testing.T, r *runner, match func(Flow) bool) {
	t.Helper()
	var m *ebpf.Map
	var key []byte
	if err := r.path.walk(func(mm *ebpf.Map, k, _ []byte, f Flow) bool {
		if match(f) {
			m, key = mm, append([]byte(nil), k...)
			return false
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if m == nil {
		t.Fatal("no such entry")
	}
	if err := m.Delete(key); err != nil {
		t.Fatal(err)
	}
}

// An unconfirmed masqueraded flow whose reply entry was evicted must not go on sending from its
// masquerade port: the port is free for the next flow to take, whose replies would then be the
// only ones that port's reply entry delivers, and two clients would share it.
func TestHalfEvictedFlowGivesUpItsPort(t *testing.T) { eachProg(t, testHalfEvictedFlowGivesUpItsPort) }

func testHalfEvictedFlowGivesUpItsPort(t *testing.T) {
	r := newRunner(t).with(t, Config{SNATPortMin: 61000, SNATPortMax: 61000})
	ap := netip.MustParseAddrPort
	vip := ap("203.0.113.50:81") // masqueraded
	victim, other := ap("198.51.100.10:5140"), ap("198.51.100.66:5140")
	send := func(from netip.AddrPort) (uint32, tuple) {
		ret, out := r.run(t, frame(pktSpec{src: from, dst: vip, proto: 17}))
		return ret, readTuple(out)
	}
	if ret, got := send(victim); ret != actRedirect || got.src.Port() != 61000 {
		t.Fatalf("the victim's first datagram: verdict %d from %s, want the one port, 61000", ret, got.src)
	}
	// The LRU evicts the victim's reply entry (one-way flows' reply entries are the least
	// recently used), and the port is taken by another client.
	forgetEntry(t, r, func(f Flow) bool { return f.Reply && f.Dst.Port() == 61000 })
	if ret, got := send(other); ret != actRedirect || got.src.Port() != 61000 {
		t.Fatalf("another client after the eviction: verdict %d from %s, want the port", ret, got.src)
	}
	// The victim's next datagram: not from the other client's port (no free port: the stack's).
	if ret, got := send(victim); ret == actRedirect && got.src.Port() == 61000 {
		t.Errorf("the victim still sends from port 61000, which another client holds")
	}
	flows, err := r.path.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Src == victim || f.Reply && f.NewDst == victim {
			t.Errorf("an entry of the victim's half flow is left: %+v", f)
		}
	}
}

// The masquerade port a flow gets says nothing of the flow hash (whose seed would otherwise
// leak, some bits a connection, through any service that echoes its peer's port): the same
// client tuple, dealt again and again with every port free, does not always get the same port.
func TestMasqueradePortIsRandom(t *testing.T) { eachProg(t, testMasqueradePortIsRandom) }

func testMasqueradePortIsRandom(t *testing.T) {
	r := newRunner(t).with(t, Config{})
	ap := netip.MustParseAddrPort
	vip, client := ap("203.0.113.50:81"), ap("198.51.100.10:5141") // masqueraded
	ports := map[uint16]bool{}
	for range 8 {
		ret, out := r.run(t, frame(pktSpec{src: client, dst: vip, proto: 17}))
		if ret != actRedirect {
			t.Fatalf("verdict %d, want taken", ret)
		}
		port := readTuple(out).src.Port()
		ports[port] = true
		// The flow ends (both entries go), and every port is free again.
		forgetEntry(t, r, func(f Flow) bool { return !f.Reply && f.Src == client })
		forgetEntry(t, r, func(f Flow) bool { return f.Reply && f.Dst.Port() == port })
	}
	if len(ports) == 1 {
		t.Errorf("one client tuple got the same masquerade port 8 times: %v", ports)
	}
}

// The places a new flow tries for a masquerade port are spread over the range whatever its size:
// with a range of 7,919 ports (the stride between tries) they would all be one port, and a flow
// whose first try is taken would be refused with the range nearly empty.
func TestMasqueradeTriesSpreadOverRange(t *testing.T) {
	eachProg(t, testMasqueradeTriesSpreadOverRange)
}

func testMasqueradeTriesSpreadOverRange(t *testing.T) {
	r := newRunner(t).with(t, Config{SNATPortMin: 20000, SNATPortMax: 20000 + 7919 - 1})
	vip := netip.MustParseAddrPort("203.0.113.50:81") // masqueraded
	before := r.counters(t)
	for i := range 1000 {
		c := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), uint16(10000+i))
		r.run(t, frame(pktSpec{src: c, dst: vip, proto: 17}))
	}
	// With 8 tries spread out, a flow is refused only if 8 ports are taken (< 1e-7 each);
	// with one port tried 8 times, about 60 of the 1,000 would be.
	if full := r.counters(t).SNATFull - before.SNATFull; full != 0 {
		t.Errorf("%d of 1000 flows found no free port among 7919", full)
	}
}

// A single UDP exchange (a DNS query and its answer) is not confirmed: confirmed, it would hold
// two entries of the established table, which nothing evicts, for its 2 min timeout, and a modest
// rate of queries would fill it and send every new flow to the stack. The client's next datagram
// after an answer confirms the flow.
func TestSingleUDPExchangeStaysUnconfirmed(t *testing.T) {
	eachProg(t, testSingleUDPExchangeStaysUnconfirmed)
}

func testSingleUDPExchangeStaysUnconfirmed(t *testing.T) {
	r := newRunner(t).with(t, Config{FlowEntries: 16, NewFlowEntries: 1024})
	ap := netip.MustParseAddrPort
	vip, backend := ap("203.0.113.50:80"), ap("10.244.1.11:8080")
	for i := range 50 {
		c := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.53"), uint16(1000+i))
		if ret, _ := r.run(t, frame(pktSpec{src: c, dst: vip, proto: 17})); ret != actRedirect {
			t.Fatalf("query %d: verdict %d, want taken (the established table is not full)", i, ret)
		}
		r.run(t, frame(pktSpec{src: backend, dst: c, proto: 17}))
		if f := findFlow(t, r, c, vip); f == nil || !f.Unconfirmed {
			t.Fatalf("query %d after its answer: %+v, want unconfirmed", i, f)
		}
	}
	c := ap("198.51.100.53:1000")
	r.run(t, frame(pktSpec{src: c, dst: vip, proto: 17}))
	if f := findFlow(t, r, c, vip); f == nil || f.Unconfirmed {
		t.Errorf("the client's datagram after an answer: %+v, want the flow confirmed", f)
	}
}
