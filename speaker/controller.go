package speaker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/cluster/mlbstatus"
)

// The speaker controller: the runtime around the pure decisions (DecideL2, DecideBGP). It takes
// the desired State and the membership's views, decides, and drives the I/O through small
// interfaces — L2Announcer (l2.Announcer), BGPAnnouncer (bgp.Speaker), Membership
// (membership.Members), EventRecorder (the Kubernetes source), StatusSink (mlbstatus.Writer) — so
// that it is unit-tested with recording fakes. cmd/vipgate wires the real ones.

// L2Where are the interfaces of one owned VIP (l2.Where): Answer where ARP/NDP requests for it are
// answered, Announce those of them where a takeover is announced (nil: every one of Answer).
type L2Where struct {
	Answer   []string
	Announce []string
}

// L2Announcer answers ARP/NDP for the VIPs this node owns (l2.Announcer.SetOwnedWhere). SetOwned
// replaces the whole set: VIPs not in owned stop being answered before it returns. It is called
// again on every resync, with the same set when nothing changed, so that a failed interface is
// retried; an error about some VIPs must not stop the others being served.
type L2Announcer interface {
	SetOwned(owned map[netip.Addr]L2Where) error
	Close() error
}

// BGPAnnouncer is the BGP speaker (bgp.Speaker): routes, sessions, their status, and the two ways
// to stop (Shutdown drains with GRACEFUL_SHUTDOWN first, Stop keeps the routes for graceful
// restart).
type BGPAnnouncer interface {
	SetAdvertisements(ads []bgp.Advertisement) error
	SetPeers(peers []bgp.PeerConfig) error
	Status() []bgp.PeerStatus
	Shutdown(ctx context.Context, drain time.Duration) error
	Stop(ctx context.Context) error
}

// Membership is what the controller needs of the L2 membership protocol (membership.Members,
// adapted in cmd/vipgate; the speaker never imports it, as MetalLB's speaker keeps memberlist
// behind its own interface): it hands over the member lists of the segments this node is in and
// reads the views back. OnChange, keys and the socket stay with whoever runs it.
type Membership interface {
	// SetSegments replaces the members (name -> addresses) and the member lists of the L2
	// segments that hold this node (SegmentsOf).
	SetSegments(peers map[string][]netip.Addr, segments [][]string)
	// SetWilling says this node can announce (it has a State): until then it is never a candidate.
	SetWilling(w bool)
	// SetWithdrawn names the segments (member lists) this node withdraws from while it stays a
	// voter there: link-aware ownership (WithdrawnSegments). It is no candidate in them, in its own
	// view at once and in the others' once its heartbeat says so.
	SetWithdrawn(segments [][]string)
	// View is the membership over all of this node's segments (Total alone is read: the "no
	// other speakers known" warning).
	View() View
	// SegmentViews are the views of this node's segments by L2Segment.Key (SegmentKey of the
	// segment's members).
	SegmentViews() map[string]View
}

// View is what the speaker reads of one evaluation of the membership.
type View struct {
	// Candidates are the members that may own VIPs (alive, and themselves hearing a majority of the
	// segment; this node only while it does): what DecideL2 picks owners from.
	Candidates map[string]bool
	// Total is the member count, this node included.
	Total int
}

// EventRecorder records a Kubernetes Event (cluster.KubeSource implements it).
type EventRecorder interface {
	Event(ref *corev1.ObjectReference, eventType, reason, message string)
}

// StatusSink takes what this node announces and the configuration problems it sees, for MetalLB's
// ServiceL2Status, ServiceBGPStatus and ConfigurationState (mlbstatus.Writer implements it).
type StatusSink interface {
	SetSpeaker(services map[types.NamespacedName]mlbstatus.ServiceStatus, problems []string)
}

