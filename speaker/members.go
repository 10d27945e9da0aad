package speaker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Membership: which speakers may announce, fast enough to move a dead host's VIPs in well under a
// second, and safe against split brain. README.md explains the design; in short:
//
//   - Every member sends a small UDP heartbeat to every other member every HeartbeatInterval (100 ms)
//     and counts a member as silent after DeadAfter (400 ms) without one. It takes a silent member's
//     VIPs over one heartbeat interval (and two 25 ms ticks) later than that (takeoverAfter), because
//     the silent member, if alive but cut off, stops answering DeadAfter after the last heartbeat it
//     heard, which may be up to one interval later.
//   - A member is *ready* (may announce) only while it has desired state to act on, hears a strict
//     majority of the member list, itself included, and has been running for DeadAfter (so that at start-up it first hears
//     everyone instead of believing it is alone). Its heartbeats carry that flag, and a member sends
//     one at once when the flag changes, so its peers hand over or take back its VIPs within a
//     network round trip instead of a timeout.
//   - Heartbeats also carry the ready members the sender hears. A member counts another as a
//     candidate owner when it hears that member directly, or hears someone who does. So a partial
//     partition (A and B cannot hear each other but both hear C) does not make A and B both take the
//     other's VIPs: every member still agrees on the same candidate set.
//   - Ownership is then a pure function of the candidate set (rendezvous hashing in DecideL2), so
//     members that see the same set agree on the owners without exchanging them.
//   - Two members cannot form a majority after a failure. There the lexically lowest name keeps
//     announcing alone and the other one stops: a partition never leaves two owners, at the price
//     that the lower-named host's death is not taken over. A third member (any host running the
//     speaker, e.g. one no L2Advertisement selects: a witness) removes that limit.
//
// Kubernetes Leases are too slow for this (renewal and expiry take seconds: Cilium 10-20 s, kube-vip
// about 3 s), and MetalLB's memberlist detects a failure in about 4 s with its defaults.
type Members struct {
	log  hclog.Logger
	self string
	conn *net.UDPConn
	port int
	opts MemberOptions

	// drop, if set, discards heartbeats from the named member (tests simulate partitions with it).
	drop func(from string) bool

	mu sync.Mutex
	// since is when the member list first became non-empty (start-up grace, see ready).
	since time.Time
	// peers are the other members and their addresses; the first address is where heartbeats go,
	// any of them is accepted as the source.
	peers    map[string][]netip.Addr
	lastSeen map[string]time.Time
	// peerReady is each peer's own ready flag, peerHears the ready members it hears (from its
	// latest heartbeat).
	peerReady map[string]bool
	peerHears map[string][]string
	// willing is set by the speaker once it can announce (it has a State): until then it tells the
	// others it is not ready, so they keep its VIPs instead of handing them to a host that would not
	// answer yet (a restarted node whose first sync is slow).
	willing bool
	// The last evaluated view, to notice changes.
	view     View
	onChange func()
	// sendNow asks Run to send a heartbeat at once (our ready flag changed).
	sendNow chan struct{}
}

// MemberOptions configures the membership protocol. Zero values mean the defaults.
type MemberOptions struct {
	// Port is the UDP port heartbeats are sent to and received on, the same on every member (7473).
	Port int
	// Bind is the local address to listen on (default: all addresses, both families).
	Bind netip.Addr
	// HeartbeatInterval is how often a heartbeat goes to every member (100 ms).
	HeartbeatInterval time.Duration
	// DeadAfter is how long a silent member still counts as alive (400 ms).
	DeadAfter time.Duration
}

// Defaults of MemberOptions.
const (
	DefaultMemberPort        = 7473
	DefaultHeartbeatInterval = 100 * time.Millisecond
	DefaultDeadAfter         = 400 * time.Millisecond
)

// View is one evaluation of the membership from this member's side.
type View struct {
	// Candidates are the members that may own VIPs: this one if Ready, and every ready member it
	// hears directly or through a member it hears. DecideL2 takes it as L2Input.Live.
	Candidates map[string]bool
	// Ready says this member may announce: it is willing (SetWilling), hears a strict majority of the
	// members (or wins the two-member tie-break) and its start-up grace is over.
	Ready bool
	// Heard is how many members this one hears directly, itself included; Total is the member count.
	Heard, Total int
}

func (v View) equal(o View) bool {
	if v.Ready != o.Ready || v.Heard != o.Heard || v.Total != o.Total || len(v.Candidates) != len(o.Candidates) {
		return false
	}
	for n := range v.Candidates {
		if !o.Candidates[n] {
			return false
		}
	}
	return true
}

// heartbeatPrefix starts every heartbeat datagram: "vipgate-hb2 NAME READY HEARD", READY is 0 or 1,
// HEARD the comma-separated ready members the sender hears ("-" for none). Heartbeats are not
// authenticated: only listed members count, and only from one of their own addresses.
const heartbeatPrefix = "vipgate-hb2"

