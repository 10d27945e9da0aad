// Package conntrack cleans stale UDP and SCTP conntrack entries, as kube-proxy's pkg/proxy/conntrack.
//
// UDP and SCTP have no connection teardown the kernel can see, so a conntrack entry that DNATs a
// Service address to an endpoint outlives the endpoint: the client keeps sending to the same 5-tuple
// (DNS resolvers and many UDP clients reuse their source port), every packet refreshes the entry, and
// the traffic is blackholed to a pod that no longer exists until the client changes its source port.
// New nftables rules do not help, because NAT rules only see a flow's first packet. So after each sync
// that removed endpoints we delete the entries that still point at them.
//
// The decision (which flows are stale) is pure: StaleFlows compares two views (dataplane.ConntrackView
// builds one from a cluster.State). The effector (Cleaner) only dumps the table once, matches in Go
// and deletes. Its Reconcile method is kube-proxy's newer approach: keep only entries whose reply
// source is a current endpoint, which needs no previous view and so also covers a restart.
//
// It is a leaf of the dataplane: it imports cluster (for ServiceKey) and nothing else of vipgate, and
// StaleFlow is the one type the dataplane's sync reports use for the entries to delete (see
// dataplane/imports_test.go).
package conntrack

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	ctnetlink "github.com/ti-mo/conntrack"

	"github.com/vipgate/vipgate/cluster"
)

// IP protocol numbers of the protocols whose conntrack entries are cleaned. TCP is left alone: a TCP
// client sees a reset or a timeout and reconnects with a new source port.
const (
	protoUDP  uint8 = 17
	protoSCTP uint8 = 132
)

// StaleFlow is a filter for conntrack entries to delete. An entry matches when every set field
// matches: Proto always, an invalid address or a zero port matches anything. OrigDst and OrigDstPort
// are the original direction's destination (the Service address the client sent to), ReplySrc and
// ReplySrcPort the reply direction's source (the endpoint the entry was DNATed to).
type StaleFlow struct {
	Proto        uint8
	OrigDst      netip.Addr
	OrigDstPort  uint16
	ReplySrc     netip.Addr
	ReplySrcPort uint16
}

// String formats the filter for logs, in conntrack(8)'s option names.
func (f StaleFlow) String() string {
	s := fmt.Sprintf("proto=%d", f.Proto)
	if f.OrigDst.IsValid() {
		s += " orig-dst=" + f.OrigDst.String()
	}
	if f.OrigDstPort != 0 {
		s += fmt.Sprintf(" orig-port-dst=%d", f.OrigDstPort)
	}
	if f.ReplySrc.IsValid() {
		s += " reply-src=" + f.ReplySrc.String()
	}
	if f.ReplySrcPort != 0 {
		s += fmt.Sprintf(" reply-port-src=%d", f.ReplySrcPort)
	}
	return s
}

// validate refuses filters that would match far more than a Service's traffic.
func (f StaleFlow) validate() error {
	if f.Proto == 0 {
		return fmt.Errorf("stale flow filter %s: protocol is required", f)
	}
	if !f.OrigDst.IsValid() && f.OrigDstPort == 0 && !f.ReplySrc.IsValid() {
		return fmt.Errorf("stale flow filter %s: needs an original destination address or port or a reply source address", f)
	}
	return nil
}

// matches reports whether the entry with the given original and reply tuples matches f.
func (f StaleFlow) matches(orig, reply ctnetlink.Tuple) bool {
	return orig.Proto.Protocol == f.Proto &&
		(!f.OrigDst.IsValid() || ctSameAddr(orig.IP.DestinationAddress, f.OrigDst)) &&
		(f.OrigDstPort == 0 || orig.Proto.DestinationPort == f.OrigDstPort) &&
		(!f.ReplySrc.IsValid() || ctSameAddr(reply.IP.SourceAddress, f.ReplySrc)) &&
		(f.ReplySrcPort == 0 || reply.Proto.SourcePort == f.ReplySrcPort)
}

// ctSameAddr compares addresses ignoring IPv4-in-IPv6 mapping and zones, which the kernel does not
// report the way the model spells them.
func ctSameAddr(a, b netip.Addr) bool { return a.Unmap().WithZone("") == b.Unmap().WithZone("") }

