package cluster

import "k8s.io/client-go/rest"

// RESTConfig is the client configuration of the source's API server, for the components that
// write to it beside the source (cluster/mlbstatus: MetalLB's status resources).
func (k *KubeSource) RESTConfig() *rest.Config { return k.cfg }
