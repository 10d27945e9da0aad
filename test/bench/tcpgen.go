package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The TCP generator and server of the gateway connection-rate row (gateway_cps.go), run inside the
// lab's namespaces as `bench tcpgen` and `bench tcpserve`. Both are event loops on raw syscalls
// (non-blocking sockets, one epoll per OS thread), not net.Conn: on 2 vCPUs the Go runtime's
// netpoller and goroutine per connection would cost more per connection than the path measured.
//
// The protocol is one line each way. The client sends a request line of tcpReqSize bytes: 'c'
// first ("close": the server answers and closes, as an HTTP/1.0 server does) or 'k' ("keep": the
// server answers and waits for the next). The answer is a line of tcpRespSize bytes. The server
// closes first, so the client's ports never sit in TIME_WAIT (the client reads the answer and the
// end of the stream, then closes): a client address's ~64,000 ports carry every sample.
//
// Threat model: both are bench tools, not part of vipgate, run only inside namespaces the bench
// created, for a bounded time (--max-time, --duration); only the lab's own namespaces can reach
// the server's port. What a sender can do to the server is make it write one 64-byte answer per
// request line and close: it keeps no state but a partial line per connection, closed past 4 KB.

const (
	tcpReqSize  = 32
	tcpRespSize = 64
	// maxLatencySamples bounds what one generator keeps for its quantiles.
	maxLatencySamples = 1_000_000
)

var (
	tcpRespLine = []byte(strings.Repeat("a", tcpRespSize-1) + "\n")
	tcpReqClose = []byte("c" + strings.Repeat("q", tcpReqSize-2) + "\n")
	tcpReqKeep  = []byte("k" + strings.Repeat("q", tcpReqSize-2) + "\n")
)

// tcpServeMain is the server (`bench tcpserve`): --threads listeners on --port (SO_REUSEPORT: the
// kernel spreads connections over them), each with its own epoll, until --max-time. It prints
// "ready" once every listener is bound.
func tcpServeMain(args []string) int {
	fs := flag.NewFlagSet("tcpserve", flag.ContinueOnError)
	port := fs.Int("port", gwPPSPort, "TCP port")
	threads := fs.Int("threads", 2, "listeners, one OS thread each (1-16)")
	maxTime := fs.Duration("max-time", time.Minute, "exit after this long (at most 1h)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *threads < 1 || *threads > 16 || *maxTime <= 0 || *maxTime > time.Hour || *port < 1 || *port > 65535 {
		fmt.Fprintln(os.Stderr, "tcpserve: bad arguments")
		return 2
	}
	var lfds []int
	for range *threads {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tcpserve:", err)
			return 1
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: *port}); err != nil {
			fmt.Fprintln(os.Stderr, "tcpserve: bind:", err)
			return 1
		}
		if err := unix.Listen(fd, 4096); err != nil {
			fmt.Fprintln(os.Stderr, "tcpserve: listen:", err)
			return 1
		}
		lfds = append(lfds, fd)
	}
	fmt.Println("ready")
	end := time.Now().Add(*maxTime)
	var wg sync.WaitGroup
	for _, lfd := range lfds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			if err := serveLoop(lfd, end); err != nil {
				fmt.Fprintln(os.Stderr, "tcpserve:", err)
			}
		}()
	}
	wg.Wait()
	return 0
}

// serveLoop accepts on lfd and answers every request line until end.
func serveLoop(lfd int, end time.Time) error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lfd)}); err != nil {
		return err
	}
	partial := map[int][]byte{} // a request line split over reads (rare: 32 bytes)
	evs := make([]unix.EpollEvent, 256)
	buf := make([]byte, 4096)
	for time.Now().Before(end) {
		n, err := unix.EpollWait(ep, evs, 200)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		for _, ev := range evs[:max(n, 0)] {
			fd := int(ev.Fd)
			if fd == lfd {
				for {
					nfd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					if unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, nfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(nfd)}) != nil {
						unix.Close(nfd)
					}
				}
				continue
			}
			r, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if r <= 0 {
				delete(partial, fd)
				unix.Close(fd)
				continue
			}
			data := append(partial[fd], buf[:r]...)
			closed := false
			for {
				i := slices.Index(data, '\n')
				if i < 0 {
					break
				}
				line := data[:i+1]
				data = data[i+1:]
				if _, err := unix.Write(fd, tcpRespLine); err != nil || line[0] != 'k' {
					closed = true
					break
				}
			}
			if closed || len(data) > 4096 { // a line longer than any request: not ours
				delete(partial, fd)
				unix.Close(fd)
			} else if len(data) > 0 {
				partial[fd] = slices.Clone(data)
			} else {
				delete(partial, fd)
			}
		}
	}
	for fd := range partial {
		unix.Close(fd)
	}
	return nil
}