// Cleaner deletes conntrack entries. The sync loop holds one and calls Delete after the new
// ruleset is in the kernel (deleting earlier would let the old rules recreate the stale entries).
type Cleaner interface {
	// Delete removes every entry matching any of filters and returns how many it removed. Entries
	// that vanish on their own meanwhile are not errors.
	Delete(filters []StaleFlow) (deleted int, err error)
}

// netlinkCleaner is the Cleaner over ctnetlink.
type netlinkCleaner struct {
	logger hclog.Logger
	// mu serializes Delete calls on the netlink socket: a dump and the deletes that follow it must
	// not interleave with another caller's messages.
	mu   sync.Mutex
	conn *ctnetlink.Conn
}

// NewCleaner opens a ctnetlink socket in the network namespace of the calling thread; the
// socket stays in that namespace whichever thread uses it later. The cleaner also implements
// Reconciler, and io.Closer to release the socket.
func NewCleaner(logger hclog.Logger) (Cleaner, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	conn, err := ctnetlink.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("opening conntrack netlink socket: %w", err)
	}
	return &netlinkCleaner{logger: logger.Named("conntrack"), conn: conn}, nil
}

// Close releases the netlink socket.
func (c *netlinkCleaner) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("closing conntrack netlink socket: %w", err)
	}
	return nil
}

// ctMaxErrors caps how many individual delete errors a Delete call reports; the count of the rest is
// summarized.
const ctMaxErrors = 5

// Delete dumps the conntrack table once (both families), matches every entry against filters in Go
// and deletes the matches one netlink request each: ti-mo/conntrack has no batch delete, and a
// kernel-side filtered flush (CTA_FILTER) only matches on mark in this library.
func (c *netlinkCleaner) Delete(filters []StaleFlow) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	for _, f := range filters {
		if err := f.validate(); err != nil {
			return 0, fmt.Errorf("deleting conntrack entries: %w", err)
		}
	}
	return c.deleteMatching(newCtFilterIndex(filters).matches, "filters", len(filters))
}

// Reconcile deletes, in one dump, every UDP and SCTP entry addressed to a Service port of view (one of
// its VIPs and its port, or its NodePort on any address) whose reply source is not one of that port's
// endpoints, as kube-proxy (1.31 and later) does after every sync. Unlike StaleFlows it needs
// no previous view, so it also repairs what happened while vipgate was not running: call it after the
// first sync. The view must describe the rules already in the kernel.
func (c *netlinkCleaner) Reconcile(view map[PortKey]ServicePort) (int, error) {
	if len(view) == 0 {
		return 0, nil
	}
	return c.deleteMatching(newCtServingIndex(view).stale, "servicePorts", len(view))
}

// deleteMatching dumps the table and deletes the entries for which match is true. what and n describe
// the request for the log line.
func (c *netlinkCleaner) deleteMatching(match func(orig, reply ctnetlink.Tuple) bool, what string, n int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	flows, err := c.conn.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("dumping conntrack table: %w", err)
	}

	deleted, failed := 0, 0
	var errs []error
	for _, fl := range flows {
		if !match(fl.TupleOrig, fl.TupleReply) {
			continue
		}
		// The tuples and zone identify the entry; sending the dumped status, timeout or counters
		// back is not needed. The reply tuple is not needed by the kernel either, but the library
		// picks the netlink family (IPv6 only when both tuples are IPv6) from it.
		del := ctnetlink.Flow{TupleOrig: fl.TupleOrig, TupleReply: fl.TupleReply, Zone: fl.Zone}
		switch err := c.conn.Delete(del); {
		case err == nil:
			deleted++
		case errors.Is(err, syscall.ENOENT):
			// Expired or deleted by someone else since the dump: the goal is reached.
		default:
			failed++
			if len(errs) < ctMaxErrors {
				errs = append(errs, fmt.Errorf("deleting conntrack entry %s: %w", fl.TupleOrig, err))
			}
		}
	}
	if failed > len(errs) {
		errs = append(errs, fmt.Errorf("and %d more conntrack delete errors", failed-len(errs)))
	}
	c.logger.Debug("deleted stale conntrack entries", what, n, "entries", len(flows),
		"deleted", deleted, "failed", failed, "took", time.Since(start))
	return deleted, errors.Join(errs...)
}

