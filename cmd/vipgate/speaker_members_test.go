package main

import (
	"flag"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/membership"
	"github.com/vipgate/vipgate/speaker"
)

// TestSpeakerFlags: the speaker's flags parse into speakerFlags (no package globals), and the
// membership's key file and insecure mode resolve flag over config, insecure only without a key.
func TestSpeakerFlags(t *testing.T) {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var f speakerFlags
	f.addFlags(fs)
	if err := fs.Parse([]string{"--member-port=7999", "--member-insecure", "--bgp-shutdown-drain=30s", "--l2-link-hold-down=5s"}); err != nil {
		t.Fatal(err)
	}
	if f.MemberPort != 7999 || !f.MemberInsecure || f.BGPDrain != 30*time.Second || f.MemberKeyFile != "" || f.LinkHoldDown != 5*time.Second {
		t.Errorf("parsed %+v", f)
	}
	for _, c := range []struct {
		name         string
		f            speakerFlags
		sc           cluster.SpeakerConfig
		wantKey      string
		wantInsecure bool
	}{
		{name: "nothing", wantKey: "", wantInsecure: false},
		{name: "config key", sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/c"},
		{name: "flag key over config", f: speakerFlags{MemberKeyFile: "/f"}, sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/f"},
		{name: "insecure flag", f: speakerFlags{MemberInsecure: true}, wantInsecure: true},
		{name: "insecure config", sc: cluster.SpeakerConfig{Insecure: true}, wantInsecure: true},
		{name: "a key wins over insecure", f: speakerFlags{MemberInsecure: true}, sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/c"},
	} {
		key, insecure := memberSettings(c.f, c.sc)
		if key != c.wantKey || insecure != c.wantInsecure {
			t.Errorf("%s: key %q insecure %v, want %q %v", c.name, key, insecure, c.wantKey, c.wantInsecure)
		}
	}
}

// TestSpeakerFindsSegmentViews: the speaker looks the membership's views up by its L2Segment.Key
// (the segment's members), and the membership keys them by the digest its heartbeats carry
// (membership.SegmentKey). speakerMembership hands the speaker every view of this node's segments
// by the speaker's key: otherwise every VIP of a segment would read "this node is not in the IP's
// L2 segment" and lose its owner.
func TestSpeakerFindsSegmentViews(t *testing.T) {
	st := &cluster.State{Nodes: map[string]*cluster.Node{}, MetalLB: &cluster.MetalLBConfig{}}
	var speakers []string
	peers := map[string][]netip.Addr{}
	for i := range 5 {
		n := fmt.Sprintf("node-%d", i)
		speakers = append(speakers, n)
		addr := netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
		st.Nodes[n] = &cluster.Node{Name: n, Labels: map[string]string{"rack": fmt.Sprint(i % 2)}, Addresses: []netip.Addr{addr}}
		peers[n] = []netip.Addr{addr}
	}
	for i, rack := range []string{"", "0", "1"} {
		name := fmt.Sprintf("pool-%d", i)
		st.MetalLB.IPAddressPools = append(st.MetalLB.IPAddressPools, &metallbv1beta1.IPAddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mlb"},
			Spec:       metallbv1beta1.IPAddressPoolSpec{Addresses: []string{fmt.Sprintf("198.51.100.%d/32", i+1)}}})
		ad := &metallbv1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mlb"},
			Spec: metallbv1beta1.L2AdvertisementSpec{IPAddressPools: []string{name}}}
		if rack != "" {
			ad.Spec.NodeSelectors = []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": rack}}}
		}
		st.MetalLB.L2Advertisements = append(st.MetalLB.L2Advertisements, ad)
	}
	segs := speaker.L2Segments(st, speakers)
	if len(segs) != 3 {
		t.Fatalf("%d segments, want 3 (everyone, rack 0, rack 1): %+v", len(segs), segs)
	}
	// A free loopback port: the membership is not run, only given its segments.
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	mem, err := membership.New(hclog.NewNullLogger(), "node-0", membership.Options{Port: port, Bind: netip.MustParseAddr("127.0.0.1"), Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	adapter := speakerMembership{mem}
	adapter.SetSegments(peers, speaker.SegmentsOf(segs, "node-0"))
	views := adapter.SegmentViews()
	want := 0
	for _, g := range segs {
		if !slices.Contains(g.Members, "node-0") {
			continue
		}
		want++
		if _, ok := views[g.Key]; !ok {
			t.Errorf("segment %v: no view by the speaker's key (views: %q)", g.Members, slices.Collect(maps.Keys(views)))
		}
	}
	if len(views) != want {
		t.Errorf("%d views, want %d (node-0's segments)", len(views), want)
	}
}
