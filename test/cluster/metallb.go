package testcluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MetalLB modes of Spec.MetalLB and InstallMetalLB.
const (
	// MetalLBL2: the pool "lan" (192.0.2.200-220, on the LAN) with an L2Advertisement; MetalLB's
	// speakers answer ARP for the addresses.
	MetalLBL2 = "l2"
	// MetalLBBGP: the objects of the vipgate cluster (manifests/metallb.yaml: pool "bgp", the
	// LoadBalancerPool, advertised by BGP to the lab router's BIRD; pool "lan" by ARP on request)
	// without what MetalLB's native BGP mode rejects (BFD, graceful restart).
	MetalLBBGP = "bgp"
)

// kube-proxy's modes (Spec.KubeProxyMode).
const (
	KubeProxyNFTables = "nftables"
	KubeProxyIPTables = "iptables"
)

// MetalLBNamespace is where the real MetalLB runs (its manifest's namespace).
const MetalLBNamespace = "metallb-system"

// metalLBManifests are the lab's MetalLB objects for the real MetalLB, by mode.
var metalLBManifests = map[string]string{
	MetalLBL2:  "metallb-real-l2.yaml",
	MetalLBBGP: "metallb-real-bgp.yaml",
}

// checkProxySpec validates and completes the proxy fields of a Spec.
func checkProxySpec(spec *Spec) error {
	switch spec.Proxy {
	case ProxyVipgate, ProxyKubeProxy, ProxyNone:
	default:
		return fmt.Errorf("testcluster: unknown proxy %q (want %s, %s or %s)", spec.Proxy, ProxyVipgate, ProxyKubeProxy, ProxyNone)
	}
	switch spec.KubeProxyMode {
	case "", KubeProxyNFTables, KubeProxyIPTables:
	default:
		return fmt.Errorf("testcluster: unknown kube-proxy mode %q (want %s or %s)", spec.KubeProxyMode, KubeProxyNFTables, KubeProxyIPTables)
	}
	if spec.KubeProxyMode != "" && spec.Proxy != ProxyKubeProxy {
		return fmt.Errorf("testcluster: kube-proxy mode %q needs proxy %s, not %s", spec.KubeProxyMode, ProxyKubeProxy, spec.Proxy)
	}
	if spec.Proxy == ProxyKubeProxy && spec.KubeProxyMode == "" {
		spec.KubeProxyMode = KubeProxyNFTables
	}
	if spec.MetalLB != "" {
		if err := checkMetalLBMode(spec.MetalLB); err != nil {
			return err
		}
		if spec.Proxy != ProxyKubeProxy {
			return fmt.Errorf("testcluster: the real MetalLB runs with proxy %s only (vipgate allocates and announces itself), not %s", ProxyKubeProxy, spec.Proxy)
		}
	}
	return nil
}

func checkMetalLBMode(mode string) error {
	if _, ok := metalLBManifests[mode]; !ok {
		return fmt.Errorf("testcluster: unknown MetalLB mode %q (want %s or %s)", mode, MetalLBL2, MetalLBBGP)
	}
	return nil
}

// InstallMetalLB installs the real MetalLB (v0.16.2, manifests/metallb-native.yaml: its CRDs,
// controller and speakers, native BGP) and the lab's pools for mode (MetalLBL2 or MetalLBBGP). In
// bgp mode the lab router's BIRD is started (if it is not running) and c.BIRD set; it returns when
// the controller and every node's speaker are ready, the webhook accepted the pools and, in bgp
// mode, every node's session at the router is established. Usable at Up (Spec.MetalLB) and after.
func (c *Cluster) InstallMetalLB(ctx context.Context, mode string) error {
	if err := checkMetalLBMode(mode); err != nil {
		return err
	}
	if c.Spec.Proxy != ProxyKubeProxy {
		return fmt.Errorf("testcluster: the real MetalLB runs with proxy %s only, this cluster runs %s", ProxyKubeProxy, c.Spec.Proxy)
	}
	// The nodes imported bin/images/*.tar when they started; nothing pulls from a registry here.
	for _, tar := range []string{"controller.tar", "speaker.tar"} {
		if p := filepath.Join(c.Spec.BinDir, "images", tar); !fileExists(p) {
			return fmt.Errorf("testcluster: MetalLB's image %s is missing (make test-images)", p)
		}
	}
	start := time.Now()
	// Server-side: the CRDs are too large for the last-applied annotation of a client-side apply.
	b, err := manifests.ReadFile("manifests/metallb-native.yaml")
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, string(b), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		return fmt.Errorf("applying metallb-native.yaml: %w", err)
	}
	// The controller generates the webhook's certificate (cert-rotator), writes it to the Secret
	// metallb-webhook-cert and the CA into the webhook configuration and the CRDs' conversion
	// webhooks, then serves; it also creates the speakers' memberlist Secret.
	if err := c.waitDeployment(ctx, MetalLBNamespace, "controller", 3*time.Minute); err != nil {
		return fmt.Errorf("MetalLB's controller: %w", err)
	}
	if mode == MetalLBBGP && c.BIRD == nil {
		if err := c.startBIRD(); err != nil {
			return err
		}
	}
	// The webhook answers only once the API server sees its endpoint: retry the pools until it
	// accepts them. A rejection by the webhook is final.
	pools, err := manifests.ReadFile("manifests/" + metalLBManifests[mode])
	if err != nil {
		return err
	}
	if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		_, err := c.Kubectl(ctx, string(pools), "apply", "-f", "-")
		if err != nil && strings.Contains(err.Error(), "denied the request") {
			return errStop{err}
		}
		return err
	}); err != nil {
		return fmt.Errorf("MetalLB's %s objects: %w", mode, err)
	}
	if err := c.waitDaemonSet(ctx, MetalLBNamespace, "speaker", 3*time.Minute); err != nil {
		return fmt.Errorf("MetalLB's speakers: %w", err)
	}
	if mode == MetalLBBGP {
		if err := c.waitBGPEstablished(ctx, 2*time.Minute); err != nil {
			return fmt.Errorf("MetalLB's BGP sessions: %w", err)
		}
	}
	c.logf("MetalLB %s ready (%.1f s)", mode, time.Since(start).Seconds())
	return nil
}

