package speaker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Membership: which speakers may announce, fast enough to move a dead host's VIPs in well under a
// second, and safe against split brain and against forged heartbeats. README.md explains the
// design; in short:
//
//   - Every member sends a small UDP heartbeat to every other member every HeartbeatInterval (100 ms)
//     and counts a member as silent after DeadAfter (400 ms) without one. It takes a silent member's
//     VIPs over one heartbeat interval (and two 25 ms ticks) later than that (takeoverAfter), because
//     the silent member, if alive but cut off, stops answering DeadAfter after the last heartbeat it
//     heard, which may be up to one interval later.
//   - Heartbeats are authenticated (HMAC-SHA256 with a key the members share, bound to the
//     receiver) and carry a counter that only grows, and an echo of the receiver's own counter: a
//     forged datagram fails the MAC, a captured one is older than what the receiver already has, or
//     (after the receiver restarted) does not echo its current incarnation. Rejected datagrams are
//     counted and never evaluated (members_wire.go).
//   - A member is *ready* (may announce) only while it has desired state to act on, hears a strict
//     majority of the member list, itself included, and has been running for DeadAfter (so that at
//     start-up it first hears everyone instead of believing it is alone). Its heartbeats carry that
//     flag, and a member sends one at once when the flag changes, so its peers hand over or take back
//     its VIPs within a network round trip instead of a timeout.
//   - Heartbeats also carry the ready members the sender hears (a bitmap over the sorted member
//     list). A member counts another as a candidate owner when it hears that member directly, or
//     hears someone who does. So a partial partition (A and B cannot hear each other but both hear
//     C) does not make A and B both take the other's VIPs: every member still agrees on the same
//     candidate set.
//   - Ownership is then a pure function of the candidate set (rendezvous hashing in DecideL2), so
//     members that see the same set agree on the owners without exchanging them.
//   - Two members cannot form a majority after a failure. There the lexically lowest name keeps
//     announcing alone and the other one stops: a partition never leaves two owners, at the price
//     that the lower-named host's death is not taken over. A third member (any host running the
//     speaker, e.g. one no L2Advertisement selects: a witness) removes that limit.
//
// Cost: a heartbeat updates one member's state (O(1) plus a comparison of its heard bitmap); the
// view is recomputed, in O(members), only when a member's liveness, readiness or heard set changed.
//
// Kubernetes Leases are too slow for this (renewal and expiry take seconds: Cilium 10-20 s, kube-vip
// about 3 s), and MetalLB's memberlist detects a failure in about 4 s with its defaults.
type Members struct {
	log  hclog.Logger
	self string
	conn packetConn
	port int
	opts MemberOptions
	// boot is this incarnation's first counter (unix ns at start): peers must echo at least this.
	boot uint64

	// drop, if set, discards heartbeats from the named member (tests simulate partitions with it).
	drop func(from string) bool

	rejected map[dropReason]prometheus.Counter
	rejVec   *prometheus.CounterVec
	received prometheus.Counter
	sendErrs prometheus.Counter

	mu sync.Mutex
	// keys verify heartbeats; keys[0] signs them. {nil} when insecure.
	keys [][]byte
	// counter is the last counter sent.
	counter uint64
	// since is when the member list first became non-empty (start-up grace, see ready).
	since time.Time
	// settled is set once the start-up grace is over.
	settled bool
	// byName are the other members; sorted is every member, self included, sorted by name: heard
	// bitmaps index it, and digest identifies it.
	byName  map[string]*peer
	peers   []*peer
	sorted  []string
	selfIdx int
	digest  uint64
	// heardBy[i] counts the vouched peers whose heard set holds member i; alive counts the peers
	// heard within DeadAfter. Both are kept up to date on every change, so evaluation is O(members).
	heardBy []int32
	alive   int
	// dirty says the view must be recomputed.
	dirty bool
	// forgotten keeps the highest counter of members that left the list: if one comes back, its
	// heartbeats captured before it left are still replays.
	forgotten map[string]uint64
	// willing is set by the speaker once it can announce (it has a State): until then it tells the
	// others it is not ready, so they keep its VIPs instead of handing them to a host that would not
	// answer yet (a restarted node whose first sync is slow).
	willing bool
	// The last evaluated view, to notice changes, and the bitmap of the ready members we vouch for.
	view     View
	hears    bitmap
	onChange func()
	// sendNow asks Run to send a heartbeat at once (our ready flag changed).
	sendNow chan struct{}
	// lastLog and suppressed rate-limit the log lines about rejected datagrams, per reason.
	lastLog     map[dropReason]time.Time
	suppressed  map[dropReason]int
	lastSendErr time.Time
}

