package ctsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Backoff bounds of the restarts: the first restart waits MinBackoff, each quick failure doubles it
// up to MaxBackoff; a daemon that ran for StableAfter starts over at MinBackoff.
const (
	MinBackoff  = 500 * time.Millisecond
	MaxBackoff  = 30 * time.Second
	StableAfter = time.Minute
)

// Status is the supervisor's view of conntrackd, for /status and tests.
type Status struct {
	// Up is set while conntrackd runs.
	Up bool
	// PID is conntrackd's process id while it runs.
	PID int
	// Restarts counts the starts after the first.
	Restarts int
	// LastExit is why the last run ended ("" before the first end).
	LastExit string
	// Since is when Up last changed.
	Since time.Time
	// Resync is how the wait for the initial resync ended (ResyncWaiting until it has), and
	// ResyncAfter how long it took (Supervisor.Resynced).
	Resync      ResyncOutcome
	ResyncAfter time.Duration
}

// String is the /status line.
func (s Status) String() string {
	state := "down"
	if s.Up {
		state = fmt.Sprintf("up (pid %d)", s.PID)
	}
	out := fmt.Sprintf("conntrackd %s since %s, %d restarts", state, s.Since.UTC().Format(time.RFC3339), s.Restarts)
	if s.LastExit != "" {
		out += ", last exit: " + s.LastExit
	}
	if s.Resync == ResyncWaiting {
		out += ", initial resync: waiting (VIPs not announced yet)"
	} else {
		out += fmt.Sprintf(", initial resync: %s after %s", s.Resync, s.ResyncAfter.Round(time.Millisecond))
	}
	return out
}

// Supervisor runs conntrackd in the caller's network namespace, restarts it with backoff when it
// exits, and stops it when its context ends. The metric vipgate_gateway_conntrack_sync_up is 1
// while it runs.
type Supervisor struct {
	log  hclog.Logger
	cfg  Config
	bin  string
	conf string
	up   prometheus.Gauge

	// wait bounds the wait for the initial resync; resynced is closed when it is over.
	wait     ResyncWait
	resynced chan struct{}
	// resyncGap is the least time between two answers to the peer's resync requests
	// (ResyncAnswerGap).
	resyncGap time.Duration

	mu     sync.Mutex
	status Status
	// sendMu serialises SendTable.
	sendMu sync.Mutex
}

// NewSupervisor renders cfg into cfg.Dir and returns a supervisor of the conntrackd binary bin
// ("" = conntrackd from PATH). The gauge is registered on reg (may be nil).
func NewSupervisor(log hclog.Logger, cfg Config, bin string, reg prometheus.Registerer) (*Supervisor, error) {
	conf, err := Render(cfg)
	if err != nil {
		return nil, err
	}
	if bin == "" {
		if bin, err = exec.LookPath("conntrackd"); err != nil {
			return nil, fmt.Errorf("conntrack sync: conntrackd not found (install Debian's conntrackd, or set conntrackSync.conntrackd): %w", err)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("conntrack sync: state directory: %w", err)
	}
	if err := os.WriteFile(PathsOf(cfg.Dir).Config, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("conntrack sync: writing conntrackd's config: %w", err)
	}
	s := &Supervisor{log: log, cfg: cfg, bin: bin, conf: conf, status: Status{Since: time.Now()},
		wait: DefaultResyncWait, resynced: make(chan struct{}), resyncGap: ResyncAnswerGap,
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vipgate_gateway_conntrack_sync_up",
			Help: "1 while conntrackd, which replicates the gateway's conntrack table to its peer, runs."})}
	if reg != nil {
		if err := reg.Register(s.up); err != nil {
			return nil, fmt.Errorf("conntrack sync: registering metrics: %w", err)
		}
	}
	return s, nil
}

// Status returns the current status.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

func (s *Supervisor) setUp(up bool, pid int, exit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status.Up != up {
		s.status.Since = time.Now()
	}
	s.status.Up, s.status.PID = up, pid
	if exit != "" {
		s.status.LastExit = exit
	}
	s.up.Set(map[bool]float64{false: 0, true: 1}[up])
}

