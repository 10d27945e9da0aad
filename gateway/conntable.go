package gateway

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// The connection table of routed forwarding (forwarding: route) as the gateway fills it: each VIP
// port's gateway-route-ids and gateway-conns elements, which nodes drain (and until when), and the
// Maglev table history behind daisy chaining. Why a dynamic map and not conntrack, and its kinds'
// encoding, text and tracing: dataplane/gateway_conntable.go.

// gatewayConnElements are a VIP port's elements of gateway-route-ids (its Maglev table, node ids as
// data) and gateway-conns (every backend, and every draining node). Nodes without a usable id are
// left out of both; their slots fall through to the stateless rule.
func gatewayConnElements(e Entry, table []int, ids map[netip.Addr]uint32) []dataplane.Element {
	var out []dataplane.Element
	for slot, bi := range table {
		a := e.Backends[bi].Addr()
		if _, ok := ids[a]; !ok {
			continue
		}
		out = append(out, dataplane.Element{Set: MapGatewayRouteIDs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: a})
	}
	seen := map[netip.Addr]bool{}
	for _, b := range append(slices.Clone(e.Backends), e.Draining...) {
		a := b.Addr()
		id, ok := ids[a]
		if !ok || seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, dataplane.Element{Set: MapGatewayConns, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: id, DataAddr: a})
	}
	return out
}

// ConnIDs assigns the node ids of one family's nodes (sorted by name): GatewayNodeID, with
// the second of two nodes that share an id left out.
func ConnIDs(addrs []netip.Addr) map[netip.Addr]uint32 {
	out := map[netip.Addr]uint32{}
	taken := map[uint32]bool{}
	for _, a := range addrs {
		id, ok := dataplane.GatewayNodeID(a)
		if !ok || taken[id] {
			continue
		}
		taken[id] = true
		out[a.Unmap()] = id
	}
	return out
}

// gatewayConntableRules are the rules of gateway-route for a table of size slots (see above).
func gatewayConntableRules(size int) []dataplane.Rule {
	return []dataplane.Rule{
		{Action: dataplane.Action{Kind: dataplane.ActFlowRecall, Set: MapGatewayFlows, Conns: MapGatewayConns}, Comment: "a known flow: to its node, if still one of the VIP port's"},
		{Action: dataplane.Action{Kind: dataplane.ActFlowDaisy, Map: MapGatewayPrevIDs, Set: MapGatewayFlows, Conns: MapGatewayConns, Value: uint32(size)}, Comment: "an unknown connection: to its slot's previous node"},
		{Action: dataplane.Action{Kind: dataplane.ActFlowPick, Map: MapGatewayRouteIDs, Set: MapGatewayFlows, Conns: MapGatewayConns, Value: uint32(size)}, Comment: "a new flow: Maglev, remembered"},
		{Action: dataplane.Action{Kind: dataplane.ActDupJhashMap, Map: MapGatewayRoutes, Value: uint32(size)}, Comment: "gateway-flows is full"},
	}
}

// gatewayConntableSets are the route mode's maps of the connection table.
func gatewayConntableSets(timeout time.Duration) []*dataplane.Set {
	return []*dataplane.Set{
		{Name: MapGatewayRouteIDs, Kind: dataplane.KindTupleMark, Comment: "VIP . proto . port . Maglev slot -> node id"},
		{Name: MapGatewayPrevIDs, Kind: dataplane.KindTupleMark, Comment: "VIP . proto . port . Maglev slot -> the slot's node before the last change"},
		{Name: MapGatewayConns, Kind: dataplane.KindTupleAddr, Comment: "VIP . proto . port . node id -> node (backends and draining nodes)"},
		{Name: MapGatewayFlows, Kind: dataplane.KindGatewayFlows, Timeout: timeout, Comment: "flow -> node id (the connection table)"},
	}
}

// DrainState says which nodes are draining and since when; Proxier keeps it across
// syncs so the deadline counts from the first sync that saw a node draining.
type DrainState struct {
	// Since is when each draining node (by name) was first seen draining.
	Since map[string]time.Time
}

// NodeDraining says whether a node is marked draining: cordoned (spec.unschedulable), or the
// `vipgate.io/drain` annotation or label with a value other than "false" (see DrainLabel).
func NodeDraining(n *cluster.Node) bool {
	if n == nil {
		return false
	}
	if n.Unschedulable {
		return true
	}
	if v, ok := n.Annotations[DrainLabel]; ok && v != "false" {
		return true
	}
	v, ok := n.Labels[DrainLabel]
	return ok && v != "false"
}