// ControllerOptions configure a Controller. L2 is required; the rest may be left zero.
type ControllerOptions struct {
	// Self is this node's name (the gateway's, on a gateway).
	Self string
	Log  hclog.Logger
	// L2 answers ARP/NDP; the Controller closes it on Stop.
	L2 L2Announcer
	// Members is the membership (nil: L2 is refused, and L2Disabled says why on every L2 decision
	// and in Warnings). The caller runs it and calls Recompute from its OnChange.
	Members    Membership
	L2Disabled string
	// Insecure is a warning shown in Warnings (the membership runs without a key).
	Insecure string
	// FixedPeers are the members from the config (speaker.members); nil: the Nodes of the State
	// that run a speaker (NodeMembers).
	FixedPeers map[string][]netip.Addr
	// Links lists this host's interfaces for DecideL2 (nil result: unknown, DefaultInterface
	// answers). Called outside the Controller's lock on every decision.
	Links            func() []Link
	DefaultInterface string
	// RouterID is the BGP router ID (an IPv4 address of this host); without one BGP does not start.
	RouterID netip.Addr
	// NewBGP starts the BGP speaker; it is called with the first State that has BGPPeers for this
	// node. nil: BGP is not available (reported in Warnings when peers ask for it).
	NewBGP func(routerID netip.Addr) (BGPAnnouncer, error)
	// BGPDrain is how long Stop announces the routes with GRACEFUL_SHUTDOWN before withdrawing them
	// (0: Stop keeps them, for graceful restart).
	BGPDrain time.Duration
	// Resync is how often Run decides again without a change (default 5s), so that a failed
	// interface is retried.
	Resync time.Duration
	// LinkStates lists this host's interfaces with their link state (l2.LinkStates), for
	// link-aware ownership: nil turns it off. The caller calls LinkUpdate on every netlink link
	// update; Run reads them again then and every Resync. Called outside the Controller's lock; a
	// nil result (the links could not be listed) changes nothing.
	LinkStates func() []LinkState
	// LinkHoldDown is how long a link that was down must stay up before this node takes the VIPs
	// announced on it back (0: DefaultLinkHoldDown).
	LinkHoldDown time.Duration
	// L2DrainOverlap is how long a draining node keeps answering the VIPs it owned after telling
	// the other members it is not ready (0: DefaultL2DrainOverlap; drain.go).
	L2DrainOverlap time.Duration
}

// DefaultResync is ControllerOptions.Resync's default.
const DefaultResync = 5 * time.Second

// Modes of an announcement, as MetalLB spells them in its Events.
const (
	ModeL2  = "layer2"
	ModeBGP = "bgp"
)

// Controller announces this node's LoadBalancer IPs by L2 and BGP. Update hands it the desired
// State, Recompute a membership change; both decide again and program the announcers. Every
// method is safe for concurrent use.
type Controller struct {
	opts ControllerOptions
	log  hclog.Logger

	mu sync.Mutex
	st *cluster.State
	// segments are the L2 segments of st; owners keeps the VIPs' owners between decisions.
	segments  []L2Segment
	owners    *OwnerCache
	switching bool
	stopped   bool
	decisions []VIPDecision
	lastErr   string
	// problems are the L2 configuration problems already logged ("ip service" -> reason).
	problems map[string]string
	alone    bool

	// announced is what this node announces, per mode: the set that Events and status are about.
	announced map[string]map[announcement]bool
	events    EventRecorder
	status    StatusSink

	bgp          BGPAnnouncer
	bgpErr       string
	bgpDecisions []VIPDecision
	bgpProblems  map[string]string
	bgpPeers     map[cluster.ServiceKey][]string

	// linkMu orders the link updates (updateLinks), so that the membership gets its withdrawals in
	// the order they were decided. Taken before mu.
	linkMu sync.Mutex
	// Under mu: hold is the links' hold-down, withdrawals the segments this node withdraws from,
	// handed what the membership was last given (member lists by SegmentKey), linkTimer the wake-up
	// at the end of the next hold-down.
	hold        LinkHold
	withdrawals []Withdrawal
	handed      map[string][]string
	linkTimer   *time.Timer
	// linkKick wakes Run to read the links (LinkUpdate).
	linkKick chan struct{}

	// drain is the node's drain (drain.go), under mu.
	drain drainState
}

// announcement is one LoadBalancer IP of one Service announced in one mode.
type announcement struct {
	ip  netip.Addr
	svc cluster.ServiceKey
}

