package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/ctsync/relay"
	"github.com/vipgate/vipgate/l2"
)

// snatOwnerPoll is how often the SNAT addresses' owners are re-decided from the membership's view
// (its own detection takes deadAfter, 400 ms by default; this adds at most one poll).
const snatOwnerPoll = 50 * time.Millisecond

// snatSettle is how long a gateway whose membership never became ready waits before it takes over
// the SNAT addresses of peers it does not hear.
const snatSettle = 5 * time.Second

// startGatewayConntrackSync starts what snatAddresses and conntrackSync ask for (docs/gateway.md,
// "SNAT gateways and conntrack sync"): the table that SNATs marked flows to this gateway's SNAT
// address; ARP/NDP answers for its SNAT addresses and for those of peers the membership counts dead;
// and conntrackd, which copies every flow's NAT state into the peer's kernel. It also adds a
// conntrackd line to /status. The returned function stops conntrackd and the answering (the SNAT
// table stays, like vipgate's own rules) and the conntrackd supervisor (nil without conntrack
// sync), whose Resynced holds the announcements back. With neither configured it removes a SNAT
// table a previous run left and does nothing else.
func startGatewayConntrackSync(ctx context.Context, cfg *cluster.GatewayConfig, flags speakerFlags, log hclog.Logger, spk *gatewaySpeaker, admin *adminServer) (func(), *ctsync.Supervisor, error) {
	log = log.Named("ctsync")
	own := cfg.SNATAddressesOf(cfg.Name)
	mark := uint32(1) << uint(cluster.DefaultMasqueradeBit)
	var all []netip.Addr
	for _, g := range cfg.SNATAddresses {
		all = append(all, g.Addresses...)
	}
	if err := ctsync.ProgramSNAT(own, all, mark); err != nil {
		return nil, nil, err
	}
	if len(cfg.SNATAddresses) == 0 && !cfg.ConntrackSync.Enabled {
		return func() {}, nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	var stops []func()
	stop := func() {
		cancel()
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	var sup *ctsync.Supervisor
	if cfg.ConntrackSync.Enabled {
		var done func()
		var err error
		if sup, done, err = startConntrackd(ctx, cfg, flags, log); err != nil {
			stop()
			return nil, nil, err
		}
		stops = append(stops, done)
		admin.setVIPLister(ctsyncStatus{vipLister: spk.spk, sup: sup})
	}
	if len(cfg.SNATAddresses) > 0 {
		log.Info("SNAT to this gateway's SNAT addresses", "addresses", own)
	}
	done, err := watchGatewayPeers(ctx, cfg, log, spk, sup)
	if err != nil {
		stop()
		return nil, nil, err
	}
	stops = append(stops, done)
	return stop, sup, nil
}

// ctsyncStatus adds conntrackd's status line to the speaker's /status warnings.
type ctsyncStatus struct {
	vipLister
	sup *ctsync.Supervisor
}

// Warnings are the speaker's, then conntrackd's status.
func (c ctsyncStatus) Warnings() []string {
	var out []string
	if w, ok := c.vipLister.(interface{ Warnings() []string }); ok {
		out = w.Warnings()
	}
	return append(out, "conntrack sync: "+c.sup.Status().String())
}

// errNoSyncKey is startConntrackd's refusal without a key.
var errNoSyncKey = errors.New("conntrackSync: the sync channel needs a key: set conntrackSync.keyFile, or the membership's " +
	"speaker.memberKeyFile (or --member-key-file), whose keys it then derives its own from; " +
	"conntrackd's channel has no authentication, and vipgate runs it only behind its signed relay")

// ctsyncKeyFile is the key file of the sync relay: conntrackSync.keyFile, else the membership's.
func ctsyncKeyFile(cfg *cluster.GatewayConfig, flags speakerFlags) (string, error) {
	if f := cfg.ConntrackSync.KeyFile; f != "" {
		return f, nil
	}
	if f, _ := memberSettings(flags, cfg.Speaker); f != "" {
		return f, nil
	}
	return "", errNoSyncKey
}

// startConntrackd writes conntrackd's config and supervises it until ctx ends, with the relay that
// carries its datagrams to the peer, signed (gateway/ctsync/relay): conntrackd itself listens
// on loopback only.
func startConntrackd(ctx context.Context, cfg *cluster.GatewayConfig, flags speakerFlags, log hclog.Logger) (*ctsync.Supervisor, func(), error) {
	cs := cfg.ConntrackSync
	// Fail closed: no key, no sync.
	keyFile, err := ctsyncKeyFile(cfg, flags)
	if err != nil {
		return nil, nil, err
	}
	keys, err := readMemberKeys(keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("conntrackSync: %w", err)
	}
	local := cs.LocalAddress
	if !local.IsValid() {
		for _, a := range cfg.GatewayIPs {
			if a.Is4() == cs.Peer.Is4() {
				local = a
				break
			}
		}
	}
	iface := cs.Interface
	if iface == "" {
		var err error
		if iface, err = l2.DefaultInterface(local); err != nil {
			return nil, nil, fmt.Errorf("conntrackSync.interface: not set and no interface holds %s: %w", local, err)
		}
	}
	dir, cleanup := cs.StateDir, func() {}
	if dir == "" {
		d, err := os.MkdirTemp("", "vipgate-ctsync-")
		if err != nil {
			return nil, nil, fmt.Errorf("conntrack sync: %w", err)
		}
		dir, cleanup = d, func() { _ = os.RemoveAll(d) }
	}
	// The gateway's own addresses: flows to and from them are its own (BGP, heartbeats, health
	// probes), not forwarded ones.
	ignore := slices.Clone(cfg.GatewayIPs)
	for _, m := range cfg.Speaker.Members {
		ignore = append(ignore, m.Address)
	}
	sup, err := ctsync.NewSupervisor(log, ctsync.Config{Interface: iface, LocalAddress: local, Peer: cs.Peer, Port: cs.Port, Dir: dir, Ignore: ignore},
		cs.Conntrackd, nodeRegistry())
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	port := uint16(cs.Port)
	rl, err := relay.New(log.Named("relay"), relay.Config{
		Local: netip.AddrPortFrom(local, port), Peer: netip.AddrPortFrom(cs.Peer, port),
		Listen: netip.AddrPortFrom(ctsync.RelayAddress, port), Daemon: netip.AddrPortFrom(ctsync.DaemonAddress, port),
		Keys: keys}, nodeRegistry())
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); rl.Run(ctx) }()
	go func() { defer wg.Done(); reloadSyncKeys(ctx, log, keyFile, keys, rl) }()
	go func() { defer wg.Done(); sup.Run(ctx) }()
	return sup, func() { wg.Wait(); cleanup() }, nil
}

