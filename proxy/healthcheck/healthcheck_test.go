package healthcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// hcSyncBuffer is a log sink the HTTP goroutines and the test may use at the same time.
type hcSyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *hcSyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *hcSyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func hcTestLogger(t *testing.T) (hclog.Logger, *hcSyncBuffer) {
	t.Helper()
	buf := &hcSyncBuffer{}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: buf}), buf
}

// hcFreePort returns a TCP port that is free on 127.0.0.1 right now (SyncServices refuses port 0, as a
// Service's healthCheckNodePort is never 0).
var (
	hcPortsMu    sync.Mutex
	hcPortsGiven = map[int]bool{}
)

func hcFreePort(t *testing.T) uint16 {
	t.Helper()
	// A port from the NodePort range (30000-32767), where real healthCheckNodePorts live. It lies below
	// the kernel's ephemeral range (32768-60999), so no other process binding port 0 or connecting out
	// can take it between the moment a health check closes it and the probe that expects "refused"
	// (CI saw exactly that with a port from the ephemeral range).
	hcPortsMu.Lock()
	defer hcPortsMu.Unlock()
	for range 200 {
		port := 30000 + rand.IntN(2768)
		if hcPortsGiven[port] {
			continue // every call returns a port no earlier call returned
		}
		ln, err := net.Listen("tcp", netip.AddrPortFrom(hcLoopback, uint16(port)).String())
		if err != nil {
			continue // in use: try another
		}
		if err := ln.Close(); err != nil {
			t.Fatalf("closing probe listener: %v", err)
		}
		hcPortsGiven[port] = true
		return uint16(port)
	}
	t.Fatalf("no free port in 30000-32767 after 200 tries")
	return 0
}

// hcResponse is what a probe saw.
type hcResponse struct {
	Status      int
	ContentType string
	NoSniff     string
	Body        string
}

var hcClient = &http.Client{
	Timeout: 5 * time.Second,
	// A fresh connection per probe, so a closed health check is seen as closed at once.
	Transport: &http.Transport{DisableKeepAlives: true},
}

