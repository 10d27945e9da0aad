// Package healthcheck serves vipgate's health checks, as kube-proxy's pkg/proxy/healthcheck:
//
//   - ServiceHealthServer answers a cloud or bare-metal load balancer's probe of a Service's
//     healthCheckNodePort (externalTrafficPolicy: Local). The LB sends traffic for the Service only to
//     nodes that answer 200, i.e. nodes with at least one local ready endpoint, so that traffic is never
//     dropped for lack of a local endpoint and the client source IP survives.
//   - ProxyHealthServer is the proxy's own /healthz and /livez (healthzBindAddress, 127.0.0.1:10256 by
//     default), which kubelet probes and LBs use as a node-level check, and /readyz, vipgate's own,
//     for the readiness probe.
//
// /healthz, /livez and the health checks copy kube-proxy's (v1.36) response bytes and status
// semantics, because existing LB health checks and monitoring are written against them: the JSON
// body (ProxyHealth: lastUpdated, currentTime, nodeEligible on /healthz, healthy, status per family),
// 503 when a change waits longer than staleAfter, and on /healthz also while the node is being
// deleted or tainted ToBeDeletedByClusterAutoscaler (SetNodeEligible).
//
// It is a leaf of the node's proxy: it imports cluster (for ServiceKey) and nothing else of vipgate, so
// that it can be tested and reused without the ruleset code (see dataplane/imports_test.go).
package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// DefaultHealthzBindAddress is kube-proxy's default healthzBindAddress.
const DefaultHealthzBindAddress = "127.0.0.1:10256"

// ServiceHealthServer serves one HTTP health check per Service with externalTrafficPolicy: Local on the
// Service's healthCheckNodePort. It is safe for concurrent use; normally the sync loop calls
// SyncServices and SyncEndpoints and the HTTP handlers only read.
type ServiceHealthServer struct {
	logger       hclog.Logger
	addrs        []netip.Addr
	proxyHealthy func() bool

	mu       sync.RWMutex
	closed   bool
	services map[cluster.ServiceKey]*hcService
	// endpoints is the last SyncEndpoints input. It is kept apart from services so that a count set
	// before the listener could be opened (or while it is failing) is right as soon as it opens.
	endpoints map[cluster.ServiceKey]int
	// failed remembers the Services whose port could not be bound, with that port, so each failure is
	// logged once at error level and the retries on later syncs only at debug level.
	failed map[cluster.ServiceKey]uint16
}

// hcService is one Service's open health check: its port and one HTTP server per listen address.
type hcService struct {
	port    uint16
	servers []*http.Server
}

// NewServiceHealthServer returns a health-check server that listens on each of addrs (one listener per
// address, so loopback is only used when addrs contains it). An unspecified address (0.0.0.0 or ::) in
// addrs means every address of the node, as kube-proxy does when nodePortAddresses is unset; an empty
// addrs means the same. proxyHealthy reports the proxy's own health (typically
// ProxyHealthServer.IsHealthy); nil means always healthy. A Service answers 200 only when it has a local
// endpoint and the proxy is healthy, 503 otherwise, so an LB moves away from a node whose proxy is stuck.
func NewServiceHealthServer(logger hclog.Logger, addrs []netip.Addr, proxyHealthy func() bool) *ServiceHealthServer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if proxyHealthy == nil {
		proxyHealthy = func() bool { return true }
	}
	listen := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsUnspecified() {
			// Go listens on both families for an unspecified address with network "tcp"; other
			// entries would only collide with it.
			listen = []netip.Addr{netip.IPv6Unspecified()}
			break
		}
		listen = append(listen, a)
	}
	if len(listen) == 0 {
		listen = []netip.Addr{netip.IPv6Unspecified()}
	}
	return &ServiceHealthServer{
		logger:       logger.Named("healthcheck"),
		addrs:        listen,
		proxyHealthy: proxyHealthy,
		services:     map[cluster.ServiceKey]*hcService{},
		endpoints:    map[cluster.ServiceKey]int{},
		failed:       map[cluster.ServiceKey]uint16{},
	}
}

