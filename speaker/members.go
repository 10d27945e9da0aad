package speaker

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Membership: which speakers are alive, fast enough to move a dead host's VIPs in under a second,
// and safe against split brain.
//
// Every member sends a small UDP heartbeat to every other member every HeartbeatInterval (100 ms) and
// declares a member dead after DeadAfter (400 ms) of silence. Ownership is a pure function of the live
// set (rendezvous hashing in DecideL2), so all members that see the same live set agree on owners
// without talking about them.
//
// Split brain: a host announces only while it sees a strict majority of the members (itself
// included). On a partition the minority side stops answering within DeadAfter, and the majority
// side takes the IPs over after the same DeadAfter, so two hosts answer for one IP at most for about
// that window and never for longer. A two-member cluster cannot have a majority after a failure; there
// a lone member keeps announcing (availability over split-brain safety): run three or more speakers
// (or a witness member) where that matters.
//
// Kubernetes Leases are too slow for this (renewal and expiry take seconds: Cilium 10-20 s, kube-vip
// about 3 s), and MetalLB's memberlist detects a failure in about 4 s with its defaults.
type Members struct {
	log  hclog.Logger
	self string
	conn *net.UDPConn
	port int

	// HeartbeatInterval and DeadAfter set the detection time (defaults 100 ms and 400 ms).
	HeartbeatInterval time.Duration
	DeadAfter         time.Duration

	mu sync.Mutex
	// since is when the member list first became non-empty: until DeadAfter has passed, this host
	// has not had the chance to hear everyone and announces nothing (else at start-up every node
	// would briefly believe it is alone and answer for every IP).
	since    time.Time
	settled  bool
	peers    map[string]netip.Addr
	lastSeen map[string]time.Time
	live     map[string]bool
	onChange func()
}

// heartbeatPrefix starts every heartbeat datagram; the member's name follows.
const heartbeatPrefix = "vipgate-hb1 "

// NewMembers listens for heartbeats on UDP port (all addresses) and returns the membership of self.
func NewMembers(log hclog.Logger, self string, port int) (*Members, error) {
	if self == "" {
		return nil, errors.New("membership needs this node's name")
	}
	conn, err := net.ListenUDP("udp", &net.UDPAddr{Port: port})
	if err != nil {
		return nil, err
	}
	return &Members{log: log, self: self, conn: conn, port: port, HeartbeatInterval: 100 * time.Millisecond,
		DeadAfter: 400 * time.Millisecond, peers: map[string]netip.Addr{}, lastSeen: map[string]time.Time{},
		live: map[string]bool{self: true}}, nil
}

// SetPeers replaces the member list (name -> address; self may be included, it is ignored).
func (m *Members) SetPeers(peers map[string]netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peers = map[string]netip.Addr{}
	for n, a := range peers {
		if n != m.self && a.IsValid() {
			m.peers[n] = a
		}
	}
	if len(m.peers) > 0 && m.since.IsZero() {
		m.since = time.Now()
	}
}

// OnChange sets a function called (from the membership goroutine) whenever the live set changes.
func (m *Members) OnChange(f func()) {
	m.mu.Lock()
	m.onChange = f
	m.mu.Unlock()
}

// Live returns the live members (self included) and whether self sees a strict majority of all members
// (or is in a cluster of at most two).
func (m *Members) Live() (map[string]bool, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.live))
	for n, v := range m.live {
		out[n] = v
	}
	total := len(m.peers) + 1
	alive := 0
	for _, v := range out {
		if v {
			alive++
		}
	}
	settled := len(m.peers) == 0 || time.Since(m.since) >= m.DeadAfter
	return out, settled && (total <= 2 || 2*alive > total)
}

// Run sends heartbeats and tracks liveness until ctx ends.
func (m *Members) Run(ctx context.Context) {
	go m.receive(ctx)
	t := time.NewTicker(m.HeartbeatInterval / 2)
	defer t.Stop()
	lastSent := time.Time{}
	msg := []byte(heartbeatPrefix + m.self)
	for {
		select {
		case <-ctx.Done():
			m.conn.Close()
			return
		case now := <-t.C:
			if now.Sub(lastSent) >= m.HeartbeatInterval {
				lastSent = now
				m.mu.Lock()
				for _, a := range m.peers {
					_, _ = m.conn.WriteToUDPAddrPort(msg, netip.AddrPortFrom(a, uint16(m.port)))
				}
				m.mu.Unlock()
			}
			m.evaluate(now)
		}
	}
}

func (m *Members) receive(ctx context.Context) {
	buf := make([]byte, 512)
	for ctx.Err() == nil {
		n, from, err := m.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		name, ok := strings.CutPrefix(string(buf[:n]), heartbeatPrefix)
		if !ok {
			continue
		}
		m.mu.Lock()
		// Only listed members count, and only from their own address.
		if a, ok := m.peers[name]; ok && a == from.Addr().Unmap() {
			m.lastSeen[name] = time.Now()
		}
		m.mu.Unlock()
		m.evaluate(time.Now())
	}
}

func (m *Members) evaluate(now time.Time) {
	m.mu.Lock()
	changed := false
	for n := range m.peers {
		alive := now.Sub(m.lastSeen[n]) < m.DeadAfter
		if m.live[n] != alive {
			changed = true
			m.live[n] = alive
			m.log.Info("member changed", "node", n, "alive", alive)
		}
	}
	for n := range m.live {
		if _, ok := m.peers[n]; !ok && n != m.self {
			delete(m.live, n)
			changed = true
		}
	}
	if !m.settled && !m.since.IsZero() && now.Sub(m.since) >= m.DeadAfter {
		// The start-up grace is over: decide again now that everyone had time to be heard.
		m.settled = true
		changed = true
	}
	f := m.onChange
	m.mu.Unlock()
	if changed && f != nil {
		f()
	}
}