// peer is what this member knows of another.
type peer struct {
	name  string
	idx   int
	addrs []netip.Addr
	dst   netip.AddrPort
	// lastSeen is when its last accepted heartbeat arrived (zero: never); highest is the highest
	// counter it sent with a valid MAC (what we echo to it, and the floor for replays).
	lastSeen time.Time
	highest  uint64
	ready    bool
	// heard is the set of members it vouches for, in our index space (nil: unknown).
	heard bitmap
	// alive: heard within DeadAfter; vouched: within takeoverAfter (as of the last tick or datagram).
	alive, vouched bool
}

// packetConn is the datagram socket (a *net.UDPConn; a simulated transport in tests).
type packetConn interface {
	ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
	Close() error
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
	// Keys authenticate the heartbeats: the first signs, any verifies (two during a rotation).
	// Required unless Insecure.
	Keys [][]byte
	// Insecure runs without a key: anyone on the LAN who can send from a member's address can
	// steer the membership. Only for labs.
	Insecure bool
}

// Defaults of MemberOptions.
const (
	DefaultMemberPort        = 7473
	DefaultHeartbeatInterval = 100 * time.Millisecond
	DefaultDeadAfter         = 400 * time.Millisecond
	// MinKeyLen is the shortest accepted membership key (bytes).
	MinKeyLen = 16
)

// ErrNoMemberKey is returned by NewMembers without a key and without Insecure.
var ErrNoMemberKey = errors.New("the L2 membership needs a shared key to authenticate heartbeats " +
	"(--member-key-file or speaker.memberKeyFile, e.g. the vipgate-memberlist Secret); " +
	"--member-insecure runs without one, for labs only")

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

// NewMembers listens for heartbeats and returns the membership of self. It sends nothing until Run.
func NewMembers(log hclog.Logger, self string, opts MemberOptions) (*Members, error) {
	opts.Port = cmp.Or(opts.Port, DefaultMemberPort)
	laddr := &net.UDPAddr{Port: opts.Port}
	if opts.Bind.IsValid() {
		laddr.IP = opts.Bind.AsSlice()
	}
	m, err := newMembers(log, self, opts, nil)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("membership: listening on UDP port %d: %w", opts.Port, err)
	}
	m.conn = conn
	return m, nil
}

// newMembers is NewMembers on a given transport (nil: set by the caller).
func newMembers(log hclog.Logger, self string, opts MemberOptions, conn packetConn) (*Members, error) {
	if self == "" {
		return nil, errors.New("membership needs this node's name")
	}
	if len(self) > 253 {
		return nil, fmt.Errorf("membership: node name %q is longer than 253 bytes", self)
	}
	opts.Port = cmp.Or(opts.Port, DefaultMemberPort)
	opts.HeartbeatInterval = cmp.Or(opts.HeartbeatInterval, DefaultHeartbeatInterval)
	opts.DeadAfter = cmp.Or(opts.DeadAfter, DefaultDeadAfter)
	if opts.DeadAfter <= opts.HeartbeatInterval {
		return nil, fmt.Errorf("membership: deadAfter %v must be longer than the heartbeat interval %v", opts.DeadAfter, opts.HeartbeatInterval)
	}
	keys, err := checkKeys(opts.Keys, opts.Insecure)
	if err != nil {
		return nil, err
	}
	rejVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vipgate_speaker_heartbeats_rejected_total",
		Help: "Membership heartbeats dropped without being evaluated, by reason."}, []string{"reason"})
	m := &Members{log: log, self: self, conn: conn, port: opts.Port, opts: opts,
		boot: uint64(time.Now().UnixNano()), keys: keys, rejVec: rejVec, rejected: map[dropReason]prometheus.Counter{},
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipgate_speaker_heartbeats_received_total",
			Help: "Membership heartbeats accepted (authenticated, fresh, from a member's address)."}),
		sendErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipgate_speaker_heartbeat_send_errors_total",
			Help: "Heartbeats that could not be built (larger than the datagram bound): an error, never a cut."}),
		byName: map[string]*peer{}, forgotten: map[string]uint64{}, sorted: []string{self}, sendNow: make(chan struct{}, 1),
		lastLog: map[dropReason]time.Time{}, suppressed: map[dropReason]int{},
		view: View{Candidates: map[string]bool{}, Total: 1, Heard: 1}}
	m.counter = m.boot
	m.heardBy = make([]int32, 1)
	m.digest = memberDigest(m.sorted)
	for _, r := range allDropReasons {
		m.rejected[r] = rejVec.WithLabelValues(string(r))
	}
	return m, nil
}

