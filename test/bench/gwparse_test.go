package main

import (
	"encoding/binary"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// The parsers and report code of the gateway connection-rate and flow-table rows (procstat.go,
// tcpgen.go, flowgen.go, gateway_cps.go, gateway_flows.go), on the kernel's and the tools' text.

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a parenthesis: fields count from its last ')'.
	stat := "4242 (nginx: wor)ker) S 4200 4200 4200 0 -1 4194624 1000 0 0 0 250 125 0 0 20 0 1 0 12345 100000000 2000 18446744073709551615\n"
	ppid, cpu, err := parseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if ppid != 4200 || cpu != 375*clockTick {
		t.Errorf("ppid %d cpu %v, want 4200 3.75s", ppid, cpu)
	}
	for _, bad := range []string{"", "4242 nginx S 1", "4242 (x) S 1 2 3"} {
		if _, _, err := parseProcStat(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseFDInfo(t *testing.T) {
	m, ok := parseFDInfo("pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t1\nkey_size:\t40\nvalue_size:\t64\nmax_entries:\t200000\nmap_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t21625600\nmap_id:\t312\nfrozen:\t0\n")
	want := bpfMapInfo{id: 312, mapType: 1, maxEntries: 200000, keySize: 40, valueSize: 64, memlock: 21625600}
	if !ok || m != want {
		t.Errorf("got %+v %v, want %+v", m, ok, want)
	}
	// A socket's or a program's descriptor is not a map.
	for _, s := range []string{"pos:\t0\nflags:\t02\nmnt_id:\t9\nino:\t1\n", "prog_type:\t3\nprog_jited:\t1\nmemlock:\t4096\nprog_id:\t77\n"} {
		if _, ok := parseFDInfo(s); ok {
			t.Errorf("%q read as a map", s)
		}
	}
}

func TestParseSlabinfo(t *testing.T) {
	text := `slabinfo - version: 2.1
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>
nf_conntrack      262144 262160    256   16    1 : tunables    0    0    0 : slabdata  16385  16385      0
TCP                   26     26   2368   13    8 : tunables    0    0    0 : slabdata      2      2      0
`
	c, err := parseSlabinfo(text)
	if err != nil {
		t.Fatal(err)
	}
	if got := c["nf_conntrack"]; got != (slabCache{active: 262144, objects: 262160, objSize: 256}) || got.bytes() != 262160*256 {
		t.Errorf("nf_conntrack: %+v", got)
	}
	if _, err := parseSlabinfo("slabinfo - version: 2.1\n"); err == nil {
		t.Error("no caches accepted")
	}
	if _, err := parseSlabinfo("x y z w\n"); err == nil {
		t.Error("a line of words accepted")
	}
}

func TestParseCounters(t *testing.T) {
	text := `# HELP vipgate_gateway_nat_fast_path_packets_total Packets...
# TYPE vipgate_gateway_nat_fast_path_packets_total counter
vipgate_gateway_nat_fast_path_packets_total{what="new"} 1234
vipgate_gateway_nat_fast_path_packets_total{what="snat_full"} 5.5e+06
vipgate_gateway_nat_fast_path_packets_total_other{what="new"} 9
vipgate_gateway_nat_fast_path{what="new"} 7
`
	got := parseCounters(text, "vipgate_gateway_nat_fast_path_packets_total", "what")
	if len(got) != 2 || got["new"] != 1234 || got["snat_full"] != 5.5e6 {
		t.Errorf("got %v", got)
	}
}

func TestTCPGenResultRoundTrip(t *testing.T) {
	r := tcpGenResult{done: 20000, errors: 3, inflight: 64, elapsed: 2 * time.Second, cpu: 1500 * time.Millisecond,
		p50: 80 * time.Microsecond, p90: 120 * time.Microsecond, p99: 400 * time.Microsecond, max: 3 * time.Millisecond,
		firstError: "connect: connection refused"}
	got, err := parseTCPGen("warning from ip netns\n" + r.format() + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got != r {
		t.Errorf("got %+v, want %+v", got, r)
	}
	if _, err := parseTCPGen("done=1 errors=0\n"); err == nil {
		t.Error("a line without times accepted")
	}
}

func TestParseNftCounter(t *testing.T) {
	n, err := parseNftCounter("table ip vgsink {\n\tcounter answers {\n\t\tpackets 98765 bytes 4543190\n\t}\n}\n")
	if err != nil || n != 98765 {
		t.Errorf("got %d %v", n, err)
	}
	if _, err := parseNftCounter("Error: No such file or directory"); err == nil {
		t.Error("an error message accepted")
	}
}

func TestParseConntrackStat(t *testing.T) {
	text := `entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
00040000  00000000 00000000 00000000 00000010 00000000 00000000 00000000 00000000 00000000 00000100 0000000a 00000000  00000000 00000000 00000000 00000000
00040000  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000001 00000005 00000000  00000000 00000000 00000000 00000000
`
	got := parseConntrackStat(text)
	if got["entries"] != 0x40000 || got["drop"] != 0x101 || got["early_drop"] != 15 || got["invalid"] != 17 {
		t.Errorf("got %v", got)
	}
	if len(parseConntrackStat("")) != 0 {
		t.Error("empty text gave figures")
	}
}

func TestParseVmRSS(t *testing.T) {
	if got := parseVmRSS("Name:\tvipgate\nVmPeak:\t 900000 kB\nVmRSS:\t   48128 kB\n"); got != 48128<<10 {
		t.Errorf("got %d", got)
	}
	if parseVmRSS("Name:\tx\n") != 0 {
		t.Error("no VmRSS gave a figure")
	}
}

// Flows are unique 5-tuples: 16 addresses x ports from 1024, a million of them.
func TestFlowTupleUnique(t *testing.T) {
	base := netip.MustParseAddr("198.51.100.16")
	seen := map[netip.AddrPort]int{}
	for k := range 1_000_000 {
		a, p := flowTuple(base, 16, k)
		ap := netip.AddrPortFrom(a, p)
		if j, ok := seen[ap]; ok {
			t.Fatalf("flows %d and %d share %v", j, k, ap)
		}
		seen[ap] = k
		if p < flowPortMin || !netip.MustParsePrefix("198.51.100.16/28").Contains(a) {
			t.Fatalf("flow %d: %v", k, ap)
		}
	}
}

// The UDP checksum verifies: the one's complement sum over the pseudo header and the datagram,
// checksum included, is 0xffff.
func TestUDPDatagramChecksum(t *testing.T) {
	for _, payload := range [][]byte{[]byte(strings.Repeat("a", flowPayload)), []byte("odd"), {}} {
		b := make([]byte, 64)
		src, dst := netip.MustParseAddrPort("198.51.100.17:1025"), netip.MustParseAddrPort("203.0.113.50:30080")
		n := udpDatagram(b, src, dst, payload)
		if n != 28+len(payload) || binary.BigEndian.Uint16(b[2:]) != uint16(n) || b[9] != 17 {
			t.Fatalf("header: %x", b[:20])
		}
		u := b[20:n]
		sum := uint32(0)
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		words := slices.Concat(s4[:], d4[:], []byte{0, 17, byte(len(u) >> 8), byte(len(u))}, u)
		if len(words)%2 == 1 {
			words = append(words, 0)
		}
		for i := 0; i < len(words); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(words[i:]))
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		if sum != 0xffff {
			t.Errorf("payload %q: checksum does not verify (sum %#x)", payload, sum)
		}
	}
}

func TestCPSSummary(t *testing.T) {
	s := func(rate, cpu, c50, c99, r50, r99 float64) cpsSample {
		return cpsSample{rate: rate, conns: rate, cpuPerConn: cpu * 1e3, connP50: c50 * 1e3, connP99: c99 * 1e3, rrP50: r50 * 1e3, rrP99: r99 * 1e3}
	}
	samples := map[string][]cpsSample{
		"ceiling":         {s(20000, 80, 60, 150, 30, 90), s(22000, 78, 62, 160, 31, 95)},
		"plain":           {s(10000, 120, 100, 300, 40, 120), s(12000, 118, 110, 320, 42, 130)},
		"direct+fastPath": {s(10000, 121, 105, 310, 41, 125), s(11400, 119, 112, 330, 43, 136)},
		"haproxy":         {s(4000, 250, 300, 900, 100, 700), s(4000, 255, 310, 950, 105, 720)},
	}
	names := []string{"ceiling", "plain", "direct+fastPath", "haproxy", "nginx"}
	got := cpsSummary(names, samples, time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC))
	for _, want := range []string{
		"Gateway vs HAProxy, 2026-12-07 19:00 UTC (medians of 2 alternating rounds",
		// ratios paired by round: 10000/10000 and 11400/12000 -> median 0.975; / HAProxy 2.5, 2.85
		"| vipgate direct, NAT fast path (tc BPF; the default) | 10,700 | 0.97 | 2.67 | 120.0 (+1.0) | 108.5 / 320.0 (+3.5 / +10.0) | 42.0 / 130.5 (+1.0 / +5.5) |",
		"| plainly routed (no table) | 11,000 | 1.00 | 2.75 | 119.0 | 105.0 / 310.0 |",
		"| no gateway (sender -> server over one veth) | 21,000 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "nginx") {
		t.Errorf("a path without samples has a line:\n%s", got)
	}
	if a := addedLatency([]float64{5, 9, 1}, []float64{1, 2, 3}); a != 4 {
		t.Errorf("addedLatency: %v, want the median of 4, 7, -2", a)
	}
}

func TestParseFlagsGatewayCPSFlows(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !o.sections["gateway-cps"] || !o.sections["gateway-flows"] || !slices.Equal(o.gwCPS.modes, []string{"nodePort", "direct"}) ||
		!slices.Equal(o.gwCPS.proxies, []string{"haproxy", "nginx"}) || !slices.Equal(o.gwFlows.sizes, []int{100000, 1000000}) {
		t.Errorf("defaults: %v %+v %+v", o.sections, o.gwCPS, o.gwFlows)
	}
	o, err = parseFlags([]string{"--only", "gateway-cps", "--quick", "--gw-cps-proxies", "", "--gw-cps-modes", "direct"})
	if err != nil {
		t.Fatal(err)
	}
	if o.gwCPS.rounds != 2 || len(o.gwCPS.proxies) != 0 || !slices.Equal(o.gwCPS.modes, []string{"direct"}) || !slices.Equal(o.gwFlows.sizes, []int{100000}) {
		t.Errorf("--quick --gw-cps-proxies '' --gw-cps-modes direct: %+v %+v", o.gwCPS, o.gwFlows)
	}
	for _, bad := range [][]string{{"--gw-cps-modes", "route"}, {"--gw-cps-proxies", "envoy"}, {"--gw-cps-concurrency", "0"},
		{"--gw-flows", "2000000"}, {"--gw-flows", "10"}, {"--gw-flows-overflow", "50000"}, {"--gw-cps-time", "1m"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestHAProxyNginxConfig(t *testing.T) {
	l, b := netip.MustParseAddrPort("203.0.113.51:30081"), netip.MustParseAddrPort("192.0.2.11:30080")
	h := haproxyConfig(l, b, gwProxySource)
	for _, want := range []string{"mode tcp", "bind 203.0.113.51:30081", "server node1 192.0.2.11:30080 source 192.0.2.101", "nbthread 2"} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, h)
		}
	}
	n := nginxConfig("/tmp/x", l, b, gwProxySource)
	for _, want := range []string{"daemon off;", "listen 203.0.113.51:30081;", "proxy_pass 192.0.2.11:30080;", "proxy_bind 192.0.2.101;", "pid /tmp/x/nginx.pid;", "ngx_stream_module.so"} {
		if !strings.Contains(n, want) {
			t.Errorf("nginx config lacks %q:\n%s", want, n)
		}
	}
}

func TestGatewayCPSPlot(t *testing.T) {
	samples := map[string][]cpsSample{"plain": {{rate: 7000, cpuPerConn: 140e3}}, "haproxy": {{rate: 3500, cpuPerConn: 330e3}}}
	g := cpsPlotData([]string{"ceiling", "plain", "haproxy"}, samples)
	if !slices.Equal(g.names, []string{"plain", "haproxy"}) || !slices.Equal(g.rates, []float64{7000, 3500}) {
		t.Fatalf("plot data: %+v", g)
	}
	f, err := g.draw(t.TempDir(), "2026-12-07")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f)
	if err != nil || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), "HAProxy") {
		t.Errorf("%s: %v, %.200q", f, err, b)
	}
	if f, err := (&gwCPSPlot{}).draw(t.TempDir(), "x"); f != "" || err != nil {
		t.Errorf("an empty plot drew %q, %v", f, err)
	}
}
