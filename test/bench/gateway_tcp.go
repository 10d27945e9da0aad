package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The gateway TCP row (--only gateway-tcp): one iperf3 TCP stream from the sender through the
// gateway namespace to the node, in the lab of the small-packet row (gateway.go), plainly routed vs
// `vipgate gateway` forwarding: route with its fast path (routeFastPath) and without it (dup), in
// alternating rounds of one run. The Service's TCP port is the UDP one's number (30080): iperf3's
// server listens on it in the node namespace, and in route forwarding the node takes the VIP's
// packets itself (the VIP is on its loopback) and answers the sender directly, through the
// gateway namespace's plain routing.
//
// Throughput moves with the machine's other load as the packet rate does; the sender's CPU time per
// 64 KB moves much less: on veth the stream's packets cross both hops in the softirq of the
// sender's transmit, charged to the sender (iperf3's client; its rusage, read when it exits), so it
// is the path's cost per byte.

// gwTCPOptions bound the row.
type gwTCPOptions struct {
	rounds  int
	seconds int // iperf3 -t of one sample
}

// tcpSample is one iperf3 run: the receiver's throughput and the client's CPU time per 64 KB sent.
type tcpSample struct {
	gbps    float64
	cpuNS64 float64
}

// iperfSent reads the bytes sent and the receiver's bits per second from iperf3 -J output.
func iperfSent(out string) (bytes, bps float64, err error) {
	var res struct {
		End struct {
			SumSent struct {
				Bytes float64 `json:"bytes"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	// ip netns exec may print warnings before the JSON document.
	if i := strings.Index(out, "{"); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return 0, 0, fmt.Errorf("parsing iperf3 -J output: %w", err)
	}
	if res.Error != "" {
		return 0, 0, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived.BitsPerSecond <= 0 {
		return 0, 0, fmt.Errorf("iperf3 reported no received bytes")
	}
	return res.End.SumSent.Bytes, res.End.SumReceived.BitsPerSecond, nil
}

// iperf runs one iperf3 client in the sender namespace to dst for seconds, retrying briefly while
// the server is not listening yet.
func (g *gwLab) iperf(dst netip.AddrPort, seconds int) (tcpSample, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second+20*time.Second)
		// `ip netns exec` execs iperf3: the process's rusage is the client's.
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", g.snd.name, "iperf3", "-c", dst.Addr().String(),
			"-p", strconv.Itoa(int(dst.Port())), "-t", strconv.Itoa(seconds), "-J")
		out, err := cmd.Output()
		cancel()
		if err != nil {
			lastErr = fmt.Errorf("iperf3 to %s: %v: %s", dst, err, oneLine(string(out)))
			continue
		}
		bytes, bps, err := iperfSent(string(out))
		if err == nil && bytes <= 0 {
			err = errors.New("iperf3 reported no bytes sent")
		}
		if err != nil {
			lastErr = fmt.Errorf("iperf3 to %s: %w", dst, err)
			continue
		}
		ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if !ok {
			return tcpSample{}, fmt.Errorf("iperf3 to %s: no rusage", dst)
		}
		cpu := ru.Utime.Nano() + ru.Stime.Nano()
		return tcpSample{gbps: bps / 1e9, cpuNS64: float64(cpu) * 65536 / bytes}, nil
	}
	return tcpSample{}, lastErr
}

// gatewayTCP is the row.
func gatewayTCP(t *table, vipgateFlag string, o gwTCPOptions) {
	what := fmt.Sprintf("gateway TCP throughput: one iperf3 stream through the gateway namespace (median of %d rounds x %d s, alternating)", o.rounds, o.seconds)
	g, err := openGwLab(vipgateFlag)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer g.close()
	srv := exec.Command("ip", "netns", "exec", g.node.name, "iperf3", "-s", "-p", strconv.Itoa(gwPPSPort))
	if err := srv.Start(); err != nil {
		t.fail(what, fmt.Errorf("iperf3 server: %w", err))
		return
	}
	defer atExit(func() { _ = srv.Process.Kill(); _ = srv.Wait() })()

	type target struct{ name, fwd string }
	targets := []target{{name: "plain"}, {name: gwPPSFastPath, fwd: gwPPSFastPath}, {name: "route (dup)", fwd: "route"}}
	samples := map[string][]tcpSample{}
	for r := 0; r < o.rounds; r++ {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, tg := range order {
			dst := netip.AddrPortFrom(gwPPSVIP, gwPPSPort)
			if tg.fwd == "" {
				g.stopGateway()
				dst = netip.AddrPortFrom(gwPPSNodeIP, gwPPSPort)
			} else if err := g.startGateway(tg.fwd, ""); err != nil {
				t.fail(what, err)
				return
			}
			s, err := g.iperf(dst, o.seconds)
			if err != nil {
				t.fail(what+" ("+tg.name+")", err)
				return
			}
			samples[tg.name] = append(samples[tg.name], s)
		}
		g.stopGateway()
	}
	pick := func(name string, f func(tcpSample) float64) []float64 { return pickSamples(samples[name], f) }
	gbps := func(s tcpSample) float64 { return s.gbps }
	cpu := func(s tcpSample) float64 { return s.cpuNS64 }
	rate := func(xs []float64) string {
		return fmt.Sprintf("%.1f Gbit/s (%.1f-%.1f)", median(xs), slices.Min(xs), slices.Max(xs))
	}
	us := func(xs []float64) string {
		return fmt.Sprintf("%.1f µs (%.1f-%.1f)", median(xs)/1e3, slices.Min(xs)/1e3, slices.Max(xs)/1e3)
	}
	plain, plainCPU := pick("plain", gbps), pick("plain", cpu)
	t.add(row{What: what, Ref: "plainly routed (gateway namespace forwarding, no nftables table): " + rate(plain)})
	for _, tg := range targets[1:] {
		got := pick(tg.name, gbps)
		t.add(row{Sub: true, What: "through `vipgate gateway`, forwarding: " + tg.name,
			Vipgate: rate(got), Ref: "plainly routed: " + rate(plain), Ratio: pairedRatio(got, plain, 0.95)})
	}
	for _, tg := range targets[1:] {
		mc := pick(tg.name, cpu)
		t.add(row{Sub: true, What: "sender CPU per 64 KB (the path's cost, less moved by other load), forwarding: " + tg.name,
			Vipgate: us(mc), Ref: "plainly routed: " + us(plainCPU), Ratio: "plain/mode " + pairedRatio(plainCPU, mc, 0.95)})
	}
}