// checkKeys validates the keys (or returns the insecure key set).
func checkKeys(keys [][]byte, insecure bool) ([][]byte, error) {
	if len(keys) == 0 {
		if !insecure {
			return nil, ErrNoMemberKey
		}
		return [][]byte{nil}, nil
	}
	for i, k := range keys {
		if len(k) < MinKeyLen {
			return nil, fmt.Errorf("membership key %d is %d bytes long, want at least %d (e.g. openssl rand -hex 32)", i+1, len(k), MinKeyLen)
		}
	}
	return slices.Clone(keys), nil
}

// Insecure says whether heartbeats are unauthenticated.
func (m *Members) Insecure() bool { return m.opts.Insecure && len(m.opts.Keys) == 0 }

// SetKeys replaces the keys (a rotation: the first signs from now on, any verifies).
func (m *Members) SetKeys(keys [][]byte) error {
	if len(keys) == 0 && !m.Insecure() {
		return ErrNoMemberKey
	}
	k, err := checkKeys(keys, m.Insecure())
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.keys = k
	m.mu.Unlock()
	return nil
}

// SetPeers replaces the member list (name -> addresses; self may be included, it is ignored).
// Members that are no longer listed are forgotten at once. An unchanged list costs O(members).
func (m *Members) SetPeers(peers map[string][]netip.Addr) {
	now := time.Now()
	m.mu.Lock()
	changed := m.setPeersLocked(peers, now)
	m.mu.Unlock()
	if changed {
		m.evaluate(now)
	}
}

