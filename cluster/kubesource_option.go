package cluster

import (
	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// NewKubeSourceForClients returns a source that reads through the given clients instead of building
// its own from a rest.Config: the bench feeds the node's real pipeline (informers, coalescer,
// snapshot, onChange) from client-go's fake clientset this way. name stands for the API server in
// logs and String. The clients are used as they are: the protobuf content type NewKubeSource's
// clients ask for is the caller's choice here.
func NewKubeSourceForClients(client kubernetes.Interface, dyn dynamic.Interface, name, nodeName string, logger hclog.Logger) *KubeSource {
	k := NewKubeSource(&rest.Config{Host: name}, nodeName, logger)
	k.client, k.dyn = client, dyn
	return k
}
