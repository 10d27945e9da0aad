package proxy

import (
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// TestAdoptOnRestart: a second vipgate (a restart) reconciles the live table in place: nothing to send
// when nothing changed, only the change otherwise, and session-affinity clients survive.
func TestAdoptOnRestart(t *testing.T) {
	ns, fd := testNetns(t)
	st := SyntheticState(200, 3)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p1 := NewProxier(hclog.NewNullLogger(), testConfig(), prog)
	if _, err := p1.Sync(st); err != nil {
		t.Fatal(err)
	}
	// A client remembered by an affinity map (svc-00007 has session affinity).
	affSet := seedAffinityClient(t, ns, p1.Flatten(cluster.IPv4))

	p2 := NewProxier(hclog.NewNullLogger(), testConfig(), prog)
	p2.SetTableReader(prog)
	rep, err := p2.Sync(st)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Adopted {
		t.Fatalf("restart did not adopt the live table")
	}
	for _, tx := range rep.Txs {
		if !tx.Empty() {
			t.Errorf("restart with no change sent %s", tx)
		}
	}
	if out, kept := affinityClientKept(ns, affSet); !kept {
		t.Errorf("affinity client lost on restart:\n%s", out)
	}

	// A restart that finds one Service gone sends only that.
	st2 := *st
	st2.Services = map[cluster.ServiceKey]*cluster.Service{}
	for k, v := range st.Services {
		if k.Name != "svc-00003" {
			st2.Services[k] = v
		}
	}
	p3 := NewProxier(hclog.NewNullLogger(), testConfig(), prog)
	p3.SetTableReader(prog)
	rep, err = p3.Sync(&st2)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Adopted || len(rep.Txs) != 1 || rep.Txs[0].Full || len(rep.Txs[0].DelElements) == 0 || len(rep.Txs[0].AddElements) != 0 {
		t.Fatalf("want one small deleting transaction, got adopted=%v %v", rep.Adopted, rep.Txs)
	}
	t.Logf("restart with one Service gone: %s", rep.Txs[0])
	live, err := prog.ReadTable(cluster.IPv4, "vipgate")
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := dataplane.FlatEqual(live, p3.Flatten(cluster.IPv4)); !ok {
		t.Errorf("live table differs from the model after adoption: %s", why)
	}
}

// affinityClient is the client seedAffinityClient puts into an affinity map.
const affinityClient = "198.51.100.10"

// seedAffinityClient writes affinityClient into the first affinity map of f's table in namespace ns,
// with one of the map's endpoints, as a packet would have; it returns the map's name.
func seedAffinityClient(t *testing.T, ns string, f *dataplane.Flat) string {
	t.Helper()
	for _, name := range f.ChainOrder {
		for _, r := range f.Chains[name].Rules {
			if r.Action.Kind != dataplane.ActAffinityDNAT {
				continue
			}
			elem := "{ " + affinityClient + " : " + r.Action.Addr.String() + " }"
			if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "element", "ip", f.Table, r.Action.Set, elem).CombinedOutput(); err != nil {
				t.Fatalf("seeding affinity client: %v: %s", err, out)
			}
			return r.Action.Set
		}
	}
	t.Fatal("no affinity map in the table")
	return ""
}

// affinityClientKept says whether affinity map set in namespace ns still holds affinityClient; out
// is the map as nft lists it.
func affinityClientKept(ns, set string) (out string, kept bool) {
	b, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", "ip", "vipgate", set).CombinedOutput()
	return string(b), strings.Contains(string(b), affinityClient)
}

