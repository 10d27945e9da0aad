package cluster

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// newBGPSecretInformer watches the basic-auth Secrets of one namespace (BGPPeer passwordSecret). It is
// the node agent's only access to Secrets: listed and watched in its own namespace, by a Role there
// (deploy/, and test/e2e/deploy_test.go checks it against this call).
func newBGPSecretInformer(client kubernetes.Interface, ns string) cache.SharedIndexInformer {
	return coreinformers.NewFilteredSecretInformer(client, ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = "type=" + string(corev1.SecretTypeBasicAuth)
	})
}
