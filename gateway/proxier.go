package gateway

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

// SyncReport tells the caller what a gateway sync did.
type SyncReport struct {
	Duration time.Duration
	Full     bool
	Txs      []*dataplane.Tx
	// Entries are every VIP port of every family, with their backends.
	Entries []Entry
	// VIPs are the LoadBalancer IPs the gateway forwards (for the speaker that announces them).
	VIPs      []netip.Addr
	Conflicts []cluster.Rejection
	// StaleFlows are the gateway's conntrack entries of UDP/SCTP flows to backends that went away,
	// and of every flow to a node drained past its deadline (nodePort forwarding).
	StaleFlows []conntrack.StaleFlow
	// Draining names the nodes draining within their deadline; NextDrainDeadline is the first of
	// their deadlines (zero: none), when the caller must sync again to end that node's flows.
	Draining          []string
	NextDrainDeadline time.Time
	// NextDaisyEnd is when the first daisy chaining window (forwarding: route, FlowTimeout after a
	// VIP port's Maglev table changed) ends (zero: none): the caller must sync again to end it.
	NextDaisyEnd time.Time
	// NoFastPath says, per family, why the route forwarding fast path (Config.FastPath) is
	// not programmed ("IPv4: <why>"); a family without nodes is not listed (nothing to forward).
	NoFastPath []string
	// FastPathWarnings are, per family, what is wrong with a fast path that is on ("IPv4: <what>"):
	// listed ingress devices that do not exist, ingress MTUs larger than the nodes' device's.
	FastPathWarnings []string
	// RetryAt is when the caller must sync again to retry a fast path whose netdev transaction
	// failed, or to delete a netdev table a failed one left (zero: nothing to retry). Sync itself
	// returns no error for those (the family's table forwards), so nothing else would retry them.
	RetryAt time.Time
	// FlowCopies are the copies of a connection table into another that the fast path's coming
	// and going made (flowcopy.go), those that read something or failed.
	FlowCopies []FlowCopy
	// The NAT fast path (Config.NATPath): the VIP ports it was given and the devices it is
	// attached to, what went wrong (it forwards what it holds; the families' tables the rest),
	// and how many of its flows the sync ended (StaleFlows).
	NATPathPorts, NATPathDevices int
	NATPathWarnings              []string
	NATFlowsEnded                int
}

// Proxier owns the gateway's dataplane state, as Proxier does the node's: one goroutine calls
// Sync; every sync rebuilds the whole desired table (a gateway holds at most a few hundred VIPs and its
// input also changes with node health, not only with objects) and sends only the difference.
type Proxier struct {
	log  hclog.Logger
	cfg  Config
	prog dataplane.Programmer

	mu       sync.Mutex
	fams     map[cluster.Family]*Ruleset
	sets     map[cluster.Family]map[string]*dataplane.Set
	needFull bool
	drain    DrainState
	// hist keeps each VIP port's Maglev table and the one before it, for daisy chaining; settle
	// is historySettle (tests set 0).
	hist   gatewayHistory
	settle time.Duration
	// now is the clock of the drain deadlines (time.Now; tests set it).
	now func() time.Time
	// ndev and ndevSets are each family's netdev table (FastPath), ndevWhy why a family has no fast
	// path ("" when it has one), for logging a change once.
	ndev     map[cluster.Family]*dataplane.Ruleset
	ndevSets map[cluster.Family]map[string]*dataplane.Set
	ndevWhy  map[cluster.Family]string
	// ndevPlan is the plan each netdev table was written for: its device indexes (fwd holds the
	// nodes' device by index, a base chain its device by registration), and the plan a failed
	// lookup keeps (netdevPlan.transient).
	ndevPlan map[cluster.Family]netdevPlan
	// ndevStale: a failed netdev transaction left a table that could not be deleted either; the
	// next sync deletes or rewrites it.
	ndevStale map[cluster.Family]bool
	// ndevFail is each family's last netdev failure, for the backoff of its retries.
	ndevFail map[cluster.Family]*netdevFailure
	// natWarn is the NAT fast path's last warnings, logged when they change.
	natWarn string
}

// netdevFailure is a family's failed netdev transactions in a row. The netdev table is sent again
// only at retryAt, delay (1 s, doubling up to netdevRetryMax) after the last failure, rather than at
// every sync: a table the kernel refuses is sent whole (megabytes with 10k Services), and a busy
// cluster syncs every few tens of milliseconds. A new plan (a device created, a node's device
// changed) is tried at once: it is what may fix it.
type netdevFailure struct {
	retryAt time.Time
	delay   time.Duration
	// why is the failure, reported until the retry; plan the plan that failed.
	why  string
	plan netdevPlan
}

