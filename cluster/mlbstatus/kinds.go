package mlbstatus

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The resources this package writes (metallb.io/v1beta1). Each API call names its resource (the
// gvr variable) and its verb on one line, so that test/e2e/deploy_test.go can check the RBAC
// against them.
var (
	gvrServiceL2Statuses   = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "servicel2statuses"}
	gvrServiceBGPStatuses  = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "servicebgpstatuses"}
	gvrConfigurationStates = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "configurationstates"}
	gvrIPAddressPools      = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "ipaddresspools"}
)

// kindAPI is the part of the API a status kind needs, in one namespace.
type kindAPI struct {
	resource     string
	list         func(context.Context, metav1.ListOptions) (*unstructured.UnstructuredList, error)
	create       func(context.Context, *unstructured.Unstructured) (*unstructured.Unstructured, error)
	update       func(context.Context, *unstructured.Unstructured) (*unstructured.Unstructured, error)
	updateStatus func(context.Context, *unstructured.Unstructured) (*unstructured.Unstructured, error)
	delete       func(context.Context, string) error
}

// l2API: ServiceL2Statuses in vipgate's namespace (node).
func l2API(dyn dynamic.Interface, ns string) kindAPI {
	return kindAPI{
		resource: gvrServiceL2Statuses.Resource,
		list: func(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
			return dyn.Resource(gvrServiceL2Statuses).Namespace(ns).List(ctx, o)
		},
		create: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceL2Statuses).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceL2Statuses).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{})
		},
		updateStatus: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceL2Statuses).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{})
		},
		delete: func(ctx context.Context, name string) error {
			return dyn.Resource(gvrServiceL2Statuses).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
		},
	}
}

// bgpAPI: ServiceBGPStatuses in vipgate's namespace (node).
func bgpAPI(dyn dynamic.Interface, ns string) kindAPI {
	return kindAPI{
		resource: gvrServiceBGPStatuses.Resource,
		list: func(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
			return dyn.Resource(gvrServiceBGPStatuses).Namespace(ns).List(ctx, o)
		},
		create: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceBGPStatuses).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceBGPStatuses).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{})
		},
		updateStatus: func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
			return dyn.Resource(gvrServiceBGPStatuses).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{})
		},
		delete: func(ctx context.Context, name string) error {
			return dyn.Resource(gvrServiceBGPStatuses).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
		},
	}
}
