package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/proxy"
	"github.com/vipgate/vipgate/proxy/healthcheck"
)

// The admin endpoint of `vipgate node`, on metricsBindAddress (127.0.0.1:10249 by default, as
// kube-proxy's metrics): /metrics for Prometheus, /status, the JSON that `vipgate status` prints, and
// /explain, the speaker's decisions for one VIP that `vipgate explain --service/--vip` reads
// (admin_explain.go).
// /healthz and /livez stay on healthzBindAddress (healthcheck.ProxyHealthServer), where kubelet and
// load balancers expect them. On a node it also answers what kube-proxy answers on its metrics port
// for tools and tests that look there (setProxyMode): /proxyMode, the mode as plain text
// ("nftables": upstream e2e's ProxyMode reads it to choose its expectations), and /healthz, "ok"
// while the process serves (kube-proxy installs the apiserver's ping check there).

var (
	nodeRegOnce sync.Once
	nodeReg     *prometheus.Registry
)

// nodeRegistry returns the Prometheus registry of `vipgate node`. It is not the global registry, so
// nothing registers on it by import side effect; every component of the node (dataplane, speakers)
// registers its collectors here, and /metrics serves exactly this registry.
func nodeRegistry() *prometheus.Registry {
	nodeRegOnce.Do(func() {
		nodeReg = prometheus.NewRegistry()
		nodeReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	})
	return nodeReg
}

// VIPStatus is one LoadBalancer IP as /status reports it.
type VIPStatus struct {
	IP      string `json:"ip"`
	Service string `json:"service,omitempty"`
	// Mode is how the VIP is announced: "l2" or "bgp".
	Mode string `json:"mode,omitempty"`
	// Announcer names the node that answers for the VIP (L2), or this node (BGP).
	Announcer string `json:"announcer,omitempty"`
	// Announced says whether this node announces it now.
	Announced bool     `json:"announced"`
	Peers     []string `json:"peers,omitempty"`
	// Reason says why this node does (not) announce it.
	Reason string `json:"reason,omitempty"`
}

// vipLister is what a nodeSpeaker implements to list its VIPs on /status. VIPs is called from the
// HTTP handler's goroutine, so it must be safe to call concurrently with Update.
type vipLister interface {
	VIPs() []VIPStatus
}

// SyncStatus describes one dataplane sync.
type SyncStatus struct {
	Time            time.Time `json:"time"`
	Duration        string    `json:"duration"`
	DurationSeconds float64   `json:"durationSeconds"`
	Full            bool      `json:"full"`
	// Changes counts elements and chains added, changed or removed.
	Changes int `json:"changes"`
}