// maxHeartbeat bounds a heartbeat datagram (a name list of a few hundred nodes fits).
const maxHeartbeat = 16 << 10

func encodeHeartbeat(self string, ready bool, hears []string) []byte {
	r, h := "0", "-"
	if ready {
		r = "1"
	}
	if len(hears) > 0 {
		h = strings.Join(hears, ",")
	}
	return []byte(heartbeatPrefix + " " + self + " " + r + " " + h)
}

func decodeHeartbeat(b []byte) (name string, ready bool, hears []string, err error) {
	f := strings.Fields(string(b))
	if len(f) != 4 || f[0] != heartbeatPrefix || (f[2] != "0" && f[2] != "1") {
		return "", false, nil, errors.New("not a vipgate heartbeat")
	}
	if f[3] != "-" {
		hears = strings.Split(f[3], ",")
	}
	return f[1], f[2] == "1", hears, nil
}

// NewMembers listens for heartbeats and returns the membership of self. It sends nothing until Run.
func NewMembers(log hclog.Logger, self string, opts MemberOptions) (*Members, error) {
	if self == "" {
		return nil, errors.New("membership needs this node's name")
	}
	opts.Port = cmp.Or(opts.Port, DefaultMemberPort)
	opts.HeartbeatInterval = cmp.Or(opts.HeartbeatInterval, DefaultHeartbeatInterval)
	opts.DeadAfter = cmp.Or(opts.DeadAfter, DefaultDeadAfter)
	if opts.DeadAfter <= opts.HeartbeatInterval {
		return nil, fmt.Errorf("membership: deadAfter %v must be longer than the heartbeat interval %v", opts.DeadAfter, opts.HeartbeatInterval)
	}
	laddr := &net.UDPAddr{Port: opts.Port}
	if opts.Bind.IsValid() {
		laddr.IP = opts.Bind.AsSlice()
	}
	conn, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("membership: listening on UDP port %d: %w", opts.Port, err)
	}
	return &Members{log: log, self: self, conn: conn, port: opts.Port, opts: opts,
		peers: map[string][]netip.Addr{}, lastSeen: map[string]time.Time{}, peerReady: map[string]bool{},
		peerHears: map[string][]string{}, sendNow: make(chan struct{}, 1),
		view: View{Candidates: map[string]bool{}, Total: 1, Heard: 1}}, nil
}

// SetPeers replaces the member list (name -> addresses; self may be included, it is ignored).
// Members that are no longer listed are forgotten at once.
func (m *Members) SetPeers(peers map[string][]netip.Addr) {
	m.mu.Lock()
	next := map[string][]netip.Addr{}
	for n, addrs := range peers {
		if n == m.self {
			continue
		}
		var valid []netip.Addr
		for _, a := range addrs {
			if a.IsValid() {
				valid = append(valid, a.Unmap())
			}
		}
		if len(valid) > 0 {
			next[n] = valid
		}
	}
	for n := range m.peers {
		if _, ok := next[n]; !ok {
			delete(m.lastSeen, n)
			delete(m.peerReady, n)
			delete(m.peerHears, n)
		}
	}
	m.peers = next
	if m.since.IsZero() {
		m.since = time.Now()
	}
	m.mu.Unlock()
	m.evaluate(time.Now())
}

// SetWilling says whether this host is able to announce (it has desired state to act on). A member
// is never Ready while unwilling.
func (m *Members) SetWilling(w bool) {
	m.mu.Lock()
	m.willing = w
	m.mu.Unlock()
	m.evaluate(time.Now())
}

// OnChange sets a function called (from a membership goroutine, without locks held) whenever the
// View changes.
func (m *Members) OnChange(f func()) {
	m.mu.Lock()
	m.onChange = f
	m.mu.Unlock()
}

// View returns the latest evaluation of the membership.
func (m *Members) View() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.view
	v.Candidates = make(map[string]bool, len(m.view.Candidates))
	for n := range m.view.Candidates {
		v.Candidates[n] = true
	}
	return v
}

// Run sends heartbeats and tracks liveness until ctx ends; then it closes the socket.
func (m *Members) Run(ctx context.Context) {
	go m.receive(ctx)
	// Evaluate often enough that a silent member is noticed within a few ms of DeadAfter.
	tick := m.tick()
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastSent time.Time
	for {
		select {
		case <-ctx.Done():
			m.conn.Close()
			return
		case <-m.sendNow:
			m.send()
			lastSent = time.Now()
		case now := <-t.C:
			m.evaluate(now)
			if now.Sub(lastSent) >= m.opts.HeartbeatInterval-tick/2 {
				m.send()
				lastSent = now
			}
		}
	}
}

// send sends one heartbeat with the current view to every member.
func (m *Members) send() {
	m.mu.Lock()
	var hears []string
	for n := range m.view.Candidates {
		if n != m.self && m.vouchedLocked(n, time.Now()) {
			hears = append(hears, n)
		}
	}
	slices.Sort(hears)
	msg := encodeHeartbeat(m.self, m.view.Ready, hears)
	dsts := make([]netip.AddrPort, 0, len(m.peers))
	for _, addrs := range m.peers {
		dsts = append(dsts, netip.AddrPortFrom(addrs[0], uint16(m.port)))
	}
	m.mu.Unlock()
	for _, d := range dsts {
		// A send error (no route while a link is down) is the same as a lost heartbeat.
		_, _ = m.conn.WriteToUDPAddrPort(msg, d)
	}
}

