package gateway

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/gateway/ctsync"
)

// SNATOwnerPoll is how often the SNAT addresses' owners are re-decided from the membership's view
// (its own detection takes deadAfter, 400 ms by default; this adds at most one poll).
const SNATOwnerPoll = 50 * time.Millisecond

// SNATSettle is how long a gateway whose membership never became ready waits before it takes over
// the SNAT addresses of peers it does not hear.
const SNATSettle = 5 * time.Second

// PeerView is the membership's view of the gateways, as the SNAT addresses' owners are decided
// from it (cmd/vipgate adapts the speaker's membership: its View's Total and Candidates). total
// ≤ 1 (no membership, L2 refused, or this gateway alone) takes nothing over.
type PeerView interface {
	View() (total int, alive map[string]bool)
}

// Announcer answers ARP/NDP for the SNAT addresses this gateway owns (an l2.Announcer of its own,
// which cmd/vipgate makes): SetOwned gives each owned address its interfaces, Reannounce sends
// gratuitous ARP/unsolicited NA for them again (the pairs sent).
type Announcer interface {
	SetOwned(map[netip.Addr][]string) error
	Reannounce() int
	Close() error
}

// SNATOwners decides, poll after poll, which SNAT addresses this gateway answers for
// (ctsync.OwnedSNAT), which peers came back (they get this gateway's conntrack table: a gateway
// that restarted with an empty table gets back the flows it NATed before), and when its own
// addresses must be announced again. It does no I/O: watchSNATOwners feeds it the time and the
// membership's view and carries its decisions out.
type SNATOwners struct {
	self   string
	byGw   map[string][]netip.Addr
	resync time.Duration

	started time.Time
	// seen are the peers the membership has heard alive at least once.
	seen      map[string]bool
	prevAlive map[string]bool
	// last and lastSet are the owned addresses last handed to the announcer, and when.
	last    []netip.Addr
	lastSet time.Time
}

// NewSNATOwners starts the decisions of gateway self at now: byGateway are the SNAT addresses of
// each gateway (snatAddresses), resync how often the owned set is handed to the announcer again
// without a change (a failed interface is retried: l2's contract).
func NewSNATOwners(self string, byGateway map[string][]netip.Addr, resync time.Duration, now time.Time) *SNATOwners {
	return &SNATOwners{self: self, byGw: byGateway, resync: resync, started: now, seen: map[string]bool{}, prevAlive: map[string]bool{}}
}

// SNATDecision is one step's outcome.
type SNATDecision struct {
	// Owned are the SNAT addresses this gateway answers for (sorted); Alive and Takeover the
	// inputs ctsync.OwnedSNAT decided them from (for the log).
	Owned    []netip.Addr
	Alive    map[string]bool
	Takeover bool
	// Set says to hand Owned to the announcer: it changed (Changed, logged), or the last time is
	// resync ago.
	Set, Changed bool
	// Returned are the peers alive again (or for the first time), sorted: each gets the whole
	// conntrack table.
	Returned []string
	// Reannounce says to announce this gateway's addresses again: a peer is heard again after a
	// silence; if this gateway was the one cut off, the peer answered for its addresses meanwhile
	// and the LAN's caches point at it.
	Reannounce bool
}

// Step decides at now from the membership's view (total members, and which are alive).
func (o *SNATOwners) Step(now time.Time, total int, candidates map[string]bool) SNATDecision {
	// Take a peer's address over only once the membership has heard it (or SNATSettle passed):
	// never on no evidence at start.
	alive, takeover := map[string]bool{o.self: true}, false
	if total > 1 {
		alive, takeover = maps.Clone(candidates), true
		if alive == nil {
			alive = map[string]bool{}
		}
		// A peer is taken over only once it was seen alive, or after SNATSettle: at start the
		// view fills in member by member.
		settled := now.Sub(o.started) > SNATSettle
		for name, ok := range candidates {
			o.seen[name] = o.seen[name] || ok
		}
		for name := range o.byGw {
			if !o.seen[name] && !settled {
				alive[name] = true
			}
		}
	}
	d := SNATDecision{Alive: alive, Takeover: takeover}
	for name := range alive {
		if alive[name] && !o.prevAlive[name] && name != o.self && o.seen[name] {
			d.Returned = append(d.Returned, name)
		}
	}
	slices.Sort(d.Returned)
	d.Reannounce = len(d.Returned) > 0 && len(o.prevAlive) > 0
	o.prevAlive = alive
	d.Owned = ctsync.OwnedSNAT(o.self, o.byGw, alive, takeover)
	d.Changed = !slices.Equal(d.Owned, o.last)
	if d.Changed || o.lastSet.IsZero() || now.Sub(o.lastSet) > o.resync {
		d.Set = true
		o.last, o.lastSet = d.Owned, now
	}
	return d
}

// snatOwnership is what watchSNATOwners needs besides the decisions.
type snatOwnership struct {
	log   hclog.Logger
	peers PeerView
	// ann is nil without SNAT addresses (the peers still get the conntrack table).
	ann     Announcer
	ifaceOf map[netip.Addr]string
	// sup is nil without conntrack sync.
	sup *ctsync.Supervisor
}

// watchSNATOwners follows the membership's view of the gateways every SNATOwnerPoll until ctx
// ends. It answers ARP/NDP for the SNAT addresses this gateway owns (SNATOwners), and when a peer
// joins or comes back it sends the peer the whole conntrack table (sup.SendTable, at once and
// again 2 s later, when the peer's conntrackd surely listens): a gateway that restarted with an
// empty table gets back the flows it NATed before, which this one carried meanwhile.
func watchSNATOwners(ctx context.Context, o *SNATOwners, w snatOwnership) {
	log := w.log
	if w.ann != nil {
		defer w.ann.Close()
	}
	sendTable := func(peer string) {
		for _, wait := range []time.Duration{0, 2 * time.Second} {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if !w.sup.Status().Up {
				return
			}
			if err := w.sup.SendTable(ctx); err != nil && ctx.Err() == nil {
				log.Warn("sending the conntrack table to a returning peer", "peer", peer, "err", err)
				return
			}
		}
		log.Info("sent the conntrack table to the peer", "peer", peer)
	}
	t := time.NewTicker(SNATOwnerPoll)
	defer t.Stop()
	for {
		var total int
		var candidates map[string]bool
		if w.peers != nil {
			total, candidates = w.peers.View()
		}
		d := o.Step(time.Now(), total, candidates)
		if w.sup != nil {
			for _, name := range d.Returned {
				go sendTable(name)
			}
		}
		if w.ann != nil && d.Set {
			m := map[netip.Addr][]string{}
			for _, a := range d.Owned {
				if ifn := w.ifaceOf[a]; ifn != "" {
					m[a] = []string{ifn}
				}
			}
			if err := w.ann.SetOwned(m); err != nil {
				log.Warn("answering for SNAT addresses", "err", err)
			}
			if d.Changed {
				log.Info("SNAT addresses answered here", "addresses", d.Owned, "alive", d.Alive, "takeover", d.Takeover)
			}
		}
		if w.ann != nil && d.Reannounce {
			if n := w.ann.Reannounce(); n > 0 {
				log.Info("SNAT addresses announced again: a peer is back", "pairs", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