// Reconciler is the optional second method of the cleaner NewCleaner returns
// (assert it from the Cleaner), for consumers that want kube-proxy's reconciling cleanup.
type Reconciler interface {
	Reconcile(view map[PortKey]ServicePort) (deleted int, err error)
}

// ctServingKey is a protocol, address and port; the address is invalid for a NodePort.
type ctServingKey struct {
	proto uint8
	addr  netip.Addr
	port  uint16
}

// ctServingIndex maps every Service address:port and NodePort of a view to its endpoints.
type ctServingIndex map[ctServingKey]map[netip.AddrPort]bool

func newCtServingIndex(view map[PortKey]ServicePort) ctServingIndex {
	ix := ctServingIndex{}
	add := func(k ctServingKey, eps []netip.AddrPort) {
		set := ix[k]
		if set == nil {
			set = map[netip.AddrPort]bool{}
			ix[k] = set
		}
		for _, ep := range eps {
			set[netip.AddrPortFrom(ep.Addr().Unmap().WithZone(""), ep.Port())] = true
		}
	}
	for key, p := range view {
		for _, vip := range p.VIPs {
			add(ctServingKey{key.Proto, vip.Unmap().WithZone(""), p.Port}, p.Endpoints)
		}
		if p.NodePort != 0 {
			add(ctServingKey{key.Proto, netip.Addr{}, p.NodePort}, p.Endpoints)
		}
	}
	return ix
}

// stale reports whether an entry goes to a Service port of the index but not to one of its endpoints.
func (ix ctServingIndex) stale(orig, reply ctnetlink.Tuple) bool {
	proto := orig.Proto.Protocol
	if proto != protoUDP && proto != protoSCTP {
		return false
	}
	from := netip.AddrPortFrom(reply.IP.SourceAddress.Unmap().WithZone(""), reply.Proto.SourcePort)
	if eps, ok := ix[ctServingKey{proto, orig.IP.DestinationAddress.Unmap().WithZone(""), orig.Proto.DestinationPort}]; ok {
		// A VIP decides alone: its port may equal another Service's NodePort number.
		return !eps[from]
	}
	if eps, ok := ix[ctServingKey{proto, netip.Addr{}, orig.Proto.DestinationPort}]; ok {
		return !eps[from]
	}
	return false
}

// ctFilterIndex finds the filters an entry may match without trying all of them: filters are bucketed
// by reply source address, else by original destination address, else by original destination port,
// so a table of N entries and F filters costs about N map lookups instead of N×F comparisons.
type ctFilterIndex struct {
	byReplySrc map[netip.Addr][]StaleFlow
	byOrigDst  map[netip.Addr][]StaleFlow
	byOrigPort map[uint16][]StaleFlow
}

func newCtFilterIndex(filters []StaleFlow) ctFilterIndex {
	ix := ctFilterIndex{
		byReplySrc: map[netip.Addr][]StaleFlow{},
		byOrigDst:  map[netip.Addr][]StaleFlow{},
		byOrigPort: map[uint16][]StaleFlow{},
	}
	for _, f := range filters {
		switch {
		case f.ReplySrc.IsValid():
			k := f.ReplySrc.Unmap().WithZone("")
			ix.byReplySrc[k] = append(ix.byReplySrc[k], f)
		case f.OrigDst.IsValid():
			k := f.OrigDst.Unmap().WithZone("")
			ix.byOrigDst[k] = append(ix.byOrigDst[k], f)
		default: // validate guarantees a port here
			ix.byOrigPort[f.OrigDstPort] = append(ix.byOrigPort[f.OrigDstPort], f)
		}
	}
	return ix
}

func (ix ctFilterIndex) matches(orig, reply ctnetlink.Tuple) bool {
	for _, f := range ix.byReplySrc[reply.IP.SourceAddress.Unmap().WithZone("")] {
		if f.matches(orig, reply) {
			return true
		}
	}
	for _, f := range ix.byOrigDst[orig.IP.DestinationAddress.Unmap().WithZone("")] {
		if f.matches(orig, reply) {
			return true
		}
	}
	for _, f := range ix.byOrigPort[orig.Proto.DestinationPort] {
		if f.matches(orig, reply) {
			return true
		}
	}
	return false
}

// PortKey names one port of a Service for conntrack cleanup.
type PortKey struct {
	Service cluster.ServiceKey
	// Port is the ServicePort's name ("" for a single unnamed port).
	Port  string
	Proto uint8
}