func (m *Members) setPeersLocked(peers map[string][]netip.Addr, now time.Time) bool {
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
	if m.since.IsZero() {
		m.since = now
	}
	same := len(next) == len(m.byName)
	for n, addrs := range next {
		if p, ok := m.byName[n]; !same || !ok || !slices.Equal(p.addrs, addrs) {
			same = false
			break
		}
	}
	if same {
		return false
	}
	if len(next)+1 > MaxMembers {
		m.log.Error("more members than a heartbeat can describe: heartbeats will not be sent", "members", len(next)+1, "max", MaxMembers)
	}
	oldSorted := m.sorted
	sorted := make([]string, 0, len(next)+1)
	sorted = append(sorted, m.self)
	for n := range next {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	index := make(map[string]int, len(sorted))
	for i, n := range sorted {
		index[n] = i
	}
	for n, p := range m.byName {
		if _, ok := next[n]; !ok {
			m.forgotten[n] = p.highest
		}
	}
	byName := make(map[string]*peer, len(next))
	list := make([]*peer, 0, len(next))
	m.alive = 0
	for _, n := range sorted {
		if n == m.self {
			continue
		}
		p := m.byName[n]
		if p == nil {
			p = &peer{name: n, highest: m.forgotten[n]}
			delete(m.forgotten, n)
		}
		p.idx = index[n]
		p.addrs = next[n]
		p.dst = netip.AddrPortFrom(p.addrs[0], uint16(m.port))
		// Carry what it vouched for over into the new index space (a changed list must not make
		// the relayed candidates vanish until everyone has sent again).
		if p.heard != nil {
			nh := newBitmap(len(sorted))
			p.heard.forEach(func(i int) {
				if i < len(oldSorted) {
					if j, ok := index[oldSorted[i]]; ok {
						nh.set(j)
					}
				}
			})
			p.heard = nh
		}
		if p.alive {
			m.alive++
		}
		byName[n] = p
		list = append(list, p)
	}
	m.byName, m.peers, m.sorted, m.selfIdx = byName, list, sorted, index[m.self]
	m.digest = memberDigest(sorted)
	m.heardBy = make([]int32, len(sorted))
	for _, p := range list {
		if p.vouched {
			m.addHeard(p, 1)
		}
	}
	m.dirty = true
	return true
}

// addHeard adds (d=1) or removes (d=-1) p's heard set to heardBy.
func (m *Members) addHeard(p *peer, d int32) {
	p.heard.forEach(func(i int) {
		if i < len(m.heardBy) {
			m.heardBy[i] += d
		}
	})
}

// SetWilling says whether this host is able to announce (it has desired state to act on). A member
// is never Ready while unwilling.
func (m *Members) SetWilling(w bool) {
	m.mu.Lock()
	if m.willing != w {
		m.willing = w
		m.dirty = true
	}
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
	var buf []byte
	for {
		select {
		case <-ctx.Done():
			m.conn.Close()
			return
		case <-m.sendNow:
			buf = m.send(buf)
			lastSent = time.Now()
		case now := <-t.C:
			m.evaluate(now)
			if now.Sub(lastSent) >= m.opts.HeartbeatInterval-tick/2 {
				buf = m.send(buf)
				lastSent = now
			}
		}
	}
}

// outgoing is one round of heartbeats: the common body and, per destination, where and what to echo.
type outgoing struct {
	body  []byte
	key   []byte
	dsts  []netip.AddrPort
	names []string
	echo  []uint64
}

// prepare builds a round of heartbeats (under m.mu).
func (m *Members) prepareLocked(o *outgoing) error {
	m.counter++
	hb := heartbeat{name: m.self, ready: m.view.Ready, counter: m.counter, digest: m.digest, heard: m.hears}
	var err error
	o.body, err = appendHeartbeat(o.body[:0], &hb)
	if err != nil {
		return err
	}
	o.key = m.keys[0]
	o.dsts, o.names, o.echo = o.dsts[:0], o.names[:0], o.echo[:0]
	for _, p := range m.peers {
		o.dsts = append(o.dsts, p.dst)
		o.names = append(o.names, p.name)
		o.echo = append(o.echo, p.highest)
	}
	return nil
}

// echoOffset is where the echo sits in a body for a sender name of length n.
func echoOffset(n int) int { return 6 + n + 8 }

// send sends one heartbeat with the current view to every member; buf is reused across rounds.
func (m *Members) send(buf []byte) []byte {
	var o outgoing
	m.mu.Lock()
	err := m.prepareLocked(&o)
	m.mu.Unlock()
	if err != nil {
		m.sendErrs.Inc()
		if now := time.Now(); now.Sub(m.lastSendErr) > 10*time.Second {
			m.lastSendErr = now
			m.log.Error("not sending heartbeats", "err", err)
		}
		return buf
	}
	off := echoOffset(len(m.self))
	for i, d := range o.dsts {
		buf = append(buf[:0], o.body...)
		putUint64(buf[off:], o.echo[i])
		buf = mac(o.key, o.names[i], buf, buf)
		// A send error (no route while a link is down) is the same as a lost heartbeat.
		_, _ = m.conn.WriteToUDPAddrPort(buf, d)
	}
	return buf
}

func putUint64(b []byte, v uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

func (m *Members) receive(ctx context.Context) {
	buf := make([]byte, MaxHeartbeat+1)
	for ctx.Err() == nil {
		n, from, err := m.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m.handle(buf[:n], from.Addr().Unmap(), time.Now())
	}
}

// handle takes one datagram: it is checked (cheapest first: size, format, member, source, MAC,
// counter, echo) and, if it passes, updates the sender's state; the view is recomputed only if the
// sender's liveness, readiness or heard set changed. It returns why it was dropped ("" if not).
func (m *Members) handle(b []byte, from netip.Addr, now time.Time) dropReason {
	var hb heartbeat
	r := parseHeartbeat(b, &hb)
	if r == acceptedReason && m.drop != nil && m.drop(hb.name) {
		return dropPartition
	}
	m.mu.Lock()
	var p *peer
	if r == acceptedReason {
		r = m.checkLocked(b, &hb, from, &p)
	}
	if r != acceptedReason {
		m.rejectLocked(r, hb.name, from, now)
		m.mu.Unlock()
		return r
	}
	m.received.Inc()
	p.lastSeen = now
	if !p.alive {
		p.alive = true
		m.alive++
		m.dirty = true
	}
	if !p.vouched {
		p.vouched = true
		m.addHeard(p, 1)
		m.dirty = true
	}
	if p.ready != hb.ready {
		p.ready = hb.ready
		m.dirty = true
	}
	// A heard set written against another member list (one of us has not seen the latest Node
	// change yet) cannot be read: keep the last one we could.
	if hb.digest == m.digest && len(hb.heard) == (len(m.sorted)+7)/8 && !p.heard.equal(hb.heard) {
		if p.vouched {
			m.addHeard(p, -1)
		}
		p.heard = bitmap(hb.heard).clone()
		m.addHeard(p, 1)
		m.dirty = true
	}
	dirty := m.dirty
	m.mu.Unlock()
	if dirty {
		m.evaluate(now)
	}
	return acceptedReason
}

// checkLocked authenticates a parsed heartbeat; on success *pp is its sender and its counter has
// been recorded.
func (m *Members) checkLocked(b []byte, hb *heartbeat, from netip.Addr, pp **peer) dropReason {
	p := m.byName[hb.name]
	if p == nil {
		return dropNotMember
	}
	if !slices.Contains(p.addrs, from) {
		return dropWrongSrc
	}
	if !verify(m.keys, m.self, b) {
		return dropBadMAC
	}
	if hb.counter <= p.highest {
		return dropReplay
	}
	// Genuine and new: echo it from now on (how the sender learns we heard it since our start),
	// even if it does not count yet.
	p.highest = hb.counter
	if hb.echo < m.boot {
		return dropUnfreshed
	}
	*pp = p
	return acceptedReason
}

// rejectLocked counts a dropped datagram and logs it, at most once per reason every 10 s.
func (m *Members) rejectLocked(r dropReason, name string, from netip.Addr, now time.Time) {
	if c := m.rejected[r]; c != nil {
		c.Inc()
	}
	if now.Sub(m.lastLog[r]) < 10*time.Second {
		m.suppressed[r]++
		return
	}
	m.lastLog[r] = now
	n := m.suppressed[r]
	m.suppressed[r] = 0
	log := m.log.Warn
	if r == dropUnfreshed {
		// Normal for a round trip after either side starts: only a replay if it goes on.
		log = m.log.Debug
	}
	log("membership heartbeat rejected", "reason", string(r), "member", name, "source", from, "suppressed", n)
}

// tick is how often Run re-evaluates the view.
func (m *Members) tick() time.Duration { return min(m.opts.HeartbeatInterval/4, 25*time.Millisecond) }

// takeoverAfter is how long a silent member still counts as a candidate owner: DeadAfter plus one
// heartbeat interval and two evaluation ticks. A member cut off from the rest stops announcing
// DeadAfter after the last heartbeat *it* heard, and that heartbeat may have been sent up to one
// interval after the last one the others heard from it; taking its VIPs over only after this longer
// window means the two sides never answer for one IP at the same time.
func (m *Members) takeoverAfter() time.Duration {
	return m.opts.DeadAfter + m.opts.HeartbeatInterval + 2*m.tick()
}

// expireLocked notices members that went silent (O(members), on every tick).
func (m *Members) expireLocked(now time.Time) {
	take := m.takeoverAfter()
	for _, p := range m.peers {
		if p.alive && now.Sub(p.lastSeen) >= m.opts.DeadAfter {
			p.alive = false
			m.alive--
			m.dirty = true
		}
		if p.vouched && now.Sub(p.lastSeen) >= take {
			p.vouched = false
			m.addHeard(p, -1)
			m.dirty = true
		}
	}
	if !m.settled && !m.since.IsZero() && now.Sub(m.since) >= m.opts.DeadAfter {
		m.settled = true
		m.dirty = true
	}
}

// evaluate recomputes the View if something changed; on a change it logs, calls onChange and, if
// our ready flag changed, has Run send a heartbeat at once.
func (m *Members) evaluate(now time.Time) {
	m.mu.Lock()
	m.expireLocked(now)
	if !m.dirty {
		m.mu.Unlock()
		return
	}
	m.dirty = false
	v := m.computeLocked()
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

// computeLocked is the pure part of evaluate, O(members); it also refreshes the bitmap of the ready
// members we vouch for (what our heartbeats carry). m.mu must be held.
func (m *Members) computeLocked() View {
	v := View{Candidates: make(map[string]bool, len(m.view.Candidates)+1), Total: len(m.peers) + 1, Heard: 1 + m.alive}
	settled := v.Heard == v.Total || m.settled
	v.Ready = m.willing && settled && hasQuorum(m.self, v.Heard, v.Total, m.byName)
	if v.Ready {
		v.Candidates[m.self] = true
	}
	hears := newBitmap(len(m.sorted))
	for _, p := range m.peers {
		if p.vouched {
			// What a member says about itself beats what others relay about it.
			if p.ready {
				v.Candidates[p.name] = true
				hears.set(p.idx)
			}
			continue
		}
		if m.heardBy[p.idx] > 0 {
			v.Candidates[p.name] = true
		}
	}
	m.hears = hears
	return v
}

// hasQuorum: a strict majority of the members, self included; with two members the lexically lower
// name wins alone (the other one cannot tell a dead peer from a partition, so it must yield).
func hasQuorum(self string, heard, total int, peers map[string]*peer) bool {
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