// SyncServices makes ports the wanted set of health checks: Service -> healthCheckNodePort. Health
// checks of Services no longer listed, or whose port changed, are closed; new ones are opened. A port
// that cannot be bound on every address is logged (once per Service and port) and retried on the next
// call; the other Services keep working. The error reports only invalid input (port 0) or a closed
// server, never a bind failure, which the caller cannot act on.
func (s *ServiceHealthServer) SyncServices(ports map[cluster.ServiceKey]uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("syncing health-check services: server is closed")
	}

	for key, svc := range s.services {
		if port, ok := ports[key]; ok && port == svc.port {
			continue
		}
		s.logger.Info("closing health check", "service", key, "port", svc.port)
		svc.close()
		delete(s.services, key)
	}
	for key := range s.failed {
		if port, ok := ports[key]; !ok || port != s.failed[key] {
			delete(s.failed, key)
		}
	}

	var errs []error
	for key, port := range ports {
		if port == 0 {
			errs = append(errs, fmt.Errorf("health check for service %s: port 0 is not a valid healthCheckNodePort", key))
			continue
		}
		if s.services[key] != nil {
			continue
		}
		svc, err := s.open(key, port)
		if err != nil {
			if s.failed[key] == port {
				s.logger.Debug("health check port still cannot be bound", "service", key, "port", port, "err", err)
			} else {
				s.logger.Error("cannot open health check, will retry on next sync", "service", key, "port", port, "err", err)
				s.failed[key] = port
			}
			continue
		}
		if _, ok := s.failed[key]; ok {
			s.logger.Info("health check opened after earlier failure", "service", key, "port", port)
			delete(s.failed, key)
		} else {
			s.logger.Info("opened health check", "service", key, "port", port)
		}
		s.services[key] = svc
	}
	return errors.Join(errs...)
}

// open listens on every configured address and serves key's health check there. On any failure it
// closes what it had opened, so that a retry starts clean and a port is never half-served.
func (s *ServiceHealthServer) open(key cluster.ServiceKey, port uint16) (*hcService, error) {
	svc := &hcService{port: port}
	handler := hcHandler{server: s, service: key}
	for _, addr := range s.addrs {
		ap := netip.AddrPortFrom(addr, port).String()
		srv, _, err := ListenAndServe(ap, handler, s.logger.With("service", key), "health check server")
		if err != nil {
			svc.close()
			return nil, err
		}
		svc.servers = append(svc.servers, srv)
	}
	return svc, nil
}

// close stops every HTTP server of the health check, closing its listeners and open connections.
func (svc *hcService) close() {
	for _, srv := range svc.servers {
		_ = srv.Close() // Close only reports listener close errors, which leave nothing to undo.
	}
	svc.servers = nil
}

// SyncEndpoints sets the number of local ready endpoints per Service. Services not in local have zero.
func (s *ServiceHealthServer) SyncEndpoints(local map[cluster.ServiceKey]int) {
	counts := make(map[cluster.ServiceKey]int, len(local))
	for k, n := range local {
		counts[k] = n
	}
	s.mu.Lock()
	s.endpoints = counts
	s.mu.Unlock()
}

// Close stops every health check. The server cannot be used afterwards.
func (s *ServiceHealthServer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, svc := range s.services {
		svc.close()
		delete(s.services, key)
	}
	s.closed = true
	return nil
}

// localEndpoints returns the Service's local endpoint count and whether its health check is open.
func (s *ServiceHealthServer) localEndpoints(key cluster.ServiceKey) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.services[key] == nil {
		return 0, false
	}
	return s.endpoints[key], true
}

// hcHandler answers one Service's health check on any path and method, as kube-proxy does.
type hcHandler struct {
	server  *ServiceHealthServer
	service cluster.ServiceKey
}

func (h hcHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	count, open := h.server.localEndpoints(h.service)
	if !open {
		// A request that raced with the health check being closed: say nothing, like kube-proxy.
		return
	}
	proxyHealthy := h.server.proxyHealthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if count > 0 && proxyHealthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(hcBody(h.service, count, proxyHealthy))
}

// hcBody renders the health-check body byte for byte as kube-proxy does (a tab-indented JSON object
// without trailing newline), for anything that compares or parses it.
func hcBody(key cluster.ServiceKey, count int, proxyHealthy bool) []byte {
	return fmt.Appendf(nil, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		key.Namespace, key.Name, count, proxyHealthy)
}

// ProxyHealthServer serves the proxy's /healthz and /livez with kube-proxy's semantics: the proxy is
// unhealthy when a change was queued (QueuedUpdate) more than staleAfter ago and has not been applied
// (Updated) since. It is healthy while nothing is pending, including before the first sync. /healthz is
// also unhealthy when the node is not eligible (being deleted), /livez is not.
//
// /readyz is vipgate's addition, for a readiness probe: /healthz answers 200 from start-up on (a proxy
// still starting is not unhealthy, and kubelet must not restart it), so a pod probed on /healthz is
// Ready before any Service works through it. /readyz answers 503 until the first sync was programmed
// into the kernel (Updated), and 200 afterwards as long as the proxy is healthy (the /livez
// condition): a later failed sync leaves the previous rules in place, which still serve, so it does not
// make the pod unready by itself; only when the failures last beyond staleAfter, when /healthz and
// /livez fail too, does /readyz fail with them. Node eligibility is left to /healthz: a node being
// drained still proxies.
type ProxyHealthServer struct {
	logger     hclog.Logger
	bindAddr   string
	staleAfter time.Duration
	// now is time.Now, replaceable in tests so that staleness needs no sleeping.
	now func() time.Time

	mu            sync.RWMutex
	lastUpdated   time.Time
	oldestPending time.Time // zero when nothing is pending
	nodeEligible  bool

	endpoint Endpoint
}

