package l2

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultRepeats are the delays after a takeover at which the gratuitous
// announcement is repeated. The first copy goes out at once; the repeats
// cover switches that drop a frame while they relearn the MAC on a new port
// and routers that rate-limit ARP cache updates.
var DefaultRepeats = []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// ErrInvalidVIP is wrapped in the IPError of a VIP that cannot be announced
// at all: invalid, unspecified, loopback, multicast, link-local or zoned.
var ErrInvalidVIP = errors.New("not an announceable unicast address")

// Options configure an Announcer.
type Options struct {
	// Repeats are the delays, counted from the takeover, at which the
	// gratuitous ARP / unsolicited NA is sent again after the immediate
	// one. nil means DefaultRepeats; an empty non-nil slice disables
	// repeats.
	Repeats []time.Duration
	// Periodic, when positive, announces every owned VIP again at this
	// interval for as long as it is owned (gratuitous ARP, unsolicited NA),
	// on the interfaces its takeover is announced on (Where.Announce). It
	// is MetalLB v0.16.2's --gratuitous-arp-interval (metallb#2910): a
	// switch whose FDB entry for the owner's MAC ages out before the
	// router's ARP entry for the VIP floods or drops the VIP's traffic
	// until something the owner sends refreshes it. 0 (the default, as in
	// MetalLB) sends nothing periodically.
	Periodic time.Duration
}

// IPError says that a VIP cannot be answered for on an interface.
// SetOwned returns one per failed (VIP, interface) pair, joined with
// errors.Join; every other pair keeps working.
type IPError struct {
	IP        netip.Addr
	Interface string // empty when the VIP itself is invalid
	Err       error
}

// Error implements error.
func (e *IPError) Error() string {
	if e.Interface == "" {
		return fmt.Sprintf("VIP %s: %v", e.IP, e.Err)
	}
	return fmt.Sprintf("VIP %s on %s: %v", e.IP, e.Interface, e.Err)
}

// Unwrap returns the cause.
func (e *IPError) Unwrap() error { return e.Err }

// Announcer answers ARP and NDP for the VIPs this host owns, on the
// interfaces it was told to use, and announces VIPs it takes over. It is
// what speaker/ drives. Safe for concurrent use.
//
// Sockets are opened lazily by SetOwned, one per (interface, family) in
// use, in the network namespace of the thread that calls SetOwned; they are
// closed when no owned VIP needs them any more.
type Announcer struct {
	log     hclog.Logger
	m       *metrics
	repeats []time.Duration
	seams   seams

	// owned is the snapshot the responders consult for every packet:
	// replaced whole by SetOwned, never mutated, so the packet path takes
	// no lock.
	owned atomic.Pointer[ownership]

	// mu serialises SetOwned and Close; it guards the fields below.
	mu         sync.Mutex
	closed     bool
	responders map[respKey]responder
	announcing map[pairKey]context.CancelFunc
	failures   map[string]bool  // failures already logged, so each is logged once
	quiet      map[pairKey]bool // owned pairs answered but never announced (Where.Announce)

	// sendMu orders repeated announcements against SetOwned: a repeat
	// sends under the read lock after checking its context, SetOwned
	// cancels under the write lock. Once SetOwned returns, no announcement
	// for a removed VIP can still be on its way.
	sendMu sync.RWMutex
	wg     sync.WaitGroup // repeat goroutines

	// The periodic announcements (Options.Periodic): stopped by Close
	// before it takes mu, since a round holds mu.
	periodicStop chan struct{}
	periodicDone sync.WaitGroup
	stopOnce     sync.Once
}

// seams are the kernel boundaries, replaced by fakes in unit tests.
type seams struct {
	lookup  func(name string) (*net.Interface, error)
	openARP func(ifi *net.Interface) (net.PacketConn, error)
	openNDP func(ifi *net.Interface) (ndpSockets, error)
}

var kernelSeams = seams{lookup: net.InterfaceByName, openARP: listenARP, openNDP: listenNDP}

