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
	"github.com/vipgate/vipgate/dataplane/ctsync"
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
}

func parseNodeFlags(name, help string, args []string) (*nodeFlags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	f := &nodeFlags{}
	fs.StringVar(&f.config, "config", "", "NodeConfig file (YAML, kind: NodeConfig)")
	fs.StringVar(&f.manifests, "manifests", "", "directory of Kubernetes YAML (Services, EndpointSlices, MetalLB kinds); watched for changes")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to watch instead of --manifests (\"in-cluster\": the pod's service account; the default inside a pod)")
	fs.StringVar(&f.logLevel, "log-level", "", "override the config's logLevel (trace, debug, info, warn, error)")
	fs.BoolVar(&f.cleanup, "cleanup", false, "delete vipgate's nftables tables and exit")
	fs.DurationVar(&bgpDrain, "bgp-shutdown-drain", 0, "on SIGTERM, advertise routes with GRACEFUL_SHUTDOWN and local-pref 0 for this long, then withdraw (0: keep them for graceful restart)")
	fs.IntVar(&memberPort, "member-port", memberPort, "UDP port of the speakers' membership heartbeats, the same on every node (0: the config's speaker.memberPort, else 7473)")
	fs.StringVar(&memberKeyFile, "member-key-file", memberKeyFile, "file of the keys that authenticate the membership heartbeats, one per line: the first signs, any verifies (over the config's speaker.memberKeyFile); without one L2 announcements are refused")
	fs.BoolVar(&memberInsecure, "member-insecure", memberInsecure, "run the L2 membership without a key (labs only: anyone on the LAN can steer it)")
	fs.BoolVar(&f.allowWorldWritable, "allow-world-writable-manifests", false, "accept a manifest directory anyone can write to (unsafe)")
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
	}
	log.Info("removed vipgate's nftables tables", "table", table, "snat", ctsync.SNATTable)
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
	prog := &dataplane.NetlinkProgrammer{}
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
	proxier := dataplane.NewProxier(log.Named("dataplane"), dpCfg, prog)
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
	healthz := dataplane.NewProxyHealthServer(log, cfg.HealthzBindAddress.String(), 2*time.Minute)
	if err := healthz.Start(); err != nil {
		log.Warn("healthz server not started", "addr", cfg.HealthzBindAddress, "err", err)
	} else {
		defer healthz.Close()
	}
	hcAddrs := cfg.HealthCheckAddresses
	if len(hcAddrs) == 0 {
		hcAddrs = cfg.NodeIPs
	}
	hc := dataplane.NewHealthCheckServer(log, hcAddrs, healthz.IsHealthy)
	defer hc.Close()
	ct, err := dataplane.NewConntrackCleaner(log.Named("conntrack"))
	if err != nil {
		log.Warn("conntrack cleanup disabled", "err", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The speaker (L2/BGP announcements) runs beside the dataplane and sees every snapshot.
	spk, err := startSpeaker(ctx, cfg, log)
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

	states := make(chan *cluster.State, 1)
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- src.Run(ctx, func(st *cluster.State) {
			healthz.QueuedUpdate()
			// Keep only the newest snapshot: a burst of changes becomes one sync.
			select {
			case <-states:
			default:
			}
			states <- st
		})
	}()
	log.Info("vipgate node started", "node", cfg.NodeName, "table", cfg.TableName, "source", src.String(), "version", version)

	conflicts := &conflictLog{log: log}
	if ks, ok := src.(kubeSource); ok {
		conflicts.events = ks.KubeSource
	}
	var pending *cluster.State
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping; the nftables rules stay in place")
			return nil
		case err := <-srcErr:
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("manifest source: %w", err)
			}
			return nil
		case st := <-states:
			pending = st
		case <-retry.C:
		}
		if pending == nil {
			continue
		}
		rep, err := proxier.Sync(pending)
		admin.recordSync(pending, rep, err)
		if err != nil {
			log.Error("sync failed, retrying in 1s", "err", err)
			retry.Reset(time.Second)
			continue
		}
		pending0 := pending
		pending = nil
		healthz.Updated()
		conflicts.report(pending0, rep.Conflicts)
		if err := hc.SyncServices(rep.HealthChecks); err != nil {
			log.Warn("health check servers", "err", err)
		}
		hc.SyncEndpoints(rep.LocalEndpoints)
		spk.Update(pending0, rep)
		if r, ok := ct.(dataplane.ConntrackReconciler); ok && rep.Full {
			// After a (re)start or a recovery: remove UDP/SCTP entries to Service ports whose reply
			// source is no longer an endpoint, keep every flow that is still right.
			if n, err := r.Reconcile(dataplane.ConntrackView(pending0)); err != nil {
				log.Warn("conntrack reconcile", "err", err)
			} else if n > 0 {
				log.Info("deleted stale conntrack entries", "count", n)
			}
		}
		if ct != nil && len(rep.StaleFlows) > 0 {
			filters := make([]dataplane.StaleFlow, 0, len(rep.StaleFlows))
			for _, f := range rep.StaleFlows {
				filters = append(filters, dataplane.StaleFlow(f))
			}
			if n, err := ct.Delete(filters); err != nil {
				log.Warn("conntrack cleanup", "err", err)
			} else if n > 0 {
				log.Debug("deleted stale conntrack entries", "count", n)
			}
		}
		// A sync that changed nothing (a Node or EndpointSlice event with no effect on the rules) is
		// routine: debug only, so the log shows the syncs that did something.
		syncLog := log.Info
		if n := txChanges(rep); n == 0 && !rep.Full {
			syncLog = log.Debug
		}
		syncLog("synced", "full", rep.Full, "adopted", rep.Adopted, "duration", rep.Duration, "changes", txChanges(rep))
	}
}

// dataplaneConfig turns the NodeConfig into the dataplane's view: NodePort addresses are the local
// addresses inside nodePortAddresses (never loopback).
func dataplaneConfig(cfg *cluster.NodeConfig, log hclog.Logger) dataplane.Config {
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
	return dataplane.Config{
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
	}
}
