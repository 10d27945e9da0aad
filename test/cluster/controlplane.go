package testcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// Users of the static token file: name, groups.
var controlPlaneUsers = []struct{ name, groups string }{
	{"admin", "system:masters"},
	{"system:kube-controller-manager", ""},
	{"system:kube-scheduler", ""},
}

// APIServerURL is the API server's address on the lab LAN.
func APIServerURL() string {
	return fmt.Sprintf("https://%s:%d", APIServerAddr, APIServerPort)
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	dir := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var err error
	if c.pki, err = apiserver.MakePKI(dir, APIServerAddr); err != nil {
		return err
	}
	// Tokens: the control plane's users and one per kubelet.
	c.tokens = map[string]string{}
	var lines []string
	add := func(user, groups string) error {
		tok, err := randomToken()
		if err != nil {
			return err
		}
		c.tokens[user] = tok
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", tok, user, user, groups))
		return nil
	}
	for _, u := range controlPlaneUsers {
		if err := add(u.name, u.groups); err != nil {
			return err
		}
	}
	for i := 1; i <= c.Spec.Nodes+c.Spec.Spare; i++ {
		if err := add(fmt.Sprintf("system:node:node%d", i), "system:nodes"); err != nil {
			return err
		}
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	for user := range c.tokens {
		if err := c.writeKubeconfig(user); err != nil {
			return err
		}
	}
	c.Kubeconfig = c.kubeconfigPath("admin")
	if err := c.makeClients(); err != nil {
		return err
	}

	// etcd on the control plane's loopback.
	etcd, err := lookPath("etcd")
	if err != nil {
		return err
	}
	etcdDir := filepath.Join(c.Dir, "etcd")
	if _, err := c.Lab.Start(lab.RoleLANClient, filepath.Join(c.Dir, "etcd.log"), etcd,
		"--data-dir", etcdDir,
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--unsafe-no-fsync", // a throwaway cluster: speed over durability
		"--log-level", "warn",
	); err != nil {
		return err
	}

	if _, err := c.Lab.Start(lab.RoleLANClient, filepath.Join(c.Dir, "kube-apiserver.log"), c.bin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", APIServerAddr.String(),
		"--advertise-address", APIServerAddr.String(),
		"--secure-port", strconv.Itoa(APIServerPort),
		"--tls-cert-file", c.pki.ServingCert,
		"--tls-private-key-file", c.pki.ServingKey,
		"--client-ca-file", c.pki.CACert,
		"--cert-dir", filepath.Join(c.Dir, "pki", "apiserver"),
		"--token-auth-file", tokenFile,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--service-cluster-ip-range", ServiceCIDR.String(),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", c.pki.ServiceAccountKey,
		"--service-account-signing-key-file", c.pki.ServiceAccountKey,
		"--kubelet-preferred-address-types", "InternalIP",
		// Webhooks (real MetalLB's, metallb.go) are called at their Service's endpoints, on the
		// pod network CPNS routes: nothing proxies cluster IPs in CPNS, which is on no node.
		"--enable-aggregator-routing=true",
		"--profiling=false",
		"--v=1",
	); err != nil {
		return err
	}
	if err := poll(ctx, readyTimeout, func(ctx context.Context) error {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, strings.TrimSpace(string(body)))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}

	flexDir := filepath.Join(c.Dir, "flexvolume")
	if err := os.MkdirAll(flexDir, 0o755); err != nil {
		return err
	}
	if _, err := c.Lab.Start(lab.RoleLANClient, filepath.Join(c.Dir, "kube-controller-manager.log"), c.bin("kube-controller-manager"),
		"--kubeconfig", c.kubeconfigPath("system:kube-controller-manager"),
		"--authentication-kubeconfig", c.kubeconfigPath("system:kube-controller-manager"),
		"--authorization-kubeconfig", c.kubeconfigPath("system:kube-controller-manager"),
		"--bind-address", "127.0.0.1",
		"--use-service-account-credentials=true",
		"--root-ca-file", c.pki.CACert,
		"--service-account-private-key-file", c.pki.ServiceAccountKey,
		"--service-cluster-ip-range", ServiceCIDR.String(),
		"--cluster-cidr", lab.ClusterCIDRv4.String(),
		"--allocate-node-cidrs=false",
		"--configure-cloud-routes=false",
		"--flex-volume-plugin-dir", flexDir,
		"--leader-elect=false",
		"--profiling=false",
		"--v=1",
	); err != nil {
		return err
	}
	if _, err := c.Lab.Start(lab.RoleLANClient, filepath.Join(c.Dir, "kube-scheduler.log"), c.bin("kube-scheduler"),
		"--kubeconfig", c.kubeconfigPath("system:kube-scheduler"),
		"--authentication-kubeconfig", c.kubeconfigPath("system:kube-scheduler"),
		"--authorization-kubeconfig", c.kubeconfigPath("system:kube-scheduler"),
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--profiling=false",
		"--v=1",
	); err != nil {
		return err
	}
	return nil
}

// readyTimeout bounds how long a component may take to become ready.
const readyTimeout = 2 * time.Minute

func (c *Cluster) bin(name string) string { return filepath.Join(c.Spec.BinDir, name) }

func (c *Cluster) kubeconfigPath(user string) string {
	return filepath.Join(c.Dir, "pki", strings.ReplaceAll(user, ":", "-")+".kubeconfig")
}

// writeKubeconfig writes a token kubeconfig for user, pointing at the API server on the LAN.
func (c *Cluster) writeKubeconfig(user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["vipgate-lab"] = &clientcmdapi.Cluster{Server: APIServerURL(), CertificateAuthorityData: c.pki.CAPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.tokens[user]}
	cfg.Contexts["vipgate-lab"] = &clientcmdapi.Context{Cluster: "vipgate-lab", AuthInfo: user}
	cfg.CurrentContext = "vipgate-lab"
	return clientcmd.WriteToFile(*cfg, c.kubeconfigPath(user))
}

func randomToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
