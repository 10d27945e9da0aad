// Package membership is the protocol by which vipgate's L2 speakers agree on which of them may
// announce: authenticated UDP heartbeats (gossip in large segments), their socket, keys and wire
// format, and the View each member derives (who is alive and ready, per L2 segment). It decides no
// owner and knows no Service: the speaker (speaker/) groups the members into segments, reads the
// views through its own Membership interface and decides; cmd/vipgate wires the two. README.md
// has the design and the measurements.
package membership

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
	"github.com/prometheus/client_golang/prometheus"
)

// Membership: which speakers may announce, fast enough to move a dead host's VIPs in well under a
// second, and safe against split brain and against forged heartbeats. README.md explains the
// design; in short:
//
//   - Members are grouped into L2 segments (speaker.L2Segments: the speakers that can announce a
//     pool's VIPs; SetSegments hands them over); everything below holds per segment, over one socket: liveness is per peer, readiness,
//     heard sets and candidates per segment, and a heartbeat carries its segment's digest.
//   - Every member sends a small UDP heartbeat to every other member of its segments every
//     HeartbeatInterval (100 ms) and counts a member as silent after DeadAfter (400 ms) without
//     one. It takes a silent member's VIPs over one heartbeat interval (and two 25 ms ticks) later
//     than that (takeoverAfter), because
//     the silent member, if alive but cut off, stops answering DeadAfter after the last heartbeat it
//     heard, which may be up to one interval later.
//   - Heartbeats are authenticated (HMAC-SHA256 with a key the members share, bound to the
//     receiver) and carry the sender's counter and an echo of the receiver's own counter: a forged
//     datagram fails the MAC, a captured one is not newer, by (echo, counter), than what the
//     receiver already has, or (after the receiver restarted) does not echo its current run.
//     Rejected datagrams are counted and never evaluated (members_wire.go, checkLocked).
//   - A member is *ready* (may announce) only while it has desired state to act on, hears a strict
//     majority of the segment's members, itself included, and hears every member, or has been running
//     for Options.StartupGrace (at least DeadAfter; vipgate's agents: 5 s), or for DeadAfter after it
//     heard every member at least once, so that at start-up it first hears everyone instead of
//     believing it is alone, while a member lost after that is a failure handled at once. Its heartbeats carry that
//     flag, and a member sends one at once when the flag changes, so its peers hand over or take back
//     its VIPs within a network round trip instead of a timeout.
//   - Heartbeats also carry the ready members the sender hears (a bitmap over the sorted member
//     list). A member counts another as a candidate owner when it hears that member directly, or
//     hears someone who does. So a partial partition (A and B cannot hear each other but both hear
//     C) does not make A and B both take the other's VIPs: every member still agrees on the same
//     candidate set.
//   - Ownership is then a pure function of the candidate set (rendezvous hashing in the speaker's
//     DecideL2, not here), so members that see the same set agree on the owners without
//     exchanging them.
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
	opts Options
	// boot is this incarnation's first counter (unix ns at start): peers must echo at least this.
	boot uint64

	// drop, if set, discards heartbeats from the named member (tests simulate partitions with it).
	drop func(from string) bool

	rejected map[dropReason]prometheus.Counter
	rejVec   *prometheus.CounterVec
	received prometheus.Counter
	sendErrs prometheus.Counter

	// sendMu orders the datagrams this member sends (counters are taken and datagrams written under
	// it), so two goroutines sending (Run's rounds, gossip replies from receive) never reorder the
	// counters one peer sees. Taken before mu.
	sendMu sync.Mutex
	// origin is the zero of the gossip cores' monotonic clock.
	origin time.Time
	// prevLists are the member lists of gossip segments this member left behind (by digest, the
	// newest few): while the informers of a large segment disagree about its members for a moment,
	// a vector written against a list we had is still read, member by member (gossipPrevKeep).
	prevLists map[uint64][]string
	prevOrder []uint64
	// rnd picks gossip peers (only under mu).
	rnd func(n int) int
	mu  sync.Mutex
	// keys verify heartbeats; keys[0] signs them. {nil} when insecure.
	keys [][]byte
	// counter is the last counter sent (one per datagram body: a peer sharing two segments with us
	// gets two datagrams per round, with growing counters).
	counter uint64
	// since is when the member list first became non-empty (start-up grace, see ready).
	since time.Time
	// settled is set once the start-up grace is over; pastDeadAfter once DeadAfter has passed
	// since, which settles a segment whose members were all heard at least once (heardAll).
	settled, pastDeadAfter bool
	// lastTick is when Run last evaluated on its ticker; graceUntil holds expiry back after this
	// process itself stalled (see stalled).
	lastTick, graceUntil time.Time
	// byName and peers are the other members of the segments this one belongs to (peers sorted by
	// name). Liveness (alive, vouched, counters) is per peer, whatever segment its datagram was for.
	byName map[string]*peer
	peers  []*peer
	// segs are the L2 segments this member belongs to (SetSegments), sorted by key. Readiness,
	// heard sets and candidates are per segment. Without SetSegments there is one segment: every
	// member given to SetPeers (the behaviour before segments).
	segs     []*segment
	explicit bool
	// alive counts the peers heard within DeadAfter.
	alive int
	// dirty says some view must be recomputed (the segments' own dirty flags say which).
	dirty bool
	// forgotten keeps the order of members that left the list: if one comes back, its heartbeats
	// captured before it left are still replays.
	forgotten map[string]peerOrder
	// willing is set by the speaker once it can announce (it has a State): until then it tells the
	// others it is not ready, so they keep its VIPs instead of handing them to a host that would not
	// answer yet (a restarted node whose first sync is slow).
	willing bool
	// withdrawn are the segments (by key) this member must not announce in although it could (the
	// speaker's link-aware ownership: the interface it would announce their VIPs on is down). It
	// stays a voter there (alive, counted in majorities) but is not ready, and says so.
	withdrawn map[uint64]bool
	// view aggregates the segments' views (what View and the metrics show).
	view     View
	onChange func()
	// sendNow asks Run to send a heartbeat at once (our ready flag changed).
	sendNow chan struct{}
	// lastLog and suppressed rate-limit the log lines about rejected datagrams, per reason.
	lastLog     map[dropReason]time.Time
	suppressed  map[dropReason]int
	lastSendErr time.Time
}

