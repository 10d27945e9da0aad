package cluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestNodeConfigSpeaker(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: n1\nnodeIPs: [192.0.2.11]\n"
	c, err := ParseNodeConfig([]byte(base + `speaker:
  memberPort: 7000
  heartbeatInterval: 50ms
  deadAfter: 200ms
  memberKeyFile: /etc/vipgate/memberlist/key
  podSelector: app=vipgate-node,tier in (edge)
  directMembersLimit: 0
  gossipFanout: 2
  gratuitousARPInterval: 30s
  members:
  - {name: n1, address: 192.0.2.11}
  - {name: n2, address: "2001:db8:1::12"}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := SpeakerConfig{MemberPort: 7000, HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 200 * time.Millisecond,
		MemberKeyFile: "/etc/vipgate/memberlist/key", PodSelector: "app=vipgate-node,tier in (edge)",
		DirectMembersLimit: new(int), GossipFanout: 2, GratuitousARPInterval: 30 * time.Second,
		Members: []SpeakerMember{{"n1", netip.MustParseAddr("192.0.2.11")}, {"n2", netip.MustParseAddr("2001:db8:1::12")}}}
	if diff := cmp.Diff(want, c.Speaker, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("speaker (-want +got):\n%s", diff)
	}
	if c, err := ParseNodeConfig([]byte(base)); err != nil || !cmp.Equal(SpeakerConfig{}, c.Speaker) {
		t.Errorf("no speaker section: %+v, %v", c, err)
	}
	for _, tc := range []struct{ yaml, err string }{
		{"speaker: {memberport: 1}", "unknown field"},
		{"speaker: {insecure: maybe}", "insecure"},
		{"speaker: {memberPort: 70000}", "speaker.memberPort"},
		{"speaker: {podSelector: \"app in (\"}", "speaker.podSelector"},
		{"speaker: {podSelector: \" \"}", "speaker.podSelector"},
		{"speaker: {heartbeatInterval: fast}", "speaker.heartbeatInterval"},
		{"speaker: {heartbeatInterval: 1ms}", "speaker.heartbeatInterval"},
		{"speaker: {heartbeatInterval: 100ms, deadAfter: 150ms}", "speaker.deadAfter"},
		{"speaker: {directMembersLimit: -1}", "speaker.directMembersLimit: -1 is outside 0-7000"},
		{"speaker: {directMembersLimit: 8000}", "speaker.directMembersLimit"},
		{"speaker: {directMembersLimit: many}", "directMembersLimit"},
		{"speaker: {gossipFanout: -2}", "speaker.gossipFanout: -2 is outside 1-16"},
		{"speaker: {gossipFanout: 100}", "speaker.gossipFanout"},
		{"speaker: {gratuitousARPInterval: 500ms}", "speaker.gratuitousARPInterval: 500ms is outside 1s-1h0m0s (0 or unset: off)"},
		{"speaker: {gratuitousARPInterval: 2h}", "speaker.gratuitousARPInterval: 2h0m0s is outside"},
		{"speaker: {gratuitousARPInterval: 30}", "speaker.gratuitousARPInterval"},
		{"speaker: {members: [{name: n2, address: 192.0.2.12}]}", "this node (\"n1\") is not listed"},
		{"speaker: {members: [{name: n1, address: 192.0.2.11}, {name: n1, address: 192.0.2.12}]}", "listed twice"},
		{"speaker: {members: [{name: n1, address: 192.0.2.11}, {name: n2, address: 192.0.2.11}]}", "also \"n1\"'s address"},
		{"speaker: {members: [{name: N1, address: 192.0.2.11}]}", "speaker.members[0].name"},
		{"speaker: {members: [{name: n1, address: nope}]}", "speaker.members[0].address"},
		{"speaker: {members: [{name: n1, address: 192.0.2.11, port: 1}]}", "unknown field"},
	} {
		_, err := ParseNodeConfig([]byte(base + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want one containing %q", tc.yaml, err, tc.err)
		}
	}
}