// ServicePort is one UDP or SCTP Service port as conntrack cleanup sees it: where clients send
// to, and which endpoints their traffic may be DNATed to.
type ServicePort struct {
	// VIPs are the addresses that take Port: ClusterIPs, external IPs and LoadBalancer IPs.
	VIPs []netip.Addr
	Port uint16
	// NodePort is taken on any node address (0: none).
	NodePort uint16
	// Endpoints are the endpoints' addresses and target ports (sorted).
	Endpoints []netip.AddrPort
}

// StaleFlows decides which conntrack entries to delete after the dataplane moved from prev to
// cur, as kube-proxy does:
//
//   - an endpoint that went away: entries from any of the port's VIPs and from its NodePort whose reply
//     source is that endpoint;
//   - a port that went from zero endpoints to some (or appeared with some): every entry to its VIPs and
//     NodePort, because entries created while there was nowhere to go (or before the rules existed)
//     are not DNATed and would keep the traffic from reaching the new endpoints;
//   - a port that dropped to zero endpoints: likewise every entry to its VIPs and NodePort;
//   - a VIP or NodePort the port no longer has: every entry to it, so traffic to a withdrawn address
//     is not forwarded by an old entry.
//
// prev is nil on the first sync after start: nothing is known to have changed, so nothing is returned;
// use the cleaner's Reconcile then. The filters are deduplicated and sorted. Apply them after the new
// rules are in the kernel.
func StaleFlows(prev, cur map[PortKey]ServicePort) []StaleFlow {
	set := map[StaleFlow]struct{}{}
	add := func(f StaleFlow) { set[f] = struct{}{} }
	allTo := func(proto uint8, p ServicePort) {
		for _, vip := range p.VIPs {
			add(StaleFlow{Proto: proto, OrigDst: vip, OrigDstPort: p.Port})
		}
		if p.NodePort != 0 {
			add(StaleFlow{Proto: proto, OrigDstPort: p.NodePort})
		}
	}

	for key, p := range prev {
		c, exists := cur[key]
		current := make(map[netip.AddrPort]bool, len(c.Endpoints))
		for _, ep := range c.Endpoints {
			current[ep] = true
		}
		for _, ep := range p.Endpoints {
			if current[ep] {
				continue
			}
			for _, vip := range p.VIPs {
				if vip.Unmap().Is4() != ep.Addr().Unmap().Is4() {
					continue // an entry never changes family through DNAT
				}
				add(StaleFlow{Proto: key.Proto, OrigDst: vip, OrigDstPort: p.Port, ReplySrc: ep.Addr(), ReplySrcPort: ep.Port()})
			}
			if p.NodePort != 0 {
				add(StaleFlow{Proto: key.Proto, OrigDstPort: p.NodePort, ReplySrc: ep.Addr(), ReplySrcPort: ep.Port()})
			}
		}
		for _, vip := range p.VIPs {
			if !exists || c.Port != p.Port || !slices.Contains(c.VIPs, vip) {
				add(StaleFlow{Proto: key.Proto, OrigDst: vip, OrigDstPort: p.Port})
			}
		}
		if p.NodePort != 0 && (!exists || c.NodePort != p.NodePort) {
			add(StaleFlow{Proto: key.Proto, OrigDstPort: p.NodePort})
		}
		if exists && len(p.Endpoints) > 0 && len(c.Endpoints) == 0 {
			allTo(key.Proto, c)
		}
	}
	// Without a previous view (the first sync after start) there is no telling which ports just became
	// active, and flushing every Service's entries would re-balance every UDP flow on each restart.
	for key, c := range cur {
		if prev == nil {
			break
		}
		if p, existed := prev[key]; len(c.Endpoints) > 0 && (!existed || len(p.Endpoints) == 0) {
			allTo(key.Proto, c)
		}
	}

	if len(set) == 0 {
		return nil
	}
	out := make([]StaleFlow, 0, len(set))
	for f := range set {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b StaleFlow) int {
		return cmp.Or(
			cmp.Compare(a.Proto, b.Proto),
			a.OrigDst.Compare(b.OrigDst),
			cmp.Compare(a.OrigDstPort, b.OrigDstPort),
			a.ReplySrc.Compare(b.ReplySrc),
			cmp.Compare(a.ReplySrcPort, b.ReplySrcPort),
		)
	})
	return out
}
