package proxy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/tablenames"
)

// Config is what the dataplane needs to know about the node it programs.
type Config struct {
	Table         string
	NodeName      string
	Zone          string
	NodeIPs       []netip.Addr
	ClusterCIDRs  []netip.Prefix
	ServiceCIDRs  []netip.Prefix
	NodePortIPs   []netip.Addr
	MasqueradeAll bool
	MasqueradeBit int
	// Families lists the families to program (default: IPv4 and IPv6).
	Families []cluster.Family
	// ExternalIPs is the policy for external and LoadBalancer IPs (see AddressScreen).
	ExternalIPs cluster.ExternalIPPolicy
	// Limits bound what one Service may cost (budget.go; zero fields: the defaults).
	Limits cluster.ServiceLimits
}

// entryKey identifies one way into a Service across Services, for ownership.
type entryKey struct {
	nodePort bool
	addr     netip.Addr
	proto    uint8
	port     uint16
}

type familyState struct {
	rs         *dataplane.Ruleset
	elemRefs   *dataplane.ElementRefs
	sharedRefs map[string]int
	// claims says who holds each entry (claims.go); refused keeps the addresses each Service's
	// parts were refused (AddressScreen), for the report.
	claims  *claimTable
	refused map[cluster.ServiceKey][]dataplane.Refusal
	// sets indexes every set of the table by name (the netlink edge needs their kinds).
	sets map[string]*dataplane.Set
}

// Proxier owns the dataplane state: it turns snapshots of the desired state into the smallest
// transactions that bring the kernel there. One goroutine calls Sync; Flatten may be called from any.
type Proxier struct {
	log  hclog.Logger
	cfg  Config
	prog dataplane.Programmer

	// reader, if set, lets the first sync adopt the live table instead of replacing it.
	reader  TableReader
	adopted bool

	mu       sync.Mutex
	fams     map[cluster.Family]*familyState
	needFull bool
	// lastFams are the families of the last sync that got as far as programming, whether or not
	// the kernel took it. Unlike fams it survives a failed sync, so that the full sync after it
	// still knows which Services went away since (deletedFlows); pendingStale are the conntrack
	// flows of the syncs that failed, reported by the next one that succeeds.
	lastFams     map[cluster.Family]*familyState
	pendingStale []conntrack.StaleFlow
	// What the last successful sync saw, to find changed Services by pointer: seen for every
	// Service, seenSlices the slices of those with more than one (see seenService).
	seen       map[cluster.ServiceKey]seenService
	seenSlices map[cluster.ServiceKey][]*cluster.EndpointSlice
	// nodeAddrs are the node addresses the last sync screened external IPs against; when they
	// change, every Service with external or LoadBalancer IPs is screened again.
	nodeAddrs map[netip.Addr]bool
	// svcCIDRs are the service CIDRs the table is built with: Config.ServiceCIDRs and the State's
	// (ServiceCIDR objects), cluster.ServiceCIDRs.
	svcCIDRs  []netip.Prefix
	healthChk map[cluster.ServiceKey]uint16
	localEps  map[cluster.ServiceKey]int
	lastSync  time.Time
}

// NewProxier returns a Proxier that programs through prog. The first Sync replaces the table.
func NewProxier(log hclog.Logger, cfg Config, prog dataplane.Programmer) *Proxier {
	if cfg.Table == "" {
		cfg.Table = "vipgate"
	}
	if len(cfg.Families) == 0 {
		cfg.Families = []cluster.Family{cluster.IPv4, cluster.IPv6}
	}
	if cfg.MasqueradeBit == 0 {
		cfg.MasqueradeBit = 14
	}
	return &Proxier{log: log, cfg: cfg, prog: prog, needFull: true}
}

func (p *Proxier) nodeInfo(f cluster.Family) NodeInfo {
	known := false
	for _, c := range p.cfg.ClusterCIDRs {
		known = known || familyOfPrefix(c) == f
	}
	return NodeInfo{Family: f, NodeName: p.cfg.NodeName, Zone: p.cfg.Zone, NodeIPs: p.cfg.NodeIPs, PodTrafficKnown: known, Limits: p.cfg.Limits}
}

func (p *Proxier) baseConfig(f cluster.Family) BaseConfig {
	return BaseConfig{
		Family: f, MasqueradeAll: p.cfg.MasqueradeAll, MasqueradeBit: p.cfg.MasqueradeBit,
		ClusterCIDRs: p.cfg.ClusterCIDRs, ServiceCIDRs: p.svcCIDRs, NodePortIPs: p.cfg.NodePortIPs,
	}
}

