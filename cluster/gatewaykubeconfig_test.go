package cluster

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// TestGatewayKubeconfigOptionsValidate: what is refused before the API server is asked (the end to
// end path is test/e2e's TestGatewayRBAC and TestGatewayKubeconfigSecret).
func TestGatewayKubeconfigOptionsValidate(t *testing.T) {
	ok := GatewayKubeconfigOptions{Server: "https://192.0.2.10:6443", Namespace: "vipgate-system", ServiceAccount: "vipgate-gateway", Duration: 8760 * time.Hour}
	for _, tc := range []struct {
		name string
		edit func(o *GatewayKubeconfigOptions)
		want string // "" = valid
	}{
		{"valid", func(*GatewayKubeconfigOptions) {}, ""},
		{"no server", func(o *GatewayKubeconfigOptions) { o.Server = "" }, "--server"},
		{"plain http", func(o *GatewayKubeconfigOptions) { o.Server = "http://192.0.2.10:6443" }, "want https"},
		{"no host", func(o *GatewayKubeconfigOptions) { o.Server = "https://" }, "want https"},
		{"no namespace", func(o *GatewayKubeconfigOptions) { o.Namespace = "" }, "namespace"},
		{"no service account", func(o *GatewayKubeconfigOptions) { o.ServiceAccount = "" }, "service account"},
		{"too short", func(o *GatewayKubeconfigOptions) { o.Duration = 5 * time.Minute }, "minimum"},
		{"secret: no duration needed", func(o *GatewayKubeconfigOptions) { o.Duration, o.Secret = 0, true }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestGatewayKubeconfigFile: the file names the server, the CA and the token, and the context's
// namespace, and nothing else (no client certificate, no TLS skip).
func TestGatewayKubeconfigFile(t *testing.T) {
	o := GatewayKubeconfigOptions{Server: "https://192.0.2.10:6443", Namespace: "vipgate-system", ServiceAccount: "vipgate-gateway"}
	b, err := gatewayKubeconfig(o, []byte("CA PEM"), "TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || ctx.Namespace != "vipgate-system" {
		t.Fatalf("current context %q: %+v", cfg.CurrentContext, ctx)
	}
	c, u := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if c == nil || c.Server != o.Server || string(c.CertificateAuthorityData) != "CA PEM" || c.InsecureSkipTLSVerify {
		t.Errorf("cluster: %+v", c)
	}
	if u == nil || u.Token != "TOKEN" || u.ClientCertificateData != nil || u.TokenFile != "" {
		t.Errorf("user: %+v", u)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(b)
	if err != nil || rc.Host != o.Server || rc.BearerToken != "TOKEN" {
		t.Errorf("as a client config: %v %+v", err, rc)
	}
}
