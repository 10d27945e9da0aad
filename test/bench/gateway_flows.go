package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// The gateway flow-table row (--only gateway-flows, issue #33): how many concurrent flows the
// gateway holds and what they cost, in the small-packet row's lab (gateway.go), forwarding direct
// (no masquerade: one backend's flows need no port each) with the NAT fast path (tc BPF) and with
// nftables only (conntrack). For each size of --gw-flows (100,000 and 1,000,000 flows) and each
// path: the sender opens that many UDP flows (flowgen.go: an ask, the server's answer, a note; 16
// source addresses x up to 64,000 ports), then
//
//   - held: the fast path's established flows (its vg_flows map, read by ID from the gateway's own
//     descriptors: two entries a flow) and the gateway namespace's conntrack entries;
//   - memory: the gateway's BPF maps (the kernel's memlock figure of each, /proc/<pid>/fdinfo;
//     preallocated: the same empty or full), the gateway's RSS, and conntrack's entries times the
//     nf_conntrack slab object (the slab's growth over the fill is machine-wide, so it is given
//     too but counts other namespaces' entries);
//   - full: --gw-flows-overflow more flows while the table is full (the fast path's sized to
//     hold exactly the run's flows: flowTableSize = 2 x flows): how many were answered and where
//     they went (conntrack takes what the fast path turns away);
//   - established: afterwards an ask on --gw-flows-probe of the held flows, evenly spread: how
//     many were answered.
//
// Conntrack's table in a namespace is bounded by the host's nf_conntrack_max, a setting of the
// machine's own namespace that the bench does not change: the nftables-only path holds at most
// that many. TCP under a SYN flood while the fast path's table is full is
// gateway/natpath/flood_test.go's TestFloodKeepsEstablished (1,000 established connections, a flood
// of 10x the table; every connection still answered by its own server): not repeated here.

// gwFlowsOptions bound the row.
type gwFlowsOptions struct {
	sizes    []int
	pps      int // the generator's datagrams per second
	overflow int // flows opened while the table is full
	probe    int // held flows asked again afterwards
}

var (
	gwFlowsSrcBase = netip.MustParseAddr("198.51.100.16") // 16 source addresses: .16-.31
	gwFlowsSrcs    = 16
)

// flowsResult is one path at one size.
type flowsResult struct {
	path                 string
	asked                int
	answered             int   // asks answered during the fill
	fastFlows, fastNew   int   // the fast path's established and unconfirmed flows after the fill
	ctEntries            int   // the gateway namespace's conntrack entries after the fill
	bpfBytes             int64 // the gateway's BPF maps (memlock)
	flowMapBytes         int64 // of which vg_flows and vg_new
	flowMapEntries       int   // vg_flows' size in entries
	rss                  int64 // the gateway's RSS
	ctObj                int   // the nf_conntrack slab object's size
	slabGrowth           int64 // the nf_conntrack slab's growth over the fill (machine-wide)
	overflow, overflowOK int   // flows opened while full, answered
	overflowCT           int   // conntrack entries they added
	overflowNew          int   // unconfirmed flows of the fast path they added (its LRU table)
	overflowEst          int   // established flows of the fast path they added
	probe, probeOK       int
	probeEst             int // the established flows of the fast path the probe added
	// conntrack's new entries (its count's growth plus the entries evicted for them), drops
	// (table full) and early drops (an unassured entry evicted for a new one) while the overflow
	// flows came, and while the probe asked.
	ctInsert, ctDrop, ctEarlyDrop int
	probeInsert, probeEarlyDrop   int
	fillTime                      time.Duration
}

// gwFlowsConfig is the gateway's config: direct forwarding, the NAT fast path on with a table of
// exactly flows (two entries each), or off.
func gwFlowsConfig(fast bool, flows int) string {
	if !fast {
		return gwPPSConfig("direct")
	}
	return strings.Replace(gwPPSConfig("direct+fastPath"), "natFastPath: {enabled: true}",
		fmt.Sprintf("natFastPath: {enabled: true, flowTableSize: %d}", 2*flows), 1)
}

var nftPacketsRE = regexp.MustCompile(`packets (\d+)`)

// parseNftCounter reads the packets of `nft list counter` output.
func parseNftCounter(out string) (int, error) {
	m := nftPacketsRE.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no packet count in %q", oneLine(out))
	}
	return strconv.Atoi(m[1])
}

// answers is the answers the sender namespace has dropped (counted) so far.
func (g *gwLab) answers() (int, error) {
	out, err := exec.Command("ip", "netns", "exec", g.snd.name, "nft", "list", "counter", "ip", "vgsink", "answers").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("nft list counter: %v: %s", err, oneLine(string(out)))
	}
	return parseNftCounter(string(out))
}