// Sync brings the kernel to the desired state st. On error the kernel keeps its previous ruleset
// (every transaction is atomic) and the next Sync replaces the table wholesale.
func (p *Proxier) Sync(st *cluster.State) (*dataplane.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	// The service CIDRs are the configured ones and the cluster's ServiceCIDR objects. They are part
	// of the fixed table (the cluster-IPs check, the external-IP screen): a range that comes or goes
	// rebuilds the table, in one atomic transaction as any full sync. Rare: an administrator's act.
	if cidrs := cluster.ServiceCIDRs(p.cfg.ServiceCIDRs, st); !slices.Equal(cidrs, p.svcCIDRs) {
		if !p.needFull {
			p.log.Info("service CIDRs changed; rebuilding the table", "serviceCIDRs", fmt.Sprint(cidrs))
		}
		p.svcCIDRs = cidrs
		p.needFull = true
	}
	rep := &dataplane.SyncReport{Full: p.needFull}

	changed := p.changedServices(st)
	screen := p.screen(st)
	if !p.needFull && !maps.Equal(screen.NodeAddrs, p.nodeAddrs) {
		// A node address came or went: Services that claim an address may gain or lose it.
		for k, svc := range st.Services {
			if len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0 {
				changed = append(changed, k)
			}
		}
		sortServiceKeys(changed)
		changed = slices.Compact(changed)
	}
	restoreGC := func() {}
	if p.needFull && len(changed) > 1000 {
		// A full sync of a big cluster builds its model in a burst of allocations that die
		// together; collecting less often while it does saves Go time. The encoding of the batch
		// (Apply) runs at the usual setting again: by then the model is built, and a collection
		// during the encoding lets it reuse the model's garbage instead of touching new memory,
		// which is what the sync's peak is made of (10,000 Services: 136 -> 132 MiB, same time).
		// The memory goes back to the OS at the end.
		old := debug.SetGCPercent(400)
		restoreGC = sync.OnceFunc(func() { debug.SetGCPercent(old) })
		defer restoreGC()
	}
	newFams := make(map[cluster.Family]*familyState, len(p.cfg.Families))
	for _, f := range p.cfg.Families {
		var fs *familyState
		if !p.needFull {
			fs = p.fams[f]
		}
		if fs == nil {
			fs = &familyState{
				rs:         &dataplane.Ruleset{Family: f, Table: p.cfg.Table, Services: make(map[cluster.ServiceKey]*dataplane.Part, len(changed)), Shared: map[string]*dataplane.Chain{}},
				elemRefs:   dataplane.NewElementRefs(f, 0),
				sharedRefs: map[string]int{},
				claims:     newClaimTable(),
				refused:    map[cluster.ServiceKey][]dataplane.Refusal{},
				sets:       map[string]*dataplane.Set{},
			}
		}
		tx := &dataplane.Tx{Family: f, Table: p.cfg.Table, Full: p.needFull}
		if p.needFull {
			fs.sharedRefs = map[string]int{}
			fs.rs.Base = BuildBase(p.baseConfig(f))
		}
		ni := p.nodeInfo(f)
		ni.Screen = screen
		ni.shared = map[string]string{}
		ni.names = dataplane.NewNameInterner()
		ni.picks = map[pickKey]string{}
		// Withdraw every claim of the changed Services, then make their new ones. Who holds an
		// entry afterwards depends only on who claims it, never on this order (claims.go); a
		// Service that gains or loses an entry this way is rebuilt too (moved).
		// What each changed Service claims is listed before any claim is withdrawn: withdrawing
		// one Service's claim can hand the entry to another changed Service (remove takes it off
		// that one's lost entries), whose own list would then miss it, so that a Service deleted
		// in the same sync went on holding the entry and no one programmed it.
		moved := map[cluster.ServiceKey]bool{}
		held := make([][]entryKey, len(changed))
		for i, key := range changed {
			if old := fs.rs.Services[key]; old != nil {
				for _, e := range old.Entries {
					held[i] = append(held[i], entryKey{e.NodePort, e.Addr, e.Proto, e.Port})
				}
			}
			for k := range fs.claims.lost[key] {
				held[i] = append(held[i], k)
			}
		}
		for i, key := range changed {
			for _, k := range held[i] {
				if s := fs.claims.remove(k, key); s != nil {
					moved[s.Key] = true
				}
			}
		}
		built := make(map[cluster.ServiceKey]*dataplane.Part, len(changed))
		var claims []entryClaim
		for _, key := range changed {
			svc := st.Services[key]
			if svc == nil {
				continue
			}
			nw := buildService(ni, svc, st.EndpointSlices[key], true)
			built[key] = nw
			claims = claimsOf(claims[:0], svc, nw)
			for _, ec := range claims {
				if s := fs.claims.add(ec.k, ec.c); s != nil {
					moved[s.Key] = true
				}
			}
		}
		opts := dataplane.DiffOptions{Sharable: sharableSets, Refs: fs.elemRefs, SharedRefs: fs.sharedRefs, Sets: fs.sets, AddParts: tx.Full,
			SharedChain: SharedChain, Neighbours: neighbourPickers}
		if tx.Full {
			// Every built part is added, after the base (DiffOptions.AddParts): the list at its
			// final size.
			opts.Parts = 1 + len(built)
			// The count of sharable elements at its final size.
			nShared := 0
			for _, part := range built {
				_, s := part.CountElements(sharableSet)
				nShared += s
			}
			if fs.elemRefs.Len() == 0 {
				fs.elemRefs = dataplane.NewElementRefs(f, nShared)
				opts.Refs = fs.elemRefs
			}
		}
		d := dataplane.NewDiff(tx, opts)
		if p.needFull {
			d.Part(nil, fs.rs.Base)
		}
		todo := changed
		if len(moved) > 0 {
			todo = slices.Clone(changed)
			for k := range moved {
				if _, ok := built[k]; !ok && !slices.Contains(changed, k) {
					todo = append(todo, k)
				}
			}
			sortServiceKeys(todo)
		}
		for _, key := range todo {
			old := fs.rs.Services[key]
			nw, ok := built[key]
			if svc := st.Services[key]; !ok && svc != nil {
				// Unchanged, but it gained or lost an entry to a changed Service.
				nw = buildService(ni, svc, st.EndpointSlices[key], true)
			}
			if len(fs.claims.lost[key]) > 0 {
				nw = nw.Unpacked() // filter reads the slices
			}
			nw = fs.claims.filter(key, nw)
			d.Part(old, nw)
			if nw == nil || (nw.NumElements() == 0 && len(nw.Chains) == 0) {
				delete(fs.rs.Services, key)
			} else {
				fs.rs.Services[key] = nw
			}
			if nw != nil && len(nw.Refused) > 0 {
				fs.refused[key] = nw.Refused
			} else {
				delete(fs.refused, key)
			}
			if !rep.Full {
				// After a full sync the caller reconciles conntrack against the whole state instead
				// (see conntrack.Reconciler): a restart must not cut every UDP flow.
				rep.StaleFlows = append(rep.StaleFlows, staleFlows(old, nw)...)
				rep.StaleFlows = append(rep.StaleFlows, deletedFlows(old, nw)...)
			}
			if nw != nil {
				nw.Pack() // a filtered part (lost entries) was unpacked
			}
		}
		if prev := p.lastFams[f]; rep.Full && prev != nil {
			// The reconciliation after a full sync sees only the Services that exist: the ones
			// that went away since the last sync are found here.
			for key, old := range prev.rs.Services {
				rep.StaleFlows = append(rep.StaleFlows, deletedFlows(old, fs.rs.Services[key])...)
			}
		}
		d.Finish()
		fs.rs.Shared = map[string]*dataplane.Chain{}
		for n := range fs.sharedRefs {
			fs.rs.Shared[n] = SharedChain(n)
		}
		tx.Sets = fs.sets
		if tx.Full && p.reader != nil && !p.adopted {
			if atx, err := p.adopt(fs); err == nil {
				tx = atx
				rep.Adopted = true
			} else {
				p.log.Info("replacing the nftables table instead of adopting it", "family", fmt.Sprintf("IPv%d", f), "reason", err)
			}
		}
		if !tx.Empty() {
			rep.Txs = append(rep.Txs, tx)
		}
		newFams[f] = fs
	}

	rep.Conflicts = conflictReport(newFams)

	restoreGC()
	p.lastFams = newFams
	for _, tx := range rep.Txs {
		if err := p.prog.Apply(tx); err != nil {
			// The in-memory state already moved on; the kernel did not. A full sync rebuilds both.
			p.needFull = true
			p.fams = nil
			p.keepPendingStale(rep.StaleFlows)
			p.log.Error("sync failed; the kernel keeps the previous ruleset, next sync replaces the table",
				"tx", tx.String(), "err", err)
			return rep, fmt.Errorf("programming IPv%d table %s: %w", tx.Family, tx.Table, err)
		}
	}
	p.fams = newFams
	rep.StaleFlows = append(rep.StaleFlows, p.pendingStale...)
	p.pendingStale = nil
	p.nodeAddrs = screen.NodeAddrs
	p.needFull = false
	p.adopted = true
	p.remember(st, changed, rep.Full)
	p.updateHealth(st, changed, rep.Full)
	rep.HealthChecks = p.healthChk
	rep.LocalEndpoints = p.localEps
	if rep.Full {
		// A full sync of a big cluster encodes tens of MiB of netlink messages once; hand that
		// memory back rather than keeping it as the process's high-water mark. Before returning,
		// not in the background: the rules are live already, but a collection and scavenging
		// still running when the next change arrives competed with it for the CPUs (the first
		// endpoint change after a full sync of 10,000 Services used ~40 ms of process CPU
		// instead of ~5-10) and left a heap far above the restored GC goal, so that change
		// also paid for a collection. The full sync's duration includes it.
		debug.FreeOSMemory()
	}
	rep.Duration = time.Since(start)
	p.lastSync = time.Now()
	return rep, nil
}

