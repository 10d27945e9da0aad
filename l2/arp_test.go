package l2

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// arpView is an ARP frame in readable form, for diffs.
type arpView struct {
	EthDst, EthSrc string
	Op             string
	SHA, SPA       string
	THA, TPA       string
}

func buildARPFrame(t *testing.T, v arpView) []byte {
	t.Helper()
	op := arp.OperationRequest
	if v.Op == "reply" {
		op = arp.OperationReply
	}
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	p, err := arp.NewPacket(op, mac(v.SHA), netip.MustParseAddr(v.SPA), mac(v.THA), netip.MustParseAddr(v.TPA))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	f := ethernet.Frame{Destination: mac(v.EthDst), Source: mac(v.EthSrc), EtherType: ethernet.EtherTypeARP, Payload: payload}
	b, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseARPFrame(t *testing.T, b []byte) arpView {
	t.Helper()
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		t.Fatalf("sent frame does not parse: %v", err)
	}
	if f.EtherType != ethernet.EtherTypeARP {
		t.Fatalf("sent frame has EtherType %v, want ARP", f.EtherType)
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil {
		t.Fatalf("sent ARP packet does not parse: %v", err)
	}
	op := "request"
	if p.Operation == arp.OperationReply {
		op = "reply"
	}
	return arpView{
		EthDst: f.Destination.String(), EthSrc: f.Source.String(), Op: op,
		SHA: p.SenderHardwareAddr.String(), SPA: p.SenderIP.String(),
		THA: p.TargetHardwareAddr.String(), TPA: p.TargetIP.String(),
	}
}

const bcast = "ff:ff:ff:ff:ff:ff"

// request is a well-formed broadcast ARP request from the client for tpa.
func request(tpa netip.Addr) arpView {
	return arpView{
		EthDst: bcast, EthSrc: clientMAC.String(), Op: "request",
		SHA: clientMAC.String(), SPA: client4.String(),
		THA: "00:00:00:00:00:00", TPA: tpa.String(),
	}
}

func newTestARP(t *testing.T) (*arpResponder, *fakePacketConn) {
	t.Helper()
	m, _ := testMetrics(t)
	conn := newFakePacketConn()
	r := newARPResponder(hclog.NewNullLogger(), eth0, conn, testOwner, m)
	t.Cleanup(func() { r.close() })
	return r, conn
}

// TestARPResponderHandle is the specification of the ARP responder: which
// frames are answered, and why the others are not.
func TestARPResponderHandle(t *testing.T) {
	ourReply := func(to arpView) []arpView {
		return []arpView{{
			EthDst: to.SHA, EthSrc: ourMAC.String(), Op: "reply",
			SHA: ourMAC.String(), SPA: to.TPA,
			THA: to.SHA, TPA: to.SPA,
		}}
	}
	edit := func(v arpView, f func(*arpView)) arpView { f(&v); return v }

	tests := []struct {
		name   string
		frame  arpView
		raw    []byte // used instead of frame when set
		reason DropReason
		reply  bool
	}{
		{name: "broadcast request for owned VIP", frame: request(vip4), reason: DropNone, reply: true},
		{
			name:   "unicast request to our MAC (cache refresh)",
			frame:  edit(request(vip4), func(v *arpView) { v.EthDst = ourMAC.String() }),
			reason: DropNone, reply: true,
		},
		{
			name:   "address probe (sender 0.0.0.0) for owned VIP",
			frame:  edit(request(vip4), func(v *arpView) { v.SPA = "0.0.0.0" }),
			reason: DropNone, reply: true,
		},
		{name: "request for an address that is not ours", frame: request(notOurs4), reason: DropNotOurs},
		{name: "request for the node's own address", frame: request(netip.MustParseAddr("192.0.2.1")), reason: DropNotOurs},
		{name: "request for a VIP owned on another interface", frame: request(vip4Eth1), reason: DropWrongInterface},
		{
			name:   "ARP reply",
			frame:  edit(request(vip4), func(v *arpView) { v.Op = "reply" }),
			reason: DropNotRequest,
		},
		{
			name:   "unicast to another host",
			frame:  edit(request(vip4), func(v *arpView) { v.EthDst = otherMAC.String() }),
			reason: DropOtherDestination,
		},
		{
			name: "our own frame",
			frame: edit(request(vip4), func(v *arpView) {
				v.EthSrc, v.SHA = ourMAC.String(), ourMAC.String()
			}),
			reason: DropOwnFrame,
		},
		{
			name:   "another host announcing our VIP",
			frame:  edit(request(vip4), func(v *arpView) { v.SPA = vip4.String() }),
			reason: DropAnnouncement,
		},
		{name: "truncated frame", raw: []byte{0xff, 0xff, 0xff}, reason: DropMalformed},
		{
			name:   "truncated ARP payload",
			raw:    append(buildARPFrame(t, request(vip4))[:14], 0, 1, 8, 0),
			reason: DropMalformed,
		},
		{
			name: "IPv4 EtherType",
			raw: func() []byte {
				b := buildARPFrame(t, request(vip4))
				b[12], b[13] = 0x08, 0x00
				return b
			}(),
			reason: DropMalformed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, conn := newTestARP(t)
			raw := tt.raw
			if raw == nil {
				raw = buildARPFrame(t, tt.frame)
			}
			if got := r.handle(raw); got != tt.reason {
				t.Errorf("handle() = %v, want %v", got, tt.reason)
			}
			var want []arpView
			if tt.reply {
				want = ourReply(tt.frame)
			}
			var got []arpView
			for _, b := range conn.frames() {
				got = append(got, parseARPFrame(t, b))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("sent frames (-want +got):\n%s", diff)
			}
		})
	}
}

