package main

import (
	"context"
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/l2"
	"github.com/vipgate/vipgate/speaker"
)

const gatewayHelp = `Usage: vipgate gateway --config FILE (--manifests DIR | --kubeconfig FILE) [flags]

Runs on a host in front of the cluster (not a node): forwards the traffic of every LoadBalancer IP to
the cluster, to the pods themselves (forwarding: direct) or to the nodes' NodePorts (forwarding:
nodePort; for externalTrafficPolicy Local only to nodes whose healthCheckNodePort answers 200). The
backend of a flow is chosen by Maglev consistent hashing of its addresses and ports, so gateways
behind one ECMP router agree. The config is a GatewayConfig (see docs/gateway.md). The host must
forward IP packets (net.ipv4.ip_forward=1, net.ipv6.conf.all.forwarding=1).

Flags:
`

// gatewaySpeaker announces the VIPs a gateway forwards, by ARP/NDP or BGP as the MetalLB
// L2Advertisements and BGPAdvertisements say, with the node's speaker code (speaker.GatewayView turns
// the cluster's State into the gateways' view: the gateways are the nodes).
type gatewaySpeaker struct {
	spk   *l2Speaker
	group speaker.GatewayGroup
	// hold, with conntrack sync, keeps the speaker's views back until the initial resync is over
	// (ctsync.Supervisor.Resynced): the gateway announces no VIP (no BGP route, no L2 vote) before
	// it holds the flows the router would move to it.
	hold *ctsync.Hold[*cluster.State]
}

func startGatewaySpeaker(ctx context.Context, cfg *cluster.GatewayConfig, flags speakerFlags, log hclog.Logger) (*gatewaySpeaker, error) {
	spk, err := newSpeakerWith(ctx, speakerOptions{Name: cfg.Name, IPs: cfg.GatewayIPs, Config: cfg.Speaker, Flags: flags,
		PodNamespace: os.Getenv(podNamespaceEnv)}, log)
	if err != nil {
		return nil, err
	}
	g := speaker.GatewayGroup{Members: map[string][]netip.Addr{}, Labels: cfg.Labels}
	for _, m := range cfg.Speaker.Members {
		g.Members[m.Name] = []netip.Addr{m.Address}
	}
	if _, ok := g.Members[cfg.Name]; !ok {
		g.Members[cfg.Name] = cfg.GatewayIPs
	}
	return &gatewaySpeaker{spk: spk, group: g}, nil
}

// Update hands the speaker the VIPs with at least one backend after a successful sync.
func (g *gatewaySpeaker) Update(st *cluster.State, rep *gateway.SyncReport) {
	forwarding := map[netip.Addr]bool{}
	for _, e := range rep.Entries {
		if len(e.Backends) > 0 {
			forwarding[e.VIP] = true
		}
	}
	view := speaker.GatewayView(st, g.group, forwarding)
	if g.hold != nil {
		g.hold.Put(view)
		return
	}
	g.spk.Update(view, nil)
}

func (g *gatewaySpeaker) Stop() { g.spk.Stop() }

func runGateway(args []string) error {
	nf, err := parseNodeFlags("gateway", gatewayHelp, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := cluster.LoadGatewayConfig(nf.config)
	if err != nil {
		return err
	}
	prog := &dataplane.NetlinkProgrammer{}
	log, done, err := startCommand(nf, &cfg.Logging, cfg.TableName, prog)
	if err != nil || done {
		return err
	}
	gateway.WarnIfNotForwarding(log, cfg.GatewayIPs)
	src, err := newSource(nf, log)
	if err != nil {
		return err
	}
	// The runtime (gateway/runtime.go): the NAT fast path, the sync loop, SNAT addresses and
	// conntrack sync, the gateway's metrics. It gets the flags and the speaker's settings as values.
	memberKeyFile, _ := memberSettings(nf.speaker, cfg.Speaker)
	rt, err := gateway.NewRuntime(gateway.RuntimeOptions{Log: log, Config: cfg, Dataplane: gateway.ConfigFor(cfg),
		Programmer: prog, Registry: nodeRegistry(), MemberKeyFile: memberKeyFile, ReadKeys: readMemberKeys,
		KeyReload: memberKeyReload, Resync: speakerResync, InterfaceOf: l2.DefaultInterface})
	if err != nil {
		return err
	}
	defer rt.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// /metrics and /status as on a node (`vipgate status --address` reads it).
	admin, stopAdmin, err := startAdmin(log, cfg.MetricsBindAddress,
		NodeStatus{Node: cfg.Name, Table: cfg.TableName, Source: src.String(), Version: version})
	if err != nil {
		return err
	}
	defer stopAdmin()

	// The speaker announces the VIPs (ARP/NDP or BGP) once they are forwarded.
	spk, err := startGatewaySpeaker(ctx, cfg, nf.speaker, log)
	if err != nil {
		return err
	}
	defer spk.Stop()
	if ks, ok := src.(kubeSource); ok {
		spk.spk.setEventer(ks.KubeSource)
		admin.addWarnings(ks.Warnings)
	}
	admin.setVIPLister(spk.spk)
	// SNAT addresses and conntrackd: the NAT state outlives a gateway's death. The membership
	// tells which peers are alive; an l2 announcer answers for the SNAT addresses.
	stopCtSync, err := rt.StartConntrackSync(ctx, gatewayPeers{spk.spk}, newSNATAnnouncer)
	if err != nil {
		return err
	}
	defer stopCtSync()
	if sup := rt.ConntrackSync(); sup != nil {
		admin.setVIPLister(ctsyncStatus{vipLister: spk.spk, sup: sup})
		// The VIPs are announced once conntrackd's initial resync is over (bounded: ctsync.ResyncWait).
		spk.hold = ctsync.NewHold(ctx, sup.Resynced(), func(v *cluster.State) { spk.spk.Update(v, nil) })
	}
	admin.addWarnings(rt.Warnings)

	log.Info("vipgate gateway started", "forwarding", cfg.Forwarding, "snat", cfg.SNAT, "table", cfg.TableName,
		"healthCheckInterval", cfg.HealthCheckInterval, "source", src.String(), "version", version)
	return rt.Run(ctx, src.Run, gateway.RunHooks{Attempted: admin.recordSync, Synced: spk.Update})
}

// gatewayPeers is the speaker's membership as the gateway's PeerView (which SNAT addresses this
// gateway answers for): no membership (L2 refused) is no peer.
type gatewayPeers struct{ spk *l2Speaker }

func (p gatewayPeers) View() (total int, alive map[string]bool) {
	if p.spk.mem == nil {
		return 0, nil
	}
	v := p.spk.mem.View()
	return v.Total, v.Candidates
}

// newSNATAnnouncer is the SNAT addresses' own l2 announcer (no metrics: the speaker's l2 metrics
// are registered already).
func newSNATAnnouncer(log hclog.Logger) (gateway.Announcer, error) {
	a, err := l2.New(log, nil, l2.Options{})
	if err != nil {
		return nil, err
	}
	return a, nil
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