// SetTableReader makes the first sync adopt the table a previous run left (see adopt.go).
func (p *Proxier) SetTableReader(r TableReader) { p.reader = r }

func (p *Proxier) adopt(fs *familyState) (*dataplane.Tx, error) {
	live, err := p.reader.ReadTable(fs.rs.Family, fs.rs.Table)
	if err != nil {
		return nil, err
	}
	desired := fs.rs.Flatten()
	// Shared pickers that are no longer used still exist in desired (reference count 0) only if
	// referenced; Flatten lists exactly the chains in use.
	return adoptTx(live, desired, fs.sets)
}

// screen returns the address screen of a sync of st: the configured policy and ranges, and the
// addresses of this node and of every Node st knows.
func (p *Proxier) screen(st *cluster.State) *AddressScreen {
	addrs := map[netip.Addr]bool{}
	for _, a := range p.cfg.NodeIPs {
		addrs[a.Unmap()] = true
	}
	for _, a := range p.cfg.NodePortIPs {
		addrs[a.Unmap()] = true
	}
	for _, n := range st.Nodes {
		for _, a := range n.Addresses {
			addrs[a.Unmap()] = true
		}
	}
	return &AddressScreen{Policy: p.cfg.ExternalIPs, ServiceCIDRs: p.svcCIDRs, ClusterCIDRs: p.cfg.ClusterCIDRs, NodeAddrs: addrs}
}

