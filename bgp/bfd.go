package bgp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/vipgate/vipgate/bgp/bfd"
)

// BFD runs in vipgate's own implementation (package bfd), beside GoBGP rather than inside it:
// GoBGP's neighbors are added without BFD, and a BFD session lives as long as its peer is
// configured with a BFDProfile, whatever happens to the BGP session or to GoBGP's neighbor
// afterwards. It starts when the BGP session is first Established (bfdStartFallback at the
// latest): FRR 8.4's bgpd resets BGP by itself when its BFD session for a neighbor was Up before
// BGP came up (it replaces that session then, and takes the new one's first state, Down, for a
// failure), so BFD must not come up first.
//
// What BGP sees of BFD is one thing: a failure (bfd.EventFailure), on which the BGP session is
// reset. A failure is the detection time expiring while Up, or the remote session we were Up with
// signalling Down with a diagnostic that names a failure. The remote's AdminDown is not (RFC 5882
// 3.2), nor is the remote tearing its session down ("neighbor signaled session down", which
// cannot be true while we are Up) or replacing it by a new one, as long as the session is Up again
// within a detection time at the slow rate. FRR 8.4 does exactly that whenever a BGP session comes
// up after its BFD session (bgpd's bgp_peer_bfd_update_source: the old session sends Down with
// diagnostic 3 and goes away, a new one with a new discriminator starts), and GoBGP's BFD, which
// reset BGP each time, made three nodes and FRR flap in a loop.
//
// A reset is ResetPeer (hard) and only while the session is Established, read with ListPeer right
// before: GoBGP queues the reset's NOTIFICATION in a one-slot channel that only an Established FSM
// reads, so a NOTIFICATION queued at any other time would stay and close the next session the
// moment it is Established (GoBGP v4.8.0). After a reset the resetter waits until the session has
// left Established before it considers the next failure, so two failures close together never
// queue two NOTIFICATIONs. What remains is the microseconds between ListPeer and ResetPeer: a
// session that drops for another reason exactly then keeps our NOTIFICATION and closes its
// successor once; the resetter logs it when it sees the session leave Established without it.

// bfdConfig is the BFD session of a peer with a BFDProfile.
func bfdConfig(p PeerConfig) bfd.Config {
	b := p.BFD
	c := bfd.Config{
		Peer:          p.PeerAddress,
		Local:         p.SourceAddress,
		DesiredMinTx:  b.TransmitInterval,
		RequiredMinRx: b.ReceiveInterval,
		DetectMult:    uint8(b.DetectMultiplier),
		Passive:       b.PassiveMode,
		// An eBGP multi-hop peer gets a multi-hop session (RFC 5883), as FRR's bgpd sets up.
		Multihop: p.EBGPMultiHop,
	}
	if c.Multihop {
		c.MinTTL = uint8(b.MinimumTTL)
	}
	c.MaxDetectTime = b.MaxDetectTime
	// Validated before (validate.go): an error here cannot happen.
	c.Auth, _ = bfdAuth(b.Auth)
	return c
}

// Validate checks a: a known type (or none), and a key that fits it.
func (a BFDAuth) Validate() error {
	_, err := bfdAuth(a)
	return err
}

// bfdAuth converts and checks a peer's BFD authentication.
func bfdAuth(a BFDAuth) (bfd.Auth, error) {
	t, err := bfd.ParseAuthType(a.Type)
	if err != nil {
		return bfd.Auth{}, err
	}
	out := bfd.Auth{Type: t, KeyID: a.KeyID, Key: a.Key}
	return out, out.Validate()
}

// bfdStartFallback is how long a new BFD session is held at most waiting for its BGP session to be
// Established: a router in BFD strict mode establishes BGP only once BFD is Up.
// (A variable for the tests.)
var bfdStartFallback = 30 * time.Second

