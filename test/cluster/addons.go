package testcluster

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// manifests are the cluster's add-ons: CoreDNS, kube-proxy (for comparison runs) and the MetalLB
// objects of the lab.
//
//go:embed manifests/*.yaml
var manifests embed.FS

// BGP autonomous systems of the lab.
const (
	RouterASN = 64512
	NodeASN   = 64513
)

// VipgateNamespace is where the chart is installed.
const VipgateNamespace = "vipgate-system"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func (c *Cluster) installAddons(ctx context.Context) error {
	if c.Spec.CNI == CNIFlannel {
		if err := c.installFlannel(ctx); err != nil {
			return err
		}
	}
	if err := c.applyManifest(ctx, "coredns.yaml", nil); err != nil {
		return err
	}
	switch c.Spec.Proxy {
	case ProxyKubeProxy:
		// The manifest names v1.36.3's image; a cluster of another version runs its own kube-proxy.
		repl := map[string]string{"APISERVER_URL": APIServerURL(), "KUBE_PROXY_MODE": c.Spec.KubeProxyMode}
		if sv, err := c.Client.Discovery().ServerVersion(); err == nil && sv.GitVersion != "" {
			repl["registry.k8s.io/kube-proxy:v1.36.3"] = "registry.k8s.io/kube-proxy:" + sv.GitVersion
		}
		if err := c.applyManifest(ctx, "kube-proxy.yaml", repl); err != nil {
			return err
		}
		if c.Spec.MetalLB != "" {
			if err := c.InstallMetalLB(ctx, c.Spec.MetalLB); err != nil {
				return err
			}
		}
	case ProxyVipgate:
		if err := c.installMetalLBCRDs(ctx); err != nil {
			return err
		}
		if err := c.applyManifest(ctx, "metallb.yaml", nil); err != nil {
			return err
		}
		if err := c.startBIRD(); err != nil {
			return err
		}
		if err := c.InstallVipgate(ctx, ""); err != nil {
			return err
		}
	}
	return nil
}

// applyManifest applies one of the embedded manifests with kubectl, after replacing the given
// placeholders.
func (c *Cluster) applyManifest(ctx context.Context, name string, repl map[string]string) error {
	b, err := manifests.ReadFile("manifests/" + name)
	if err != nil {
		return err
	}
	text := string(b)
	for k, v := range repl {
		text = strings.ReplaceAll(text, k, v)
	}
	if _, err := c.Kubectl(ctx, text, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("applying %s: %w", name, err)
	}
	return nil
}

