package gateway

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/gateway/ctsync"
	"github.com/vipgate/vipgate/gateway/healthprobe"
)

// Runtime is a running gateway: the NAT fast path, the Proxier and its sync loop with the health
// prober, the SNAT addresses' owners and conntrack sync, the gateway's metrics and /status
// warnings. It does not announce the VIPs nor hear the other gateways: cmd/vipgate wires the
// speaker to it (RunHooks.Synced, PeerView, Announcer), and serves /status and /metrics.
type Runtime struct {
	opts RuntimeOptions
	cfg  *cluster.GatewayConfig
	log  hclog.Logger
	dp   Config
	gw   *Proxier
	nat  *natPathStatus
	// fastPath is why a family has no route forwarding fast path (its gauges and warnings).
	fastPath fastPathStatus
	copies   flowCopyMetrics
	ctClean  dataplane.ConntrackCleanup
	// sup is conntrackd's supervisor (StartConntrackSync; nil without conntrack sync).
	sup *ctsync.Supervisor
}

// RuntimeOptions is what NewRuntime needs; cmd/vipgate resolves flags and the speaker's
// settings into plain values.
type RuntimeOptions struct {
	Log    hclog.Logger
	Config *cluster.GatewayConfig
	// Dataplane is Config's dataplane view (ConfigFor, as render and explain build it).
	Dataplane  Config
	Programmer dataplane.Programmer
	// Registry takes the gateway's metrics and conntrack sync's.
	Registry prometheus.Registerer
	// MemberKeyFile is the membership's key file (--member-key-file over speaker.memberKeyFile;
	// "": none): the flow hash's seed and the sync relay's keys come from it unless the config
	// names their own. ReadKeys reads a key file (the membership's format), again every KeyReload
	// for the relay.
	MemberKeyFile string
	ReadKeys      func(path string) ([][]byte, error)
	KeyReload     time.Duration
	// Resync is how often the SNAT addresses' owned set is handed to the announcer again without a
	// change (the speaker's own resync: a failed interface is retried).
	Resync time.Duration
	// InterfaceOf is the interface on an address's LAN (l2.DefaultInterface).
	InterfaceOf func(netip.Addr) (string, error)
}

// NewRuntime loads the NAT fast path (a flow hash seed that cannot be read is an error), makes the
// Proxier and registers the gateway's metrics. Close lets go of the NAT fast path.
func NewRuntime(o RuntimeOptions) (*Runtime, error) {
	log, cfg := o.Log, o.Config
	r := &Runtime{opts: o, cfg: cfg, log: log, dp: o.Dataplane, copies: newFlowCopyMetrics()}
	if r.dp.FastPath != nil {
		// This machine's devices: a listed one that does not exist gets no chain (render, which
		// may plan for another machine, keeps them).
		fp := *r.dp.FastPath
		fp.OmitMissing = true
		r.dp.FastPath = &fp
	}
	var err error
	r.dp.NATPath, r.nat, err = startNATPath(cfg, o, log)
	if err != nil {
		return nil, err
	}
	r.gw = NewProxier(log.Named("dataplane"), r.dp, o.Programmer)
	ct, err := conntrack.NewCleaner(log.Named("conntrack"))
	if err != nil {
		log.Warn("conntrack cleanup disabled", "err", err)
	}
	r.ctClean = dataplane.ConntrackCleanup{Cleaner: ct, Log: log}
	r.register()
	return r, nil
}

// register adds the gateway's metrics to the registry: the route forwarding fast path's gauges
// (with the fast path on), the NAT fast path's (forwarding direct and nodePort), the flow copies'
// (forwarding route, also without the fast path: the first sync copies a netdev table an earlier
// run left).
func (r *Runtime) register() {
	reg := r.opts.Registry
	if r.dp.FastPath != nil {
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			if err := reg.Register(r.fastPath.gauge(f)); err != nil {
				r.log.Warn("fast path metric not registered", "err", err)
			}
		}
	}
	if r.cfg.Forwarding != cluster.ForwardRoute {
		for _, c := range r.nat.collectors() {
			if err := reg.Register(c); err != nil {
				r.log.Warn("NAT fast path metric not registered", "err", err)
			}
		}
	}
	if r.dp.Forwarding == cluster.ForwardRoute {
		for _, c := range r.copies.collectors() {
			if err := reg.Register(c); err != nil {
				r.log.Warn("flow copy metric not registered", "err", err)
			}
		}
	}
}

// Close lets go of the NAT fast path's program, which stays attached (as the nftables tables
// stay) and keeps forwarding its flows; the next run adopts them.
func (r *Runtime) Close() { r.nat.close() }

