//go:build tools

// Package tools pins the real kube-apiserver used by the end-to-end tests.
// It is a separate module so the main module does not depend on k8s.io/kubernetes.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