// installMetalLBCRDs creates MetalLB's CRDs (the module version go.mod requires) and waits until
// they are served.
func (c *Cluster) installMetalLBCRDs(ctx context.Context) error {
	crds, err := apiserver.MetalLBCRDs(nil)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.GetName(), err)
		}
	}
	return poll(ctx, readyTimeout, func(ctx context.Context) error {
		for _, crd := range crds {
			got, err := c.Dynamic.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !established(got) {
				return fmt.Errorf("CRD %s not established", crd.GetName())
			}
		}
		for _, gv := range []string{"metallb.io/v1beta1", "metallb.io/v1beta2"} {
			if _, err := c.Client.Discovery().ServerResourcesForGroupVersion(gv); err != nil {
				return err
			}
		}
		return nil
	})
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, cond := range conds {
		m, _ := cond.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// ChartValues are the values the cluster installs vipgate's chart with: the API server's real
// address (nothing programs the kubernetes Service before vipgate runs), the lab's CIDRs, and
// externalIPs allowed anywhere: vipgate refuses them by default (KEP-5707), but the upstream
// [sig-network] Services specs (conformance) expect kube-proxy's behaviour ("should be possible to
// connect to a service via ExternalIP..." uses 203.0.113.250), so the cluster opts in to every
// address and the suite keeps seeing kube-proxy's behaviour.
func ChartValues() string {
	return fmt.Sprintf(`apiServer:
  host: %s
  port: %d
node:
  config:
    clusterCIDRs: [%s]
    serviceCIDRs: [%s]
    externalIPs:
      allowedCIDRs: ["0.0.0.0/0", "::/0"]
    logFormat: text
controller:
  replicas: 1
`, APIServerAddr, APIServerPort, lab.ClusterCIDRv4, ServiceCIDR)
}

// RenderChart renders vipgate's Helm chart (deploy/helm/vipgate) with Helm's engine, the cluster's
// values, then the extra values files given.
func (c *Cluster) RenderChart(extraValues ...string) (string, error) {
	root, err := lab.ModuleRoot()
	if err != nil {
		return "", err
	}
	values := filepath.Join(c.Dir, "vipgate-values.yaml")
	if err := os.WriteFile(values, []byte(ChartValues()), 0o644); err != nil {
		return "", err
	}
	args := []string{"-chart", filepath.Join(root, "deploy", "helm", "vipgate"), "-namespace", VipgateNamespace, "-f", values}
	if c.Spec.Values != "" {
		args = append(args, "-f", c.Spec.Values)
	}
	for _, v := range extraValues {
		args = append(args, "-f", v)
	}
	cmd := exec.Command(c.bin("helmrender"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("rendering the chart: %w: %s", err, stderr.String())
	}
	return string(out), nil
}

// InstallVipgate installs (or upgrades) vipgate from its chart; extraValues is a values file or "".
func (c *Cluster) InstallVipgate(ctx context.Context, extraValues string) error {
	var extra []string
	if extraValues != "" {
		extra = append(extra, extraValues)
	}
	rendered, err := c.RenderChart(extra...)
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+VipgateNamespace+"\n", "apply", "-f", "-"); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, rendered, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("installing vipgate's chart: %w", err)
	}
	return nil
}

// startBIRD runs BIRD on the lab's router: a BGP session with every node (passive: vipgate
// connects), routes learnt into the router's kernel table with ECMP over the nodes.
func (c *Cluster) startBIRD() error {
	dir := filepath.Join(c.Dir, "bird")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "router id %s;\nlog stderr all;\nprotocol device {}\n", lab.RouterLANv4)
	sb.WriteString("protocol kernel {\n  ipv4 { import none; export all; };\n  merge paths on;\n}\n")
	sb.WriteString("protocol bfd {\n  interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; };\n}\n")
	fmt.Fprintf(&sb, "template bgp nodes {\n  local %s as %d;\n  direct;\n  passive on;\n  hold time 9;\n  bfd on;\n  error wait time 1, 10;\n  ipv4 { import all; export none; };\n}\n", lab.RouterLANv4, RouterASN)
	for _, n := range c.kubeLabNodes() {
		fmt.Fprintf(&sb, "protocol bgp %s from nodes {\n  neighbor %s as %d;\n}\n", n.Name, n.IPv4, NodeASN)
	}
	// The gateways (gateways.go) connect as AS GatewayASN.
	for _, n := range c.gatewayLabNodes() {
		fmt.Fprintf(&sb, "protocol bgp %s from nodes {\n  neighbor %s as %d;\n}\n", n.Name, n.IPv4, GatewayASN)
	}
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	bird, err := lookPath("bird")
	if err != nil {
		return err
	}
	c.BIRD, err = c.Lab.Start(lab.RoleRouter, filepath.Join(c.Dir, "bird.log"), bird, "-f", "-c", conf,
		"-s", filepath.Join(dir, "bird.ctl"), "-P", filepath.Join(dir, "bird.pid"))
	return err
}

// Birdc runs a BIRD client command on the router.
func (c *Cluster) Birdc(args ...string) (string, error) {
	full := append([]string{"netns", "exec", c.Lab.NS(lab.RoleRouter), "birdc", "-s", filepath.Join(c.Dir, "bird", "bird.ctl")}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	return string(out), err
}
