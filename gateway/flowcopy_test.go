package gateway

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// flowKey4 is the kernel's IPv4 gateway-flows key of a flow: each field in its own 4-byte register,
// the ports in network order and padded.
func flowKey4(src string, sport uint16, dst string, dport uint16) []byte {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	k := append([]byte(nil), s[:]...)
	k = binary.BigEndian.AppendUint16(k, sport)
	k = append(k, 0, 0)
	k = append(k, d[:]...)
	k = binary.BigEndian.AppendUint16(k, dport)
	return append(k, 0, 0)
}

func nodeID(t *testing.T, a string) uint32 {
	t.Helper()
	id, ok := dataplane.GatewayNodeID(netip.MustParseAddr(a))
	if !ok {
		t.Fatalf("%s has no node id", a)
	}
	return id
}

func TestFlowCopyTranslate(t *testing.T) {
	n1, n2, gone := nodeID(t, "192.0.2.11"), nodeID(t, "192.0.2.12"), nodeID(t, "192.0.2.99")
	plan := flowCopyPlan{keyLen: dataplane.FlowKeyLen(cluster.IPv4), nodes: map[uint32]bool{n1: true, n2: true}, timeout: time.Hour}
	key := flowKey4("10.0.0.1", 1234, "203.0.113.50", 80)
	for _, c := range []struct {
		name string
		in   dataplane.GatewayFlow
		want dataplane.GatewayFlow
		skip flowSkip
	}{
		{"kept with its life and the map's timeout", dataplane.GatewayFlow{Key: key, Mark: n1, Timeout: time.Hour, Expires: 20 * time.Minute},
			dataplane.GatewayFlow{Key: key, Mark: n1, Timeout: time.Hour, Expires: 20 * time.Minute}, flowCopied},
		{"a longer timeout (another configuration) is cut to the map's", dataplane.GatewayFlow{Key: key, Mark: n2, Timeout: 2 * time.Hour, Expires: 90 * time.Minute},
			dataplane.GatewayFlow{Key: key, Mark: n2, Timeout: time.Hour, Expires: time.Hour}, flowCopied},
		{"its node left", dataplane.GatewayFlow{Key: key, Mark: gone, Timeout: time.Hour, Expires: time.Minute}, dataplane.GatewayFlow{}, flowGoneNode},
		{"no node", dataplane.GatewayFlow{Key: key, Timeout: time.Hour, Expires: time.Minute}, dataplane.GatewayFlow{}, flowGoneNode},
		{"about to expire", dataplane.GatewayFlow{Key: key, Mark: n1, Timeout: time.Hour, Expires: 500 * time.Millisecond}, dataplane.GatewayFlow{}, flowExpiring},
		{"no expiry", dataplane.GatewayFlow{Key: key, Mark: n1}, dataplane.GatewayFlow{}, flowExpiring},
		{"an IPv6 key in an IPv4 map", dataplane.GatewayFlow{Key: []byte{1, 2, 3, 4}, Mark: n1, Expires: time.Minute}, dataplane.GatewayFlow{}, flowBadKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, skip := plan.translate(c.in)
			if skip != c.skip {
				t.Fatalf("skip %d, want %d", skip, c.skip)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
	if dataplane.FlowKeyLen(dataplane.NetdevFamily(cluster.IPv6)) != 4 || dataplane.FlowKeyLen(dataplane.NetdevFamily(cluster.IPv4)) != 16 {
		t.Errorf("key lengths %d %d, want 16 (IPv4) and 4 (IPv6), whatever the table", dataplane.FlowKeyLen(dataplane.NetdevFamily(cluster.IPv4)), dataplane.FlowKeyLen(dataplane.NetdevFamily(cluster.IPv6)))
	}
}

func TestGatewayFlowNodes(t *testing.T) {
	ap := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	got := gatewayFlowNodes([]Entry{
		{Backends: []netip.AddrPort{ap("192.0.2.11:80"), ap("192.0.2.12:80")}, Draining: []netip.AddrPort{ap("192.0.2.13:80")}},
		{Algorithm: cluster.LBSourceHash, Backends: []netip.AddrPort{ap("192.0.2.14:80")}},
	})
	want := map[uint32]bool{nodeID(t, "192.0.2.11"): true, nodeID(t, "192.0.2.12"): true, nodeID(t, "192.0.2.13"): true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backends and draining nodes of Maglev VIP ports (-want +got)\n%s", diff)
	}
}

// memFlows is a GatewayFlowStore of maps in memory that refuses, as the kernel does, a transaction
// with an entry the map holds with another node.
type memFlows struct {
	maps  map[string]map[string]dataplane.GatewayFlow
	chunk int
	txs   int
}

func (m *memFlows) ReadGatewayFlows(f cluster.Family, table, _ string, _ time.Time, each func([]dataplane.GatewayFlow) error) error {
	src, ok := m.maps[table]
	if !ok {
		return dataplane.ErrNoFlowsMap
	}
	var chunk []dataplane.GatewayFlow
	for _, fl := range src {
		chunk = append(chunk, fl)
		if len(chunk) == m.chunk {
			if err := each(chunk); err != nil {
				return err
			}
			chunk = nil
		}
	}
	if len(chunk) > 0 {
		return each(chunk)
	}
	return nil
}

func (m *memFlows) GatewayFlowWriter(f cluster.Family, table, _ string, _ time.Time) (dataplane.GatewayFlowWriter, error) {
	return memWriter{m, table}, nil
}

type memWriter struct {
	m     *memFlows
	table string
}

func (w memWriter) Add(flows []dataplane.GatewayFlow) error {
	w.m.txs++
	dst := w.m.maps[w.table]
	for _, fl := range flows {
		if old, ok := dst[string(fl.Key)]; ok && old.Mark != fl.Mark {
			return fmt.Errorf("adding: %w", unix.EEXIST)
		}
	}
	for _, fl := range flows {
		dst[string(fl.Key)] = fl
	}
	return nil
}

func (memWriter) Close() error { return nil }

// TestCopyGatewayFlows copies a map of 20,000 entries in memory: the kept ones arrive with their
// node and life, the stale and expiring ones do not, and the destination's clashing entries stay as
// they are (the transactions that held them split down to them).
func TestCopyGatewayFlows(t *testing.T) {
	n1, n2 := nodeID(t, "192.0.2.11"), nodeID(t, "192.0.2.12")
	src, dst := map[string]dataplane.GatewayFlow{}, map[string]dataplane.GatewayFlow{}
	for i := range 20000 {
		fl := dataplane.GatewayFlow{Key: flowKey4("10.0.0.1", uint16(i), "203.0.113.50", 80), Mark: n1, Timeout: time.Hour, Expires: time.Duration(i+1) * time.Second}
		switch {
		case i%100 == 1:
			fl.Mark = 7 // no node's id
		case i == 0:
			fl.Expires = 100 * time.Millisecond
		}
		src[string(fl.Key)] = fl
	}
	// The destination learnt three of the flows itself, two with another node.
	for _, i := range []int{10, 500, 19999} {
		k := flowKey4("10.0.0.1", uint16(i), "203.0.113.50", 80)
		mark := n2
		if i == 500 {
			mark = n1
		}
		dst[string(k)] = dataplane.GatewayFlow{Key: k, Mark: mark, Timeout: time.Hour, Expires: time.Minute}
	}
	store := &memFlows{maps: map[string]map[string]dataplane.GatewayFlow{"from": src, "to": dst}, chunk: 1000}
	plan := flowCopyPlan{keyLen: 16, nodes: map[uint32]bool{n1: true, n2: true}, timeout: time.Hour}
	c := copyGatewayFlows(store, flowTable{dataplane.NetdevFamily(cluster.IPv4), "from"}, flowTable{cluster.IPv4, "to"}, plan, "test", time.Time{})
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	want := FlowCopy{Read: 20000, Copied: 20000 - 200 - 1 - 2, Stale: 200, Expiring: 1, Refused: 2}
	got := FlowCopy{Read: c.Read, Copied: c.Copied, Stale: c.Stale, Expiring: c.Expiring, Refused: c.Refused}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	for _, i := range []int{10, 19999} {
		if fl := dst[string(flowKey4("10.0.0.1", uint16(i), "203.0.113.50", 80))]; fl.Mark != n2 {
			t.Errorf("flow %d: node %#x, want the destination's own %#x", i, fl.Mark, n2)
		}
	}
	if fl := dst[string(flowKey4("10.0.0.1", 500, "203.0.113.50", 80))]; fl.Expires != 501*time.Second {
		t.Errorf("a flow the destination held with the same node: life %v, want the copied %v", fl.Expires, 501*time.Second)
	}
	if len(dst) != 20000-200-1 {
		t.Errorf("destination holds %d entries, want %d", len(dst), 20000-200-1)
	}
	t.Logf("%d transactions", store.txs)
	// A source that does not exist: nothing read, no error.
	if c := copyGatewayFlows(store, flowTable{cluster.IPv4, "none"}, flowTable{cluster.IPv4, "to"}, plan, "test", time.Time{}); c.Err != nil || c.Read != 0 {
		t.Errorf("copy from a missing table: %+v", c)
	}
}

func TestSplitIngress(t *testing.T) {
	in := &dataplane.Chain{Name: "gateway-ingress-s0", Hook: dataplane.HookIngress, Devices: []string{"s0"}}
	route := &dataplane.Chain{Name: ChainGatewayRoute}
	tx := &dataplane.Tx{Family: dataplane.NetdevFamily(cluster.IPv4), Table: "t", Full: true, AddChains: []*dataplane.Chain{in, route}, AddSets: []*dataplane.Set{{Name: "s"}}}
	first, hooks := splitIngress(tx)
	if !first.Full || len(first.AddSets) != 1 || len(first.AddChains) != 1 || first.AddChains[0] != route {
		t.Errorf("first: %s", first)
	}
	if hooks == nil || hooks.Full || len(hooks.AddChains) != 1 || hooks.AddChains[0] != in || len(hooks.AddSets) != 0 {
		t.Errorf("hooks: %v", hooks)
	}
	if len(tx.AddChains) != 2 {
		t.Error("the transaction was changed")
	}
}

// readFlows reads a table's gateway-flows by key.
func readFlows(t *testing.T, prog *dataplane.NetlinkProgrammer, f cluster.Family, table string) map[string]dataplane.GatewayFlow {
	t.Helper()
	out := map[string]dataplane.GatewayFlow{}
	err := prog.ReadGatewayFlows(f, table, MapGatewayFlows, time.Time{}, func(fls []dataplane.GatewayFlow) error {
		for _, fl := range fls {
			fl.Key = bytes.Clone(fl.Key)
			out[string(fl.Key)] = fl
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	return out
}

// TestGatewayFlowCopyKernel takes the fast path off and on again in a gateway namespace whose netdev
// table holds entries put there by nft and by real datagrams through the fast path, and checks that
// the other table holds them afterwards: same keys and nodes, the life they had left.
func TestGatewayFlowCopyKernel(t *testing.T) {
	needNetnsTools(t, "ip", "python3", "nft")
	cl, gw, _ := netdevLab(t)
	vip := "203.0.113.50"
	st := gatewayUDPState(vip, "192.0.2.11")
	onLink, wantOn := true, true
	fast := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", onLink, nil }}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: nsFd(t, gw)}
	defer prog.Close()
	p := routeGateway(cluster.IPv4, fast, prog)
	sync := func(what string, want int) []FlowCopy {
		t.Helper()
		copies := syncFastPath(t, what, p, st, wantOn)
		if len(copies) != want {
			t.Fatalf("%s: %d copies, want %d: %v", what, len(copies), want, copies)
		}
		return copies
	}
	sync("first", 0) // both tables new, nothing to copy
	netdev, table := dataplane.NetdevTableName(cluster.DefaultTableName, cluster.IPv4), cluster.DefaultTableName
	nft := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", gw, "nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	n1 := nodeID(t, "192.0.2.11")
	// nft (1.0.6) stores the value of a `typeof ... : meta mark` element as spelled, in network
	// order, where the packets' `meta mark` (what gateway-flows holds) is in host order: the
	// entries are spelled so that the kernel holds what a packet of node 192.0.2.11 would write.
	asNft := func(mark uint32) uint32 { return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, mark)) }
	nft("add", "element", "netdev", netdev, MapGatewayFlows, fmt.Sprintf(
		"{ 10.0.0.1 . 1234 . %[1]s . 5000 timeout 1h expires 30m : %#[2]x, 10.0.0.2 . 1234 . %[1]s . 5000 timeout 1h expires 30m : %#[3]x, 10.0.0.3 . 1234 . %[1]s . 5000 timeout 1h expires 100ms : %#[2]x }",
		vip, asNft(n1), asNft(7)))
	udpSend(t, cl, vip, 5000, 100) // a flow of real packets, through the fast path
	before := readFlows(t, prog, dataplane.NetdevFamily(cluster.IPv4), netdev)
	if len(before) < 3 {
		// The 100 ms entry may be gone already.
		t.Fatalf("netdev table's flows: %d, want those written by nft and the datagrams'", len(before))
	}
	kept := flowKey4("10.0.0.1", 1234, vip, 5000)
	if fl, ok := before[string(kept)]; !ok || fl.Mark != n1 {
		t.Fatalf("the entry nft wrote is not read back with the key layout flowKey4 and node %#x: %v", n1, before)
	}

	// Off: the node is no longer on-link, the netdev table is deleted, its flows copied first.
	onLink, wantOn = false, false
	time.Sleep(200 * time.Millisecond) // the 100 ms entry expires
	c := sync("off", 1)[0]
	if c.Read != 3 || c.Copied != 2 || c.Stale != 1 {
		t.Errorf("fast path off: %s; want 3 read, 2 copied (the node's), 1 stale", c)
	}
	if out, _ := exec.Command("ip", "netns", "exec", gw, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), netdev) {
		t.Fatalf("the netdev table is left:\n%s", out)
	}
	after := readFlows(t, prog, cluster.IPv4, table)
	check := func(what string, got map[string]dataplane.GatewayFlow, skew time.Duration) {
		t.Helper()
		for k, b := range before {
			if b.Mark != n1 || b.Expires < flowMinLife {
				if _, ok := got[k]; ok {
					t.Errorf("%s: the stale or expired entry %x was copied", what, k)
				}
				continue
			}
			a, ok := got[k]
			switch {
			case !ok:
				t.Errorf("%s: entry %x (node %#x) missing", what, k, b.Mark)
			case a.Mark != b.Mark:
				t.Errorf("%s: entry %x has node %#x, want %#x", what, k, a.Mark, b.Mark)
			case a.Timeout != 0 && a.Timeout != dataplane.DefaultGatewayFlowTimeout: // 0: the kernel lists no timeout equal to the map's
				t.Errorf("%s: entry %x has timeout %v, want the map's %v", what, k, a.Timeout, dataplane.DefaultGatewayFlowTimeout)
			case a.Expires > b.Expires || a.Expires < b.Expires-skew:
				t.Errorf("%s: entry %x expires in %v, want within %v below %v", what, k, a.Expires, skew, b.Expires)
			}
		}
	}
	check("the family's table after the fast path went off", after, 10*time.Second)
	if list := nft("list", "map", "ip", table, MapGatewayFlows); !strings.Contains(list, "10.0.0.1 . 1234 . "+vip+" . 5000") {
		t.Errorf("nft does not list the copied entry as it was written:\n%s", list)
	}

	// On again: the new netdev table is seeded from the family's before its ingress chain exists.
	onLink, wantOn = true, true
	copies := sync("on again", 1)
	if c := copies[0]; c.Why != "fast path on" || c.Copied != 2 {
		t.Errorf("fast path on: %s; want 2 copied into the new netdev table", c)
	}
	check("the netdev table after the fast path came back", readFlows(t, prog, dataplane.NetdevFamily(cluster.IPv4), netdev), 20*time.Second)

	// A restart: both tables are written afresh; the old netdev table's flows go to the new family
	// table, and from there to the new netdev table.
	p = routeGateway(cluster.IPv4, fast, prog)
	copies = sync("restart", 2)
	if copies[0].Why != "netdev table rewritten" || copies[1].Why != "fast path on" {
		t.Errorf("restart: copies %v; want the old netdev table's into the family's, then back", copies)
	}
	check("the family's table after a restart", readFlows(t, prog, cluster.IPv4, table), 30*time.Second)
	check("the netdev table after a restart", readFlows(t, prog, dataplane.NetdevFamily(cluster.IPv4), netdev), 30*time.Second)

	// A netdev transaction the kernel refuses (a device name longer than IFNAMSIZ-1): the table is
	// deleted, its flows copied into the family's first.
	nft("flush", "map", "ip", table, MapGatewayFlows)
	fast.Devices, wantOn = []string{"s0", "a-sixteen-bytes!"}, false
	copies = sync("refused", 2)
	if copies[0].Why != "netdev table rewritten" || copies[0].Copied != 2 {
		t.Errorf("a refused netdev transaction: copies %v; want the netdev table's 2 entries copied first", copies)
	}
	if out, _ := exec.Command("ip", "netns", "exec", gw, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), netdev) {
		t.Fatalf("the netdev table is left after the failure:\n%s", out)
	}
	check("the family's table after a refused netdev transaction", readFlows(t, prog, cluster.IPv4, table), 30*time.Second)
}

// TestGatewayFlowCopyScale writes 100,000 entries (VIPGATE_FLOWCOPY_ENTRIES) into a netdev table's gateway-flows and copies them
// into the family's table, logging how long each takes (not asserted: a shared machine).
func TestGatewayFlowCopyScale(t *testing.T) {
	needNetnsTools(t, "ip")
	if testing.Short() {
		t.Skip("short")
	}
	_, gw, _ := netdevLab(t)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: nsFd(t, gw)}
	defer prog.Close()
	st := gatewayUDPState("203.0.113.50", "192.0.2.11")
	fast := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil }}
	rep, err := routeGateway(cluster.IPv4, fast, prog).Sync(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 100000
	if v, err := strconv.Atoi(os.Getenv("VIPGATE_FLOWCOPY_ENTRIES")); err == nil && v > 0 && v <= dataplane.GatewayFlowsMax {
		n = v // a measurement of another size (GatewayFlowsMax: a full map)
	}
	n1 := nodeID(t, "192.0.2.11")
	netdev := flowTable{dataplane.NetdevFamily(cluster.IPv4), dataplane.NetdevTableName(cluster.DefaultTableName, cluster.IPv4)}
	w, err := prog.GatewayFlowWriter(netdev.family, netdev.table, MapGatewayFlows, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	batch := make([]dataplane.GatewayFlow, 0, dataplane.FlowCopyBatch)
	for i := range n {
		batch = append(batch, dataplane.GatewayFlow{Key: flowKey4(fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&0xff, i&0xff), uint16(i), "203.0.113.50", 5000),
			Mark: n1, Timeout: time.Hour, Expires: 30 * time.Minute})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.Add(batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	w.Close()
	t.Logf("writing %d entries: %v", n, time.Since(start))
	start = time.Now()
	read := 0
	if err := prog.ReadGatewayFlows(netdev.family, netdev.table, MapGatewayFlows, time.Time{}, func(fls []dataplane.GatewayFlow) error { read += len(fls); return nil }); err != nil {
		t.Fatal(err)
	}
	t.Logf("reading %d entries: %v", read, time.Since(start))
	plan := flowCopyPlan{keyLen: 16, nodes: gatewayFlowNodes(rep.Entries), timeout: time.Hour}
	// Without a deadline, to measure a whole copy (a sync's copies stop at flowCopyBudget).
	c := copyGatewayFlows(prog, netdev, flowTable{cluster.IPv4, cluster.DefaultTableName}, plan, "scale", time.Time{})
	t.Logf("copying: %s", c)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	if c.Read != n || c.Copied != n {
		t.Errorf("%s; want %d read and copied", c, n)
	}
	got := 0
	if err := prog.ReadGatewayFlows(cluster.IPv4, cluster.DefaultTableName, MapGatewayFlows, time.Time{}, func(fls []dataplane.GatewayFlow) error { got += len(fls); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Errorf("the family's table holds %d entries, want %d", got, n)
	}
	// Once more within a sync's budget (the entries are there with the same node: accepted):
	// how far it gets, logged.
	c = copyGatewayFlows(prog, netdev, flowTable{cluster.IPv4, cluster.DefaultTableName}, plan, "scale, budgeted", time.Now().Add(flowCopyBudget))
	t.Logf("copying within flowCopyBudget (%v): %s: %s", flowCopyBudget, c.Result(), c)
	if c.Err != nil && c.Result() != "truncated" {
		t.Error(c.Err)
	}
}

// TestGatewayFlowCopyKernelIPv6 does the same with IPv6, whose gateway-flows key is a 32-bit hash
// of the flow: the fast path goes off and comes back, its entries going to the ip6 table and back.
func TestGatewayFlowCopyKernelIPv6(t *testing.T) {
	needNetnsTools(t, "ip")
	ns := fmt.Sprintf("vgt%d-fc6", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "s0", "type", "veth", "peer", "name", "n0").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	st := gatewayUDPState("2001:db8:5::50", "2001:db8::11")
	onLink := true
	fast := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", onLink, nil }}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: nsFd(t, ns)}
	defer prog.Close()
	p := routeGateway(cluster.IPv6, fast, prog)
	syncFastPath(t, "on", p, st, onLink)
	netdev := flowTable{dataplane.NetdevFamily(cluster.IPv6), dataplane.NetdevTableName(cluster.DefaultTableName, cluster.IPv6)}
	n1 := nodeID(t, "2001:db8::11")
	w, err := prog.GatewayFlowWriter(netdev.family, netdev.table, MapGatewayFlows, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	kept, stale := []byte{0x12, 0x34, 0x56, 0x78}, []byte{0x9a, 0xbc, 0xde, 0xf0}
	if err := w.Add([]dataplane.GatewayFlow{{Key: kept, Mark: n1, Timeout: time.Hour, Expires: 20 * time.Minute}, {Key: stale, Mark: 7, Timeout: time.Hour, Expires: 20 * time.Minute}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	want := func(what string, got map[string]dataplane.GatewayFlow) {
		t.Helper()
		fl, ok := got[string(kept)]
		if !ok || fl.Mark != n1 || fl.Expires > 20*time.Minute || fl.Expires < 20*time.Minute-10*time.Second {
			t.Errorf("%s: entry %x: %+v (present %v), want node %#x and ~20m left", what, kept, fl, ok, n1)
		}
		if _, ok := got[string(stale)]; ok {
			t.Errorf("%s: the stale entry was copied", what)
		}
	}
	onLink = false
	syncFastPath(t, "off", p, st, onLink)
	want("the ip6 table after the fast path went off", readFlows(t, prog, cluster.IPv6, cluster.DefaultTableName))
	onLink = true
	syncFastPath(t, "on again", p, st, onLink)
	want("the netdev table after the fast path came back", readFlows(t, prog, netdev.family, netdev.table))
}

// copyCounter is a Programmer and a GatewayFlowStore of no kernel: the netdev transactions that add
// ingress chains fail while failHooks is set, every table's gateway-flows holds one entry of node
// 192.0.2.11, and reads lists the tables read (one per copy).
type copyCounter struct {
	failHooks bool
	node      uint32
	reads     []string
}

func (c *copyCounter) Apply(tx *dataplane.Tx) error {
	if dataplane.IsNetdev(tx.Family) && c.failHooks && slices.ContainsFunc(tx.AddChains, func(ch *dataplane.Chain) bool { return ch.Hook == dataplane.HookIngress }) {
		return errors.New("ingress chain refused")
	}
	return nil
}

func (c *copyCounter) ReadGatewayFlows(f cluster.Family, table, _ string, _ time.Time, each func([]dataplane.GatewayFlow) error) error {
	c.reads = append(c.reads, table)
	return each([]dataplane.GatewayFlow{{Key: flowKey4("10.0.0.1", 1234, "203.0.113.50", 5000), Mark: c.node, Timeout: time.Hour, Expires: time.Minute}})
}

func (c *copyCounter) GatewayFlowWriter(cluster.Family, string, string, time.Time) (dataplane.GatewayFlowWriter, error) {
	return memWriter{&memFlows{maps: map[string]map[string]dataplane.GatewayFlow{"": {}}}, ""}, nil
}

// TestGatewayFlowCopySyncs: which syncs copy the connection table. A start copies (the netdev table
// is written afresh); a routine diff (a node added) does not; a fast path whose ingress chains the
// kernel refuses copies at its first failure but not at the retries of its backoff, and once a retry
// succeeds copies the family's flows into the new table; a sync without nodes copies nothing.
func TestGatewayFlowCopySyncs(t *testing.T) {
	st := gatewayUDPState("203.0.113.50", "192.0.2.11")
	index := map[string]int{"s0": 2, "n0": 3}
	fp := &FastPath{Devices: []string{"s0"},
		NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil },
		Index:      func(d string) int { return index[d] }}
	prog := &copyCounter{node: nodeID(t, "192.0.2.11")}
	p := routeGateway(cluster.IPv4, fp, prog)
	clock := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return clock }
	sync := func(step string, wantWhys ...string) {
		t.Helper()
		prog.reads = nil
		rep, err := p.Sync(st, nil)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var whys []string
		for _, c := range rep.FlowCopies {
			whys = append(whys, c.Why)
			if c.Err != nil {
				t.Errorf("%s: copy %s: %v", step, c, c.Err)
			}
		}
		if !slices.Equal(whys, wantWhys) || len(prog.reads) != len(wantWhys) {
			t.Errorf("%s: copies %q (tables read %q), want %q", step, whys, prog.reads, wantWhys)
		}
	}
	sync("start", "netdev table rewritten", "fast path on")
	st.Nodes["node2"] = &cluster.Node{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}
	sync("a node added (a diff)")
	delete(st.Nodes, "node2")
	sync("a node removed (a diff)")

	prog.failHooks = true
	index["s0"] = 4 // the device re-created: the netdev table is written afresh, and refused
	sync("first failure", "netdev table rewritten", "fast path on")
	for i := range 3 {
		clock = clock.Add(time.Minute) // past the backoff
		sync(fmt.Sprintf("retry %d, failing again", i+1))
	}
	prog.failHooks = false
	clock = clock.Add(time.Minute)
	sync("the retry that succeeds", "fast path on after a failure")
	sync("nothing changed")

	st.Nodes = map[string]*cluster.Node{}
	sync("no nodes: the fast path off, every entry stale")
}

// TestGatewayFlowCopyClash copies a netdev table's entries into a family table that holds some of
// the same flows itself, in a gateway namespace: the entries it holds with another node stay so and
// the others are copied (an entry held with the same node takes the copied life); with a clash in
// every few entries, the copy stops at its cap of refused transactions, truncated, having
// overwritten none of the destination's.
func TestGatewayFlowCopyClash(t *testing.T) {
	needNetnsTools(t, "ip")
	ns := fmt.Sprintf("vgt%d-fcc", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "s0", "type", "veth", "peer", "name", "n0").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	st := gatewayUDPState("203.0.113.50", "192.0.2.11")
	fast := &FastPath{Devices: []string{"s0"}, NodeDevice: func(netip.Addr) (string, bool, error) { return "n0", true, nil }}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: nsFd(t, ns)}
	defer prog.Close()
	syncFastPath(t, "on", routeGateway(cluster.IPv4, fast, prog), st, true)
	n1, n2 := nodeID(t, "192.0.2.11"), nodeID(t, "192.0.2.12")
	netdev := flowTable{dataplane.NetdevFamily(cluster.IPv4), dataplane.NetdevTableName(cluster.DefaultTableName, cluster.IPv4)}
	fam := flowTable{cluster.IPv4, cluster.DefaultTableName}
	key := func(i int) []byte {
		return flowKey4(fmt.Sprintf("10.0.%d.%d", i>>8, i&0xff), 1234, "203.0.113.50", 5000)
	}
	write := func(to flowTable, fls []dataplane.GatewayFlow) {
		t.Helper()
		w, err := prog.GatewayFlowWriter(to.family, to.table, MapGatewayFlows, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := w.Add(fls); err != nil {
			t.Fatalf("writing %s: %v", to, err)
		}
	}
	const n = 2000
	var src []dataplane.GatewayFlow
	for i := range n {
		src = append(src, dataplane.GatewayFlow{Key: key(i), Mark: n1, Timeout: time.Hour, Expires: 30 * time.Minute})
	}
	write(netdev, src)
	// The family's table learnt three of the flows with another node, one with the same node.
	clash := []int{7, 1000, 1999}
	var own []dataplane.GatewayFlow
	for _, i := range clash {
		own = append(own, dataplane.GatewayFlow{Key: key(i), Mark: n2, Timeout: time.Hour, Expires: 5 * time.Minute})
	}
	own = append(own, dataplane.GatewayFlow{Key: key(500), Mark: n1, Timeout: time.Hour, Expires: 5 * time.Minute})
	write(fam, own)
	plan := flowCopyPlan{keyLen: 16, nodes: map[uint32]bool{n1: true}, timeout: time.Hour}
	// A dump during a resize of the source's hash table (the kernel's, in the background, after
	// the writes) lists entries twice and misses others: the copy says so (Duplicates, truncated),
	// and is made again, which writes the same.
	c := copyGatewayFlows(prog, netdev, fam, plan, "clash", time.Time{})
	for i := 0; i < 5 && c.Duplicates > 0; i++ {
		t.Logf("copy: %s: %v; again", c, c.Err)
		time.Sleep(100 * time.Millisecond)
		c = copyGatewayFlows(prog, netdev, fam, plan, "clash", time.Time{})
	}
	t.Logf("copy: %s", c)
	if c.Err != nil || c.Read != n || c.Refused != len(clash) || c.Copied != n-len(clash) || c.Aborts > flowCopyMaxAborts {
		t.Errorf("%s (err %v); want %d read, %d refused, the rest copied, at most %d refused transactions", c, c.Err, n, len(clash), flowCopyMaxAborts)
	}
	// The kernel's dump restarts its hash walk at each message and skips what it sent: while the
	// map's hash table is resized (in the background, after many inserts), it can miss entries.
	// The table is read again until it holds what is expected, a few times.
	settled := func(want int) map[string]dataplane.GatewayFlow {
		got := readFlows(t, prog, fam.family, fam.table)
		for i := 0; i < 20 && len(got) != want; i++ {
			time.Sleep(50 * time.Millisecond)
			got = readFlows(t, prog, fam.family, fam.table)
		}
		return got
	}
	got := settled(n)
	if len(got) != n {
		t.Errorf("the family's table holds %d entries, want %d", len(got), n)
	}
	for i := range n {
		fl, want := got[string(key(i))], n1
		if slices.Contains(clash, i) {
			want = n2
		}
		if fl.Mark != want {
			t.Errorf("entry %d: node %#x, want %#x", i, fl.Mark, want)
		}
	}
	if fl := got[string(key(500))]; fl.Expires < 20*time.Minute {
		t.Errorf("the entry the destination held with the same node expires in %v, want the copied ~30m", fl.Expires)
	}

	// A clash in every tenth entry: more than the cap of refused transactions can find.
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "flush", "map", "ip", fam.table, MapGatewayFlows).CombinedOutput(); err != nil {
		t.Fatalf("nft flush: %v: %s", err, out)
	}
	own = own[:0]
	for i := 0; i < n; i += 10 {
		own = append(own, dataplane.GatewayFlow{Key: key(i), Mark: n2, Timeout: time.Hour, Expires: 5 * time.Minute})
	}
	write(fam, own)
	c = copyGatewayFlows(prog, netdev, fam, plan, "many clashes", time.Time{})
	t.Logf("copy: %s: %v", c, c.Err)
	if c.Result() != "truncated" || c.Aborts > flowCopyMaxAborts {
		t.Errorf("%s: %s (%v), want truncated after at most %d refused transactions", c, c.Result(), c.Err, flowCopyMaxAborts)
	}
	got = settled(len(own) + c.Copied)
	for i := 0; i < n; i += 10 {
		if fl := got[string(key(i))]; fl.Mark != n2 {
			t.Errorf("entry %d: node %#x, want the destination's own %#x", i, fl.Mark, n2)
		}
	}
	if len(got) != len(own)+c.Copied {
		t.Errorf("the family's table holds %d entries, want its own %d and the %d copied", len(got), len(own), c.Copied)
	}
}
