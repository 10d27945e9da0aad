package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/ctsync/relay"
	"github.com/vipgate/vipgate/keyreload"
)

// StartConntrackSync starts what snatAddresses and conntrackSync ask for (docs/gateway.md, "SNAT
// gateways and conntrack sync"): the table that SNATs marked flows to this gateway's SNAT
// address; ARP/NDP answers for its SNAT addresses and for those of peers the membership (peers)
// counts dead, by the announcer newAnnouncer makes (called only with SNAT addresses); and
// conntrackd, which copies every flow's NAT state into the peer's kernel (ConntrackSync then
// returns its supervisor, whose Resynced holds the announcements back). The returned function
// stops conntrackd and the answering (the SNAT table stays, like vipgate's own rules). With
// neither configured it removes a SNAT table a previous run left and does nothing else.
func (r *Runtime) StartConntrackSync(ctx context.Context, peers PeerView, newAnnouncer func(hclog.Logger) (Announcer, error)) (func(), error) {
	cfg := r.cfg
	log := r.log.Named("ctsync")
	own := cfg.SNATAddressesOf(cfg.Name)
	mark := uint32(1) << uint(cluster.DefaultMasqueradeBit)
	var all []netip.Addr
	for _, g := range cfg.SNATAddresses {
		all = append(all, g.Addresses...)
	}
	if err := ctsync.ProgramSNAT(own, all, mark); err != nil {
		return nil, err
	}
	if len(cfg.SNATAddresses) == 0 && !cfg.ConntrackSync.Enabled {
		return func() {}, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	var stops []func()
	stop := func() {
		cancel()
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if cfg.ConntrackSync.Enabled {
		sup, done, err := startConntrackd(ctx, cfg, r.opts, log)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, done)
		r.sup = sup
	}
	if len(cfg.SNATAddresses) > 0 {
		log.Info("SNAT to this gateway's SNAT addresses", "addresses", own)
	}
	done, err := r.startSNATOwners(ctx, log, peers, newAnnouncer)
	if err != nil {
		stop()
		return nil, err
	}
	stops = append(stops, done)
	return stop, nil
}

// ConntrackSync is conntrackd's supervisor once StartConntrackSync started it (nil without
// conntrack sync): its Resynced holds the announcements back, its Status goes on /status.
func (r *Runtime) ConntrackSync() *ctsync.Supervisor { return r.sup }

// startSNATOwners makes the SNAT addresses' announcer and starts watchSNATOwners; the returned
// function waits for it to end (with ctx).
func (r *Runtime) startSNATOwners(ctx context.Context, log hclog.Logger, peers PeerView, newAnnouncer func(hclog.Logger) (Announcer, error)) (func(), error) {
	cfg := r.cfg
	byGw := map[string][]netip.Addr{}
	for _, g := range cfg.SNATAddresses {
		byGw[g.Gateway] = g.Addresses
	}
	w := snatOwnership{log: log, peers: peers, ifaceOf: map[netip.Addr]string{}, sup: r.sup}
	if len(byGw) > 0 {
		ann, err := newAnnouncer(log.Named("l2"))
		if err != nil {
			return nil, fmt.Errorf("SNAT addresses: %w", err)
		}
		w.ann = ann
	}
	for _, addrs := range byGw {
		for _, a := range addrs {
			// The SNAT address is on the LAN of a gateway IP: answered on that IP's interface.
			for _, gip := range cfg.GatewayIPs {
				if gip.Is4() == a.Is4() {
					if ifn, err := r.opts.InterfaceOf(gip); err == nil {
						w.ifaceOf[a] = ifn
					}
				}
			}
		}
	}
	owners := NewSNATOwners(cfg.Name, byGw, r.opts.Resync, time.Now())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchSNATOwners(ctx, owners, w)
	}()
	return func() { <-done }, nil
}

// ErrNoSyncKey is conntrack sync's refusal without a key.
var ErrNoSyncKey = errors.New("conntrackSync: the sync channel needs a key: set conntrackSync.keyFile, or the membership's " +
	"speaker.memberKeyFile (or --member-key-file), whose keys it then derives its own from; " +
	"conntrackd's channel has no authentication, and vipgate runs it only behind its signed relay")

// SyncKeyFile is the key file of the sync relay: conntrackSync.keyFile, else the membership's
// (memberKeyFile: --member-key-file over speaker.memberKeyFile, "" without one).
func SyncKeyFile(cfg *cluster.GatewayConfig, memberKeyFile string) (string, error) {
	if f := cfg.ConntrackSync.KeyFile; f != "" {
		return f, nil
	}
	if memberKeyFile != "" {
		return memberKeyFile, nil
	}
	return "", ErrNoSyncKey
}

// startConntrackd writes conntrackd's config and supervises it until ctx ends, with the relay that
// carries its datagrams to the peer, signed (gateway/ctsync/relay): conntrackd itself listens
// on loopback only.
func startConntrackd(ctx context.Context, cfg *cluster.GatewayConfig, o RuntimeOptions, log hclog.Logger) (*ctsync.Supervisor, func(), error) {
	cs := cfg.ConntrackSync
	// Fail closed: no key, no sync.
	keyFile, err := SyncKeyFile(cfg, o.MemberKeyFile)
	if err != nil {
		return nil, nil, err
	}
	keys, err := o.ReadKeys(keyFile)
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
		if iface, err = o.InterfaceOf(local); err != nil {
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
		cs.Conntrackd, o.Registry)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	port := uint16(cs.Port)
	rl, err := relay.New(log.Named("relay"), relay.Config{
		Local: netip.AddrPortFrom(local, port), Peer: netip.AddrPortFrom(cs.Peer, port),
		Listen: netip.AddrPortFrom(ctsync.RelayAddress, port), Daemon: netip.AddrPortFrom(ctsync.DaemonAddress, port),
		Keys: keys}, o.Registry)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); rl.Run(ctx) }()
	// The key file again every KeyReload (as the membership's): a rotated Secret takes effect
	// without a restart; a broken file keeps the old keys.
	reload := keyreload.Reloader{Path: keyFile, Period: o.KeyReload, Read: o.ReadKeys, Apply: rl.SetKeys, Log: log,
		Failed: "conntrack sync: keeping the previous keys", Reloaded: "conntrack sync: keys reloaded"}
	go func() { defer wg.Done(); reload.Run(ctx, keys) }()
	go func() { defer wg.Done(); sup.Run(ctx) }()
	return sup, func() { wg.Wait(); cleanup() }, nil
}
