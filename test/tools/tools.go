//go:build tools

// Package tools pins the real Kubernetes components used by the end-to-end tests and the test cluster:
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (for the conformance
// comparison), agnhost and the e2e suite (e2e.test). It is a separate module so the main module does
// not depend on k8s.io/kubernetes.
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
