package bfd

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// netnsEnv marks a test binary re-executed in a network namespace of its own.
const netnsEnv = "VIPGATE_BFD_TEST_NETNS"

// inNetns runs the calling test in a new network namespace with only loopback, up: the test binary
// runs again, in a namespace created for it and gone with it, so nothing binds a socket in the
// machine's namespace. It returns true in the re-executed binary (go on with the test), false in
// the original one (the test is done: it passed or failed with the inner output).
func inNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(netnsEnv) != "" {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("loopback up: %v", err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a network namespace: %v\n%s", err, out)
	}
	t.Logf("in a network namespace:\n%s", out)
	return false
}

var (
	loopA = netip.MustParseAddr("127.0.0.1") // the Server
	loopB = netip.MustParseAddr("127.0.0.2") // the hand-made peer
)

// TestArrivalTimestamp: a datagram read late is dated by its arrival (the kernel's timestamp),
// before the read started.
func TestArrivalTimestamp(t *testing.T) {
	if !inNetns(t) {
		return
	}
	conn, noStamps, err := listen(false, SingleHopPort)
	if err != nil {
		t.Fatal(err)
	}
	if noStamps != nil {
		t.Fatalf("no receive timestamps: %v", noStamps)
	}
	defer conn.Close()
	out, err := dial(loopA, loopB)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	sent := time.Now()
	if _, err := out.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(loopA, SingleHopPort)); err != nil {
		t.Fatal(err)
	}
	for !queued(conn) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // read it late
	readAt := time.Now()
	buf, oob := make([]byte, readBuffer), make([]byte, oobBuffer)
	_, oobn, _, _, err := conn.ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if queued(conn) {
		t.Errorf("a datagram queued after reading the only one")
	}
	at := arrival(oob[:oobn], time.Now())
	if !at.Before(readAt) || at.Before(sent.Add(-time.Second)) {
		t.Errorf("arrival %v after sending, read %v after sending: want it between (no kernel timestamp?)", at.Sub(sent), readAt.Sub(sent))
	}
	if hops, ok := hopLimit(oob[:oobn]); !ok || hops != ttl {
		t.Errorf("hop limit %d (found %v), want %d next to the timestamp", hops, ok, ttl)
	}
}

// peeredServer is a Server Up with a hand-made peer on loopback, which sends every 20ms until
// stopped. Every event and every tick put off is recorded. Its reader can be stopped (as if the Go
// scheduler did not run it) or slowed down.
type peeredServer struct {
	t    *testing.T
	srv  *Server
	conn *net.UDPConn // the listening socket

	// gate, when set, stops the reader before its next read until closed; slow makes it sleep
	// before each read.
	gate atomic.Pointer[chan struct{}]
	slow atomic.Bool
	// handOver makes a tick put off open the gate and wait for the reader to hand a datagram to
	// the loop: the scheduler running the reader before the loop.
	handOver bool

	mu     sync.Mutex
	events []Event
	defers []deferral

	stopOnce sync.Once
	stopPeer chan struct{}
	peerDone sync.WaitGroup
}

// deferral is a tick put off at now, with the deadline until.
type deferral struct{ now, until time.Time }

