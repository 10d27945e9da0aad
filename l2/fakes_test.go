package l2

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/ipv6"
)

// Addresses used by the unit tests (documentation ranges only).
var (
	ourMAC    = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	clientMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	otherMAC  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x03}

	vip4      = netip.MustParseAddr("192.0.2.50")
	vip4Eth1  = netip.MustParseAddr("192.0.2.52") // owned, but on eth1
	notOurs4  = netip.MustParseAddr("192.0.2.51")
	client4   = netip.MustParseAddr("192.0.2.2")
	vip6      = netip.MustParseAddr("2001:db8:1::50")
	vip6Eth1  = netip.MustParseAddr("2001:db8:1::52")
	notOurs6  = netip.MustParseAddr("2001:db8:1::51")
	client6LL = netip.MustParseAddr("fe80::2")

	eth0 = &net.Interface{Index: 7, Name: "eth0", MTU: 1500, HardwareAddr: ourMAC}
)

// testOwner owns vip4 and vip6 on eth0, vip4Eth1 and vip6Eth1 on eth1.
func testOwner(ip netip.Addr, iface string) DropReason {
	switch {
	case (ip == vip4 || ip == vip6) && iface == "eth0":
		return DropNone
	case (ip == vip4Eth1 || ip == vip6Eth1) && iface == "eth1":
		return DropNone
	case ip == vip4 || ip == vip6 || ip == vip4Eth1 || ip == vip6Eth1:
		return DropWrongInterface
	}
	return DropNotOurs
}

func testMetrics(t *testing.T) (*metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// metricValue sums the samples of the named metric whose labels include
// all of want.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

// eventually polls cond until it holds or a generous deadline passes. It
// asserts an outcome, not a duration.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fakePacketConn is a net.PacketConn that hands frames from in to
// ReadFrom and records what is written.
type fakePacketConn struct {
	in        chan []byte
	closed    chan struct{}
	closeOnce sync.Once

	mu   sync.Mutex
	sent [][]byte
}

func newFakePacketConn() *fakePacketConn {
	return &fakePacketConn{in: make(chan []byte, 16), closed: make(chan struct{})}
}

func (c *fakePacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	select {
	case f := <-c.in:
		return copy(b, f), nil, nil
	case <-c.closed:
		return 0, nil, net.ErrClosed
	}
}

func (c *fakePacketConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, append([]byte(nil), b...))
	return len(b), nil
}

func (c *fakePacketConn) frames() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.sent...)
}

func (c *fakePacketConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

func (c *fakePacketConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *fakePacketConn) LocalAddr() net.Addr              { return nil }
func (c *fakePacketConn) SetDeadline(time.Time) error      { return nil }
func (c *fakePacketConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakePacketConn) SetWriteDeadline(time.Time) error { return nil }

// ndpSent is one message written to a fakeNDPConn.
type ndpSent struct {
	msg ndp.Message
	dst netip.Addr
}

// fakeNDPConn implements ndpConn in memory.
type fakeNDPConn struct {
	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	sent   []ndpSent
	joined map[netip.Addr]bool
}

func newFakeNDPConn() *fakeNDPConn {
	return &fakeNDPConn{closed: make(chan struct{}), joined: map[netip.Addr]bool{}}
}

func (c *fakeNDPConn) WriteTo(m ndp.Message, _ *ipv6.ControlMessage, dst netip.Addr) error {
	select {
	case <-c.closed:
		return net.ErrClosed
	default:
	}
	// Marshal as the real Conn does, so an invalid message fails here too.
	if _, err := ndp.MarshalMessage(m); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, ndpSent{msg: m, dst: dst})
	return nil
}

func (c *fakeNDPConn) JoinGroup(g netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.joined[g] = true
	return nil
}

func (c *fakeNDPConn) LeaveGroup(g netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.joined, g)
	return nil
}

func (c *fakeNDPConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *fakeNDPConn) messages() []ndpSent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ndpSent(nil), c.sent...)
}

func (c *fakeNDPConn) groups() map[netip.Addr]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := map[netip.Addr]bool{}
	for k, v := range c.joined {
		g[k] = v
	}
	return g
}

func (c *fakeNDPConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}