// tcpGenResult is what one generator run printed.
type tcpGenResult struct {
	done, errors, inflight int
	elapsed, cpu           time.Duration
	// Latency quantiles: connect to answer ("conns"), or request to answer ("rr").
	p50, p90, p99, max time.Duration
	firstError         string
}

// format prints r as the generator's last line.
func (r tcpGenResult) format() string {
	s := fmt.Sprintf("done=%d errors=%d inflight=%d elapsed_ns=%d cpu_ns=%d p50_ns=%d p90_ns=%d p99_ns=%d max_ns=%d",
		r.done, r.errors, r.inflight, r.elapsed.Nanoseconds(), r.cpu.Nanoseconds(), r.p50.Nanoseconds(), r.p90.Nanoseconds(), r.p99.Nanoseconds(), r.max.Nanoseconds())
	if r.firstError != "" {
		s += " first_error=" + strings.ReplaceAll(r.firstError, " ", "_")
	}
	return s
}

// parseTCPGen reads the generator's last line back (format's inverse).
func parseTCPGen(out string) (tcpGenResult, error) {
	kv := lastKV(out)
	var r tcpGenResult
	ints := map[string]*int{"done": &r.done, "errors": &r.errors, "inflight": &r.inflight}
	durs := map[string]*time.Duration{"elapsed_ns": &r.elapsed, "cpu_ns": &r.cpu, "p50_ns": &r.p50, "p90_ns": &r.p90, "p99_ns": &r.p99, "max_ns": &r.max}
	for k, p := range ints {
		if _, err := fmt.Sscanf(kv[k], "%d", p); err != nil {
			return r, fmt.Errorf("tcpgen printed %q: no %s", oneLine(out), k)
		}
	}
	for k, p := range durs {
		var ns int64
		if _, err := fmt.Sscanf(kv[k], "%d", &ns); err != nil {
			return r, fmt.Errorf("tcpgen printed %q: no %s", oneLine(out), k)
		}
		*p = time.Duration(ns)
	}
	if r.elapsed <= 0 {
		return r, fmt.Errorf("tcpgen printed %q: no time", oneLine(out))
	}
	r.firstError = strings.ReplaceAll(kv["first_error"], "_", " ")
	return r, nil
}

