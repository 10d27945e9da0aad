package bgp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/bgp/bfd"
)

// globalASN is the AS number GoBGP's global configuration needs before any peer exists. Every
// neighbor sets its own local AS (PeerConfig.MyASN), so this number never reaches the wire.
const globalASN = 4294967294

// opTimeout bounds a single management call into GoBGP. They are in-memory operations, so this
// only trips if GoBGP's serve loop is stuck.
const opTimeout = 30 * time.Second

// Speaker owns an embedded GoBGP server. Its methods are safe for concurrent use; they are
// serialized, since every call diffs against the state the previous one left.
type Speaker struct {
	log      hclog.Logger
	srv      *server.BgpServer
	routerID netip.Addr

	mu sync.Mutex
	// peers are the peers configured in GoBGP, by name.
	peers map[string]PeerConfig
	// routes are the routes announced (present in GoBGP's RIB), by prefix.
	routes map[netip.Prefix]route
	// filters are the per-peer export filters installed in GoBGP (see filter.go).
	filters map[string]*peerFilter
	// prepends are the AS path prepend policies installed in GoBGP (see prepend.go).
	prepends map[prependKey]map[netip.Prefix]bool
	// draining is set by Shutdown: routes carry GRACEFUL_SHUTDOWN and LOCAL_PREF 0.
	draining bool
	// peersSet is set after the first SetPeers: only peers added by that call can be the
	// sessions of a restart (graceful restart's Restart State).
	peersSet bool
	stopped  bool

	// bfd runs the BFD sessions (bfd.go). bfdNames maps addresses to peer names for the BFD
	// goroutine's logs (it never takes mu); bfdResets resets the BGP sessions whose BFD failed;
	// stopWatch ends the watch of GoBGP's peer states that starts held sessions.
	bfd       *bfd.Server
	bfdNames  atomic.Pointer[map[netip.Addr]string]
	bfdResets *bfdResetter
	stopWatch context.CancelFunc

	// bfdMu guards bfdPeers, the sessions configured in the BFD server by peer address, and
	// bfdHeld, the sessions held until their BGP session is Established, with the timer that
	// starts them anyway. Taken after mu, never before.
	bfdMu    sync.Mutex
	bfdPeers map[netip.Addr]bfd.Config
	bfdHeld  map[netip.Addr]*time.Timer
}

// New starts an embedded GoBGP server with the given router ID (IPv4, as BGP requires) and no
// peers. listenPort is the TCP port accepting connections from routers: 0 means 179, -1 means
// connect out only. Metrics are registered on reg when it is not nil.
func New(logger hclog.Logger, reg prometheus.Registerer, routerID netip.Addr, listenPort int) (*Speaker, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if !routerID.Is4() || routerID.IsUnspecified() {
		return nil, fmt.Errorf("router ID %q: must be a non-zero IPv4 address", routerID)
	}
	if listenPort < -1 || listenPort > 65535 {
		return nil, fmt.Errorf("listen port %d out of range", listenPort)
	}
	srv := server.NewBgpServer(server.LoggerOption(newSlogLogger(logger.Named("gobgp")), nil))
	// Serve runs the loop every management call goes through; without it StartBgp blocks forever.
	go srv.Serve()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:        globalASN,
		RouterId:   routerID.String(),
		ListenPort: int32(listenPort),
	}})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("starting GoBGP (router ID %s, port %d): %w", routerID, listenPort, err)
	}
	s := &Speaker{
		log:      logger,
		srv:      srv,
		routerID: routerID,
		peers:    map[string]PeerConfig{},
		routes:   map[netip.Prefix]route{},
		filters:  map[string]*peerFilter{},
		prepends: map[prependKey]map[netip.Prefix]bool{},
		bfdPeers: map[netip.Addr]bfd.Config{},
		bfdHeld:  map[netip.Addr]*time.Timer{},
	}
	s.bfdNames.Store(&map[netip.Addr]string{})
	s.bfdResets = newBFDResetter(logger.Named("bfd"), srv, s.bfdPeerName)
	// The BFD server opens its sockets with the first session: nothing is bound without BFD peers.
	s.bfd = bfd.New(bfd.Options{Logger: logger.Named("bfd"), OnEvent: s.onBFDEvent})
	if err := s.watchEstablished(); err != nil {
		s.stopBFD()
		srv.Stop()
		return nil, fmt.Errorf("watching GoBGP peer events: %w", err)
	}
	if reg != nil {
		if err := reg.Register(&collector{s: s}); err != nil {
			s.stopBFD()
			srv.Stop()
			return nil, fmt.Errorf("registering BGP metrics: %w", err)
		}
	}
	return s, nil
}