// syncBFD makes the BFD sessions match the configured peers: a session per peer with a
// BFDProfile, updated in place when only its timers change. A new session is held (silent) until
// its BGP session is Established, or bfdStartFallback. Call with s.mu held.
func (s *Speaker) syncBFD() error {
	want := map[netip.Addr]bfd.Config{}
	names := map[netip.Addr]string{}
	for _, p := range s.peers {
		if p.BFD != nil {
			want[p.PeerAddress] = bfdConfig(p)
			names[p.PeerAddress] = p.Name
		}
	}
	s.bfdNames.Store(&names)
	s.bfdMu.Lock()
	defer s.bfdMu.Unlock()
	var errs []error
	for _, addr := range slices.SortedFunc(maps.Keys(s.bfdPeers), netip.Addr.Compare) {
		if _, ok := want[addr]; !ok {
			if err := s.bfd.Remove(addr); err != nil {
				errs = append(errs, fmt.Errorf("removing BFD session with %s: %w", addr, err))
			}
			delete(s.bfdPeers, addr)
			if t, ok := s.bfdHeld[addr]; ok {
				t.Stop()
				delete(s.bfdHeld, addr)
			}
		}
	}
	for _, addr := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
		c := want[addr]
		old, ok := s.bfdPeers[addr]
		switch {
		case ok:
			c.Hold = old.Hold
		case !s.established(addr):
			c.Hold = true
			s.bfdHeld[addr] = time.AfterFunc(bfdStartFallback, func() {
				s.startBFD(addr, fmt.Sprintf("no established BGP session after %s", bfdStartFallback))
			})
		}
		if ok && old == c {
			continue
		}
		if err := s.bfd.Set(c); err != nil {
			errs = append(errs, fmt.Errorf("BFD session with %s: %w", addr, err))
			continue
		}
		s.bfdPeers[addr] = c
	}
	return errors.Join(errs...)
}

// established reports whether GoBGP's session with addr is Established.
func (s *Speaker) established(addr netip.Addr) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	up := false
	_ = s.srv.ListPeer(ctx, &api.ListPeerRequest{Address: addr.String()}, func(p *api.Peer) {
		up = p.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED
	})
	return up
}

// startBFD starts the held BFD session with addr, if there is one.
func (s *Speaker) startBFD(addr netip.Addr, why string) {
	s.bfdMu.Lock()
	defer s.bfdMu.Unlock()
	t, held := s.bfdHeld[addr]
	if !held {
		return
	}
	t.Stop()
	delete(s.bfdHeld, addr)
	c := s.bfdPeers[addr]
	c.Hold = false
	if err := s.bfd.Set(c); err != nil {
		if !errors.Is(err, bfd.ErrClosed) {
			s.log.Warn("starting the BFD session", "peer", s.bfdPeerName(addr), "address", addr, "err", err)
		}
		return
	}
	s.bfdPeers[addr] = c
	s.log.Info("BFD session started", "peer", s.bfdPeerName(addr), "address", addr, "trigger", why)
}

// watchEstablished starts held BFD sessions when their BGP session becomes Established.
func (s *Speaker) watchEstablished() error {
	ctx, cancel := context.WithCancel(context.Background())
	err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev != nil && ev.Type == apiutil.PEER_EVENT_STATE && ev.Peer.State.SessionState == gobgp.BGP_FSM_ESTABLISHED {
				s.startBFD(ev.Peer.State.NeighborAddress, "BGP session established")
			}
		},
	}, server.WatchPeer())
	if err != nil {
		cancel()
		return err
	}
	s.stopWatch = cancel
	return nil
}

// bfdPeerName names the peer at addr in logs (the address if it has no BFD session).
func (s *Speaker) bfdPeerName(addr netip.Addr) string {
	if n, ok := (*s.bfdNames.Load())[addr]; ok {
		return n
	}
	return addr.String()
}

// onBFDEvent runs on the BFD server's goroutine: it logs and hands failures to the resetter, and
// never blocks.
func (s *Speaker) onBFDEvent(ev bfd.Event) {
	name := s.bfdPeerName(ev.Peer)
	switch {
	case ev.Kind == bfd.EventFailure:
		s.log.Warn("BFD session failed", "peer", name, "address", ev.Peer, "reason", ev.Failure,
			"remote_state", ev.RemoteState, "remote_diag", ev.RemoteDiag)
		s.bfdResets.kick(ev)
	case ev.From == ev.To:
		s.log.Debug("BFD session created", "peer", name, "address", ev.Peer, "discriminator", ev.LocalDiscr)
	case ev.Grace > 0:
		s.log.Info("BFD: the router tore down or replaced its session; handshaking again (a failure only if not up within the grace time)",
			"peer", name, "address", ev.Peer, "replaced", ev.Replaced, "old_remote_discriminator", ev.ReplacedFrom,
			"remote_discriminator", ev.RemoteDiscr, "remote_diag", ev.RemoteDiag, "grace", ev.Grace)
	default:
		s.log.Info("BFD session state", "peer", name, "address", ev.Peer, "from", ev.From, "to", ev.To, "diag", ev.Diag,
			"remote_state", ev.RemoteState, "remote_diag", ev.RemoteDiag, "remote_discriminator", ev.RemoteDiscr)
	}
}

