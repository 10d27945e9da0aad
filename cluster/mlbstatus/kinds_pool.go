package mlbstatus

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// poolStatusAPI: the status subresource of IPAddressPools, in the pool's namespace (controller).
func poolStatusAPI(dyn dynamic.Interface) func(context.Context, *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return dyn.Resource(gvrIPAddressPools).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	}
}
