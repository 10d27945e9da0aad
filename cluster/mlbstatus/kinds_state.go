package mlbstatus

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// configStateAPI: ConfigurationStates in vipgate's namespace (node and controller).
func configStateAPI(dyn dynamic.Interface, ns string) kindAPI {
	return kindAPI{
		resource: gvrConfigurationStates.Resource,
		list: func(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
			return dyn.Resource(gvrConfigurationStates).Namespace(ns).List(ctx, o)
		},
		create: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrConfigurationStates).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrConfigurationStates).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{})
		},
		updateStatus: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrConfigurationStates).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{})
		},
	}
}

// ownerPods watches this component's own pod in vipgate's namespace (the owner of what it writes,
// as MetalLB's objects are owned by the speaker or controller pod, so Kubernetes' garbage collector
// removes them with the pod). fieldSelector picks the pod (spec.nodeName for a node's pod,
// metadata.name for the controller's), labelSelector the node agent's pods.
func ownerPods(client kubernetes.Interface, ns, labelSelector, fieldSelector string) cache.SharedIndexInformer {
	return coreinformers.NewFilteredPodInformer(client, ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector, o.FieldSelector = labelSelector, fieldSelector
	})
}
