package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The traffic generators. The bench re-executes itself inside the client namespace (ip netns exec
// <client> <this binary> connrate|waitconn ...), so the packets leave from the lab's client like any
// outside client's. Both are bounded in time and in count.

const (
	maxGeneratorTime = 30 * time.Second
	maxConnections   = 1_000_000
)

// connRateMain opens TCP connections in parallel loops (connect, read the lab server's line,
// close) for a while and prints "rate=<conns/s> conns=N errors=E".
func connRateMain(args []string) int {
	fs := flag.NewFlagSet("connrate", flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port of a lab server")
	d := fs.Duration("duration", 2*time.Second, "how long (at most 30s)")
	workers := fs.Int("workers", 4, "parallel connection loops (1-64)")
	if err := fs.Parse(args); err != nil || *addr == "" || *d <= 0 || *d > maxGeneratorTime || *workers < 1 || *workers > 64 {
		fmt.Fprintln(os.Stderr, "usage: connrate --addr HOST:PORT --duration D (<=30s) --workers N (1-64)")
		return 2
	}
	var conns, errs atomic.Int64
	var firstErr sync.Once
	var first error
	start := time.Now()
	end := start.Add(*d)
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && conns.Load()+errs.Load() < maxConnections {
				if err := oneConn(*addr, time.Second); err != nil {
					errs.Add(1)
					firstErr.Do(func() { first = err })
					continue
				}
				conns.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	line := fmt.Sprintf("rate=%.1f conns=%d errors=%d secs=%.3f", float64(conns.Load())/secs, conns.Load(), errs.Load(), secs)
	if first != nil {
		line += fmt.Sprintf(" first_error=%q", first.Error())
	}
	fmt.Println(line)
	return 0
}

// oneConn connects, reads one line and closes.
func oneConn(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return fmt.Errorf("reading the server's line: %w", err)
	}
	return nil
}

// waitConnMain prints "ready", then tries to connect to addr every interval until the outcome it
// waits for: "ok" (a connection that gets the lab server's line) prints "ok at=<unix ns of the
// successful connect> attempts=N"; "refused" (the dataplane rejects: the Service exists without
// endpoints) prints "refused at=... attempts=N". The bench changes the manifests after "ready" and
// subtracts its own clock reading (same host, same clock).
func waitConnMain(args []string) int {
	fs := flag.NewFlagSet("waitconn", flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port")
	until := fs.String("until", "ok", "ok | refused")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after (at most 30s)")
	attempt := fs.Duration("attempt-timeout", 20*time.Millisecond, "connect timeout of one attempt (a dropped SYN waits this long)")
	interval := fs.Duration("interval", time.Millisecond, "pause after an attempt that failed at once")
	if err := fs.Parse(args); err != nil || *addr == "" || *timeout <= 0 || *timeout > maxGeneratorTime || (*until != "ok" && *until != "refused") {
		fmt.Fprintln(os.Stderr, "usage: waitconn --addr HOST:PORT [--until ok|refused] [--timeout D (<=30s)]")
		return 2
	}
	fmt.Println("ready")
	end := time.Now().Add(*timeout)
	for n := 1; time.Now().Before(end) && n < maxConnections; n++ {
		c, err := net.DialTimeout("tcp", *addr, *attempt)
		at := time.Now().UnixNano()
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil && *until == "ok" {
				fmt.Printf("ok at=%d attempts=%d\n", at, n)
				return 0
			}
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) && *until == "refused" {
			fmt.Printf("refused at=%d attempts=%d\n", at, n)
			return 0
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			time.Sleep(*interval) // refused or unreachable came back at once: don't spin
		}
	}
	fmt.Println("timeout")
	return 1
}