// SetPeers makes GoBGP's peers equal to peers. Unchanged peers keep their sessions; a changed peer
// is removed and added again (its session restarts), unless only its BFDProfile changed: BFD
// sessions are vipgate's own and take new timers without a restart of anything. An invalid peer,
// or one GoBGP refuses, is left out and named in the returned error; the others are configured
// regardless.
//
// Restart: when the first SetPeers of a Speaker finds routes already set (SetAdvertisements was
// called first, as after a vipgate restart), its graceful-restart peers open their sessions as a
// restarting speaker (RFC 4724 Restart State and Forwarding State bits), so routers keep the routes
// they retained until the new session has sent the full table.
func (s *Speaker) SetPeers(peers []PeerConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("speaker is shut down")
	}
	restarting := !s.peersSet && len(s.routes) > 0
	s.peersSet = true
	want, verr := validatePeers(peers, s.routerID)
	errs := []error{verr}

	// Remove first, so that a peer whose address moved to another name can be added below.
	for _, name := range slices.Sorted(maps.Keys(s.peers)) {
		old := s.peers[name]
		if p, ok := want[name]; ok && sameBGPPeer(p, old) {
			s.peers[name] = p // the BFDProfile may differ: syncBFD below applies it
			continue
		}
		if err := s.deletePeer(old); err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", name, err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.peers[name]; ok {
			continue
		}
		if err := s.addPeer(want[name], restarting); err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", name, err))
		}
	}
	errs = append(errs, s.syncBFD())
	return errors.Join(errs...)
}

// sameBGPPeer reports whether two configs make the same GoBGP neighbor (they may differ in BFD).
func sameBGPPeer(a, b PeerConfig) bool {
	a.BFD, b.BFD = nil, nil
	return reflect.DeepEqual(a, b)
}

func (s *Speaker) addPeer(p PeerConfig, restarting bool) error {
	if p.BFD != nil && p.BFD.EchoMode {
		s.log.Warn("BFD echo mode is not supported; using asynchronous mode", "peer", p.Name)
	}
	// The export filter must exist before the session can come up, or the first table dump
	// would leak routes meant for other peers.
	if _, err := s.syncFilter(p, s.deniedFor(p, s.routes)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(p, restarting && p.GracefulRestart)}); err != nil {
		// Leave no filter behind for a peer that does not exist.
		if _, ferr := s.syncFilter(p, nil); ferr != nil {
			s.log.Warn("removing export filter of a peer GoBGP refused", "peer", p.Name, "err", ferr)
		}
		return fmt.Errorf("adding to GoBGP: %w", err)
	}
	s.peers[p.Name] = p
	s.log.Info("peer added", "peer", p.Name, "address", p.PeerAddress, "my_asn", p.MyASN, "local_asn", p.localASN(), "peer_asn", p.PeerASN)
	return nil
}

func (s *Speaker) deletePeer(p PeerConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// DeletePeer sends a Cease NOTIFICATION, so the router drops our routes at once.
	if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.PeerAddress.String()}); err != nil {
		return fmt.Errorf("removing from GoBGP: %w", err)
	}
	delete(s.peers, p.Name)
	if _, err := s.syncFilter(p, nil); err != nil {
		s.log.Warn("removing export filter of a removed peer", "peer", p.Name, "err", err)
	}
	s.log.Info("peer removed", "peer", p.Name, "address", p.PeerAddress)
	return nil
}