// NewProxyHealthServer returns a proxy health server for bindAddr ("host:port", e.g.
// DefaultHealthzBindAddress). It does not listen until Start.
func NewProxyHealthServer(logger hclog.Logger, bindAddr string, staleAfter time.Duration) *ProxyHealthServer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &ProxyHealthServer{
		logger:     logger.Named("healthz"),
		bindAddr:   bindAddr,
		staleAfter: staleAfter,
		now:        time.Now,
		// The node is eligible until we learn otherwise, as in kube-proxy.
		nodeEligible: true,
	}
}

// Start listens on the bind address and serves /healthz, /livez and /readyz in the background.
func (h *ProxyHealthServer) Start() error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", h.serveHealthz)
	mux.HandleFunc("/livez", h.serveLivez)
	mux.HandleFunc("/readyz", h.serveReadyz)
	addr, err := h.endpoint.Start(h.bindAddr, mux, h.logger, "proxy healthz server")
	if err != nil {
		return fmt.Errorf("starting proxy healthz: %w", err)
	}
	h.logger.Info("serving proxy healthz", "address", addr.String())
	return nil
}

// Addr returns the address Start listens on (useful with port 0), or nil before Start.
func (h *ProxyHealthServer) Addr() net.Addr { return h.endpoint.Addr() }

// Close stops serving.
func (h *ProxyHealthServer) Close() error {
	if err := h.endpoint.Close(); err != nil {
		return fmt.Errorf("closing proxy healthz: %w", err)
	}
	return nil
}

// Updated records that the dataplane was synced successfully: nothing is pending any more.
func (h *ProxyHealthServer) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oldestPending = time.Time{}
	h.lastUpdated = h.now()
}

// QueuedUpdate records that a change arrived that is not yet applied. Only the oldest pending change
// counts: a steady stream of changes must not keep postponing the deadline.
func (h *ProxyHealthServer) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = h.now()
	}
}

// SetNodeEligible records whether this node may receive LB traffic (false once it is being deleted or
// tainted ToBeDeletedByClusterAutoscaler); it affects /healthz only.
func (h *ProxyHealthServer) SetNodeEligible(eligible bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = eligible
}

// IsHealthy reports the proxy's own health, ignoring node eligibility. It suits
// NewServiceHealthServer's proxyHealthy.
func (h *ProxyHealthServer) IsHealthy() bool {
	healthy, _, _ := h.health()
	return healthy
}

// IsReady reports what /readyz answers: synced at least once, and healthy.
func (h *ProxyHealthServer) IsReady() bool {
	healthy, lastUpdated, _ := h.health()
	return healthy && !lastUpdated.IsZero()
}

// health returns the proxy's health, the last successful sync and the current time.
func (h *ProxyHealthServer) health() (healthy bool, lastUpdated, now time.Time) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now = h.now()
	// As in kube-proxy, a proxy that never synced is healthy (it is starting up).
	healthy = h.lastUpdated.IsZero() || h.oldestPending.IsZero() || now.Sub(h.oldestPending) < h.staleAfter
	return healthy, h.lastUpdated, now
}

// ProxyHealth is the body of /healthz, /livez and /readyz: kube-proxy's (v1.36
// pkg/proxy/healthcheck ProxyHealth) field for field, encoded as kube-proxy encodes it
// (encoding/json, times in RFC 3339 with nanoseconds, no trailing newline), so that monitoring
// written against kube-proxy parses it unchanged. Synced is vipgate's, on /readyz only.
type ProxyHealth struct {
	// LastUpdated is the last successful sync, or the current time when healthy (kube-proxy's
	// compatibility rule: older releases reported every sync loop run, so "recent" means healthy).
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set on /healthz only: false while the node is being deleted or tainted
	// ToBeDeletedByClusterAutoscaler.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	Healthy      bool  `json:"healthy"`
	// Status is the health per IP family ("IPv4", "IPv6"), present once a sync was programmed.
	Status map[string]ProxierHealth `json:"status,omitempty"`
	// Synced is /readyz's: whether a sync was ever programmed.
	Synced *bool `json:"synced,omitempty"`
}

