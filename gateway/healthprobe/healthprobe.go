// Package healthprobe is the gateway's health prober: for Services with externalTrafficPolicy
// Local and nodePort forwarding, the gateway sends a Service's traffic only to nodes whose
// healthCheckNodePort answers 200 (the node's vipgate, like kube-proxy, answers 200 while the node
// has a ready local endpoint and 503 otherwise; see proxy/healthcheck), exactly as a cloud load
// balancer does.
//
// It is a leaf of the dataplane: it knows HTTP and targets, not Services or the gateway's tables.
// The gateway lists the targets (gateway.HealthTargets) and builds its table from the
// prober's Snapshot; cmd/vipgate wires the two.
package healthprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Target is what a Prober probes: a comparable value whose String is the address and port of an
// HTTP health check as netip.AddrPort prints it ("10.0.0.1:32001", "[2001:db8::1]:32001").
// The prober is generic in it so that the gateway's own type (gateway.HealthTarget) goes in and
// comes back out of Snapshot unconverted; netip.AddrPort is one too.
type Target interface {
	comparable
	String() string
}

// Outcome is the typed result of one probe.
type Outcome uint8

// Probe outcomes.
const (
	// Unknown: not probed yet. The target is not used until it answers.
	Unknown Outcome = iota
	// Healthy: HTTP 200.
	Healthy
	// NoEndpoints: an HTTP answer other than 200 (503: no local endpoint). Definitive: the target
	// leaves at once.
	NoEndpoints
	// Unreachable: no HTTP answer (timeout, reset, no route). The node may be down, or a packet was
	// lost: the target leaves after Fall such probes in a row, so one lost packet does not move
	// flows.
	Unreachable
	// Refused: the node answered with a TCP reset: it is up but nothing serves the health check (its
	// vipgate is not running). Definitive: the target leaves at once.
	Refused
	// BadAnswer: something answered on the port, but not HTTP. Definitive: the target leaves at once
	// (what serves there is not a health check to trust).
	BadAnswer
)

func (o Outcome) String() string {
	switch o {
	case Healthy:
		return "healthy"
	case NoEndpoints:
		return "no-local-endpoints"
	case Unreachable:
		return "unreachable"
	case Refused:
		return "refused"
	case BadAnswer:
		return "bad-answer"
	}
	return "unknown"
}

// Fall is how many unreachable probes in a row take a target out.
const Fall = 2

// Options configure a Prober.
type Options struct {
	// Interval is the time between the starts of two probes of one target.
	Interval time.Duration
	// Timeout bounds one probe (default: Interval, at most 1 s).
	Timeout time.Duration
	// OnChange is called (from a prober goroutine) whenever a target's usability changes. It must not
	// block; the gateway loop coalesces the calls.
	OnChange func()
}

// Prober probes a set of health targets, each in its own goroutine, and keeps which are usable. Its
// state is owned by the prober; the gateway reads it with Snapshot.
type Prober[T Target] struct {
	log  hclog.Logger
	opts Options
	hc   *http.Client

	mu      sync.Mutex
	targets map[T]*probeState
	closed  bool
}

type probeState struct {
	cancel   context.CancelFunc
	outcome  Outcome
	usable   bool
	failures int
	// since is when the target last changed usability, for the log.
	since time.Time
}

// New returns a Prober with no targets.
func New[T Target](log hclog.Logger, opts Options) *Prober[T] {
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = min(opts.Interval, time.Second)
	}
	if opts.OnChange == nil {
		opts.OnChange = func() {}
	}
	// A fresh connection per probe: a kept-alive connection to a node whose vipgate died could hide it,
	// and a new TCP handshake is what the VIP traffic needs to work as well.
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	return &Prober[T]{log: log, opts: opts, hc: &http.Client{Transport: tr, Timeout: opts.Timeout}, targets: map[T]*probeState{}}
}

// SetTargets makes ts the set of probed targets: new ones start (unknown, so unused until their first
// answer), gone ones stop. A target whose String is not an address:port is logged and not probed.
func (p *Prober[T]) SetTargets(ts []T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	want := make(map[T]bool, len(ts))
	for _, t := range ts {
		if _, err := netip.ParseAddrPort(t.String()); err != nil {
			// Not probed, so never usable: a caller's bug, said once per SetTargets.
			p.log.Error("health target is not an address:port; not probed", "target", t.String(), "err", err)
			continue
		}
		want[t] = true
		if _, ok := p.targets[t]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		p.targets[t] = &probeState{cancel: cancel, since: time.Now()}
		go p.run(ctx, t)
	}
	for t, s := range p.targets {
		if !want[t] {
			s.cancel()
			delete(p.targets, t)
		}
	}
}

// Timeout is the time one probe may take.
func (p *Prober[T]) Timeout() time.Duration { return p.opts.Timeout }

// Snapshot returns the usable targets (true) and the others (absent); a fresh map the caller owns.
func (p *Prober[T]) Snapshot() map[T]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := make(map[T]bool, len(p.targets))
	for t, s := range p.targets {
		if s.usable {
			h[t] = true
		}
	}
	return h
}

// WaitProbed waits until every target has been probed at least once, or timeout passes. The gateway
// calls it before its first sync, so that a restart does not program eTP=Local VIPs without
// backends (and reject their clients) for the moment the first probes take.
func (p *Prober[T]) WaitProbed(ctx context.Context, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p.mu.Lock()
		done := true
		for _, s := range p.targets {
			if s.outcome == Unknown {
				done = false
				break
			}
		}
		p.mu.Unlock()
		if done {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Outcomes returns the last outcome of every target (for status output and tests).
func (p *Prober[T]) Outcomes() map[T]Outcome {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[T]Outcome, len(p.targets))
	for t, s := range p.targets {
		out[t] = s.outcome
	}
	return out
}

// Close stops every probe.
func (p *Prober[T]) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for t, s := range p.targets {
		s.cancel()
		delete(p.targets, t)
	}
}

func (p *Prober[T]) run(ctx context.Context, t T) {
	tick := time.NewTicker(p.opts.Interval)
	defer tick.Stop()
	url := "http://" + t.String() + "/"
	for {
		o := p.probe(ctx, url)
		if ctx.Err() != nil {
			return
		}
		p.record(t, o)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probe GETs the healthCheckNodePort once.
func (p *Prober[T]) probe(ctx context.Context, url string) Outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Unreachable
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return Refused
		}
		if strings.Contains(err.Error(), "malformed HTTP") {
			return BadAnswer
		}
		return Unreachable
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return Healthy
	}
	return NoEndpoints
}

// record applies one outcome to the target's state: healthy at once, out at once on a definitive
// answer, out after Fall unreachable probes in a row.
func (p *Prober[T]) record(t T, o Outcome) {
	p.mu.Lock()
	s, ok := p.targets[t]
	if !ok {
		p.mu.Unlock()
		return
	}
	s.outcome = o
	usable := s.usable
	switch o {
	case Healthy:
		s.failures = 0
		usable = true
	case NoEndpoints, Refused, BadAnswer:
		s.failures = 0
		usable = false
	case Unreachable:
		s.failures++
		if s.failures >= Fall {
			usable = false
		}
	}
	changed := usable != s.usable
	var was time.Duration
	if changed {
		s.usable = usable
		was = time.Since(s.since)
		s.since = time.Now()
	}
	p.mu.Unlock()
	if changed {
		state := "down"
		if usable {
			state = "up"
		}
		p.log.Info("health check "+state, "target", t.String(), "outcome", o.String(), "after", fmt.Sprint(was.Round(time.Millisecond)))
		p.opts.OnChange()
	}
}
