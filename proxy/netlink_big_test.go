package proxy

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestNetlinkVerdictMapChunks: a verdict map with thousands of elements whose chains have long names
// is sent in element lists that each stay under the 64 KiB attribute limit. When the chain names
// were left out of the size estimate, a list of ~1,000 such elements wrapped the 16-bit attribute
// length and the whole batch failed with ENOENT (first seen as a full sync of 14,300 Services).
func TestNetlinkVerdictMapChunks(t *testing.T) {
	_, fd := testNetns(t)
	tx := &dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Full: true, Sets: map[string]*dataplane.Set{}}
	vmap := &dataplane.Set{Name: MapServiceNodePorts, Kind: dataplane.KindProtoPortVmap}
	tx.AddSets = append(tx.AddSets, vmap)
	tx.Sets[vmap.Name] = vmap
	const chains, elements = 50, 2700
	for i := 0; i < chains; i++ {
		tx.AddChains = append(tx.AddChains, &dataplane.Chain{Name: fmt.Sprintf("external-%02d-a-rather-long-namespace/and-a-long-service-name-tcp", i)})
	}
	for i := 0; i < elements; i++ {
		tx.AddElements = append(tx.AddElements, dataplane.Element{Set: vmap.Name, Proto: dataplane.ProtoTCP, Port: uint16(30000 + i),
			Verdict: dataplane.VerdictGoto, Chain: tx.AddChains[i%chains].Name})
	}
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	if err := prog.Apply(tx); err != nil {
		t.Fatalf("%d verdict elements to chains with %d-byte names: %v", elements, len(tx.AddChains[0].Name), err)
	}
	// A wrapped list length can also drop elements silently: count them in the kernel.
	kt, err := prog.ReadKernelTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(kt.Elements[vmap.Name]); got != elements {
		t.Errorf("the kernel holds %d of the %d elements", got, elements)
	}
}

// TestNetlinkSharedPickerFlap: a Service whose endpoint count flaps between two values moves between
// two shared picker chains; the one it leaves stays, unused, and is not added again when the Service
// comes back. Adding it again appended a second copy of its rule in the kernel on every flap (one more
// binding of the big endpoint map each time, making every later element add slower). The first move
// adds no chain either: a full sync adds the pickers of one endpoint fewer and one more.
func TestNetlinkSharedPickerFlap(t *testing.T) {
	_, fd := testNetns(t)
	st := SyntheticState(20, 10)
	p, prog := syncedIPv4(t, fd, st)
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00001"}
	full := st.EndpointSlices[key]
	short := *full[0]
	short.Endpoints = short.Endpoints[:9]
	for i := 0; i < 6; i++ {
		st.EndpointSlices[key] = []*cluster.EndpointSlice{&short}
		if i%2 == 1 {
			st.EndpointSlices[key] = full
		}
		rep, err := p.Sync(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, tx := range rep.Txs {
			// Not even the first move to 9: the full sync added the pickers of 9 and 11
			// endpoints beside the one of 10 (neighbourPickers).
			if len(tx.AddChains) > 0 {
				t.Errorf("flap %d adds chain %s", i, tx.AddChains[0].Name)
			}
		}
	}
	kt, err := prog.ReadKernelTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := kt.Rules[PickChain(MapEndpoints, 12)]; ok {
		t.Errorf("chain %s exists: only one endpoint more or fewer than a count in use is added", PickChain(MapEndpoints, 12))
	}
	for _, name := range []string{PickChain(MapEndpoints, 9), PickChain(MapEndpoints, 10), PickChain(MapEndpoints, 11)} {
		if got := len(kt.Rules[name]); got != 1 {
			t.Errorf("chain %s holds %d rules in the kernel, want 1", name, got)
		}
	}
}

// TestNetlinkBatchErrors: the batch asks the kernel to acknowledge its last message only; a message
// that fails anywhere in it (first, middle, last) still fails the whole batch with the kernel's
// error, nothing of it is applied, and the next batch works.
func TestNetlinkBatchErrors(t *testing.T) {
	_, fd := testNetns(t)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	vmap := &dataplane.Set{Name: MapServiceNodePorts, Kind: dataplane.KindProtoPortVmap}
	base := &dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Full: true, Sets: map[string]*dataplane.Set{vmap.Name: vmap},
		AddSets: []*dataplane.Set{vmap}, AddChains: []*dataplane.Chain{{Name: "target"}}}
	if err := prog.Apply(base); err != nil {
		t.Fatal(err)
	}
	good := func(port uint16) dataplane.Element {
		return dataplane.Element{Set: vmap.Name, Proto: dataplane.ProtoTCP, Port: port, Verdict: dataplane.VerdictGoto, Chain: "target"}
	}
	bad := dataplane.Element{Set: vmap.Name, Proto: dataplane.ProtoTCP, Port: 9, Verdict: dataplane.VerdictGoto, Chain: "no-such-chain"}
	for name, els := range map[string][]dataplane.Element{
		"first": {bad, good(1), good(2)},
		"last":  {good(1), good(2), bad},
	} {
		tx := &dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Sets: base.Sets, AddElements: els}
		// Messages before and after the failing element list: a chain added, then flushed and
		// deleted.
		tx.AddChains = []*dataplane.Chain{{Name: "other-" + name}}
		tx.DelChains = []string{"other-" + name}
		err := prog.Apply(tx)
		if err == nil {
			t.Errorf("%s: a batch with a verdict to a missing chain succeeded", name)
		} else if !strings.Contains(err.Error(), "no such file or directory") {
			t.Errorf("%s: want the kernel's ENOENT, got %v", name, err)
		}
	}
	kt, err := prog.ReadKernelTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(kt.Elements[vmap.Name]); n != 0 || len(kt.Chains) != 1 {
		t.Errorf("failed batches left %d elements and %d chains behind", n, len(kt.Chains))
	}
	if err := prog.Apply(&dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Sets: base.Sets, AddElements: []dataplane.Element{good(1)}}); err != nil {
		t.Fatalf("a good batch after failed ones: %v", err)
	}
	// The socket of a good batch is kept for the next ones (send); Close drops it and the
	// programmer opens another.
	if err := prog.Apply(&dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Sets: base.Sets, DelElements: []dataplane.Element{good(1)}}); err != nil {
		t.Fatalf("a second good batch on the kept socket: %v", err)
	}
	if err := prog.Close(); err != nil {
		t.Fatal(err)
	}
	if err := prog.Apply(&dataplane.Tx{Family: cluster.IPv4, Table: "vipgate", Sets: base.Sets, AddElements: []dataplane.Element{good(2)}}); err != nil {
		t.Fatalf("a good batch after Close: %v", err)
	}
	prog.Close()
	if kt, err := prog.ReadKernelTable(cluster.IPv4, "vipgate"); err != nil {
		t.Fatal(err)
	} else if n := len(kt.Elements[vmap.Name]); n != 1 {
		t.Errorf("after add, delete, add: %d elements, want 1", n)
	}
}

