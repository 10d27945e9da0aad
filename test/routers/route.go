package routers

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Route is a BGP route as a router learned it, in one format for BIRD and FRR.
type Route struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
	// LocalPref is 0 when the router did not report one (eBGP routes in FRR).
	LocalPref uint32
	// ASPath is the AS path as space-separated numbers ("" for iBGP routes).
	ASPath string
	// Communities are "ASN:VALUE" strings, sorted; well-known names are turned into numbers
	// (graceful-shutdown is "65535:0").
	Communities []string
	// LargeCommunities are "ASN:DATA1:DATA2" strings, sorted.
	LargeCommunities []string
}

// Router is what BIRD and FRR have in common for tests.
type Router interface {
	// Routes returns the BGP routes the router has, IPv4 and IPv6, sorted by prefix.
	Routes() ([]Route, error)
	// Established reports whether the BGP session with neighbor is established.
	Established(neighbor netip.Addr) (bool, error)
}

// Find returns the route for prefix, if present.
func Find(routes []Route, prefix netip.Prefix) (Route, bool) {
	for _, r := range routes {
		if r.Prefix == prefix {
			return r, true
		}
	}
	return Route{}, false
}

// WaitFor polls cond every 50ms until it returns true or timeout passes, and returns the last error.
func WaitFor(timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}
			return fmt.Errorf("timed out after %s", timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitEstablished waits until the router's session with neighbor is established.
func WaitEstablished(r Router, neighbor netip.Addr, timeout time.Duration) error {
	return WaitFor(timeout, func() (bool, error) { return r.Established(neighbor) })
}

// WaitRoute waits until the router has prefix and returns the route.
func WaitRoute(r Router, prefix netip.Prefix, timeout time.Duration) (Route, error) {
	var got Route
	err := WaitFor(timeout, func() (bool, error) {
		routes, err := r.Routes()
		if err != nil {
			return false, err
		}
		var ok bool
		got, ok = Find(routes, prefix)
		return ok, nil
	})
	return got, err
}

// WaitNoRoute waits until the router no longer has prefix.
func WaitNoRoute(r Router, prefix netip.Prefix, timeout time.Duration) error {
	return WaitFor(timeout, func() (bool, error) {
		routes, err := r.Routes()
		if err != nil {
			return false, err
		}
		_, ok := Find(routes, prefix)
		return !ok, nil
	})
}

// wellKnown maps the names routers print to community values (RFC 1997, 7999, 8326).
var wellKnown = map[string]string{
	"graceful-shutdown":   "65535:0",
	"gshut":               "65535:0",
	"blackhole":           "65535:666",
	"no-export":           "65535:65281",
	"no-advertise":        "65535:65282",
	"no-export-subconfed": "65535:65283",
	"local-as":            "65535:65283",
	"no-peer":             "65535:65284",
}

func normCommunities(cs []string) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if v, ok := wellKnown[strings.ToLower(c)]; ok {
			c = v
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func sortRoutes(rs []Route) {
	slices.SortFunc(rs, func(a, b Route) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
}
