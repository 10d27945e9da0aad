package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// runtimeProgrammer accepts every transaction and has no table to adopt.
type runtimeProgrammer struct{}

func (runtimeProgrammer) Apply(*dataplane.Tx) error { return nil }
func (runtimeProgrammer) ReadTable(cluster.Family, string) (*dataplane.Flat, error) {
	return nil, errors.New("no table")
}

func TestNodeEligible(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes map[string]*cluster.Node
		want  bool
	}{
		{"no Node known (file source)", nil, true},
		{"own Node", map[string]*cluster.Node{"node1": {Name: "node1"}}, true},
		{"own Node to be deleted", map[string]*cluster.Node{"node1": {Name: "node1", ToBeDeleted: true}}, false},
		{"another Node to be deleted", map[string]*cluster.Node{"node1": {Name: "node1"}, "node2": {Name: "node2", ToBeDeleted: true}}, true},
		{"own Node gone", map[string]*cluster.Node{"node2": {Name: "node2"}}, false},
	} {
		if got := NodeEligible(&cluster.State{Nodes: tc.nodes}, "node1"); got != tc.want {
			t.Errorf("%s: NodeEligible = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRuntimeHealthzNodeEligibility runs the node's Runtime with a source that sends snapshots, and
// reads /healthz and /livez over HTTP as kubelet and a load balancer do: the node's Node being
// deleted (the autoscaler's taint) fails /healthz only, with nodeEligible false in the body, and its
// return makes it pass again.
func TestRuntimeHealthzNodeEligibility(t *testing.T) {
	cfg := &cluster.NodeConfig{NodeName: "node1", TableName: "vipgate", MasqueradeBit: 14,
		HealthzBindAddress: netip.MustParseAddrPort("127.0.0.1:0")}
	rt := NewRuntime(RuntimeOptions{Log: hclog.NewNullLogger(), Config: cfg,
		Dataplane: Config{NodeName: "node1", Table: "vipgate"}, Programmer: runtimeProgrammer{}})
	defer rt.Close()
	// No conntrack cleanup: the test runs in the machine's own network namespace, whose entries are
	// not the test's to touch.
	if c, ok := rt.ctClean.Cleaner.(io.Closer); ok {
		_ = c.Close()
	}
	rt.ctClean = dataplane.ConntrackCleanup{}
	if rt.HealthzAddr() == nil {
		t.Fatal("healthz server did not start")
	}
	base := "http://" + rt.HealthzAddr().String()

	send := make(chan *cluster.State)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- rt.Run(ctx, func(ctx context.Context, submit func(*cluster.State)) error {
			for {
				select {
				case st := <-send:
					submit(st)
				case <-ctx.Done():
					return nil
				}
			}
		}, RunHooks{})
	}()
	defer func() { cancel(); <-done }()

	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %q is not JSON: %v", path, b, err)
		}
		return resp.StatusCode, doc
	}
	// waitFor polls /healthz until it answers code (the sync loop runs in the background).
	waitFor := func(code int) map[string]any {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, doc := get("/healthz")
			if got == code {
				return doc
			}
			if time.Now().After(deadline) {
				t.Fatalf("/healthz answers %d %v, want %d", got, doc, code)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	node := func(toBeDeleted bool) *cluster.State {
		return &cluster.State{Nodes: map[string]*cluster.Node{"node1": {Name: "node1", ToBeDeleted: toBeDeleted}}}
	}

	send <- node(false)
	if doc := waitFor(200); doc["nodeEligible"] != true || doc["healthy"] != true {
		t.Errorf("/healthz of an eligible node: %v", doc)
	}
	send <- node(true)
	if doc := waitFor(503); doc["nodeEligible"] != false || doc["healthy"] != true {
		t.Errorf("/healthz of a node being deleted: %v", doc)
	}
	if code, doc := get("/livez"); code != 200 || doc["nodeEligible"] != nil {
		t.Errorf("/livez of a node being deleted: %d %v (want 200, no nodeEligible)", code, doc)
	}
	send <- node(false)
	waitFor(200)
}