// ownership maps each owned VIP to the interfaces it is answered on.
type ownership map[netip.Addr]map[string]struct{}

// respKey names one responder.
type respKey struct {
	iface  string
	family string
}

// pairKey is one VIP on one interface.
type pairKey struct {
	ip    netip.Addr
	iface string
}

func (p pairKey) responder() respKey { return respKey{iface: p.iface, family: familyOf(p.ip)} }

func familyOf(ip netip.Addr) string {
	if ip.Is4() {
		return familyIPv4
	}
	return familyIPv6
}

// New returns an Announcer that owns nothing yet. Its metrics are
// registered on reg; a nil reg leaves them unregistered. A nil logger
// discards logs.
func New(logger hclog.Logger, reg prometheus.Registerer, opts Options) (*Announcer, error) {
	return newAnnouncer(logger, reg, opts, kernelSeams)
}

func newAnnouncer(logger hclog.Logger, reg prometheus.Registerer, opts Options, s seams) (*Announcer, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	repeats := opts.Repeats
	if repeats == nil {
		repeats = DefaultRepeats
	}
	a := &Announcer{
		log:        logger,
		m:          m,
		repeats:    slices.Clone(repeats),
		seams:      s,
		responders: map[respKey]responder{},
		announcing: map[pairKey]context.CancelFunc{},
		failures:   map[string]bool{},
		quiet:      map[pairKey]bool{},
	}
	a.owned.Store(&ownership{})
	if opts.Periodic > 0 {
		a.periodicStop = make(chan struct{})
		a.periodicDone.Add(1)
		go a.periodicLoop(opts.Periodic)
	}
	return a, nil
}

// periodicLoop announces the owned VIPs every interval until Close.
func (a *Announcer) periodicLoop(interval time.Duration) {
	defer a.periodicDone.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-a.periodicStop:
			return
		case <-t.C:
			a.announcePeriodic()
		}
	}
}

// announcePeriodic sends one round of the periodic announcements: every owned (VIP, interface)
// pair whose takeover is announced, once. It holds mu, so the set cannot change under it.
func (a *Announcer) announcePeriodic() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0
	}
	var pairs []pairKey
	for ip, ifaces := range *a.owned.Load() {
		for iface := range ifaces {
			if p := (pairKey{ip: ip, iface: iface}); !a.quiet[p] {
				pairs = append(pairs, p)
			}
		}
	}
	slices.SortFunc(pairs, func(x, y pairKey) int { return cmp.Or(x.ip.Compare(y.ip), strings.Compare(x.iface, y.iface)) })
	n := 0
	for _, p := range pairs {
		r, ok := a.responders[p.responder()]
		if !ok {
			continue
		}
		if err := r.gratuitous(p.ip); err != nil {
			a.log.Warn("periodic VIP announcement", "ip", p.ip, "interface", p.iface, "err", err)
			continue
		}
		n++
	}
	a.m.periodic.Add(float64(n))
	return n
}

// owns is the ownerFunc of every responder.
func (a *Announcer) owns(ip netip.Addr, iface string) DropReason {
	ifaces, ok := (*a.owned.Load())[ip.Unmap()]
	if !ok {
		return DropNotOurs
	}
	if _, ok := ifaces[iface]; !ok {
		return DropWrongInterface
	}
	return DropNone
}