// conflictReport lists, sorted and once each, the entries lost to other Services and the addresses
// refused by the node's policy, over all families.
func conflictReport(fams map[cluster.Family]*familyState) []cluster.Rejection {
	var out []cluster.Rejection
	for _, fs := range fams {
		out = append(out, fs.claims.conflicts()...)
		for key, rs := range fs.refused {
			for _, r := range rs {
				out = append(out, cluster.Rejection{Kind: "Service", Object: key.String(), Reason: r.String(), Addr: r.Addr})
			}
		}
	}
	slices.SortFunc(out, func(a, b cluster.Rejection) int {
		return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Reason, b.Reason))
	})
	return slices.Compact(out)
}

// elementEntry says which entry an element belongs to, for elements keyed by an entry.
func elementEntry(el dataplane.Element) (entryKey, bool) {
	switch el.Set {
	case tablenames.MapServiceIPs, MapNoEndpointServices, tablenames.MapFirewallIPs, MapEndpoints, MapEndpointsCluster:
		return entryKey{addr: el.Addr, proto: el.Proto, port: el.Port}, true
	case MapServiceNodePorts, MapNoEndpointNodePorts, MapNodePortEndpoints, MapNodePortEndpointsCluster:
		return entryKey{nodePort: true, proto: el.Proto, port: el.Port}, true
	}
	return entryKey{}, false
}