// Run starts conntrackd and keeps it running until ctx ends, then stops it (SIGTERM, SIGKILL after
// 2 s) and returns. It also watches the first daemon's initial resync (Resynced).
func (s *Supervisor) Run(ctx context.Context) {
	p := PathsOf(s.cfg.Dir)
	backoff := MinBackoff
	go s.answerResyncs(ctx, p.Log)
	go s.watchResync(ctx, time.Now())
	for first := true; ; first = false {
		if !first {
			s.mu.Lock()
			s.status.Restarts++
			s.mu.Unlock()
		}
		// Only this supervisor runs conntrackd with this directory, and it is not running now: a
		// lock file or socket left by a killed daemon would only stop the next one from starting.
		_ = os.Remove(p.Lock)
		_ = os.Remove(p.Socket)
		start := time.Now()
		exit := s.runOnce(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > StableAfter {
			backoff = MinBackoff
		}
		s.log.Error("conntrackd exited; flows created meanwhile are not replicated to the peer", "err", exit, "restart_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, MaxBackoff)
	}
}

// runOnce runs conntrackd until it exits or ctx ends, and says why it ended.
func (s *Supervisor) runOnce(ctx context.Context, p Paths) string {
	cmd := exec.Command(s.bin, "-C", p.Config)
	// conntrackd logs to its LogFile; what it prints before it gets there goes to ours.
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// A gateway that dies takes its conntrackd along, as a dead machine would (the kernel sends
	// SIGKILL when the thread that started it exits).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.setUp(false, 0, err.Error())
		return err.Error()
	}
	pid := cmd.Process.Pid
	_ = os.WriteFile(p.Config+".pid", []byte(strconv.Itoa(pid)+"\n"), 0o600)
	s.setUp(true, pid, "")
	s.log.Info("conntrackd started", "pid", pid, "peer", s.cfg.Peer, "interface", s.cfg.Interface, "dir", s.cfg.Dir)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// StartupResync brings the peer's flows here; the flows this gateway created while its
	// conntrackd was down (or before it first ran) reach the peer only by a bulk send, ordered once
	// the new daemon listens on its control socket.
	bulkCtx, bulkStop := context.WithCancel(ctx)
	defer bulkStop()
	go s.bulkSend(bulkCtx, p, pid)
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-done:
		case <-time.After(2 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
		s.log.Info("conntrackd stopped", "pid", pid)
	}
	_ = os.Remove(p.Config + ".pid")
	exit := "exited"
	if err != nil {
		exit = err.Error()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() >= 0 {
			exit = fmt.Sprintf("exit status %d", ee.ExitCode())
		}
	}
	s.setUp(false, 0, exit)
	return exit
}

// bulkSend waits (up to 10 s) for conntrackd's control socket, puts it back on the normal
// scheduler and sends the whole table to the peer (SendTable).
func (s *Supervisor) bulkSend(ctx context.Context, p Paths, pid int) {
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(p.Socket); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	// conntrackd makes itself SCHED_RR 99 at start (to keep up with netlink events). A real-time
	// task that gets busy starves everything else of its core, the BGP and BFD sessions and the
	// softirq threads that forward packets included; on a gateway those matter more than the
	// replication. Back to the normal scheduler once it is up.
	if err := unix.SchedSetAttr(pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 0 /* SCHED_OTHER */}, 0); err != nil {
		s.log.Warn("conntrackd keeps its real-time scheduling", "pid", pid, "err", err)
	}
	if err := s.SendTable(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("conntrackd could not send its table to the peer; flows created while it was down are not on the peer", "err", err)
	}
}

// SendTable makes conntrackd send the whole kernel table to the peer: `conntrackd -R` reads the
// kernel table into its cache, `conntrackd -B` sends the cache. The -R matters: entries conntrackd
// put into the kernel on the peer's behalf are not in its cache, and a peer that lost its table
// (a reboot) needs them back, with the flows it had NATed that this gateway carried meanwhile.
// Its own StartupResync request is answered from the cache alone.
func (s *Supervisor) SendTable(ctx context.Context) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	conf := PathsOf(s.cfg.Dir).Config
	for _, flag := range []string{"-R", "-B"} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(cctx, s.bin, "-C", conf, flag).CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("conntrackd %s: %w: %s", flag, err, out)
		}
	}
	s.log.Debug("conntrackd sent the kernel table to the peer")
	return nil
}

// resyncRequested is the line conntrackd logs when the peer's conntrackd (re)started and asked for
// this gateway's table (StartupResync).
var resyncRequested = []byte("resync requested by other node")

// ResyncAnswerGap is the least time between two whole-table sends that answer the peer's resync
// requests (answerResyncs): requests that come meanwhile get one send when it has passed. A dump
// costs a read of the kernel table and a datagram per ~15 entries; a peer that restarts in a loop
// must not turn that into a flood. (The requests reach conntrackd only through the relay: signed by
// the peer, and at most ResyncBurst at once, one per ResyncEvery after.)
const ResyncAnswerGap = 5 * time.Second

// answerResyncs follows conntrackd's log file and, whenever the peer asks for a resync, sends it the
// whole kernel table (SendTable), at most once per ResyncAnswerGap. conntrackd answers such a
// request from its cache alone, which lacks the entries it injected for the peer: without this, a
// peer that restarted with an empty table would not get back the flows it had NATed, which this
// gateway carried meanwhile.
func (s *Supervisor) answerResyncs(ctx context.Context, path string) {
	var off int64
	if fi, err := os.Stat(path); err == nil {
		off = fi.Size()
	}
	var lastAnswer time.Time
	pending := false
	var partial []byte
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if pending && time.Since(lastAnswer) >= s.resyncGap {
			pending, lastAnswer = false, time.Now()
			s.log.Info("the peer's conntrackd asked for a resync: sending it the whole conntrack table")
			if err := s.SendTable(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("sending the conntrack table to the peer", "err", err)
			}
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if fi, err := f.Stat(); err == nil && fi.Size() < off {
			off = 0 // truncated or replaced
		}
		// At most 1 MiB per round: the log is ours, but a flood must not cost unbounded memory.
		buf, _ := io.ReadAll(io.LimitReader(io.NewSectionReader(f, off, 1<<20), 1<<20))
		f.Close()
		off += int64(len(buf))
		data := append(partial, buf...)
		i := bytes.LastIndexByte(data, '\n')
		if i < 0 {
			partial = data[:min(len(data), 4096):min(len(data), 4096)]
			continue
		}
		lines, rest := data[:i], data[i+1:]
		partial = append([]byte(nil), rest[:min(len(rest), 4096)]...)
		if bytes.Contains(lines, resyncRequested) {
			// Answered at the next tick, or once ResyncAnswerGap has passed since the last answer.
			pending = true
		}
	}
}