// DrainLabel, as a Node annotation or label, marks a node draining for the gateways (as does
// spec.unschedulable, i.e. a cordoned node): no new flows, established flows keep it until they end
// or the gateway's drainTimeout passes. A value of "false" does not drain.
const DrainLabel = "vipgate.io/drain"

// DefaultDrainTimeout is how long a draining node keeps its established flows at most.
const DefaultDrainTimeout = 5 * time.Minute

// drainUpdate updates the draining nodes' start times for this sync at now and returns the nodes
// (by name) that drain, split by whether their deadline has passed, and the next deadline (zero:
// none).
func (d *DrainState) update(draining []string, now time.Time, timeout time.Duration) (keep, expired map[string]bool, next time.Time) {
	if d.Since == nil {
		d.Since = map[string]time.Time{}
	}
	keep, expired = map[string]bool{}, map[string]bool{}
	for name := range d.Since {
		if !slices.Contains(draining, name) {
			delete(d.Since, name) // no longer draining: forgotten, a new drain starts afresh
		}
	}
	for _, name := range draining {
		since, ok := d.Since[name]
		if !ok {
			since = now
			d.Since[name] = now
		}
		end := since.Add(timeout)
		if !now.Before(end) {
			expired[name] = true
			continue
		}
		keep[name] = true
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	return keep, expired, next
}

// gatewayDrain is one sync's view of the draining nodes (by name): keep are still within their
// deadline, expired are past it.
type gatewayDrain struct {
	keep, expired map[string]bool
	// hist is the proxier's table history (nil: none, as for render); now is the sync's clock;
	// settle is how long a table must have been current to be chained to (historySettle).
	hist   gatewayHistory
	now    time.Time
	settle time.Duration
}

// drainingNodes lists the names of the nodes marked draining (NodeDraining), sorted.
func drainingNodes(cfg Config, st *cluster.State) []string {
	var out []string
	if st != nil && len(st.Nodes) > 0 {
		for _, n := range st.Nodes {
			if NodeDraining(n) {
				out = append(out, n.Name)
			}
		}
	} else {
		for i := range cfg.Nodes {
			if NodeDraining(&cfg.Nodes[i]) {
				out = append(out, cfg.Nodes[i].Name)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nodeState is how an endpoint's node takes part: normally, draining, or gone (drained past the
// deadline).
type nodeState uint8

const (
	nodeNormal nodeState = iota
	nodeDraining
	nodeGone
)

// endpointsOnNodes maps the endpoint addresses of slices that run on a draining or gone node to
// that state (forwarding: direct).
func endpointsOnNodes(slices_ []*cluster.EndpointSlice, nodes []gatewayNode) map[netip.Addr]nodeState {
	state := map[string]nodeState{}
	for _, n := range nodes {
		switch {
		case n.gone:
			state[n.name] = nodeGone
		case n.draining:
			state[n.name] = nodeDraining
		}
	}
	out := map[netip.Addr]nodeState{}
	if len(state) == 0 {
		return out
	}
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			if s, ok := state[ep.NodeName]; ok {
				for _, a := range ep.Addresses {
					out[a.Unmap()] = s
				}
			}
		}
	}
	return out
}

// terminatingOn says the Service has an endpoint on node that is terminating but still serving:
// the node's healthCheckNodePort says 503, yet its established connections still have a pod.
func terminatingOn(slices_ []*cluster.EndpointSlice, node string) bool {
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			if ep.NodeName == node && ep.Terminating && ep.Serving {
				return true
			}
		}
	}
	return false
}

// expiredAddrs are the addresses of family f of the nodes drained past their deadline: their
// established flows end (the gateway's conntrack entries of them are deleted, nodePort forwarding).
func expiredAddrs(cfg Config, st *cluster.State, f cluster.Family, expired map[string]bool) map[netip.Addr]bool {
	if len(expired) == 0 || cfg.Forwarding != cluster.ForwardNodePort {
		return nil
	}
	out := map[netip.Addr]bool{}
	for _, n := range gatewayNodes(cfg, st, f) {
		if expired[n.name] {
			out[n.addr] = true
		}
	}
	return out
}

// historySettle is how long a VIP port's table must have been current for the next change to chain
// to it (daisy chaining). Shorter-lived tables are a gateway's own transients, which the other
// gateways behind the router never had: its health checks converging a node at a time when it
// starts or when its own link comes back. A change away from one keeps the last settled table as
// the previous one. The health checks' first round takes one interval, so 10 s covers the default
// 5 s interval and a Fall of 2 unreachable probes.
const historySettle = 10 * time.Second

// gatewayHistory keeps, per VIP port, its current Maglev table and the one before the last change,
// as node addresses by slot, for daisy chaining. It is the proxier's memory: a restarted gateway
// starts without previous tables.
type gatewayHistory map[gwTableKey]*gwTableHist

type gwTableKey struct {
	vip   netip.Addr
	proto uint8
	port  uint16
}

type gwTableHist struct {
	size      int
	cur, prev []netip.Addr
	// changed is when prev stopped being current; since is when cur became current.
	changed, since time.Time
}

// advance records table (indexes into e.Backends, size slots) as e's current table at now and
// returns the previous one (nil: none, or of another size, whose slots mean something else) and
// when it was replaced. A current table younger than settle is a transient: replacing it keeps the
// previous table (historySettle).
func (h gatewayHistory) advance(e Entry, table []int, size int, now time.Time, settle time.Duration) ([]netip.Addr, time.Time) {
	if h == nil {
		return nil, time.Time{}
	}
	cur := make([]netip.Addr, len(table))
	for i, bi := range table {
		cur[i] = e.Backends[bi].Addr()
	}
	k := gwTableKey{e.VIP, e.Proto, e.Port}
	old := h[k]
	switch {
	case old == nil || old.size != size:
		h[k] = &gwTableHist{size: size, cur: cur, since: now}
	case slices.Equal(old.cur, cur):
	case now.Sub(old.since) < settle:
		h[k] = &gwTableHist{size: size, cur: cur, prev: old.prev, changed: old.changed, since: now}
	default:
		h[k] = &gwTableHist{size: size, cur: cur, prev: old.cur, changed: now, since: now}
	}
	return h[k].prev, h[k].changed
}

// daisyWindow is the previous table to daisy chain to at now, and until when (nil, zero: none):
// only for window after the change. A flow that started before the change was idle at most the
// flow timeout when it comes back; a flow that starts after it is remembered by the current table
// and must not be chained to the previous one later (when its gateway dies or its entry expires).
func daisyWindow(prev []netip.Addr, changed, now time.Time, window time.Duration) ([]netip.Addr, time.Time) {
	if prev == nil || changed.IsZero() {
		return nil, time.Time{}
	}
	end := changed.Add(window)
	if !now.Before(end) {
		return nil, time.Time{}
	}
	return prev, end
}

// forget drops e's VIP port's tables: after a time without backends it starts afresh.
func (h gatewayHistory) forget(e Entry) { delete(h, gwTableKey{e.VIP, e.Proto, e.Port}) }

// prune forgets the VIP ports that are not in keep: a VIP port that comes back starts afresh.
func (h gatewayHistory) prune(keep []Entry) {
	live := map[gwTableKey]bool{}
	for _, e := range keep {
		live[gwTableKey{e.VIP, e.Proto, e.Port}] = true
	}
	for k := range h {
		if !live[k] {
			delete(h, k)
		}
	}
}

// gatewayDaisyElements are a VIP port's gateway-route-prev elements: the slots whose node changed
// since the previous table, to that previous node while it is still one of the VIP port's nodes
// (a backend or draining) with an id.
func gatewayDaisyElements(e Entry, table []int, prev []netip.Addr, ids map[netip.Addr]uint32) []dataplane.Element {
	if prev == nil {
		return nil
	}
	live := map[netip.Addr]bool{}
	for _, b := range append(slices.Clone(e.Backends), e.Draining...) {
		live[b.Addr()] = true
	}
	var out []dataplane.Element
	for slot, a := range prev {
		if _, ok := ids[a]; !ok || !live[a] || e.Backends[table[slot]].Addr() == a {
			continue
		}
		out = append(out, dataplane.Element{Set: MapGatewayPrevIDs, Addr: e.VIP, Proto: e.Proto, Port: e.Port, Index: uint32(slot), DataAddr: a})
	}
	return out
}
