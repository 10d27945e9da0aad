package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// This file makes the kubeconfig of a gateway (`vipgate gateway kubeconfig`): a gateway runs on a VM
// outside the cluster, so it has no mounted service-account token; an administrator's kubeconfig
// asks the API server for one of the ServiceAccount that deploy/manifests/12-rbac-gateway.yaml binds
// to the gateway's read-only ClusterRole, and the result names only that ServiceAccount, never the
// administrator's credentials.

// GatewayKubeconfigOptions say which ServiceAccount the kubeconfig is for and how its token is made.
type GatewayKubeconfigOptions struct {
	// Server is the API server's URL as the gateway reaches it (the administrator's kubeconfig may
	// name another address, e.g. 127.0.0.1 on a control-plane node).
	Server string
	// Namespace and ServiceAccount name the gateway's ServiceAccount (vipgate-system/vipgate-gateway).
	Namespace, ServiceAccount string
	// Duration is the lifetime asked of a TokenRequest token (at least 10 minutes, the API server's
	// minimum; it may grant less: --service-account-max-token-expiration).
	Duration time.Duration
	// Secret asks for a long-lived token instead: a kubernetes.io/service-account-token Secret
	// (<ServiceAccount>-token), which kube-controller-manager's token controller fills and which
	// lives until the Secret is deleted.
	Secret bool
	// SecretWait bounds the wait for the token controller (default 30s).
	SecretWait time.Duration
	// CAData is the CA bundle that verifies Server (PEM). Empty: the administrator's kubeconfig's,
	// else the cluster's kube-root-ca.crt ConfigMap in Namespace.
	CAData []byte
}

// GatewayCredentials is the made kubeconfig.
type GatewayCredentials struct {
	// Kubeconfig is the file's content (YAML): Server, the CA, the token, Namespace as the context's.
	Kubeconfig []byte
	// Expires is when a TokenRequest token expires (zero for a Secret's token: never).
	Expires time.Time
	// SecretName is the token Secret (Secret mode only).
	SecretName string
}

// gatewayTokenMinimum is the shortest lifetime the TokenRequest API accepts.
const gatewayTokenMinimum = 10 * time.Minute

// MakeGatewayKubeconfig asks the API server admin points at for a token of the gateway's
// ServiceAccount and returns a kubeconfig for o.Server with it. The ServiceAccount must exist (the
// RBAC manifest creates it): a token of an absent ServiceAccount would be refused by every request.
func MakeGatewayKubeconfig(ctx context.Context, admin *rest.Config, o GatewayKubeconfigOptions) (*GatewayCredentials, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	if _, err := client.CoreV1().ServiceAccounts(o.Namespace).Get(ctx, o.ServiceAccount, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("ServiceAccount %s/%s does not exist: apply deploy/manifests/12-rbac-gateway.yaml (or the chart with gateway.rbac.create=true) first", o.Namespace, o.ServiceAccount)
		}
		return nil, fmt.Errorf("reading ServiceAccount %s/%s with the administrator's kubeconfig: %w", o.Namespace, o.ServiceAccount, err)
	}
	ca := o.CAData
	if len(ca) == 0 {
		if ca, err = clusterCA(ctx, client, admin, o.Namespace); err != nil {
			return nil, err
		}
	}
	out := &GatewayCredentials{}
	var token string
	if o.Secret {
		out.SecretName = o.ServiceAccount + "-token"
		if token, err = secretToken(ctx, client, o, out.SecretName); err != nil {
			return nil, err
		}
	} else {
		secs := int64(o.Duration / time.Second)
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}
		tr, err := client.CoreV1().ServiceAccounts(o.Namespace).CreateToken(ctx, o.ServiceAccount, req, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("requesting a token for ServiceAccount %s/%s (TokenRequest): %w", o.Namespace, o.ServiceAccount, err)
		}
		token, out.Expires = tr.Status.Token, tr.Status.ExpirationTimestamp.Time
	}
	if out.Kubeconfig, err = gatewayKubeconfig(o, ca, token); err != nil {
		return nil, err
	}
	return out, nil
}

