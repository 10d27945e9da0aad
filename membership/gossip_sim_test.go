package membership

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Gossip mode at scale, in process, on a virtual clock: N members, of which one (the observer,
// member 0) is a real Members running the real code path (chunks, MAC, counters, echo, the
// decisions), and N-1 are bare gossipCores exchanging their vectors directly (no MAC, for speed).
// Only the observer's work is timed; its traffic is counted datagram by datagram.

// queueConn queues what the observer sends, for the simulation to deliver.
type queueConn struct {
	q              []queued
	datagrams, out int
}

type queued struct {
	b   []byte
	dst netip.AddrPort
}

func (c *queueConn) ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error) { select {} }
func (c *queueConn) WriteToUDPAddrPort(b []byte, dst netip.AddrPort) (int, error) {
	c.q = append(c.q, queued{slices.Clone(b), dst})
	c.datagrams++
	c.out += len(b)
	return len(b), nil
}
func (c *queueConn) Close() error { return nil }

// simPeer is one simulated member.
type simPeer struct {
	core    *gossipCore
	next    time.Time
	round   int
	sentTo  []int
	counter uint64
	silent  bool
	group   int
}

type gossipSim struct {
	m       *Members
	conn    *queueConn
	g       *segment
	p       gossipParams
	names   []string
	addrs   []netip.Addr
	byAddr  map[netip.Addr]int
	peers   []*simPeer
	key     []byte
	now     time.Time
	rnd     *rand.Rand
	busy    time.Duration
	in, inB int
	buf     []byte
	picks   []int
	entries []byte
}

func newGossipSim(tb testing.TB, n int, opts Options) *gossipSim {
	tb.Helper()
	s := &gossipSim{conn: &queueConn{}, key: testKeys[0], now: time.Unix(1e9, 0), byAddr: map[netip.Addr]int{},
		rnd: rand.New(rand.NewPCG(uint64(n), 7))}
	peers := map[string][]netip.Addr{}
	for i := range n {
		name := fmt.Sprintf("node-%05d.rack%02d.example", i, i%40)
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		s.names = append(s.names, name)
		s.addrs = append(s.addrs, a)
		s.byAddr[a] = i
		peers[name] = []netip.Addr{a}
	}
	opts.Keys = [][]byte{s.key}
	opts.DirectMembersLimit = -1
	m, err := newMembers(hclog.NewNullLogger(), s.names[0], opts, s.conn)
	if err != nil {
		tb.Fatal(err)
	}
	m.origin = s.now
	m.mu.Lock()
	m.setMembershipLocked(peers, nil, false, s.now)
	m.willing = true
	s.g = m.segs[0]
	m.mu.Unlock()
	if s.g.gossip == nil {
		tb.Fatal("not in gossip mode")
	}
	s.m, s.p = m, s.g.gossip.p
	t := s.t()
	for i := range n {
		c := newGossipCore(n, i, s.p, t)
		// Everyone starts having just heard everyone (the ages then spread to their steady state).
		for j := range n {
			c.fresh[j], c.ready[j] = t, true
		}
		s.peers = append(s.peers, &simPeer{core: c, counter: 1e18,
			next: s.now.Add(time.Duration(s.rnd.Int64N(int64(s.p.Round))))})
	}
	return s
}

func (s *gossipSim) t() int64 { return s.m.nanos(s.now) }

