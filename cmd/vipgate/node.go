package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/natpath"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/proxy/symreturn"
)

const nodeHelp = `Usage: vipgate node --config FILE (--manifests DIR | --kubeconfig FILE) [flags]

Programs the network namespace it runs in so that Kubernetes Services work as with kube-proxy in
nftables mode: ClusterIP, NodePort, LoadBalancer ingress IPs and externalIPs (only inside the
config's externalIPs.allowedCIDRs: off by default, KEP-5707), traffic policies,
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
	if err == nil && done {
		// --cleanup: the symmetric return's table, ip rules and routes too.
		err = symreturn.Apply(symreturn.Kernel{}, symreturn.Plan{Table: symreturn.TableName(cfg.TableName)})
	}
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

	// The admin endpoint (/metrics, /status) on metricsBindAddress, localhost unless configured
	// otherwise. Components register their metrics on nodeRegistry().
	admin, stopAdmin, err := startAdmin(log, cfg.MetricsBindAddress,
		NodeStatus{Node: cfg.NodeName, Table: cfg.TableName, Source: src.String(), Version: version})
	if err != nil {
		return err
	}
	defer stopAdmin()
	// kube-proxy's /proxyMode (and ping /healthz) on the metrics port.
	admin.setProxyMode(NodeProxyMode)

	// The runtime (proxy/runtime.go): the Proxier and its sync loop, the health servers, conntrack
	// cleanup, the log and Events of what is not programmed.
	ro := proxy.RuntimeOptions{Log: log, Config: cfg, Dataplane: proxy.ConfigFor(cfg, log), Programmer: prog}
	ks, isKube := src.(kubeSource)
	if isKube {
		ro.Events = ks.KubeSource
		admin.addWarnings(ks.Warnings)
	}
	rt := proxy.NewRuntime(ro)
	defer rt.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// Symmetric return (symmetricReturn): on, its table, ip rules and routes are kept in step with
	// the main table; off, what an earlier config left is removed.
	if srPlan := symreturn.NewPlan(cfg.SymmetricReturn, cfg.TableName); srPlan.Enabled() {
		go symreturn.Run(ctx, log, symreturn.Kernel{}, srPlan, symreturn.DefaultPeriod)
	} else if err := symreturn.Apply(symreturn.Kernel{}, srPlan); err != nil {
		log.Warn("symmetric return: removing what an earlier config left", "err", err)
	}

	// The speaker (L2/BGP announcements) runs beside the dataplane and sees every snapshot.
	spk, err := startSpeakerWith(ctx, cfg, nf.speaker, log)
	if err != nil {
		return err
	}
	defer spk.Stop()
	if e, ok := spk.(interface{ setEventer(eventer) }); ok && isKube {
		// With the Kubernetes source the speakers also tell in Events which node announces what.
		e.setEventer(ks.KubeSource)
	}
	if vl, ok := spk.(vipLister); ok {
		admin.setVIPLister(vl)
	}
	log.Info("vipgate node started", "node", cfg.NodeName, "table", cfg.TableName, "source", src.String(), "version", version)
	return rt.Run(ctx, src.Run, proxy.RunHooks{Attempted: admin.recordSync, Synced: spk.Update})
}