// NodeStatus is the document /status serves.
type NodeStatus struct {
	Node    string    `json:"node"`
	Table   string    `json:"table"`
	Source  string    `json:"source"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	// LastSync is the last successful sync (nil before the first).
	LastSync *SyncStatus `json:"lastSync,omitempty"`
	// LastError is the error of the last sync if it failed, with its time.
	LastError     string     `json:"lastError,omitempty"`
	LastErrorTime *time.Time `json:"lastErrorTime,omitempty"`
	Services      int        `json:"services"`
	Endpoints     int        `json:"endpoints"`
	// Tables counts what each family's table holds.
	Tables   []proxy.ProgrammedCounts `json:"tables"`
	Rejected []explain.RejectedObject `json:"rejected"`
	VIPs     []VIPStatus              `json:"vips"`
	// Warnings are conditions of the node as a whole (e.g. L2 refused without a membership key,
	// or unauthenticated membership).
	Warnings []string `json:"warnings,omitempty"`
}

// adminServer serves /metrics and /status. The sync loop writes through recordSync; the handlers
// only read a copy.
type adminServer struct {
	log     hclog.Logger
	addr    netip.AddrPort
	reg     *prometheus.Registry
	metrics *proxy.Metrics
	changes *proxy.ChangeMetrics

	mu     sync.Mutex
	status NodeStatus
	vips   vipLister
	// warnings are more sources of Warnings (the Kubernetes source's caches not synced).
	warnings []func() []string
	// proxyMode is what /proxyMode answers ("" on a gateway: 404).
	proxyMode string
	endpoint  healthcheck.Endpoint
}

// NodeProxyMode is the kube-proxy mode `vipgate node` stands in for: its dataplane is nftables,
// with kube-proxy's nftables mode's semantics.
const NodeProxyMode = "nftables"

// newAdminServer creates the admin endpoint and the dataplane metrics on reg. base holds the fields
// that never change (node, table, source, version).
func newAdminServer(log hclog.Logger, addr netip.AddrPort, reg *prometheus.Registry, base NodeStatus) (*adminServer, error) {
	m, err := proxy.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	cm, err := proxy.NewChangeMetrics(reg)
	if err != nil {
		return nil, err
	}
	base.Started = time.Now()
	return &adminServer{log: log, addr: addr, reg: reg, metrics: m, changes: cm, status: base}, nil
}

// startAdmin creates the admin endpoint (metrics on nodeRegistry()) and starts it. Failing to listen
// is logged, not fatal, as for healthz: a taken port (an old kube-proxy still holding it) must not
// stop the dataplane. stop closes it.
func startAdmin(log hclog.Logger, addr netip.AddrPort, base NodeStatus) (a *adminServer, stop func(), err error) {
	a, err = newAdminServer(log.Named("admin"), addr, nodeRegistry(), base)
	if err != nil {
		return nil, nil, err
	}
	if err := a.Start(); err != nil {
		log.Warn("admin endpoint not started", "addr", addr, "err", err)
		return a, func() {}, nil
	}
	return a, func() { _ = a.Close() }, nil
}

// Start listens on the admin address and serves in the background.
func (a *adminServer) Start() error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	mux.HandleFunc("/status", a.serveStatus)
	mux.HandleFunc(explain.ExplainPath, a.serveExplain) // admin_explain.go
	mux.HandleFunc("/proxyMode", a.serveProxyMode)
	mux.HandleFunc("/healthz", a.serveHealthzPing)
	bound, err := a.endpoint.Start(a.addr.String(), mux, a.log, "admin endpoint")
	if err != nil {
		return fmt.Errorf("starting admin endpoint: %w", err)
	}
	if !a.addr.Addr().IsLoopback() {
		a.log.Warn("admin endpoint (metrics, status) listens beyond localhost, as configured", "address", bound.String())
	} else {
		a.log.Info("serving metrics and status", "address", bound.String())
	}
	return nil
}

// Addr is the address the endpoint listens on (nil before Start).
func (a *adminServer) Addr() net.Addr { return a.endpoint.Addr() }

// Close stops serving.
func (a *adminServer) Close() error { return a.endpoint.Close() }

// setVIPLister makes /status list the VIPs of v (the speaker).
func (a *adminServer) setVIPLister(v vipLister) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.vips = v
}

// recordSync records the outcome of one sync of snapshot st.
func (a *adminServer) recordSync(st *cluster.State, rep *dataplane.SyncReport, err error) {
	a.metrics.ObserveSync(st, rep, err)
	a.changes.ObserveSync(st, rep, err)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		now := time.Now()
		a.status.LastError, a.status.LastErrorTime = err.Error(), &now
		return
	}
	a.status.LastError, a.status.LastErrorTime = "", nil
	a.status.LastSync = &SyncStatus{Time: time.Now(), Duration: rep.Duration.String(), DurationSeconds: rep.Duration.Seconds(),
		Full: rep.Full, Changes: proxy.TxChanges(rep)}
	a.status.Services = len(st.Services)
	a.status.Endpoints = proxy.CountEndpoints(st)
	rej := make([]explain.RejectedObject, 0, len(st.Rejected)+len(rep.Conflicts))
	for _, r := range append(append([]cluster.Rejection(nil), st.Rejected...), rep.Conflicts...) {
		rej = append(rej, explain.Rejected(r))
	}
	a.status.Rejected = rej
}

// snapshot returns the current status document.
func (a *adminServer) snapshot() NodeStatus {
	a.mu.Lock()
	st := a.status
	st.Rejected = append([]explain.RejectedObject{}, a.status.Rejected...)
	vips := a.vips
	warnings := a.warnings
	a.mu.Unlock()
	st.Tables = a.metrics.Programmed()
	st.VIPs = []VIPStatus{}
	if vips != nil {
		st.VIPs = append(st.VIPs, vips.VIPs()...)
		if w, ok := vips.(interface{ Warnings() []string }); ok {
			st.Warnings = w.Warnings()
		}
	}
	for _, w := range warnings {
		st.Warnings = append(st.Warnings, w()...)
	}
	return st
}

// setProxyMode makes /proxyMode answer mode and /healthz "ok", as kube-proxy's metrics port does.
func (a *adminServer) setProxyMode(mode string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proxyMode = mode
}

func (a *adminServer) getProxyMode() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proxyMode
}

// serveProxyMode answers the mode as kube-proxy does: plain text, no newline.
func (a *adminServer) serveProxyMode(w http.ResponseWriter, r *http.Request) {
	mode := a.getProxyMode()
	if mode == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = fmt.Fprint(w, mode)
}

// serveHealthzPing is the apiserver library's /healthz with only its ping check, which kube-proxy
// installs on its metrics port: "ok" while the process serves. The proxy's own health is on
// healthzBindAddress.
func (a *adminServer) serveHealthzPing(w http.ResponseWriter, r *http.Request) {
	if a.getProxyMode() == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = fmt.Fprint(w, "ok")
}

// addWarnings makes /status list what w returns among its warnings.
func (a *adminServer) addWarnings(w func() []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.warnings = append(a.warnings, w)
}

func (a *adminServer) serveStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(a.snapshot()); err != nil {
		a.log.Debug("writing /status", "err", err)
	}
}