// segment is one L2 membership this member belongs to: its own member list (self included), its
// majority, heard sets and candidates. Heartbeats for it carry its digest.
type segment struct {
	key     uint64
	sorted  []string
	selfIdx int
	// members are the other members, in the order of sorted.
	members []*segMember
	// heardBy[i] counts the vouched members whose heard set holds member i; alive counts the
	// members heard within DeadAfter. Both are kept up to date on every change, so evaluation is
	// O(members of the segment).
	heardBy []int32
	alive   int
	dirty   bool
	// heardAll: every member was heard at least once (see settledLocked).
	heardAll bool
	// The last evaluated view, and the bitmap of the ready members we vouch for (what our
	// heartbeats for this segment carry).
	view  View
	hears bitmap
	// gossip is set in gossip mode (more members than DirectMembersLimit): the segment's liveness
	// and readiness come from it, not from heartbeats (gossip_members.go).
	gossip *gossipState
}

// segMember is a peer as a member of one segment: what it said about itself and others there.
type segMember struct {
	p     *peer
	seg   *segment
	idx   int
	ready bool
	// heard is the set of members it vouches for in this segment, in its index space (nil: unknown).
	heard bitmap
}

// peer is what this member knows of another.
type peer struct {
	name  string
	addrs []netip.Addr
	dst   netip.AddrPort
	// lastSeen is when its last accepted heartbeat arrived (zero: never).
	lastSeen time.Time
	// order is the (echo, counter) of its last accepted datagram: the next one must be greater
	// (see checkLocked).
	order peerOrder
	// echoBack is the counter we echo to it (of its last accepted datagram, or of a genuine one
	// that did not echo this run yet), set at echoAt.
	echoBack uint64
	echoAt   time.Time
	// alive: heard within DeadAfter; vouched: within takeoverAfter (as of the last tick or datagram).
	alive, vouched bool
	// in are its memberships of the segments we share with it.
	in []*segMember
}

// packetConn is the datagram socket (a *net.UDPConn; a simulated transport in tests).
type packetConn interface {
	ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
	Close() error
}

// Options configures the membership protocol. Zero values mean the defaults.
type Options struct {
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
	// DirectMembersLimit is the largest segment that runs the all-to-all heartbeats; a larger one
	// runs gossip mode (gossip.go). 0: DefaultDirectMembersLimit (128); negative: every segment
	// gossips (the config's 0; tests force gossip mode in a 3-node lab with it).
	DirectMembersLimit int
	// GossipFanout is to how many members a gossip round sends the vector (0: DefaultGossipFanout).
	GossipFanout int
	// StartupGrace is how long after start-up a member that does not yet hear every member of a
	// segment waits before it may announce without them (0 or less than DeadAfter: DeadAfter). It
	// keeps agents that start a few seconds apart (a migration, a cluster's cold start) from taking
	// each other's VIPs for the moment between their starts; a member that hears everyone is settled
	// at once, and one that heard everyone once is settled after DeadAfter (a member lost then is a
	// failure: the others take its VIPs at once). vipgate's node agent and gateway use
	// DefaultStartupGrace.
	StartupGrace time.Duration
}

