package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/healthprobe"
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

// gatewayDataplaneConfig is the dataplane's view of a GatewayConfig.
func gatewayDataplaneConfig(cfg *cluster.GatewayConfig) gateway.Config {
	return gateway.Config{
		Table:        cfg.TableName,
		Forwarding:   cfg.Forwarding,
		SNAT:         cfg.SNAT,
		Nodes:        cfg.Nodes,
		MaglevSize:   cfg.MaglevTableSize,
		DrainTimeout: cfg.DrainTimeout, // 0: the dataplane's default (5m)
		FlowTimeout:  cfg.FlowTimeout,  // 0: the dataplane's default (1h)
		FastPath:     gatewayFastPath(cfg),
		Limits:       cfg.ServiceLimits,
	}
}

// gatewayFastPath is the route forwarding fast path of cfg (nil: off). The nodes' device and, without
// configured devices, the ingress interfaces are looked up at each sync (netlink route get, the up
// interfaces), so a node that moves or an interface that comes up later is seen.
func gatewayFastPath(cfg *cluster.GatewayConfig) *gateway.FastPath {
	if !cfg.RouteFastPath || cfg.Forwarding != cluster.ForwardRoute {
		return nil
	}
	return &gateway.FastPath{Devices: cfg.RouteFastPathDevices}
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

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
	warnIfNotForwarding(log, cfg)
	src, err := newSource(nf, log)
	if err != nil {
		return err
	}
	dpCfg := gatewayDataplaneConfig(cfg)
	if dpCfg.FastPath != nil {
		// This machine's devices: a listed one that does not exist gets no chain (render, which
		// may plan for another machine, keeps them).
		dpCfg.FastPath.OmitMissing = true
	}
	var natStatus *natPathStatus
	dpCfg.NATPath, natStatus, err = startNATPath(cfg, nf.speaker, log)
	if err != nil {
		return err
	}
	defer natStatus.close()
	gw := gateway.NewProxier(log.Named("dataplane"), dpCfg, prog)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// /metrics and /status as on a node (`vipgate status --address` reads it).
	admin, stopAdmin, err := startAdmin(log, cfg.MetricsBindAddress,
		NodeStatus{Node: cfg.Name, Table: cfg.TableName, Source: src.String(), Version: version})
	if err != nil {
		return err
	}
	defer stopAdmin()

	ct, err := conntrack.NewCleaner(log.Named("conntrack"))
	if err != nil {
		log.Warn("conntrack cleanup disabled", "err", err)
	}
	ctClean := dataplane.ConntrackCleanup{Cleaner: ct, Log: log}
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
	// SNAT addresses and conntrackd (gateway_ctsync.go): the NAT state outlives a gateway's death.
	stopCtSync, ctSup, err := startGatewayConntrackSync(ctx, cfg, nf.speaker, log, spk, admin)
	if err != nil {
		return err
	}
	defer stopCtSync()
	// The VIPs are announced once conntrackd's initial resync is over (bounded: ctsync.ResyncWait).
	if ctSup != nil {
		spk.hold = ctsync.NewHold(ctx, ctSup.Resynced(), func(v *cluster.State) { spk.spk.Update(v, nil) })
	}

	// The sync loop (dataplane.SyncRunner) owns the dataplane: new snapshots, health changes and
	// drain deadlines all wake it. Its Sync runs only once Run is called, below, so it may use the
	// prober made after it.
	var prober *healthprobe.Prober[gateway.HealthTarget]
	var targetsOf *cluster.State // the snapshot the prober's targets come from
	first := true
	var runner *dataplane.SyncRunner[*gateway.SyncReport]
	// /status warns while a family has no route forwarding fast path (routeFastPath on): its
	// packets take the slower dup path, e.g. because the kernel refused the netdev table. It also
	// warns about a fast path that is on without some of its devices (a misspelt
	// routeFastPath.devices entry gets no chain) or with ingress MTUs the nodes' link cannot carry.
	var noFastPath fastPathStatus
	// The connection table copies of the fast path's transitions (the dataplane logs each one):
	// entries copied, and copies by result, for an alert on those that did not end ("truncated":
	// the sync's budget or the cap of refused transactions; "full": the destination map is full).
	flowCopies := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipgate", Name: "gateway_flow_copies_total",
		Help: "Copies of a route forwarding connection table (gateway-flows) into the other table when the fast path goes off or comes on, by result (done, truncated, full, failed).",
	}, []string{"result"})
	flowsCopied := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "vipgate", Name: "gateway_flows_copied_total",
		Help: "Connection table entries copied between the fast path's netdev table and the family's table.",
	})
	if dpCfg.FastPath != nil {
		admin.addWarnings(noFastPath.warnings)
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			if err := nodeRegistry().Register(noFastPath.gauge(f)); err != nil {
				log.Warn("fast path metric not registered", "err", err)
			}
		}
	}
	// The seed warning concerns every mode (the jhash rules use it too); the rest is the NAT path's.
	admin.addWarnings(natStatus.warnings)
	if cfg.Forwarding != cluster.ForwardRoute {
		for _, c := range natStatus.collectors() {
			if err := nodeRegistry().Register(c); err != nil {
				log.Warn("NAT fast path metric not registered", "err", err)
			}
		}
	}
	if dpCfg.Forwarding == cluster.ForwardRoute {
		// Also without the fast path: the first sync copies a netdev table an earlier run left.
		for _, c := range []prometheus.Collector{flowCopies, flowsCopied} {
			if err := nodeRegistry().Register(c); err != nil {
				log.Warn("flow copy metric not registered", "err", err)
			}
		}
	}
	runner = dataplane.NewSyncRunner(log, dataplane.SyncRunnerOptions[*gateway.SyncReport]{
		Name: "gateway sync",
		Sync: func(ctx context.Context, st *cluster.State) (*gateway.SyncReport, error) {
			if st != targetsOf {
				prober.SetTargets(gateway.HealthTargets(dpCfg, st))
				targetsOf = st
			}
			if first {
				// The table a previous run left keeps forwarding meanwhile.
				prober.WaitProbed(ctx, prober.Timeout()+100*time.Millisecond)
				first = false
			}
			return gw.Sync(st, prober.Snapshot())
		},
		Attempted: func(st *cluster.State, rep *gateway.SyncReport, err error) {
			admin.recordSync(st, gatewayReport(rep), err)
		},
		AfterSync: []func(*cluster.State, *gateway.SyncReport){
			func(st *cluster.State, rep *gateway.SyncReport) {
				// The next drain deadline or end of a daisy chaining window (route forwarding),
				// whichever comes first: that sync takes the node or the previous table's slots out
				// (and deletes its flows' conntrack entries, nodePort forwarding).
				// Or the retry of a fast path whose netdev transaction failed: the sync reports no
				// error for it (the family's table forwards), so the runner would not retry it.
				if wake := earliest(earliest(rep.NextDrainDeadline, rep.NextDaisyEnd), rep.RetryAt); !wake.IsZero() {
					runner.ResyncAt(wake.Add(10 * time.Millisecond))
				}
				if len(rep.Draining) > 0 {
					log.Info("nodes draining: no new flows, established ones keep them until the deadline", "nodes", strings.Join(rep.Draining, ","), "until", rep.NextDrainDeadline.Format(time.RFC3339))
				}
				for _, c := range rep.Conflicts {
					log.Warn("rejected", "object", c.Object, "reason", c.Reason)
				}
				for _, r := range st.Rejected {
					log.Debug("rejected", "object", r.Object, "reason", r.Reason)
				}
				noFastPath.set(rep.NoFastPath, rep.FastPathWarnings)
				natStatus.set(rep)
				for _, c := range rep.FlowCopies {
					flowsCopied.Add(float64(c.Copied))
					flowCopies.WithLabelValues(c.Result()).Inc()
				}
				spk.Update(st, rep)
				ctClean.Delete(rep.StaleFlows)
				log.Info("synced", "full", rep.Full, "duration", rep.Duration, "vips", len(rep.VIPs), "backends", gatewayBackendSummary(rep.Entries))
			},
		},
	})

	prober = healthprobe.New[gateway.HealthTarget](log.Named("health"), healthprobe.Options{
		Interval: cfg.HealthCheckInterval,
		OnChange: runner.Resync,
	})
	defer prober.Close()

	runCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- src.Run(ctx, runner.Submit)
		stopRunner() // the source ended: so does the gateway
	}()
	log.Info("vipgate gateway started", "forwarding", cfg.Forwarding, "snat", cfg.SNAT, "table", cfg.TableName,
		"healthCheckInterval", cfg.HealthCheckInterval, "source", src.String(), "version", version)

	_ = runner.Run(runCtx)
	if ctx.Err() != nil {
		log.Info("stopping; the nftables rules (and the NAT fast path, if on) stay in place")
		return nil
	}
	if err := <-srcErr; err != nil {
		return fmt.Errorf("source: %w", err)
	}
	return nil
}

