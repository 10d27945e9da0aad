package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is where the relay listens and sends.
type Config struct {
	// Local is this gateway's address and port on the sync link (the relay listens there), Peer
	// the peer's relay. Only datagrams from Peer are read.
	Local, Peer netip.AddrPort
	// Listen is where conntrackd sends (a loopback address; conntrackd's
	// IPv4_Destination_Address and Port), Daemon where conntrackd listens (its IPv4_address and
	// Port). Only datagrams from Daemon's address are read on Listen.
	Listen, Daemon netip.AddrPort
	// Keys are the membership keys: the first signs, any verifies.
	Keys [][]byte
	// Limits bound the datagrams let through (zero: DefaultLimits).
	Limits Limits
}

// Direction names the way a datagram goes, for the counts and the metric.
type Direction string

const (
	// In: from the peer's relay to conntrackd.
	In Direction = "in"
	// Out: from conntrackd to the peer's relay.
	Out Direction = "out"
)

// Relay carries conntrackd's datagrams to and from the peer's relay (package doc).
type Relay struct {
	log     hclog.Logger
	cfg     Config
	s       *session
	lan, lo *net.UDPConn

	mu      sync.Mutex
	counts  map[Direction]map[Verdict]uint64
	logged  map[Verdict]time.Time
	metrics *prometheus.CounterVec
}

// New binds the relay's sockets (Local on the LAN, Listen on loopback). The metric
// vipgate_gateway_conntrack_relay_datagrams_total{direction,verdict} is registered on reg (may be
// nil).
func New(log hclog.Logger, cfg Config, reg prometheus.Registerer) (*Relay, error) {
	switch {
	case !cfg.Local.IsValid() || !cfg.Peer.IsValid() || !cfg.Listen.IsValid() || !cfg.Daemon.IsValid():
		return nil, errors.New("conntrack sync relay: needs its LAN address, the peer's, and the loopback addresses")
	case cfg.Local.Addr().Unmap().Is4() != cfg.Peer.Addr().Unmap().Is4():
		return nil, fmt.Errorf("conntrack sync relay: %s and the peer %s are of different families", cfg.Local, cfg.Peer)
	case !cfg.Listen.Addr().IsLoopback() || !cfg.Daemon.Addr().IsLoopback():
		return nil, fmt.Errorf("conntrack sync relay: conntrackd's side %s, %s must be loopback addresses", cfg.Listen, cfg.Daemon)
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	s, err := newSession(cfg.Local.Addr().Unmap(), cfg.Peer.Addr().Unmap(), cfg.Keys, cfg.Limits, time.Now, randomU64)
	if err != nil {
		return nil, err
	}
	r := &Relay{log: log, cfg: cfg, s: s, counts: map[Direction]map[Verdict]uint64{In: {}, Out: {}}, logged: map[Verdict]time.Time{},
		metrics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vipgate_gateway_conntrack_relay_datagrams_total",
			Help: "Datagrams of the conntrack sync relay by direction (in: from the peer to conntrackd; out: from conntrackd to the peer) and verdict (forwarded, or why not)."},
			[]string{"direction", "verdict"})}
	if reg != nil {
		if err := reg.Register(r.metrics); err != nil {
			return nil, fmt.Errorf("conntrack sync relay: registering metrics: %w", err)
		}
	}
	if r.lan, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Local)); err != nil {
		return nil, fmt.Errorf("conntrack sync relay: listening on %s: %w", cfg.Local, err)
	}
	if r.lo, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Listen)); err != nil {
		r.lan.Close()
		return nil, fmt.Errorf("conntrack sync relay: listening on %s: %w", cfg.Listen, err)
	}
	return r, nil
}

// SetKeys replaces the keys (a rotation: the first signs from now on, any verifies); with an
// error the old keys stay.
func (r *Relay) SetKeys(keys [][]byte) error { return r.s.setKeys(keys) }

// Counts returns how many datagrams went each way, by verdict.
func (r *Relay) Counts() map[Direction]map[Verdict]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[Direction]map[Verdict]uint64{}
	for d, m := range r.counts {
		out[d] = map[Verdict]uint64{}
		for v, n := range m {
			out[d][v] = n
		}
	}
	return out
}

// count records a verdict, and logs a drop: the first of each reason, then at most one a minute.
func (r *Relay) count(d Direction, v Verdict, from net.Addr) {
	r.metrics.WithLabelValues(string(d), string(v)).Inc()
	r.mu.Lock()
	r.counts[d][v]++
	n := r.counts[d][v]
	logIt := false
	switch v {
	case Forwarded, Handshake, Queued:
	default:
		if t, ok := r.logged[v]; !ok || time.Since(t) > time.Minute {
			r.logged[v], logIt = time.Now(), true
		}
	}
	r.mu.Unlock()
	if logIt {
		r.log.Warn("conntrack sync relay: dropped a datagram", "direction", string(d), "reason", string(v), "from", from.String(), "count", n)
	}
}

// Run carries datagrams until ctx ends, then closes the sockets.
func (r *Relay) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.fromPeerLoop() }()
	go func() { defer wg.Done(); r.fromDaemonLoop() }()
	r.sendPeer(r.s.Hello())
	r.log.Info("conntrack sync relay up", "lan", r.cfg.Local, "peer", r.cfg.Peer, "conntrackd", r.cfg.Daemon)
	<-ctx.Done()
	r.lan.Close()
	r.lo.Close()
	wg.Wait()
}

func (r *Relay) sendPeer(b []byte) {
	if b != nil {
		_, _ = r.lan.WriteToUDPAddrPort(b, r.cfg.Peer)
	}
}

func (r *Relay) fromPeerLoop() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.lan.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if from.Addr().Unmap() != r.cfg.Peer.Addr().Unmap() || from.Port() != r.cfg.Peer.Port() {
			r.count(In, WrongSource, net.UDPAddrFromAddrPort(from))
			continue
		}
		payload, send, v := r.s.fromPeer(buf[:n])
		r.count(In, v, net.UDPAddrFromAddrPort(from))
		for _, b := range send {
			r.sendPeer(b)
		}
		if payload != nil {
			_, _ = r.lo.WriteToUDPAddrPort(payload, r.cfg.Daemon)
		}
	}
}

func (r *Relay) fromDaemonLoop() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.lo.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if from.Addr().Unmap() != r.cfg.Daemon.Addr().Unmap() {
			r.count(Out, WrongSource, net.UDPAddrFromAddrPort(from))
			continue
		}
		out, v := r.s.fromDaemon(buf[:n])
		r.count(Out, v, net.UDPAddrFromAddrPort(from))
		r.sendPeer(out)
	}
}