// Defaults of Options.
const (
	DefaultPort              = 7473
	DefaultHeartbeatInterval = 100 * time.Millisecond
	DefaultDeadAfter         = 400 * time.Millisecond
	// DefaultDirectMembersLimit is the largest segment that heartbeats all-to-all (above: gossip).
	DefaultDirectMembersLimit = 128
	// DefaultGossipFanout is how many members a gossip round sends the vector to.
	DefaultGossipFanout = 1
	// DefaultStartupGrace is the StartupGrace vipgate's agents run with.
	DefaultStartupGrace = 5 * time.Second
	// MinKeyLen is the shortest accepted membership key, in bytes (characters of a key file line):
	// 32 hex characters are 128 bits, the least any alphabet a key is written in (hex, base64,
	// text) gives at this length. (16 was 64 bits for a hex key.)
	MinKeyLen = 32
)

// ErrNoKey is returned by New without a key and without Insecure.
var ErrNoKey = errors.New("the L2 membership needs a shared key to authenticate heartbeats " +
	"(--member-key-file or speaker.memberKeyFile, e.g. the vipgate-memberlist Secret); " +
	"--member-insecure runs without one, for labs only")

// View is one evaluation of the membership from this member's side.
type View struct {
	// Candidates are the members that may own VIPs: this one if Ready, and every ready member it
	// hears directly or through a member it hears. The speaker picks owners among them (DecideL2).
	Candidates map[string]bool
	// Ready says this member may announce: it is willing (SetWilling), not withdrawn from the
	// segment (SetWithdrawn), hears a strict majority of the members (or wins the two-member
	// tie-break) and its start-up grace is over.
	Ready bool
	// Heard is how many members this one hears directly, itself included; Total is the member count.
	Heard, Total int
	// Members are the segment's members, sorted (SegmentViews only): what the speaker keys its
	// segments by.
	Members []string
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

// New listens for heartbeats and returns the membership of self. It sends nothing until Run.
func New(log hclog.Logger, self string, opts Options) (*Members, error) {
	opts.Port = cmp.Or(opts.Port, DefaultPort)
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

// newMembers is New on a given transport (nil: set by the caller).
func newMembers(log hclog.Logger, self string, opts Options, conn packetConn) (*Members, error) {
	if self == "" {
		return nil, errors.New("membership needs this node's name")
	}
	if len(self) > 253 {
		return nil, fmt.Errorf("membership: node name %q is longer than 253 bytes", self)
	}
	opts.Port = cmp.Or(opts.Port, DefaultPort)
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
		byName: map[string]*peer{}, forgotten: map[string]peerOrder{}, sendNow: make(chan struct{}, 1),
		lastLog: map[dropReason]time.Time{}, suppressed: map[dropReason]int{},
		view: View{Candidates: map[string]bool{}, Total: 1, Heard: 1}}
	m.counter = m.boot
	m.origin = time.Now()
	m.rnd = newGossipRand(self, m.boot)
	m.segs = []*segment{newSegment([]string{self}, self)}
	for _, r := range allDropReasons {
		m.rejected[r] = rejVec.WithLabelValues(string(r))
	}
	return m, nil
}

// checkKeys validates the keys (or returns the insecure key set).
func checkKeys(keys [][]byte, insecure bool) ([][]byte, error) {
	if len(keys) == 0 {
		if !insecure {
			return nil, ErrNoKey
		}
		return [][]byte{nil}, nil
	}
	for i, k := range keys {
		if len(k) < MinKeyLen {
			return nil, fmt.Errorf("membership key %d is %d bytes long, want at least %d (128 bits as hex; e.g. openssl rand -hex 32)", i+1, len(k), MinKeyLen)
		}
	}
	return slices.Clone(keys), nil
}

// Insecure says whether heartbeats are unauthenticated.
func (m *Members) Insecure() bool { return m.opts.Insecure && len(m.opts.Keys) == 0 }

// SetKeys replaces the keys (a rotation: the first signs from now on, any verifies).
func (m *Members) SetKeys(keys [][]byte) error {
	if len(keys) == 0 && !m.Insecure() {
		return ErrNoKey
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

// SetPeers replaces the member list (name -> addresses; self may be included, it is ignored) and
// makes it one segment: every member votes in one majority. Members that are no longer listed are
// forgotten at once. An unchanged list costs O(members).
func (m *Members) SetPeers(peers map[string][]netip.Addr) {
	now := time.Now()
	m.mu.Lock()
	changed := m.setMembershipLocked(peers, nil, false, now)
	m.mu.Unlock()
	if changed {
		m.evaluate(now)
	}
}

// SetSegments replaces the member list and the L2 segments (each a list of member names: the
// speaker's L2Segments). Only the segments holding this member count: it sends heartbeats to their members
// only, and is ready (per segment) when it hears a strict majority of a segment. Members in no
// segment shared with this one are not tracked; with no segment at all, nothing is sent. A segment
// member without an address counts in its segment's majority but can never be heard.
func (m *Members) SetSegments(peers map[string][]netip.Addr, segments [][]string) {
	now := time.Now()
	m.mu.Lock()
	changed := m.setMembershipLocked(peers, segments, true, now)
	m.mu.Unlock()
	if changed {
		m.evaluate(now)
	}
}

// newSegment makes an empty segment of the given members (self must be one of them).
func newSegment(members []string, self string) *segment {
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	g := &segment{key: SegmentKey(sorted), sorted: sorted, heardBy: make([]int32, len(sorted)), dirty: true,
		view: View{Candidates: map[string]bool{}, Total: len(sorted), Heard: 1}}
	g.selfIdx, _ = slices.BinarySearch(sorted, self)
	return g
}

func (m *Members) setMembershipLocked(peers map[string][]netip.Addr, segLists [][]string, explicit bool, now time.Time) bool {
	addrs := map[string][]netip.Addr{}
	for n, as := range peers {
		if n == m.self {
			continue
		}
		var valid []netip.Addr
		for _, a := range as {
			if a.IsValid() {
				valid = append(valid, a.Unmap())
			}
		}
		if len(valid) > 0 {
			addrs[n] = valid
		}
	}
	// The segments that hold self; without explicit segments, one of everyone with an address.
	var lists [][]string
	if !explicit {
		all := []string{m.self}
		for n := range addrs {
			all = append(all, n)
		}
		lists = [][]string{all}
	} else {
		for _, l := range segLists {
			if slices.Contains(l, m.self) {
				lists = append(lists, l)
			}
		}
	}
	next := make([]*segment, 0, len(lists))
	for _, l := range lists {
		next = append(next, newSegment(l, m.self))
	}
	slices.SortFunc(next, func(a, b *segment) int { return cmp.Compare(a.key, b.key) })
	next = slices.CompactFunc(next, func(a, b *segment) bool { return a.key == b.key })
	// The peers: every other member of those segments (with an address, or it cannot be reached).
	want := map[string][]netip.Addr{}
	for _, g := range next {
		for _, n := range g.sorted {
			if n != m.self && addrs[n] != nil {
				want[n] = addrs[n]
			}
		}
	}
	if m.since.IsZero() {
		m.since = now
	}
	same := explicit == m.explicit && len(next) == len(m.segs) && len(want) == len(m.byName)
	for i := 0; same && i < len(next); i++ {
		same = next[i].key == m.segs[i].key
	}
	for n, as := range want {
		if p, ok := m.byName[n]; !same || !ok || !slices.Equal(p.addrs, as) {
			same = false
			break
		}
	}
	if same {
		return false
	}
	m.explicit = explicit
	for _, g := range next {
		if limit := m.gossipLimit(); (limit < 0 || len(g.sorted) > limit) && len(g.sorted) > 1 {
			// Gossip mode (gossip_members.go): the vector goes in chunks of a 16-bit count.
			if len(g.sorted) > MaxGossipMembers {
				m.log.Error("more members in an L2 segment than a gossip vector can describe: gossip for it will not be sent",
					"members", len(g.sorted), "max", MaxGossipMembers)
			}
		} else if len(g.sorted) > MaxMembers {
			m.log.Error("more members in an L2 segment than a heartbeat can describe: heartbeats for it will not be sent",
				"members", len(g.sorted), "max", MaxMembers)
		}
	}
	for n, p := range m.byName {
		if _, ok := want[n]; !ok {
			m.forgotten[n] = p.order
		}
	}
	byName := make(map[string]*peer, len(want))
	list := make([]*peer, 0, len(want))
	for n, as := range want {
		p := m.byName[n]
		if p == nil {
			p = &peer{name: n, order: m.forgotten[n]}
			delete(m.forgotten, n)
		}
		p.addrs = as
		p.dst = netip.AddrPortFrom(as[0], uint16(m.port))
		byName[n] = p
		list = append(list, p)
	}
	slices.SortFunc(list, func(a, b *peer) int { return strings.Compare(a.name, b.name) })
	// What a peer said in the old segments is carried over to the new ones (a changed list must not
	// make its readiness or the relayed candidates vanish until everyone has sent again): from the
	// old segment with the same key, else the one of its old segments that overlaps most.
	overlap := func(a, b *segment) int {
		n := 0
		for _, x := range a.sorted {
			if _, ok := slices.BinarySearch(b.sorted, x); ok {
				n++
			}
		}
		return n
	}
	old := map[*peer][]*segMember{}
	for _, p := range list {
		old[p], p.in = p.in, nil
	}
	m.alive = 0
	for _, p := range list {
		if p.alive {
			m.alive++
		}
	}
	for _, g := range next {
		index := make(map[string]int, len(g.sorted))
		for i, n := range g.sorted {
			index[n] = i
		}
		for i, n := range g.sorted {
			p := byName[n]
			if p == nil {
				continue
			}
			sm := &segMember{p: p, seg: g, idx: i}
			var from *segMember
			best := -1
			for _, o := range old[p] {
				if o.seg.key == g.key {
					from = o
					break
				}
				if ov := overlap(o.seg, g); ov > best {
					from, best = o, ov
				}
			}
			if from != nil {
				sm.ready = from.ready
				if from.heard != nil {
					nh := newBitmap(len(g.sorted))
					from.heard.forEach(func(j int) {
						if j < len(from.seg.sorted) {
							if k, ok := index[from.seg.sorted[j]]; ok {
								nh.set(k)
							}
						}
					})
					sm.heard = nh
				}
			}
			p.in = append(p.in, sm)
			g.members = append(g.members, sm)
			if p.alive {
				g.alive++
			}
			if p.vouched {
				addHeard(sm, 1)
			}
		}
	}
	m.setupGossipLocked(next, now)
	m.byName, m.peers, m.segs = byName, list, next
	m.dirty = true
	return true
}

// addHeard adds (d=1) or removes (d=-1) sm's heard set to its segment's heardBy.
func addHeard(sm *segMember, d int32) {
	hb := sm.seg.heardBy
	sm.heard.forEach(func(i int) {
		if i < len(hb) {
			hb[i] += d
		}
	})
}

// SetWilling says whether this host is able to announce (it has desired state to act on). A member
// is never Ready while unwilling.
func (m *Members) SetWilling(w bool) {
	m.mu.Lock()
	if m.willing != w {
		m.willing = w
		m.markAllLocked()
	}
	m.mu.Unlock()
	m.evaluate(time.Now())
}

// SetWithdrawn names the segments (member lists, as SetSegments takes them) in which this member
// must not announce, although it may vote: the speaker's link-aware ownership withdraws a node
// from a segment while the interface it would announce the segment's VIPs on is down, and until
// the link has been up for a hold-down. In those segments it is not Ready, so it is no candidate
// of its own and, since its heartbeats carry that flag (authenticated like the rest: a LAN
// attacker can neither forge nor replay it), of no other member either; it still counts in every
// majority. A change is evaluated at once and, if a ready flag changed, heartbeats go out at once.
// A list that matches none of this member's segments is kept, and applies if such a segment
// appears (the speaker hands the new segments' withdrawals over before SetSegments).
func (m *Members) SetWithdrawn(segments [][]string) {
	next := make(map[uint64]bool, len(segments))
	for _, l := range segments {
		sorted := slices.Clone(l)
		slices.Sort(sorted)
		next[SegmentKey(slices.Compact(sorted))] = true
	}
	m.mu.Lock()
	changed := len(next) != len(m.withdrawn)
	for k := range next {
		changed = changed || !m.withdrawn[k]
	}
	var logs []uint64
	if changed {
		for _, g := range m.segs {
			if next[g.key] != m.withdrawn[g.key] {
				logs = append(logs, g.key)
			}
		}
		m.withdrawn = next
		m.markAllLocked()
	}
	m.mu.Unlock()
	for _, k := range logs {
		m.log.Info("membership", "withdrawn", next[k], "segment", fmt.Sprintf("%016x", k))
	}
	if changed {
		m.evaluate(time.Now())
	}
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

// SegmentViews returns the latest evaluation of every segment this member belongs to, by segment
// key (SegmentKey of its sorted members, the digest on the wire), each with its Members: what the
// speaker's DecideL2 takes as L2Input.SegmentViews (cmd/vipgate keys them by the speaker's key).
func (m *Members) SegmentViews() map[uint64]View {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[uint64]View, len(m.segs))
	for _, g := range m.segs {
		v := g.view
		v.Candidates = make(map[string]bool, len(g.view.Candidates))
		for n := range g.view.Candidates {
			v.Candidates[n] = true
		}
		v.Members = slices.Clone(g.sorted)
		out[g.key] = v
	}
	return out
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
			now := time.Now()
			buf = m.send(buf)
			lastSent = now
			buf = m.gossipRound(buf, now, true)
		case now := <-t.C:
			m.stalled(now)
			m.evaluate(now)
			if now.Sub(lastSent) >= m.opts.HeartbeatInterval-tick/2 {
				buf = m.send(buf)
				lastSent = now
			}
			buf = m.gossipRound(buf, now, false)
		}
	}
}

// outgoing is one segment's heartbeats of a round: the common body and, per destination, where
// and what to echo.
type outgoing struct {
	body  []byte
	key   []byte
	dsts  []netip.AddrPort
	names []string
	echo  []uint64
}

// prepareLocked builds a round of heartbeats, one body per segment (under m.mu).
func (m *Members) prepareLocked(os []outgoing) ([]outgoing, error) {
	os = os[:0]
	var firstErr error
	for _, g := range m.segs {
		if len(g.members) == 0 || g.gossip != nil {
			continue
		}
		m.counter++
		hb := heartbeat{name: m.self, ready: g.view.Ready, counter: m.counter, digest: g.key, heard: g.hears}
		var o outgoing
		var err error
		if o.body, err = appendHeartbeat(nil, &hb); err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		o.key = m.keys[0]
		for _, sm := range g.members {
			o.dsts = append(o.dsts, sm.p.dst)
			o.names = append(o.names, sm.p.name)
			o.echo = append(o.echo, sm.p.echoBack)
		}
		os = append(os, o)
	}
	return os, firstErr
}

// echoOffset is where the echo sits in a body for a sender name of length n.
func echoOffset(n int) int { return 6 + n + 8 }

// send sends one heartbeat per segment with its current view to every member of the segment; buf
// is reused across rounds. A segment whose heartbeat would be oversize is an error, the others are
// still sent.
func (m *Members) send(buf []byte) []byte {
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	m.mu.Lock()
	os, err := m.prepareLocked(nil)
	m.mu.Unlock()
	if err != nil {
		m.sendErrs.Inc()
		if now := time.Now(); now.Sub(m.lastSendErr) > 10*time.Second {
			m.lastSendErr = now
			m.log.Error("not sending heartbeats", "err", err)
		}
	}
	off := echoOffset(len(m.self))
	for _, o := range os {
		for i, d := range o.dsts {
			buf = append(buf[:0], o.body...)
			putUint64(buf[off:], o.echo[i])
			buf = mac(o.key, o.names[i], buf, buf)
			// A send error (no route while a link is down) is the same as a lost heartbeat.
			_, _ = m.conn.WriteToUDPAddrPort(buf, d)
		}
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
//
// Liveness counts whatever segment the datagram is for. Its ready flag and heard set belong to the
// segment whose digest it carries; when no shared segment has that digest (the two members have
// not seen the same member list yet: a node joined or left), the ready flag still applies if the
// sender shares exactly one segment with us, and the last readable heard set stays in force.
func (m *Members) handle(b []byte, from netip.Addr, now time.Time) dropReason {
	if len(b) >= 4 && string(b[:4]) == gossipMagic {
		return m.handleGossip(b, from, now)
	}
	var hb heartbeat
	r := parseHeartbeat(b, &hb)
	if r == acceptedReason && m.drop != nil && m.drop(hb.name) {
		return dropPartition
	}
	m.mu.Lock()
	var p *peer
	if r == acceptedReason {
		r = m.checkLocked(b, &hb, from, now, &p)
	}
	if r != acceptedReason {
		m.rejectLocked(r, hb.name, from, now)
		m.mu.Unlock()
		return r
	}
	m.received.Inc()
	m.touchLocked(p, now)
	var sm *segMember
	match := false
	for _, x := range p.in {
		if x.seg.key == hb.digest {
			sm, match = x, true
			break
		}
	}
	if sm == nil && len(p.in) == 1 {
		sm = p.in[0]
	}
	if sm != nil && sm.seg.gossip != nil {
		// A heartbeat for a segment we gossip in (the sender's DirectMembersLimit differs): a proof
		// of life and readiness of its sender, nothing more.
		if match {
			m.gossipHeardLocked(sm, hb.ready, now)
		}
		sm = nil
	}
	if sm != nil {
		if sm.ready != hb.ready {
			sm.ready = hb.ready
			sm.seg.dirty, m.dirty = true, true
		}
		if match && len(hb.heard) == (len(sm.seg.sorted)+7)/8 && !sm.heard.equal(hb.heard) {
			addHeard(sm, -1)
			sm.heard = bitmap(hb.heard).clone()
			addHeard(sm, 1)
			sm.seg.dirty, m.dirty = true, true
		}
	}
	dirty := m.dirty
	m.mu.Unlock()
	if dirty {
		m.evaluate(now)
	}
	return acceptedReason
}

// touchLocked records an accepted datagram of p: it is alive and vouched for (in the all-to-all
// segments it is in; gossip segments take liveness from their vectors).
func (m *Members) touchLocked(p *peer, now time.Time) {
	p.lastSeen = now
	if !p.alive {
		p.alive = true
		m.alive++
		for _, sm := range p.in {
			sm.seg.alive++
			if sm.seg.gossip == nil {
				sm.seg.dirty = true
			}
		}
		m.dirty = true
	}
	if !p.vouched {
		p.vouched = true
		for _, sm := range p.in {
			addHeard(sm, 1)
			if sm.seg.gossip == nil {
				sm.seg.dirty = true
				m.dirty = true
			}
		}
	}
}

// peerOrder orders a member's datagrams: by the echo they carry (our own counter, which only grows
// during our run), then by the sender's counter.
type peerOrder struct{ echo, counter uint64 }

// checkLocked authenticates a parsed heartbeat; on success *pp is its sender and its order has
// been recorded.
//
// Freshness and order come from the echo, i.e. from our own counter, not from the sender's: a
// datagram counts only if it echoes a counter of this run of ours (between our boot counter and the
// last one we sent), and only if (echo, counter) is greater than in the last datagram accepted from
// that member. A replay carries an echo and a counter we have already seen; a datagram captured
// before our restart echoes another run's counter. The sender's counter only orders the datagrams it
// sent between two of ours. So nothing a sender's counter says can lock it out: not a forged counter
// of 2^64-1 (its next genuine datagram echoes a counter we sent after the forgery was accepted, and
// the forger cannot echo one we have not sent yet), nor a restart with its clock behind (its new
// counters are smaller, its echoes newer). Before, the counter alone was compared, and either left
// the member's datagrams "replays" until the receiver restarted (issue 27).
//
// A genuine datagram that does not echo this run (the sender has not heard us since we started, or
// echoes a counter we never sent: a keyed forger made us accept one of its own) is not evaluated,
// but, once we have accepted nothing from the sender for DeadAfter, its counter is echoed from then
// on, so the sender's next datagram counts: a greater counter replaces the echo at once, a smaller
// one (a restart with the clock behind) once the echo has not been refreshed for DeadAfter.
//
// While the sender is heard (a datagram accepted within DeadAfter), such datagrams change nothing:
// a datagram that does not echo this run may be a replay, of any age, and one of a previous run of
// the sender (whose counters are larger if it restarted with its clock behind) would otherwise set
// the echo to a counter the sender's current run refuses, so the sender would stop hearing us
// while the replays go on (TestReplayedOldRunNoEchoPoison). Nothing is lost by waiting: a sender
// that restarted is accepted as soon as it echoes our counters (it takes them from our datagrams,
// which do not echo its new run), and the echo is then its new counter; only a member that stopped
// echoing our run while we still accept it (a keyed forger made it refuse us) needs the DeadAfter
// until its counter is taken.
func (m *Members) checkLocked(b []byte, hb *heartbeat, from netip.Addr, now time.Time, pp **peer) dropReason {
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
	if hb.echo < m.boot || hb.echo > m.counter {
		if now.Sub(p.lastSeen) >= m.opts.DeadAfter && (hb.counter > p.echoBack || now.Sub(p.echoAt) >= m.opts.DeadAfter) {
			p.echoBack, p.echoAt = hb.counter, now
		}
		return dropUnfreshed
	}
	if o := p.order; hb.echo < o.echo || hb.echo == o.echo && hb.counter <= o.counter {
		return dropReplay
	}
	p.order = peerOrder{echo: hb.echo, counter: hb.counter}
	p.echoBack, p.echoAt = hb.counter, now
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

// stalled notices that this process itself did not run for a while (more than two ticks between
// two ticks: CPU starvation, a long GC pause, a frozen VM). The heartbeats that arrived meanwhile are
// still in the socket buffer, read only after this tick, so expiring now would find every peer
// silent and make this node drop its VIPs for nothing (measured under CPU saturation: the whole
// process stalls up to 1.4 s). Expiry waits one tick, long enough for the receiver to drain the
// buffer. The price: a node that was stalled past the takeover time, and whose peers did take over,
// may answer alongside the new owner for up to one tick plus a round trip after it resumes.
func (m *Members) stalled(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tick := m.tick()
	if !m.lastTick.IsZero() && now.Sub(m.lastTick) > 2*tick {
		m.graceUntil = now.Add(tick)
	}
	m.lastTick = now
}

// expireLocked notices members that went silent (O(members), on every tick).
func (m *Members) expireLocked(now time.Time) {
	if now.Before(m.graceUntil) {
		return
	}
	take := m.takeoverAfter()
	for _, p := range m.peers {
		if p.alive && now.Sub(p.lastSeen) >= m.opts.DeadAfter {
			p.alive = false
			m.alive--
			for _, sm := range p.in {
				sm.seg.alive--
				if sm.seg.gossip == nil {
					sm.seg.dirty = true
				}
			}
			m.dirty = true
		}
		if p.vouched && now.Sub(p.lastSeen) >= take {
			p.vouched = false
			for _, sm := range p.in {
				addHeard(sm, -1)
				if sm.seg.gossip == nil {
					sm.seg.dirty, m.dirty = true, true
				}
			}
		}
	}
	m.gossipTickLocked(now)
	if !m.settled && !m.since.IsZero() {
		age := now.Sub(m.since)
		if !m.pastDeadAfter && age >= m.opts.DeadAfter {
			m.pastDeadAfter = true
			m.markAllLocked()
		}
		if age >= max(m.opts.StartupGrace, m.opts.DeadAfter) {
			m.settled = true
			m.markAllLocked()
		}
	}
}

// settledLocked says whether segment g is past the start-up grace given its view v: it hears every
// member now; or the grace is over; or every member was heard at least once and DeadAfter has
// passed (a member lost after the segment was whole is a failure, not a late start). With
// StartupGrace at most DeadAfter this is the old rule: whole, or DeadAfter passed.
func (m *Members) settledLocked(g *segment, v View) bool {
	if v.Heard == v.Total {
		g.heardAll = true
		return true
	}
	return m.settled || (g.heardAll && m.pastDeadAfter)
}

// markAllLocked marks every segment for evaluation (something global changed: willing, settled).
func (m *Members) markAllLocked() {
	for _, g := range m.segs {
		g.dirty = true
	}
	m.dirty = true
}

// evaluate recomputes the views of the segments that changed; on a change it logs, calls onChange
// and, if one of our ready flags changed, has Run send a heartbeat at once.
func (m *Members) evaluate(now time.Time) {
	m.mu.Lock()
	m.expireLocked(now)
	if !m.dirty {
		m.mu.Unlock()
		return
	}
	m.dirty = false
	type change struct {
		key      uint64
		old, new View
	}
	var changes []change
	for _, g := range m.segs {
		if !g.dirty {
			continue
		}
		g.dirty = false
		v := m.computeLocked(g)
		if !v.equal(g.view) {
			changes = append(changes, change{g.key, g.view, v})
			g.view = v
		}
	}
	agg := m.aggregateLocked()
	aggChanged := !agg.equal(m.view)
	m.view = agg
	if len(changes) == 0 && !aggChanged {
		m.mu.Unlock()
		return
	}
	f := m.onChange
	multi := len(m.segs) > 1
	m.mu.Unlock()
	send := false
	for _, c := range changes {
		var kv []any
		if multi {
			kv = []any{"segment", fmt.Sprintf("%016x", c.key)}
		}
		if c.new.Ready != c.old.Ready {
			send = true
			m.log.Info("membership", append([]any{"ready", c.new.Ready, "heard", c.new.Heard, "members", c.new.Total}, kv...)...)
		}
		for n := range c.new.Candidates {
			if !c.old.Candidates[n] && n != m.self {
				m.log.Info("member can announce", append([]any{"node", n}, kv...)...)
			}
		}
		for n := range c.old.Candidates {
			if !c.new.Candidates[n] && n != m.self {
				m.log.Info("member cannot announce", append([]any{"node", n}, kv...)...)
			}
		}
	}
	if send {
		select {
		case m.sendNow <- struct{}{}:
		default:
		}
	}
	if f != nil {
		f()
	}
}

// computeLocked is the pure part of evaluate for one segment, O(members of the segment); it also
// refreshes the bitmap of the ready members we vouch for there (what our heartbeats carry).
// m.mu must be held.
func (m *Members) computeLocked(g *segment) View {
	if g.gossip != nil {
		return m.computeGossipLocked(g)
	}
	v := View{Candidates: make(map[string]bool, len(g.view.Candidates)+1), Total: len(g.sorted), Heard: 1 + g.alive}
	settled := m.settledLocked(g, v)
	other := ""
	if len(g.sorted) == 2 {
		other = g.sorted[1-g.selfIdx]
	}
	v.Ready = m.willing && !m.withdrawn[g.key] && settled && hasQuorum(m.self, v.Heard, v.Total, other)
	if v.Ready {
		v.Candidates[m.self] = true
	}
	hears := newBitmap(len(g.sorted))
	for _, sm := range g.members {
		if sm.p.vouched {
			// What a member says about itself beats what others relay about it.
			if sm.ready {
				v.Candidates[sm.p.name] = true
				hears.set(sm.idx)
			}
			continue
		}
		if g.heardBy[sm.idx] > 0 {
			v.Candidates[sm.p.name] = true
		}
	}
	g.hears = hears
	return v
}

// aggregateLocked sums the segments up for View and the metrics: one segment is shown as it is;
// several as the members of all of them, ready only when ready in every one, and the union of
// their candidates. No segment at all: not ready, alone.
func (m *Members) aggregateLocked() View {
	if len(m.segs) == 1 {
		return m.segs[0].view
	}
	v := View{Candidates: map[string]bool{}, Total: len(m.peers) + 1, Heard: 1 + m.alive, Ready: len(m.segs) > 0}
	for _, g := range m.segs {
		v.Ready = v.Ready && g.view.Ready
		for n := range g.view.Candidates {
			v.Candidates[n] = true
		}
	}
	return v
}

// hasQuorum: a strict majority of the members, self included; with two members (other names the
// second one) the lexically lower name wins alone (the other one cannot tell a dead peer from a
// partition, so it must yield).
func hasQuorum(self string, heard, total int, other string) bool {
	if 2*heard > total {
		return true
	}
	return total == 2 && heard == 1 && other != "" && self < other
}

// Close stops receiving; Run also closes the socket when its context ends.
func (m *Members) Close() error { return m.conn.Close() }