// TestARPGratuitous checks the announcement frames: a request and a reply,
// both broadcast, both with sender IP = target IP = VIP and our MAC.
func TestARPGratuitous(t *testing.T) {
	r, conn := newTestARP(t)
	if err := r.gratuitous(vip4); err != nil {
		t.Fatal(err)
	}
	want := []arpView{
		{EthDst: bcast, EthSrc: ourMAC.String(), Op: "request", SHA: ourMAC.String(), SPA: vip4.String(), THA: bcast, TPA: vip4.String()},
		{EthDst: bcast, EthSrc: ourMAC.String(), Op: "reply", SHA: ourMAC.String(), SPA: vip4.String(), THA: ourMAC.String(), TPA: vip4.String()},
	}
	var got []arpView
	for _, b := range conn.frames() {
		got = append(got, parseARPFrame(t, b))
		if len(b) < 60 {
			t.Errorf("frame of %d bytes is shorter than the Ethernet minimum of 60", len(b))
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gratuitous frames (-want +got):\n%s", diff)
	}
}

// TestARPReadLoopMetrics drives the responder through its socket and
// checks what the metrics count.
func TestARPReadLoopMetrics(t *testing.T) {
	m, reg := testMetrics(t)
	conn := newFakePacketConn()
	r := newARPResponder(hclog.NewNullLogger(), eth0, conn, testOwner, m)
	defer r.close()

	conn.in <- buildARPFrame(t, request(notOurs4))
	conn.in <- buildARPFrame(t, request(vip4Eth1))
	conn.in <- []byte{1, 2, 3}
	conn.in <- buildARPFrame(t, request(vip4))
	labels := map[string]string{"interface": "eth0", "family": "ipv4"}
	// Frames are handled in order and the request for vip4 is counted
	// last, after its reply.
	eventually(t, "three counted requests", func() bool {
		return metricValue(t, reg, "vipgate_l2_requests_received_total", labels) == 3
	})
	if n := len(conn.frames()); n != 1 {
		t.Errorf("sent %d frames, want 1 reply", n)
	}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for k, v := range labels {
			l[k] = v
		}
		return l
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vipgate_l2_requests_received_total", labels, 3},
		{"vipgate_l2_replies_sent_total", labels, 1},
		{"vipgate_l2_requests_dropped_total", with("reason", "not_ours"), 1},
		{"vipgate_l2_requests_dropped_total", with("reason", "wrong_interface"), 1},
		{"vipgate_l2_requests_dropped_total", with("reason", "malformed"), 1},
	} {
		if got := metricValue(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