// Validate checks the options before anything is asked of the API server. The server URL must be
// https with a host: the token is a bearer credential.
func (o GatewayKubeconfigOptions) Validate() error {
	if o.Server == "" {
		return errors.New("the API server URL is required (--server https://ADDRESS:6443, as the gateway reaches it)")
	}
	u, err := url.Parse(o.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("API server URL %q: want https://HOST[:PORT]", o.Server)
	}
	if o.Namespace == "" || o.ServiceAccount == "" {
		return errors.New("the namespace and the service account name are required")
	}
	if !o.Secret && o.Duration < gatewayTokenMinimum {
		return fmt.Errorf("token duration %v is below the API server's minimum of %v", o.Duration, gatewayTokenMinimum)
	}
	return nil
}

// clusterCA is the CA that verifies the API server: the administrator's kubeconfig's (inline or a
// file), else the kube-root-ca.crt ConfigMap that kube-controller-manager publishes in every
// namespace.
func clusterCA(ctx context.Context, client kubernetes.Interface, admin *rest.Config, ns string) ([]byte, error) {
	if len(admin.CAData) > 0 {
		return admin.CAData, nil
	}
	if admin.CAFile != "" {
		b, err := os.ReadFile(admin.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the administrator's kubeconfig's CA: %w", err)
		}
		return b, nil
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the administrator's kubeconfig has no CA and ConfigMap %s/kube-root-ca.crt cannot be read (%w): pass the cluster's CA with --ca-file", ns, err)
	}
	if ca := cm.Data["ca.crt"]; ca != "" {
		return []byte(ca), nil
	}
	return nil, fmt.Errorf("ConfigMap %s/kube-root-ca.crt has no ca.crt: pass the cluster's CA with --ca-file", ns)
}

// secretToken creates (or reuses) the ServiceAccount's token Secret and waits until the token
// controller has written its token.
func secretToken(ctx context.Context, client kubernetes.Interface, o GatewayKubeconfigOptions, name string) (string, error) {
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace,
			Annotations: map[string]string{corev1.ServiceAccountNameKey: o.ServiceAccount},
			Labels:      map[string]string{"app.kubernetes.io/name": "vipgate", "app.kubernetes.io/component": "gateway"}},
		Type: corev1.SecretTypeServiceAccountToken,
	}
	_, err := client.CoreV1().Secrets(o.Namespace).Create(ctx, want, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating the token Secret %s/%s: %w", o.Namespace, name, err)
	}
	wait := o.SecretWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		s, err := client.CoreV1().Secrets(o.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("reading the token Secret %s/%s: %w", o.Namespace, name, err)
		}
		// An existing Secret of that name must be this ServiceAccount's token, nothing else.
		if s.Type != corev1.SecretTypeServiceAccountToken || s.Annotations[corev1.ServiceAccountNameKey] != o.ServiceAccount {
			return "", fmt.Errorf("a Secret %s/%s exists and is not a token of ServiceAccount %s: delete or rename it", o.Namespace, name, o.ServiceAccount)
		}
		if tok := s.Data[corev1.ServiceAccountTokenKey]; len(tok) > 0 {
			return string(tok), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the token Secret %s/%s has no token after %v: kube-controller-manager's token controller fills it (is it running with --service-account-private-key-file?); or use a TokenRequest token (without --secret)", o.Namespace, name, wait)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// gatewayKubeconfig is the kubeconfig file of the gateway's ServiceAccount.
func gatewayKubeconfig(o GatewayKubeconfigOptions, ca []byte, token string) ([]byte, error) {
	const clusterName = "vipgate"
	user := o.ServiceAccount
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[clusterName] = &clientcmdapi.Cluster{Server: o.Server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	ctxName := user + "@" + clusterName
	cfg.Contexts[ctxName] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: user, Namespace: o.Namespace}
	cfg.CurrentContext = ctxName
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return b, nil
}
