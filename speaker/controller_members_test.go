package speaker

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// TestNodeMembersFromSpeakerPods: with the speaker pods known (State.SpeakerNodes, the Kubernetes
// source), only the Nodes that run one are members, so a rack whose other nodes run no vipgate
// keeps a majority of its speakers; without (the file source), every Node is.
func TestNodeMembersFromSpeakerPods(t *testing.T) {
	st := &cluster.State{Nodes: map[string]*cluster.Node{}, MetalLB: &cluster.MetalLBConfig{
		IPAddressPools: []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "mlb"},
			Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"192.0.2.100/30"}}}},
		L2Advertisements: []*metallbv1beta1.L2Advertisement{{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "mlb"}}},
	}}
	for i, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		st.Nodes[n] = &cluster.Node{Name: n, Addresses: []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})}}
	}
	members := func() []string {
		m := NodeMembers(st)
		if a := m["n1"]; len(a) != 2 || !a[0].Is4() {
			t.Errorf("n1's addresses %v: want the IPv4 one first (heartbeats go there)", a)
		}
		return slices.Sorted(maps.Keys(m))
	}
	if d := cmp.Diff([]string{"n1", "n2", "n3", "n4", "n5"}, members()); d != "" {
		t.Errorf("file source (-want +got):\n%s", d)
	}
	st.SpeakerNodes = map[string]bool{"n1": true, "n2": true}
	got := members()
	if d := cmp.Diff([]string{"n1", "n2"}, got); d != "" {
		t.Errorf("speaker pods on n1, n2 (-want +got):\n%s", d)
	}
	// The segment is the speakers, not the five Nodes: two of two is a majority.
	segs := L2Segments(st, append(got, "n1"))
	if len(segs) != 1 || !slices.Equal(segs[0].Members, []string{"n1", "n2"}) {
		t.Errorf("segments %+v, want one of n1, n2", segs)
	}
}