// netdevRetryMin and netdevRetryMax bound the delay of a fast path retry (netdevFailure).
const (
	netdevRetryMin = time.Second
	netdevRetryMax = time.Minute
)

// samePlan says whether a and b program the same netdev table layout.
func samePlan(a, b netdevPlan) bool {
	return a.why == b.why && a.nodeDev == b.nodeDev && a.nodeIndex == b.nodeIndex &&
		slices.Equal(a.ingress, b.ingress) && slices.Equal(a.ingressIndex, b.ingressIndex)
}

// NewProxier returns a Proxier that programs through prog. The first Sync replaces the
// table.
func NewProxier(log hclog.Logger, cfg Config, prog dataplane.Programmer) *Proxier {
	return &Proxier{log: log, cfg: cfg.withDefaults(), prog: prog, needFull: true, now: time.Now, settle: historySettle}
}

// Sync brings the kernel to the gateway table for st and health. On error the kernel keeps its
// previous ruleset and the next Sync replaces the table wholesale.
func (p *Proxier) Sync(st *cluster.State, health Health) (*SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	rep := &SyncReport{Full: p.needFull}
	// The drain clock runs across failed syncs: a deadline counts from when a node was first seen
	// draining.
	now := p.now()
	keep, expired, next := p.drain.update(drainingNodes(p.cfg, st), now, p.cfg.DrainTimeout)
	rep.NextDrainDeadline, rep.Draining = next, slices.Sorted(maps.Keys(keep))
	if p.hist == nil {
		p.hist = gatewayHistory{}
	}
	drain := gatewayDrain{keep, expired, p.hist, now, p.settle}
	newFams := map[cluster.Family]*Ruleset{}
	newSets := map[cluster.Family]map[string]*dataplane.Set{}
	newNdev := map[cluster.Family]*dataplane.Ruleset{}
	newNdevSets := map[cluster.Family]map[string]*dataplane.Set{}
	ndevWhy := map[cluster.Family]string{}
	ndevPlans := map[cluster.Family]netdevPlan{}
	newFail := map[cluster.Family]*netdevFailure{}
	planOf := map[cluster.Family]netdevPlan{}
	stale := map[cluster.Family]bool{}
	for _, f := range p.cfg.Families {
		var prev *Ruleset
		if !p.needFull {
			prev = p.fams[f]
		}
		grs, err := buildGatewayRuleset(p.cfg, f, st, health, prev, drain)
		if err != nil {
			return rep, err
		}
		var old *Ruleset
		sets := map[string]*dataplane.Set{}
		if !p.needFull && p.fams[f] != nil {
			old = p.fams[f]
			sets = p.sets[f]
		}
		tx := &dataplane.Tx{Family: f, Table: p.cfg.Table, Full: old == nil}
		var oldRS *dataplane.Ruleset
		if old != nil {
			oldRS = old.Ruleset
		}
		dataplane.DiffRulesets(oldRS, grs.Ruleset, sets, tx, func(_ cluster.ServiceKey, o, n *dataplane.Part) {
			rep.StaleFlows = append(rep.StaleFlows, gatewayStaleFlows(o, n, expiredAddrs(p.cfg, st, f, expired))...)
		})
		if len(tx.DelSets) > 0 && old != nil {
			// A set the base drops (firewall-ips, when the family's last source ranges go): its
			// elements are deleted first (they hold its goto chains), which needs its kind.
			tx.Sets = maps.Clone(sets)
			for _, s := range old.Ruleset.Base.Sets {
				if _, ok := tx.Sets[s.Name]; !ok && slices.Contains(tx.DelSets, s.Name) {
					tx.Sets[s.Name] = s
				}
			}
		}
		if !tx.Empty() {
			rep.Txs = append(rep.Txs, tx)
		}
		newFams[f], newSets[f] = grs, sets
		// The fast path's netdev table after the family's table: the IP stack's path is complete
		// before the netdev chains take packets away from it.
		plan := netdevPlan{why: "off"}
		if p.cfg.Forwarding == cluster.ForwardRoute && p.cfg.FastPath != nil {
			plan = planNetdev(p.cfg.FastPath, gatewayNodeAddrs(p.cfg, st, f, expired))
			if prev, ok := p.ndevPlan[f]; ok && plan.transient && p.ndev[f] != nil {
				// A lookup that failed (a link flap) is no reason to drop the fast path: that
				// would delete the netdev table and the flows in its gateway-flows.
				p.log.Warn("route forwarding fast path: keeping the previous plan", "family", f, "why", plan.why)
				plan = prev
			}
			ndevWhy[f] = plan.why
			if plan.bigMTU != "" && plan.bigMTU != p.ndevPlan[f].bigMTU {
				p.log.Warn("route forwarding fast path: packets larger than the nodes' MTU are lost", "family", f, "why", plan.bigMTU)
			}
			if plan.missing != "" && plan.missing != p.ndevPlan[f].missing {
				p.log.Warn("route forwarding fast path: ingress devices left out", "family", f, "why", plan.missing)
			}
		}
		planOf[f] = plan
		fail := p.ndevFail[f]
		switch {
		case fail != nil && now.Before(fail.retryAt) && (plan.why == "" && samePlan(plan, fail.plan) || plan.why != "" && p.ndevStale[f]):
			// Within the backoff of a failure, and nothing changed that could fix it: no netdev
			// transaction (whether it would write or delete the table). A table the failure left
			// (stale) stays so until the retry.
			if plan.why == "" {
				ndevWhy[f] = fail.why
			}
			newFail[f] = fail
			if p.ndevStale[f] {
				stale[f] = true
			}
		case plan.why == "":
			nrs := gatewayNetdevRuleset(p.cfg, f, grs, plan)
			var old *dataplane.Ruleset
			nsets := map[string]*dataplane.Set{}
			// A new index of a device (re-created under its name) rewrites the table: the diff
			// compares names.
			if prev := p.ndevPlan[f]; !p.needFull && p.ndev[f] != nil && prev.nodeIndex == plan.nodeIndex && slices.Equal(prev.ingressIndex, plan.ingressIndex) {
				old, nsets = p.ndev[f], p.ndevSets[f]
			}
			ntx := &dataplane.Tx{Family: nrs.Family, Table: nrs.Table, Full: old == nil}
			diffGatewayTables(old, nrs, nsets, ntx)
			if !ntx.Empty() {
				rep.Txs = append(rep.Txs, ntx)
			}
			newNdev[f], newNdevSets[f], ndevPlans[f] = nrs, nsets, plan
		case p.needFull || p.ndev[f] != nil || p.ndevStale[f]:
			// No fast path (now): a full sync, or the end of one, deletes the netdev table, which
			// an earlier configuration or run may have left (an empty Full netdev Tx deletes).
			rep.Txs = append(rep.Txs, &dataplane.Tx{Family: dataplane.NetdevFamily(f), Table: dataplane.NetdevTableName(p.cfg.Table, f), Full: true})
		}
		if !grs.NextDaisyEnd.IsZero() && (rep.NextDaisyEnd.IsZero() || grs.NextDaisyEnd.Before(rep.NextDaisyEnd)) {
			rep.NextDaisyEnd = grs.NextDaisyEnd
		}
		rep.Entries = append(rep.Entries, grs.Entries...)
		rep.Conflicts = append(rep.Conflicts, grs.Conflicts...)
		for _, e := range grs.Entries {
			if !slices.Contains(rep.VIPs, e.VIP) {
				rep.VIPs = append(rep.VIPs, e.VIP)
			}
		}
	}
	slices.SortFunc(rep.VIPs, netip.Addr.Compare)
	// A Service's algorithm refusal is found once per family: report it once.
	slices.SortFunc(rep.Conflicts, func(a, b cluster.Rejection) int {
		return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Reason, b.Reason))
	})
	rep.Conflicts = slices.Compact(rep.Conflicts)
	applied := make([]*dataplane.Tx, 0, len(rep.Txs))
	// copies: the connection table copies of this sync (flowcopy.go), with their budget.
	copies := &syncCopies{done: map[cluster.Family]bool{}}
	for _, tx := range rep.Txs {
		var err error
		if dataplane.IsNetdev(tx.Family) {
			err = p.applyNetdev(tx, newFams[dataplane.IPFamily(tx.Family)].Entries, rep, copies)
		} else {
			err = p.prog.Apply(tx)
		}
		if err == nil {
			applied = append(applied, tx)
			continue
		}
		if dataplane.IsNetdev(tx.Family) {
			// The netdev table is a failure domain of its own: the family's table forwards every
			// packet without it (dup). So the sync goes on without the fast path, and a later one
			// writes the netdev table from scratch; forcing the family's table to be re-created
			// would empty its gateway-flows (every flow's node) and keep failing with it.
			f := dataplane.IPFamily(tx.Family)
			why := fmt.Sprintf("programming %s: %v", dataplane.TableString(tx.Family, tx.Table), err)
			if deletion := tx.Full && len(tx.AddChains) == 0 && len(tx.AddSets) == 0; !deletion {
				// What the failed batch left (it is atomic: the previous netdev table) may be wrong
				// now, e.g. a chain of a device that is gone: delete it, its flows copied first.
				p.saveNetdevFlows(tx, newFams[f].Entries, rep, copies)
				if derr := p.prog.Apply(&dataplane.Tx{Family: tx.Family, Table: tx.Table, Full: true}); derr != nil {
					why += fmt.Sprintf("; deleting the table: %v", derr)
					stale[f] = true
				}
			} else {
				stale[f] = true // the failed transaction was the deletion
			}
			fail := &netdevFailure{delay: netdevRetryMin, why: why, plan: planOf[f]}
			if prev := p.ndevFail[f]; prev != nil {
				fail.delay = min(2*prev.delay, netdevRetryMax)
			}
			fail.retryAt = now.Add(fail.delay)
			newFail[f] = fail
			delete(newNdev, f)
			delete(newNdevSets, f)
			delete(ndevPlans, f)
			ndevWhy[f] = why
			continue
		}
		p.needFull, p.fams, p.sets = true, nil, nil
		p.log.Error("gateway sync failed; the kernel keeps the previous ruleset, next sync replaces the table",
			"tx", tx.String(), "err", err)
		return rep, fmt.Errorf("programming %s: %w", dataplane.TableString(tx.Family, tx.Table), err)
	}
	rep.Txs = applied
	if p.cfg.NATPath != nil {
		p.syncNATPath(newFams, rep.StaleFlows, rep)
	}
	for _, f := range p.cfg.Families {
		why, ok := ndevWhy[f]
		if !ok {
			continue
		}
		if why != "" && why != whyNoNodes {
			rep.NoFastPath = append(rep.NoFastPath, fmt.Sprintf("IPv%d: %s", f, why))
		}
		if plan, on := ndevPlans[f]; on {
			for _, w := range []string{plan.missing, plan.bigMTU} {
				if w != "" {
					rep.FastPathWarnings = append(rep.FastPathWarnings, fmt.Sprintf("IPv%d: %s", f, w))
				}
			}
		}
		if fail := newFail[f]; fail != nil && (rep.RetryAt.IsZero() || fail.retryAt.Before(rep.RetryAt)) {
			rep.RetryAt = fail.retryAt
		}
		// Logged when it changes: a failure that persists (a name the kernel refuses) is tried
		// again after each backoff (netdevFailure), and would fill the log otherwise.
		if old, ok := p.ndevWhy[f]; !ok || old != why {
			if why != "" {
				p.log.Warn("no route forwarding fast path; the family's table forwards alone (dup)", "family", f, "why", why)
			} else {
				p.log.Info("route forwarding fast path on", "family", f, "table", newNdev[f].Table)
			}
		}
	}
	p.fams, p.sets, p.needFull = newFams, newSets, false
	p.ndev, p.ndevSets, p.ndevWhy, p.ndevPlan, p.ndevStale, p.ndevFail = newNdev, newNdevSets, ndevWhy, ndevPlans, stale, newFail
	p.hist.prune(rep.Entries)
	rep.Duration = time.Since(start)
	return rep, nil
}

