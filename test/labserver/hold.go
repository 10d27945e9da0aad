package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

const maxConns = 10000

func holdMain(args []string) int {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	addr := fs.String("tcp", "", "TCP target HOST:PORT")
	conns := fs.Int("conns", 10, "connections to hold")
	duration := fs.Duration("duration", 10*time.Second, "how long to hold them")
	interval := fs.Duration("interval", 200*time.Millisecond, "time between pings on each connection")
	timeout := fs.Duration("timeout", 2*time.Second, "connect and echo timeout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *addr == "" || *conns <= 0 || *conns > maxConns || *duration <= 0 || *duration > time.Hour {
		fmt.Fprintf(os.Stderr, "hold: need --tcp HOST:PORT, 1..%d --conns and a --duration up to 1h\n", maxConns)
		return 2
	}

	// Open every connection first and say "hold", so the server keeps it.
	var cs []net.Conn
	var readers []*bufio.Reader
	pods := map[string]int{}
	for range *conns {
		c, err := net.DialTimeout("tcp", *addr, *timeout)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(*timeout))
			_, err = c.Write([]byte("hold\n"))
		}
		var greeting string
		r := bufio.NewReader(c)
		if err == nil {
			greeting, err = r.ReadString('\n')
		}
		if err != nil {
			fmt.Printf("error=%s\n", errorKind(err))
			fmt.Fprintf(os.Stderr, "hold: opening connection %d: %v\n", len(cs)+1, err)
			for _, c := range cs {
				c.Close()
			}
			return 1
		}
		pods[fields(greeting)["name"]]++
		cs = append(cs, c)
		readers = append(readers, r)
	}
	fmt.Printf("opened=%d pods=%s\n", len(cs), counts(pods))

	stop := make(chan struct{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case <-sig:
		case <-time.After(*duration):
		}
		close(stop)
	}()

	// Each connection pings on its own; the first failure marks it broken.
	var mu sync.Mutex
	errs := map[string]int{}
	broken := 0
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			tick := time.NewTicker(*interval)
			defer tick.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				msg := fmt.Sprintf("ping %d %d\n", i, seq)
				_ = c.SetDeadline(time.Now().Add(*timeout))
				_, err := c.Write([]byte(msg))
				var echo string
				if err == nil {
					echo, err = readers[i].ReadString('\n')
				}
				if err == nil && echo != msg {
					err = fmt.Errorf("echo %q, want %q", strings.TrimSpace(echo), strings.TrimSpace(msg))
				}
				if err != nil {
					mu.Lock()
					broken++
					kind := errorKind(err)
					if kind == "failed" {
						kind = "mismatch"
					}
					errs[kind]++
					mu.Unlock()
					fmt.Fprintf(os.Stderr, "hold: connection %d broken: %v\n", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("conns=%d broken=%d errors=%s\n", len(cs), broken, counts(errs))
	if broken > 0 {
		return 1
	}
	return 0
}