// changedServices lists (sorted) the Services whose Service object or slices differ from the last
// successful sync, compared by pointer; all of them on a full sync.
func (p *Proxier) changedServices(st *cluster.State) []cluster.ServiceKey {
	var out []cluster.ServiceKey
	if p.needFull {
		out = make([]cluster.ServiceKey, 0, len(st.Services))
		for k := range st.Services {
			out = append(out, k)
		}
		sortServiceKeys(out)
		return out
	}
	seen := map[cluster.ServiceKey]bool{}
	add := func(k cluster.ServiceKey) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for k, svc := range st.Services {
		if s := p.seen[k]; s.svc != svc || !p.sameSlices(k, s, st.EndpointSlices[k]) {
			add(k)
		}
	}
	for k := range p.seen {
		if st.Services[k] == nil {
			add(k)
		}
	}
	sortServiceKeys(out)
	return out
}

// seenService is what a sync saw of one Service: its object and, when it had exactly one, its
// slice (most Services have one; those with more keep them in Proxier.seenSlices). Two pointers
// instead of a pointer and a slice: the map of every Service is a fifth smaller (10,000 Services:
// 1.1 -> 0.9 MiB).
type seenService struct {
	svc   *cluster.Service
	slice *cluster.EndpointSlice
}

// sameSlices says whether slices are the ones the last sync saw of Service k (s).
func (p *Proxier) sameSlices(k cluster.ServiceKey, s seenService, slices_ []*cluster.EndpointSlice) bool {
	if len(slices_) == 1 {
		return s.slice == slices_[0]
	}
	return s.slice == nil && slices.Equal(p.seenSlices[k], slices_)
}

func (p *Proxier) remember(st *cluster.State, changed []cluster.ServiceKey, full bool) {
	if full || p.seen == nil {
		p.seen = make(map[cluster.ServiceKey]seenService, len(st.Services))
		p.seenSlices = map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	}
	for _, k := range changed {
		v := st.Services[k]
		if v == nil {
			delete(p.seen, k)
			delete(p.seenSlices, k)
			continue
		}
		s := seenService{svc: v}
		if sl := st.EndpointSlices[k]; len(sl) == 1 {
			s.slice = sl[0]
			delete(p.seenSlices, k)
		} else if len(sl) > 1 {
			p.seenSlices[k] = sl
		} else {
			delete(p.seenSlices, k)
		}
		p.seen[k] = s
	}
}

func (p *Proxier) updateHealth(st *cluster.State, changed []cluster.ServiceKey, full bool) {
	if p.healthChk == nil || full {
		p.healthChk = map[cluster.ServiceKey]uint16{}
		p.localEps = map[cluster.ServiceKey]int{}
	}
	for _, k := range changed {
		delete(p.healthChk, k)
		delete(p.localEps, k)
		svc := st.Services[k]
		if svc == nil || !svc.ExternalPolicyLocal || svc.HealthCheckNodePort == 0 {
			continue
		}
		p.healthChk[k] = svc.HealthCheckNodePort
		n := 0
		for _, fs := range p.fams {
			if part := fs.rs.Services[k]; part != nil {
				n = max(n, part.LocalEndpoints)
			}
		}
		p.localEps[k] = n
	}
}

// maxPendingStale bounds the conntrack flows kept across failed syncs (a few per changed Service
// each): syncs that keep failing for long must not grow them without end. Past it the flows are
// dropped, and the reconciliation after the next full sync still repairs what concerns the Services
// that exist.
const maxPendingStale = 1 << 16

// keepPendingStale keeps the flows of a failed sync for the next successful one: the changes that
// made them stale are in the desired state, and the next sync compares with that state, not with
// the kernel's.
func (p *Proxier) keepPendingStale(flows []conntrack.StaleFlow) {
	if n := len(p.pendingStale) + len(flows); n > maxPendingStale {
		p.log.Warn("dropping conntrack cleanup of failed syncs", "flows", n-maxPendingStale)
		flows = flows[:max(0, maxPendingStale-len(p.pendingStale))]
	}
	p.pendingStale = append(p.pendingStale, flows...)
}

