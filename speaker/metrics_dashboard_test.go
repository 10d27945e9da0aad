package speaker

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestOwnerChanges(t *testing.T) {
	ip1, ip2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	mine := func(ip netip.Addr) VIPDecision { return VIPDecision{IP: ip, Owner: "a", Interfaces: []string{"eth0"}} }
	other := func(ip netip.Addr, n string) VIPDecision { return VIPDecision{IP: ip, Owner: n} }
	for _, tc := range []struct {
		name       string
		prev, next []VIPDecision
		want       []OwnerChange
	}{
		{"first decision", nil, []VIPDecision{mine(ip1), other(ip2, "b")},
			[]OwnerChange{{IP: ip1, Change: OwnerTaken, Reason: OwnerReasonNew}}},
		{"nothing changed", []VIPDecision{mine(ip1)}, []VIPDecision{mine(ip1)}, nil},
		{"failover to us", []VIPDecision{other(ip1, "b")}, []VIPDecision{mine(ip1)},
			[]OwnerChange{{IP: ip1, Change: OwnerTaken, Reason: OwnerReasonMoved, Other: "b"}}},
		{"back from no owner", []VIPDecision{other(ip1, "")}, []VIPDecision{mine(ip1)},
			[]OwnerChange{{IP: ip1, Change: OwnerTaken, Reason: OwnerReasonNew}}},
		{"moved away", []VIPDecision{mine(ip1)}, []VIPDecision{other(ip1, "c")},
			[]OwnerChange{{IP: ip1, Change: OwnerReleased, Reason: OwnerReasonMoved, Other: "c"}}},
		{"no owner", []VIPDecision{mine(ip1)}, []VIPDecision{other(ip1, "")},
			[]OwnerChange{{IP: ip1, Change: OwnerReleased, Reason: OwnerReasonNoOwner}}},
		{"interface gone", []VIPDecision{mine(ip1)}, []VIPDecision{{IP: ip1, Owner: "a", Reason: "gone"}},
			[]OwnerChange{{IP: ip1, Change: OwnerReleased, Reason: OwnerReasonNoInterface}}},
		{"Service deleted", []VIPDecision{mine(ip1), mine(ip2)}, []VIPDecision{mine(ip2)},
			[]OwnerChange{{IP: ip1, Change: OwnerReleased, Reason: OwnerReasonRemoved}}},
		{"other nodes' moves are theirs", []VIPDecision{other(ip1, "b")}, []VIPDecision{other(ip1, "c")}, nil},
		// A shared IP has one decision per Service: one change, not one per Service.
		{"shared IP", nil, []VIPDecision{mine(ip1), mine(ip1)},
			[]OwnerChange{{IP: ip1, Change: OwnerTaken, Reason: OwnerReasonNew}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := OwnerChanges("a", tc.prev, tc.next)
			slices.SortFunc(got, func(x, y OwnerChange) int { return x.IP.Compare(y.IP) })
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("OwnerChanges (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOwnerChangesCountedByDecideL2 checks the call site: DecideL2 with an OwnerCache counts what this
// node takes and releases; without one (a one-off decision) it counts nothing.
func TestOwnerChangesCountedByDecideL2(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := RegisterOwnerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	taken := ownerChanges.WithLabelValues(OwnerTaken, OwnerReasonMoved)
	released := ownerChanges.WithLabelValues(OwnerReleased, OwnerReasonMoved)
	fresh := ownerChanges.WithLabelValues(OwnerTaken, OwnerReasonNew)
	t0, r0, n0 := counterValue(taken), counterValue(released), counterValue(fresh)

	// One decision loop of the node that owns the VIP while n1 and n2 are alive.
	ip := "192.0.2.10"
	self := hashOwner(ip, "n1", "n2")
	peer := map[string]string{"n1": "n2", "n2": "n1"}[self]
	st := newL2World().pool("lan", nil, "192.0.2.0/24").ad("l2", lanAd).svc("web", false, []string{ip}, "n1", "n2").st
	cache := NewOwnerCache()
	decide := func(cache *OwnerCache, live ...string) {
		l := map[string]bool{}
		for _, n := range live {
			l[n] = true
		}
		DecideL2(L2Input{Self: self, Live: l, Links: lan, State: st, Owners: cache})
	}
	decide(cache, self, peer) // first decision: taken, new
	decide(cache, self, peer) // still ours: nothing
	decide(cache, peer)       // self not live: the peer owns it (released, moved)
	decide(cache, self, peer) // back: taken, moved
	decide(nil, self, peer)   // no cache (a one-off decision): not counted

	if got := counterValue(fresh) - n0; got != 1 {
		t.Errorf("taken/new = %v, want 1", got)
	}
	if got := counterValue(released) - r0; got != 1 {
		t.Errorf("released/moved = %v, want 1", got)
	}
	if got := counterValue(taken) - t0; got != 1 {
		t.Errorf("taken/moved = %v, want 1", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() == "vipgate_l2_owner_changes_total" {
			n = len(mf.GetMetric())
		}
	}
	if n != 6 {
		t.Errorf("vipgate_l2_owner_changes_total on the registry: %d series, want 6 (every change/reason pair, from the start)", n)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
