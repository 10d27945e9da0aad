package cluster

import (
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// apiNode is a Node as the informer delivers it, with what kubelet writes besides what vipgate reads.
func apiNode(name, rv string, addr string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv,
			Labels:      map[string]string{ZoneLabel: "zone-a", "kubernetes.io/hostname": name},
			Annotations: map[string]string{"vipgate.io/example": "x", "csi.volume.kubernetes.io/nodeid": "{}"}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				LastHeartbeatTime: metav1.NewTime(time.Unix(1000, 0))}},
		},
	}
}

// heartbeat is n as kubelet's next status write leaves it: a new resourceVersion and heartbeat time.
func heartbeat(n *corev1.Node, rv string) *corev1.Node {
	n = n.DeepCopy()
	n.ResourceVersion = rv
	n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(n.Status.Conditions[0].LastHeartbeatTime.Add(time.Minute))
	n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{"img:" + rv}})
	return n
}

// TestNodeUnchangedForVipgate checks the Node update filter: what kubelet writes all the time is
// dropped, every change of what NodeFromAPI reads is not, and whenever the filter drops an update,
// NodeFromAPI makes the same Node of both versions (so nothing read is ever dropped).
func TestNodeUnchangedForVipgate(t *testing.T) {
	base := apiNode("node1", "1", "192.0.2.11")
	for _, tc := range []struct {
		name      string
		change    func(n *corev1.Node)
		unchanged bool
	}{
		{"heartbeat", func(n *corev1.Node) { *n = *heartbeat(n, "2") }, true},
		{"taint", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}} }, true},
		{"NotReady", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"other annotation", func(n *corev1.Node) { n.Annotations["csi.volume.kubernetes.io/nodeid"] = `{"a":"b"}` }, true},
		{"label", func(n *corev1.Node) { n.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = "" }, false},
		{"label removed", func(n *corev1.Node) { delete(n.Labels, ZoneLabel) }, false},
		{"zone", func(n *corev1.Node) { n.Labels[ZoneLabel] = "zone-b" }, false},
		{"vipgate annotation", func(n *corev1.Node) { n.Annotations["vipgate.io/example"] = "y" }, false},
		{"vipgate annotation added", func(n *corev1.Node) { n.Annotations["vipgate.io/other"] = "" }, false},
		{"vipgate annotation removed", func(n *corev1.Node) { delete(n.Annotations, "vipgate.io/example") }, false},
		{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, false},
		{"address", func(n *corev1.Node) { n.Status.Addresses[0].Address = "192.0.2.12" }, false},
		{"external address added", func(n *corev1.Node) {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.1"})
		}, false},
		{"new UID", func(n *corev1.Node) { n.UID = "other" }, false},
		{"autoscaler's taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}
		}, false},
		{"being deleted", func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base.DeepCopy()
			tc.change(n)
			got := nodeUnchangedForVipgate(base, n)
			if got != tc.unchanged {
				t.Errorf("nodeUnchangedForVipgate = %v, want %v", got, tc.unchanged)
			}
			a, errA := NodeFromAPI(base)
			b, errB := NodeFromAPI(n)
			if same := sameNodeConversion(a, errA, b, errB); got && !same {
				t.Errorf("the filter drops an update that NodeFromAPI reads: %+v -> %+v", a, b)
			}
		})
	}
	if nodeUnchangedForVipgate(base, cache.DeletedFinalStateUnknown{Obj: base}) {
		t.Error("a tombstone counted as an unchanged Node")
	}

	// Through the handler: the heartbeat is counted and dropped, the label change passed on.
	var ignored atomic.Int64
	passed := 0
	h := dropUnchanged(cache.ResourceEventHandlerFuncs{UpdateFunc: func(any, any) { passed++ }}, nodeUnchangedForVipgate, &ignored)
	h.OnUpdate(base, heartbeat(base, "2"))
	labelled := base.DeepCopy()
	labelled.Labels["role"] = "edge"
	h.OnUpdate(base, labelled)
	if ignored.Load() != 1 || passed != 1 {
		t.Errorf("%d updates ignored, %d passed on; want 1 and 1", ignored.Load(), passed)
	}
}

