package main

import (
	"fmt"
	"os"
	"os/exec"
	"sync"

	"github.com/vipgate/vipgate/dataplane"
)

// Everything the bench creates is undone by cleanup functions, run in reverse order on a normal
// exit, on an error, on SIGINT/SIGTERM and when the overall time limit strikes.
var (
	cleanupMu sync.Mutex
	cleanups  []func()
)

// atExit registers f and returns a function that runs it early (once) and unregisters it.
func atExit(f func()) func() {
	var once sync.Once
	run := func() { once.Do(f) }
	cleanupMu.Lock()
	cleanups = append(cleanups, run)
	cleanupMu.Unlock()
	return run
}

// runCleanups undoes everything still registered, newest first.
func runCleanups() {
	cleanupMu.Lock()
	cs := cleanups
	cleanups = nil
	cleanupMu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// netns is a throwaway network namespace with an open fd, for dataplane.NetlinkProgrammer{NetNSFd}.
type netns struct {
	name  string
	f     *os.File
	close func()
	progs []*dataplane.NetlinkProgrammer // closed with the namespace: their kept sockets hold it alive
}

// programmer returns a NetlinkProgrammer for the namespace, closed with it.
func (n *netns) programmer() *dataplane.NetlinkProgrammer {
	p := &dataplane.NetlinkProgrammer{NetNSFd: n.fd()}
	n.progs = append(n.progs, p)
	return p
}

var nsSeq int

// newNetns creates vg<pid>-bench<n> (the vg<pid>- prefix lets the lab's SweepStale remove it if this
// process is killed before it can clean up) and brings its loopback up.
func newNetns() (*netns, error) {
	nsSeq++
	name := fmt.Sprintf("vg%d-bench%d", os.Getpid(), nsSeq)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("creating netns %s: %v: %s", name, err, out)
	}
	n := &netns{name: name}
	n.close = atExit(func() {
		for _, p := range n.progs {
			p.Close()
		}
		if n.f != nil {
			n.f.Close()
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: deleting netns %s: %v: %s\n", name, err, out)
		}
	})
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		n.close()
		return nil, fmt.Errorf("opening netns %s: %w", name, err)
	}
	n.f = f
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		n.close()
		return nil, fmt.Errorf("netns %s: lo up: %v: %s", name, err, out)
	}
	return n, nil
}

func (n *netns) fd() int { return int(n.f.Fd()) }
