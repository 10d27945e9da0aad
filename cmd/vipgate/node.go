package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/natpath"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/proxy/healthcheck"
)

const nodeHelp = `Usage: vipgate node --config FILE (--manifests DIR | --kubeconfig FILE) [flags]

Programs the network namespace it runs in so that Kubernetes Services work as with kube-proxy in
nftables mode: ClusterIP, NodePort, LoadBalancer ingress IPs and externalIPs, traffic policies,
session affinity, source ranges. Rules live in the nftables tables "ip vipgate" and "ip6 vipgate"
(the config's tableName). Stopping vipgate leaves the rules in place, so traffic keeps flowing while
it restarts; "--cleanup" removes them.

kube-proxy flag             vipgate NodeConfig field
  --hostname-override         nodeName
  --cluster-cidr              clusterCIDRs
  --nodeport-addresses        nodePortAddresses
  --masquerade-all            masqueradeAll
  --iptables-masquerade-bit   masqueradeBit
  --healthz-bind-address      healthzBindAddress
  --metrics-bind-address      metricsBindAddress

Flags:
`

type nodeFlags struct {
	config, manifests, kubeconfig, logLevel string
	cleanup, allowWorldWritable             bool
	speaker                                 speakerFlags
	// bgpSecrets are the Secrets of vipgate's namespace the Kubernetes source reads (source.go).
	bgpSecrets string
}

func parseNodeFlags(name, help string, args []string) (*nodeFlags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	f := &nodeFlags{}
	fs.StringVar(&f.config, "config", "", "NodeConfig file (YAML, kind: NodeConfig)")
	fs.StringVar(&f.manifests, "manifests", "", "directory of Kubernetes YAML (Services, EndpointSlices, MetalLB kinds); watched for changes")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to watch instead of --manifests (\"in-cluster\": the pod's service account; the default inside a pod)")
	fs.StringVar(&f.logLevel, "log-level", "", "override the config's logLevel (trace, debug, info, warn, error)")
	fs.BoolVar(&f.cleanup, "cleanup", false, "delete vipgate's nftables tables and exit")
	f.speaker.addFlags(fs)
	fs.BoolVar(&f.allowWorldWritable, "allow-world-writable-manifests", false, "accept a manifest directory anyone can write to (unsafe)")
	fs.StringVar(&f.bgpSecrets, "bgp-password-secrets", "", "comma-separated names of the basic-auth Secrets in vipgate's namespace (POD_NAMESPACE) that BGPPeers name (passwordSecret, vipgate.io/bfd-auth-secret); the only Secrets read, each by name (grant them in the Role by resourceNames)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), help)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if f.config == "" {
		return nil, errors.New("--config is required")
	}
	return f, nil
}

// startCommand is the common start of `vipgate node` and `vipgate gateway`: the logger (the config's
// logLevel and logFormat, --log-level over them) and --cleanup, which deletes vipgate's tables and
// is all the command does then (done).
func startCommand(nf *nodeFlags, logging *cluster.Logging, table string, prog *dataplane.NetlinkProgrammer) (log hclog.Logger, done bool, err error) {
	if nf.logLevel != "" {
		logging.Level = hclog.LevelFromString(nf.logLevel)
	}
	log = logging.NewLogger("vipgate", os.Stderr)
	if !nf.cleanup {
		return log, false, nil
	}
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		// The gateway's SNAT-address table (conntrack sync) too; absent tables are fine.
		for _, t := range []string{table, ctsync.SNATTable} {
			if err := prog.DeleteTable(f, t); err != nil {
				return log, true, fmt.Errorf("deleting table %s: %w", t, err)
			}
		}
		// The gateway's route forwarding fast path (a netdev table per family): left behind, its
		// ingress chains would go on forwarding VIP traffic with no table behind them.
		nd := dataplane.NetdevTableName(table, f)
		if err := prog.DeleteTable(dataplane.NetdevFamily(f), nd); err != nil {
			return log, true, fmt.Errorf("deleting netdev table %s: %w", nd, err)
		}
	}
	// The gateway's NAT fast path: a BPF program that stays attached when the gateway ends.
	n, err := natpath.Cleanup()
	if err != nil {
		return log, true, fmt.Errorf("detaching the NAT fast path: %w", err)
	}
	log.Info("removed vipgate's nftables tables", "table", table, "snat", ctsync.SNATTable,
		"fastPath", dataplane.NetdevTableName(table, cluster.IPv4)+","+dataplane.NetdevTableName(table, cluster.IPv6),
		"natFastPathPrograms", n)
	return log, true, nil
}

