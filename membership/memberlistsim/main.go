// Command memberlistsim measures hashicorp/memberlist v0.5.3 (SWIM + Lifeguard, AES-GCM) as the
// liveness layer vipgate's L2 speakers could use, on an in-memory lossy network in one process:
// the time until every live member has declared a silently dead one gone, datagrams and bytes per
// second per member, and the process's CPU divided by the member count (no kernel). It is its own
// module so that vipgate does not depend on memberlist; membership/README.md has the figures.
//
//	cd membership/memberlistsim && go run . -n 100 -tuned=true
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

type network struct {
	mu    sync.RWMutex
	nodes map[string]*transport
	bytes atomic.Int64
	pkts  atomic.Int64
}

type transport struct {
	net     *network
	name    string
	port    int
	dead    atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
}

type addr string

func (a addr) Network() string { return "sim" }
func (a addr) String() string  { return string(a) }

func (n *network) add(name string, port int) *transport {
	t := &transport{net: n, name: name, port: port, packets: make(chan *memberlist.Packet, 4096), streams: make(chan net.Conn, 64)}
	n.mu.Lock()
	n.nodes[fmt.Sprintf("127.0.0.1:%d", port)] = t
	n.mu.Unlock()
	return t
}

func (t *transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return net.IPv4(127, 0, 0, 1), t.port, nil
}
func (t *transport) WriteTo(b []byte, a string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: a})
}
func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if t.dead.Load() {
		return now, nil
	}
	t.net.mu.RLock()
	d := t.net.nodes[a.Addr]
	t.net.mu.RUnlock()
	t.net.bytes.Add(int64(len(b)))
	t.net.pkts.Add(1)
	if d == nil || d.dead.Load() {
		return now, nil
	}
	select {
	case d.packets <- &memberlist.Packet{Buf: append([]byte(nil), b...), From: addr(fmt.Sprintf("127.0.0.1:%d", t.port)), Timestamp: now}:
	default: // a full socket buffer drops, as UDP
	}
	return now, nil
}
func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *transport) DialTimeout(a string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: a}, timeout)
}
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	t.net.mu.RLock()
	d := t.net.nodes[a.Addr]
	t.net.mu.RUnlock()
	if d == nil || d.dead.Load() || t.dead.Load() {
		return nil, fmt.Errorf("no route to %s", a.Addr)
	}
	c1, c2 := net.Pipe()
	select {
	case d.streams <- c2:
	case <-time.After(timeout):
		return nil, fmt.Errorf("timeout")
	}
	return c1, nil
}
func (t *transport) StreamCh() <-chan net.Conn { return t.streams }
func (t *transport) Shutdown() error           { return nil }

type events struct {
	mu     sync.Mutex
	victim string
	gone   map[string]time.Time
	self   string
}

func (e *events) NotifyJoin(*memberlist.Node)   {}
func (e *events) NotifyUpdate(*memberlist.Node) {}
func (e *events) NotifyLeave(n *memberlist.Node) {
	e.mu.Lock()
	if n.Name == e.victim {
		e.gone[e.self] = time.Now()
	}
	e.mu.Unlock()
}

func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	n := flag.Int("n", 100, "members")
	tuned := flag.Bool("tuned", true, "tuned timings")
	measure := flag.Duration("measure", 5*time.Second, "steady-state measurement")
	flag.Parse()
	nw := &network{nodes: map[string]*transport{}}
	ev := &events{gone: map[string]time.Time{}}
	var mls []*memberlist.Memberlist
	var ts []*transport
	key := []byte("0123456789abcdef0123456789abcdef")
	for i := range *n {
		name := fmt.Sprintf("node-%05d", i)
		t := nw.add(name, 10000+i)
		c := memberlist.DefaultLANConfig()
		c.Name = name
		c.Transport = t
		c.SecretKey = key
		c.LogOutput = io.Discard
		c.DisableTcpPings = true
		c.TCPTimeout = 30 * time.Second
		if *tuned {
			c.ProbeInterval = 100 * time.Millisecond
			c.ProbeTimeout = 50 * time.Millisecond
			c.SuspicionMult = 1
			c.SuspicionMaxTimeoutMult = 2
			c.GossipInterval = 20 * time.Millisecond
			c.GossipNodes = 4
		}
		c.Events = &sharedEvents{ev: ev, self: name}
		m, err := memberlist.Create(c)
		if err != nil {
			log.Fatal(err)
		}
		mls = append(mls, m)
		ts = append(ts, t)
	}
	for i := 1; i < *n; i++ {
		var err error
		for try := 0; try < 5; try++ {
			if _, err = mls[i].Join([]string{fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(i))}); err == nil {
				break
			}
		}
		if err != nil {
			log.Fatalf("join %d: %v", i, err)
		}
	}
	// Wait until everyone knows everyone.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok := true
		for _, m := range mls {
			if m.NumMembers() != *n {
				ok = false
				break
			}
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	nw.bytes.Store(0)
	nw.pkts.Store(0)
	c0, t0 := cpu(), time.Now()
	time.Sleep(*measure)
	el := time.Since(t0).Seconds()
	cpuPer := (cpu() - c0).Seconds() / el / float64(*n)
	bytesPer := float64(nw.bytes.Load()) / el / float64(*n) * 2 // in + out
	pktsPer := float64(nw.pkts.Load()) / el / float64(*n) * 2

	victim := *n / 2
	ev.mu.Lock()
	ev.victim = mls[victim].LocalNode().Name
	ev.mu.Unlock()
	killed := time.Now()
	ts[victim].dead.Store(true)
	var lat []time.Duration
	deadline = time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ev.mu.Lock()
		k := len(ev.gone)
		ev.mu.Unlock()
		if k >= *n-1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	ev.mu.Lock()
	for name, at := range ev.gone {
		if name != ev.victim {
			lat = append(lat, at.Sub(killed))
		}
	}
	ev.mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	first, med, last := time.Duration(0), time.Duration(0), time.Duration(0)
	if len(lat) > 0 {
		first, med, last = lat[0], lat[len(lat)/2], lat[len(lat)-1]
	}
	fmt.Printf("members=%d tuned=%v detected_by=%d/%d first=%v median=%v all=%v datagrams/s/member=%.0f bytes/s/member=%.0f (%.2f Mbit/s) cpu/member=%.2f%% (whole process, %d members on %d cores)\n",
		*n, *tuned, len(lat), *n-1, first.Round(time.Millisecond), med.Round(time.Millisecond), last.Round(time.Millisecond),
		pktsPer, bytesPer, bytesPer*8/1e6, 100*cpuPer, *n, 2)
	for _, m := range mls {
		m.Shutdown()
	}
}

type sharedEvents struct {
	ev   *events
	self string
}

func (s *sharedEvents) NotifyJoin(*memberlist.Node)   {}
func (s *sharedEvents) NotifyUpdate(*memberlist.Node) {}
func (s *sharedEvents) NotifyLeave(n *memberlist.Node) {
	s.ev.mu.Lock()
	if s.ev.victim != "" && n.Name == s.ev.victim {
		if _, ok := s.ev.gone[s.self]; !ok {
			s.ev.gone[s.self] = time.Now()
		}
	}
	s.ev.mu.Unlock()
}
