package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/bgp/bfd"
	"github.com/vipgate/vipgate/test/routers"
)

// The netns tests run the Speaker in a child process started with `ip netns exec`: GoBGP opens its
// sockets from goroutines of its own, which the Go scheduler runs on any OS thread, so pinning one
// thread into a namespace (LockOSThread + setns) would leave most sockets in the root namespace.
// The child is this test binary again, switched into helper mode by an environment variable, and
// driven by JSON lines on stdin/stdout.

const helperEnv = "VIPGATE_BGP_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(runHelper())
	}
	if os.Getenv(senderEnv) == "1" {
		os.Exit(runSender())
	}
	os.Exit(m.Run())
}

type helperRequest struct {
	Op         string          `json:"op"`
	RouterID   netip.Addr      `json:"routerID,omitzero"`
	ListenPort int             `json:"listenPort,omitempty"`
	Peers      []PeerConfig    `json:"peers,omitempty"`
	Ads        []Advertisement `json:"ads,omitempty"`
	Drain      time.Duration   `json:"drain,omitempty"`
	Address    netip.Addr      `json:"address,omitzero"`
	// BFDFallback replaces bfdStartFallback (op start).
	BFDFallback time.Duration `json:"bfdFallback,omitempty"`
	// BFD sets sessions of a standalone BFD server, without a Speaker (op bfd).
	BFD []bfd.Config `json:"bfd,omitempty"`
}

type helperResponse struct {
	Err     string       `json:"err,omitempty"`
	Status  []PeerStatus `json:"status,omitempty"`
	Metrics string       `json:"metrics,omitempty"`
	// BFD is the standalone BFD server's sessions (op bfdstatus); CPU the process's CPU time
	// (op rusage).
	BFD []bfd.SessionStatus `json:"bfdStatus,omitempty"`
	CPU time.Duration       `json:"cpu,omitempty"`
}

func runHelper() int {
	log := hclog.New(&hclog.LoggerOptions{Name: "speaker", Level: hclog.Debug, Output: os.Stderr})
	var sp *Speaker
	var bs *bfd.Server
	reg := prometheus.NewRegistry()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req helperRequest
		var resp helperResponse
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Err = err.Error()
			_ = out.Encode(resp)
			continue
		}
		var err error
		switch {
		case req.Op == "start":
			if req.BFDFallback > 0 {
				bfdStartFallback = req.BFDFallback
			}
			sp, err = New(log, reg, req.RouterID, req.ListenPort)
		case req.Op == "bfd":
			if bs == nil {
				bl := log.Named("bfd")
				bs = bfd.New(bfd.Options{Logger: bl, OnEvent: func(ev bfd.Event) {
					if ev.From != ev.To || ev.Kind == bfd.EventFailure {
						bl.Info("event", "peer", ev.Peer, "kind", ev.Kind, "from", ev.From, "to", ev.To, "diag", ev.Diag,
							"failure", ev.Failure, "remote_state", ev.RemoteState, "remote_diag", ev.RemoteDiag, "grace", ev.Grace)
					}
				}})
			}
			for _, c := range req.BFD {
				if err = bs.Set(c); err != nil {
					break
				}
			}
		case req.Op == "bfdstatus" && bs != nil:
			resp.BFD = bs.Status()
		case req.Op == "rusage":
			var ru syscall.Rusage
			if err = syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
				resp.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
		case sp == nil:
			err = errors.New("not started")
		case req.Op == "peers":
			err = sp.SetPeers(req.Peers)
		case req.Op == "ads":
			err = sp.SetAdvertisements(req.Ads)
		case req.Op == "status":
			resp.Status = sp.Status()
		case req.Op == "bfdsessions":
			resp.BFD = sp.bfd.Status()
		case req.Op == "metrics":
			resp.Metrics, err = gatherText(reg)
		case req.Op == "shutdown":
			err = sp.Shutdown(context.Background(), req.Drain)
		case req.Op == "stop":
			err = sp.Stop(context.Background())
		default:
			err = fmt.Errorf("unknown op %q", req.Op)
		}
		if err != nil {
			resp.Err = err.Error()
		}
		_ = out.Encode(resp)
	}
	return 0
}

// remoteSpeaker drives a Speaker running in a helper process inside a namespace.
type remoteSpeaker struct {
	t    testing.TB
	cmd  *exec.Cmd
	mu   sync.Mutex
	in   *json.Encoder
	out  *json.Decoder
	done chan struct{}
	log  string
}

// startSpeaker runs a Speaker in netns ns and calls New on it.
func startSpeaker(t testing.TB, ns string, routerID netip.Addr, listenPort int) *remoteSpeaker {
	t.Helper()
	return startSpeakerWith(t, ns, helperRequest{Op: "start", RouterID: routerID, ListenPort: listenPort})
}

