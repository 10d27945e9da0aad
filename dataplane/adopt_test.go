package dataplane

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// TestAdoptOnRestart: a second vipgate (a restart) reconciles the live table in place: nothing to send
// when nothing changed, only the change otherwise, and session-affinity clients survive.
func TestAdoptOnRestart(t *testing.T) {
	ns, fd := testNetns(t)
	st := SyntheticState(200, 3)
	prog := &NetlinkProgrammer{NetNSFd: fd}
	p1 := NewProxier(hclog.NewNullLogger(), testConfig(), prog)
	if _, err := p1.Sync(st); err != nil {
		t.Fatal(err)
	}
	// A client remembered by an affinity map (svc-00007 has session affinity), with one of the
	// map's endpoints.
	var affSet, endpoint string
	for _, c := range p1.Flatten(cluster.IPv4).Chains {
		for _, r := range c.Rules {
			if r.Action.Kind == ActAffinityDNAT && affSet == "" {
				affSet, endpoint = r.Action.Set, r.Action.Addr.String()
			}
		}
	}
	if affSet == "" {
		t.Fatal("no affinity map in the synthetic state")
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "element", "ip", "vipgate", affSet, "{ 198.51.100.10 : "+endpoint+" }").CombinedOutput(); err != nil {
		t.Fatalf("seeding affinity client: %v: %s", err, out)
	}

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
	out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", "ip", "vipgate", affSet).CombinedOutput()
	if !strings.Contains(string(out), "198.51.100.10") {
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
	if ok, why := FlatEqual(live, p3.Flatten(cluster.IPv4)); !ok {
		t.Errorf("live table differs from the model after adoption: %s", why)
	}
}