// NewController returns a Controller that acts once Update hands it a State.
func NewController(opts ControllerOptions) *Controller {
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.LinkHoldDown <= 0 {
		opts.LinkHoldDown = DefaultLinkHoldDown
	}
	return &Controller{opts: opts, log: opts.Log, owners: NewOwnerCache(), problems: map[string]string{},
		announced: map[string]map[announcement]bool{}, bgpProblems: map[string]string{}, hold: LinkHold{HoldDown: opts.LinkHoldDown},
		linkKick: make(chan struct{}, 1)}
}

// Run decides again every Resync until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.opts.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.linkKick:
			c.updateLinks(false)
		case <-t.C:
			// The links again too: the safety net under the netlink updates.
			c.updateLinks(false)
			c.Recompute()
		}
	}
}

// SetEvents makes the Controller record Events: "nodeAssigned" when it starts announcing an IP,
// and BGP objects it rejects or only partly supports.
func (c *Controller) SetEvents(e EventRecorder) {
	c.mu.Lock()
	c.events = e
	c.mu.Unlock()
}

// SetStatus hands the status resources' writer what is announced, now and after every decision.
func (c *Controller) SetStatus(s StatusSink) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = s
	c.publishStatus()
}

// Update takes a new desired State: the membership gets its segments, then L2 and BGP decide.
func (c *Controller) Update(st *cluster.State) {
	peers := c.opts.FixedPeers
	if peers == nil {
		peers = NodeMembers(st)
	}
	// The segments: which speakers vote on which VIPs. This node always runs a speaker.
	names := []string{c.opts.Self}
	for n := range peers {
		names = append(names, n)
	}
	segs := L2Segments(st, names)
	if segs == nil {
		segs = []L2Segment{} // no L2 pool: no membership (nil would mean "one for all")
	}
	// The State, its segments and the membership's views of them must change together: a decision
	// from new segments and old views (or the reverse) would drop this node's VIPs for an instant.
	// Decisions wait (switching) until the membership has the new segments, then run once.
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.st = st
	c.segments = segs
	c.switching = true
	c.drain.node = NodeDrain(st.Nodes[c.opts.Self])
	c.updateDrainLocked(time.Now())
	willing := !c.drain.active
	c.mu.Unlock()
	if m := c.opts.Members; m != nil {
		// The new segments' withdrawals before the segments themselves (on top of the old ones until
		// they are gone), so that no segment is ready for an instant on a link that is down.
		c.updateLinks(true)
		m.SetSegments(peers, SegmentsOf(segs, c.opts.Self))
		// Now this node can answer, unless it drains (drain.go): tell the others (a no-op after the
		// first State, until a drain starts or ends).
		m.SetWilling(willing)
	}
	c.mu.Lock()
	c.switching = false
	c.mu.Unlock()
	c.updateLinks(false)
	c.Recompute()
	c.updateBGP(st)
}

// LinksChanged reads the links now and withdraws from, or comes back to, the L2 segments whose
// VIPs they carry (link-aware ownership): a down link withdraws at once, one that came up counts
// after LinkHoldDown. The hold-down's timer calls it; netlink updates go through LinkUpdate.
func (c *Controller) LinksChanged() { c.updateLinks(false) }

// LinkUpdate takes one netlink link update (l2.WatchLinks; name "" = read every link again) and
// has Run read the links again, at once; a burst of updates is read once. A down is recorded
// here, so that a down and up too quick for a read in between still restarts the hold-down.
func (c *Controller) LinkUpdate(name string, up bool) {
	if name != "" && !up {
		c.mu.Lock()
		c.hold.Down(name)
		c.mu.Unlock()
	}
	select {
	case c.linkKick <- struct{}{}:
	default:
	}
}

// linkDown is LinkUpdate(name, false) read at once (tests).
func (c *Controller) linkDown(name string) {
	c.mu.Lock()
	c.hold.Down(name)
	c.mu.Unlock()
	c.updateLinks(false)
}

