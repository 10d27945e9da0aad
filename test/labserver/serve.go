package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

const (
	// holdWait is how long a TCP connection may stay silent after the
	// greeting before the server closes it; a client that wants a long-lived
	// connection says "hold" within it. Probes close right after reading.
	holdWait = 5 * time.Second
	// holdIdle bounds a held connection with no traffic at all.
	holdIdle = 10 * time.Minute
)

func serveMain(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	name := fs.String("name", "", "name to report (the pod name)")
	ports := fs.String("port", "8080", "comma-separated TCP+UDP ports")
	httpPort := fs.Int("http", 0, "HTTP port (0: none)")
	ready := fs.String("ready", "", "file to create once every listener is bound")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *name == "" {
		fmt.Fprintln(os.Stderr, "serve: --name is required")
		return 2
	}
	var portList []int
	for _, s := range strings.Split(*ports, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p <= 0 || p > 65535 {
			fmt.Fprintf(os.Stderr, "serve: bad port %q\n", s)
			return 2
		}
		portList = append(portList, p)
	}

	// One listener per family: Go makes "tcp6"/"udp6" wildcard sockets
	// v6-only, so v4 clients show up as plain v4 addresses, never as
	// v4-mapped ones.
	for _, port := range portList {
		for _, fam := range []string{"4", "6"} {
			addr := net.JoinHostPort(map[string]string{"4": "0.0.0.0", "6": "::"}[fam], strconv.Itoa(port))
			ln, err := net.Listen("tcp"+fam, addr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "serve: %v\n", err)
				return 1
			}
			go serveTCP(*name, ln)
			pc, err := net.ListenPacket("udp"+fam, addr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "serve: %v\n", err)
				return 1
			}
			if err := startUDP(*name, pc, fam == "6"); err != nil {
				fmt.Fprintf(os.Stderr, "serve: %v\n", err)
				return 1
			}
		}
	}
	if *httpPort != 0 {
		for _, fam := range []string{"4", "6"} {
			addr := net.JoinHostPort(map[string]string{"4": "0.0.0.0", "6": "::"}[fam], strconv.Itoa(*httpPort))
			ln, err := net.Listen("tcp"+fam, addr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "serve: %v\n", err)
				return 1
			}
			go serveHTTP(*name, ln)
		}
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte("ready\n"), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "serve: %v\n", err)
			return 1
		}
	}
	fmt.Printf("serving name=%s ports=%s http=%d\n", *name, *ports, *httpPort)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return 0
}

func serveTCP(name string, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fmt.Fprintf(os.Stderr, "accept: %v\n", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go handleTCP(name, c)
	}
}

func handleTCP(name string, c net.Conn) {
	defer c.Close()
	if _, err := c.Write([]byte(replyLine(name, addrPort(c.RemoteAddr()), addrPort(c.LocalAddr())))); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(holdWait))
	r := bufio.NewReader(c)
	first, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(first) != "hold" {
		return
	}
	// A held connection echoes every line back until the client goes away.
	for {
		_ = c.SetReadDeadline(time.Now().Add(holdIdle))
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

// startUDP answers every datagram with the reply line, sent from the address
// the datagram was sent to. The destination comes from IP_PKTINFO, since a
// wildcard socket does not know it otherwise.
func startUDP(name string, pc net.PacketConn, v6 bool) error {
	buf := make([]byte, 2048)
	if v6 {
		p := ipv6.NewPacketConn(pc)
		if err := p.SetControlMessage(ipv6.FlagDst, true); err != nil {
			return fmt.Errorf("udp6 pktinfo: %w", err)
		}
		local := addrPort(pc.LocalAddr())
		go func() {
			for {
				_, cm, src, err := p.ReadFrom(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				var reply *ipv6.ControlMessage
				dst := local
				if cm != nil && cm.Dst != nil {
					a, _ := netip.AddrFromSlice(cm.Dst)
					dst = netip.AddrPortFrom(a, local.Port())
					reply = &ipv6.ControlMessage{Src: cm.Dst}
				}
				_, _ = p.WriteTo([]byte(replyLine(name, addrPort(src), dst)), reply, src)
			}
		}()
		return nil
	}
	p := ipv4.NewPacketConn(pc)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		return fmt.Errorf("udp4 pktinfo: %w", err)
	}
	local := addrPort(pc.LocalAddr())
	go func() {
		for {
			_, cm, src, err := p.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			var reply *ipv4.ControlMessage
			dst := local
			if cm != nil && cm.Dst != nil {
				a, _ := netip.AddrFromSlice(cm.Dst.To4())
				dst = netip.AddrPortFrom(a, local.Port())
				reply = &ipv4.ControlMessage{Src: cm.Dst}
			}
			_, _ = p.WriteTo([]byte(replyLine(name, addrPort(src), dst)), reply, src)
		}
	}()
	return nil
}

type localAddrKey struct{}

func serveHTTP(name string, ln net.Listener) {
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, localAddrKey{}, addrPort(c.LocalAddr()))
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			src, _ := netip.ParseAddrPort(r.RemoteAddr)
			dst, _ := r.Context().Value(localAddrKey{}).(netip.AddrPort)
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, replyLine(name, src, dst))
		}),
	}
	_ = srv.Serve(ln)
}