// Owned returns the VIPs currently answered for on at least one interface,
// sorted. A VIP whose every interface failed is not listed.
func (a *Announcer) Owned() []netip.Addr {
	snap := *a.owned.Load()
	ips := make([]netip.Addr, 0, len(snap))
	for ip := range snap {
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// SetOwned replaces the set of VIPs this host answers for, each with the
// names of the interfaces to answer on. VIPs that were not owned before (or
// whose interface was recreated) are announced at once and again after each
// of Options.Repeats; VIPs no longer in owned stop being answered and
// announced before SetOwned returns.
//
// A VIP that cannot be served on an interface (missing interface, socket
// error) yields an *IPError in the returned error; the other VIPs are
// served regardless, and the failed pair is retried on the next call, so
// callers should call SetOwned again from time to time (a resync) rather
// than only on change. Each distinct failure is logged once.
func (a *Announcer) SetOwned(owned map[netip.Addr][]string) error {
	where := make(map[netip.Addr]Where, len(owned))
	for ip, ifaces := range owned {
		where[ip] = Where{Answer: ifaces}
	}
	return a.SetOwnedWhere(where)
}

// Where are the interfaces of one owned VIP: Answer lists where requests for it are answered,
// Announce those of them where a takeover is announced (gratuitous ARP, unsolicited NA). A nil
// Announce means every interface of Answer; names in Announce that are not in Answer are ignored.
type Where struct {
	Answer   []string
	Announce []string
}

// SetOwnedWhere is SetOwned with the takeover announcements limited to Where.Announce: an
// L2Advertisement without interfaces answers on every eligible interface but announces on the
// preferred ones only (speaker.VIPDecision.Announce).
func (a *Announcer) SetOwnedWhere(owned map[netip.Addr]Where) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errors.New("announcer is closed")
	}

	var errs []error
	fail := func(ip netip.Addr, iface string, err error) {
		errs = append(errs, &IPError{IP: ip, Interface: iface, Err: err})
	}

	want := map[pairKey]struct{}{}
	quiet := map[pairKey]bool{} // answered, never announced
	for ip, w := range owned {
		if !announceable(ip) {
			fail(ip, "", ErrInvalidVIP)
			continue
		}
		for _, name := range w.Answer {
			p := pairKey{ip: ip.Unmap(), iface: name}
			want[p] = struct{}{}
			if w.Announce != nil && !slices.Contains(w.Announce, name) {
				quiet[p] = true
			}
		}
	}

	// Open (or reopen) the responders the wanted pairs need.
	failed := map[respKey]error{}
	fresh := map[respKey]bool{} // opened by this call: announce all its VIPs
	checked := map[respKey]bool{}
	for p := range want {
		k := p.responder()
		if checked[k] {
			continue
		}
		checked[k] = true
		reopened, err := a.ensureResponder(k)
		if err != nil {
			failed[k] = err
		}
		fresh[k] = reopened
	}

	prev := *a.owned.Load()
	next := ownership{}
	var added []pairKey
	for p := range want {
		k := p.responder()
		if err := failed[k]; err != nil {
			fail(p.ip, p.iface, err)
			continue
		}
		if n, ok := a.responders[k].(*ndpResponder); ok {
			if err := n.join(p.ip); err != nil {
				fail(p.ip, p.iface, err)
				continue
			}
		}
		if next[p.ip] == nil {
			next[p.ip] = map[string]struct{}{}
		}
		next[p.ip][p.iface] = struct{}{}
		if _, was := prev[p.ip][p.iface]; (!was || fresh[k]) && !quiet[p] {
			added = append(added, p)
		}
	}

	// Publish: from here on removed pairs are not answered, and their
	// pending repeats are cancelled.
	a.sendMu.Lock()
	a.owned.Store(&next)
	a.quiet = quiet
	a.stopAnnouncing(func(p pairKey) bool {
		_, keep := next[p.ip][p.iface]
		return !keep || quiet[p]
	})
	a.sendMu.Unlock()

	// Leave the solicited-node groups of removed IPv6 VIPs, and close the
	// responders nothing needs any more.
	for k, r := range a.responders {
		n, isNDP := r.(*ndpResponder)
		if isNDP {
			for ip := range n.targets {
				if _, keep := next[ip][k.iface]; !keep {
					if err := n.leave(ip); err != nil {
						a.log.Warn("leaving solicited-node group", "ip", ip, "interface", k.iface, "err", err)
					}
				}
			}
		}
		if !referenced(next, k) {
			a.closeResponder(k)
		}
	}

	// Announce takeovers: once now, then on schedule in the background.
	slices.SortFunc(added, func(x, y pairKey) int { return x.ip.Compare(y.ip) })
	for _, p := range added {
		r := a.responders[p.responder()]
		if err := r.gratuitous(p.ip); err != nil {
			// Answering still works; the repeats may get through.
			a.log.Warn("announcing VIP", "ip", p.ip, "interface", p.iface, "err", err)
		}
		a.log.Info("took over VIP", "ip", p.ip, "interface", p.iface)
		a.startRepeats(p, r)
	}
	for ip, ifaces := range next {
		for iface := range ifaces {
			p := pairKey{ip: ip, iface: iface}
			if _, was := prev[ip][iface]; !was && quiet[p] {
				a.log.Debug("answering for VIP without announcing it", "ip", ip, "interface", iface)
			}
		}
	}
	for ip, ifaces := range prev {
		for iface := range ifaces {
			if _, keep := next[ip][iface]; !keep {
				a.log.Info("gave up VIP", "ip", ip, "interface", iface)
			}
		}
	}

	a.updateOwnedGauge(next)
	a.logFailuresOnce(errs)
	return errors.Join(errs...)
}