// updateLinks decides the withdrawals from the links as read now and hands them to the
// membership if they changed; union keeps the segments handed before as well (Update, before the
// membership has the new segments). It arms a timer for the end of the next hold-down.
func (c *Controller) updateLinks(union bool) {
	if c.opts.LinkStates == nil || c.opts.Members == nil {
		return
	}
	c.linkMu.Lock()
	defer c.linkMu.Unlock()
	states := c.opts.LinkStates()
	if states == nil {
		return // not listed this time: keep what was decided
	}
	now := time.Now()
	c.mu.Lock()
	if c.st == nil || c.stopped {
		c.mu.Unlock()
		return
	}
	links, why, next := c.hold.Observe(states, now)
	ws := WithdrawnSegments(c.st, c.opts.Self, c.segments, links, why)
	want := map[string][]string{}
	for _, w := range ws {
		want[w.Segment.Key] = w.Segment.Members
	}
	if union {
		for k, v := range c.handed {
			want[k] = v
		}
	}
	for _, w := range ws {
		if !slices.ContainsFunc(c.withdrawals, func(o Withdrawal) bool { return o.Segment.Key == w.Segment.Key }) {
			c.log.Warn("withdrawing from an L2 segment: its VIPs go to the other members until the link is back",
				"segment", strings.Join(w.Segment.Members, ","), "reason", w.Reason)
		}
	}
	for _, o := range c.withdrawals {
		if !slices.ContainsFunc(ws, func(w Withdrawal) bool { return o.Segment.Key == w.Segment.Key }) {
			c.log.Info("back in an L2 segment: link up for the hold-down", "segment", strings.Join(o.Segment.Members, ","), "hold_down", c.opts.LinkHoldDown)
		}
	}
	c.withdrawals = ws
	if c.linkTimer != nil {
		c.linkTimer.Stop()
		c.linkTimer = nil
	}
	if !next.IsZero() {
		c.linkTimer = time.AfterFunc(next.Sub(now), c.LinksChanged)
	}
	changed := len(want) != len(c.handed)
	for k := range want {
		_, had := c.handed[k]
		changed = changed || !had
	}
	if !changed {
		c.mu.Unlock()
		return
	}
	c.handed = want
	lists := make([][]string, 0, len(want))
	for _, v := range want {
		lists = append(lists, v)
	}
	c.mu.Unlock()
	// Outside mu: the membership evaluates at once and calls Recompute.
	c.opts.Members.SetWithdrawn(lists)
}

// Recompute decides L2 again and hands the result to the L2 announcer. It runs on every State,
// on every membership change and every Resync.
func (c *Controller) Recompute() {
	var links []Link
	if c.opts.Links != nil {
		links = c.opts.Links()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st == nil || c.switching || c.stopped {
		return
	}
	var view View
	var segViews map[string]View
	if m := c.opts.Members; m != nil {
		view = m.View()
		segViews = m.SegmentViews()
	}
	if c.opts.Members != nil && view.Total == 1 && !c.alone && len(c.st.Nodes) <= 1 && c.opts.FixedPeers == nil {
		c.alone = true
		c.log.Warn("no other speakers known (no Node objects and no speaker.members): this node announces alone; " +
			"run every speaker with the same member list, or each one answers for every IP")
	}
	owned, decisions := DecideL2(L2Input{Self: c.opts.Self, Links: links, DefaultInterface: c.opts.DefaultInterface,
		State: c.st, Segments: c.segments, SegmentViews: segViews, Owners: c.owners})
	if c.opts.Members == nil {
		for i := range decisions {
			if decisions[i].Reason == "" || decisions[i].Owner == "" {
				decisions[i].Reason = c.opts.L2Disabled
			}
		}
	}
	c.decisions = decisions
	c.logProblems(decisions)
	defer c.publishStatus()
	now := map[announcement]string{}
	for _, d := range decisions {
		if d.Owner == c.opts.Self && len(d.Interfaces) > 0 {
			now[announcement{d.IP, d.Service}] = ""
		}
	}
	c.setAnnounced(ModeL2, now)
	// Answer on every interface DecideL2 chose; announce takeovers on its preferred ones only.
	where := make(map[netip.Addr]L2Where, len(owned))
	for _, d := range decisions {
		if ifs, ok := owned[d.IP]; ok {
			where[d.IP] = L2Where{Answer: ifs, Announce: d.Announce}
		}
	}
	where = c.drainOwnedLocked(where, time.Now()) // a draining node's overlap (drain.go)
	if err := c.opts.L2.SetOwned(where); err != nil {
		if e := err.Error(); e != c.lastErr {
			c.lastErr = e
			c.log.Warn("announcing LoadBalancer IPs", "err", err)
		}
	} else {
		c.lastErr = ""
	}
}

// setAnnounced replaces what this node announces in one mode with now (announcement -> detail for
// the Event) and records a "nodeAssigned" Event for each announcement that starts (MetalLB's
// Event). It is the one place the announced set changes: an announcement that ends is forgotten
// here, so announcing it again is a new start. Called with c.mu held.
func (c *Controller) setAnnounced(mode string, now map[announcement]string) {
	prev := c.announced[mode]
	next := make(map[announcement]bool, len(now))
	for a, detail := range now {
		next[a] = true
		if prev[a] || c.events == nil {
			continue
		}
		ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: a.svc.Namespace, Name: a.svc.Name}
		c.events.Event(ref, corev1.EventTypeNormal, "nodeAssigned",
			fmt.Sprintf("announcing %s from node %q with protocol %q%s", a.ip, c.opts.Self, mode, detail))
	}
	for a := range prev {
		if !next[a] {
			c.log.Debug("no longer announcing", "ip", a.ip, "service", a.svc, "protocol", mode)
		}
	}
	c.announced[mode] = next
}

