package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// The copies of gateway-flows between a family's table and its netdev table as the fast path comes
// and goes, so that established flows keep their node. Why, and the netlink side (reading and
// writing the map): dataplane/gateway_flowcopy.go.

// flowCopyBudget bounds all the copies of one Sync together (a rewrite makes two per family): the
// sync loop carries every other change, node deaths too, and they wait for it; a copy cut short
// still saved the flows it wrote. Measured (TestGatewayFlowCopyScale, a shared 2-core VM): 100,000
// entries are read in 0.6-1.5 s, written in 0.3-0.9 s, copied in 1.5-2.5 s; one copy given 2 s
// got through 131,072 entries of a 200,000-entry map. The kernel's dump grows quadratically with
// the map (each 32 KiB message of it walks the hash table from its start again): a full map
// (1,048,576) takes over a minute to read, so far fewer of it fit. A rewrite's two copies share
// the budget. A copy in the background, outside the sync, is what would lift this bound.
const flowCopyBudget = 2 * time.Second

// flowCopyMaxAborts caps the transactions a copy may have refused (an entry the destination holds
// with another node): each costs the kernel an abort (a synchronize_rcu, 10 ms or more), packets
// choose the keys, and each finds at least one clash (one per message that held one, from the
// extended ACK; ~5 refusals per clash without it, addSplitting).
const flowCopyMaxAborts = 32

// flowSplitWays is how many parts addSplitting splits a refused transaction into when the kernel
// named none of the refused entries (no extended ACK): more parts find an entry in fewer refusals
// (log16 of the batch rather than log2), at the price of transactions that succeed, which cost far
// less than an abort.
const flowSplitWays = 16

// flowMinLife is the least life a copied entry must have left: one about to expire is not worth a
// place in a transaction, and its flow is dealt again by the same rules as an expired one.
const flowMinLife = time.Second

// flowSkip is why an entry was not copied.
type flowSkip int

const (
	flowCopied   flowSkip = iota
	flowBadKey            // not a key of the destination's layout
	flowGoneNode          // its node is in no VIP port's gateway-conns now
	flowExpiring          // less than flowMinLife left
)

// flowCopyPlan is the pure part of a copy: which entries go, and with what life.
type flowCopyPlan struct {
	keyLen int
	// nodes are the ids of the nodes some VIP port's gateway-conns holds (gatewayFlowNodes).
	nodes map[uint32]bool
	// timeout is the destination map's timeout.
	timeout time.Duration
}

// translate decides one entry: the entry to write, or why none.
func (p flowCopyPlan) translate(in dataplane.GatewayFlow) (dataplane.GatewayFlow, flowSkip) {
	switch {
	case len(in.Key) != p.keyLen:
		return dataplane.GatewayFlow{}, flowBadKey
	case in.Mark == 0 || !p.nodes[in.Mark]:
		return dataplane.GatewayFlow{}, flowGoneNode
	case in.Expires < flowMinLife:
		// An entry without an expiry (Expires 0) cannot come from a map with a timeout; it is not
		// made immortal by the copy either.
		return dataplane.GatewayFlow{}, flowExpiring
	}
	return dataplane.GatewayFlow{Key: in.Key, Mark: in.Mark, Timeout: p.timeout, Expires: min(in.Expires, p.timeout)}, flowCopied
}

// gatewayFlowNodes are the node ids of family f's gateway-conns for entries: every backend and
// draining node of the VIP ports whose flows the connection table keeps (Maglev, not source-hash).
func gatewayFlowNodes(entries []Entry) map[uint32]bool {
	out := map[uint32]bool{}
	for _, e := range entries {
		if e.Algorithm == cluster.LBSourceHash {
			continue
		}
		for _, list := range [][]netip.AddrPort{e.Backends, e.Draining} {
			for _, b := range list {
				if id, ok := dataplane.GatewayNodeID(b.Addr()); ok {
					out[id] = true
				}
			}
		}
	}
	return out
}

