package cluster

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/test/apiserver"
)

func TestSpeakerNodes(t *testing.T) {
	now := metav1.Now()
	pod := func(node string, phase corev1.PodPhase, deleting bool) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	got := SpeakerNodes([]*corev1.Pod{
		pod("running", corev1.PodRunning, false),
		pod("crashing", corev1.PodRunning, false), // CrashLoopBackOff is a Running pod: silent, still a member
		pod("starting", corev1.PodPending, false),
		pod("", corev1.PodPending, false), // not scheduled
		pod("terminating", corev1.PodRunning, true),
		pod("evicted", corev1.PodFailed, false),
		pod("done", corev1.PodSucceeded, false),
		nil,
	})
	if want := []string{"crashing", "running", "starting"}; !slices.Equal(want, slices.Sorted(maps.Keys(got))) {
		t.Errorf("speaker nodes %v, want %v", slices.Sorted(maps.Keys(got)), want)
	}
}

// TestKubeSourceSpeakerPods: against a real kube-apiserver, WatchSpeakerPods lists the nodes the
// node agent's pods (the DaemonSet's labels, vipgate's namespace) are scheduled on: not other pods,
// not other namespaces, not unscheduled pods; a pod being deleted or ended stops counting, a new
// one counts, and a Node without a speaker pod is in State.Nodes but not in State.SpeakerNodes.
func TestKubeSourceSpeakerPods(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := mustFor(t)
	srv.CreateNamespaces(t, "vipgate-system", "default")
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		srv.CreateNode(t, n, nil)
	}
	agent := map[string]string{"app.kubernetes.io/name": "vipgate", "app.kubernetes.io/component": "node", "app.kubernetes.io/instance": "vipgate"}
	mk := func(ns, name, node string, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vipgate", Image: "vipgate"}}}}
		must(c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}))
		return p
	}
	mk("vipgate-system", "node-a", "n1", agent)
	mk("vipgate-system", "node-b", "n2", agent)
	mk("vipgate-system", "pending", "", agent)
	mk("vipgate-system", "controller", "n3", map[string]string{"app.kubernetes.io/name": "vipgate", "app.kubernetes.io/component": "controller"})
	mk("default", "impostor", "n4", agent)

	rec := newStateRecorder()
	src := NewKubeSource(srv.RESTConfig(), "n1", hclog.NewNullLogger())
	if err := src.WatchSpeakerPods("vipgate-system", ""); err != nil {
		t.Fatal(err)
	}
	if err := src.WatchSpeakerPods("vipgate-system", "app in ("); err == nil {
		t.Error("a broken selector was accepted")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, rec.onChange) }()
	defer func() { stop(); <-done }()

	speakers := func(st *State) string { return strings.Join(slices.Sorted(maps.Keys(st.SpeakerNodes)), ",") }
	st := rec.wait(t, "the agent pods of vipgate-system only", func(st *State) bool { return speakers(st) == "n1,n2" })
	if len(st.Nodes) != 4 {
		t.Errorf("State.Nodes has %d nodes, want all 4 (only the members are filtered)", len(st.Nodes))
	}
	// A crashing pod still counts (its status says nothing about scheduling).
	p, err := c.CoreV1().Pods("vipgate-system").Get(ctx, "node-b", metav1.GetOptions{})
	must(p, err)
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vipgate", Image: "vipgate", RestartCount: 7,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
	must(c.CoreV1().Pods("vipgate-system").UpdateStatus(ctx, p, metav1.UpdateOptions{}))
	// A scheduled pod is deleted with a grace period: it is terminating (no kubelet here confirms it).
	must(nil, c.CoreV1().Pods("vipgate-system").Delete(ctx, "node-a", metav1.DeleteOptions{}))
	rec.wait(t, "n1's pod terminating", func(st *State) bool { return speakers(st) == "n2" })
	mk("vipgate-system", "node-c", "n3", agent)
	rec.wait(t, "n3's new pod", func(st *State) bool { return speakers(st) == "n2,n3" })
	p, err = c.CoreV1().Pods("vipgate-system").Get(ctx, "node-c", metav1.GetOptions{})
	must(p, err)
	p.Status.Phase = corev1.PodFailed // evicted
	must(c.CoreV1().Pods("vipgate-system").UpdateStatus(ctx, p, metav1.UpdateOptions{}))
	rec.wait(t, "n3's pod failed", func(st *State) bool { return speakers(st) == "n2" })
}
