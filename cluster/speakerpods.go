package cluster

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultSpeakerPodSelector selects vipgate's node agent pods: the labels of the DaemonSet's pod
// template in deploy/manifests/30-daemonset.yaml and in the Helm chart (which adds
// app.kubernetes.io/instance; set speaker.podSelector to tell two releases in one namespace apart).
const DefaultSpeakerPodSelector = "app.kubernetes.io/name=vipgate,app.kubernetes.io/component=node"

// WatchSpeakerPods makes the source watch the pods of namespace ns (vipgate's own) that selector
// matches — the node agent's pods — and list the nodes they are scheduled on in State.SpeakerNodes:
// the L2 speakers' members are the nodes that run a speaker, as MetalLB's speakerlist uses its
// speaker pods. "" selects DefaultSpeakerPodSelector. Call it before Run.
func (k *KubeSource) WatchSpeakerPods(ns, selector string) error {
	if ns == "" {
		return fmt.Errorf("watching the speaker pods needs vipgate's namespace")
	}
	if selector == "" {
		selector = DefaultSpeakerPodSelector
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return fmt.Errorf("speaker pod selector %q: %w", selector, err)
	}
	k.podsNamespace, k.podsSelector = ns, sel.String()
	return nil
}

// newSpeakerPodInformer watches the pods of one namespace that selector matches. It is the node
// agent's only access to pods: listed and watched in its own namespace, by a Role there (deploy/, and
// test/e2e/deploy_test.go checks it against this call).
func newSpeakerPodInformer(client kubernetes.Interface, ns, selector string) cache.SharedIndexInformer {
	inf := coreinformers.NewFilteredPodInformer(client, ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	// Only where and whether a pod runs is read: keep nothing else of it in memory.
	_ = inf.SetTransform(slimPod)
	return inf
}

// slimPod keeps what SpeakerNodes reads.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}, nil
}

// SpeakerNodes lists the nodes that run a speaker, from the node agent's pods: a pod counts once it
// is scheduled (spec.nodeName) — also while it crashes or is not ready yet, since a silent member is
// what the majority rule accounts for — and stops counting when it is being deleted or has ended
// (Succeeded, Failed: evicted, or its node was drained). Never nil.
func SpeakerNodes(pods []*corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		if p == nil || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out[p.Spec.NodeName] = true
	}
	return out
}