// FlowCopy reports one copy of a connection table into another's.
type FlowCopy struct {
	Family cluster.Family
	// From and To name the tables ("netdev table vipgate-fwd4", "IPv4 table vipgate"); Why is
	// the transition ("fast path off", "fast path on", "netdev table rewritten").
	From, To, Why string
	// Read entries, of which Copied were written; the others were left out as stale (their node
	// left), expiring, of another layout, or refused (the destination holds the flow with another
	// node), or listed twice (Duplicates). Aborts are the transactions the kernel refused for the
	// refused entries.
	Read, Copied, Stale, Expiring, BadKey, Refused, Duplicates, Aborts int
	Duration                                                           time.Duration
	// Err is why the copy stopped (nil: it ran to its end): ErrFlowCopyTruncated, ENFILE (the
	// destination is full) or another failure. The flows not copied are dealt again, as without
	// the copy.
	Err error
}

// Result is the copy's outcome for metrics: "done", "truncated" (the sync's budget, the cap of
// refused transactions, an interrupted dump), "full" (the destination map is full) or "failed".
func (c FlowCopy) Result() string {
	switch {
	case c.Err == nil:
		return "done"
	case errors.Is(c.Err, dataplane.ErrFlowCopyTruncated):
		return "truncated"
	case errors.Is(c.Err, unix.ENFILE):
		return "full"
	}
	return "failed"
}

// String formats the copy for logs.
func (c FlowCopy) String() string {
	return fmt.Sprintf("%s -> %s (%s): %d read, %d copied, %d stale, %d expiring, %d refused (%d transactions) in %v",
		c.From, c.To, c.Why, c.Read, c.Copied, c.Stale, c.Expiring, c.Refused, c.Aborts, c.Duration.Round(time.Millisecond))
}

// flowTable is one table holding a gateway-flows map.
type flowTable struct {
	family cluster.Family
	table  string
}

func (t flowTable) String() string { return dataplane.TableString(t.family, t.table) }