// fastPathStatus is why the last sync had no route forwarding fast path, per family
// (gateway.SyncReport.NoFastPath), and what is wrong with one that is on (FastPathWarnings), for
// /status's warnings: the sync loop writes it, the admin endpoint reads it.
type fastPathStatus struct {
	why  atomic.Pointer[[]string]
	warn atomic.Pointer[[]string]
}

func (s *fastPathStatus) set(why, warn []string) {
	s.warn.Store(&warn)
	s.why.Store(&why)
}

// gauge is vipgate_gateway_fast_path of family f: 0 before the first sync and while the last sync
// reported the family without its fast path, else 1 (a family without nodes too: nothing to
// forward).
func (s *fastPathStatus) gauge(f cluster.Family) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "vipgate", Name: "gateway_fast_path",
		Help:        "0 while the family's route forwarding fast path (netdev fwd) is off and its table forwards alone (dup; /status says why), else 1.",
		ConstLabels: prometheus.Labels{"family": fmt.Sprintf("ipv%d", f)},
	}, func() float64 {
		p := s.why.Load()
		if p == nil || slices.ContainsFunc(*p, func(why string) bool { return strings.HasPrefix(why, fmt.Sprintf("IPv%d:", f)) }) {
			return 0
		}
		return 1
	})
}