// RemoveMetalLB removes the real MetalLB's workloads as a user handing its objects to another
// implementation would: the controller, the speakers (their announcements stop: BGP sessions close,
// ARP answers end) and its ValidatingWebhookConfiguration, which would otherwise reject every change
// to a MetalLB object once the controller is gone. The CRDs, the pools, peers and advertisements,
// the namespace and the Services' addresses stay.
func (c *Cluster) RemoveMetalLB(ctx context.Context) error {
	for _, args := range [][]string{
		{"-n", MetalLBNamespace, "delete", "deployment", "controller", "--ignore-not-found", "--wait=true", "--timeout=2m"},
		{"-n", MetalLBNamespace, "delete", "daemonset", "speaker", "--ignore-not-found", "--wait=true", "--timeout=2m"},
		{"delete", "validatingwebhookconfiguration", "metallb-webhook-configuration", "--ignore-not-found"},
	} {
		if _, err := c.Kubectl(ctx, "", args...); err != nil {
			return fmt.Errorf("removing MetalLB: %w", err)
		}
	}
	return poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		pods, err := c.Client.CoreV1().Pods(MetalLBNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=metallb"})
		if err != nil {
			return err
		}
		if n := len(pods.Items); n > 0 {
			return fmt.Errorf("%d MetalLB pods left", n)
		}
		return nil
	})
}

// waitDeployment waits until every replica of a Deployment is updated and ready.
func (c *Cluster) waitDeployment(ctx context.Context, ns, name string, timeout time.Duration) error {
	return poll(ctx, timeout, func(ctx context.Context) error {
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas < want || d.Status.ReadyReplicas < want {
			return fmt.Errorf("deployment %s/%s: %d of %d ready%s", ns, name, d.Status.ReadyReplicas, want, c.podProblems(ctx, ns, d.Spec.Selector))
		}
		return nil
	})
}

// waitDaemonSet waits until a DaemonSet's pod is updated and ready on every node it schedules to.
func (c *Cluster) waitDaemonSet(ctx context.Context, ns, name string, timeout time.Duration) error {
	return poll(ctx, timeout, func(ctx context.Context) error {
		d, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration < d.Generation || !daemonSetReady(d) {
			return fmt.Errorf("daemonset %s/%s: %d of %d ready%s", ns, name, d.Status.NumberReady, d.Status.DesiredNumberScheduled, c.podProblems(ctx, ns, d.Spec.Selector))
		}
		return nil
	})
}

func daemonSetReady(d *appsv1.DaemonSet) bool {
	s := d.Status
	return s.DesiredNumberScheduled > 0 && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberReady == s.DesiredNumberScheduled
}

// podProblems names the pods of a selector that are not ready and why, for timeout errors.
func (c *Cluster) podProblems(ctx context.Context, ns string, sel *metav1.LabelSelector) string {
	if sel == nil {
		return ""
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(sel)})
	if err != nil {
		return ""
	}
	var out []string
	for _, p := range pods.Items {
		if podReady(&p) {
			continue
		}
		why := string(p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				why += " " + cs.State.Waiting.Reason
			}
			if cs.LastTerminationState.Terminated != nil {
				why += fmt.Sprintf(" (last exit %d %s)", cs.LastTerminationState.Terminated.ExitCode, cs.LastTerminationState.Terminated.Reason)
			}
		}
		out = append(out, p.Name+": "+why)
	}
	if len(out) == 0 {
		return ""
	}
	return "; " + strings.Join(out, ", ")
}

// waitBGPEstablished waits until the router's session with every node is established.
func (c *Cluster) waitBGPEstablished(ctx context.Context, timeout time.Duration) error {
	if c.BIRD == nil {
		return errors.New("BIRD is not running")
	}
	return poll(ctx, timeout, func(ctx context.Context) error {
		out, err := c.Birdc("show", "protocols")
		if err != nil {
			return fmt.Errorf("birdc: %w: %s", err, out)
		}
		for _, n := range c.Nodes {
			ok := false
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) > 0 && f[0] == n.Name {
					ok = strings.Contains(line, "Established")
				}
			}
			if !ok {
				return fmt.Errorf("router's session with %s not established:\n%s", n.Name, out)
			}
		}
		return nil
	})
}
