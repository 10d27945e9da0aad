package proxy

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/proxy/healthcheck"
)

// Runtime is a running node's Service proxy: the Proxier and its sync loop, the /healthz and
// healthCheckNodePort servers, conntrack cleanup, and the log (and Events) of what is not
// programmed. It does not announce the VIPs: cmd/vipgate wires the speaker to it (RunHooks.Synced)
// and serves /status and /metrics, as for the gateway's Runtime.
type Runtime struct {
	log       hclog.Logger
	proxier   *Proxier
	healthz   *healthcheck.ProxyHealthServer
	hc        *healthcheck.ServiceHealthServer
	ctClean   dataplane.ConntrackCleanup
	conflicts *conflictLog
	// nodeName is this node's, for its eligibility on /healthz (NodeEligible).
	nodeName string
	// stopHealthz closes the /healthz server if it started.
	stopHealthz func()
}

// RuntimeOptions is what NewRuntime needs.
type RuntimeOptions struct {
	Log    hclog.Logger
	Config *cluster.NodeConfig
	// Dataplane is Config's proxy view (ConfigFor).
	Dataplane Config
	// Programmer programs the kernel; a restart adopts the table the previous run left through it
	// (affinity survives) instead of replacing it.
	Programmer interface {
		dataplane.Programmer
		TableReader
	}
	// Events records each conflict as a Warning Event on its Service (nil: logged only).
	Events ServiceEventer
}

// ServiceEventer records an Event on a Service (the Kubernetes source; none with the file source).
type ServiceEventer interface {
	Event(ref *corev1.ObjectReference, eventType, reason, message string)
}

// NewRuntime makes the Proxier and starts the health servers: /healthz, /livez and /readyz on
// healthzBindAddress (a taken port is logged, not fatal), the healthCheckNodePort servers on
// healthCheckAddresses (default: the node IPs). Close stops them.
func NewRuntime(o RuntimeOptions) *Runtime {
	log, cfg := o.Log, o.Config
	r := &Runtime{log: log, proxier: NewProxier(log.Named("dataplane"), o.Dataplane, o.Programmer),
		conflicts: &conflictLog{log: log, events: o.Events}, nodeName: cfg.NodeName, stopHealthz: func() {}}
	r.proxier.SetTableReader(o.Programmer)
	// QueuedUpdate when a snapshot arrives, Updated when one is programmed, so a node whose syncs
	// keep failing (or never run) turns unhealthy after staleAfter; /readyz stays 503 until the
	// first sync is in the kernel (the DaemonSet's readiness probe).
	r.healthz = healthcheck.NewProxyHealthServer(log, cfg.HealthzBindAddress.String(), 2*time.Minute)
	if err := r.healthz.Start(); err != nil {
		log.Warn("healthz server not started", "addr", cfg.HealthzBindAddress, "err", err)
	} else {
		r.stopHealthz = func() { _ = r.healthz.Close() }
	}
	hcAddrs := cfg.HealthCheckAddresses
	if len(hcAddrs) == 0 {
		hcAddrs = cfg.NodeIPs
	}
	r.hc = healthcheck.NewServiceHealthServer(log, hcAddrs, r.healthz.IsHealthy)
	ct, err := conntrack.NewCleaner(log.Named("conntrack"))
	if err != nil {
		log.Warn("conntrack cleanup disabled", "err", err)
	}
	r.ctClean = dataplane.ConntrackCleanup{Cleaner: ct, Log: log}
	return r
}

// HealthzAddr is the address /healthz, /livez and /readyz listen on (nil if that server did not
// start).
func (r *Runtime) HealthzAddr() net.Addr { return r.healthz.Addr() }

// Close stops the health servers.
func (r *Runtime) Close() {
	_ = r.hc.Close()
	r.stopHealthz()
}

// RunHooks are what cmd/vipgate does around each sync.
type RunHooks struct {
	// Attempted follows every sync attempt: the admin endpoint's /status and sync metrics.
	Attempted func(st *cluster.State, rep *dataplane.SyncReport, err error)
	// Synced follows a successful sync, after the health checks: the speaker announces.
	Synced func(st *cluster.State, rep *dataplane.SyncReport)
}

// Run runs the sync loop (dataplane.SyncRunner: the newest snapshot wins, failures are retried
// with backoff, and after each success the health checks, the speaker and conntrack follow) until
// ctx ends or the source does: source runs with the loop's submit. Its error, if the source ended
// on its own, is Run's.
func (r *Runtime) Run(ctx context.Context, source func(context.Context, func(*cluster.State)) error, hooks RunHooks) error {
	log := r.log
	runner := dataplane.NewSyncRunner(log, dataplane.SyncRunnerOptions[*dataplane.SyncReport]{
		Name: "sync",
		Sync: func(_ context.Context, st *cluster.State) (*dataplane.SyncReport, error) {
			return r.proxier.Sync(st)
		},
		Attempted: hooks.Attempted,
		AfterSync: []func(*cluster.State, *dataplane.SyncReport){
			func(st *cluster.State, rep *dataplane.SyncReport) {
				r.healthz.Updated()
				r.conflicts.report(st, rep.Conflicts)
				if err := r.hc.SyncServices(rep.HealthChecks); err != nil {
					log.Warn("health check servers", "err", err)
				}
				r.hc.SyncEndpoints(rep.LocalEndpoints)
				if hooks.Synced != nil {
					hooks.Synced(st, rep)
				}
				if rep.Full {
					// After a (re)start or a recovery: remove UDP/SCTP entries to Service ports whose
					// reply source is no longer an endpoint, keep every flow that is still right.
					r.ctClean.Reconcile(st)
				}
				r.ctClean.Delete(rep.StaleFlows)
				// A sync that changed nothing (a Node or EndpointSlice event with no effect on the
				// rules) is routine: debug only, so the log shows the syncs that did something.
				syncLog := log.Info
				if n := TxChanges(rep); n == 0 && !rep.Full {
					syncLog = log.Debug
				}
				syncLog("synced", "full", rep.Full, "adopted", rep.Adopted, "duration", rep.Duration, "changes", TxChanges(rep))
			},
		},
	})

	runCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	srcErr := make(chan error, 1)
	go func() {
		srcErr <- source(ctx, func(st *cluster.State) {
			r.healthz.QueuedUpdate()
			r.healthz.SetNodeEligible(NodeEligible(st, r.nodeName))
			runner.Submit(st)
		})
		stopRunner() // the source ended: so does the node
	}()
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

// NodeEligible says whether /healthz may answer 200 for node name given snapshot st, as kube-proxy
// decides it: not while its Node is being deleted or tainted ToBeDeletedByClusterAutoscaler
// (cluster.Node.ToBeDeleted), nor once it is gone (kube-proxy's nil Node: the snapshot knows Nodes,
// not this one). A snapshot that knows no Node at all (the file source without Nodes) leaves it
// eligible: nothing says it is going away.
func NodeEligible(st *cluster.State, name string) bool {
	if n, ok := st.Nodes[name]; ok && n != nil {
		return !n.ToBeDeleted
	}
	return len(st.Nodes) == 0
}

// TxChanges counts what a sync changed (elements and chains added, changed or removed), for logs
// and /status.
func TxChanges(rep *dataplane.SyncReport) int {
	n := 0
	for _, tx := range rep.Txs {
		n += tx.NumAddElements() + len(tx.DelElements) + len(tx.AddChains) + len(tx.FlushChains) + len(tx.DelChains)
	}
	return n
}