// bfdResetter resets BGP sessions whose BFD session failed, one at a time, off the BFD goroutine.
type bfdResetter struct {
	log hclog.Logger
	srv *server.BgpServer
	// name names a peer in logs.
	name func(netip.Addr) string

	mu      sync.Mutex
	pending map[netip.Addr]bfd.Event
	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func newBFDResetter(log hclog.Logger, srv *server.BgpServer, name func(netip.Addr) string) *bfdResetter {
	r := &bfdResetter{log: log, srv: srv, name: name, pending: map[netip.Addr]bfd.Event{},
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// kick queues a failure; failures of one peer not yet handled collapse into one.
func (r *bfdResetter) kick(ev bfd.Event) {
	r.mu.Lock()
	r.pending[ev.Peer] = ev
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// stop ends the worker; failures still queued are dropped (the speaker is going away).
func (r *bfdResetter) stop() {
	r.once.Do(func() { close(r.quit) })
	<-r.done
}

func (r *bfdResetter) run() {
	defer close(r.done)
	for {
		select {
		case <-r.quit:
			return
		case <-r.wake:
		}
		r.mu.Lock()
		batch := r.pending
		r.pending = map[netip.Addr]bfd.Event{}
		r.mu.Unlock()
		for _, addr := range slices.SortedFunc(maps.Keys(batch), netip.Addr.Compare) {
			r.reset(batch[addr])
		}
	}
}

// peerState reads the session state and the count of NOTIFICATIONs sent of the neighbor at addr.
func (r *bfdResetter) peerState(addr netip.Addr) (state api.PeerState_SessionState, notifications uint64, found bool) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := r.srv.ListPeer(ctx, &api.ListPeerRequest{Address: addr.String()}, func(p *api.Peer) {
		state = p.GetState().GetSessionState()
		notifications = p.GetState().GetMessages().GetSent().GetNotification()
		found = true
	})
	if err != nil {
		r.log.Warn("BFD: reading the BGP session state", "address", addr, "err", err)
		return 0, 0, false
	}
	return state, notifications, found
}

// resetWait bounds the wait for a reset session to leave Established.
const resetWait = 2 * time.Second

// reset closes the BGP session of a peer whose BFD session failed, if it is Established.
func (r *bfdResetter) reset(ev bfd.Event) {
	name := r.name(ev.Peer)
	state, sent, found := r.peerState(ev.Peer)
	if !found {
		return
	}
	if state != api.PeerState_SESSION_STATE_ESTABLISHED {
		r.log.Info("BFD failure: the BGP session is not established, nothing to reset", "peer", name, "address", ev.Peer,
			"state", sessionState(state))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	err := r.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: ev.Peer.String(), Soft: false,
		Communication: "BFD down: " + ev.Failure.String()})
	cancel()
	if err != nil {
		r.log.Error("BFD failure: resetting the BGP session", "peer", name, "address", ev.Peer, "err", err)
		return
	}
	r.log.Warn("BFD failure: BGP session reset", "peer", name, "address", ev.Peer, "reason", ev.Failure)
	deadline := time.Now().Add(resetWait)
	for time.Now().Before(deadline) {
		select {
		case <-r.quit:
			return
		case <-time.After(10 * time.Millisecond):
		}
		now, sentNow, found := r.peerState(ev.Peer)
		if !found {
			return
		}
		if now != api.PeerState_SESSION_STATE_ESTABLISHED {
			if sentNow == sent {
				r.log.Warn("BFD failure: the BGP session closed without sending our reset; GoBGP may close its next session once, right after it is established",
					"peer", name, "address", ev.Peer)
			}
			return
		}
	}
	r.log.Warn("BFD failure: the BGP session is still established after the reset", "peer", name, "address", ev.Peer, "waited", resetWait)
}

// bfdStateOf maps a BFD session state to the public BFDState.
func bfdStateOf(s bfd.State) BFDState {
	switch s {
	case bfd.StateUp:
		return BFDUp
	case bfd.StateInit:
		return BFDInit
	case bfd.StateAdminDown:
		return BFDAdminDown
	}
	return BFDDown
}