// logProblems logs each configuration problem of the L2 decisions once (and again only after it
// went away and came back). Called with c.mu held.
func (c *Controller) logProblems(decisions []VIPDecision) {
	seen := map[string]bool{}
	for _, d := range decisions {
		if !d.Problem {
			continue
		}
		key := d.IP.String() + " " + d.Service.String()
		seen[key] = true
		if c.problems[key] != d.Reason {
			c.problems[key] = d.Reason
			c.log.Warn("LoadBalancer IP not announced by L2 as configured", "ip", d.IP, "service", d.Service, "reason", d.Reason)
		}
	}
	for k := range c.problems {
		if !seen[k] {
			delete(c.problems, k)
		}
	}
}

// updateBGP programs the BGP sessions and routes the State asks of this node.
func (c *Controller) updateBGP(st *cluster.State) {
	peers, ads, decisions, problems := DecideBGP(BGPInput{Self: c.opts.Self, State: st})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	ads, decisions = DrainBGP(c.drain.bgp, c.opts.Self, ads, decisions) // drain.go
	c.bgpDecisions = decisions
	defer c.publishStatus()
	c.reportBGPProblems(problems)
	switch {
	case c.bgp != nil:
	case len(peers) == 0:
		c.bgpErr = "" // nothing to peer with: an earlier "not peering" no longer holds
	default:
		b, err := c.startBGP()
		if err != nil {
			if e := err.Error(); e != c.bgpErr {
				c.bgpErr = e
				c.log.Error("not peering", "err", err)
			}
			break
		}
		c.bgp, c.bgpErr = b, ""
	}
	if c.bgp == nil || len(peers) == 0 {
		// Without a BGP speaker, or without a peer to speak to, nothing is announced: no
		// nodeAssigned Event and no ServiceBGPStatus may claim otherwise (MetalLB's speaker, too,
		// reports no peers when no BGPPeer selects the node). VIPs and Warnings say why.
		c.bgpPeers = nil
		c.setAnnounced(ModeBGP, nil)
	} else {
		c.bgpPeers = AdvertisedPeers(c.opts.Self, peers, ads, decisions)
		peerNames := make([]string, 0, len(peers))
		for _, p := range peers {
			peerNames = append(peerNames, p.Name)
		}
		now := map[announcement]string{}
		for _, d := range decisions {
			if d.Owner == c.opts.Self {
				now[announcement{d.IP, d.Service}] = " to peers " + strings.Join(peerNames, ", ")
			}
		}
		c.setAnnounced(ModeBGP, now)
	}
	if c.bgp == nil {
		return
	}
	// Routes first, then sessions: a restarted speaker then announces everything in its first
	// UPDATEs after graceful restart, and the routers see no flap.
	if err := c.bgp.SetAdvertisements(ads); err != nil {
		c.log.Warn("BGP advertisements", "err", err)
	}
	if err := c.bgp.SetPeers(peers); err != nil {
		c.log.Warn("BGP peers", "err", err)
	}
}

