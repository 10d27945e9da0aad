package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/test/lab"
)

// Polling of the dataplane tests: a manifest change shows in the kernel within about a second
// (debounce plus sync), so five seconds is generous, and 100 ms keeps the measured latency honest.
const (
	dpSettleTimeout = 5 * time.Second
	dpPollInterval  = 100 * time.Millisecond
)

// dpLab is a lab with `vipgate node` running in some of its nodes, all reading one dpManifest
// directory.
type dpLab struct {
	*lab.Lab
	// Manifests is the directory every vipgate reads.
	Manifests string
	// Bin is the vipgate binary.
	Bin string
	// Configs holds each node's NodeConfig path, Procs its vipgate process.
	Configs map[string]string
	Procs   map[string]*lab.Proc
}

// dpNodeConfigYAML is the NodeConfig of a lab node; zone may be empty.
func dpNodeConfigYAML(n *lab.Node, zone string) string {
	s := fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: %s
nodeIPs: [%s, %q]
clusterCIDRs: [%s, %q]
serviceCIDRs: [%s, %q]
masqueradeAll: false
healthzBindAddress: "127.0.0.1:10256"
logLevel: debug
`, n.Name, n.IPv4, n.IPv6, lab.ClusterCIDRv4, lab.ClusterCIDRv6, lab.ServiceCIDRv4, lab.ServiceCIDRv6) +
		// spec.externalIPs are off by default (KEP-5707); the lab's VIP ranges allow them.
		ndExternalIPsLab
	if zone != "" {
		s += "nodeZone: " + zone + "\n"
	}
	return s
}

// dpStartVIPGate writes each node's NodeConfig (zones by node name) and starts `vipgate node` there,
// then waits until every one has done its first sync. On failure the logs are in the test output.
func dpStartVIPGate(t *testing.T, l *lab.Lab, zones map[string]string) *dpLab {
	t.Helper()
	d := &dpLab{
		Lab:       l,
		Manifests: filepath.Join(t.TempDir(), "manifests"),
		Bin:       vipgateBinary(t),
		Configs:   map[string]string{},
		Procs:     map[string]*lab.Proc{},
	}
	// vipgate refuses a world-writable manifest directory; 0755 is what a ConfigMap mount gives.
	if err := os.Mkdir(d.Manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes() {
		cfg := filepath.Join(l.Dir(), n.Name+"-nodeconfig.yaml")
		if err := os.WriteFile(cfg, []byte(dpNodeConfigYAML(n, zones[n.Name])), 0o644); err != nil {
			t.Fatal(err)
		}
		d.Configs[n.Name] = cfg
		p, err := l.Start(n.Name, filepath.Join(l.Dir(), n.Name+"-vipgate.log"), d.Bin, "node", "--config", cfg, "--manifests", d.Manifests)
		if err != nil {
			t.Fatal(err)
		}
		d.Procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range d.Procs {
				t.Logf("vipgate log of %s (last 40 lines):\n%s", name, p.Tail(40))
			}
		}
	})
	for name, p := range d.Procs {
		d.waitLog(t, name, "synced", 10*time.Second)
		if exited, err := p.Exited(); exited {
			t.Fatalf("vipgate on %s exited: %v\n%s", name, err, p.Tail(20))
		}
	}
	return d
}

// waitLog waits until the node's vipgate log contains substr.
func (d *dpLab) waitLog(t *testing.T, node, substr string, timeout time.Duration) {
	t.Helper()
	p := d.Procs[node]
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Log(), substr) {
		if exited, err := p.Exited(); exited {
			t.Fatalf("vipgate on %s exited: %v\n%s", node, err, p.Tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("vipgate on %s: no %q in its log after %v:\n%s", node, substr, timeout, p.Tail(20))
		}
		time.Sleep(dpPollInterval / 2)
	}
}

// write puts content into the manifest file name, atomically (a dot file renamed into place, as
// ConfigMap volumes and editors do, so vipgate never reads half a file), and returns the time of the
// rename.
func (d *dpLab) write(t *testing.T, name, content string) time.Time {
	t.Helper()
	tmp := filepath.Join(d.Manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.Manifests, name)); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// probe sends one probe and fails the test only if it could not run at all.
func (d *dpLab) probe(t *testing.T, from, proto string, to netip.AddrPort) lab.ProbeResult {
	t.Helper()
	r, err := d.Probe(from, proto, to.String())
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return r
}

// probeN sends n probes (each a new flow) and returns every result, so that callers can pair the
// answering pod with the source it saw.
func (d *dpLab) probeN(t *testing.T, from, proto string, to netip.AddrPort, n int) []lab.ProbeResult {
	t.Helper()
	out := make([]lab.ProbeResult, n)
	for i := range out {
		out[i] = d.probe(t, from, proto, to)
	}
	return out
}

// dpEventually polls cond every dpPollInterval until it returns "" (the wanted behaviour shows) or
// timeout passes, and fails the test with cond's last complaint.
func dpEventually(t *testing.T, timeout time.Duration, what string, cond func() string) {
	t.Helper()
	dpPoll(t, timeout, what, cond)
}

// dpPoll is dpEventually that also brackets the moment the behaviour appeared: after lastFail (the
// start of the last check that did not see it; zero if the first check did) and before seen (the end
// of the first check that did). A check that waits for a probe timeout widens the bracket by that
// timeout, which is why both ends are reported.
func dpPoll(t *testing.T, timeout time.Duration, what string, cond func() string) (lastFail, seen time.Time) {
	t.Helper()
	start := time.Now()
	for {
		checked := time.Now()
		why := cond()
		if why == "" {
			return lastFail, time.Now()
		}
		lastFail = checked
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v: %s", what, timeout, why)
		}
		time.Sleep(dpPollInterval)
	}
}

// expectAnswer is a condition for dpEventually: a probe answered by one of pods (any pod when none are given)
// seeing a source in srcs (any source when none are given).
func (d *dpLab) expectAnswer(t *testing.T, from, proto string, to netip.AddrPort, pods []string, srcs ...netip.Addr) func() string {
	return func() string {
		r := d.probe(t, from, proto, to)
		return dpJudge(r, pods, srcs)
	}
}

// expectError is a condition for dpEventually: a probe that fails with kind.
func (d *dpLab) expectError(t *testing.T, from, proto string, to netip.AddrPort, kind string) func() string {
	return func() string {
		r := d.probe(t, from, proto, to)
		if r.Err != kind {
			return fmt.Sprintf("%s %s from %s: %v, want error=%s", proto, to, from, r, kind)
		}
		return ""
	}
}

// dpJudge says what is wrong with r, or "" if one of pods answered seeing one of srcs.
func dpJudge(r lab.ProbeResult, pods []string, srcs []netip.Addr) string {
	switch {
	case !r.OK():
		return fmt.Sprintf("%v, want an answer from %v", r, pods)
	case len(pods) > 0 && !slices.Contains(pods, r.Pod):
		return fmt.Sprintf("%v, want one of %v", r, pods)
	case len(srcs) > 0 && !slices.Contains(srcs, r.Src.Addr()):
		return fmt.Sprintf("%v, want source one of %v", r, srcs)
	}
	return ""
}

// dpTally counts answers per pod ("error=kind" for failures).
func dpTally(rs []lab.ProbeResult) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		if r.OK() {
			m[r.Pod]++
		} else {
			m["error="+r.Err]++
		}
	}
	return m
}

// ap builds a target from an address text and a port.
func dpAP(addr string, port int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port))
}

// dpNames returns the pods' names.
func dpNames(pods ...*lab.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// httpGet fetches url with curl inside the role's namespace and returns the status code and body.
func (d *dpLab) httpGet(role, url string) (int, string, error) {
	out, err := d.Exec(role, "curl", "-s", "-m", "2", "-w", "\n%{http_code}", url)
	if err != nil {
		return 0, out, err
	}
	i := strings.LastIndex(out, "\n")
	code, err := strconv.Atoi(strings.TrimSpace(out[i+1:]))
	if err != nil {
		return 0, out, fmt.Errorf("curl output without a status code: %q", out)
	}
	return code, out[:i], nil
}

// dpHealthBody is the JSON of a healthCheckNodePort answer (kube-proxy's format).
type dpHealthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func dpParseHealthBody(body string) (dpHealthBody, error) {
	var hb dpHealthBody
	if err := json.Unmarshal([]byte(body), &hb); err != nil {
		return hb, fmt.Errorf("health check body %q: %w", body, err)
	}
	return hb, nil
}

// dpListenUDPIn opens a UDP socket bound to laddr inside the network namespace ns (a name under
// /var/run/netns). The socket stays in that namespace for its whole life, whichever thread later
// uses it, so the test process can act as a client with a fixed source port: the one thing the lab
// probe cannot do, and what UDP conntrack cleanup is about.
func dpListenUDPIn(ns string, laddr netip.AddrPort) (*net.UDPConn, error) {
	type result struct {
		c   *net.UDPConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The namespace belongs to this OS thread only while it is locked. If switching back fails,
		// the goroutine ends still locked, and Go then retires the thread instead of reusing it in
		// the wrong namespace.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("opening own netns: %w", err)}
			return
		}
		defer orig.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("opening netns %s: %w", ns, err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering netns %s: %w", ns, err)}
			return
		}
		c, lerr := net.ListenUDP("udp", net.UDPAddrFromAddrPort(laddr))
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			if c != nil {
				c.Close()
			}
			ch <- result{err: fmt.Errorf("leaving netns %s: %w", ns, err)}
			return // still locked: the thread is discarded
		}
		runtime.UnlockOSThread()
		if lerr != nil {
			lerr = fmt.Errorf("listening on %s in %s: %w", laddr, ns, lerr)
		}
		ch <- result{c, lerr}
	}()
	r := <-ch
	return r.c, r.err
}

// dpUdpAsk sends one datagram from c to dst and returns the lab server's answer.
func dpUdpAsk(c *net.UDPConn, dst netip.AddrPort, timeout time.Duration) (lab.ProbeResult, error) {
	if _, err := c.WriteToUDPAddrPort([]byte("probe\n"), dst); err != nil {
		return lab.ProbeResult{}, fmt.Errorf("sending to %s: %w", dst, err)
	}
	buf := make([]byte, 512)
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return lab.ProbeResult{}, err
	}
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return lab.ProbeResult{Err: "timeout"}, nil
		}
		return lab.ProbeResult{Err: "failed", Output: err.Error()}, nil
	}
	r, ok := lab.ParseProbeOutput(string(buf[:n]))
	if !ok {
		return lab.ProbeResult{}, fmt.Errorf("unexpected answer %q", buf[:n])
	}
	return r, nil
}

// conntrackEntries lists the role's conntrack entries of proto that were sent to origDst (a Service
// address) and whose reply comes from replySrc (the endpoint the flow was DNATed to).
func (d *dpLab) conntrackEntries(role, proto string, origDst, replySrc netip.Addr) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := d.ExecContext(ctx, role, "conntrack", "-L", "-p", proto, "--orig-dst", origDst.String(), "--reply-src", replySrc.String())
	if err != nil {
		return nil, err
	}
	var entries []string
	for _, line := range strings.Split(out, "\n") {
		// The summary line ("conntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.")
		// goes to stderr, which Exec merges: keep only entry lines.
		if strings.HasPrefix(line, proto) {
			entries = append(entries, line)
		}
	}
	return entries, nil
}