// timed runs f and adds the CPU time it took this thread to the observer's busy time (the test's
// goroutine is locked to its thread: wall time would count the other work on a shared machine).
func (s *gossipSim) timed(f func()) {
	t := threadCPU()
	f()
	s.busy += threadCPU() - t
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// connected says whether a datagram from i reaches j.
func (s *gossipSim) connected(i, j int) bool {
	return !s.peers[i].silent && !s.peers[j].silent && s.peers[i].group == s.peers[j].group
}

// toObserver delivers peer i's vector to the observer as real, signed chunks.
func (s *gossipSim) toObserver(i int, reply bool) {
	p := s.peers[i]
	t := s.t()
	p.core.setSelf(t, true)
	n := len(s.names)
	per := gossipPerChunk(len(s.names[i]))
	for off := 0; off < n; off += per {
		cnt := min(per, n-off)
		p.counter++
		gc := gossipChunk{name: s.names[i], ready: true, reply: reply, counter: p.counter, echo: s.m.boot,
			digest: s.g.key, unit: s.p.Unit, total: n, offset: off}
		gc.entries = p.core.encode(t, s.entries[:0], off, cnt)
		b, err := appendGossip(s.buf[:0], &gc)
		if err != nil {
			panic(err)
		}
		b = mac(s.key, s.names[0], b, b)
		s.in++
		s.inB += len(b)
		from := s.addrs[i]
		s.timed(func() {
			if r := s.m.handle(b, from, s.now); r != acceptedReason {
				panic(fmt.Sprintf("observer rejected %s's chunk: %s", s.names[i], r))
			}
		})
	}
	s.drain()
}

// drain delivers what the observer sent.
func (s *gossipSim) drain() {
	for len(s.conn.q) > 0 {
		d := s.conn.q[0]
		s.conn.q = s.conn.q[1:]
		j := s.byAddr[d.dst.Addr()]
		if !s.connected(0, j) {
			continue
		}
		var gc gossipChunk
		if r := parseGossip(d.b, &gc); r != acceptedReason {
			panic(r)
		}
		p := s.peers[j]
		p.core.heard(s.t(), 0, gc.ready)
		p.core.merge(s.t(), int64(gc.unit), gc.offset, gc.entries, 0)
		if !gc.reply && gc.offset == 0 && !slices.Contains(p.sentTo, 0) {
			p.sentTo = append(p.sentTo, 0)
			s.toObserver(j, true)
		}
	}
}

// exchange is a push from i to j and, unless j sent to i this round, j's answer.
func (s *gossipSim) exchange(i, j int) {
	if !s.connected(i, j) {
		return
	}
	if j == 0 {
		s.toObserver(i, false)
		return
	}
	t := s.t()
	a, b := s.peers[i], s.peers[j]
	s.entries = a.core.encode(t, s.entries[:0], 0, len(s.names))
	b.core.heard(t, i, true)
	b.core.merge(t, a.core.unit, 0, s.entries, i)
	if slices.Contains(b.sentTo, i) {
		return
	}
	b.sentTo = append(b.sentTo, i)
	b.core.setSelf(t, true)
	s.entries = b.core.encode(t, s.entries[:0], 0, len(s.names))
	a.core.heard(t, j, true)
	a.core.merge(t, b.core.unit, 0, s.entries, j)
}

// run advances the virtual clock by d in steps of one tick: the simulated members' rounds at their
// own phases, the observer's ticks and rounds; sample is called after every step.
func (s *gossipSim) run(d time.Duration, sample func()) {
	tick := s.m.tick()
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.now = s.now.Add(tick)
		for i := 1; i < len(s.peers); i++ {
			p := s.peers[i]
			if p.silent || p.next.After(s.now) {
				continue
			}
			p.next = p.next.Add(s.p.Round)
			p.round++
			p.sentTo = p.sentTo[:0]
			p.core.setSelf(s.t(), true)
			s.picks = p.core.pick(s.picks, s.p.Fanout, s.rnd.IntN)
			for _, j := range s.picks {
				p.sentTo = append(p.sentTo, j)
				s.exchange(i, j)
			}
		}
		s.timed(func() {
			s.m.stalled(s.now)
			s.m.evaluate(s.now)
			s.buf = s.m.gossipRound(s.buf, s.now, false)
		})
		s.drain()
		if sample != nil {
			sample()
		}
	}
}

// maxLiveAge is the largest age any member has of a live (not silent, connected) member.
func (s *gossipSim) maxLiveAge() time.Duration {
	t := s.t()
	var worst int64
	for i, p := range s.peers {
		if p.silent {
			continue
		}
		c := p.core
		if i == 0 {
			c = s.g.gossip.core
		}
		for j, f := range c.fresh {
			if j != i && s.connected(i, j) && t-f > worst {
				worst = t - f
			}
		}
	}
	return time.Duration(worst)
}

