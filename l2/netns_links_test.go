package l2

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestNetnsLinkStates: in namespace a, the peer of va set down (a carrier lost: va stays
// IFF_UP) and va itself set down are both "down" for LinkStates and for the WatchLinks updates,
// with va's IPv4 prefix still listed; back up, both say up. The updates come from the kernel
// (RTNLGRP_LINK), not from polling: the test never reads the links between the change and the
// update it waits for.
func TestNetnsLinkStates(t *testing.T) {
	l := newLab(t)
	var mu sync.Mutex
	var got []string
	seen := func(want string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	l.inA(t, func() {
		err = WatchLinks(ctx, func(name string, up bool) {
			mu.Lock()
			defer mu.Unlock()
			s := "resync"
			if name != "" {
				s = name + map[bool]string{true: " up", false: " down"}[up]
			}
			got = append(got, s)
		}, func(msg string, err error) { t.Logf("%s: %v", msg, err) })
	})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !seen(want) {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no update %q within 5 s; got %q", want, got)
			}
			time.Sleep(5 * time.Millisecond)
		}
		mu.Lock()
		got = nil
		mu.Unlock()
	}
	state := func(name string) LinkState {
		t.Helper()
		var ls []LinkState
		var err error
		l.inA(t, func() { ls, err = LinkStates() })
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			if s.Name == "lo" {
				t.Errorf("LinkStates lists lo")
			}
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("LinkStates has no %s: %+v", name, ls)
		return LinkState{}
	}
	wait("resync")
	if s := state("va"); !s.Up || !slices.Contains(s.Prefixes, netip.MustParsePrefix("192.0.2.0/24")) {
		t.Errorf("va at the start: %+v, want up with 192.0.2.0/24", s)
	}

	run(t, "ip", "-n", l.b, "link", "set", "vb", "down") // va's carrier goes
	wait("va down")
	if s := state("va"); s.Up || !slices.Contains(s.Prefixes, netip.MustParsePrefix("192.0.2.0/24")) {
		t.Errorf("va without carrier: %+v, want down, 192.0.2.0/24 still listed", s)
	}
	run(t, "ip", "-n", l.b, "link", "set", "vb", "up")
	wait("va up")
	if s := state("va"); !s.Up {
		t.Errorf("va with carrier again: %+v, want up", s)
	}

	run(t, "ip", "-n", l.a, "link", "set", "va", "down")
	wait("va down")
	if s := state("va"); s.Up {
		t.Errorf("va set down: %+v", s)
	}
	run(t, "ip", "-n", l.a, "link", "set", "va", "up")
	wait("va up")
}