// startPeered starts the Server and the peer and waits for the session to be Up.
func startPeered(t *testing.T, handOver bool) *peeredServer {
	ps := &peeredServer{t: t, handOver: handOver, stopPeer: make(chan struct{})}
	hooks := testHooks{
		beforeRead: func() {
			if ch := ps.gate.Load(); ch != nil {
				<-*ch
			}
			if ps.slow.Load() {
				time.Sleep(200 * time.Microsecond)
			}
		},
		onDefer: func(now, until time.Time) {
			ps.mu.Lock()
			ps.defers = append(ps.defers, deferral{now, until})
			ps.mu.Unlock()
			if !ps.handOver {
				return
			}
			ps.openReader()
			for deadline := time.Now().Add(10 * time.Second); len(ps.srv.rx) == 0 && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
		},
	}
	ps.srv = newServer(Options{OnEvent: func(ev Event) {
		ps.mu.Lock()
		ps.events = append(ps.events, ev)
		ps.mu.Unlock()
	}}, hooks)
	t.Cleanup(func() {
		ps.openReader() // before Close, which waits for the reader
		ps.srv.Close()
	})
	// Our side expects a packet every 50ms; the peer says it sends every 100ms with a multiplier
	// of 20 (a detection time of 2s, long enough for a loaded machine to run the peer in time)
	// and sends every 20ms.
	if err := ps.srv.Set(Config{Peer: loopB, Local: loopA, DesiredMinTx: 50 * ms, RequiredMinRx: 50 * ms, DetectMult: 3}); err != nil {
		t.Fatal(err)
	}
	out, err := dial(loopA, loopB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	st, _ := ps.srv.Session(loopB)
	send := func(state State, your uint32) {
		p := Packet{State: state, DetectMult: 20, MyDiscr: 77, YourDiscr: your, DesiredMinTx: 100 * ms, RequiredMinRx: 50 * ms}
		if _, err := out.WriteToUDPAddrPort(p.Append(nil), netip.AddrPortFrom(loopA, SingleHopPort)); err != nil {
			t.Errorf("peer: %v", err)
		}
	}
	send(StateDown, 0)
	ps.waitState(StateInit)
	send(StateUp, st.LocalDiscr)
	ps.waitState(StateUp)
	ps.peerDone.Add(1)
	t.Cleanup(ps.stop)
	go func() {
		defer ps.peerDone.Done()
		tick := time.NewTicker(20 * ms)
		defer tick.Stop()
		for range 3000 { // at most a minute
			select {
			case <-ps.stopPeer:
				return
			case <-tick.C:
				send(StateUp, st.LocalDiscr)
			}
		}
	}()
	_ = ps.srv.do(func() { ps.conn = ps.srv.listeners[listenKey{}].conn })
	return ps
}

// stopReader stops the reader and waits for the peer's packets to queue up.
func (ps *peeredServer) stopReader() {
	ps.t.Helper()
	ch := make(chan struct{})
	ps.gate.Store(&ch)
	for deadline := time.Now().Add(10 * time.Second); !queued(ps.conn) || ps.srv.pending.Load() != 0; {
		if time.Now().After(deadline) {
			ps.t.Fatalf("the peer's packets do not queue up with the reader stopped")
		}
		time.Sleep(time.Millisecond)
	}
}

// openReader lets the reader run again.
func (ps *peeredServer) openReader() {
	if ch := ps.gate.Swap(nil); ch != nil {
		close(*ch)
	}
}

// stop stops the peer.
func (ps *peeredServer) stop() {
	ps.stopOnce.Do(func() {
		close(ps.stopPeer)
		ps.peerDone.Wait()
	})
}

func (ps *peeredServer) waitState(want State) {
	ps.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * ms) {
		st, _ := ps.srv.Session(loopB)
		if st.State == want {
			return
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("session %s, want %s", st.State, want)
		}
	}
}

// recorded returns the events and the ticks put off so far.
func (ps *peeredServer) recorded() ([]Event, []deferral) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.Clone(ps.events), slices.Clone(ps.defers)
}

// failures returns the failures reported so far.
func (ps *peeredServer) failures() []Event {
	events, _ := ps.recorded()
	var f []Event
	for _, ev := range events {
		if ev.Kind == EventFailure {
			f = append(f, ev)
		}
	}
	return f
}

// checkDeferrals checks that every tick put off was before the deadline of its expiry, which is
// maxDefer after it was first put off, and that the loop waited deferStep between two (no more
// than maxDefer/deferStep per expiry); it returns how many ticks were put off.
func (ps *peeredServer) checkDeferrals() int {
	ps.t.Helper()
	_, defers := ps.recorded()
	first := map[time.Time]time.Time{}
	count := map[time.Time]int{}
	for _, d := range defers {
		if !d.now.Before(d.until) {
			ps.t.Errorf("tick put off at %v, past its deadline", d.now.Sub(d.until))
		}
		if _, ok := first[d.until]; !ok {
			first[d.until] = d.now
		}
		count[d.until]++
	}
	for until, n := range count {
		if got := until.Sub(first[until]); got != maxDefer {
			ps.t.Errorf("deadline %v after the tick was first put off, want %v", got, maxDefer)
		}
		if n > int(maxDefer/deferStep) {
			ps.t.Errorf("one expiry held back %d times, want at most %d", n, maxDefer/deferStep)
		}
	}
	return len(defers)
}