// SetAdvertisements makes the announced routes equal to ads. Only new, changed and removed routes
// cause UPDATEs. An invalid advertisement is left out and named in the returned error.
func (s *Speaker) SetAdvertisements(ads []Advertisement) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("speaker is shut down")
	}
	want, nerr := normalizeAds(ads)
	errs := []error{nerr}

	// Export filters first: a new route restricted to some peers must be filtered before it
	// enters the RIB. Peers whose filter changed for a route that stays announced get a soft
	// reset below (see filter.go).
	var resetPeers []PeerConfig
	for _, name := range slices.Sorted(maps.Keys(s.peers)) {
		p := s.peers[name]
		changed, err := s.syncFilter(p, s.deniedFor(p, want))
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: export filter: %w", name, err))
		}
		if slices.ContainsFunc(changed, func(pfx netip.Prefix) bool {
			_, was := s.routes[pfx]
			_, stays := want[pfx]
			return was && stays
		}) {
			resetPeers = append(resetPeers, p)
		}
	}

	// AS path prepend policies, also before the routes enter the RIB; a route that stays announced
	// with another prepend is sent again by a soft reset out of every peer (prepend.go).
	prepChanged, err := s.syncPrepends(want)
	if err != nil {
		errs = append(errs, fmt.Errorf("AS path prepend: %w", err))
	}
	if slices.ContainsFunc(prepChanged, func(pfx netip.Prefix) bool {
		_, was := s.routes[pfx]
		_, stays := want[pfx]
		return was && stays
	}) {
		resetPeers = nil
		for _, name := range slices.Sorted(maps.Keys(s.peers)) {
			resetPeers = append(resetPeers, s.peers[name])
		}
	}

	var add []route
	for _, pfx := range sortedPrefixes(want) {
		if old, ok := s.routes[pfx]; ok && old.equal(want[pfx]) {
			continue
		}
		add = append(add, want[pfx])
	}
	var del []route
	for _, pfx := range sortedPrefixes(s.routes) {
		if _, ok := want[pfx]; !ok {
			del = append(del, s.routes[pfx])
		}
	}
	errs = append(errs, s.addPaths(add), s.deletePaths(del))
	for _, p := range resetPeers {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{
			Address: p.PeerAddress.String(), Soft: true, Direction: api.ResetPeerRequest_DIRECTION_OUT})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: re-evaluating routes after a filter change: %w", p.Name, err))
		}
	}
	if len(add)+len(del) > 0 {
		s.log.Debug("advertisements updated", "added_or_changed", len(add), "withdrawn", len(del), "total", len(s.routes))
	}
	return errors.Join(errs...)
}

// addPaths announces (or re-announces) routes and records them in s.routes.
func (s *Speaker) addPaths(routes []route) error {
	if len(routes) == 0 {
		return nil
	}
	paths := make([]*apiutil.Path, 0, len(routes))
	ok := make([]route, 0, len(routes))
	var errs []error
	for _, r := range routes {
		p, err := apiPath(r, s.draining)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		paths = append(paths, p)
		ok = append(ok, r)
	}
	if len(paths) == 0 {
		return errors.Join(errs...)
	}
	// One request for all paths: GoBGP handles it in one pass of its serve loop.
	if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		// The batch error hides which path failed; paths are validated, so this is unexpected.
		// Retry one by one to learn which routes are really in the RIB.
		s.log.Warn("adding paths as a batch failed, retrying one by one", "count", len(paths), "err", err)
		for i, p := range paths {
			if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
				errs = append(errs, fmt.Errorf("announcing %s: %w", ok[i].prefix, err))
				continue
			}
			s.routes[ok[i].prefix] = ok[i]
		}
		return errors.Join(errs...)
	}
	for _, r := range ok {
		s.routes[r.prefix] = r
	}
	return errors.Join(errs...)
}

// deletePaths withdraws routes and forgets them.
func (s *Speaker) deletePaths(routes []route) error {
	// Never call DeletePath with an empty list: GoBGP reads that as "delete every local path".
	if len(routes) == 0 {
		return nil
	}
	paths := make([]*apiutil.Path, 0, len(routes))
	for _, r := range routes {
		p, err := apiPath(r, false)
		if err != nil {
			return err
		}
		paths = append(paths, p)
	}
	if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: paths}); err != nil {
		return fmt.Errorf("withdrawing %d routes: %w", len(paths), err)
	}
	for _, r := range routes {
		delete(s.routes, r.prefix)
	}
	return nil
}

// Status reports every configured peer, sorted by name.
func (s *Speaker) Status() []PeerStatus {
	s.mu.Lock()
	names := make(map[netip.Addr]string, len(s.peers))
	withBFD := map[netip.Addr]bool{}
	for _, p := range s.peers {
		names[p.PeerAddress] = p.Name
		withBFD[p.PeerAddress] = p.BFD != nil
	}
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var out []PeerStatus
	err := s.srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		st := peerStatus(p, names)
		if withBFD[st.Address] {
			st.BFD = BFDDown
			if b, ok := s.bfd.Session(st.Address); ok {
				st.BFD = bfdStateOf(b.State)
			}
		}
		out = append(out, st)
	})
	if err != nil {
		s.log.Warn("listing GoBGP peers", "err", err)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int {
		if a.Name != b.Name {
			if a.Name < b.Name {
				return -1
			}
			return 1
		}
		return a.Address.Compare(b.Address)
	})
	return out
}