// flowgen runs the flow generator in the sender namespace.
func (g *gwLab) flowgen(from, to, stride int, kind string, pps, chunk int) error {
	out, err := exec.Command("ip", "netns", "exec", g.snd.name, g.self, "flowgen",
		"--dst", netip.AddrPortFrom(gwPPSVIP, gwPPSPort).String(), "--src-base", gwFlowsSrcBase.String(), "--srcs", strconv.Itoa(gwFlowsSrcs),
		"--from", strconv.Itoa(from), "--to", strconv.Itoa(to), "--stride", strconv.Itoa(stride),
		"--kind", kind, "--chunk", strconv.Itoa(chunk), "--pps", strconv.Itoa(pps)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("flowgen %d-%d: %v: %s", from, to, err, oneLine(string(out)))
	}
	return nil
}

// fastPathMaps reads the gateway's BPF maps: their memory, and vg_flows' and vg_new's entries.
func fastPathMaps(pid int) (total, flowMaps int64, flowEntries, established, unconfirmed int, err error) {
	maps, err := processMaps(pid)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	for _, mi := range maps {
		total += mi.memlock
		m, err := ebpf.NewMapFromID(ebpf.MapID(mi.id))
		if err != nil {
			continue
		}
		info, err := m.Info()
		if err == nil && (info.Name == "vg_flows" || info.Name == "vg_new") {
			flowMaps += mi.memlock
			n, cerr := countEntries(m)
			if cerr != nil {
				m.Close()
				return 0, 0, 0, 0, 0, fmt.Errorf("counting %s: %w", info.Name, cerr)
			}
			if info.Name == "vg_flows" {
				established, flowEntries = n/2, int(info.MaxEntries)
			} else {
				unconfirmed = n / 2
			}
		}
		m.Close()
	}
	return total, flowMaps, flowEntries, established, unconfirmed, nil
}

// countEntries counts a map's entries by walking its keys.
func countEntries(m *ebpf.Map) (int, error) {
	key, prev := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	var from any // nil: the first key
	for n := 0; ; n++ {
		err := m.NextKey(from, key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		copy(prev, key)
		from = prev
	}
}

// conntrackStats sums a namespace's conntrack statistics over its CPUs.
func conntrackStats(ns string) map[string]int {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/stat/nf_conntrack").Output()
	if err != nil {
		return map[string]int{}
	}
	return parseConntrackStat(string(out))
}

// parseConntrackStat reads /proc/net/stat/nf_conntrack: a header of names, then one line of hex
// numbers per CPU, summed by name (entries is the same on every line: kept once).
func parseConntrackStat(s string) map[string]int {
	out := map[string]int{}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) < 2 {
		return out
	}
	names := strings.Fields(lines[0])
	for _, l := range lines[1:] {
		for i, f := range strings.Fields(l) {
			if i >= len(names) {
				break
			}
			v, err := strconv.ParseUint(f, 16, 64)
			if err != nil {
				continue
			}
			if names[i] == "entries" {
				out["entries"] = int(v)
				continue
			}
			out[names[i]] += int(v)
		}
	}
	return out
}

// vmRSS reads a process's resident memory from /proc/<pid>/status.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	return parseVmRSS(string(b))
}