func runNode(args []string) error {
	nf, err := parseNodeFlags("node", nodeHelp, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := cluster.LoadNodeConfig(nf.config)
	if err != nil {
		return err
	}
	// The decoder reads the table back for adoption; tables of an older vipgate get their rule
	// comments back from the node's rules (proxy.DecodeOptions).
	prog := &dataplane.NetlinkProgrammer{Decode: proxy.DecodeOptions()}
	log, done, err := startCommand(nf, &cfg.Logging, cfg.TableName, prog)
	if err != nil || done {
		return err
	}
	src, err := newSource(nf, log)
	if err != nil {
		return err
	}
	if ps, ok := src.(interface{ SetServiceProxyName(string) }); ok {
		ps.SetServiceProxyName(cfg.ServiceProxyName)
	}

	dpCfg := dataplaneConfig(cfg, log)
	proxier := proxy.NewProxier(log.Named("dataplane"), dpCfg, prog)
	// A restart adopts the table the previous run left instead of replacing it (affinity survives).
	proxier.SetTableReader(prog)

	// The admin endpoint (/metrics, /status) on metricsBindAddress, localhost unless configured
	// otherwise. Components register their metrics on nodeRegistry().
	admin, stopAdmin, err := startAdmin(log, cfg.MetricsBindAddress,
		NodeStatus{Node: cfg.NodeName, Table: cfg.TableName, Source: src.String(), Version: version})
	if err != nil {
		return err
	}
	defer stopAdmin()

	// /healthz, /livez and /readyz: QueuedUpdate when a snapshot arrives, Updated when one is
	// programmed, so a node whose syncs keep failing (or never run) turns unhealthy after staleAfter;
	// /readyz stays 503 until the first sync is in the kernel (the DaemonSet's readiness probe).
	healthz := healthcheck.NewProxyHealthServer(log, cfg.HealthzBindAddress.String(), 2*time.Minute)
	if err := healthz.Start(); err != nil {
		log.Warn("healthz server not started", "addr", cfg.HealthzBindAddress, "err", err)
	} else {
		defer healthz.Close()
	}
	hcAddrs := cfg.HealthCheckAddresses
	if len(hcAddrs) == 0 {
		hcAddrs = cfg.NodeIPs
	}
	hc := healthcheck.NewServiceHealthServer(log, hcAddrs, healthz.IsHealthy)
	defer hc.Close()
	ct, err := conntrack.NewCleaner(log.Named("conntrack"))
	if err != nil {
		log.Warn("conntrack cleanup disabled", "err", err)
	}
	ctClean := dataplane.ConntrackCleanup{Cleaner: ct, Log: log}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The speaker (L2/BGP announcements) runs beside the dataplane and sees every snapshot.
	spk, err := startSpeakerWith(ctx, cfg, nf.speaker, log)
	if err != nil {
		return err
	}
	defer spk.Stop()
	if ks, ok := src.(kubeSource); ok {
		// With the Kubernetes source the speakers also tell in Events which node announces what.
		if e, ok := spk.(interface{ setEventer(eventer) }); ok {
			e.setEventer(ks.KubeSource)
		}
	}
	if vl, ok := spk.(vipLister); ok {
		admin.setVIPLister(vl)
	}

	conflicts := &conflictLog{log: log}
	if ks, ok := src.(kubeSource); ok {
		conflicts.events = ks.KubeSource
		admin.addWarnings(ks.Warnings)
	}
	// The sync loop (dataplane.SyncRunner): the newest snapshot wins, failures are retried with
	// backoff, and after each success the health checks, the speaker and conntrack follow.
	runner := dataplane.NewSyncRunner(log, dataplane.SyncRunnerOptions[*dataplane.SyncReport]{
		Name: "sync",
		Sync: func(_ context.Context, st *cluster.State) (*dataplane.SyncReport, error) {
			return proxier.Sync(st)
		},
		Attempted: admin.recordSync,
		AfterSync: []func(*cluster.State, *dataplane.SyncReport){
			func(st *cluster.State, rep *dataplane.SyncReport) {
				healthz.Updated()
				conflicts.report(st, rep.Conflicts)
				if err := hc.SyncServices(rep.HealthChecks); err != nil {
					log.Warn("health check servers", "err", err)
				}
				hc.SyncEndpoints(rep.LocalEndpoints)
				spk.Update(st, rep)
				if rep.Full {
					// After a (re)start or a recovery: remove UDP/SCTP entries to Service ports whose
					// reply source is no longer an endpoint, keep every flow that is still right.
					ctClean.Reconcile(st)
				}
				ctClean.Delete(rep.StaleFlows)
				// A sync that changed nothing (a Node or EndpointSlice event with no effect on the
				// rules) is routine: debug only, so the log shows the syncs that did something.
				syncLog := log.Info
				if n := txChanges(rep); n == 0 && !rep.Full {
					syncLog = log.Debug
				}
				syncLog("synced", "full", rep.Full, "adopted", rep.Adopted, "duration", rep.Duration, "changes", txChanges(rep))
			},
		},
	})

	runCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- src.Run(ctx, func(st *cluster.State) {
			healthz.QueuedUpdate()
			runner.Submit(st)
		})
		stopRunner() // the source ended: so does the node
	}()
	log.Info("vipgate node started", "node", cfg.NodeName, "table", cfg.TableName, "source", src.String(), "version", version)

	_ = runner.Run(runCtx)
	if ctx.Err() != nil {
		log.Info("stopping; the nftables rules stay in place")
		return nil
	}
	if err := <-srcErr; err != nil {
		return fmt.Errorf("manifest source: %w", err)
	}
	return nil
}