func (c *Controller) startBGP() (BGPAnnouncer, error) {
	switch {
	case c.opts.NewBGP == nil:
		return nil, fmt.Errorf("BGP is not available here")
	case !c.opts.RouterID.IsValid():
		return nil, fmt.Errorf("BGP needs an IPv4 node IP as router ID")
	}
	b, err := c.opts.NewBGP(c.opts.RouterID)
	if err != nil {
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	return newLinkBWHolder(b, 0, c.log), nil // weighted ECMP's weights changed at most every 5 s (wecmp.go)
}

// reportBGPProblems logs and records an Event for each BGP object problem when it appears or its
// reason changes: "Rejected", or "Unsupported" for an object used without some of its fields.
// Called with c.mu held.
func (c *Controller) reportBGPProblems(problems []Problem) {
	seen := make(map[string]string, len(problems))
	for _, p := range problems {
		obj := p.Object.String()
		seen[obj] = p.Reason
		if c.bgpProblems[obj] == p.Reason {
			continue
		}
		reason, msg := "Rejected", "rejected"
		if p.Accepted {
			// In use, a field ignored: never silent (log, Event, ConfigurationState).
			reason, msg = "Unsupported", "accepted with an unsupported field"
		}
		c.log.Warn(msg, "object", obj, "reason", p.Reason)
		if c.events != nil {
			apiVersion := "metallb.io/v1beta1"
			if p.Object.Kind == "BGPPeer" {
				apiVersion = "metallb.io/v1beta2"
			}
			c.events.Event(&corev1.ObjectReference{APIVersion: apiVersion, Kind: p.Object.Kind, Namespace: p.Object.Namespace, Name: p.Object.Name},
				corev1.EventTypeWarning, reason, p.Reason)
		}
	}
	c.bgpProblems = seen
}

// publishStatus hands the status sink what this node announces and the configuration problems it
// sees. Called with c.mu held.
func (c *Controller) publishStatus() {
	if c.status == nil || c.st == nil {
		return
	}
	svcs := map[types.NamespacedName]mlbstatus.ServiceStatus{}
	for k, ifs := range AnnouncedInterfaces(c.decisions) {
		key := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		svcs[key] = mlbstatus.ServiceStatus{Interfaces: ifs, Peers: svcs[key].Peers}
	}
	for k, peers := range c.bgpPeers {
		key := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		svcs[key] = mlbstatus.ServiceStatus{Interfaces: svcs[key].Interfaces, Peers: peers}
	}
	// The L2 owners of each Service's IPs (a dual-stack Service may have two): the node announcing
	// it removes the others' ServiceL2Status, but not theirs.
	for _, d := range c.decisions {
		key := types.NamespacedName{Namespace: d.Service.Namespace, Name: d.Service.Name}
		if st, ok := svcs[key]; ok && d.Owner != "" && !slices.Contains(st.L2Owners, d.Owner) {
			st.L2Owners = append(st.L2Owners, d.Owner)
			slices.Sort(st.L2Owners)
			svcs[key] = st
		}
	}
	problems := map[string]string{}
	for _, r := range c.st.Rejected {
		problems[r.Kind+" "+r.Object] = r.Reason
	}
	for o, r := range c.bgpProblems {
		problems[o] = r
	}
	if c.bgpErr != "" {
		// Peers ask for BGP but it does not run: ConfigurationState says so, as Warnings does.
		problems["BGP speaker"] = "not peering: " + c.bgpErr
	}
	for k, r := range c.problems {
		ip, svc, _ := strings.Cut(k, " ")
		problems["Service "+svc+" IP "+ip] = r
	}
	c.status.SetSpeaker(svcs, mlbstatus.ProblemLines(problems))
}

// VIPStatus is one LoadBalancer IP as the Controller decided it, for /status.
type VIPStatus struct {
	IP      netip.Addr
	Service cluster.ServiceKey
	// Mode is "l2" or "bgp".
	Mode string
	// Announcer is the node that answers for the IP (L2), or this node (BGP) when it advertises it.
	Announcer string
	// Announced says whether this node announces it now.
	Announced bool
	// Peers are the BGP sessions and their states (BGP only).
	Peers []string
	// Reason says why this node does (not) announce it.
	Reason string
}

// VIPs reports every LoadBalancer IP the last decisions covered: the L2 ones, then the BGP ones.
func (c *Controller) VIPs() []VIPStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]VIPStatus, 0, len(c.decisions)+len(c.bgpDecisions))
	for _, d := range c.decisions {
		reason := d.Reason
		if d.Preference != "" {
			// preferredNodeSelectors: how the owner was chosen (MetalLB v0.16.2).
			reason = strings.TrimPrefix(reason+"; "+d.Preference, "; ")
		}
		out = append(out, VIPStatus{IP: d.IP, Service: d.Service, Mode: "l2", Announcer: d.Owner,
			Announced: d.Owner == c.opts.Self && len(d.Interfaces) > 0, Reason: reason})
	}
	var peers []string
	if c.bgp != nil {
		for _, p := range c.bgp.Status() {
			peers = append(peers, fmt.Sprintf("%s %s (%s)", p.Name, p.Address, p.State))
		}
	}
	for _, d := range c.bgpDecisions {
		// Announced as setAnnounced recorded it: the decision alone does not say whether a speaker
		// and a peer are there to carry it.
		v := VIPStatus{IP: d.IP, Service: d.Service, Mode: "bgp", Announcer: d.Owner,
			Announced: c.announced[ModeBGP][announcement{d.IP, d.Service}], Peers: peers, Reason: d.Reason}
		switch {
		case d.Owner != c.opts.Self || v.Announced:
		case c.bgp == nil:
			v.Reason = "not announced: BGP is not running"
			if c.bgpErr != "" {
				v.Reason += " (" + c.bgpErr + ")"
			}
		default:
			v.Reason = "not announced: no BGPPeer selects this node"
		}
		out = append(out, v)
	}
	return out
}

