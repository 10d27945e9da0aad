package membership

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The membership at scale, in process: one member (the observer) among N on a simulated transport
// and a virtual clock. The other N-1 are simulated senders that sign genuine heartbeats for it;
// the observer runs the real receive, expiry/evaluation and send paths, and only its own work is
// timed. Since the protocol is symmetric, the observer's CPU and traffic are every member's.

// sinkConn counts what a member sends.
type sinkConn struct{ datagrams, bytes int }

func (c *sinkConn) ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error) {
	select {}
}
func (c *sinkConn) WriteToUDPAddrPort(b []byte, _ netip.AddrPort) (int, error) {
	c.datagrams++
	c.bytes += len(b)
	return len(b), nil
}
func (c *sinkConn) Close() error { return nil }

// simSegment is the observer and the simulated senders.
type simSegment struct {
	m       *Members
	sink    *sinkConn
	names   []string
	addrs   []netip.Addr
	counter []uint64
	// silent marks the senders that stopped.
	silent []bool
	heard  bitmap
	// after silentSince+takeoverAfter the senders, like the observer, stop vouching for the silent
	// ones: heardNow is their heard set then.
	silentSince time.Time
	heardNow    bitmap
	key         []byte
	now         time.Time
	busy        time.Duration
}

func newSimSegment(tb testing.TB, n int, opts Options) *simSegment {
	tb.Helper()
	s := &simSegment{sink: &sinkConn{}, key: testKeys[0], now: time.Unix(1e9, 0)}
	peers := map[string][]netip.Addr{}
	for i := range n {
		name := fmt.Sprintf("node-%05d.rack%02d.example", i, i%40)
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		s.names = append(s.names, name)
		s.addrs = append(s.addrs, a)
		s.counter = append(s.counter, uint64(1e18))
		s.silent = append(s.silent, false)
		peers[name] = []netip.Addr{a}
	}
	opts.Keys = [][]byte{s.key}
	m, err := newMembers(hclog.NewNullLogger(), s.names[0], opts, s.sink)
	if err != nil {
		tb.Fatal(err)
	}
	m.mu.Lock()
	m.setMembershipLocked(peers, nil, false, s.now)
	m.willing = true
	m.mu.Unlock()
	s.m = m
	// Every sender hears every member and says so (the steady state of a healthy segment).
	s.heard = newBitmap(n)
	for i := range n {
		s.heard.set(i)
	}
	return s
}

// datagram is sender i's next heartbeat for the observer.
func (s *simSegment) datagram(i int) []byte {
	s.counter[i]++
	heard := s.heard
	if !s.silentSince.IsZero() && s.now.Sub(s.silentSince) >= s.m.takeoverAfter() {
		if s.heardNow == nil {
			s.heardNow = s.heard.clone()
			for j, q := range s.silent {
				if q {
					s.heardNow[j/8] &^= 1 << (j % 8)
				}
			}
		}
		heard = s.heardNow
	}
	hb := heartbeat{name: s.names[i], ready: true, counter: s.counter[i], echo: s.m.boot, digest: s.m.segs[0].key, heard: heard}
	b, _ := appendHeartbeat(make([]byte, 0, MaxHeartbeat), &hb)
	return mac(s.key, s.names[0], b, b)
}

// timed runs f and adds its duration to the observer's busy time.
func (s *simSegment) timed(f func()) {
	t := time.Now()
	f()
	s.busy += time.Since(t)
}

// run advances the virtual clock by d: every sender's heartbeat each interval, spread evenly,
// the observer's evaluation every tick and its own heartbeats every interval. It returns the
// moment (virtual) the observer first dropped member gone from its candidates, if it did.
func (s *simSegment) run(d time.Duration, gone string) (dropped time.Time) {
	interval, tick := s.m.opts.HeartbeatInterval, s.m.tick()
	n := len(s.names)
	end := s.now.Add(d)
	step := interval / time.Duration(n)
	next, nextTick, nextSend := 1, s.now.Add(tick), s.now
	var buf []byte
	for s.now.Before(end) {
		s.now = s.now.Add(step)
		if !s.silent[next] {
			b, from := s.datagram(next), s.addrs[next]
			s.timed(func() { s.m.handle(b, from, s.now) })
		}
		if next++; next == n {
			next = 1
		}
		if !s.now.Before(nextTick) {
			nextTick = nextTick.Add(tick)
			s.timed(func() { s.m.evaluate(s.now) })
			if gone != "" && dropped.IsZero() && !s.m.View().Candidates[gone] {
				dropped = s.now
			}
		}
		if !s.now.Before(nextSend) {
			nextSend = nextSend.Add(interval)
			s.timed(func() { buf = s.m.send(buf) })
		}
	}
	return dropped
}