// TestNetlinkAffinityPurge: clients an affinity map remembers with an endpoint that leaves the
// Service are forgotten (they pick again), the others keep their endpoint; also when the endpoint
// left while vipgate was not running (restart, adopting the table).
func TestNetlinkAffinityPurge(t *testing.T) {
	ns, fd := testNetns(t)
	st := SyntheticState(60, 10)
	key := cluster.ServiceKey{Namespace: "bench", Name: "svc-00007"} // the synthetic mix's affinity Service
	if st.Services[key].AffinityTimeout == 0 {
		t.Fatalf("%s has no session affinity in the synthetic state", key)
	}
	p, prog := syncedIPv4(t, fd, st)
	// The map of the Service's ClusterIP chain, and its endpoints.
	var set string
	var eps []netip.Addr
	for _, c := range p.Flatten(cluster.IPv4).Chains {
		for s, addrs := range affinityEndpoints(c) {
			if strings.Contains(c.Name, "svc-00007") && strings.HasSuffix(c.Name, "-cluster") {
				set, eps = s, addrs
			}
		}
	}
	if set == "" || len(eps) < 3 {
		t.Fatalf("no affinity map with 3 endpoints for %s", key)
	}
	seed := func(client string, ep netip.Addr) {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "element", "ip", "vipgate", set,
			"{ "+client+" : "+ep.String()+" }").CombinedOutput(); err != nil {
			t.Fatalf("seeding %s: %v: %s", client, err, out)
		}
	}
	clients := func() string {
		out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", "ip", "vipgate", set).CombinedOutput()
		return string(out)
	}
	without := func(gone netip.Addr) []*cluster.EndpointSlice {
		es := *st.EndpointSlices[key][0]
		es.Endpoints = slices.DeleteFunc(slices.Clone(es.Endpoints), func(e cluster.Endpoint) bool { return e.Addresses[0] == gone })
		return []*cluster.EndpointSlice{&es}
	}

	seed("198.51.100.1", eps[0])
	seed("198.51.100.2", eps[1])
	st.EndpointSlices[key] = without(eps[1])
	rep, err := p.Sync(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Txs) != 1 || len(rep.Txs[0].Purges) == 0 {
		t.Fatalf("removing an endpoint of an affinity Service asked for no purge: %v", rep.Txs)
	}
	if got := clients(); !strings.Contains(got, "198.51.100.1") || strings.Contains(got, "198.51.100.2") {
		t.Errorf("after %s left, want client .1 kept and .2 forgotten:\n%s", eps[1], got)
	}

	// While vipgate is not running, another endpoint leaves; the restart adopts the table.
	seed("198.51.100.3", eps[2])
	st.EndpointSlices[key] = without(eps[2])
	p2 := NewProxier(hclog.NewNullLogger(), ipv4Config(), prog)
	p2.SetTableReader(prog)
	rep, err = p2.Sync(st)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Adopted {
		t.Fatal("the restart did not adopt the table")
	}
	if got := clients(); !strings.Contains(got, "198.51.100.1") || strings.Contains(got, "198.51.100.3") {
		t.Errorf("after %s left during a restart, want client .1 kept and .3 forgotten:\n%s", eps[2], got)
	}
}

func ipv4Config() Config {
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	return cfg
}

// syncedIPv4 programs st (IPv4 only) into the namespace of fd.
func syncedIPv4(t testing.TB, fd int, st *cluster.State) (*Proxier, *dataplane.NetlinkProgrammer) {
	t.Helper()
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p := NewProxier(hclog.NewNullLogger(), ipv4Config(), prog)
	if _, err := p.Sync(st); err != nil {
		t.Fatal(err)
	}
	return p, prog
}

// affinityEndpoints lists, per affinity map, the endpoint addresses chain c's rules send new clients
// to (as the engine's purge computation reads them).
func affinityEndpoints(c *dataplane.Chain) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, r := range c.Rules {
		if r.Action.Kind == dataplane.ActAffinityDNAT {
			out[r.Action.Set] = append(out[r.Action.Set], r.Action.Addr)
		}
	}
	return out
}