// ProxierHealth is one IP family's health in ProxyHealth.Status (kube-proxy's ProxierHealth).
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// proxyFamilies are the families ProxyHealth.Status reports: the node's Proxier programs the ip
// and the ip6 table in every sync, so both are updated together (kube-proxy keeps one time per
// family because it runs one proxier per family).
var proxyFamilies = []string{"IPv4", "IPv6"}

// Health returns the proxy's health as /livez reports it (no node eligibility, lastUpdated the real
// last sync).
func (h *ProxyHealthServer) Health() ProxyHealth {
	healthy, lastUpdated, now := h.health()
	doc := ProxyHealth{LastUpdated: lastUpdated, CurrentTime: now, Healthy: healthy}
	if !lastUpdated.IsZero() {
		doc.Status = make(map[string]ProxierHealth, len(proxyFamilies))
		for _, f := range proxyFamilies {
			doc.Status[f] = ProxierHealth{LastUpdated: lastUpdated, Healthy: healthy}
		}
	}
	return doc
}

// NodeEligible reports what SetNodeEligible last said (true until it is called).
func (h *ProxyHealthServer) NodeEligible() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.nodeEligible
}

func (h *ProxyHealthServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	doc := h.Health()
	eligible := h.NodeEligible()
	doc.NodeEligible = &eligible
	hzWrite(w, doc, doc.Healthy && eligible)
}

func (h *ProxyHealthServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	doc := h.Health()
	hzWrite(w, doc, doc.Healthy)
}

func (h *ProxyHealthServer) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	doc := h.Health()
	synced := !doc.LastUpdated.IsZero()
	doc.Synced = &synced
	hzWrite(w, doc, doc.Healthy && synced)
}

// hzWrite writes doc with kube-proxy's headers, 200 when ok and 503 otherwise. When ok, lastUpdated
// is the current time, as kube-proxy reports it (older releases did, and monitoring relies on
// "recent"); the per-family times stay the real ones.
func hzWrite(w http.ResponseWriter, doc ProxyHealth, ok bool) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
		doc.LastUpdated = doc.CurrentTime
	}
	out, _ := json.Marshal(doc)
	_, _ = w.Write(out)
}

// Limits of every HTTP server vipgate runs (healthCheckNodePort servers on the node IPs, /healthz,
// the admin endpoint). The health-check servers answer anyone on the LAN; without limits a client
// that opens connections and sends nothing, or keeps them idle, or reads the answer one byte a
// minute, holds a goroutine and a file descriptor each for ever. Every answer is a few hundred
// bytes (/metrics a few MiB at most), every request a GET with a handful of headers.
// They are variables so that tests can shorten them.
var (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 15 * time.Second
	httpWriteTimeout      = 30 * time.Second
	// httpIdleTimeout is above the 5-30 s health-check interval of load balancers, so their
	// keep-alive connections are reused, and far below "for ever".
	httpIdleTimeout    = 60 * time.Second
	httpMaxHeaderBytes = 16 << 10
)

// ListenAndServe listens on addr ("host:port") and serves handler on a NewHTTPServer in the
// background, for every HTTP server vipgate runs. Serving ends with the server's Close; should it
// end otherwise (the listener died), that is logged as "<what> stopped" rather than lost. It
// returns the server and the address it listens on (the port chosen for port 0); an error names
// the address.
func ListenAndServe(addr string, handler http.Handler, logger hclog.Logger, what string) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := NewHTTPServer(handler, logger)
	go func() {
		// Serve returns ErrServerClosed after Close; anything else means the listener died.
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(what+" stopped", "address", ln.Addr().String(), "err", err)
		}
	}()
	return srv, ln.Addr(), nil
}

// Endpoint is one HTTP server of ListenAndServe with its life cycle: Start, Addr, Close, safe for
// concurrent use (the proxy's /healthz, the node's admin endpoint). The zero value is ready to use.
type Endpoint struct {
	mu   sync.Mutex
	srv  *http.Server
	addr net.Addr
}

// Start serves handler on addr in the background (ListenAndServe) and returns the address it
// listens on.
func (e *Endpoint) Start(addr string, handler http.Handler, logger hclog.Logger, what string) (net.Addr, error) {
	srv, bound, err := ListenAndServe(addr, handler, logger, what)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.srv, e.addr = srv, bound
	e.mu.Unlock()
	return bound, nil
}

// Addr is the address Start listens on (useful with port 0), or nil before Start.
func (e *Endpoint) Addr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// Close stops serving, closing the listener and open connections; nothing to do before Start or
// after Close.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	srv := e.srv
	e.srv = nil
	e.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// NewHTTPServer returns an http.Server for handler with vipgate's timeouts and header limit, logging
// its errors (a client that misbehaves) to logger.
func NewHTTPServer(handler http.Handler, logger hclog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
}