// parseVmRSS reads VmRSS (kB) from /proc/<pid>/status text, in bytes.
func parseVmRSS(s string) int64 {
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// startEcho runs `bench udpecho` on the pod's address in the node namespace.
func (g *gwLab) startEcho(maxTime time.Duration) (func(), error) {
	cmd := exec.Command("ip", "netns", "exec", g.node.name, g.self, "udpecho",
		"--addr", netip.AddrPortFrom(gwPPSPod, gwPPSPort).String(), "--max-time", maxTime.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop := atExit(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		stop()
		return nil, fmt.Errorf("udpecho said %q: %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return stop, nil
}

// gatewayFlows is the row.
func gatewayFlows(t *table, vipgateFlag string, o gwFlowsOptions) {
	what := fmt.Sprintf("gateway flow table: concurrent UDP flows through `vipgate gateway`, forwarding: direct (each flow asked, answered and confirmed; %s datagrams/s at most)", thousands(o.pps))
	g, err := openGwLab(vipgateFlag)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer g.close()
	// The sender's 16 source addresses (the gateway resolves them for the answers), and the rule
	// that counts and drops the answers before any socket.
	var cmds []string
	for i := range gwFlowsSrcs {
		a, _ := flowTuple(gwFlowsSrcBase, gwFlowsSrcs, i)
		cmds = append(cmds, "addr add "+a.String()+"/32 dev eth0")
	}
	for _, c := range cmds {
		if out, err := exec.Command("ip", append([]string{"-n", g.snd.name}, strings.Fields(c)...)...).CombinedOutput(); err != nil {
			t.fail(what, fmt.Errorf("netns %s: ip %s: %v: %s", g.snd.name, c, err, out))
			return
		}
	}
	sink := exec.Command("ip", "netns", "exec", g.snd.name, "nft", "-f", "-")
	sink.Stdin = strings.NewReader(fmt.Sprintf("table ip vgsink {\n\tcounter answers {}\n\tchain in { type filter hook input priority 0; udp sport %d counter name answers drop; }\n}\n", gwPPSPort))
	if out, err := sink.CombinedOutput(); err != nil {
		t.fail(what, fmt.Errorf("netns %s: nft -f (the answers' sink): %v: %s", g.snd.name, err, oneLine(string(out))))
		return
	}
	stopEcho, err := g.startEcho(30 * time.Minute)
	if err != nil {
		t.fail(what, err)
		return
	}
	defer stopEcho()
	t.add(row{What: what, Ref: "the host's nf_conntrack_max: " + strings.TrimSpace(readFileString("/proc/sys/net/netfilter/nf_conntrack_max")) + " (conntrack's bound in every namespace; not changed)"})
	for _, n := range o.sizes {
		for _, fast := range []bool{true, false} {
			r, err := g.flowsRun(n, fast, o)
			if err != nil {
				t.fail(fmt.Sprintf("%s flows, fast path %v", thousands(n), fast), err)
				return
			}
			flowsRows(t, n, r)
		}
	}
	g.stopGateway()
}

func readFileString(f string) string {
	b, _ := os.ReadFile(f)
	return string(b)
}

// flowsRun measures one path at one size.
func (g *gwLab) flowsRun(n int, fast bool, o gwFlowsOptions) (flowsResult, error) {
	r := flowsResult{path: "nftables only (conntrack)", asked: n}
	name := "direct-flows"
	if fast {
		r.path = "NAT fast path (tc BPF)"
		name = "direct+fastPath-flows"
	}
	g.stopGateway()
	_ = exec.Command("ip", "netns", "exec", g.gw.name, "conntrack", "-F").Run()
	if err := g.startGatewayConfig(name, gwFlowsConfig(fast, n), ""); err != nil {
		return r, err
	}
	pid := g.gwProc.Process.Pid
	slab0, _ := readSlab("nf_conntrack")
	a0, err := g.answers()
	if err != nil {
		return r, err
	}
	start := time.Now()
	// Each flow asked, answered and noted; then noted once more, for the flows whose answer came
	// back after their note (the machine's other load can hold the server back that long).
	// A chunk's flows wait unconfirmed meanwhile: at most half of what the fast path's table of
	// unconfirmed flows holds (a quarter of its entries, at least 1,024; two a flow), or the
	// chunk would evict its own first flows.
	chunk := min(20000, max(n/8, 256))
	if err := g.flowgen(0, n, 1, "pair", o.pps, chunk); err != nil {
		return r, err
	}
	time.Sleep(300 * time.Millisecond)
	if err := g.flowgen(0, n, 1, "note", o.pps, chunk); err != nil {
		return r, err
	}
	r.fillTime = time.Since(start)
	time.Sleep(300 * time.Millisecond)
	a1, err := g.answers()
	if err != nil {
		return r, err
	}
	r.answered = a1 - a0
	if fast {
		if r.bpfBytes, r.flowMapBytes, r.flowMapEntries, r.fastFlows, r.fastNew, err = fastPathMaps(pid); err != nil {
			return r, err
		}
	}
	r.rss = vmRSS(pid)
	r.ctEntries = conntrackCount(g.gw.name)
	slab1, _ := readSlab("nf_conntrack")
	r.ctObj = slab1.objSize
	r.slabGrowth = slab1.bytes() - slab0.bytes()
	// More flows while the table is full.
	r.overflow = o.overflow
	ct0 := conntrackStats(g.gw.name)
	// In chunks of 1,000: a flow the full table refused turns the next ones away for a while.
	if err := g.flowgen(n, n+o.overflow, 1, "pair", o.pps, 1000); err != nil {
		return r, err
	}
	time.Sleep(300 * time.Millisecond)
	a2, err := g.answers()
	if err != nil {
		return r, err
	}
	r.overflowOK = a2 - a1
	r.overflowCT = conntrackCount(g.gw.name) - r.ctEntries
	ct1 := conntrackStats(g.gw.name)
	r.ctDrop, r.ctEarlyDrop = ct1["drop"]-ct0["drop"], ct1["early_drop"]-ct0["early_drop"]
	r.ctInsert = r.overflowCT + r.ctEarlyDrop
	if fast {
		_, _, _, est, unconfirmed, err := fastPathMaps(pid)
		if err != nil {
			return r, err
		}
		r.overflowEst, r.overflowNew = est-r.fastFlows, unconfirmed-r.fastNew
	}
	// The held flows, asked again.
	stride := max(n/o.probe, 1)
	r.probe = (n + stride - 1) / stride
	if err := g.flowgen(0, n, stride, "ask", o.pps, 20000); err != nil {
		return r, err
	}
	time.Sleep(300 * time.Millisecond)
	a3, err := g.answers()
	if err != nil {
		return r, err
	}
	r.probeOK = a3 - a2
	ct2 := conntrackStats(g.gw.name)
	r.probeEarlyDrop = ct2["early_drop"] - ct1["early_drop"]
	r.probeInsert = conntrackCount(g.gw.name) - r.ctEntries - r.overflowCT + r.probeEarlyDrop
	if fast {
		_, _, _, est, _, err := fastPathMaps(pid)
		if err != nil {
			return r, err
		}
		r.probeEst = est - r.fastFlows - r.overflowEst
	}
	fmt.Printf("      %s flows, %s: %+v\n", thousands(n), r.path, r)
	return r, nil
}

// overflowWhere says where the flows opened while the table was full went.
func overflowWhere(r flowsResult) string {
	s := fmt.Sprintf("conntrack made %s entries for them", thousands(r.ctInsert))
	if r.ctDrop > 0 || r.ctEarlyDrop > 0 {
		s += fmt.Sprintf(", and being full dropped %s packets and evicted %s held entries not yet assured for new ones", thousands(r.ctDrop), thousands(r.ctEarlyDrop))
	}
	if r.flowMapEntries > 0 {
		s += fmt.Sprintf(", the fast path's unconfirmed (LRU) table %+d flows, its established table %+d", r.overflowNew, r.overflowEst)
	}
	return s
}

// probeNew says what the probe of the held flows created: nothing when every one was answered
// from the entry its flow held.
func probeNew(r flowsResult) string {
	s := fmt.Sprintf("conntrack %s", thousands(r.probeInsert))
	if r.probeEarlyDrop > 0 {
		s += fmt.Sprintf(" (evicting %s unassured entries)", thousands(r.probeEarlyDrop))
	}
	if r.flowMapEntries > 0 {
		s += fmt.Sprintf(", the fast path's established table %+d", r.probeEst)
	}
	if r.probeInsert == 0 && r.probeEst == 0 {
		s += ": every one answered from the entry its flow held"
	}
	return s
}

// flowsRows adds one path's figures at one size.
func flowsRows(t *table, n int, r flowsResult) {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	held := r.ctEntries
	where := fmt.Sprintf("%s conntrack entries", thousands(r.ctEntries))
	memory := fmt.Sprintf("conntrack: %s entries x %d B (nf_conntrack slab object) = %s (the slab grew %s over the fill, machine-wide); gateway RSS %s",
		thousands(r.ctEntries), r.ctObj, mib(int64(r.ctEntries)*int64(r.ctObj)), mib(r.slabGrowth), mib(r.rss))
	if r.flowMapEntries > 0 {
		held = r.fastFlows + r.ctEntries
		where = fmt.Sprintf("%s in the fast path's established table, %s unconfirmed, %s in conntrack", thousands(r.fastFlows), thousands(r.fastNew), thousands(r.ctEntries))
		memory = fmt.Sprintf("BPF maps %s, of which the flow tables %s (vg_flows: %s entries, preallocated; %.0f B a flow held); gateway RSS %s; conntrack %s entries",
			mib(r.bpfBytes), mib(r.flowMapBytes), thousands(r.flowMapEntries), float64(r.flowMapBytes)/float64(max(r.fastFlows, 1)), mib(r.rss), thousands(r.ctEntries))
	}
	t.add(row{Sub: true, What: fmt.Sprintf("%s flows, %s: held after the fill (%.1f s)", thousands(n), r.path, r.fillTime.Seconds()),
		Vipgate: fmt.Sprintf("%s of %s (%s); %s of %s asks answered", thousands(held), thousands(n), where, thousands(r.answered), thousands(r.asked)),
		Ref:     memory, Ratio: fmt.Sprintf("held/asked %.3f", float64(held)/float64(n))})
	t.add(row{Sub: true, What: fmt.Sprintf("%s flows, %s: %s new flows while the table is full", thousands(n), r.path, thousands(r.overflow)),
		Vipgate: fmt.Sprintf("%s answered; %s", thousands(r.overflowOK), overflowWhere(r))})
	t.add(row{Sub: true, What: fmt.Sprintf("%s flows, %s: the held flows asked again afterwards (every %s-th)", thousands(n), r.path, thousands(max(n/max(r.probe, 1), 1))),
		Vipgate: fmt.Sprintf("%s of %s answered; new entries for them: %s", thousands(r.probeOK), thousands(r.probe), probeNew(r))})
}