// Warnings are the gateway's lines of /status: a family without its route forwarding fast path
// (routeFastPath on: its packets take the slower dup path, e.g. because the kernel refused the
// netdev table) or one on without some of its devices or with ingress MTUs the nodes' link cannot
// carry; the flow hash's seed (every mode: the jhash rules use it too); the NAT fast path's.
func (r *Runtime) Warnings() []string {
	var out []string
	if r.dp.FastPath != nil {
		out = append(out, r.fastPath.warnings()...)
	}
	return append(out, r.nat.warnings()...)
}

// RunHooks are what cmd/vipgate does around each sync.
type RunHooks struct {
	// Attempted follows every sync attempt, with the report as a node's (DataplaneReport): the
	// admin endpoint's /status and sync metrics.
	Attempted func(st *cluster.State, rep *dataplane.SyncReport, err error)
	// Synced follows a successful sync, before its stale flows' conntrack entries are deleted:
	// the speaker announces the VIPs with backends.
	Synced func(st *cluster.State, rep *SyncReport)
}

// Run runs the sync loop until ctx ends or the source does: source runs with the loop's submit
// (the first complete snapshot and every change); new snapshots, health changes and drain
// deadlines all wake the loop. Its error, if the source ended on its own, is Run's.
func (r *Runtime) Run(ctx context.Context, source func(context.Context, func(*cluster.State)) error, hooks RunHooks) error {
	log := r.log
	// The sync loop (dataplane.SyncRunner) owns the dataplane. Its Sync runs only once Run is
	// called, below, so it may use the prober made after it.
	var prober *healthprobe.Prober[HealthTarget]
	var targetsOf *cluster.State // the snapshot the prober's targets come from
	first := true
	var runner *dataplane.SyncRunner[*SyncReport]
	runner = dataplane.NewSyncRunner(log, dataplane.SyncRunnerOptions[*SyncReport]{
		Name: "gateway sync",
		Sync: func(ctx context.Context, st *cluster.State) (*SyncReport, error) {
			if st != targetsOf {
				prober.SetTargets(HealthTargets(r.dp, st))
				targetsOf = st
			}
			if first {
				// The table a previous run left keeps forwarding meanwhile.
				prober.WaitProbed(ctx, prober.Timeout()+100*time.Millisecond)
				first = false
			}
			return r.gw.Sync(st, prober.Snapshot())
		},
		Attempted: func(st *cluster.State, rep *SyncReport, err error) {
			if hooks.Attempted != nil {
				hooks.Attempted(st, rep.DataplaneReport(), err)
			}
		},
		AfterSync: []func(*cluster.State, *SyncReport){
			func(st *cluster.State, rep *SyncReport) {
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
				for _, rej := range st.Rejected {
					log.Debug("rejected", "object", rej.Object, "reason", rej.Reason)
				}
				r.fastPath.set(rep.NoFastPath, rep.FastPathWarnings)
				r.nat.set(rep)
				r.copies.record(rep.FlowCopies)
				if hooks.Synced != nil {
					hooks.Synced(st, rep)
				}
				r.ctClean.Delete(rep.StaleFlows)
				log.Info("synced", "full", rep.Full, "duration", rep.Duration, "vips", len(rep.VIPs), "backends", backendSummary(rep.Entries))
			},
		},
	})

	prober = healthprobe.New[HealthTarget](log.Named("health"), healthprobe.Options{
		Interval: r.cfg.HealthCheckInterval,
		OnChange: runner.Resync,
	})
	defer prober.Close()

	runCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- source(ctx, runner.Submit)
		stopRunner() // the source ended: so does the gateway
	}()
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

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// DataplaneReport is a gateway sync as the admin endpoint records a node's (nil for nil).
func (rep *SyncReport) DataplaneReport() *dataplane.SyncReport {
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

// backendSummary formats "vip:port/proto=backend,backend; ..." for the sync log line, so the log
// shows when a node leaves or joins a VIP's set.
func backendSummary(entries []Entry) string {
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

// WarnIfNotForwarding warns when the host does not forward packets of a family the gateway serves
// (ips: the gateway's addresses): the rules would DNAT and the kernel would then drop everything.
func WarnIfNotForwarding(log hclog.Logger, ips []netip.Addr) {
	for _, ip := range ips {
		path := "/proc/sys/net/ipv4/ip_forward"
		if cluster.FamilyOf(ip) == cluster.IPv6 {
			path = "/proc/sys/net/ipv6/conf/all/forwarding"
		}
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "1" {
			log.Warn("IP forwarding is off: VIP traffic will not reach the cluster", "sysctl", path)
		}
	}
}