// startSpeakerWith runs a Speaker in netns ns and sends it start (Op "start").
func startSpeakerWith(t testing.TB, ns string, start helperRequest) *remoteSpeaker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "speaker.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	argv := routers.InNetns(ns, exe, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting speaker helper in %s: %v", ns, err)
	}
	r := &remoteSpeaker{t: t, cmd: cmd, in: json.NewEncoder(stdin), out: json.NewDecoder(stdout), done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); logf.Close(); close(r.done) }()
	t.Cleanup(func() {
		r.Kill()
		b, _ := os.ReadFile(logPath)
		// Under -race the child reports data races on its stderr only; surface them here.
		if strings.Contains(string(b), "WARNING: DATA RACE") {
			t.Errorf("data race in the speaker process:\n%s", b)
		}
		if t.Failed() {
			t.Logf("speaker log:\n%s", tail(string(b), 80))
		}
	})
	if _, err := r.call(start); err != nil {
		t.Fatalf("starting speaker: %v", err)
	}
	return r
}

func (r *remoteSpeaker) call(req helperRequest) (helperResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.in.Encode(req); err != nil {
		return helperResponse{}, fmt.Errorf("sending %s: %w", req.Op, err)
	}
	var resp helperResponse
	if err := r.out.Decode(&resp); err != nil {
		return helperResponse{}, fmt.Errorf("reading %s reply: %w", req.Op, err)
	}
	if resp.Err != "" {
		return resp, errors.New(resp.Err)
	}
	return resp, nil
}

func (r *remoteSpeaker) SetPeers(peers ...PeerConfig) error {
	_, err := r.call(helperRequest{Op: "peers", Peers: peers})
	return err
}

func (r *remoteSpeaker) SetAdvertisements(ads ...Advertisement) error {
	_, err := r.call(helperRequest{Op: "ads", Ads: ads})
	return err
}

func (r *remoteSpeaker) Status() []PeerStatus {
	resp, err := r.call(helperRequest{Op: "status"})
	if err != nil {
		r.t.Errorf("status: %v", err)
	}
	return resp.Status
}

// BFDSessions returns the Speaker's BFD sessions (discriminators, sequence numbers).
func (r *remoteSpeaker) BFDSessions() []bfd.SessionStatus {
	resp, err := r.call(helperRequest{Op: "bfdsessions"})
	if err != nil {
		r.t.Errorf("BFD sessions: %v", err)
	}
	return resp.BFD
}

func (r *remoteSpeaker) Metrics() string {
	resp, err := r.call(helperRequest{Op: "metrics"})
	if err != nil {
		r.t.Errorf("metrics: %v", err)
	}
	return resp.Metrics
}

func (r *remoteSpeaker) Shutdown(drain time.Duration) error {
	_, err := r.call(helperRequest{Op: "shutdown", Drain: drain})
	return err
}

func (r *remoteSpeaker) Stop() error {
	_, err := r.call(helperRequest{Op: "stop"})
	return err
}

// Freeze stops the process (SIGSTOP): its sockets stay open but nothing is sent, like a hung node.
func (r *remoteSpeaker) Freeze() { _ = r.cmd.Process.Signal(syscall.SIGSTOP) }

// Kill ends the process at once (the kernel closes its TCP sessions with FIN). Safe to call twice.
func (r *remoteSpeaker) Kill() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Kill()
	<-r.done
}

// waitStatus waits until cond holds for the speaker's status.
func (r *remoteSpeaker) waitStatus(timeout time.Duration, cond func([]PeerStatus) bool) ([]PeerStatus, error) {
	var st []PeerStatus
	err := routers.WaitFor(timeout, func() (bool, error) {
		st = r.Status()
		return cond(st), nil
	})
	return st, err
}

func tail(s string, n int) string {
	lines := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			lines++
			if lines > n {
				return s[i+1:]
			}
		}
	}
	return s
}

// The sender mode sends hand-made UDP datagrams from inside a namespace (the router side), with a
// chosen source address and TTL: hostile BFD input for the speaker.
const senderEnv = "VIPGATE_BGP_TEST_SENDER"

type datagram struct {
	From    netip.Addr     `json:"from"`
	To      netip.AddrPort `json:"to"`
	TTL     int            `json:"ttl"`
	Payload []byte         `json:"payload"`
	Count   int            `json:"count"`
	// Interval paces the Count copies (zero: back to back).
	Interval time.Duration `json:"interval,omitempty"`
}

func runSender() int {
	var ds []datagram
	if err := json.NewDecoder(os.Stdin).Decode(&ds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, d := range ds {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if d.From.Is4() {
					serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_TTL, d.TTL)
				} else {
					serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_UNICAST_HOPS, d.TTL)
				}
			})
			if err != nil {
				return err
			}
			return serr
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp", netip.AddrPortFrom(d.From, 0).String())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for i := range max(d.Count, 1) {
			if i > 0 && d.Interval > 0 {
				time.Sleep(d.Interval)
			}
			if _, err := pc.(*net.UDPConn).WriteToUDPAddrPort(d.Payload, d.To); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		pc.Close()
	}
	return 0
}

// sendDatagrams sends ds from namespace ns (this test binary in sender mode).
func sendDatagrams(t testing.TB, ns string, ds []datagram) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	argv := routers.InNetns(ns, exe, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), senderEnv+"=1")
	cmd.Stdin = strings.NewReader(string(b))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sending datagrams from %s: %v: %s", ns, err, out)
	}
}