// tcpGenMain is the generator (`bench tcpgen`). --mode conns: new connections, one request each
// (connect, request, answer, the server's close, close), --concurrency of them open at any time
// over --threads OS threads, for --duration or --count connections; latency is connect to answer.
// --mode rr: one connection, --count requests one after the other; latency is request to answer.
// It prints one line (tcpGenResult.format): CPU time is its own, user and system (on veth the
// softirq that carries its packets through the namespaces runs on its thread and is charged here).
func tcpGenMain(args []string) int {
	fs := flag.NewFlagSet("tcpgen", flag.ContinueOnError)
	dst := fs.String("dst", "", "ip:port")
	mode := fs.String("mode", "conns", "conns | rr")
	d := fs.Duration("duration", 2*time.Second, "how long (at most 30s)")
	count := fs.Int("count", maxConnections, "connections (conns) or requests (rr) at most")
	conc := fs.Int("concurrency", 64, "connections open at once (conns; 1-4096)")
	threads := fs.Int("threads", 2, "OS threads (conns; 1-16)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*dst)
	if err != nil || !ap.Addr().Is4() || *d <= 0 || *d > maxGeneratorTime || *count < 1 || *count > maxConnections ||
		*conc < 1 || *conc > 4096 || *threads < 1 || *threads > 16 || (*mode != "conns" && *mode != "rr") {
		fmt.Fprintln(os.Stderr, "usage: tcpgen --dst IPv4:PORT --mode conns|rr --duration D (<=30s) --count N --concurrency C --threads T")
		return 2
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	var res tcpGenResult
	var lats []time.Duration
	if *mode == "rr" {
		res, lats = genRR(sa, start.Add(*d), *count)
	} else {
		res, lats = genConns(sa, start.Add(*d), *count, *conc, *threads)
	}
	res.elapsed = time.Since(start)
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	res.cpu = time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	if len(lats) > 0 {
		res.p50, res.p90, res.p99 = quantile(lats, 0.5), quantile(lats, 0.9), quantile(lats, 0.99)
		res.max = slices.Max(lats)
	}
	fmt.Println(res.format())
	return 0
}

// genConn is one connection of genConns.
type genConn struct {
	start    time.Time
	answered bool
	got      int
}

// genConns runs the connection loops: every thread keeps its share of conc connections open until
// end or count, and the numbers are added up.
func genConns(sa *unix.SockaddrInet4, end time.Time, count, conc, threads int) (tcpGenResult, []time.Duration) {
	var mu sync.Mutex
	var total tcpGenResult
	var lats []time.Duration
	var wg sync.WaitGroup
	for i := range threads {
		share := conc / threads
		if i < conc%threads {
			share++
		}
		n := count / threads
		if i < count%threads {
			n++
		}
		if share == 0 || n == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			r, l := connLoop(sa, end, n, share)
			mu.Lock()
			defer mu.Unlock()
			total.done += r.done
			total.errors += r.errors
			total.inflight += r.inflight
			if total.firstError == "" {
				total.firstError = r.firstError
			}
			if len(lats) < maxLatencySamples {
				lats = append(lats, l[:min(len(l), maxLatencySamples-len(lats))]...)
			}
		}()
	}
	wg.Wait()
	return total, lats
}

// connLoop is one thread of genConns: conc connections in flight, each replaced when it ends.
func connLoop(sa *unix.SockaddrInet4, end time.Time, count, conc int) (tcpGenResult, []time.Duration) {
	var r tcpGenResult
	var lats []time.Duration
	fail := func(err error) {
		r.errors++
		if r.firstError == "" {
			r.firstError = err.Error()
		}
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		fail(err)
		return r, nil
	}
	defer unix.Close(ep)
	conns := map[int]*genConn{}
	started := 0
	open := func() {
		for started < count && time.Now().Before(end) {
			started++
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				fail(err)
				time.Sleep(time.Millisecond) // out of descriptors or memory: don't spin
				continue
			}
			c := &genConn{start: time.Now()}
			if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
				unix.Close(fd)
				fail(err)
				continue
			}
			if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(fd)}); err != nil {
				unix.Close(fd)
				fail(err)
				continue
			}
			conns[fd] = c
			return
		}
	}
	finish := func(fd int, err error) {
		c := conns[fd]
		delete(conns, fd)
		unix.Close(fd)
		switch {
		case err != nil:
			fail(err)
		case !c.answered:
			fail(errors.New("closed before the answer"))
		default:
			r.done++
		}
		open()
	}
	for range conc {
		open()
	}
	evs := make([]unix.EpollEvent, 256)
	buf := make([]byte, 4096)
	for len(conns) > 0 && time.Now().Before(end) {
		n, err := unix.EpollWait(ep, evs, 50)
		if err != nil && !errors.Is(err, unix.EINTR) {
			fail(err)
			break
		}
		for _, ev := range evs[:max(n, 0)] {
			fd := int(ev.Fd)
			c := conns[fd]
			if c == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 && c.got == 0 && !c.answered {
				// Connected (or failed): send the request, then wait for the answer.
				if serr, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); serr != 0 {
					finish(fd, fmt.Errorf("connect: %w", unix.Errno(serr)))
					continue
				}
				if _, err := unix.Write(fd, tcpReqClose); err != nil {
					finish(fd, fmt.Errorf("request: %w", err))
					continue
				}
				_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
				c.got = -1 // the request is sent (nothing read yet)
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
				continue
			}
			k, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if err != nil {
				finish(fd, fmt.Errorf("answer: %w", err))
				continue
			}
			if k == 0 { // the server's close: the connection is done
				finish(fd, nil)
				continue
			}
			if c.got < 0 {
				c.got = 0
			}
			c.got += k
			if !c.answered && c.got >= tcpRespSize {
				c.answered = true
				if len(lats) < maxLatencySamples {
					lats = append(lats, time.Since(c.start))
				}
			}
		}
	}
	r.inflight = len(conns)
	for fd := range conns {
		unix.Close(fd)
	}
	return r, lats
}

// genRR sends count requests one after the other on one connection (blocking sockets).
func genRR(sa *unix.SockaddrInet4, end time.Time, count int) (tcpGenResult, []time.Duration) {
	var r tcpGenResult
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		r.errors, r.firstError = 1, err.Error()
		return r, nil
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	tv := unix.NsecToTimeval(time.Second.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Connect(fd, sa); err != nil {
		r.errors, r.firstError = 1, "connect: "+err.Error()
		return r, nil
	}
	lats := make([]time.Duration, 0, min(count, maxLatencySamples))
	buf := make([]byte, 4096)
	for i := 0; i < count && time.Now().Before(end); i++ {
		t0 := time.Now()
		if _, err := unix.Write(fd, tcpReqKeep); err != nil {
			r.errors, r.firstError = r.errors+1, "request: "+err.Error()
			break
		}
		got := 0
		for got < tcpRespSize {
			k, err := unix.Read(fd, buf)
			if err != nil || k == 0 {
				r.errors, r.firstError = r.errors+1, fmt.Sprintf("answer: %v (read %d)", err, k)
				return r, lats
			}
			got += k
		}
		lats = append(lats, time.Since(t0))
		r.done++
	}
	return r, lats
}
