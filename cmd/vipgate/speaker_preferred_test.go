package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/membership"
	"github.com/vipgate/vipgate/speaker"
)

// recordingL2 is the speaker's L2 announcer reduced to what it was last told to own.
type recordingL2 struct {
	mu    sync.Mutex
	owned map[netip.Addr]speaker.L2Where
}

func (r *recordingL2) SetOwned(o map[netip.Addr]speaker.L2Where) error {
	r.mu.Lock()
	r.owned = o
	r.mu.Unlock()
	return nil
}
func (r *recordingL2) Close() error { return r.SetOwned(nil) }
func (r *recordingL2) owns(ip netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.owned[ip]
	return ok
}

// TestSpeakerPreferredNodeFailover runs three speakers — speaker.Controller on the real membership
// protocol, heartbeats over UDP on loopback (127.0.0.1-3, one port) — with an L2Advertisement whose
// preferredNodeSelectors (MetalLB v0.16.2) prefer a node the sha256(node#IP) hash would not pick:
// all three agree that the preferred node owns the VIP, and only it answers. When it dies
// (membership closed: its heartbeats stop), the two others agree on the hash owner among
// themselves — a node the preference does not name — and /status says why.
func TestSpeakerPreferredNodeFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the membership protocol")
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()

	vip := netip.MustParseAddr("198.51.100.7")
	names := []string{"n1", "n2", "n3"}
	hashOrder := slices.Clone(names)
	slices.SortFunc(hashOrder, func(a, b string) int {
		ha, hb := sha256.Sum256([]byte(a+"#"+vip.String())), sha256.Sum256([]byte(b+"#"+vip.String()))
		return bytes.Compare(ha[:], hb[:])
	})
	preferred := hashOrder[1] // not the hash's choice, nor the fallback's
	fallback := hashOrder[0]

	st := &cluster.State{Nodes: map[string]*cluster.Node{}, Services: map[cluster.ServiceKey]*cluster.Service{},
		EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}, MetalLB: &cluster.MetalLBConfig{}}
	peers := map[string][]netip.Addr{}
	for i, n := range names {
		addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)})
		labels := map[string]string{"kubernetes.io/hostname": n}
		if n == preferred {
			labels["zone"] = "primary"
		}
		st.Nodes[n] = &cluster.Node{Name: n, Labels: labels, Addresses: []netip.Addr{addr}}
		peers[n] = []netip.Addr{addr}
	}
	st.MetalLB.IPAddressPools = []*metallbv1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "lan", Namespace: "mlb"},
		Spec: metallbv1beta1.IPAddressPoolSpec{Addresses: []string{"198.51.100.0/28"}}}}
	st.MetalLB.L2Advertisements = []*metallbv1beta1.L2Advertisement{{ObjectMeta: metav1.ObjectMeta{Name: "lan", Namespace: "mlb"},
		Spec: metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{"lan"}, PreferredNodeSelectors: []metallbv1beta1.PreferredNodeSelector{
			{Weight: 80, Preference: metav1.LabelSelector{MatchLabels: map[string]string{"zone": "primary"}}}}}}}
	key := cluster.ServiceKey{Namespace: "default", Name: "web"}
	st.Services[key] = &cluster.Service{Key: key, Type: cluster.TypeLoadBalancer, LoadBalancerIPs: []netip.Addr{vip}}
	st.EndpointSlices[key] = []*cluster.EndpointSlice{{Service: key, Family: cluster.IPv4,
		Endpoints: []cluster.Endpoint{{NodeName: "n1", Ready: true, Serving: true}}}}

	nodes := map[string]*prefNode{}
	for i, n := range names {
		mem, err := membership.New(hclog.NewNullLogger(), n, membership.Options{Port: port, Bind: netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)}),
			Insecure: true, HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		nd := &prefNode{l2: &recordingL2{}, mem: mem}
		nd.ctrl = speaker.NewController(speaker.ControllerOptions{Self: n, Log: hclog.NewNullLogger(), L2: nd.l2,
			Members: speakerMembership{mem}, FixedPeers: peers, DefaultInterface: "eth0", Resync: 200 * time.Millisecond})
		mem.OnChange(nd.ctrl.Recompute)
		ctx, cancel := context.WithCancel(context.Background())
		nd.cancel = cancel
		nd.done.Add(2)
		go func() { defer nd.done.Done(); mem.Run(ctx) }()
		go func() { defer nd.done.Done(); nd.ctrl.Run(ctx) }()
		nodes[n] = nd
		t.Cleanup(func() { nd.kill() })
	}
	for _, n := range names {
		nodes[n].ctrl.Update(st)
	}

	// announcer is what a node's /status says of the VIP.
	announcer := func(n string) (owner, reason string) {
		for _, v := range nodes[n].ctrl.VIPs() {
			if v.IP == vip {
				return v.Announcer, v.Reason
			}
		}
		return "", ""
	}
	agree := func(alive []string, want string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			var got []string
			ok := true
			for _, n := range alive {
				o, r := announcer(n)
				got = append(got, fmt.Sprintf("%s: %s (%s)", n, o, r))
				ok = ok && o == want && nodes[n].l2.owns(vip) == (n == want)
			}
			if ok {
				t.Logf("agreed on %s: %s", want, strings.Join(got, "; "))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("want every live speaker to name %s and only it to answer; got %s", want, strings.Join(got, "; "))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("hash order for %s: %v; preferred (zone=primary, weight 80) %s", vip, hashOrder, preferred)
	agree(names, preferred, 20*time.Second)
	if _, r := announcer(preferred); !strings.Contains(r, "preferredNodeSelectors: owner among the 1 of 3 candidates with the top weight 80") {
		t.Errorf("/status reason %q, want the preference named", r)
	}

	nodes[preferred].kill()
	alive := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == preferred })
	start := time.Now()
	agree(alive, fallback, 20*time.Second)
	t.Logf("failover from the preferred %s to %s (not preferred) seen after %v", preferred, fallback, time.Since(start).Round(10*time.Millisecond))
	if _, r := announcer(fallback); !strings.Contains(r, "no preferred node is a live eligible candidate") {
		t.Errorf("/status reason %q after the preferred node died, want it said", r)
	}
}

// prefNode is one speaker of TestSpeakerPreferredNodeFailover.
type prefNode struct {
	ctrl   *speaker.Controller
	l2     *recordingL2
	mem    *membership.Members
	cancel context.CancelFunc
	done   sync.WaitGroup
	once   sync.Once
}

// kill stops a node's speaker: its heartbeats stop and it answers for nothing. Idempotent.
func (nd *prefNode) kill() {
	nd.once.Do(func() {
		nd.cancel()
		nd.mem.Close()
		nd.done.Wait()
		nd.ctrl.Stop()
	})
}