// TestKubeBuilderNodeHeartbeat: a full listing that finds a Node at a new resourceVersion whose
// conversion is the same keeps the previous *Node (sameState sees no change) and does not report a
// refused Node again; a label change makes a new *Node.
func TestKubeBuilderNodeHeartbeat(t *testing.T) {
	events := record.NewFakeRecorder(10)
	b := newKubeBuilder(hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}), events)
	node, bad := apiNode("node1", "1", "192.0.2.11"), apiNode("node2", "1", "not-an-ip")
	first := b.build(kubeObjects{nodes: []*corev1.Node{node, bad}})
	if first.Nodes["node1"] == nil || len(first.Rejected) != 1 || len(events.Events) != 1 {
		t.Fatalf("nodes %v, rejected %v, %d events", first.Nodes, first.Rejected, len(events.Events))
	}
	<-events.Events

	second := b.build(kubeObjects{nodes: []*corev1.Node{heartbeat(node, "2"), heartbeat(bad, "2")}})
	if second.Nodes["node1"] != first.Nodes["node1"] || !sameState(first, second) {
		t.Errorf("a heartbeat made a new *Node or a different State")
	}
	if len(events.Events) != 0 {
		t.Errorf("the refused Node was reported again for a heartbeat: %s", <-events.Events)
	}

	labelled := heartbeat(node, "3")
	labelled.Labels["role"] = "edge"
	third := b.build(kubeObjects{nodes: []*corev1.Node{labelled, heartbeat(bad, "3")}})
	if n := third.Nodes["node1"]; n == second.Nodes["node1"] || n.Labels["role"] != "edge" || sameState(second, third) {
		t.Errorf("a label change kept the *Node or the State: %+v", n)
	}
	// And the converted Node itself is what a fresh conversion makes.
	if want, _ := NodeFromAPI(labelled); !reflect.DeepEqual(third.Nodes["node1"], want) {
		t.Errorf("node1 %+v, want %+v", third.Nodes["node1"], want)
	}
}

// TestKubeSourceNodeHeartbeat runs the source on client-go's fake clientset: a Node status write
// that changes nothing vipgate reads builds no snapshot and calls no onChange; a full listing taken
// afterwards for another reason keeps the Node's pointer; a label change reaches onChange.
func TestKubeSourceNodeHeartbeat(t *testing.T) {
	node := apiNode("node1", "1", "192.0.2.11")
	client, src, rec := runFakeKubeSource(t, node)
	ctx := t.Context()
	first := rec.wait(t, "the first State", func(st *State) bool { return st.Nodes["node1"] != nil })
	_, states := rec.latest()
	snaps := src.stats.snapshots.Load()

	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, heartbeat(node, "2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the heartbeat never reached the Node handler", func() bool { return src.stats.nodeIgnored.Load() != 0 })
	if n := src.stats.snapshots.Load() - snaps; n != 0 {
		t.Errorf("a Node heartbeat built %d snapshots", n)
	}

	// Another Node: a full listing, which reads node1 at its new resourceVersion and must keep it.
	if _, err := client.CoreV1().Nodes().Create(ctx, apiNode("node2", "3", "192.0.2.12"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st := rec.wait(t, "node2", func(st *State) bool { return st.Nodes["node2"] != nil })
	if st.Nodes["node1"] != first.Nodes["node1"] {
		t.Errorf("node1's *Node changed across a heartbeat")
	}

	labelled := heartbeat(node, "4")
	labelled.Labels["role"] = "edge"
	if _, err := client.CoreV1().Nodes().Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "node1's new label", func(st *State) bool { return st.Nodes["node1"].Labels["role"] == "edge" })
	// The States since the heartbeat: node2's and the label's, nothing for the heartbeat.
	if _, n := rec.latest(); n-states != 2 {
		t.Errorf("%d States after the heartbeat, node2 and the label change; want 2", n-states)
	}
	if n := src.stats.nodeIgnored.Load(); n != 1 {
		t.Errorf("%d Node updates ignored, want the 1 heartbeat", n)
	}
}

// TestNodeFromAPIToBeDeleted: a deletion timestamp or the cluster autoscaler's taint makes a Node
// ToBeDeleted (kube-proxy's ineligible node: /healthz fails); another taint does not.
func TestNodeFromAPIToBeDeleted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(n *corev1.Node)
		want   bool
	}{
		{"plain", func(*corev1.Node) {}, false},
		{"other taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}
		}, false},
		{"autoscaler's taint", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "a", Effect: corev1.TaintEffectNoSchedule}, {Key: ToBeDeletedTaint, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}}
		}, true},
		{"deletion timestamp", func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} }, true},
	} {
		n := apiNode("node1", "1", "192.0.2.11")
		tc.change(n)
		got, err := NodeFromAPI(n)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.ToBeDeleted != tc.want {
			t.Errorf("%s: ToBeDeleted = %v, want %v", tc.name, got.ToBeDeleted, tc.want)
		}
	}
}
