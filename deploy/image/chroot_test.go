package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestAgnhostToolsInChroot builds the agnhost test image from the TestImages table (with a stand-in
// for agnhost itself), unpacks its layer and runs the tools e2e tests exec in agnhost pods through
// its /bin/sh in a chroot: the dynamically linked ones prove their libraries and loader came along.
func TestAgnhostToolsInChroot(t *testing.T) {
	root := agnhostRoot(t)

	for _, script := range []string{
		"curl --version",
		"nc -h 2>&1 | grep -q OpenBSD",             // -z, -u, -v: not busybox's nc
		"wget --version 2>&1 | grep -q 'GNU Wget'", // Debian's: the static busybox's wget crashes
		"dig -v",
		"nslookup 2>&1 | grep -q Usage",
		"ip -V 2>&1 | grep -q BusyBox",
		// No /dev in a bare chroot (the runtime provides it), so no redirection to /dev/null.
		"h=$(hostname) && l=$(ls /) && p=$(cat /etc/passwd) && sleep 0 && echo ok | grep -q ok",
		"/agnhost pause | grep -q 'agnhost pause'",
	} {
		out, err := exec.Command("chroot", root, "/bin/sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Errorf("chroot /bin/sh -c %q: %v\n%s", script, err, out)
		}
	}
}

// agnhostRoot builds the agnhost test image from the TestImages table (with a stand-in for agnhost
// itself) and unpacks its layer into a directory to chroot into. It skips without root or without
// the Debian tools the image copies.
func agnhostRoot(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs programs in a chroot")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot")
	}
	for _, p := range []string{"/bin/busybox", "/usr/bin/curl", "/bin/nc.openbsd", "/usr/bin/dig", "/usr/bin/ldd", "/usr/sbin/chroot"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("needs %s (Debian busybox-static, curl, netcat-openbsd, bind9-dnsutils; make test-images installs them)", p)
		}
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "agnhost"), []byte("#!/bin/sh\necho agnhost \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return unpackTestImage(t, bin, "agnhost.tar")
}

// TestAgnhostWgetTriesOnce: the image's wget (Debian's GNU wget) makes one attempt, as upstream's
// busybox wget does. The upstream e2e test "should only allow access from service loadbalancer
// source ranges" checks a blocked pod with `wget -T 5 -qO- <LB IP>` polled for 30 s; GNU wget's
// default of 20 tries (with 1..10 s pauses between them) turned each such check into about four
// minutes. Here a listener in a network namespace of its own accepts connections and never
// answers, so every attempt ends in wget's read timeout; exactly one connection must arrive.
func TestAgnhostWgetTriesOnce(t *testing.T) {
	root := agnhostRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	ns := fmt.Sprintf("vg%d-wget", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	var ln net.Listener
	if err := lab.InNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
	})

	// A deadline only bounds the wait if wget hangs; nothing here measures time.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "chroot", root, "/bin/sh", "-c",
		"wget -T 1 -qO- http://"+ln.Addr().String()+"/")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case c := <-accepted:
			conns = append(conns, c)
			if len(conns) > 1 {
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("wget connected %d times: it retries (GNU wget's default is 20 tries); the image needs /etc/wgetrc with tries = 1", len(conns))
			}
			continue
		case err := <-done:
			if err == nil {
				t.Fatal("wget succeeded against a server that never answers")
			}
		}
		break
	}
	// Connections that arrived just before wget exited.
	for len(accepted) > 0 {
		conns = append(conns, <-accepted)
	}
	if len(conns) != 1 {
		t.Fatalf("wget connected %d times, want 1", len(conns))
	}
}
