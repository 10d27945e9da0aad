package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vipgate/vipgate/test/apiserver"
)

// TestKubeSourceBGPSecretsRBAC: against a real kube-apiserver with RBAC authorization, the node
// agent's ServiceAccount bound to the Role the chart renders for bgp.passwordSecrets: [tor, absent]
// (deploy/helm/vipgate/templates/rbac-node.yaml: list and watch on secrets, resourceNames) reads
// its named Secret through the Kubernetes source, follows its changes, and can read no other
// Secret of the namespace (another BGP password, Helm's release Secret) in any way; a name the
// source is given but the Role does not grant is refused, logged, and does not hold up the sync.
// With the old informer (every basic-auth Secret of the namespace) the source never syncs under
// this Role.
func TestKubeSourceBGPSecretsRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	const ns, agent = "vipgate-system", "system:serviceaccount:vipgate-system:vipgate-node"
	srv := apiserver.Start(t, apiserver.Options{RBAC: true, Users: []string{agent}})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := mustFor(t)
	srv.CreateNamespaces(t, ns)
	mk := func(name string, typ corev1.SecretType, pw string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: typ,
			Data: map[string][]byte{"password": []byte(pw), "username": []byte("u")}}
	}
	must(c.CoreV1().Secrets(ns).Create(ctx, mk("tor", corev1.SecretTypeBasicAuth, "one"), metav1.CreateOptions{}))
	must(c.CoreV1().Secrets(ns).Create(ctx, mk("other-peer", corev1.SecretTypeBasicAuth, "not-yours"), metav1.CreateOptions{}))
	must(c.CoreV1().Secrets(ns).Create(ctx, mk("sh.helm.release.v1.vipgate.v1", "helm.sh/release.v1", "release"), metav1.CreateOptions{}))

	// The node agent's RBAC (deploy/manifests/10-rbac-node.yaml's ClusterRole, and the chart's
	// bgp-secrets Role for bgp.passwordSecrets: [tor, absent]).
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "vipgate-node", Namespace: ns}}
	read := []string{"list", "watch"}
	must(c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: read},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"}, Verbs: read},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}}, metav1.CreateOptions{}))
	must(c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "vipgate-node"}, Subjects: sa}, metav1.CreateOptions{}))
	must(c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node-bgp-secrets"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: read, ResourceNames: []string{"tor", "absent"}},
	}}, metav1.CreateOptions{}))
	must(c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vipgate-node-bgp-secrets"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "vipgate-node-bgp-secrets"}, Subjects: sa}, metav1.CreateOptions{}))

	asAgent, err := kubernetes.NewForConfig(srv.RESTConfigAs(agent))
	if err != nil {
		t.Fatal(err)
	}
	secrets := asAgent.CoreV1().Secrets(ns)
	// RBAC takes a moment to see new roles: wait until the granted read works.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=tor"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent cannot list its own Secret by name: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"list every Secret", func() error { _, err := secrets.List(ctx, metav1.ListOptions{}); return err }},
		{"list basic-auth Secrets (the old informer)", func() error {
			_, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: "type=" + string(corev1.SecretTypeBasicAuth)})
			return err
		}},
		{"list another BGP password by name", func() error {
			_, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=other-peer"})
			return err
		}},
		{"watch Helm's release Secret by name", func() error {
			w, err := secrets.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=sh.helm.release.v1.vipgate.v1"})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"get Helm's release Secret", func() error {
			_, err := secrets.Get(ctx, "sh.helm.release.v1.vipgate.v1", metav1.GetOptions{})
			return err
		}},
		{"get its own Secret (informers never get)", func() error { _, err := secrets.Get(ctx, "tor", metav1.GetOptions{}); return err }},
		{"list Secrets of another namespace", func() error {
			_, err := asAgent.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=tor"})
			return err
		}},
	} {
		if err := c.call(); !apierrors.IsForbidden(err) {
			t.Errorf("the node agent could %s: %v, want Forbidden", c.what, err)
		}
	}

	var logs syncBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	rec := newStateRecorder()
	src := NewKubeSource(srv.RESTConfigAs(agent), "node1", log)
	// "other-peer" is not in the Role: refused, logged, and the source syncs without it.
	src.WatchBGPSecrets(ns, []string{"tor", "absent", "other-peer"})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, rec.onChange) }()
	defer func() { stop(); <-done }()
	names := func(st *State) string {
		var out []string
		for _, s := range st.MetalLB.Secrets {
			out = append(out, s.Namespace+"/"+s.Name+"="+string(s.Data["password"]))
		}
		return strings.Join(out, ",")
	}
	rec.wait(t, "its named Secret only", func(st *State) bool { return names(st) == ns+"/tor=one" })
	must(c.CoreV1().Secrets(ns).Update(ctx, mk("tor", corev1.SecretTypeBasicAuth, "two"), metav1.UpdateOptions{}))
	rec.wait(t, "the changed password", func(st *State) bool { return names(st) == ns+"/tor=two" })
	must(c.CoreV1().Secrets(ns).Create(ctx, mk("absent", corev1.SecretTypeBasicAuth, "three"), metav1.CreateOptions{}))
	rec.wait(t, "a granted Secret created later", func(st *State) bool { return names(st) == ns+"/absent=three,"+ns+"/tor=two" })
	if l := logs.String(); !strings.Contains(l, "refused") || !strings.Contains(l, "other-peer") {
		t.Errorf("the refused name is not logged:\n%s", l)
	}
}
