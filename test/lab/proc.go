package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a background process running in a lab namespace.
type Proc struct {
	// Role is the namespace role the process runs in.
	Role string
	// Args is the command line (without the ip netns exec wrapper).
	Args []string
	// LogPath receives the process's stdout and stderr.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status; valid once done is closed
}

// spawner forks every lab process from one OS thread that never exits.
// Pdeathsig is delivered when the *thread* that forked a child dies, not the
// process; Go may retire a thread (a goroutine that exits while locked to
// it), which would kill our servers at a random moment.
var spawner = sync.OnceValue(func() chan func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: this thread lives as long as the process
		for f := range ch {
			f()
		}
	}()
	return ch
})

// Start runs args in the background in the role's namespace, with stdout and
// stderr appended to logPath (default: a file in the lab's work dir). The
// process and its children are killed when the lab closes or when this
// process dies.
func (l *Lab) Start(role, logPath string, args ...string) (*Proc, error) {
	ns := l.NS(role)
	if ns == "" {
		return nil, fmt.Errorf("lab: unknown role %q", role)
	}
	if len(args) == 0 {
		return nil, errors.New("lab: start needs a command")
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("lab: closed")
	}
	n := len(l.procs)
	l.mu.Unlock()
	if logPath == "" {
		logPath = filepath.Join(l.dir, fmt.Sprintf("%s-%s-%d.log", role, filepath.Base(args[0]), n))
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lab: opening log for %s: %w", args[0], err)
	}
	defer logFile.Close() // the child has its own copy

	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true, // Stop and Kill reach the whole process group
		Pdeathsig: syscall.SIGKILL,
	}
	started := make(chan error, 1)
	spawner() <- func() { started <- cmd.Start() }
	if err := <-started; err != nil {
		return nil, fmt.Errorf("lab: starting %s in %s: %w", strings.Join(args, " "), role, err)
	}
	p := &Proc{Role: role, Args: args, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	l.mu.Lock()
	l.procs = append(l.procs, p)
	closed := l.closed
	l.mu.Unlock()
	if closed {
		// Close ran while we were starting: do not leak the process.
		p.Kill()
		return nil, errors.New("lab: closed")
	}
	l.logf("%s: started %s (pid %d, log %s)", role, strings.Join(args, " "), p.Pid(), logPath)
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its exit error.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Wait waits for the process to exit (or ctx to end) and returns its exit error.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signal sends sig to the process group.
func (p *Proc) Signal(sig syscall.Signal) error {
	if exited, _ := p.Exited(); exited {
		return nil
	}
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %s: %w", p.Args[0], err)
	}
	return nil
}

// Stop sends SIGTERM, waits up to 5 seconds, then kills. It returns once the
// process is gone.
func (p *Proc) Stop() error {
	p.stop(5 * time.Second)
	return nil
}

// Kill kills the process group with SIGKILL and waits for the process.
func (p *Proc) Kill() error {
	err := p.Signal(syscall.SIGKILL)
	<-p.done
	return err
}

func (p *Proc) stop(grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		// The leader is gone; make sure no child of it lingers.
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	case <-time.After(grace):
		_ = p.Kill()
	}
}

// Log returns the process's log so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.LogPath)
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
