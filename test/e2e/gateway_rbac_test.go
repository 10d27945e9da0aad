package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestGatewayRBAC (issue #28): a gateway VM's API access, end to end, against a real kube-apiserver
// with RBAC authorization. An administrator applies deploy/manifests/12-rbac-gateway.yaml with
// kubectl and makes the gateway's kubeconfig with `vipgate gateway kubeconfig` (a TokenRequest token
// of vipgate-system/vipgate-gateway and the cluster's CA). With that kubeconfig alone: every list
// and watch the manifest grants succeeds (each of them is a call the gateway's code makes:
// TestDeployRBACMatchesCode); writes and reads it does not grant are refused with 403 (a Service
// created, a Node updated, a Secret read, status objects outside vipgate-system); and `vipgate
// gateway` in its netns syncs from the API with it — its Service's VIP in the sync — with no
// request refused, and writes its MetalLB ConfigurationState (POD_NAMESPACE=vipgate-system).
func TestGatewayRBAC(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"rb1"}},
		{Name: "gw1"},
	}})
	srv := apiserver.Start(t, apiserver.Options{Netns: l.NS(lab.RoleLANClient), Addr: lab.LANClientv4, RBAC: true})
	srv.InstallMetalLBCRDs(t)
	root := moduleRoot(t)
	kubectl := gatewayRBACKubectl(t, root)
	bin := vipgateBinary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The administrator's side: the namespace and the gateway's RBAC, as deploy/README.md says.
	for _, f := range []string{"00-namespace.yaml", "12-rbac-gateway.yaml"} {
		if out, err := l.Exec(lab.RoleLANClient, kubectl, "--kubeconfig", srv.Kubeconfig, "apply", "-f", filepath.Join(root, "deploy/manifests", f)); err != nil {
			t.Fatalf("kubectl apply -f %s: %v\n%s", f, err, out)
		}
	}
	gwKubeconfig := filepath.Join(dir, "gateway.kubeconfig")
	start := time.Now()
	out, err := l.Exec(lab.RoleLANClient, bin, "gateway", "kubeconfig", "--kubeconfig", srv.Kubeconfig, "--server", srv.URL,
		"--duration", "24h", "--output", gwKubeconfig)
	if err != nil {
		t.Fatalf("vipgate gateway kubeconfig: %v\n%s", err, out)
	}
	t.Logf("vipgate gateway kubeconfig (%v): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	if fi, err := os.Stat(gwKubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kubeconfig file: %v, mode %v, want 0600 (it holds a token)", err, fi.Mode().Perm())
	}
	raw, err := clientcmd.LoadFromFile(gwKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range raw.AuthInfos {
		if a.Token == "" || a.Token == srv.Token || a.ClientCertificateData != nil {
			t.Errorf("user %s of the gateway's kubeconfig: want the ServiceAccount's token only", name)
		}
	}
	gwCfg, err := clientcmd.BuildConfigFromFlags("", gwKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	gwCfg.Dial = apiserver.DialerInNetns(l.NS(lab.RoleLANClient))
	asGW, err := kubernetes.NewForConfig(gwCfg)
	if err != nil {
		t.Fatal(err)
	}
	dynGW, err := dynamic.NewForConfig(gwCfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server authenticates it as the ServiceAccount (the CA in the kubeconfig verified the
	// server on the way).
	review, err := asGW.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("who am I, with the gateway's kubeconfig: %v", err)
	}
	if u := review.Status.UserInfo.Username; u != "system:serviceaccount:vipgate-system:vipgate-gateway" {
		t.Fatalf("the gateway's kubeconfig authenticates as %q", u)
	}

	// Every list and watch of the manifest's ClusterRole and Role, as the gateway.
	t.Run("granted", func(t *testing.T) {
		for _, g := range gatewayRBACGrants(t) {
			gvr := gatewayRBACVersion(g.gr)
			var ri dynamic.ResourceInterface = dynGW.Resource(gvr)
			if g.namespace != "" {
				ri = dynGW.Resource(gvr).Namespace(g.namespace)
			}
			// As an informer: a list, then a watch from its resourceVersion.
			rv := ""
			for _, verb := range g.verbs {
				var err error
				began := time.Now()
				switch verb {
				case "list":
					var l *unstructured.UnstructuredList
					if l, err = ri.List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
						rv = l.GetResourceVersion()
					}
				case "watch":
					var w interface{ Stop() }
					if w, err = ri.Watch(ctx, metav1.ListOptions{ResourceVersion: rv}); err == nil {
						w.Stop()
					}
				default:
					continue // writes: the gateway itself makes them below
				}
				if err != nil {
					t.Errorf("%s %s (namespace %q) as the gateway: %v", verb, g.gr, g.namespace, err)
				}
				if d := time.Since(began); d > time.Second {
					t.Logf("%s %s: %v", verb, g.gr, d.Round(time.Millisecond))
				}
			}
		}
	})

	// What the gateway must not do. The admin makes the objects first, so a 403 is the RBAC's.
	c := srv.Client
	srv.CreateNode(t, "node1", nil, l.Node("node1").IPv4)
	if _, err := c.CoreV1().Secrets("vipgate-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tor-password"},
		Type: corev1.SecretTypeBasicAuth, Data: map[string][]byte{"password": []byte("secret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("refused", func(t *testing.T) {
		l2status := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "servicel2statuses"}
		for _, tc := range []struct {
			what string
			call func() error
		}{
			{"create a Service", func() error {
				_, err := asGW.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "evil"},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
				return err
			}},
			{"update a Node", func() error {
				n, err := c.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("admin: %w", err)
				}
				n.Labels = map[string]string{"evil": "yes"}
				_, err = asGW.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			}},
			{"get a Node (informers only list and watch)", func() error {
				_, err := asGW.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
				return err
			}},
			{"get a Secret", func() error {
				_, err := asGW.CoreV1().Secrets("vipgate-system").Get(ctx, "tor-password", metav1.GetOptions{})
				return err
			}},
			{"list the Secrets of vipgate-system", func() error {
				_, err := asGW.CoreV1().Secrets("vipgate-system").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"request a token of another ServiceAccount", func() error {
				_, err := asGW.CoreV1().ServiceAccounts("vipgate-system").Get(ctx, "default", metav1.GetOptions{})
				return err
			}},
			{"grant itself more (create a RoleBinding)", func() error {
				_, err := asGW.RbacV1().RoleBindings("vipgate-system").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "evil"},
					RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
					Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "vipgate-gateway", Namespace: "vipgate-system"}}}, metav1.CreateOptions{})
				return err
			}},
			{"list pods outside vipgate-system", func() error {
				_, err := asGW.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"create a ServiceL2Status outside vipgate-system", func() error {
				u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
					"metadata": map[string]any{"name": "evil", "namespace": "default"}}}
				_, err := dynGW.Resource(l2status).Namespace("default").Create(ctx, u, metav1.CreateOptions{})
				return err
			}},
			{"update an IPAddressPool's status", func() error {
				pools := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "ipaddresspools"}
				u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
					"metadata": map[string]any{"name": "evil", "namespace": "vipgate-system"}}}
				_, err := dynGW.Resource(pools).Namespace("vipgate-system").UpdateStatus(ctx, u, metav1.UpdateOptions{})
				return err
			}},
		} {
			if err := tc.call(); !apierrors.IsForbidden(err) {
				t.Errorf("%s as the gateway: %v, want 403 Forbidden", tc.what, err)
			}
		}
	})

	// The gateway itself, with that kubeconfig: a LoadBalancer Service with an endpoint on node1.
	vip := netip.MustParseAddr("203.0.113.48")
	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "rbacweb", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "rbacweb-1", Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: "rbacweb", discoveryv1.LabelManagedBy: "vipgate-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{l.Pod("rb1").IPv4.String()}, NodeName: new("node1")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: vip.String()}}
	if _, err := c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	gwConfig := filepath.Join(dir, "gw1.yaml")
	if err := os.WriteFile(gwConfig, []byte(fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [%q]
forwarding: route
healthCheckInterval: 250ms
`, l.Node("gw1").IPv4)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := l.Start("gw1", filepath.Join(dir, "gw1.log"), "env", "POD_NAMESPACE=vipgate-system",
		bin, "gateway", "--config", gwConfig, "--kubeconfig", gwKubeconfig, "--log-level", "debug")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- vipgate gateway:\n%s", p.Tail(40))
		}
	})
	start = time.Now()
	deadline := start.Add(60 * time.Second)
	for !strings.Contains(p.Log(), "vips=1") {
		if exited, err := p.Exited(); exited {
			t.Fatalf("the gateway exited: %v\n%s", err, p.Tail(30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not sync the Service within 60s with its kubeconfig:\n%s", p.Tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("gateway started -> synced with vips=1: %v", time.Since(start).Round(time.Millisecond))
	// Its status writer writes its ConfigurationState in vipgate-system under the Role.
	states := schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "configurationstates"}
	for {
		_, err := srv.Dynamic.Resource(states).Namespace("vipgate-system").Get(ctx, "speaker-gw1", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway wrote no ConfigurationState speaker-gw1: %v\n%s", err, p.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nothing the gateway asked for was refused (client-go and the status writer log a 403 as
	// "forbidden"). A second of quiet lets late requests show.
	time.Sleep(time.Second)
	if log := p.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("a request of the gateway was refused:\n%s", gatewayRBACLines(log, "forbidden"))
	}
}

// gatewayRBACGrant is one rule of the gateway's manifest: a resource, its verbs, and the namespace
// of a Role ("" for the ClusterRole).
type gatewayRBACGrant struct {
	gr        schema.GroupResource
	verbs     []string
	namespace string
}

// gatewayRBACGrants reads the rules of deploy/manifests/12-rbac-gateway.yaml.
func gatewayRBACGrants(t *testing.T) []gatewayRBACGrant {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy/manifests/12-rbac-gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []gatewayRBACGrant
	for _, o := range readObjects(t, b) {
		var rules []rbacv1.PolicyRule
		ns := ""
		switch o.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			o.decodeInto(t, &r)
			rules = r.Rules
		case "Role":
			var r rbacv1.Role
			o.decodeInto(t, &r)
			rules, ns = r.Rules, r.Namespace
		}
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					if !strings.Contains(res, "/") {
						out = append(out, gatewayRBACGrant{gr: schema.GroupResource{Group: g, Resource: res}, verbs: r.Verbs, namespace: ns})
					}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no rules in 12-rbac-gateway.yaml")
	}
	return out
}

// gatewayRBACVersion is the version vipgate reads a resource at.
func gatewayRBACVersion(gr schema.GroupResource) schema.GroupVersionResource {
	v := "v1"
	switch {
	case gr.Group == "metallb.io" && gr.Resource == "bgppeers":
		v = "v1beta2"
	case gr.Group == "metallb.io":
		v = "v1beta1"
	}
	return gr.WithVersion(v)
}

// gatewayRBACKubectl finds kubectl ($PATH, else the module's bin/kubectl from `make k8s`).
func gatewayRBACKubectl(t *testing.T, root string) string {
	t.Helper()
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	p := filepath.Join(root, "bin", "kubectl")
	if _, err := os.Stat(p); err != nil {
		t.Skip("kubectl not installed (make k8s builds bin/kubectl)")
	}
	return p
}

// gatewayRBACLines returns the lines of log that contain word (case-insensitive).
func gatewayRBACLines(log, word string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(line), word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestGatewayKubeconfigSecret: `vipgate gateway kubeconfig --secret` against a real kube-apiserver
// (RBAC) with kube-controller-manager's token controller: it creates the service-account-token
// Secret vipgate-gateway-token, waits for the controller's token and prints a kubeconfig that
// authenticates as the gateway's ServiceAccount, with the RBAC of 12-rbac-gateway.yaml; a second run
// reuses the Secret. An administrator's kubeconfig without a CA (insecure-skip-tls-verify) gets the
// cluster's CA from ConfigMap kube-root-ca.crt. A missing ServiceAccount is an error that says
// what to apply, and nothing is printed on stdout.
func TestGatewayKubeconfigSecret(t *testing.T) {
	srv := apiserver.Start(t, apiserver.Options{RBAC: true})
	srv.StartTokenControllers(t)
	root := moduleRoot(t)
	kubectl := gatewayRBACKubectl(t, root)
	bin := vipgateBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, f := range []string{"00-namespace.yaml", "12-rbac-gateway.yaml"} {
		if out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", srv.Kubeconfig, "apply", "-f", filepath.Join(root, "deploy/manifests", f)).CombinedOutput(); err != nil {
			t.Fatalf("kubectl apply -f %s: %v\n%s", f, err, out)
		}
	}
	run := func(admin string, args ...string) (stdout, stderr string, err error) {
		var o, e strings.Builder
		cmd := exec.CommandContext(ctx, bin, append([]string{"gateway", "kubeconfig", "--kubeconfig", admin, "--server", srv.URL}, args...)...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	// asGateway checks what a kubeconfig is to the API server: the gateway's ServiceAccount, which
	// lists Services and may not read Secrets.
	asGateway := func(t *testing.T, kubeconfig string) *kubernetes.Clientset {
		t.Helper()
		cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kubeconfig))
		if err != nil {
			t.Fatalf("the printed kubeconfig: %v\n%s", err, kubeconfig)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		review, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("who am I: %v", err)
		}
		if u := review.Status.UserInfo.Username; u != "system:serviceaccount:vipgate-system:vipgate-gateway" {
			t.Fatalf("authenticated as %q", u)
		}
		if _, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("list services: %v", err)
		}
		if _, err := c.CoreV1().Secrets("vipgate-system").Get(ctx, "vipgate-gateway-token", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("get its own token Secret: %v, want 403", err)
		}
		return c
	}

	var first string
	t.Run("secret", func(t *testing.T) {
		start := time.Now()
		out, msg, err := run(srv.Kubeconfig, "--secret")
		if err != nil {
			t.Fatalf("%v\n%s", err, msg)
		}
		t.Logf("--secret (%v): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(msg))
		asGateway(t, out)
		first = out
		s, err := srv.Client.CoreV1().Secrets("vipgate-system").Get(ctx, "vipgate-gateway-token", metav1.GetOptions{})
		if err != nil || s.Type != corev1.SecretTypeServiceAccountToken {
			t.Fatalf("the token Secret: %v %v", err, s)
		}
		again, msg, err := run(srv.Kubeconfig, "--secret")
		if err != nil {
			t.Fatalf("second run: %v\n%s", err, msg)
		}
		if again != first {
			t.Errorf("the second run made another kubeconfig; want the same Secret's token")
		}
	})

	t.Run("CA from kube-root-ca.crt", func(t *testing.T) {
		admin, err := clientcmd.LoadFromFile(srv.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		var wantCA []byte
		for _, c := range admin.Clusters {
			wantCA, c.CertificateAuthorityData, c.InsecureSkipTLSVerify = c.CertificateAuthorityData, nil, true
		}
		insecure := filepath.Join(t.TempDir(), "admin-insecure.kubeconfig")
		if err := clientcmd.WriteToFile(*admin, insecure); err != nil {
			t.Fatal(err)
		}
		// The root CA publisher writes the ConfigMap shortly after the namespace exists.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := srv.Client.CoreV1().ConfigMaps("vipgate-system").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("no kube-root-ca.crt: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		out, msg, err := run(insecure, "--duration", "1h")
		if err != nil {
			t.Fatalf("%v\n%s", err, msg)
		}
		got, err := clientcmd.Load([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		for name, c := range got.Clusters {
			if string(c.CertificateAuthorityData) != string(wantCA) || c.InsecureSkipTLSVerify {
				t.Errorf("cluster %s of the kubeconfig: CA %q, insecure %v; want the cluster's CA", name, c.CertificateAuthorityData, c.InsecureSkipTLSVerify)
			}
		}
		asGateway(t, out)
		if !strings.Contains(msg, "expires") {
			t.Errorf("the token's expiry is not said: %q", msg)
		}
	})

	t.Run("no ServiceAccount", func(t *testing.T) {
		out, msg, err := run(srv.Kubeconfig, "--service-account", "absent")
		if err == nil || out != "" || !strings.Contains(msg, "12-rbac-gateway.yaml") {
			t.Errorf("err %v, stdout %q, stderr %q; want an error naming the manifest to apply and no output", err, out, msg)
		}
	})
}