// Reannounce announces every owned VIP again (gratuitous ARP, unsolicited NA, then the repeats) on
// every interface it is answered on, as at a takeover, and returns how many pairs it announced. For
// an owner that never gave its VIPs up while another host answered for them too (it was cut off:
// its peer took them over, the LAN's caches point there): when it hears its peer again, the
// caches must come back. Pairs answered without announcing (SetOwnedWhere) are announced too.
func (a *Announcer) Reannounce() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0
	}
	var pairs []pairKey
	for ip, ifaces := range *a.owned.Load() {
		for iface := range ifaces {
			pairs = append(pairs, pairKey{ip: ip, iface: iface})
		}
	}
	slices.SortFunc(pairs, func(x, y pairKey) int { return cmp.Or(x.ip.Compare(y.ip), strings.Compare(x.iface, y.iface)) })
	n := 0
	for _, p := range pairs {
		r, ok := a.responders[p.responder()]
		if !ok {
			continue
		}
		if err := r.gratuitous(p.ip); err != nil {
			a.log.Warn("announcing VIP again", "ip", p.ip, "interface", p.iface, "err", err)
		}
		a.log.Info("announced VIP again", "ip", p.ip, "interface", p.iface)
		a.startRepeats(p, r)
		n++
	}
	return n
}