func (m *Members) receive(ctx context.Context) {
	buf := make([]byte, maxHeartbeat)
	for ctx.Err() == nil {
		n, from, err := m.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		name, ready, hears, err := decodeHeartbeat(buf[:n])
		if err != nil || (m.drop != nil && m.drop(name)) {
			continue
		}
		now := time.Now()
		m.mu.Lock()
		// Only listed members count, and only from one of their own addresses.
		if slices.Contains(m.peers[name], from.Addr().Unmap()) {
			m.lastSeen[name] = now
			m.peerReady[name] = ready
			m.peerHears[name] = hears
		}
		m.mu.Unlock()
		m.evaluate(now)
	}
}

// heardLocked says whether member n was heard within DeadAfter. m.mu must be held.
func (m *Members) heardLocked(n string, now time.Time) bool {
	seen, ok := m.lastSeen[n]
	return ok && now.Sub(seen) < m.opts.DeadAfter
}

// takeoverAfter is how long a silent member still counts as a candidate owner: DeadAfter plus one
// heartbeat interval and two evaluation ticks. A member cut off from the rest stops announcing
// DeadAfter after the last heartbeat *it* heard, and that heartbeat may have been sent up to one
// interval after the last one the others heard from it; taking its VIPs over only after this longer
// window means the two sides never answer for one IP at the same time.
func (m *Members) takeoverAfter() time.Duration {
	return m.opts.DeadAfter + m.opts.HeartbeatInterval + 2*m.tick()
}

// tick is how often Run re-evaluates the view.
func (m *Members) tick() time.Duration { return min(m.opts.HeartbeatInterval/4, 25*time.Millisecond) }

// vouchedLocked says whether member n was heard recently enough to remain a candidate (and to relay
// what it hears). m.mu must be held.
func (m *Members) vouchedLocked(n string, now time.Time) bool {
	seen, ok := m.lastSeen[n]
	return ok && now.Sub(seen) < m.takeoverAfter()
}

// evaluate recomputes the View; on a change it logs, calls onChange and, if our ready flag changed,
// has Run send a heartbeat at once.
func (m *Members) evaluate(now time.Time) {
	m.mu.Lock()
	v := m.computeLocked(now)
	old := m.view
	if v.equal(old) {
		m.mu.Unlock()
		return
	}
	m.view = v
	f := m.onChange
	m.mu.Unlock()
	if v.Ready != old.Ready {
		m.log.Info("membership", "ready", v.Ready, "heard", v.Heard, "members", v.Total)
		select {
		case m.sendNow <- struct{}{}:
		default:
		}
	}
	for n := range v.Candidates {
		if !old.Candidates[n] && n != m.self {
			m.log.Info("member can announce", "node", n)
		}
	}
	for n := range old.Candidates {
		if !v.Candidates[n] && n != m.self {
			m.log.Info("member cannot announce", "node", n)
		}
	}
	if f != nil {
		f()
	}
}

// computeLocked is the pure part of evaluate. m.mu must be held.
func (m *Members) computeLocked(now time.Time) View {
	v := View{Candidates: map[string]bool{}, Total: len(m.peers) + 1, Heard: 1}
	// heard counts for our quorum; vouched (the longer window) for who may own VIPs.
	vouched := map[string]bool{}
	for n := range m.peers {
		if m.heardLocked(n, now) {
			v.Heard++
		}
		if m.vouchedLocked(n, now) {
			vouched[n] = true
		}
	}
	settled := v.Heard == v.Total || (!m.since.IsZero() && now.Sub(m.since) >= m.opts.DeadAfter)
	v.Ready = m.willing && settled && hasQuorum(m.self, v.Heard, v.Total, m.peers)
	if v.Ready {
		v.Candidates[m.self] = true
	}
	for n := range m.peers {
		if vouched[n] {
			// What a member says about itself beats what others relay about it.
			if m.peerReady[n] {
				v.Candidates[n] = true
			}
			continue
		}
		for k := range vouched {
			if slices.Contains(m.peerHears[k], n) {
				v.Candidates[n] = true
				break
			}
		}
	}
	return v
}

// hasQuorum: a strict majority of the members, self included; with two members the lexically lower
// name wins alone (the other one cannot tell a dead peer from a partition, so it must yield).
func hasQuorum(self string, heard, total int, peers map[string][]netip.Addr) bool {
	if 2*heard > total {
		return true
	}
	if total == 2 && heard == 1 {
		for other := range peers {
			return self < other
		}
	}
	return false
}

// Close stops receiving; Run also closes the socket when its context ends.
func (m *Members) Close() error { return m.conn.Close() }
