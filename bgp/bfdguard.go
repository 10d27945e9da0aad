package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Workaround for a GoBGP v4.8.0 bug that keeps a BFD peer's session down for good after one reset.
//
// When GoBGP's BFD session for a neighbor goes from Up (or Init) to Down (expiry, or the router
// signalling Down/AdminDown), bfd_peer.go calls BgpServer.ResetPeer, which puts a Cease/
// Administrative Reset NOTIFICATION ("BFD is down") into the neighbor FSM's one-slot channel
// fsm.notification (server.go sendNotification -> peer.sendNotification, non-blocking). Only
// fsm.go's established() reads that channel. A router such as BIRD removes its BFD session whenever
// its BGP session goes down, so after a BGP reset GoBGP's BFD session always fails *after* the BGP
// session is already Idle: the NOTIFICATION stays queued, and the next session is killed the moment
// it is Established. BIRD's BFD session then goes away again, GoBGP's BFD fails again while BGP is
// Idle, and so on every ~6.5s (5s idle hold + connect) until the process restarts.
//
// The queued NOTIFICATION lives in the FSM, which lives as long as the neighbor; GoBGP offers no
// API to clear it. Deleting the neighbor and adding it again with the same configuration does: it
// builds a new FSM (empty channel) and, since stopNeighbor also removes the neighbor's BFD session,
// a new BFD session that starts Down, so the old one can no longer fail later and queue another
// NOTIFICATION.
//
// Triggers, for a peer with BFD (both lead to renewBFDPeer, which acts only while the session is
// not Established):
//
//  1. GoBGP queues a hard-reset NOTIFICATION for it: ResetPeer logs "Send operation notification"
//     with Op "Neighbor reset" and Key <address> (server.go sendNotification) in the same serve-loop
//     operation that queues it. vipgate itself only ever calls ResetPeer soft (which returns before
//     that point), so this is GoBGP's BFD. GoBGP has no event for it and no API exposing the BFD
//     transition reliably: polling BFD state misses it, since the router's next BFD session often
//     brings GoBGP's back Up within 100ms of the expiry. The log record is the only exact signal, so
//     the handler GoBGP logs through (logging.go) passes it here. If the session is Established at
//     that moment, the NOTIFICATION is consumed normally (the session drops: trigger 2); if not, it
//     is stale, and the peer is re-created before the old FSM can reach Established again: after any
//     session loss it waits at least 5s in Idle (idleHoldAfterReset, GoBGP's holdtimeIdle), then
//     needs a connection and an OPEN exchange.
//  2. Its session leaves Established (GoBGP peer state event). This catches the stale NOTIFICATION
//     a BIRD config reload leaves: the BFD session that would fail ~1 detection time later is
//     deleted with the neighbor first. It is also the fallback if trigger 1 stops matching (a GoBGP
//     upgrade rewording its log): a stale NOTIFICATION then kills one session instead of all.
//
// Safety: DeletePeer writes its Cease only from an Established FSM (fsm.go established() is the
// only reader of deconfiguredNotification); renewBFDPeer checks with ListPeer, under s.mu, right
// before deleting that the session is not Established, and that the peer is still the one the
// event was about (SetPeers did not replace it since). s.mu serializes it with SetPeers and
// SetAdvertisements like any other change of s.peers.
//
// Cost: a BFD peer's neighbor is re-created once per session loss and once per BFD failure while
// the session is down; it then connects at once instead of after the 5s idle hold. It cannot loop
// by itself: a re-created neighbor starts with BFD Down and triggers again only after its BFD came
// Up and failed, or its session was Established and dropped. Graceful restart is kept: the
// neighbor is added with the same PeerConfig and GoBGP's current LocalRestarting flag, so it sends
// the OPEN the old FSM would have sent; the router, as a graceful restart helper, keeps our routes
// (where the drop allowed it) until the new session's End-of-RIB. Only the peer's Adj-RIB-In is
// dropped, and vipgate does not use received routes.
//
// Remove this file (and the hook in logging.go) once GoBGP drops a NOTIFICATION queued before the
// session was Established (the fix upstream: drain fsm.notification on entering established()).

// bfdGuard is the state of the workaround, owned by the Speaker.
type bfdGuard struct {
	cancel context.CancelFunc
	// kick carries the addresses whose session left Established, to the worker.
	kick chan bfdGuardEvent
	done chan struct{}
}