// announceable reports whether ip can be a VIP answered by ARP/NDP.
func announceable(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsValid() && ip.Zone() == "" && !ip.IsUnspecified() && !ip.IsLoopback() &&
		!ip.IsMulticast() && !ip.IsLinkLocalUnicast() && ip != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// referenced reports whether any owned VIP needs responder k.
func referenced(o ownership, k respKey) bool {
	for ip, ifaces := range o {
		if _, ok := ifaces[k.iface]; ok && familyOf(ip) == k.family {
			return true
		}
	}
	return false
}

// ensureResponder makes sure responder k is open on the interface that
// now has its name. It reports whether it opened a new socket, so that
// the VIPs on it are announced again: a recreated interface (a new
// ifindex or MAC) means the network has to learn about us again.
func (a *Announcer) ensureResponder(k respKey) (bool, error) {
	ifi, err := a.seams.lookup(k.iface)
	if err != nil {
		// The interface is gone: a socket bound to its old index
		// would never see a packet again.
		a.closeResponder(k)
		return false, fmt.Errorf("looking up interface: %w", err)
	}
	if r, ok := a.responders[k]; ok {
		old := r.iface()
		if old.Index == ifi.Index && bytes.Equal(old.HardwareAddr, ifi.HardwareAddr) {
			return false, nil
		}
		a.closeResponder(k)
	}
	if len(ifi.HardwareAddr) != 6 {
		return false, fmt.Errorf("interface %s has no Ethernet address", ifi.Name)
	}
	switch k.family {
	case familyIPv4:
		conn, err := a.seams.openARP(ifi)
		if err != nil {
			return false, err
		}
		a.responders[k] = newARPResponder(a.log, ifi, conn, a.owns, a.m)
	default:
		conn, err := a.seams.openNDP(ifi)
		if err != nil {
			return false, err
		}
		a.responders[k] = newNDPResponder(a.log, ifi, conn, a.owns, a.m)
	}
	a.log.Debug("opened responder", "interface", k.iface, "family", k.family, "ifindex", ifi.Index, "mac", ifi.HardwareAddr.String())
	return true, nil
}

// closeResponder stops the announcements through responder k and closes it.
func (a *Announcer) closeResponder(k respKey) {
	r, ok := a.responders[k]
	if !ok {
		return
	}
	a.sendMu.Lock()
	a.stopAnnouncing(func(p pairKey) bool { return p.responder() == k })
	a.sendMu.Unlock()
	delete(a.responders, k)
	if err := r.close(); err != nil {
		a.log.Warn("closing responder", "interface", k.iface, "family", k.family, "err", err)
	}
}

// stopAnnouncing cancels the repeats of the pairs matching stop. The
// caller holds mu and sendMu.
func (a *Announcer) stopAnnouncing(stop func(pairKey) bool) {
	for p, cancel := range a.announcing {
		if stop(p) {
			cancel()
			delete(a.announcing, p)
		}
	}
}

// startRepeats schedules the repeated announcements of p through r. The
// caller holds mu.
func (a *Announcer) startRepeats(p pairKey, r responder) {
	if cancel, ok := a.announcing[p]; ok {
		cancel()
	}
	if len(a.repeats) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.announcing[p] = cancel
	start := time.Now()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for _, d := range a.repeats {
			t := time.NewTimer(time.Until(start.Add(d)))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			a.sendMu.RLock()
			var err error
			if ctx.Err() == nil {
				err = r.gratuitous(p.ip)
			}
			a.sendMu.RUnlock()
			if err != nil {
				a.log.Warn("repeating VIP announcement", "ip", p.ip, "interface", p.iface, "err", err)
			}
		}
	}()
}

func (a *Announcer) updateOwnedGauge(o ownership) {
	a.m.owned.Reset()
	for ip, ifaces := range o {
		for iface := range ifaces {
			a.m.owned.WithLabelValues(iface, familyOf(ip)).Inc()
		}
	}
}

// logFailuresOnce logs each failure that was not already failing at the
// previous SetOwned: a resync loop calling SetOwned every few seconds must
// not repeat the same line forever.
func (a *Announcer) logFailuresOnce(errs []error) {
	now := make(map[string]bool, len(errs))
	for _, err := range errs {
		key := err.Error()
		now[key] = true
		if a.failures[key] {
			continue
		}
		var ipErr *IPError
		if errors.As(err, &ipErr) {
			a.log.Error("cannot answer for VIP", "ip", ipErr.IP, "interface", ipErr.Interface, "err", ipErr.Err)
		}
	}
	a.failures = now
}

// Close stops answering for every VIP, cancels pending announcements and
// closes all sockets. The Announcer cannot be used afterwards.
func (a *Announcer) Close() error {
	a.stopOnce.Do(func() {
		if a.periodicStop != nil {
			close(a.periodicStop)
			a.periodicDone.Wait()
		}
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	a.sendMu.Lock()
	a.owned.Store(&ownership{})
	a.stopAnnouncing(func(pairKey) bool { return true })
	a.sendMu.Unlock()
	a.wg.Wait()
	var errs []error
	for k, r := range a.responders {
		delete(a.responders, k)
		if err := r.close(); err != nil {
			errs = append(errs, err)
		}
	}
	a.m.owned.Reset()
	return errors.Join(errs...)
}