func hcGet(t *testing.T, method, url string) (hcResponse, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatalf("building request: %v", err)
	}
	resp, err := hcClient.Do(req)
	if err != nil {
		return hcResponse{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
	return hcResponse{
		Status:      resp.StatusCode,
		ContentType: resp.Header.Get("Content-Type"),
		NoSniff:     resp.Header.Get("X-Content-Type-Options"),
		Body:        string(body),
	}, nil
}

func hcURL(addr netip.Addr, port uint16, path string) string {
	return "http://" + netip.AddrPortFrom(addr, port).String() + path
}

func hcMustGet(t *testing.T, method, url string) hcResponse {
	t.Helper()
	r, err := hcGet(t, method, url)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func hcWant(status int, key cluster.ServiceKey, count int, healthy bool) hcResponse {
	return hcResponse{
		Status:      status,
		ContentType: "application/json",
		NoSniff:     "nosniff",
		Body:        string(hcBody(key, count, healthy)),
	}
}

func hcRefused(t *testing.T, url string) {
	t.Helper()
	_, err := hcGet(t, http.MethodGet, url)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET %s: got err %v, want connection refused", url, err)
	}
}

var hcLoopback = netip.MustParseAddr("127.0.0.1")

func TestHealthCheckBodyMatchesKubeProxy(t *testing.T) {
	// The exact bytes kube-proxy writes (dedented, tab-indented, no trailing newline).
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"n\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	got := string(hcBody(cluster.ServiceKey{Namespace: "ns", Name: "n"}, 2, true))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	// And it is the JSON document LB tooling parses.
	var doc struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
	if err := json.Unmarshal([]byte(got), &doc); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	if doc.Service.Namespace != "ns" || doc.Service.Name != "n" || doc.LocalEndpoints != 2 || !doc.ServiceProxyHealthy {
		t.Errorf("parsed body = %+v", doc)
	}
}

func TestHealthCheckServerCountsDriveStatus(t *testing.T) {
	logger, _ := hcTestLogger(t)
	var proxyHealthy atomic.Bool
	proxyHealthy.Store(true)
	s := NewServiceHealthServer(logger, []netip.Addr{hcLoopback}, proxyHealthy.Load)
	t.Cleanup(func() { _ = s.Close() })

	web := cluster.ServiceKey{Namespace: "demo", Name: "web"}
	dns := cluster.ServiceKey{Namespace: "demo", Name: "dns"}
	webPort, dnsPort := hcFreePort(t), hcFreePort(t)
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{web: webPort, dns: dnsPort}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}

	steps := []struct {
		name    string
		local   map[cluster.ServiceKey]int
		healthy bool
		web     hcResponse
		dns     hcResponse
	}{
		{"no endpoints yet", nil, true,
			hcWant(503, web, 0, true), hcWant(503, dns, 0, true)},
		{"web has two local endpoints", map[cluster.ServiceKey]int{web: 2}, true,
			hcWant(200, web, 2, true), hcWant(503, dns, 0, true)},
		{"web loses them, dns gains one", map[cluster.ServiceKey]int{web: 0, dns: 1}, true,
			hcWant(503, web, 0, true), hcWant(200, dns, 1, true)},
		{"proxy unhealthy fails every Service", map[cluster.ServiceKey]int{web: 3, dns: 1}, false,
			hcWant(503, web, 3, false), hcWant(503, dns, 1, false)},
		{"proxy healthy again", map[cluster.ServiceKey]int{web: 3, dns: 1}, true,
			hcWant(200, web, 3, true), hcWant(200, dns, 1, true)},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			s.SyncEndpoints(step.local)
			proxyHealthy.Store(step.healthy)
			// Any path and method answers, as in kube-proxy.
			if diff := cmp.Diff(step.web, hcMustGet(t, http.MethodGet, hcURL(hcLoopback, webPort, "/"))); diff != "" {
				t.Errorf("web (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(step.dns, hcMustGet(t, http.MethodPost, hcURL(hcLoopback, dnsPort, "/any/path?x=1"))); diff != "" {
				t.Errorf("dns (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHealthCheckServerOpensAndClosesByDiff(t *testing.T) {
	logger, _ := hcTestLogger(t)
	s := NewServiceHealthServer(logger, []netip.Addr{hcLoopback}, nil)
	t.Cleanup(func() { _ = s.Close() })

	a := cluster.ServiceKey{Namespace: "ns", Name: "a"}
	b := cluster.ServiceKey{Namespace: "ns", Name: "b"}
	aPort, bPort, bPort2 := hcFreePort(t), hcFreePort(t), hcFreePort(t)
	s.SyncEndpoints(map[cluster.ServiceKey]int{a: 1, b: 1})

	if err := s.SyncServices(map[cluster.ServiceKey]uint16{a: aPort, b: bPort}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	hcMustGet(t, http.MethodGet, hcURL(hcLoopback, bPort, "/"))

	// b moves to another port, a stays: b's old port closes, a keeps its listener.
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{a: aPort, b: bPort2}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	hcRefused(t, hcURL(hcLoopback, bPort, "/"))
	if diff := cmp.Diff(hcWant(200, b, 1, true), hcMustGet(t, http.MethodGet, hcURL(hcLoopback, bPort2, "/"))); diff != "" {
		t.Errorf("b on new port (-want +got):\n%s", diff)
	}

	// b goes away entirely.
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{a: aPort}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	hcRefused(t, hcURL(hcLoopback, bPort2, "/"))
	if diff := cmp.Diff(hcWant(200, a, 1, true), hcMustGet(t, http.MethodGet, hcURL(hcLoopback, aPort, "/"))); diff != "" {
		t.Errorf("a (-want +got):\n%s", diff)
	}

	// Port 0 is refused with an error; a keeps working.
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{a: aPort, b: 0}); err == nil {
		t.Errorf("SyncServices with port 0: got nil error")
	}
	hcMustGet(t, http.MethodGet, hcURL(hcLoopback, aPort, "/"))

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	hcRefused(t, hcURL(hcLoopback, aPort, "/"))
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{a: aPort}); err == nil {
		t.Errorf("SyncServices after Close: got nil error")
	}
}

func TestHealthCheckServerPortInUse(t *testing.T) {
	logger, logs := hcTestLogger(t)
	s := NewServiceHealthServer(logger, []netip.Addr{hcLoopback}, nil)
	t.Cleanup(func() { _ = s.Close() })

	blocker, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	t.Cleanup(func() { _ = blocker.Close() })
	busyPort := uint16(blocker.Addr().(*net.TCPAddr).Port)

	busy := cluster.ServiceKey{Namespace: "ns", Name: "busy"}
	fine := cluster.ServiceKey{Namespace: "ns", Name: "fine"}
	finePort := hcFreePort(t)
	want := map[cluster.ServiceKey]uint16{busy: busyPort, fine: finePort}
	s.SyncEndpoints(map[cluster.ServiceKey]int{busy: 1, fine: 1})

	// Three syncs while the port is taken: a bind failure is not an error for the caller, is logged at
	// error level once, and the other Service works throughout.
	for i := range 3 {
		if err := s.SyncServices(want); err != nil {
			t.Fatalf("sync %d: SyncServices: %v", i, err)
		}
		if diff := cmp.Diff(hcWant(200, fine, 1, true), hcMustGet(t, http.MethodGet, hcURL(hcLoopback, finePort, "/"))); diff != "" {
			t.Errorf("sync %d: fine (-want +got):\n%s", i, diff)
		}
	}
	if n := strings.Count(logs.String(), "[ERROR]"); n != 1 {
		t.Errorf("got %d error log lines for the busy port, want 1; logs:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "service=ns/busy") {
		t.Errorf("error log does not name the Service; logs:\n%s", logs.String())
	}

	// The port is freed: the next sync opens the health check.
	if err := blocker.Close(); err != nil {
		t.Fatalf("closing blocker: %v", err)
	}
	if err := s.SyncServices(want); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	if diff := cmp.Diff(hcWant(200, busy, 1, true), hcMustGet(t, http.MethodGet, hcURL(hcLoopback, busyPort, "/healthz"))); diff != "" {
		t.Errorf("busy after retry (-want +got):\n%s", diff)
	}
}

func TestHealthCheckServerListensOnlyOnGivenAddresses(t *testing.T) {
	v6 := netip.MustParseAddr("::1")
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	logger, _ := hcTestLogger(t)
	key := cluster.ServiceKey{Namespace: "ns", Name: "v6only"}

	// Only ::1 is configured: 127.0.0.1 must not answer.
	s := NewServiceHealthServer(logger, []netip.Addr{v6}, nil)
	t.Cleanup(func() { _ = s.Close() })
	port := hcFreePort(t)
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{key: port}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	s.SyncEndpoints(map[cluster.ServiceKey]int{key: 1})
	if diff := cmp.Diff(hcWant(200, key, 1, true), hcMustGet(t, http.MethodGet, hcURL(v6, port, "/"))); diff != "" {
		t.Errorf("[::1] (-want +got):\n%s", diff)
	}
	hcRefused(t, hcURL(hcLoopback, port, "/"))

	// Both addresses: one listener each, both answer.
	both := NewServiceHealthServer(logger, []netip.Addr{hcLoopback, v6}, nil)
	t.Cleanup(func() { _ = both.Close() })
	port2 := hcFreePort(t)
	if err := both.SyncServices(map[cluster.ServiceKey]uint16{key: port2}); err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	for _, a := range []netip.Addr{hcLoopback, v6} {
		if diff := cmp.Diff(hcWant(503, key, 0, true), hcMustGet(t, http.MethodGet, hcURL(a, port2, "/"))); diff != "" {
			t.Errorf("%s (-want +got):\n%s", a, diff)
		}
	}
}

// hcFakeClock is a settable clock for ProxyHealthServer.
type hcFakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *hcFakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *hcFakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestProxyHealthServer(t *testing.T) {
	logger, _ := hcTestLogger(t)
	clock := &hcFakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	h := NewProxyHealthServer(logger, "127.0.0.1:0", 30*time.Second)
	h.now = clock.Now
	if err := h.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	base := "http://" + h.Addr().String()

	type probe struct {
		Healthz, Livez, Readyz int
	}
	check := func(t *testing.T, want probe) {
		t.Helper()
		hz := hcMustGet(t, http.MethodGet, base+"/healthz")
		lz := hcMustGet(t, http.MethodGet, base+"/livez")
		rz := hcMustGet(t, http.MethodGet, base+"/readyz")
		if diff := cmp.Diff(want, probe{hz.Status, lz.Status, rz.Status}); diff != "" {
			t.Errorf("status (-want +got):\n%s", diff)
		}
		if got := h.IsReady(); got != (want.Readyz == 200) {
			t.Errorf("IsReady = %v, /readyz %d", got, want.Readyz)
		}
		var rdoc map[string]any
		if err := json.Unmarshal([]byte(rz.Body), &rdoc); err != nil {
			t.Fatalf("readyz body %q is not JSON: %v", rz.Body, err)
		}
		if _, ok := rdoc["synced"]; !ok {
			t.Errorf("readyz body %q lacks \"synced\"", rz.Body)
		}
		for _, r := range []hcResponse{hz, lz, rz} {
			if r.ContentType != "application/json" || r.NoSniff != "nosniff" {
				t.Errorf("headers: %+v", r)
			}
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(hz.Body), &doc); err != nil {
			t.Fatalf("healthz body %q is not JSON: %v", hz.Body, err)
		}
		for _, k := range []string{"lastUpdated", "currentTime", "nodeEligible"} {
			if _, ok := doc[k]; !ok {
				t.Errorf("healthz body %q lacks %q", hz.Body, k)
			}
		}
		if strings.Contains(hz.Body, "m=") {
			t.Errorf("healthz body %q leaks the monotonic clock", hz.Body)
		}
	}

	steps := []struct {
		name string
		do   func()
		want probe
	}{
		// Starting up is healthy (kubelet must not restart a proxy that is still starting) but not
		// ready: no Service works through this node before the first sync is in the kernel.
		{"starting up", func() {}, probe{200, 200, 503}},
		{"queued before the first sync is still starting up", func() { h.QueuedUpdate(); clock.Advance(time.Minute) }, probe{200, 200, 503}},
		{"synced", h.Updated, probe{200, 200, 200}},
		{"idle for long is fine", func() { clock.Advance(time.Hour) }, probe{200, 200, 200}},
		// A failed sync keeps the previous rules, which still serve: ready until it is late.
		{"change queued, not late yet", func() { h.QueuedUpdate(); clock.Advance(20 * time.Second) }, probe{200, 200, 200}},
		{"more changes do not move the deadline", func() { h.QueuedUpdate(); clock.Advance(11 * time.Second) }, probe{503, 503, 503}},
		{"applied", h.Updated, probe{200, 200, 200}},
		{"node being deleted fails healthz only", func() { h.SetNodeEligible(false) }, probe{503, 200, 200}},
		{"node eligible again", func() { h.SetNodeEligible(true) }, probe{200, 200, 200}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			step.do()
			check(t, step.want)
		})
	}
	if h.IsHealthy() != true {
		t.Errorf("IsHealthy = false at the end")
	}

	// The bodies, byte for byte as kube-proxy v1.36 writes them (encoding/json of its ProxyHealth):
	// unhealthy reports the real last update, healthy the current time; /healthz adds nodeEligible,
	// /livez ignores it; each family's status carries the real last update.
	h.SetNodeEligible(false)
	h.QueuedUpdate()
	clock.Advance(time.Minute)
	bodies := map[string]hcResponse{}
	for _, p := range []string{"/healthz", "/livez", "/readyz"} {
		bodies[p] = hcMustGet(t, http.MethodGet, base+p)
	}
	fam := `"status":{"IPv4":{"lastUpdated":"2026-01-02T04:05:36Z","healthy":false},"IPv6":{"lastUpdated":"2026-01-02T04:05:36Z","healthy":false}}`
	want := map[string]hcResponse{
		"/healthz": {Status: 503, Body: `{"lastUpdated":"2026-01-02T04:05:36Z","currentTime":"2026-01-02T04:06:36Z","nodeEligible":false,"healthy":false,` + fam + `}`},
		"/livez":   {Status: 503, Body: `{"lastUpdated":"2026-01-02T04:05:36Z","currentTime":"2026-01-02T04:06:36Z","healthy":false,` + fam + `}`},
		"/readyz":  {Status: 503, Body: `{"lastUpdated":"2026-01-02T04:05:36Z","currentTime":"2026-01-02T04:06:36Z","healthy":false,` + fam + `,"synced":true}`},
	}
	for p, w := range want {
		if got := bodies[p]; got.Status != w.Status || got.Body != w.Body {
			t.Errorf("%s: %d %s\nwant %d %s", p, got.Status, got.Body, w.Status, w.Body)
		}
	}
	h.Updated()
	clock.Advance(time.Second)
	// Healthy but the node still not eligible: /healthz alone fails, says why, and (a 503) reports
	// the real last update, as kube-proxy; /livez answers 200 with the current time.
	hz := hcMustGet(t, http.MethodGet, base+"/healthz")
	wantHz := `{"lastUpdated":"2026-01-02T04:06:36Z","currentTime":"2026-01-02T04:06:37Z","nodeEligible":false,"healthy":true,` +
		`"status":{"IPv4":{"lastUpdated":"2026-01-02T04:06:36Z","healthy":true},"IPv6":{"lastUpdated":"2026-01-02T04:06:36Z","healthy":true}}}`
	if hz.Status != 503 || hz.Body != wantHz {
		t.Errorf("/healthz of a healthy proxy on a node being deleted: %d %s\nwant 503 %s", hz.Status, hz.Body, wantHz)
	}
	if lz := hcMustGet(t, http.MethodGet, base+"/livez"); lz.Status != 200 || strings.Contains(lz.Body, "nodeEligible") ||
		!strings.HasPrefix(lz.Body, `{"lastUpdated":"2026-01-02T04:06:37Z",`) {
		t.Errorf("/livez of a healthy proxy on a node being deleted: %d %s", lz.Status, lz.Body)
	}
}

// TestProxyHealthStartingBody: before the first sync the body has no per-family status (kube-proxy
// reports only the families that synced) and /readyz says synced false.
func TestProxyHealthStartingBody(t *testing.T) {
	logger, _ := hcTestLogger(t)
	clock := &hcFakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	h := NewProxyHealthServer(logger, "127.0.0.1:0", 30*time.Second)
	h.now = clock.Now
	if err := h.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	base := "http://" + h.Addr().String()
	for p, w := range map[string]hcResponse{
		"/healthz": {Status: 200, Body: `{"lastUpdated":"2026-01-02T03:04:05Z","currentTime":"2026-01-02T03:04:05Z","nodeEligible":true,"healthy":true}`},
		"/livez":   {Status: 200, Body: `{"lastUpdated":"2026-01-02T03:04:05Z","currentTime":"2026-01-02T03:04:05Z","healthy":true}`},
		"/readyz":  {Status: 503, Body: `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2026-01-02T03:04:05Z","healthy":true,"synced":false}`},
	} {
		if got := hcMustGet(t, http.MethodGet, base+p); got.Status != w.Status || got.Body != w.Body {
			t.Errorf("%s: %d %s\nwant %d %s", p, got.Status, got.Body, w.Status, w.Body)
		}
	}
}

// TestHTTPServerLimits: the healthCheckNodePort servers (and every server NewHTTPServer makes) close a
// connection that sends no request, close an idle keep-alive connection, and refuse oversized headers.
// The timeouts are shortened; the test waits for the close, it does not time it.
func TestHTTPServerLimits(t *testing.T) {
	defer func(h, i time.Duration) { httpReadHeaderTimeout, httpIdleTimeout = h, i }(httpReadHeaderTimeout, httpIdleTimeout)
	httpReadHeaderTimeout, httpIdleTimeout = 200*time.Millisecond, 200*time.Millisecond
	srv := NewHTTPServer(http.NotFoundHandler(), hclog.NewNullLogger())
	if srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 || srv.ReadHeaderTimeout == 0 || srv.MaxHeaderBytes == 0 {
		t.Errorf("a limit is unset: %+v", srv)
	}

	logger, _ := hcTestLogger(t)
	s := NewServiceHealthServer(logger, []netip.Addr{hcLoopback}, nil)
	t.Cleanup(func() { _ = s.Close() })
	web := cluster.ServiceKey{Namespace: "demo", Name: "web"}
	port := hcFreePort(t)
	if err := s.SyncServices(map[cluster.ServiceKey]uint16{web: port}); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(hcLoopback, port).String()
	// closed reads from c until the server closes it (a minute at most: a hang fails the test).
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.Copy(io.Discard, c)
		return err == nil // EOF: the server closed it
	}

	// Nothing sent: closed after the header timeout.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closed(c) {
		t.Error("a connection that sends nothing is kept open")
	}

	// One request, then idle: answered, then closed.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := io.WriteString(c2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(time.Minute))
	var got bytes.Buffer
	if _, err := io.Copy(&got, c2); err != nil {
		t.Errorf("idle keep-alive connection: %v (want the server to close it)", err)
	}
	if !strings.Contains(got.String(), "503") {
		t.Errorf("no answer before the close: %q", got.String())
	}

	// Oversized headers: 431.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB header: %d, want 431", resp.StatusCode)
	}
}