type bfdGuardEvent struct {
	addr netip.Addr
	at   time.Time
	why  string
}

// newBFDGuard returns the guard and the log hook to give GoBGP's logger (trigger 1).
func newBFDGuard(log hclog.Logger) (*bfdGuard, func(string, func(string) any)) {
	g := &bfdGuard{kick: make(chan bfdGuardEvent, 64), done: make(chan struct{})}
	hook := func(msg string, attr func(string) any) {
		if msg != "Send operation notification" || fmt.Sprint(attr("Op")) != "Neighbor reset" {
			return
		}
		addr, err := netip.ParseAddr(fmt.Sprint(attr("Key")))
		if err != nil {
			return
		}
		// Called inside GoBGP's serve loop: never block.
		select {
		case g.kick <- bfdGuardEvent{addr: addr, at: time.Now(), why: "BFD reset queued a NOTIFICATION"}:
		default:
			log.Warn("BFD guard: event queue full, dropping an event", "address", addr)
		}
	}
	return g, hook
}

// startBFDGuard watches GoBGP's peer state events (trigger 2) and starts the worker. Call once,
// from New, with the guard newBFDGuard made.
func (s *Speaker) startBFDGuard(g *bfdGuard) error {
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	// Callbacks run on one goroutine of GoBGP's watcher, in order, so last needs no lock.
	last := map[netip.Addr]gobgp.FSMState{}
	err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, at time.Time) {
			if ev == nil || ev.Type != apiutil.PEER_EVENT_STATE {
				return
			}
			addr, st := ev.Peer.State.NeighborAddress, ev.Peer.State.SessionState
			was := last[addr]
			last[addr] = st
			if was == gobgp.BGP_FSM_ESTABLISHED && st != gobgp.BGP_FSM_ESTABLISHED {
				select {
				case g.kick <- bfdGuardEvent{addr: addr, at: at, why: "session left Established"}:
				default:
					s.log.Warn("BFD guard: event queue full, dropping a session-down event", "address", addr)
				}
			}
		},
	}, server.WatchPeer())
	if err != nil {
		cancel()
		return err
	}
	go func() {
		defer close(g.done)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-g.kick:
				s.renewBFDPeer(ev)
			}
		}
	}()
	return nil
}

// stopBFDGuard stops the watcher and the worker. Call without s.mu held (the worker takes it).
func (s *Speaker) stopBFDGuard() {
	if g := s.bfdGuard; g != nil && g.cancel != nil {
		g.cancel()
		<-g.done
	}
}

// renewBFDPeer deletes and re-adds the BFD peer at ev.addr whose session went down, if it is still
// configured as it was then and its session is still not Established.
func (s *Speaker) renewBFDPeer(ev bfdGuardEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	var p PeerConfig
	found := false
	for _, c := range s.peers {
		if c.PeerAddress == ev.addr {
			p, found = c, true
			break
		}
	}
	// A peer SetPeers removed, or replaced after the event (a new neighbor, new FSM): nothing to do.
	if !found || p.BFD == nil || s.peerAdded[p.Name].After(ev.at) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var cur *api.Peer
	err := s.srv.ListPeer(ctx, &api.ListPeerRequest{Address: ev.addr.String()}, func(ap *api.Peer) { cur = ap })
	if err != nil || cur == nil {
		s.log.Warn("BFD guard: reading peer state", "peer", p.Name, "err", err)
		return
	}
	if cur.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED {
		// Never send DeletePeer's Cease to a live session. After trigger 1 this session reads the
		// NOTIFICATION at once and drops, which is trigger 2. After trigger 2 the old FSM cannot
		// be Established again this soon (5s idle hold), so nothing is stale here.
		return
	}
	restarting := cur.GetGracefulRestart().GetLocalRestarting()
	s.log.Info("re-creating the GoBGP neighbor of a BFD peer whose session is down, so that no stale BFD NOTIFICATION kills its next session",
		"peer", p.Name, "address", p.PeerAddress, "trigger", ev.why, "state", sessionState(cur.GetState().GetSessionState()))
	if err := s.deletePeer(p); err != nil {
		s.log.Warn("BFD guard: removing peer", "peer", p.Name, "err", err)
		return
	}
	if err := s.addPeer(p, restarting); err != nil {
		// SetPeers adds it again next time, since it is no longer in s.peers.
		s.log.Error("BFD guard: re-adding peer", "peer", p.Name, "err", err)
	}
}
