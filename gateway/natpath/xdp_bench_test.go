package natpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// BenchmarkGatewayCPU: the gateway's CPU per 64-byte packet (60 bytes and the FCS: UDP with 18
// bytes of payload, one flow) through plain routing (no program, no nftables: the kernel's
// forwarding), the tc program and the XDP program, on veths (native XDP), in the lab of the
// netns tests: sender (the lab's client), gateway, sink (the backend host, whose eth0 drops
// everything in XDP: the frames are counted there, its stack never sees them).
//
// The sender is an XDP program run by BPF_PROG_TEST_RUN in live-frame mode
// (BPF_F_TEST_XDP_LIVE_FRAMES), on one thread pinned to one CPU: it writes the frame's headers
// and redirects it into the gateway's veth, 64 frames a batch. The gateway's NAPI poll (its veth,
// GRO on in every mode so that it takes XDP frames) runs as a softirq on that thread when each
// batch ends, and the sink's after it: so the sender cannot outrun the gateway (nothing queues or
// drops: every frame sent is counted at the sink), and the thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID: the scheduler's, exact, which on this kernel includes the softirqs
// served on the thread; ksoftirqd's time is added, in case it took some) is the whole path's: the
// sender, the gateway, the sink. The figures: that time per packet; the same less the "bare" mode's
// (an XDP program on the gateway's veth that only writes the MAC addresses and redirects: the
// sender, a veth's receive and transmit, the sink), which is the gateway's own work; the thread's
// CPU share of /proc/stat's softirq ticks, for the record. Each mode runs xdpBenchRounds times,
// interleaved, and the least time per packet is kept (others on the machine only add).
//
// Run: go test -run '^$' -bench BenchmarkGatewayCPU -benchtime 1x ./gateway/natpath/ (root).
func BenchmarkGatewayCPU(b *testing.B) {
	l := newTestLab(b)
	if _, err := exec.LookPath("ethtool"); err != nil {
		b.Skip("needs ethtool")
	}
	run := func(ns string, args ...string) {
		b.Helper()
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("%v in %s: %v: %s", args, ns, err, out)
		}
	}
	run(l.gw, "ethtool", "-K", "s0", "gro", "on")
	l.noRxVLAN(b)
	// The sink: XDP_DROP on its eth0 (which also lets the gateway's n0 take XDP frames).
	drop := xdpProgram(b, asm.Instructions{asm.Mov.Imm(asm.R0, xdpDrop), asm.Return()})
	dev := func(ns, name string) (idx int, mac net.HardwareAddr) {
		b.Helper()
		if err := in(ns, func() error {
			ifi, err := net.InterfaceByName(name)
			if err == nil {
				idx, mac = ifi.Index, ifi.HardwareAddr
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		return idx, mac
	}
	sinkIdx, sinkMAC := dev(l.backend, "eth0")
	s0Idx, s0MAC := dev(l.gw, "s0")
	n0Idx, n0MAC := dev(l.gw, "n0")
	clientIdx, clientMAC := dev(l.client, "eth0")
	attachXDPLink(b, l.backend, drop, sinkIdx)
	// The sink's neighbour entry, resolved: every packet is forwarded the same way.
	run(l.gw, "ip", "neigh", "replace", "192.0.2.11", "lladdr", sinkMAC.String(), "dev", "n0", "nud", "permanent")
	ap := netip.MustParseAddrPort
	client, pod, vip := ap("198.51.100.10:40000"), ap("10.244.1.11:8080"), ap("203.0.113.50:80")
	mk := func(dst netip.AddrPort) []byte {
		f := frame(pktSpec{src: client, dst: dst, proto: 17, payload: make([]byte, 18)})
		copy(f[0:], s0MAC)
		copy(f[6:], clientMAC)
		return f
	}
	// bare: the least a gateway can do, in XDP.
	macs := append(append([]byte{}, sinkMAC...), n0MAC...)
	bare := xdpProgram(b, asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
		asm.LoadImm(asm.R5, int64(binary.LittleEndian.Uint64(macs[0:])), asm.DWord),
		asm.StoreMem(asm.R2, 0, asm.R5, asm.DWord),
		asm.LoadImm(asm.R5, int64(binary.LittleEndian.Uint32(macs[8:])), asm.DWord),
		asm.StoreMem(asm.R2, 8, asm.R5, asm.Word),
		asm.Mov.Imm(asm.R1, int32(n0Idx)),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("short"),
		asm.Return(),
	})
	type mode struct {
		name   string
		attach AttachMode // "": no NAT fast path
		frame  []byte
	}
	modes := []mode{{"bare", "", mk(pod)}, {"plain", "", mk(pod)}, {"tc", AttachTC, mk(vip)}, {"xdp", AttachXDP, mk(vip)}}
	const packets = 2_000_000
	best := map[string]benchFigures{}
	for round := range xdpBenchRounds {
		for _, m := range modes {
			var p *Path
			var bareLink link.Link
			switch {
			case m.name == "bare":
				bareLink = attachXDPLink(b, l.gw, bare, s0Idx)
			case m.attach != "":
				p = l.loadQuiet(b, Config{Attach: m.attach})
				if err := p.Sync([]VIPPort{{VIP: vip.Addr(), Proto: 17, Port: vip.Port(), Table: []netip.AddrPort{pod}}}); err != nil {
					b.Fatal(err)
				}
				if on, _ := p.AttachedXDP(); m.attach == AttachXDP && len(on) != 2 {
					b.Fatalf("XDP on %v, want both devices", on)
				}
			}
			sender := xdpProgram(b, senderInsns(m.frame, clientIdx))
			redirected := xdpRedirects(b, l.gw, "s0")
			got := l.flood(b, sender, m.frame, packets)
			redirected = xdpRedirects(b, l.gw, "s0") - redirected
			if p != nil {
				_ = in(l.gw, p.Detach)
				p.Close()
			}
			if bareLink != nil {
				bareLink.Close()
			}
			sender.Close()
			b.Logf("round %d %-5s %s", round, m.name, got)
			if got.received < packets*99/100 {
				b.Fatalf("%s: %d of %d packets reached the sink", m.name, got.received, packets)
			}
			if xdp := m.name == "bare" || m.attach == AttachXDP; xdp != (redirected >= packets*99/100) {
				b.Fatalf("%s: the gateway's XDP redirected %d of %d packets", m.name, redirected, packets)
			}
			if old, ok := best[m.name]; !ok || got.perPacket() < old.perPacket() {
				best[m.name] = got
			}
		}
	}
	base := best["bare"].perPacket()
	gw := func(name string) float64 { return best[name].perPacket() - base }
	for _, m := range modes {
		f := best[m.name]
		b.Logf("%-5s %4.0f ns/packet for the whole path, %4.0f ns the gateway's own (less bare's); %.2fx plain routing's gateway time, %.2fx its whole path",
			m.name, f.perPacket(), gw(m.name), gw(m.name)/gw("plain"), f.perPacket()/best["plain"].perPacket())
		b.ReportMetric(f.perPacket(), m.name+"-ns/pkt")
	}
}

// attachXDPLink attaches prog natively to device idx of namespace ns until the benchmark ends
// (or the link is closed).
func attachXDPLink(b *testing.B, ns string, prog *ebpf.Program, idx int) link.Link {
	b.Helper()
	var lk link.Link
	if err := in(ns, func() error {
		var err error
		lk, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lk.Close() })
	return lk
}

// xdpBenchRounds: how often each mode runs (the least is kept).
var xdpBenchRounds = 3

type benchFigures struct {
	sent, received int
	// cpu: the sender thread's CPU time and ksoftirqd's on its CPU; softirq the CPU's softirq
	// ticks (/proc/stat) meanwhile.
	cpu, ksoftirqd, softirq time.Duration
	elapsed                 time.Duration
}

func (f benchFigures) perPacket() float64 {
	return float64((f.cpu + f.ksoftirqd).Nanoseconds()) / float64(max(f.received, 1))
}

func (f benchFigures) String() string {
	return fmt.Sprintf("%d of %d received in %v (%.2f Mpps); CPU %v (ksoftirqd %v; softirq ticks %v): %.0f ns/packet",
		f.received, f.sent, f.elapsed.Round(time.Millisecond), float64(f.received)/f.elapsed.Seconds()/1e6,
		f.cpu.Round(time.Millisecond), f.ksoftirqd, f.softirq, f.perPacket())
}

// benchCPU is the CPU the sender runs on.
const benchCPU = 1

// flood sends n copies of frame with sender (live frames, on benchCPU) and measures.
func (l *testLab) flood(b *testing.B, sender *ebpf.Program, frame []byte, n int) benchFigures {
	b.Helper()
	before := sinkDrops(b, l.backend)
	var f benchFigures
	if err := in(l.client, func() error {
		// The thread is in's, locked to this goroutine: pinned for the run, then as it was.
		var orig, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			return err
		}
		one.Set(benchCPU)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &orig)
		ks0 := ksoftirqdTime(benchCPU)
		si0 := cpuSoftirq(benchCPU)
		var t0, t1 unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t0)
		start := time.Now()
		_, err := sender.Run(&ebpf.RunOptions{Data: frame, Repeat: uint32(n), Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES})
		f.elapsed = time.Since(start)
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t1)
		f.cpu = time.Duration(t1.Nano() - t0.Nano())
		f.ksoftirqd = ksoftirqdTime(benchCPU) - ks0
		f.softirq = cpuSoftirq(benchCPU) - si0
		return err
	}); err != nil {
		b.Fatalf("sending: %v", err)
	}
	f.sent = n
	f.received = sinkDrops(b, l.backend) - before
	return f
}