// TestAdoptLegacyChainNames: the eTP=Local chains were named ext-ip-… and ext-np-… until those names
// turned out ambiguous (names.go). A vipgate that starts on a table an older one left, with the old
// names, adopts it: the transaction creates the chains under their new names, replaces the map
// elements that jumped to the old ones, and deletes the old chains; the live table is then exactly
// the model, and a session-affinity client the old table remembered is still there (an adoption, not
// a replacement).
func TestAdoptLegacyChainNames(t *testing.T) {
	ns, fd := testNetns(t)
	st := dcState()
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	p1 := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	if _, err := p1.Sync(st); err != nil {
		t.Fatal(err)
	}
	// The table as the older vipgate wrote it: the same model under the old names, through the same
	// encoder, replacing the current one in one transaction.
	var oldNames []string
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		tx, renamed := legacyTx(p1.Flatten(fam))
		oldNames = append(oldNames, renamed...)
		if err := prog.Apply(tx); err != nil {
			t.Fatalf("IPv%d: programming the legacy table: %v", fam, err)
		}
	}
	if len(oldNames) < 4 {
		t.Fatalf("the fixture has %d eTP=Local chains (%v), want some of both kinds in both families", len(oldNames), oldNames)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chains").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "chain "+oldNames[0]+" ") {
		t.Fatalf("legacy chain %s not in the kernel (%v):\n%s", oldNames[0], err, out)
	}
	// A client an affinity map of the old table remembers.
	affSet := seedAffinityClient(t, ns, p1.Flatten(cluster.IPv4))

	p2 := NewProxier(hclog.NewNullLogger(), dcConfig(), prog)
	p2.SetTableReader(prog)
	rep, err := p2.Sync(st)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Adopted {
		t.Fatal("the legacy table was replaced, not adopted")
	}
	var deleted []string
	for _, tx := range rep.Txs {
		t.Logf("adopting: %s", tx)
		if tx.Full {
			t.Errorf("adoption sent a full replacement: %s", tx)
		}
		deleted = append(deleted, tx.DelChains...)
	}
	for _, old := range oldNames {
		if !slices.Contains(deleted, old) {
			t.Errorf("legacy chain %s not deleted (deleted: %v)", old, deleted)
		}
	}
	for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		live, err := prog.ReadTable(fam, "vipgate")
		if err != nil {
			t.Fatal(err)
		}
		if ok, why := dataplane.FlatEqual(live, p2.Flatten(fam)); !ok {
			t.Errorf("IPv%d: live table differs from the model after adopting the legacy table: %s", fam, why)
		}
		for name := range live.Chains {
			if strings.HasPrefix(name, "ext-ip-") || strings.HasPrefix(name, "ext-np-") {
				t.Errorf("IPv%d: legacy chain %s left in the table", fam, name)
			}
		}
	}
	if out, kept := affinityClientKept(ns, affSet); !kept {
		t.Errorf("affinity client lost adopting the legacy table:\n%s", out)
	}

	// A packet through the renamed chain: the node itself opens a connection to an eTP=Local
	// LoadBalancer IP, which service-ips sends to local-ip-…, which sends host traffic to the
	// cluster-wide endpoints. conntrack shows the DNAT. A veth pair (both ends in the namespace) with
	// a default route gives the SYN a way out of the output path; nothing answers it.
	var entry dataplane.Element
	for _, e := range p2.Flatten(cluster.IPv4).Elements[tablenames.MapServiceIPs] {
		if strings.HasPrefix(e.Chain, "local-ip-") {
			entry = e
			break
		}
	}
	if !entry.Addr.IsValid() || entry.Proto != dataplane.ProtoTCP {
		t.Fatalf("no TCP entry of an eTP=Local Service in %s: %+v", tablenames.MapServiceIPs, entry)
	}
	var endpoints []string
	for _, e := range p2.Flatten(cluster.IPv4).Elements[MapEndpointsCluster] {
		if e.Addr == entry.Addr && e.Proto == entry.Proto && e.Port == entry.Port {
			endpoints = append(endpoints, e.DataAddr.String())
		}
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "vgd0", "type", "veth", "peer", "name", "vgd1"},
		{"addr", "add", "192.0.2.1/24", "dev", "vgd0"},
		{"link", "set", "vgd0", "up"},
		{"link", "set", "vgd1", "up"},
		{"route", "add", "default", "dev", "vgd0"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	dst := netip.AddrPortFrom(entry.Addr, entry.Port).String()
	// One SYN (and its retransmission) for at most a second: bash's /dev/tcp connect, cut by timeout.
	_ = exec.Command("ip", "netns", "exec", ns, "timeout", "1", "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(dst, ":", "/", 1)).Run()
	out, err = exec.Command("ip", "netns", "exec", ns, "conntrack", "-L", "-p", "tcp", "--orig-dst", entry.Addr.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("conntrack -L: %v: %s", err, out)
	}
	dnat := false
	for _, ep := range endpoints {
		dnat = dnat || strings.Contains(string(out), "src="+ep+" ")
	}
	if !dnat {
		t.Errorf("connection to %s not DNATed to one of the cluster-wide endpoints %v:\n%s", dst, endpoints, out)
	}
	t.Logf("connection to %s after adoption: %s", dst, strings.TrimSpace(string(out)))
}

// legacyTx is the transaction with which a vipgate that named the eTP=Local chains ext-ip-… and
// ext-np-… wrote f: the whole table, the chains, the jumps to them and the verdicts of the map
// elements under the old names. renamed lists the old names.
func legacyTx(f *dataplane.Flat) (tx *dataplane.Tx, renamed []string) {
	old := func(name string) string {
		if r, ok := strings.CutPrefix(name, "local-ip-"); ok {
			return "ext-ip-" + r
		}
		if r, ok := strings.CutPrefix(name, "local-np-"); ok {
			return "ext-np-" + r
		}
		return name
	}
	tx = &dataplane.Tx{Family: f.Family, Table: f.Table, Full: true, Sets: f.Sets}
	for _, name := range f.SetOrder {
		tx.AddSets = append(tx.AddSets, f.Sets[name])
	}
	for _, name := range f.ChainOrder {
		c := *f.Chains[name]
		c.Name = old(name)
		c.Rules = slices.Clone(c.Rules)
		for i := range c.Rules {
			c.Rules[i].Action.Chain = old(c.Rules[i].Action.Chain)
		}
		tx.AddChains = append(tx.AddChains, &c)
		if c.Name != name {
			renamed = append(renamed, c.Name)
		}
	}
	for _, name := range f.SetOrder {
		for _, e := range f.Elements[name] {
			e.Chain = old(e.Chain)
			tx.AddElements = append(tx.AddElements, e)
		}
	}
	return tx, renamed
}