// TestServerStarvedReader: with the reader not running, the loop's detection timer expires while
// the peer's packets wait in the socket; the loop puts the tick off, the reader catches up, and
// the session stays Up.
func TestServerStarvedReader(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ps := startPeered(t, true)
	ps.stopReader()
	for deadline := time.Now().Add(30 * time.Second); ps.gate.Load() != nil; time.Sleep(ms) {
		if f := ps.failures(); len(f) != 0 {
			t.Fatalf("the session failed with the peer's packets queued: %+v", f)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the loop never put a tick off for the queued packets")
		}
	}
	// The reader catches up; the session's detection time restarts from the last packet.
	for deadline := time.Now().Add(10 * time.Second); queued(ps.conn); time.Sleep(ms) {
		if time.Now().After(deadline) {
			t.Fatalf("the reader does not catch up")
		}
	}
	time.Sleep(100 * ms)
	st, _ := ps.srv.Session(loopB)
	if f := ps.failures(); st.State != StateUp || st.Failures != 0 || len(f) != 0 {
		t.Errorf("session %s with %d failures (%+v), want up without failure", st.State, st.Failures, f)
	}
	if n := ps.checkDeferrals(); n == 0 {
		t.Errorf("no tick put off")
	}
}

// TestServerDeferralBounded: with the reader never running again, datagrams stay queued for good
// (as a sender can keep a socket busy); the loop puts the tick off until the deadline, then the
// detection time expires.
func TestServerDeferralBounded(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ps := startPeered(t, false)
	ps.stopReader()
	ps.waitExpiry(30 * time.Second)
	if n := ps.checkDeferrals(); n == 0 {
		t.Errorf("no tick put off with datagrams queued")
	}
}

// TestServerJunkFlood: with the peer stopped and datagrams from an address that is no peer
// keeping the socket busy (the reader slowed down so that they queue), the detection time still
// expires, once.
func TestServerJunkFlood(t *testing.T) {
	if !inNetns(t) {
		return
	}
	ps := startPeered(t, false)
	junk, err := dial(loopA, netip.MustParseAddr("127.0.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	st, _ := ps.srv.Session(loopB)
	ps.slow.Store(true)
	ps.stop()
	stopFlood := make(chan struct{})
	var flood sync.WaitGroup
	flood.Add(1)
	go func() {
		// 10 datagrams a millisecond, faster than the slowed reader, for at most 10 s.
		defer flood.Done()
		p := Packet{State: StateUp, DetectMult: 3, MyDiscr: 99, YourDiscr: st.LocalDiscr, DesiredMinTx: ms, RequiredMinRx: ms}
		b := p.Append(nil)
		tick := time.NewTicker(ms)
		defer tick.Stop()
		for range 10000 {
			select {
			case <-stopFlood:
				return
			case <-tick.C:
			}
			for range 10 {
				_, _ = junk.WriteToUDPAddrPort(b, netip.AddrPortFrom(loopA, SingleHopPort))
			}
		}
	}()
	defer func() {
		close(stopFlood)
		flood.Wait()
	}()
	// Liveness, not a timing: the detection time (2s) after the peer's last packet, plus slack.
	ps.waitExpiry(st.DetectTime + time.Second)
	if n := ps.srv.Drops()[DropUnknownPeer]; n == 0 {
		t.Errorf("no datagram from the non-peer dropped: the flood did not reach the reader")
	}
	t.Logf("ticks put off: %d; datagrams from the non-peer dropped: %d", ps.checkDeferrals(), ps.srv.Drops()[DropUnknownPeer])
}

// waitExpiry waits for the session to report its detection time expiring, and checks that it
// went down with it, then failed, once.
func (ps *peeredServer) waitExpiry(timeout time.Duration) {
	ps.t.Helper()
	for deadline := time.Now().Add(timeout); len(ps.failures()) == 0; time.Sleep(5 * ms) {
		if time.Now().After(deadline) {
			ps.t.Fatalf("no failure within %v", timeout)
		}
	}
	time.Sleep(50 * ms) // nothing more follows
	events, _ := ps.recorded()
	var got []string
	for _, ev := range events {
		switch ev.Kind {
		case EventState:
			got = append(got, fmt.Sprintf("%s>%s (%s)", ev.From, ev.To, ev.Diag))
		case EventFailure:
			got = append(got, "failure "+ev.Failure.String())
		}
	}
	want := []string{
		fmt.Sprintf("%s>%s (%s)", StateDown, StateDown, DiagNone), // created
		fmt.Sprintf("%s>%s (%s)", StateDown, StateInit, DiagNone),
		fmt.Sprintf("%s>%s (%s)", StateInit, StateUp, DiagNone),
		fmt.Sprintf("%s>%s (%s)", StateUp, StateDown, DiagDetectTimeExpired),
		"failure " + FailureDetectTimeExpired.String(),
	}
	if !slices.Equal(got, want) {
		ps.t.Errorf("events %q, want %q", got, want)
	}
	st, _ := ps.srv.Session(loopB)
	if st.State != StateDown || st.Diag != DiagDetectTimeExpired {
		ps.t.Errorf("session %s (%s), want down, detection time expired", st.State, st.Diag)
	}
}
