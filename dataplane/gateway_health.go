package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The gateway's health prober: for Services with externalTrafficPolicy Local and nodePort
// forwarding, the gateway sends a Service's traffic only to nodes whose healthCheckNodePort answers
// 200 (the node's vipgate, like kube-proxy, answers 200 while the node has a ready local endpoint and
// 503 otherwise), exactly as a cloud load balancer does.

// ProbeOutcome is the typed result of one probe.
type ProbeOutcome uint8

// Probe outcomes.
const (
	// ProbeUnknown: not probed yet. The target is not used until it answers.
	ProbeUnknown ProbeOutcome = iota
	// ProbeHealthy: HTTP 200.
	ProbeHealthy
	// ProbeNoEndpoints: an HTTP answer other than 200 (503: no local endpoint). Definitive: the
	// target leaves at once.
	ProbeNoEndpoints
	// ProbeUnreachable: no HTTP answer (timeout, reset, no route). The node may be down, or a packet
	// was lost: the target leaves after ProbeFall such probes in a row, so one lost packet does not
	// move flows.
	ProbeUnreachable
	// ProbeRefused: the node answered with a TCP reset: it is up but nothing serves the health check
	// (its vipgate is not running). Definitive: the target leaves at once.
	ProbeRefused
	// ProbeBadAnswer: something answered on the port, but not HTTP. Definitive: the target leaves at
	// once (what serves there is not a health check to trust).
	ProbeBadAnswer
)

func (o ProbeOutcome) String() string {
	switch o {
	case ProbeHealthy:
		return "healthy"
	case ProbeNoEndpoints:
		return "no-local-endpoints"
	case ProbeUnreachable:
		return "unreachable"
	case ProbeRefused:
		return "refused"
	case ProbeBadAnswer:
		return "bad-answer"
	}
	return "unknown"
}

// ProbeFall is how many unreachable probes in a row take a target out.
const ProbeFall = 2

// ProberOptions configure a Prober.
type ProberOptions struct {
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
type Prober struct {
	log  hclog.Logger
	opts ProberOptions
	hc   *http.Client

	mu      sync.Mutex
	targets map[HealthTarget]*probeState
	closed  bool
}

type probeState struct {
	cancel   context.CancelFunc
	outcome  ProbeOutcome
	usable   bool
	failures int
	// since is when the target last changed usability, for the log.
	since time.Time
}

// NewProber returns a Prober with no targets.
func NewProber(log hclog.Logger, opts ProberOptions) *Prober {
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
	return &Prober{log: log, opts: opts, hc: &http.Client{Transport: tr, Timeout: opts.Timeout}, targets: map[HealthTarget]*probeState{}}
}

// SetTargets makes ts the set of probed targets: new ones start (unknown, so unused until their first
// answer), gone ones stop.
func (p *Prober) SetTargets(ts []HealthTarget) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	want := make(map[HealthTarget]bool, len(ts))
	for _, t := range ts {
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
func (p *Prober) Timeout() time.Duration { return p.opts.Timeout }

// Snapshot returns the usable targets.
func (p *Prober) Snapshot() Health {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := make(Health, len(p.targets))
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
func (p *Prober) WaitProbed(ctx context.Context, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p.mu.Lock()
		done := true
		for _, s := range p.targets {
			if s.outcome == ProbeUnknown {
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
func (p *Prober) Outcomes() map[HealthTarget]ProbeOutcome {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[HealthTarget]ProbeOutcome, len(p.targets))
	for t, s := range p.targets {
		out[t] = s.outcome
	}
	return out
}

// Close stops every probe.
func (p *Prober) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for t, s := range p.targets {
		s.cancel()
		delete(p.targets, t)
	}
}

func (p *Prober) run(ctx context.Context, t HealthTarget) {
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
func (p *Prober) probe(ctx context.Context, url string) ProbeOutcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return ProbeUnreachable
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return ProbeRefused
		}
		if strings.Contains(err.Error(), "malformed HTTP") {
			return ProbeBadAnswer
		}
		return ProbeUnreachable
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return ProbeHealthy
	}
	return ProbeNoEndpoints
}

// record applies one outcome to the target's state: healthy at once, out at once on a definitive
// answer, out after ProbeFall unreachable probes in a row.
func (p *Prober) record(t HealthTarget, o ProbeOutcome) {
	p.mu.Lock()
	s, ok := p.targets[t]
	if !ok {
		p.mu.Unlock()
		return
	}
	s.outcome = o
	usable := s.usable
	switch o {
	case ProbeHealthy:
		s.failures = 0
		usable = true
	case ProbeNoEndpoints, ProbeRefused, ProbeBadAnswer:
		s.failures = 0
		usable = false
	case ProbeUnreachable:
		s.failures++
		if s.failures >= ProbeFall {
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
