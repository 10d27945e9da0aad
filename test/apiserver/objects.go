package apiserver

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The objects a cluster has before vipgate sees it, made here because this server runs without the
// controllers and kubelets that would make them. Each fails the test on an error and accepts an
// object that already exists, so that a test can ask for what it needs without knowing what the
// server made itself ("default").

// CreateNamespaces makes each namespace with its "default" ServiceAccount, which the
// ServiceAccount admission wants before it admits a pod (kube-controller-manager makes it in a
// cluster).
func (s *Server) CreateNamespaces(t testing.TB, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, ns := range names {
		_, err := s.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating namespace %s: %v", ns, err)
		}
		_, err = s.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating the default ServiceAccount of %s: %v", ns, err)
		}
	}
}

// CreateNode makes the Node object a kubelet would register: name, labels and its addresses as
// InternalIPs.
func (s *Server) CreateNode(t testing.TB, name string, labels map[string]string, addrs ...netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	if _, err := s.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating Node %s: %v", name, err)
	}
}