func (s *fastPathStatus) warnings() []string {
	p := s.why.Load()
	if p == nil {
		return nil
	}
	out := make([]string, 0, len(*p))
	for _, why := range *p {
		out = append(out, "route forwarding fast path off: "+why)
	}
	if w := s.warn.Load(); w != nil {
		for _, what := range *w {
			out = append(out, "route forwarding fast path: "+what)
		}
	}
	return out
}

// gatewayReport is a gateway sync as the admin endpoint records a node's.
func gatewayReport(rep *gateway.SyncReport) *dataplane.SyncReport {
	if rep == nil {
		return nil
	}
	// The metrics count the families' tables; the fast path's netdev tables hold the same sets.
	txs := make([]*dataplane.Tx, 0, len(rep.Txs))
	for _, tx := range rep.Txs {
		if tx.Family == cluster.IPv4 || tx.Family == cluster.IPv6 {
			txs = append(txs, tx)
		}
	}
	return &dataplane.SyncReport{Duration: rep.Duration, Full: rep.Full, Txs: txs, Conflicts: rep.Conflicts}
}

// gatewayBackendSummary formats "vip:port/proto=backend,backend; ..." for the sync log line, so the
// log shows when a node leaves or joins a VIP's set.
func gatewayBackendSummary(entries []gateway.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s=", netip.AddrPortFrom(e.VIP, e.Port))
		if len(e.Backends) == 0 {
			b.WriteString("none (" + e.Why + ")")
			continue
		}
		for j, be := range e.Backends {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString(be.String())
		}
		if e.SNAT {
			b.WriteString(" snat")
		}
	}
	return b.String()
}

// warnIfNotForwarding warns when the host does not forward packets of a family the gateway serves:
// the rules would DNAT and the kernel would then drop everything.
func warnIfNotForwarding(log hclog.Logger, cfg *cluster.GatewayConfig) {
	for _, ip := range cfg.GatewayIPs {
		path := "/proc/sys/net/ipv4/ip_forward"
		if cluster.FamilyOf(ip) == cluster.IPv6 {
			path = "/proc/sys/net/ipv6/conf/all/forwarding"
		}
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "1" {
			log.Warn("IP forwarding is off: VIP traffic will not reach the cluster", "sysctl", path)
		}
	}
}