// copyGatewayFlows copies the entries of from's gateway-flows into to's by plan, until deadline. A
// source that does not exist is no copy and no error (Read 0).
func copyGatewayFlows(store dataplane.GatewayFlowStore, from, to flowTable, plan flowCopyPlan, why string, deadline time.Time) (rep FlowCopy) {
	start := time.Now()
	rep = FlowCopy{Family: dataplane.IPFamily(from.family), From: from.String(), To: to.String(), Why: why}
	lim := &flowCopyLimit{deadline: deadline}
	var w dataplane.GatewayFlowWriter
	defer func() {
		if w != nil {
			w.Close()
		}
		rep.Aborts = lim.aborts
		rep.Duration = time.Since(start)
	}()
	if err := lim.check(); err != nil {
		rep.Err = err
		return rep
	}
	pending := make([]dataplane.GatewayFlow, 0, dataplane.FlowCopyBatch)
	// The keys read: the kernel's dump restarts its hash walk at each message and skips as many
	// entries as it sent, so a resize of the map's hash table during the dump (the kernel's, in the
	// background, as the map grows or shrinks) lists some entries twice and others not at all.
	// Those are not written twice (that would be refused as a clash), and the copy is reported
	// truncated.
	seen := map[string]struct{}{}
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if w == nil {
			var err error
			if w, err = store.GatewayFlowWriter(to.family, to.table, MapGatewayFlows, deadline); err != nil {
				return err
			}
		}
		copied, refused, err := addSplitting(w, pending, lim)
		rep.Copied += copied
		rep.Refused += refused
		pending = pending[:0]
		return err
	}
	err := store.ReadGatewayFlows(from.family, from.table, MapGatewayFlows, deadline, func(chunk []dataplane.GatewayFlow) error {
		if err := lim.check(); err != nil {
			return err
		}
		for _, in := range chunk {
			if _, dup := seen[string(in.Key)]; dup {
				rep.Duplicates++
				continue
			}
			seen[string(in.Key)] = struct{}{}
			rep.Read++
			out, skip := plan.translate(in)
			switch skip {
			case flowBadKey:
				rep.BadKey++
				continue
			case flowGoneNode:
				rep.Stale++
				continue
			case flowExpiring:
				rep.Expiring++
				continue
			}
			// The chunk's slices are the reader's: the key is copied.
			out.Key = append([]byte(nil), out.Key...)
			pending = append(pending, out)
			if len(pending) == dataplane.FlowCopyBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil || errors.Is(err, dataplane.ErrFlowCopyTruncated) && !lim.cut {
		// A dump the kernel interrupted still delivered entries: they are written, and the copy
		// reported truncated.
		if ferr := flush(); ferr != nil {
			err = ferr
		}
	}
	if err == nil && rep.Duplicates > 0 {
		err = fmt.Errorf("%w: the dump listed %d entries twice (the map was resized during it): others may be missing", dataplane.ErrFlowCopyTruncated, rep.Duplicates)
	}
	if err != nil && !errors.Is(err, dataplane.ErrNoFlowsMap) {
		rep.Err = err
	}
	return rep
}

// flowCopyLimit is what bounds one copy: its sync's deadline and its refused transactions.
type flowCopyLimit struct {
	deadline time.Time
	aborts   int
	// cut: check refused to go on.
	cut bool
}

// check says whether the copy may send (or read) more: an ErrFlowCopyTruncated once the deadline
// has passed or flowCopyMaxAborts transactions were refused.
func (l *flowCopyLimit) check() error {
	switch {
	case l.aborts >= flowCopyMaxAborts:
		l.cut = true
		return fmt.Errorf("%w: %d transactions refused for entries the destination holds with another node (flowCopyMaxAborts)", dataplane.ErrFlowCopyTruncated, l.aborts)
	case !l.deadline.IsZero() && time.Now().After(l.deadline):
		l.cut = true
		return fmt.Errorf("%w: the sync's copy budget (flowCopyBudget, %v) is spent", dataplane.ErrFlowCopyTruncated, flowCopyBudget)
	}
	return nil
}

// addSplitting adds flows in one transaction; when the kernel refuses it for an entry the map holds
// with another node (EEXIST), it adds the rest without the entries the kernel named (extended ACK:
// the first clash of each message), or, when it named none, flowSplitWays parts of it, down to
// single entries; and counts the refused ones. It stops when lim does; other errors end it. copied and refused count the
// entries written and those the destination holds with another node.
func addSplitting(w dataplane.GatewayFlowWriter, flows []dataplane.GatewayFlow, lim *flowCopyLimit) (copied, refused int, err error) {
	if err := lim.check(); err != nil {
		return 0, 0, err
	}
	err = w.Add(flows)
	switch {
	case err == nil:
		return len(flows), 0, nil
	case !errors.Is(err, unix.EEXIST):
		return 0, 0, err
	}
	lim.aborts++
	if len(flows) == 1 {
		return 0, 1, nil
	}
	if at, _ := dataplane.ClashedFlows(err); len(at) > 0 {
		// The kernel named the refused entries (the first of each message that held one): the
		// rest goes again without them.
		rest := make([]dataplane.GatewayFlow, 0, len(flows)-len(at))
		for i, fl := range flows {
			if !slices.Contains(at, i) {
				rest = append(rest, fl)
			}
		}
		if n := len(flows) - len(rest); n > 0 {
			copied, refused, err = addSplitting(w, rest, lim)
			return copied, refused + n, err
		}
	}
	part := (len(flows) + flowSplitWays - 1) / flowSplitWays
	for i := 0; i < len(flows); i += part {
		c, r, err := addSplitting(w, flows[i:min(i+part, len(flows))], lim)
		copied, refused = copied+c, refused+r
		if err != nil {
			return copied, refused, err
		}
	}
	return copied, refused, nil
}

// syncCopies are the copies of one Sync.
type syncCopies struct {
	// done: the family's netdev table's flows were copied in this sync, or need no copy.
	done map[cluster.Family]bool
	// deadline ends every copy of the sync: flowCopyBudget after its first began (zero before).
	deadline time.Time
}

// applyNetdev applies family f's netdev transaction tx, carrying the connection table across it (see
// the file comment): a transaction that deletes or replaces the netdev table copies its flows into
// the family's table first; one that creates it is applied in two, with the family's flows copied
// in between. entries are the family's VIP ports (for the nodes whose flows are kept). A copy never
// fails the transaction.
func (p *Proxier) applyNetdev(tx *dataplane.Tx, entries []Entry, rep *SyncReport, sc *syncCopies) error {
	store, ok := p.prog.(dataplane.GatewayFlowStore)
	if !ok || !tx.Full || p.cfg.Forwarding != cluster.ForwardRoute {
		// A diff keeps the table and its gateway-flows; other forwardings have no connection table.
		return p.prog.Apply(tx)
	}
	f := dataplane.IPFamily(tx.Family)
	netdev, fam := flowTable{tx.Family, tx.Table}, flowTable{f, p.cfg.Table}
	plan := flowCopyPlan{keyLen: dataplane.FlowKeyLen(f), nodes: gatewayFlowNodes(entries), timeout: p.cfg.FlowTimeout}
	deletion := len(tx.AddChains) == 0 && len(tx.AddSets) == 0
	if p.ndevFail[f] != nil {
		// The family's last netdev transaction failed: the table it left was deleted, its flows
		// copied into the family's first (saveNetdevFlows), or it stayed (stale) with those flows
		// copied. A retry, which may well fail the same way (a chain the kernel refuses), is sent
		// whole, and the family's flows are copied into the new table only once the kernel took
		// it: copying before, at every retry of the backoff, would be spent for nothing. The
		// price: a flow whose slot moved and whose packet comes between the ingress chains and the
		// end of that copy (milliseconds) is dealt by Maglev; its entry then clashes with the
		// copy's and stays as the packet wrote it.
		sc.done[f] = true
		if err := p.prog.Apply(tx); err != nil || deletion {
			return err
		}
		p.copyFlows(store, fam, netdev, plan, "fast path on after a failure", rep, sc)
		return nil
	}
	why := "netdev table rewritten"
	if deletion {
		why = "fast path off"
	}
	// The table may not exist (a first start, the fast path coming on): nothing is read then.
	p.copyFlows(store, netdev, fam, plan, why, rep, sc)
	sc.done[f] = true
	if deletion {
		return p.prog.Apply(tx)
	}
	first, hooks := splitIngress(tx)
	if err := p.prog.Apply(first); err != nil {
		return err
	}
	p.copyFlows(store, fam, netdev, plan, "fast path on", rep, sc)
	if hooks == nil {
		return nil
	}
	return p.prog.Apply(hooks)
}

// saveNetdevFlows copies the netdev table of tx's family into the family's table before the table a
// failed netdev transaction left is deleted, unless this sync copied it already (the failed
// transaction replaced the table: applyNetdev copied just before).
func (p *Proxier) saveNetdevFlows(tx *dataplane.Tx, entries []Entry, rep *SyncReport, sc *syncCopies) {
	store, ok := p.prog.(dataplane.GatewayFlowStore)
	f := dataplane.IPFamily(tx.Family)
	if !ok || sc.done[f] || p.cfg.Forwarding != cluster.ForwardRoute {
		return
	}
	plan := flowCopyPlan{keyLen: dataplane.FlowKeyLen(f), nodes: gatewayFlowNodes(entries), timeout: p.cfg.FlowTimeout}
	p.copyFlows(store, flowTable{tx.Family, tx.Table}, flowTable{f, p.cfg.Table}, plan, "fast path off after a failed transaction", rep, sc)
	sc.done[f] = true
}

// copyFlows runs one copy within the sync's budget and reports it (in rep and the log) when it read
// anything or stopped short. A plan without nodes copies nothing: every entry would be stale (no
// VIP port has a node, whyNoNodes).
func (p *Proxier) copyFlows(store dataplane.GatewayFlowStore, from, to flowTable, plan flowCopyPlan, why string, rep *SyncReport, sc *syncCopies) {
	if len(plan.nodes) == 0 {
		return
	}
	if sc.deadline.IsZero() {
		sc.deadline = time.Now().Add(flowCopyBudget)
	}
	c := copyGatewayFlows(store, from, to, plan, why, sc.deadline)
	if c.Read == 0 && c.Err == nil {
		return
	}
	rep.FlowCopies = append(rep.FlowCopies, c)
	if c.Err != nil {
		p.log.Warn("connection table not copied in full; the flows left out are dealt again by Maglev", "copy", c.String(), "result", c.Result(), "err", c.Err)
		return
	}
	p.log.Info("connection table copied", "copy", c.String())
}

// splitIngress splits a transaction that creates a netdev table into the table without its ingress
// chains (no packet reaches it) and those chains (nil: it has none).
func splitIngress(tx *dataplane.Tx) (first, hooks *dataplane.Tx) {
	t := *tx
	t.AddChains = nil
	var ingress []*dataplane.Chain
	for _, ch := range tx.AddChains {
		if ch.Hook == dataplane.HookIngress {
			ingress = append(ingress, ch)
		} else {
			t.AddChains = append(t.AddChains, ch)
		}
	}
	if len(ingress) == 0 {
		return tx, nil
	}
	return &t, &dataplane.Tx{Family: tx.Family, Table: tx.Table, AddChains: ingress, Sets: tx.Sets}
}