// dataplaneConfig turns the NodeConfig into the dataplane's view: NodePort addresses are the local
// addresses inside nodePortAddresses (never loopback).
func dataplaneConfig(cfg *cluster.NodeConfig, log hclog.Logger) proxy.Config {
	var npIPs []netip.Addr
	seen := map[netip.Addr]bool{}
	addIP := func(a netip.Addr) {
		a = a.Unmap()
		if a.IsLoopback() || seen[a] {
			return
		}
		for _, p := range cfg.NodePortAddresses {
			if p.Contains(a) {
				seen[a] = true
				npIPs = append(npIPs, a)
				return
			}
		}
	}
	for _, a := range cfg.NodeIPs {
		addIP(a)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					addIP(ip)
				}
			}
		}
	} else {
		log.Warn("listing local addresses for nodePortAddresses", "err", err)
	}
	return proxy.Config{
		Table:         cfg.TableName,
		NodeName:      cfg.NodeName,
		Zone:          cfg.NodeZone,
		NodeIPs:       cfg.NodeIPs,
		ClusterCIDRs:  cfg.ClusterCIDRs,
		ServiceCIDRs:  cfg.ServiceCIDRs,
		NodePortIPs:   npIPs,
		MasqueradeAll: cfg.MasqueradeAll,
		MasqueradeBit: cfg.MasqueradeBit,
		ExternalIPs:   cfg.ExternalIPs,
		Limits:        cfg.ServiceLimits,
	}
}