func peerStatus(p *api.Peer, names map[netip.Addr]string) PeerStatus {
	st := PeerStatus{State: StateUnknown}
	if c := p.GetConf(); c != nil {
		st.Address, _ = netip.ParseAddr(c.GetNeighborAddress())
		st.Name = c.GetDescription()
	}
	if n, ok := names[st.Address]; ok {
		st.Name = n
	}
	if ps := p.GetState(); ps != nil {
		st.State = sessionState(ps.GetSessionState())
		st.UpdatesSent = ps.GetMessages().GetSent().GetUpdate()
	}
	if st.State == StateEstablished {
		if up := p.GetTimers().GetState().GetUptime(); up != nil && up.GetSeconds() > 0 {
			st.Uptime = time.Since(up.AsTime()).Truncate(time.Second)
		}
	}
	for _, af := range p.GetAfiSafis() {
		st.Advertised += int(af.GetState().GetAdvertised())
	}
	return st
}

// Shutdown stops the speaker for good (node drain, uninstall). With drain > 0 it first re-announces
// every route with the GRACEFUL_SHUTDOWN community and LOCAL_PREF 0 (RFC 8326) and waits drain (or
// until ctx is done) so routers move traffic to other nodes while this one still forwards. Then it
// withdraws everything and closes every session with a Cease NOTIFICATION.
func (s *Speaker) Shutdown(ctx context.Context, drain time.Duration) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	var errs []error
	if drain > 0 && len(s.routes) > 0 {
		s.draining = true
		errs = append(errs, s.addPaths(slices.Collect(maps.Values(s.routes))))
		s.log.Info("graceful shutdown: routes re-announced with GRACEFUL_SHUTDOWN", "routes", len(s.routes), "drain", drain)
		// Do not hold the lock while waiting: Status and metrics stay live during the drain.
		s.mu.Unlock()
		t := time.NewTimer(drain)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return errors.Join(errs...)
		}
	}
	errs = append(errs, s.deletePaths(slices.Collect(maps.Values(s.routes))))
	s.stopped = true
	s.mu.Unlock()
	s.stopBFDClient()
	// Stop deletes every neighbor with a Cease NOTIFICATION; BFD goes after (closeBFD).
	s.srv.Stop()
	s.closeBFD()
	s.log.Info("BGP speaker shut down")
	return errors.Join(errs...)
}

// Stop closes every session without withdrawing routes and without a NOTIFICATION where graceful
// restart was negotiated, so routers keep forwarding to this node for the restart time (120s) while
// vipgate restarts. Call it only when the process is about to exit.
// After a restart, call SetAdvertisements before SetPeers so the first UPDATEs carry every route.
func (s *Speaker) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	s.stopBFDClient()
	err := s.srv.StopBgp(ctx, &api.StopBgpRequest{AllowGracefulRestart: true})
	// The BGP sessions first, BFD after them (see closeBFD): a router must see the session close
	// (and keep our routes, as a graceful restart helper) before it sees BFD go down.
	s.closeBFD()
	if err != nil {
		return fmt.Errorf("stopping GoBGP: %w", err)
	}
	s.log.Info("BGP speaker stopped for restart")
	return nil
}

func sortedPrefixes(m map[netip.Prefix]route) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// stopBFD stops everything BFD: stopBFDClient, then closeBFD.
func (s *Speaker) stopBFD() {
	s.stopBFDClient()
	s.closeBFD()
}

// stopBFDClient stops what ties BFD to GoBGP: the resetter (no BGP reset during a stop), the watch
// of session states and the timers that start held sessions. Call it before stopping GoBGP.
func (s *Speaker) stopBFDClient() {
	if s.stopWatch != nil {
		s.stopWatch()
	}
	s.bfdMu.Lock()
	for addr, t := range s.bfdHeld {
		t.Stop()
		delete(s.bfdHeld, addr)
	}
	s.bfdMu.Unlock()
	s.bfdResets.stop()
}

// bfdAfterBGP is how long Stop and Shutdown wait between closing the BGP sessions and closing BFD.
// FRR 8.4 takes a BFD AdminDown for a failure (bfdd reports it to bgpd as Down, which resets the
// session with a Cease and flushes our routes) unless bgpd has already seen the session close:
// then, as a graceful restart helper, it keeps them. BFD's way (bfdd, zebra, bgpd) is slower
// than TCP's, and this makes the order certain on a LAN.
const bfdAfterBGP = 100 * time.Millisecond

// closeBFD sends AdminDown on every BFD session (bfdAfterBGP after the BGP sessions closed) and
// closes the BFD server. RFC 5882 3.2: a router then turns BFD off for the session rather than
// declaring a failure.
func (s *Speaker) closeBFD() {
	if len(s.bfd.Status()) > 0 {
		time.Sleep(bfdAfterBGP)
	}
	s.bfd.Close()
}