// deletedFlows lists the conntrack entries to delete because a Service port is no longer
// programmed, as kube-proxy does since Kubernetes 1.38 (kubernetes#141371): when a Service is deleted
// (or stops being this node's: ExternalName, headless, another proxy's, refused) or loses a port,
// every UDP and SCTP entry to its cluster IPs, external IPs and LoadBalancer IPs on that port. One-way
// datagram senders (statsd, syslog) otherwise keep their entry alive for ever, DNATed to a pod
// address that may belong to another pod by now. staleFlows already removes the entries replied by
// its endpoints; these are the rest: entries to the Service's addresses, whoever answered them (or
// nobody, made before its rules existed).
//
// As in kube-proxy, not the NodePorts: such an entry is found by its destination port alone, any
// address, so deleting "every flow to port N" would cut flows that were never the Service's (to
// another host's port N, through this node); the endpoint-based deletion of staleFlows covers the
// NodePort flows that were DNATed. Nor an address a living Service merely drops from a port it
// keeps (kube-proxy's reconciler does not see those either).
func deletedFlows(old, nw *dataplane.Part) []conntrack.StaleFlow {
	if old == nil {
		return nil
	}
	type protoPort struct {
		proto uint8
		port  uint16
	}
	kept := map[protoPort]bool{}
	if nw != nil {
		for _, e := range nw.Entries {
			if !e.NodePort {
				kept[protoPort{e.Proto, e.Port}] = true
			}
		}
	}
	var out []conntrack.StaleFlow
	for _, e := range old.Entries {
		if e.NodePort || !e.Addr.IsValid() || (e.Proto != dataplane.ProtoUDP && e.Proto != dataplane.ProtoSCTP) || kept[protoPort{e.Proto, e.Port}] {
			continue
		}
		out = append(out, conntrack.StaleFlow{Proto: e.Proto, OrigDst: e.Addr, OrigDstPort: e.Port})
	}
	return out
}

// staleFlows lists the conntrack entries a Service change makes stale. Only UDP and SCTP matter: TCP
// connections to a vanished endpoint fail on their own, datagram "connections" would be kept alive by
// the client forever.
func staleFlows(old, nw *dataplane.Part) []conntrack.StaleFlow {
	var out []conntrack.StaleFlow
	isDgram := func(p uint8) bool { return p == dataplane.ProtoUDP || p == dataplane.ProtoSCTP }
	newB := map[dataplane.Backend]bool{}
	if nw != nil {
		for b := range nw.AllBackends() {
			newB[b] = true
		}
	}
	if old != nil {
		for b := range old.AllBackends() {
			if isDgram(b.Proto) && !newB[b] {
				out = append(out, conntrack.StaleFlow{Proto: b.Proto, ReplySrc: b.Endpoint.Addr(), ReplySrcPort: b.Endpoint.Port()})
			}
		}
	}
	if nw != nil {
		had := map[dataplane.EntryRef]bool{}
		if old != nil {
			for _, e := range old.Entries {
				if e.HasEndpoints {
					e.HasEndpoints = false
					had[e] = true
				}
			}
		}
		for _, e := range nw.Entries {
			if !isDgram(e.Proto) || !e.HasEndpoints {
				continue
			}
			k := e
			k.HasEndpoints = false
			if !had[k] {
				out = append(out, conntrack.StaleFlow{Proto: e.Proto, OrigDst: e.Addr, OrigDstPort: e.Port})
			}
		}
	}
	return out
}

// Flatten returns the current ruleset of family f (nil before the first successful sync).
func (p *Proxier) Flatten(f cluster.Family) *dataplane.Flat {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs := p.fams[f]
	if fs == nil {
		return nil
	}
	return fs.rs.Flatten()
}

// LastSync returns when the last successful sync finished.
func (p *Proxier) LastSync() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastSync
}

// BuildRuleset builds the complete ruleset of one family for st without any kernel (what `vipgate
// render` prints), and what the node would report for st: the entries lost to other Services and
// the addresses its policy refuses (SyncReport.Conflicts). An error says why the ruleset could not be
// built; the ruleset is then nil.
func BuildRuleset(cfg Config, f cluster.Family, st *cluster.State) (*dataplane.Ruleset, []cluster.Rejection, error) {
	p := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
	p.cfg.Families = []cluster.Family{f}
	rep, err := p.Sync(st)
	if err != nil {
		return nil, nil, fmt.Errorf("building the IPv%d ruleset: %w", f, err)
	}
	// The proxier keeps its parts packed (compact.go); the ruleset handed out has them as slices.
	rs := *p.fams[f].rs
	rs.Services = make(map[cluster.ServiceKey]*dataplane.Part, len(rs.Services))
	for k, part := range p.fams[f].rs.Services {
		rs.Services[k] = part.Unpacked()
	}
	return &rs, rep.Conflicts, nil
}

type nopProgrammer struct{}

func (nopProgrammer) Apply(*dataplane.Tx) error { return nil }