// Flatten returns the current gateway table of family f, or with NetdevFamily(f) its fast path's netdev
// table (nil before the first successful sync).
func (p *Proxier) Flatten(f cluster.Family) *dataplane.Flat {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dataplane.IsNetdev(f) {
		if rs := p.ndev[dataplane.IPFamily(f)]; rs != nil {
			return rs.Flatten()
		}
		return nil
	}
	if g := p.fams[f]; g != nil {
		return g.Ruleset.Flatten()
	}
	return nil
}

// gatewayStaleFlows lists the conntrack entries of datagram flows whose backend left the entry: the
// gateway's conntrack would keep sending a client's UDP "connection" to it forever otherwise. TCP
// connections to a vanished backend fail on their own, and flows whose backend stays keep it (conntrack
// pins a flow to its backend; Maglev only changes the choice for new flows).
func gatewayStaleFlows(old, nw *dataplane.Part, expired map[netip.Addr]bool) []conntrack.StaleFlow {
	if old == nil {
		return nil
	}
	keep := map[dataplane.Backend]bool{}
	if nw != nil {
		for _, b := range nw.Backends {
			keep[b] = true
		}
	}
	var out []conntrack.StaleFlow
	seen := map[dataplane.Backend]bool{}
	for _, b := range old.Backends {
		datagram := b.Proto == dataplane.ProtoUDP || b.Proto == dataplane.ProtoSCTP
		if (!datagram && !expired[b.Endpoint.Addr()]) || keep[b] || seen[b] {
			continue
		}
		seen[b] = true
		out = append(out, conntrack.StaleFlow{Proto: b.Proto, ReplySrc: b.Endpoint.Addr(), ReplySrcPort: b.Endpoint.Port()})
	}
	return out
}
