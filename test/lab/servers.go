package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LabServerEnv names the environment variable holding a prebuilt labserver.
const LabServerEnv = "VIPGATE_LABSERVER"

// LabServerPackage is the import path of the lab server command.
const LabServerPackage = "github.com/vipgate/vipgate/test/labserver"

// LabServer returns the path of the labserver binary: Spec.LabServer, else
// $VIPGATE_LABSERVER, else one built with `go build` once per process.
func (l *Lab) LabServer() (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.labserver != "" {
		return l.labserver, nil
	}
	path := l.spec.LabServer
	if path == "" {
		path = os.Getenv(LabServerEnv)
	}
	if path == "" {
		var err error
		if path, err = builtLabServer(); err != nil {
			return "", err
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("lab: labserver path: %w", err)
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("lab: labserver: %w", err)
	}
	l.labserver = abs
	return abs, nil
}

// builtLabServer builds the labserver once per process, so a test binary
// with many labs pays for the link step once. The directory carries the pid,
// so SweepStale removes it once this process is gone.
var builtLabServer = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-bin-", workDirPrefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("lab: creating build dir: %w", err)
	}
	out := filepath.Join(dir, "labserver")
	if err := BuildBinary(LabServerPackage, out); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return out, nil
})

// BuildBinary builds a main package of this module (an import path such as
// "github.com/vipgate/vipgate/cmd/vipgate") into the file out.
func BuildBinary(pkg, out string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command(GoBinary(), "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// GoBinary finds the go command: from PATH, else (sudo often drops the Go directory from PATH) the
// Go installation this program was built with.
func GoBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	// The deprecation is about binaries copied to another machine; the lab's programs (tests,
	// `go run` tools) run where they were built, so the build's GOROOT holds the right go.
	//lint:ignore SA1019 see above: the build's GOROOT is the one wanted here
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// ModuleRoot finds the vipgate module directory: from the working directory
// upwards, else from this source file's location.
func ModuleRoot() (string, error) {
	isRoot := func(dir string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		return err == nil && strings.Contains(string(b), "module github.com/vipgate/vipgate\n")
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			if isRoot(dir) {
				return dir, nil
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Dir(filepath.Dir(filepath.Dir(file))) // test/lab/servers.go -> root
		if isRoot(dir) {
			return dir, nil
		}
	}
	return "", errors.New("lab: cannot find the vipgate module (run from inside it or set " + LabServerEnv + ")")
}

// StartServers starts (or restarts) a lab server in every pod: TCP and UDP
// on the lab's server ports and HTTP on its HTTP port, both families. It
// returns once all of them listen.
func (l *Lab) StartServers() error {
	bin, err := l.LabServer()
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.servers
	l.servers = nil
	l.mu.Unlock()
	for _, p := range old {
		p.stop(2 * time.Second)
	}

	var ports []string
	for _, p := range l.spec.ServerPorts {
		ports = append(ports, strconv.Itoa(p))
	}
	type started struct {
		proc  *Proc
		ready string
	}
	var all []started
	for _, pod := range l.Pods() {
		ready := filepath.Join(l.dir, pod.Name+".ready")
		_ = os.Remove(ready)
		proc, err := l.Start(pod.Name, filepath.Join(l.dir, pod.Name+"-labserver.log"), bin, "serve",
			"--name", pod.Name, "--port", strings.Join(ports, ","),
			"--http", strconv.Itoa(l.spec.HTTPPort), "--ready", ready)
		if err != nil {
			return err
		}
		all = append(all, started{proc, ready})
	}
	l.mu.Lock()
	for _, s := range all {
		l.servers = append(l.servers, s.proc)
	}
	l.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for _, s := range all {
		for {
			if _, err := os.Stat(s.ready); err == nil {
				break
			}
			if exited, _ := s.proc.Exited(); exited {
				return fmt.Errorf("lab: server in %s exited: %s", s.proc.Role, s.proc.Tail(10))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("lab: server in %s not ready after 10s: %s", s.proc.Role, s.proc.Tail(10))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	l.logf("lab servers up in %d pods (ports %s, http %d)", len(all), strings.Join(ports, ","), l.spec.HTTPPort)
	return nil
}

// Server returns the lab server process of a pod (nil if none runs), so a
// test can stop a backend.
func (l *Lab) Server(pod string) *Proc {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.servers {
		if p.Role == pod {
			return p
		}
	}
	return nil
}

// ProbeResult is the outcome of one probe.
type ProbeResult struct {
	// Pod is the name of the pod that answered ("" on error).
	Pod string
	// Src is the client address the server saw, after any SNAT.
	Src netip.AddrPort
	// Dst is the address the server was reached at, after any DNAT.
	Dst netip.AddrPort
	// Err is "" on success, else refused, timeout, reset, unreachable,
	// prohibited, blocked, closed or failed.
	Err string
	// Output is the probe's raw output.
	Output string
}

// OK reports whether a server answered.
func (r ProbeResult) OK() bool { return r.Err == "" && r.Pod != "" }

// String renders the result for logs.
func (r ProbeResult) String() string {
	if r.Err != "" {
		return "error=" + r.Err
	}
	return fmt.Sprintf("pod=%s src=%s dst=%s", r.Pod, r.Src, r.Dst)
}

// ProbeTimeout is the per-probe timeout of Probe and ProbeMany.
var ProbeTimeout = time.Second

// Probe connects (tcp), sends a datagram (udp) or GETs / (http) from the role's namespace
// to hostport and reports who answered. A network failure is a result (Err),
// not an error; the error is for a probe that could not run at all.
func (l *Lab) Probe(fromRole, proto, hostport string) (ProbeResult, error) {
	bin, err := l.LabServer()
	if err != nil {
		return ProbeResult{}, err
	}
	if proto != "tcp" && proto != "udp" && proto != "http" {
		return ProbeResult{}, fmt.Errorf("lab: probe protocol %q, want tcp, udp or http", proto)
	}
	out, runErr := l.Exec(fromRole, bin, "probe", "--"+proto, hostport, "--timeout", ProbeTimeout.String())
	r, ok := ParseProbeOutput(out)
	if !ok {
		if runErr == nil {
			runErr = errors.New("no reply line")
		}
		return ProbeResult{}, fmt.Errorf("lab: probe %s %s from %s: %w", proto, hostport, fromRole, runErr)
	}
	return r, nil
}

// ParseProbeOutput reads labserver probe output: a reply line or an error line.
func ParseProbeOutput(out string) (ProbeResult, bool) {
	for _, line := range strings.Split(out, "\n") {
		f := kv(line)
		if kind, ok := f["error"]; ok {
			return ProbeResult{Err: kind, Output: out}, true
		}
		if name, ok := f["name"]; ok {
			r := ProbeResult{Pod: name, Output: out}
			r.Src, _ = netip.ParseAddrPort(f["src"])
			r.Dst, _ = netip.ParseAddrPort(f["dst"])
			return r, true
		}
	}
	return ProbeResult{}, false
}

// ProbeSummary is the outcome of ProbeMany.
type ProbeSummary struct {
	Sent, OK, Lost int
	// MaxGap is the longest outage: from the first lost probe of the longest
	// loss run to the next successful probe. MaxGapProbes is that run's length.
	MaxGap       time.Duration
	MaxGapProbes int
	// Pods counts answers per pod, Sources per source address seen by the
	// server, Errors failures per kind.
	Pods, Sources, Errors map[string]int
	Output                string
}

// ProbeMany sends count probes (a new flow each) at the given interval and
// summarizes them. count is at most 100000.
func (l *Lab) ProbeMany(fromRole, proto, hostport string, count int, interval time.Duration) (ProbeSummary, error) {
	bin, err := l.LabServer()
	if err != nil {
		return ProbeSummary{}, err
	}
	// The whole run is bounded: schedule plus one timeout plus slack.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*interval+ProbeTimeout+time.Minute)
	defer cancel()
	out, runErr := l.ExecContext(ctx, fromRole, bin, "probe", "--"+proto, hostport, "--timeout", ProbeTimeout.String(),
		"--count", strconv.Itoa(count), "--interval", interval.String())
	s, ok := ParseProbeSummary(out)
	if !ok {
		if runErr == nil {
			runErr = errors.New("no summary line")
		}
		return ProbeSummary{}, fmt.Errorf("lab: probing %s %s from %s: %w", proto, hostport, fromRole, runErr)
	}
	return s, nil
}

// ParseProbeSummary reads the summary line of labserver probe --count.
func ParseProbeSummary(out string) (ProbeSummary, bool) {
	for _, line := range strings.Split(out, "\n") {
		f := kv(line)
		if _, ok := f["sent"]; !ok {
			continue
		}
		s := ProbeSummary{Output: out}
		s.Sent, _ = strconv.Atoi(f["sent"])
		s.OK, _ = strconv.Atoi(f["ok"])
		s.Lost, _ = strconv.Atoi(f["lost"])
		ms, _ := strconv.Atoi(f["max_gap_ms"])
		s.MaxGap = time.Duration(ms) * time.Millisecond
		s.MaxGapProbes, _ = strconv.Atoi(f["max_gap_probes"])
		s.Pods, s.Sources, s.Errors = countMap(f["pods"]), countMap(f["srcs"]), countMap(f["errors"])
		return s, true
	}
	return ProbeSummary{}, false
}

// Hold is a running `labserver hold`: long-lived connections that are
// pinged until the duration ends.
type Hold struct {
	// Proc is the hold process.
	Proc *Proc
}

// HoldResult is the outcome of a Hold.
type HoldResult struct {
	Opened, Broken int
	// Pods counts the held connections per pod that accepted them.
	Pods map[string]int
	// Errors counts broken connections per kind.
	Errors map[string]int
}

// StartHold opens conns long-lived TCP connections from the role to
// hostport and keeps pinging them for duration, in the background. Use
// WaitOpened before disturbing anything, then Wait for the verdict.
func (l *Lab) StartHold(fromRole, hostport string, conns int, duration time.Duration) (*Hold, error) {
	return l.StartHoldTimeout(fromRole, hostport, conns, duration, 0)
}

// StartHoldTimeout is StartHold with the time each connect and echo may take before the connection
// counts as broken (0: labserver's default, 2 s). A longer one tells a black-holed connection from
// one whose echo was only late, when something else on the machine takes its CPUs.
func (l *Lab) StartHoldTimeout(fromRole, hostport string, conns int, duration, timeout time.Duration) (*Hold, error) {
	bin, err := l.LabServer()
	if err != nil {
		return nil, err
	}
	log := filepath.Join(l.dir, fmt.Sprintf("hold-%s-%d.log", fromRole, time.Now().UnixNano()))
	args := []string{bin, "hold", "--tcp", hostport, "--conns", strconv.Itoa(conns), "--duration", duration.String()}
	if timeout > 0 {
		args = append(args, "--timeout", timeout.String())
	}
	p, err := l.Start(fromRole, log, args...)
	if err != nil {
		return nil, err
	}
	return &Hold{Proc: p}, nil
}

// WaitOpened waits until every connection is open and returns how they are
// spread over pods.
func (h *Hold) WaitOpened(timeout time.Duration) (map[string]int, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, line := range strings.Split(h.Proc.Log(), "\n") {
			f := kv(line)
			if _, ok := f["opened"]; ok {
				return countMap(f["pods"]), nil
			}
			if kind, ok := f["error"]; ok {
				return nil, fmt.Errorf("lab: hold could not open connections: %s: %s", kind, h.Proc.Tail(5))
			}
		}
		if exited, _ := h.Proc.Exited(); exited {
			return nil, fmt.Errorf("lab: hold exited early: %s", h.Proc.Tail(5))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("lab: hold: connections not open after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Wait waits for the hold to finish and returns its verdict.
func (h *Hold) Wait(ctx context.Context) (HoldResult, error) {
	if err := h.Proc.Wait(ctx); err != nil && ctx.Err() != nil {
		return HoldResult{}, err
	}
	var r HoldResult
	found := false
	for _, line := range strings.Split(h.Proc.Log(), "\n") {
		f := kv(line)
		if v, ok := f["opened"]; ok {
			r.Opened, _ = strconv.Atoi(v)
			r.Pods = countMap(f["pods"])
		}
		if v, ok := f["broken"]; ok {
			r.Broken, _ = strconv.Atoi(v)
			r.Errors = countMap(f["errors"])
			found = true
		}
	}
	if !found {
		return r, fmt.Errorf("lab: hold printed no verdict: %s", h.Proc.Tail(5))
	}
	return r, nil
}

// kv splits "k=v k=v" into a map.
func kv(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// countMap parses "a:1,b:2" ("-" is empty). Keys may contain colons (IPv6),
// so the count is after the last one.
func countMap(s string) map[string]int {
	m := map[string]int{}
	if s == "" || s == "-" {
		return m
	}
	for _, part := range strings.Split(s, ",") {
		i := strings.LastIndex(part, ":")
		if i < 0 {
			continue
		}
		n, err := strconv.Atoi(part[i+1:])
		if err == nil {
			m[part[:i]] = n
		}
	}
	return m
}
