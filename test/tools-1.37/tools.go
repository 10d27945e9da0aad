//go:build tools

// Package tools pins the real Kubernetes v1.37 components for the test cluster at the newest version
// (`make k8s K8S_VERSION=v1.37.2`): kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
// kube-proxy (for the conformance comparison), agnhost and the e2e suite (e2e.test). It is test/tools
// (v1.36.3, the project's test version) at k8s.io/kubernetes v1.37.2 with every staging module at
// v0.37.2, a separate module so neither version's dependencies constrain the other's.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