// TestMembershipSimulation prints, per segment size and timing, the failover after a silent death
// (from the victim's last heartbeat to its removal from the observer's candidates), the traffic and
// the CPU of one member (its own work, no kernel). VIPGATE_SIM_MEMBERS lists the sizes (default
// 100,1000; the README's figures: 100,1000,5000). Nothing is asserted about the figures.
func TestMembershipSimulation(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	sizes := []int{100, 1000}
	if v := os.Getenv("VIPGATE_SIM_MEMBERS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 3 || n > MaxMembers {
				t.Fatalf("VIPGATE_SIM_MEMBERS=%q: want sizes 3-%d", v, MaxMembers)
			}
			sizes = append(sizes, n)
		}
	}
	t.Logf("%-7s %-13s %-9s %-13s %-13s %-11s %-9s", "members", "interval/dead", "failover", "datagrams/s", "bytes/s", "Mbit/s", "CPU")
	for _, timing := range [][2]time.Duration{{100 * time.Millisecond, 400 * time.Millisecond}, {50 * time.Millisecond, 200 * time.Millisecond}} {
		for _, n := range sizes {
			s := newSimSegment(t, n, Options{HeartbeatInterval: timing[0], DeadAfter: timing[1]})
			s.run(time.Second, "") // everyone heard, ready
			if v := s.m.View(); !v.Ready || len(v.Candidates) != n {
				t.Fatalf("%d members: not settled: ready %v, %d candidates", n, v.Ready, len(v.Candidates))
			}
			s.busy, s.sink.datagrams, s.sink.bytes = 0, 0, 0
			const measured = 2 * time.Second
			s.run(measured, "")
			cpu := s.busy.Seconds() / measured.Seconds()
			// Traffic is symmetric: what one member sends, it also receives.
			dgs := float64(2*s.sink.datagrams) / measured.Seconds()
			bytesPerS := float64(2*s.sink.bytes) / measured.Seconds()

			// A silent death: the victim's last heartbeat is the last one before this moment.
			victim := n / 2
			s.silent[victim] = true
			lastHeard := s.now
			s.silentSince = lastHeard
			dropped := s.run(2*time.Second, s.names[victim])
			if dropped.IsZero() {
				t.Fatalf("%d members: the silent member was never dropped", n)
			}
			t.Logf("%-7d %-13s %-9v %-13.0f %-13.0f %-11.1f %.1f%%", n, fmt.Sprintf("%v/%v", timing[0], timing[1]),
				dropped.Sub(lastHeard).Round(time.Millisecond), dgs, bytesPerS, bytesPerS*8/1e6, 100*cpu)
		}
	}
}

// BenchmarkUDPLoopback is the kernel's share per heartbeat, which the simulation leaves out: one
// 700-byte datagram sent and received over loopback.
func BenchmarkUDPLoopback(b *testing.B) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	msg, buf := make([]byte, 700), make([]byte, 2048)
	for b.Loop() {
		if _, err := tx.WriteToUDPAddrPort(msg, to); err != nil {
			b.Fatal(err)
		}
		if _, _, err := rx.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeat is the cost of receiving one heartbeat in a segment of N members, when it
// changes nothing (the steady state), when it is forged (bad MAC) and when it comes from a stranger.
func BenchmarkHeartbeat(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		s := newSimSegment(b, n, Options{})
		s.run(time.Second, "")
		// Pre-signed heartbeats, a few rounds of them, replayed with fresh counters as the observer's
		// memory of the counters is reset between passes.
		rounds := max(1, 20000/n)
		var dgs [][]byte
		var from []netip.Addr
		for range rounds {
			for i := 1; i < n; i++ {
				dgs = append(dgs, s.datagram(i))
				from = append(from, s.addrs[i])
			}
		}
		b.Run(fmt.Sprintf("genuine/members=%d", n), func(b *testing.B) {
			now := s.now
			for i := 0; b.Loop(); i++ {
				k := i % len(dgs)
				if k == 0 {
					s.m.mu.Lock()
					for _, p := range s.m.peers {
						p.order = peerOrder{}
					}
					s.m.mu.Unlock()
				}
				if r := s.m.handle(dgs[k], from[k], now); r != acceptedReason {
					b.Fatal(r)
				}
			}
		})
		forged := append([]byte(nil), dgs[0]...)
		forged[len(forged)-1] ^= 1
		b.Run(fmt.Sprintf("forged/members=%d", n), func(b *testing.B) {
			for b.Loop() {
				if r := s.m.handle(forged, from[0], s.now); r != dropBadMAC {
					b.Fatal(r)
				}
			}
		})
		stranger := seal(b, s.key, s.names[0], heartbeat{name: "stranger", counter: 1, heard: s.heard})
		b.Run(fmt.Sprintf("stranger/members=%d", n), func(b *testing.B) {
			for b.Loop() {
				s.m.handle(stranger, netip.MustParseAddr("192.0.2.9"), s.now)
			}
		})
		// A heartbeat that changes the sender's readiness: the view is recomputed (O(members)).
		b.Run(fmt.Sprintf("change/members=%d", n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				s.counter[1]++
				hb := heartbeat{name: s.names[1], ready: i%2 == 0, counter: s.counter[1], echo: s.m.boot, digest: s.m.segs[0].key, heard: s.heard}
				d, _ := appendHeartbeat(nil, &hb)
				d = mac(s.key, s.names[0], d, d)
				s.m.handle(d, s.addrs[1], s.now)
			}
		})
	}
}
