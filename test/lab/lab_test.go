package lab

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The address plan is a contract other tests hard-code; pin it down.
func TestAddressPlan(t *testing.T) {
	got := map[string]string{
		"node1 v4":    NodeIPv4(1).String(),
		"node2 v6":    NodeIPv6(2).String(),
		"node3 cidr4": PodCIDRv4(3).String(),
		"node3 cidr6": PodCIDRv6(3).String(),
		"node1 gw4":   PodGatewayv4(1).String(),
		"node1 gw6":   PodGatewayv6(1).String(),
		"pod 2/1 v4":  PodIPv4(2, 1).String(),
		"pod 1/2 v6":  PodIPv6(1, 2).String(),
	}
	want := map[string]string{
		"node1 v4":    "192.0.2.11",
		"node2 v6":    "2001:db8:1::12",
		"node3 cidr4": "10.244.3.0/24",
		"node3 cidr6": "2001:db8:244:3::/64",
		"node1 gw4":   "10.244.1.1",
		"node1 gw6":   "2001:db8:244:1::1",
		"pod 2/1 v4":  "10.244.2.11",
		"pod 1/2 v6":  "2001:db8:244:1::12",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("address plan (-want +got):\n%s", d)
	}
	// The largest lab stays clear of the fixed addresses.
	if NodeIPv4(MaxNodes).Compare(LANClientv4) >= 0 {
		t.Errorf("node %d's address %s collides with the lanclient", MaxNodes, NodeIPv4(MaxNodes))
	}
	if !PodCIDRv4(1).Contains(PodIPv4(1, MaxPodsPerNode)) {
		t.Errorf("pod %d leaves its node's CIDR", MaxPodsPerNode)
	}
}

func TestPlan(t *testing.T) {
	l := &Lab{prefix: "vg1-0-", pods: map[string]*Pod{}, byNS: map[string]string{}, spec: Spec{Nodes: []NodeSpec{
		{Name: "node1", Pods: []string{"a", "b"}},
		{Name: "node2", Pods: []string{"c"}},
	}}}
	l.plan()
	if got := l.NS("router"); got != "vg1-0-router" {
		t.Errorf("NS(router) = %q", got)
	}
	c := l.Pod("c")
	if c.NS != "vg1-0-c" || c.Node.Name != "node2" || c.IPv4.String() != "10.244.2.11" || c.IPv6.String() != "2001:db8:244:2::11" {
		t.Errorf("pod c = %+v", c)
	}
	if got := len(l.Pods()); got != 3 {
		t.Errorf("%d pods", got)
	}
	if l.NS("nope") != "" || l.Node("nope") != nil || l.Pod("nope") != nil {
		t.Error("unknown names must give zero values")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want string // substring of the error, "" for valid
	}{
		{"ok", Spec{Nodes: []NodeSpec{{Name: "node1", Pods: []string{"web-1"}}}}, ""},
		{"reserved", Spec{Nodes: []NodeSpec{{Name: "router"}}}, "reserved"},
		{"duplicate", Spec{Nodes: []NodeSpec{{Name: "n1", Pods: []string{"n1"}}}}, "twice"},
		{"bad chars", Spec{Nodes: []NodeSpec{{Name: "Node_1"}}}, "lower-case"},
		{"too many", Spec{Nodes: make([]NodeSpec, MaxNodes+1)}, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(tc.spec)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("validate = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseProbeOutput(t *testing.T) {
	r, ok := ParseProbeOutput("name=web-1 src=[2001:db8:2::10]:40000 dst=[2001:db8:244:1::11]:8080\n")
	if !ok || r.Pod != "web-1" || r.Src.String() != "[2001:db8:2::10]:40000" || r.Dst.Port() != 8080 || !r.OK() {
		t.Errorf("reply: %+v %v", r, ok)
	}
	r, ok = ParseProbeOutput("probe tcp x: connection refused\nerror=refused\n")
	if !ok || r.Err != "refused" || r.OK() {
		t.Errorf("error: %+v %v", r, ok)
	}
	if _, ok := ParseProbeOutput("exec: no such file\n"); ok {
		t.Error("garbage parsed")
	}
}

func TestParseProbeSummary(t *testing.T) {
	s, ok := ParseProbeSummary("sent=10 ok=7 lost=3 max_gap_ms=40 max_gap_probes=2 pods=web-1:3,web-2:4 srcs=2001:db8:2::10:7 errors=timeout:3\n")
	if !ok {
		t.Fatal("not parsed")
	}
	want := ProbeSummary{
		Sent: 10, OK: 7, Lost: 3, MaxGap: 40 * time.Millisecond, MaxGapProbes: 2,
		Pods:    map[string]int{"web-1": 3, "web-2": 4},
		Sources: map[string]int{"2001:db8:2::10": 7},
		Errors:  map[string]int{"timeout": 3},
	}
	s.Output = ""
	if d := cmp.Diff(want, s); d != "" {
		t.Errorf("summary (-want +got):\n%s", d)
	}
}

func TestSweepSafety(t *testing.T) {
	if _, err := Sweep("v"); err == nil {
		t.Error("Sweep accepted a dangerously short prefix")
	}
	if _, err := Sweep("netns"); err == nil {
		t.Error("Sweep accepted a prefix outside vg*")
	}
	if !labNSName.MatchString("vg123-0-node1") || labNSName.MatchString("vgt123-rtr") {
		t.Error("stale-lab pattern matches the wrong names")
	}
}