// Announced lists what this node announces now in mode (ModeL2, ModeBGP): "ip service", sorted.
func (c *Controller) Announced(mode string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.announced[mode]))
	for a := range c.announced[mode] {
		out = append(out, a.ip.String()+" "+a.svc.String())
	}
	slices.Sort(out)
	return out
}

// Warnings lists what /status should show about the speaker as a whole: L2 refused, membership
// without a key, BGP not started, and the BGP objects with problems.
func (c *Controller) Warnings() []string {
	var out []string
	for _, w := range []string{c.opts.L2Disabled, c.opts.Insecure} {
		if w != "" {
			out = append(out, w)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out = append(out, c.drainWarningsLocked()...)
	for _, w := range c.withdrawals {
		out = append(out, fmt.Sprintf("L2: withdrawn from the segment of %s (link-aware ownership): %s", strings.Join(w.Segment.Members, ", "), w.Reason))
	}
	if c.bgpErr != "" {
		out = append(out, "BGP not peering: "+c.bgpErr)
	}
	var problems []string
	for o, r := range c.bgpProblems {
		problems = append(problems, o+": "+r)
	}
	slices.Sort(problems)
	return append(out, problems...)
}

// Stop stops answering ARP/NDP and stops BGP: with BGPDrain, the routes are announced with the
// GRACEFUL_SHUTDOWN community for that long first; without, they are kept for graceful restart.
// Later Updates do nothing.
func (c *Controller) Stop() {
	c.mu.Lock()
	c.stopped = true
	b := c.bgp
	if c.linkTimer != nil {
		c.linkTimer.Stop()
	}
	c.mu.Unlock()
	if err := c.opts.L2.Close(); err != nil {
		c.log.Warn("closing the L2 announcer", "err", err)
	}
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.BGPDrain+10*time.Second)
	defer cancel()
	if c.opts.BGPDrain > 0 {
		c.log.Info("BGP graceful shutdown: draining, then withdrawing", "drain", c.opts.BGPDrain)
		_ = b.Shutdown(ctx, c.opts.BGPDrain)
	} else {
		_ = b.Stop(ctx)
	}
}