// reloadSyncKeys reads the key file again every memberKeyReload (as the membership does) and hands
// changed keys to the relay: a rotated Secret takes effect without a restart. A broken file keeps
// the old keys.
func reloadSyncKeys(ctx context.Context, log hclog.Logger, path string, keys [][]byte, rl *relay.Relay) {
	t := time.NewTicker(memberKeyReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next, err := readMemberKeys(path)
		if err == nil && slices.EqualFunc(keys, next, bytes.Equal) {
			continue
		}
		if err == nil {
			err = rl.SetKeys(next)
		}
		if err != nil {
			log.Error("conntrack sync: keeping the previous keys", "err", err)
			continue
		}
		keys = next
		log.Info("conntrack sync: keys reloaded", "keys", len(keys))
	}
}

// watchGatewayPeers follows the membership's view of the gateways every snatOwnerPoll until ctx
// ends. It answers ARP/NDP for the SNAT addresses this gateway owns (ctsync.OwnedSNAT), and when a
// peer joins or comes back it sends the peer the whole conntrack table (sup.SendTable, at once and
// again 2 s later, when the peer's conntrackd surely listens): a gateway that restarted with an
// empty table gets back the flows it NATed before, which this one carried meanwhile.
func watchGatewayPeers(ctx context.Context, cfg *cluster.GatewayConfig, log hclog.Logger, spk *gatewaySpeaker, sup *ctsync.Supervisor) (func(), error) {
	byGw := map[string][]netip.Addr{}
	for _, g := range cfg.SNATAddresses {
		byGw[g.Gateway] = g.Addresses
	}
	var ann *l2.Announcer
	if len(byGw) > 0 {
		// Its own announcer (no metrics: the speaker's l2 metrics are registered already).
		var err error
		if ann, err = l2.New(log.Named("l2"), nil, l2.Options{}); err != nil {
			return nil, fmt.Errorf("SNAT addresses: %w", err)
		}
	}
	ifaceOf := map[netip.Addr]string{}
	for _, addrs := range byGw {
		for _, a := range addrs {
			// The SNAT address is on the LAN of a gateway IP: answered on that IP's interface.
			for _, gip := range cfg.GatewayIPs {
				if gip.Is4() == a.Is4() {
					if ifn, err := l2.DefaultInterface(gip); err == nil {
						ifaceOf[a] = ifn
					}
				}
			}
		}
	}
	sendTable := func(peer string) {
		for _, wait := range []time.Duration{0, 2 * time.Second} {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if !sup.Status().Up {
				return
			}
			if err := sup.SendTable(ctx); err != nil && ctx.Err() == nil {
				log.Warn("sending the conntrack table to a returning peer", "peer", peer, "err", err)
				return
			}
		}
		log.Info("sent the conntrack table to the peer", "peer", peer)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if ann != nil {
			defer ann.Close()
		}
		t := time.NewTicker(snatOwnerPoll)
		defer t.Stop()
		var last []netip.Addr
		lastSet, started, seen := time.Time{}, time.Now(), map[string]bool{}
		prevAlive := map[string]bool{}
		for {
			// Take a peer's address over only once the membership has heard it (or snatSettle
			// passed): never on no evidence at start.
			alive, takeover := map[string]bool{cfg.Name: true}, false
			if spk.spk.mem != nil {
				v := spk.spk.mem.View()
				if v.Total > 1 {
					alive, takeover = maps.Clone(v.Candidates), true
					// A peer is taken over only once it was seen alive, or after snatSettle: at
					// start the view fills in member by member.
					settled := time.Since(started) > snatSettle
					for name, ok := range v.Candidates {
						seen[name] = seen[name] || ok
					}
					for name := range byGw {
						if !seen[name] && !settled {
							alive[name] = true
						}
					}
				}
			}
			returned := false
			for name := range alive {
				if alive[name] && !prevAlive[name] && name != cfg.Name && seen[name] {
					returned = true
					if sup != nil {
						go sendTable(name)
					}
				}
			}
			// A peer heard again after a silence: if we were the one cut off, it answered for our
			// own addresses meanwhile and the LAN's caches point at it. Announce them again.
			reannounce := returned && len(prevAlive) > 0
			prevAlive = alive
			owned := ctsync.OwnedSNAT(cfg.Name, byGw, alive, takeover)
			// SetOwned again now and then: a failed interface is retried (l2's contract).
			if ann != nil && (!slices.Equal(owned, last) || time.Since(lastSet) > speakerResync) {
				m := map[netip.Addr][]string{}
				for _, a := range owned {
					if ifn := ifaceOf[a]; ifn != "" {
						m[a] = []string{ifn}
					}
				}
				if err := ann.SetOwned(m); err != nil {
					log.Warn("answering for SNAT addresses", "err", err)
				}
				if !slices.Equal(owned, last) {
					log.Info("SNAT addresses answered here", "addresses", owned, "alive", alive, "takeover", takeover)
				}
				last, lastSet = owned, time.Now()
			}
			if ann != nil && reannounce {
				if n := ann.Reannounce(); n > 0 {
					log.Info("SNAT addresses announced again: a peer is back", "pairs", n)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { <-done }, nil
}