// ksoftirqdTime is the CPU time of ksoftirqd/cpu (/proc/<pid>/stat's utime and stime).
func ksoftirqdTime(cpu int) time.Duration {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "ksoftirqd/"+strconv.Itoa(cpu) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			return 0
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			return 0
		}
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		return time.Duration(u+s) * (time.Second / 100)
	}
	return 0
}

// cpuSoftirq reads CPU cpu's softirq time from /proc/stat.
func cpuSoftirq(cpu int) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 7 && f[0] == "cpu"+strconv.Itoa(cpu) {
			si, _ := strconv.Atoi(f[7])
			return time.Duration(si) * (time.Second / 100) // USER_HZ
		}
	}
	return 0
}

// sinkDrops reads the frames the sink's XDP program dropped (its eth0's rx_queue_0_xdp_drops).
func sinkDrops(b *testing.B, ns string) int {
	b.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-S", "eth0").CombinedOutput()
	if err != nil {
		b.Fatalf("ethtool -S in %s: %v: %s", ns, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == "rx_queue_0_xdp_drops" {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	b.Fatal("no rx_queue_0_xdp_drops")
	return 0
}

// senderInsns is the sender: it writes frame's first 48 bytes (its headers: a frame comes back to
// the live-frame pool as the gateway and the sink left it) and redirects it to device ifindex.
func senderInsns(frame []byte, ifindex int) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 48),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
	}
	for off := 0; off < 48; off += 8 {
		insns = append(insns,
			asm.LoadImm(asm.R5, int64(binary.LittleEndian.Uint64(frame[off:])), asm.DWord),
			asm.StoreMem(asm.R2, int16(off), asm.R5, asm.DWord))
	}
	return append(insns,
		asm.Mov.Imm(asm.R1, int32(ifindex)),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("short"),
		asm.Return())
}

func xdpProgram(b *testing.B, insns asm.Instructions) *ebpf.Program {
	b.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, Instructions: insns, License: "GPL"})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// loadQuiet is load without the cleanup's Detach and Close (the benchmark does them per mode).
func (l *testLab) loadQuiet(b testing.TB, cfg Config) *Path {
	b.Helper()
	var p *Path
	err := in(l.gw, func() error {
		var err error
		if p, err = Load(cfg); err != nil {
			return err
		}
		var idx []int
		for _, d := range []string{"s0", "n0"} {
			ifi, err := net.InterfaceByName(d)
			if err != nil {
				return err
			}
			idx = append(idx, ifi.Index)
		}
		return p.Attach(idx)
	})
	if err != nil {
		b.Fatalf("loading the NAT fast path: %v", err)
	}
	return p
}