func (s *gossipSim) fresh(i, j int) int64 {
	if i == 0 {
		return s.g.gossip.core.fresh[j]
	}
	return s.peers[i].core.fresh[j]
}

// TestGossipSimulation prints, per segment size, the gossip timings, the failover after a silent
// death, the traffic and CPU of a member, the largest age of a live member, and runs a 40/60
// partition, asserting its order in virtual time: the minority's last member stops (loses its
// quorum) before the majority's first member drops a minority member from its candidates.
// VIPGATE_GOSSIP_SIM_MEMBERS lists the sizes (default 100,1000; the README's: 100,1000,5000).
func TestGossipSimulation(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	sizes := []int{100, 1000}
	if v := os.Getenv("VIPGATE_GOSSIP_SIM_MEMBERS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 5 || n > 60000 {
				t.Fatalf("VIPGATE_GOSSIP_SIM_MEMBERS=%q: want sizes 5-60000", v)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) { gossipSimulation(t, n) })
	}
}

func gossipSimulation(t *testing.T, n int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var opts Options
	if v := os.Getenv("VIPGATE_GOSSIP_SIM_FANOUT"); v != "" {
		opts.GossipFanout, _ = strconv.Atoi(v)
	}
	s := newGossipSim(t, n, opts)
	p := s.p
	t.Logf("%d members: round %v, fanout %d, unit %v, stop %v, dead %v (estimated spread %v)", n, p.Round, p.Fanout, p.Unit, p.Stop, p.Dead, p.Spread)
	// Warm up, then measure the steady state.
	s.run(3*time.Second, nil)
	if v := s.m.View(); !v.Ready || len(v.Candidates) != n {
		t.Fatalf("not settled: ready %v, heard %d/%d, %d candidates", v.Ready, v.Heard, v.Total, len(v.Candidates))
	}
	s.busy, s.conn.datagrams, s.conn.out, s.in, s.inB = 0, 0, 0, 0, 0
	s.g.gossip.core.maxAge = 0
	const measured = 4 * time.Second
	var maxAge time.Duration
	samples := 0
	s.run(measured, func() {
		if samples++; samples%10 == 0 {
			maxAge = max(maxAge, s.maxLiveAge())
		}
	})
	v := s.m.View()
	if !v.Ready || len(v.Candidates) != n {
		t.Errorf("a false positive in the steady state: ready %v, heard %d/%d, %d candidates", v.Ready, v.Heard, v.Total, len(v.Candidates))
	}
	obsMax := time.Duration(s.g.gossip.core.maxAge)
	dgs := float64(s.conn.datagrams+s.in) / measured.Seconds()
	bps := float64(s.conn.out+s.inB) / measured.Seconds()
	cpu := s.busy.Seconds() / measured.Seconds()

	// A silent death of the owner of a VIP: failover until every member dropped it from its
	// candidates, and until the new owner (the next by rendezvous hash) did.
	all := map[string]bool{}
	for _, name := range s.names {
		all[name] = true
	}
	ip := "192.0.2.10"
	var victim, heir int
	for {
		vn := rendezvousOwner(all, ip)
		victim = slices.Index(s.names, vn)
		if victim != 0 {
			break
		}
		delete(all, vn)
	}
	delete(all, s.names[victim])
	hn := rendezvousOwner(all, ip)
	heir = slices.Index(s.names, hn)
	died := s.now
	s.peers[victim].silent = true
	dead := int64(p.Dead)
	var allDropped, heirDropped, obsDropped time.Time
	s.run(p.Dead+2*time.Second, func() {
		t := s.t()
		if heirDropped.IsZero() && t-s.fresh(heir, victim) >= dead {
			heirDropped = s.now
		}
		if obsDropped.IsZero() && !s.m.View().Candidates[s.names[victim]] {
			obsDropped = s.now
		}
		if allDropped.IsZero() {
			for i := range s.peers {
				if i != victim && t-s.fresh(i, victim) < dead {
					return
				}
			}
			allDropped = s.now
		}
	})
	if allDropped.IsZero() || obsDropped.IsZero() {
		t.Fatalf("the silent member was never dropped")
	}
	t.Logf("%-7s %-10s %-10s %-10s %-9s %-11s %-9s %-6s %-12s", "members", "failover", "new owner", "observer", "dgrams/s", "bytes/s", "Mbit/s", "CPU", "max live age (observer)")
	t.Logf("%-7d %-10v %-10v %-10v %-9.0f %-11.0f %-9.2f %-6s %v (%v)", n, allDropped.Sub(died), heirDropped.Sub(died), obsDropped.Sub(died),
		dgs, bps, bps*8/1e6, fmt.Sprintf("%.2f%%", 100*cpu), maxAge.Round(time.Millisecond), obsMax.Round(time.Millisecond))
	if maxAge >= p.Stop {
		t.Errorf("a live member was %v old somewhere, at or beyond stop %v: a false positive", maxAge, p.Stop)
	}

	// A 40/60 partition: the minority (40 %, the highest indexes; the observer is in the majority).
	s.peers[victim].silent = false
	s.run(3*time.Second, nil) // the victim comes back and is fresh everywhere again
	minority := func(i int) bool { return i >= n-n*4/10 }
	for i := range s.peers {
		if minority(i) {
			s.peers[i].group = 1
		}
	}
	cut := s.now
	tc := s.t()
	// The earliest the majority can drop a minority member: its oldest news of one at the cut (it
	// gets no newer news of them afterwards), plus Dead.
	earliest := int64(math.MaxInt64)
	for k := range s.peers {
		if minority(k) {
			continue
		}
		for x := n - n*4/10; x < n; x++ {
			earliest = min(earliest, s.fresh(k, x)+dead)
		}
	}
	var obsFirstDrop time.Time
	s.run(p.Dead+time.Second, func() {
		if obsFirstDrop.IsZero() && len(s.m.View().Candidates) < n {
			obsFirstDrop = s.now
		}
	})
	// The last moment a minority member still had a quorum: its (n/2+1)-th freshest entry (self
	// included) plus Stop, from its final vector (which only grew since the cut).
	var lastStop int64 = math.MinInt64
	for i := range s.peers {
		if !minority(i) {
			continue
		}
		f := slices.Clone(s.peers[i].core.fresh)
		f[i] = never // itself: always live, counted apart
		slices.Sort(f)
		slices.Reverse(f)
		// Quorum needs 2·(others live + 1) > n, i.e. n/2 others at most Stop old.
		lastStop = max(lastStop, f[n/2-1]+int64(p.Stop))
	}
	t.Logf("partition 40/60: the minority's last member stops %v after the cut, the majority's first takeover can come %v after it (observer's first drop: %v)",
		time.Duration(lastStop-tc), time.Duration(earliest-tc), obsFirstDrop.Sub(cut))
	if lastStop >= earliest {
		t.Errorf("the minority still had a quorum %v after the cut, when the majority took over at %v: two owners", time.Duration(lastStop-tc), time.Duration(earliest-tc))
	}
	if !obsFirstDrop.IsZero() && obsFirstDrop.Sub(cut) < time.Duration(lastStop-tc) {
		t.Errorf("the observer dropped a minority member %v after the cut, before the minority stopped (%v)", obsFirstDrop.Sub(cut), time.Duration(lastStop-tc))
	}
}

// rendezvousOwner is the speaker's owner rule (the lowest sha256(node "#" ip), ties to the lower
// name; speaker/owners.go), repeated here because the membership does not decide owners: the
// simulation only needs the member that owns a VIP and the one that takes it over.
func rendezvousOwner(cands map[string]bool, ip string) string {
	var best string
	var bestHash [sha256.Size]byte
	for n, ok := range cands {
		if !ok {
			continue
		}
		h := sha256.Sum256([]byte(n + "#" + ip))
		if c := bytes.Compare(h[:], bestHash[:]); best == "" || c < 0 || c == 0 && n < best {
			best, bestHash = n, h
		}
	}
	return best
}
