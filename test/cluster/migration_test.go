package testcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// The migration test: docs/migration.md followed step by step, with the documented commands, on a
// live cluster while clients hold long-lived connections and open new ones through a LoadBalancer
// IP (from the lab's client, outside the cluster), a NodePort (from the client, via node1) and a
// ClusterIP (from a pod). Per step it reports the held connections broken, the longest run of
// failed new connections (probes every 100 ms; from the first failed probe to the next one that
// answered), whether a LoadBalancer IP changed, and at the end what is left of kube-proxy in each
// node's kernel and of MetalLB in the API. It asserts the goals only where they are not
// timings: held LoadBalancer connections broken ≤ 1 %, LoadBalancer IPs unchanged, nothing of
// kube-proxy's left in the kernel (except in step 3b, BGP node by node, where the guide says why
// they break: reported, not failed). The figures go to docs/migration.md.
//
// make test runs the shortest path (kube-proxy in nftables mode, no MetalLB); make
// test-cluster-migration runs every path (VIPGATE_MIGRATION_PATHS=all, or a comma-separated list).
// The path kube-proxy-iptables-metallb-l2-rollback migrates and then goes the way back
// (docs/migration.md, "Roll back to kube-proxy and MetalLB"), measured the same way.

// EnvMigrationPaths selects TestMigration's paths: "" the CI one, "all", or names of migrationPaths.
const EnvMigrationPaths = "VIPGATE_MIGRATION_PATHS"

// migrationPath is one way into vipgate: the cluster it starts from.
type migrationPath struct {
	name string
	// spec is the cluster before: kube-proxy's mode, and MetalLB's (Spec.MetalLB "" none:
	// docs/migration.md, "Only kube-proxy, no MetalLB").
	spec Spec
	ci   bool
	// rollback: after the migration, the way back to kube-proxy and MetalLB (docs/migration.md,
	// "Roll back to kube-proxy and MetalLB"); L2 paths only.
	rollback bool
}

var migrationPaths = []migrationPath{
	{name: "kube-proxy-nftables", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy}, ci: true},
	{name: "kube-proxy-iptables-metallb-l2", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy, KubeProxyMode: KubeProxyIPTables, MetalLB: MetalLBL2}},
	{name: "kube-proxy-nftables-metallb-bgp", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy, MetalLB: MetalLBBGP}},
	{name: "kube-proxy-nftables-metallb-l2", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy, MetalLB: MetalLBL2}},
	{name: "kube-proxy-iptables-metallb-bgp", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy, KubeProxyMode: KubeProxyIPTables, MetalLB: MetalLBBGP}},
	{name: "kube-proxy-iptables-metallb-l2-rollback", spec: Spec{Nodes: 2, Proxy: ProxyKubeProxy, KubeProxyMode: KubeProxyIPTables, MetalLB: MetalLBL2}, rollback: true},
}

// The agent label of docs/migration.md, and its step 3 patch of kube-proxy's and MetalLB's speaker's
// DaemonSets.
const (
	migrationLabel = "vipgate.io/node-agent"
	migrationPatch = `{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null},
    "template":{"spec":{"affinity":{"nodeAffinity":
    {"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":
    [{"key":"vipgate.io/node-agent","operator":"DoesNotExist"}]}]}}}}}}}`
	// migrationPatchRolling is the patch the guide had first: without OnDelete, the changed
	// template restarts kube-proxy and MetalLB's speaker on every node (VIPGATE_MIGRATION_PATCH=rolling).
	migrationPatchRolling = `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":
    {"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":
    [{"key":"vipgate.io/node-agent","operator":"DoesNotExist"}]}]}}}}}}}`
)

// Held connections per path of the Service, and the probe interval for new ones.
const (
	migrationHeldLB    = 100
	migrationHeldOther = 50
	migrationProbeRate = 100 * time.Millisecond
	// migrationSettle is how long a step is watched after its commands returned and the cluster
	// reached the state the step waits for.
	migrationSettle = 5 * time.Second
)

func TestMigration(t *testing.T) {
	sel := os.Getenv(EnvMigrationPaths)
	ran := 0
	for _, p := range migrationPaths {
		if sel == "" && !p.ci || sel != "" && sel != "all" && !slices.Contains(strings.Split(sel, ","), p.name) {
			continue
		}
		ran++
		t.Run(p.name, func(t *testing.T) { testMigration(t, p) })
	}
	if ran == 0 {
		t.Fatalf("%s=%q names no path (have %v)", EnvMigrationPaths, sel, pathNames())
	}
}

func pathNames() []string {
	var names []string
	for _, p := range migrationPaths {
		names = append(names, p.name)
	}
	return names
}

// migration is one run of the guide on one cluster.
type migration struct {
	t   *testing.T
	ctx context.Context
	c   *Cluster
	ns  string
	// The three ways to the Service; lb is "" while the Service has no LoadBalancer IP.
	lb, nodePort, clusterIP string
	// clientNode runs the client pod; clientNetns is its network namespace (/proc/PID/ns/net).
	clientNode, clientNetns string
	probers                 map[string]*prober
	rows                    []migrationRow
	// lbIPs are the LoadBalancer IPs of every Service in the cluster, as first seen.
	lbIPs map[string]string
	// arp follows the router's neighbour entry of an L2 LoadBalancer IP (which node it sends to).
	arp *arpWatch
}

// migrationRow is one step's figures.
type migrationRow struct {
	step     string
	took     time.Duration
	held     map[string]lab.HoldResult // per path: LoadBalancer, NodePort, ClusterIP
	gap      map[string]probeWindow
	lbChange string // "" none, else what changed
}

func testMigration(t *testing.T, p migrationPath) {
	c := migrationCluster(t, p.spec)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	m := &migration{t: t, ctx: ctx, c: c, ns: "migration", probers: map[string]*prober{}}
	m.setup()
	defer m.stopProbers()
	t.Cleanup(func() {
		if t.Failed() {
			m.diagnose("on failure")
		}
	})
	t.Logf("load before the migration: %s", loadAvg())

	// The connections held through the whole migration, opened before step 1.
	whole := m.startHolds("whole migration")

	m.step("before (nothing changed, 10 s)", func() { time.Sleep(10 * time.Second) })
	mlb := p.spec.MetalLB
	m.step("1 MetalLB's CRDs at v0.16.2", m.applyCRDs)
	m.step("2 "+map[bool]string{true: "MetalLB's controller out, ", false: ""}[mlb != ""]+"vipgate installed, node agents held back", func() {
		if mlb != "" {
			kubectl(t, ctx, c, "-n", "metallb-system", "scale", "deployment", "controller", "--replicas=0")
			kubectl(t, ctx, c, "delete", "validatingwebhookconfiguration", "metallb-webhook-configuration")
		}
		m.installVipgate(`node: {nodeSelector: {"vipgate.io/node-agent": "true"}}`)
		kubectl(t, ctx, c, "-n", VipgateNamespace, "rollout", "status", "deployment/vipgate-controller", "--timeout=3m")
		if pods := m.pods(VipgateNamespace, "app.kubernetes.io/component=node"); len(pods) != 0 {
			t.Errorf("node agents started before any node was labelled: %v", pods)
		}
	})
	dss := []string{"kube-system/kube-proxy"}
	if mlb != "" {
		dss = append(dss, "metallb-system/speaker")
	}
	m.step("3 "+strings.Join(dss, " and ")+" kept off labelled nodes (the patch)", func() {
		for _, ds := range dss {
			ns, name, _ := strings.Cut(ds, "/")
			patch := migrationPatch
			if os.Getenv("VIPGATE_MIGRATION_PATCH") == "rolling" {
				patch = migrationPatchRolling
			}
			kubectl(t, ctx, c, "-n", ns, "patch", "ds", name, "--type=merge", "-p", patch)
		}
		// The patch changes the pod template: a RollingUpdate DaemonSet replaces every pod.
		for _, ds := range dss {
			ns, name, _ := strings.Cut(ds, "/")
			if d, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{}); err == nil && d.Spec.UpdateStrategy.Type != "OnDelete" {
				kubectl(t, ctx, c, "-n", ns, "rollout", "status", "ds/"+name, "--timeout=3m")
			}
		}
	})
	if mlb == MetalLBBGP {
		// 3b: node by node, each once its sessions are up.
		for i, n := range c.Nodes {
			m.stepKnown("3b "+n.Name+": kube-proxy and MetalLB's speaker out, vipgate in",
				"MetalLB's native speaker closes its session without graceful restart, the router withdraws the node's routes, "+
					"and the flows that entered through it move to a node without their conntrack entries", func() {
					kubectl(t, ctx, c, "label", "node", n.Name, migrationLabel+"=true")
					m.waitAgents(c.Nodes[:i+1])
					m.waitBGP(n.Name)
				})
		}
	} else {
		m.step("3"+map[bool]string{true: "a", false: ""}[mlb != ""]+" kube-proxy"+map[bool]string{true: " and MetalLB's speaker", false: ""}[mlb != ""]+" out, vipgate in (all nodes)", func() {
			kubectl(t, ctx, c, "label", "nodes", "--all", migrationLabel+"=true")
			m.waitAgents(c.Nodes)
		})
	}
	m.step("3 kube-proxy's rules removed", func() { m.removeKubeProxyRules(p.spec.KubeProxyMode) })
	m.step("4 "+map[bool]string{true: "MetalLB and ", false: ""}[mlb != ""]+"kube-proxy's DaemonSet deleted"+map[bool]string{true: " (selector kept)", false: ", node agents on every node"}[mlb != ""], func() {
		if mlb != "" {
			kubectl(t, ctx, c, "-n", "metallb-system", "delete", "deployment", "controller")
			kubectl(t, ctx, c, "-n", "metallb-system", "delete", "daemonset", "speaker")
		}
		kubectl(t, ctx, c, "-n", "kube-system", "delete", "daemonset", "kube-proxy")
		if mlb != "" {
			// With LoadBalancer IPs in use the guide keeps the selector: removing it rolls every node
			// agent, and each restart moves the node's IPs (L2: to another node and back; BGP
			// without graceful restart: its routes withdrawn and back), resetting their established
			// connections (measured: 100 of 100 in both modes). New nodes are labelled as they join.
			return
		}
		// helm upgrade --reuse-values --set-json 'node.nodeSelector=null': the values of step 2 with
		// the nodeSelector removed (helmrender coalesces values files as Helm does).
		m.installVipgate(`node: {nodeSelector: {"vipgate.io/node-agent": "true"}}`, `node: {nodeSelector: null}`)
		kubectl(t, ctx, c, "-n", VipgateNamespace, "rollout", "status", "ds/vipgate-node", "--timeout=3m")
		ds, err := c.Client.AppsV1().DaemonSets(VipgateNamespace).Get(ctx, "vipgate-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sel := ds.Spec.Template.Spec.NodeSelector; sel[migrationLabel] != "" {
			t.Errorf("after step 4 vipgate-node still selects nodes by %v: a new node would get no proxy", sel)
		}
	})
	if mlb == "" {
		m.step("5 a pool and an L2Advertisement", func() {
			apply(t, ctx, c, `apiVersion: v1
kind: Namespace
metadata: {name: metallb-system}
`, `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec:
  addresses: [192.0.2.240-192.0.2.250]
`, `apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
spec:
  ipAddressPools: [lan]
`)
			svc := waitService(t, ctx, c, m.ns, "web")
			m.setLB(svc.Status.LoadBalancer.Ingress[0].IP)
			m.waitAnswers(m.lb, lab.RoleClient)
		})
	}
	m.step("after (vipgate alone, 10 s)", func() { time.Sleep(10 * time.Second) })

	res := m.stopHolds(whole)
	m.rows = append(m.rows, migrationRow{step: "whole migration (held from before step 1)", held: res, gap: m.windows(time.Time{}, time.Now().Add(-1100*time.Millisecond))})
	m.checkLeftovers(p.spec.KubeProxyMode)
	m.report(p)
	if p.rollback {
		m.rollback(p)
	}
}

// rollback is docs/migration.md's "Roll back to kube-proxy and MetalLB" (L2), from where the
// migration left the cluster: vipgate on every (labelled) node, MetalLB's and kube-proxy's
// DaemonSets deleted. Measured as the migration is, in its own table.
func (m *migration) rollback(p migrationPath) {
	t, ctx, c := m.t, m.ctx, m.c
	if p.spec.MetalLB != MetalLBL2 {
		t.Fatalf("the way back is written for MetalLB's L2 mode, path %s has %q", p.name, p.spec.MetalLB)
	}
	m.rows = nil
	t.Logf("=== the way back (load %s)", loadAvg())
	whole := m.startHolds("whole way back")
	m.step("R before (vipgate, 10 s)", func() { time.Sleep(10 * time.Second) })
	m.step("R1 vipgate's controller out, MetalLB's controller in; kube-proxy's DaemonSet and MetalLB's speaker back, kept off labelled nodes", func() {
		kubectl(t, ctx, c, "-n", VipgateNamespace, "scale", "deployment", "vipgate-controller", "--replicas=0")
		kubectl(t, ctx, c, "-n", VipgateNamespace, "rollout", "status", "deployment/vipgate-controller", "--timeout=2m")
		kp := m.manifest("kube-proxy.yaml", map[string]string{"APISERVER_URL": APIServerURL(), "KUBE_PROXY_MODE": p.spec.KubeProxyMode})
		if sv, err := c.Client.Discovery().ServerVersion(); err == nil && sv.GitVersion != "" {
			kp = strings.ReplaceAll(kp, "registry.k8s.io/kube-proxy:v1.36.3", "registry.k8s.io/kube-proxy:"+sv.GitVersion)
		}
		if _, err := c.Kubectl(ctx, withMigrationAffinity(t, kp), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, withMigrationAffinity(t, m.manifest("metallb-native.yaml", nil)), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if err := c.waitDeployment(ctx, MetalLBNamespace, "controller", 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, sel := range []string{"k8s-app=kube-proxy", "app=metallb,component=speaker"} {
			if pods := m.pods("", sel); len(pods) != 0 {
				t.Errorf("%s pods on labelled nodes: %v", sel, pods)
			}
		}
	})
	// The node that answers for the L2 IP now (vipgate's owner: the same one MetalLB's speakers
	// choose among the same nodes).
	m.arp.mu.Lock()
	owner := m.arp.last
	m.arp.mu.Unlock()
	var others []string
	for _, n := range c.Nodes {
		if n.Name != owner {
			others = append(others, n.Name)
		}
	}
	// waitProxies waits until no vipgate-node pod is left and kube-proxy and MetalLB's speaker are
	// ready on want nodes.
	waitProxies := func(want int) {
		if err := poll(ctx, 4*time.Minute, func(ctx context.Context) error {
			if pods := m.pods(VipgateNamespace, "app.kubernetes.io/component=node"); len(pods) != 0 {
				return fmt.Errorf("vipgate-node pods left: %v", pods)
			}
			for _, ds := range []string{"kube-system/kube-proxy", MetalLBNamespace + "/speaker"} {
				ns, name, _ := strings.Cut(ds, "/")
				d, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if int(d.Status.NumberReady) != want {
					return fmt.Errorf("%s: %d of %d ready%s", ds, d.Status.NumberReady, want, c.podProblems(ctx, ns, d.Spec.Selector))
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// MetalLB's speaker has no start-up grace: the first one up owns every IP until it hears the
	// others (measured with the label removed from all nodes at once: the IP moved to the other
	// node for 3.5 s, 100 of 100 held LoadBalancer connections reset). So its speakers start on the
	// IP's owner first; vipgate's agents leave every node at once, as they came (a value other than
	// "true" takes them off and keeps kube-proxy and the speaker off too).
	m.step("R2 vipgate's agents out (all nodes: label value \"back\")", func() {
		kubectl(t, ctx, c, "label", "nodes", "--all", "--overwrite", migrationLabel+"=back")
		if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
			if pods := m.pods(VipgateNamespace, "app.kubernetes.io/component=node"); len(pods) != 0 {
				return fmt.Errorf("vipgate-node pods left: %v", pods)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	m.step("R2 kube-proxy and MetalLB's speaker in on the IP's owner ("+owner+")", func() {
		kubectl(t, ctx, c, "label", "node", owner, migrationLabel+"-")
		waitProxies(1)
	})
	m.step("R2 kube-proxy and MetalLB's speaker in on the other nodes", func() {
		kubectl(t, ctx, c, "label", "nodes", "--all", migrationLabel+"-")
		start := time.Now()
		waitProxies(len(c.Nodes))
		t.Logf("kube-proxy and MetalLB's speaker ready on every node, no vipgate-node, %.1f s after the label went (others: %v)", time.Since(start).Seconds(), others)
		// kube-proxy must have programmed its rules before vipgate's tables go (R3).
		for _, n := range c.Nodes {
			if err := poll(ctx, time.Minute, func(ctx context.Context) error {
				out, _ := c.Lab.Exec(n.Name, "nft", "list", "ruleset")
				if !strings.Contains(out, "KUBE-SVC-") {
					return fmt.Errorf("%s: no KUBE-SVC- chain in nft's view yet", n.Name)
				}
				return nil
			}); err != nil {
				t.Logf("%v (kube-proxy may use legacy xtables); waiting 10 s instead", err)
				time.Sleep(10 * time.Second)
			}
		}
		for _, n := range c.Nodes {
			tables, _ := c.Lab.Exec(n.Name, "nft", "list", "tables")
			t.Logf("%s after vipgate's agent left: nft tables [%s]", n.Name, strings.Join(strings.Fields(strings.ReplaceAll(tables, "table ", "")), " "))
		}
	})
	m.step("R3 vipgate's nftables tables removed", func() {
		for _, n := range c.Nodes {
			out, _ := c.Lab.Exec(n.Name, "sh", "-c", "nft delete table ip vipgate; nft delete table ip6 vipgate")
			t.Logf("%s: nft delete table ip/ip6 vipgate: %s", n.Name, strings.TrimSpace(out))
		}
	})
	m.step("R4 vipgate uninstalled; the DaemonSets' affinity removed", func() {
		rendered, err := c.RenderChart()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, rendered, "delete", "--ignore-not-found", "--wait=true", "--timeout=2m", "-f", "-"); err != nil {
			t.Logf("deleting vipgate's chart objects: %v", err)
		}
		for _, ds := range []string{"kube-system/kube-proxy", MetalLBNamespace + "/speaker"} {
			ns, name, _ := strings.Cut(ds, "/")
			kubectl(t, ctx, c, "-n", ns, "patch", "ds", name, "--type=merge", "-p", `{"spec":{"template":{"spec":{"affinity":null}}}}`)
		}
	})
	m.step("R after (kube-proxy and MetalLB, 10 s)", func() { time.Sleep(10 * time.Second) })
	res := m.stopHolds(whole)
	m.rows = append(m.rows, migrationRow{step: "whole way back (held from before R1)", held: res})
	for _, n := range c.Nodes {
		tables, _ := c.Lab.Exec(n.Name, "nft", "list", "tables")
		t.Logf("%s after the way back: nft tables [%s]", n.Name, strings.Join(strings.Fields(strings.ReplaceAll(tables, "table ", "")), " "))
		if strings.Contains(tables, "vipgate") {
			t.Errorf("%s: vipgate's tables left: %s", n.Name, tables)
		}
	}
	left, _ := c.Kubectl(ctx, "", "get", "all", "-n", VipgateNamespace, "-o", "name")
	t.Logf("vipgate's namespace after the way back: %s", strings.Join(strings.Fields(left), " "))
	out, _ := c.Kubectl(ctx, "", "get", "pods", "-A", "-o", "wide")
	t.Logf("pods after the way back:\n%s", out)
	m.report(migrationPath{name: p.name + " (the way back)"})
}

// manifest is one of the cluster's add-on manifests with repl's replacements.
func (m *migration) manifest(name string, repl map[string]string) string {
	b, err := manifests.ReadFile("manifests/" + name)
	if err != nil {
		m.t.Fatal(err)
	}
	text := string(b)
	for k, v := range repl {
		text = strings.ReplaceAll(text, k, v)
	}
	return text
}

// withMigrationAffinity gives every DaemonSet of a manifest step 3's patch (OnDelete, and kept off
// nodes labelled vipgate.io/node-agent) before it is created: applied and patched after, its pods
// would start on the labelled nodes first.
func withMigrationAffinity(t *testing.T, manifest string) string {
	var patch map[string]any
	if err := json.Unmarshal([]byte(migrationPatch), &patch); err != nil {
		t.Fatal(err)
	}
	pspec := patch["spec"].(map[string]any)
	affinity := pspec["template"].(map[string]any)["spec"].(map[string]any)["affinity"]
	var docs []string
	for _, doc := range strings.Split(manifest, "\n---") {
		if !strings.Contains(doc, "kind: DaemonSet") {
			docs = append(docs, doc)
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		spec := obj["spec"].(map[string]any)
		spec["updateStrategy"] = map[string]any{"type": "OnDelete"}
		spec["template"].(map[string]any)["spec"].(map[string]any)["affinity"] = affinity
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, "\n"+string(b)+"\n")
	}
	return strings.Join(docs, "\n---")
}

// setup deploys the lab server behind a LoadBalancer Service (no IP yet without MetalLB) and a
// client pod, and starts the probes.
func (m *migration) setup() {
	t, ctx, c := m.t, m.ctx, m.c
	kubectl(t, ctx, c, "create", "namespace", m.ns)
	apply(t, ctx, c, labServerDeployment(m.ns, "web", 3), lbService(m.ns, "web", "web", "", "Cluster"),
		labServerDeployment(m.ns, "client", 1))
	kubectl(t, ctx, c, "-n", m.ns, "rollout", "status", "deployment/web", "--timeout=3m")
	kubectl(t, ctx, c, "-n", m.ns, "rollout", "status", "deployment/client", "--timeout=3m")
	svc, err := c.Client.CoreV1().Services(m.ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.nodePort = net.JoinHostPort(c.Nodes[0].Lab.IPv4.String(), fmt.Sprint(svc.Spec.Ports[0].NodePort))
	m.clusterIP = net.JoinHostPort(svc.Spec.ClusterIP, "8080")
	m.clientNode, m.clientNetns = m.podNetns("client")
	m.lbIPs = m.allLBIPs()
	m.waitAnswers(m.nodePort, lab.RoleClient)
	m.probers["NodePort"] = startProber(namedNetns(c.Lab.NS(lab.RoleClient)), m.nodePort, migrationProbeRate)
	m.probers["ClusterIP"] = startProber(m.clientNetns, m.clusterIP, migrationProbeRate)
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		m.setLB(svc.Status.LoadBalancer.Ingress[0].IP)
		m.waitAnswers(m.lb, lab.RoleClient)
	}
	t.Logf("Service web: LoadBalancer %q, NodePort %s (node1), ClusterIP %s from pod on %s", m.lb, m.nodePort, m.clusterIP, m.clientNode)
}

func (m *migration) setLB(ip string) {
	m.lb = net.JoinHostPort(ip, "8080")
	if a, err := netip.ParseAddr(ip); err == nil && lab.LANv4.Contains(a) && m.arp == nil {
		m.arp = startARPWatch(m.c, ip, nodeMACs(m.t, m.c))
		m.t.Cleanup(m.arp.close)
	}
	if m.probers["LoadBalancer"] == nil {
		m.probers["LoadBalancer"] = startProber(namedNetns(m.c.Lab.NS(lab.RoleClient)), m.lb, migrationProbeRate)
	}
	for k, v := range m.allLBIPs() {
		if _, ok := m.lbIPs[k]; !ok {
			m.lbIPs[k] = v
		}
	}
}

// waitAnswers waits until addr answers a probe from role.
func (m *migration) waitAnswers(addr, role string) {
	if err := poll(m.ctx, 2*time.Minute, func(ctx context.Context) error {
		r, err := m.c.Lab.Probe(role, "tcp", addr)
		if err != nil || !r.OK() {
			return fmt.Errorf("probe %s: %v %v", addr, r, err)
		}
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
}

// podNetns finds the node and the network namespace of app's (one) pod: its container's process
// from the node's containerd.
func (m *migration) podNetns(app string) (node, path string) {
	t := m.t
	pods, err := m.c.Client.CoreV1().Pods(m.ns).List(m.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("pod of %s: %v %v", app, pods, err)
	}
	p := pods.Items[0]
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	for _, n := range m.c.Nodes {
		if n.Name != p.Spec.NodeName {
			continue
		}
		out, err := exec.Command("ip", "netns", "exec", n.Lab.NS, "ctr", "--address",
			filepath.Join(n.Dir, "containerd.sock"), "-n", "k8s.io", "tasks", "ls").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: ctr tasks ls: %v: %s", n.Name, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == id {
				return n.Name, "/proc/" + f[1] + "/ns/net"
			}
		}
		t.Fatalf("%s: no task %s in %s", n.Name, id, out)
	}
	t.Fatalf("pod %s on unknown node %s", p.Name, p.Spec.NodeName)
	return "", ""
}

// installVipgate installs or upgrades vipgate's chart with the cluster's values and these extra
// values files (their text), coalesced in order as Helm does.
func (m *migration) installVipgate(values ...string) {
	var files []string
	for i, v := range values {
		f := filepath.Join(m.c.Dir, fmt.Sprintf("migration-values-%d-%d.yaml", len(m.rows), i))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			m.t.Fatal(err)
		}
		files = append(files, f)
	}
	rendered, err := m.c.RenderChart(files...)
	if err != nil {
		m.t.Fatal(err)
	}
	// Helm's lookup keeps an existing membership key Secret; helmrender has no cluster to look in
	// and renders a new key: leave the Secret out once it exists, as helm upgrade would keep it.
	if _, err := m.c.Client.CoreV1().Secrets(VipgateNamespace).Get(m.ctx, "vipgate-memberlist", metav1.GetOptions{}); err == nil {
		var keep []string
		for _, doc := range strings.Split(rendered, "\n---") {
			if strings.Contains(doc, "kind: Secret") && strings.Contains(doc, "name: vipgate-memberlist") {
				continue
			}
			keep = append(keep, doc)
		}
		rendered = strings.Join(keep, "\n---")
	}
	if _, err := m.c.Kubectl(m.ctx, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+VipgateNamespace+"\n", "apply", "-f", "-"); err != nil {
		m.t.Fatal(err)
	}
	if _, err := m.c.Kubectl(m.ctx, rendered, "apply", "-f", "-"); err != nil {
		m.t.Fatal(err)
	}
}

// pods lists the names of the pods matching selector in ns, with their node.
func (m *migration) pods(ns, selector string) []string {
	pods, err := m.c.Client.CoreV1().Pods(ns).List(m.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		m.t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name+"@"+p.Spec.NodeName)
	}
	return names
}

// waitAgents waits until every one of nodes runs a Ready vipgate-node pod and no kube-proxy pod. A
// node agent that lost the race for kube-proxy's health port stays not Ready (docs/migration.md,
// step 3): it is logged, and deleted as the guide says after 30 s.
func (m *migration) waitAgents(nodes []*Node) {
	t, ctx, c := m.t, m.ctx, m.c
	deleted := map[string]bool{}
	start := time.Now()
	want := map[string]bool{}
	for _, n := range nodes {
		want[n.Name] = true
	}
	if err := poll(ctx, 4*time.Minute, func(ctx context.Context) error {
		for _, kp := range m.pods("kube-system", "k8s-app=kube-proxy") {
			if _, node, _ := strings.Cut(kp, "@"); want[node] {
				return fmt.Errorf("kube-proxy pod left: %v", kp)
			}
		}
		pods, err := c.Client.CoreV1().Pods(VipgateNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err != nil {
			return err
		}
		ready := 0
		for _, p := range pods.Items {
			if !want[p.Spec.NodeName] {
				continue
			}
			if podReady(&p) {
				ready++
				continue
			}
			if time.Since(p.CreationTimestamp.Time) > 30*time.Second && !deleted[p.Name] {
				logs, _ := c.Kubectl(ctx, "", "-n", VipgateNamespace, "logs", p.Name)
				if strings.Contains(logs, "healthz server not started") {
					t.Logf("%s on %s: not Ready 30 s after start, `healthz server not started`: deleting it as the guide says", p.Name, p.Spec.NodeName)
					deleted[p.Name] = true
					_, _ = c.Kubectl(ctx, "", "-n", VipgateNamespace, "delete", "pod", p.Name, "--wait=false")
				}
			}
		}
		if ready != len(nodes) {
			return fmt.Errorf("%d of %d vipgate-node pods ready", ready, len(nodes))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("every labelled node runs a Ready vipgate-node and no kube-proxy %.1f s after the label (%d pods deleted for the health port)",
		time.Since(start).Seconds(), len(deleted))
}

// waitBGP waits until the router's session with node is established (vipgate's now).
func (m *migration) waitBGP(node string) {
	start := time.Now()
	if err := poll(m.ctx, 2*time.Minute, func(ctx context.Context) error {
		out, err := m.c.Birdc("show", "protocols", node)
		if err != nil || !strings.Contains(out, "Established") {
			return fmt.Errorf("router's session with %s: %v %s", node, err, out)
		}
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
	m.t.Logf("router's session with %s established %.1f s later", node, time.Since(start).Seconds())
}

// applyCRDs is step 1: MetalLB v0.16.2's config/crd/bases applied server-side over whatever is
// installed. The guide fetches them from GitHub; the lab has no internet, and go.mod's MetalLB is
// v0.16.2, whose files apiserver.MetalLBCRDs reads.
func (m *migration) applyCRDs() {
	crds, err := apiserver.MetalLBCRDs(nil)
	if err != nil {
		m.t.Fatal(err)
	}
	// The installed BGPPeer CRD converts through MetalLB's webhook; the files have no conversion
	// section, and a server-side apply leaves fields other managers own (MetalLB's controller
	// injects the webhook's CA; a client-side or Helm install owns the rest), so the guide switches
	// conversion off first.
	if out, err := m.c.Kubectl(m.ctx, "", "get", "crd", "bgppeers.metallb.io", "--ignore-not-found", "-o", "name"); err == nil && strings.TrimSpace(out) != "" {
		kubectl(m.t, m.ctx, m.c, "patch", "crd", "bgppeers.metallb.io", "--type=merge", "-p", `{"spec":{"conversion":{"strategy":"None","webhook":null}}}`)
	}
	var docs []string
	for _, crd := range crds {
		b, err := json.Marshal(crd.Object)
		if err != nil {
			m.t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	if _, err := m.c.Kubectl(m.ctx, strings.Join(docs, "\n---\n"), "apply", "--server-side", "-f", "-"); err != nil {
		m.t.Fatal(err)
	}
	conv, _ := m.c.Kubectl(m.ctx, "", "get", "crd", "bgppeers.metallb.io", "-o", "jsonpath={.spec.conversion.strategy}")
	if strings.TrimSpace(conv) != "None" {
		m.t.Errorf("after step 1 the BGPPeer CRD converts with %q, want None (no webhook)", conv)
	}
	if err := poll(m.ctx, time.Minute, func(ctx context.Context) error {
		for _, gv := range []string{"metallb.io/v1beta1", "metallb.io/v1beta2"} {
			if _, err := m.c.Client.Discovery().ServerResourcesForGroupVersion(gv); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
}

// removeKubeProxyRules is "After the last node": nftables mode, the guide's nft commands on each
// node; iptables mode, `kube-proxy --cleanup` from kube-proxy's image on each node.
func (m *migration) removeKubeProxyRules(mode string) {
	for _, n := range m.c.Nodes {
		if mode == KubeProxyIPTables {
			// kube-proxy --cleanup leaves the KUBE-FIREWALL chain (its "block incoming localnet
			// connections" rule) and route_localnet=1, which it set for localhost NodePorts; vipgate
			// needs neither (dataplane/README.md), so the guide removes both, the sysctl first.
			out := m.nodePod(n.Name, "kube-proxy-cleanup", "/usr/local/bin/kube-proxy --cleanup; "+
				"sysctl -w net.ipv4.conf.all.route_localnet=0 || echo 0 >/proc/sys/net/ipv4/conf/all/route_localnet; "+
				"for t in iptables ip6tables; do $t -D INPUT -j KUBE-FIREWALL; $t -D OUTPUT -j KUBE-FIREWALL; $t -F KUBE-FIREWALL; $t -X KUBE-FIREWALL; done; true")
			m.t.Logf("%s: kube-proxy --cleanup: %s", n.Name, tail(out, 10))
			continue
		}
		// An IPv4-only cluster has no ip6 table: the second command fails there, as in a shell.
		out, _ := m.c.Lab.Exec(n.Name, "sh", "-c", "nft delete table ip kube-proxy; nft delete table ip6 kube-proxy")
		m.t.Logf("%s: nft delete table ip/ip6 kube-proxy: %s", n.Name, strings.TrimSpace(out))
	}
}

// nodePod runs script in a privileged host-network pod of kube-proxy's image on node and returns
// its output.
func (m *migration) nodePod(node, name, script string) string {
	t, ctx, c := m.t, m.ctx, m.c
	image := "registry.k8s.io/kube-proxy:v1.36.3"
	if sv, err := c.Client.Discovery().ServerVersion(); err == nil && sv.GitVersion != "" {
		image = "registry.k8s.io/kube-proxy:" + sv.GitVersion
	}
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s-%[2]s, namespace: kube-system}
spec:
  nodeName: %[2]s
  hostNetwork: true
  restartPolicy: Never
  tolerations: [{operator: Exists}]
  containers:
    - name: run
      image: %[3]s
      imagePullPolicy: IfNotPresent
      command: [sh, -c, %[4]q]
      securityContext: {privileged: true}
`, name, node, image, script)
	apply(t, ctx, c, pod)
	podName := name + "-" + node
	if err := poll(ctx, 2*time.Minute, func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("pod %s: %s", podName, p.Status.Phase)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, _ := c.Kubectl(ctx, "", "-n", "kube-system", "logs", podName)
	_, _ = c.Kubectl(ctx, "", "-n", "kube-system", "delete", "pod", podName, "--wait=false")
	return out
}

// allLBIPs maps every LoadBalancer Service of the cluster to its IPs.
func (m *migration) allLBIPs() map[string]string {
	svcs, err := m.c.Client.CoreV1().Services("").List(m.ctx, metav1.ListOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	ips := map[string]string{}
	for _, s := range svcs.Items {
		var got []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			got = append(got, in.IP)
		}
		if len(got) > 0 {
			ips[s.Namespace+"/"+s.Name] = strings.Join(got, ",")
		}
	}
	return ips
}

// lbChanges says which LoadBalancer IPs differ from the first ones seen ("" none).
func (m *migration) lbChanges() string {
	now := m.allLBIPs()
	var diffs []string
	for k, v := range m.lbIPs {
		if now[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s %s -> %q", k, v, now[k]))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// heldSet is one set of held connections, per path.
type heldSet map[string]*lab.Hold

// startHolds opens the held connections on every path that exists now and waits until they are.
func (m *migration) startHolds(what string) heldSet {
	t, c := m.t, m.c
	hs := heldSet{}
	bin, err := c.Lab.LabServer()
	if err != nil {
		t.Fatal(err)
	}
	start := func(name, role string, args ...string) {
		p, err := c.Lab.Start(role, filepath.Join(c.Dir, fmt.Sprintf("hold-%s-%d.log", strings.ToLower(name), time.Now().UnixNano())), args...)
		if err != nil {
			t.Fatal(err)
		}
		h := &lab.Hold{Proc: p}
		t.Cleanup(func() { _ = p.Stop() })
		pods, err := h.WaitOpened(time.Minute)
		if err != nil {
			t.Fatalf("%s: %s: %v", what, name, err)
		}
		t.Logf("%s: %s: held connections open, per pod %v", what, name, pods)
		hs[name] = h
	}
	hold := func(addr string, n int) []string {
		return []string{bin, "hold", "--tcp", addr, "--conns", fmt.Sprint(n), "--duration", "50m", "--timeout", "3s"}
	}
	if m.lb != "" {
		start("LoadBalancer", lab.RoleClient, hold(m.lb, migrationHeldLB)...)
	}
	start("NodePort", lab.RoleClient, hold(m.nodePort, migrationHeldOther)...)
	// From the client pod: nsenter into its network namespace from its node's.
	start("ClusterIP", m.clientNode, append([]string{"nsenter", "--net=" + m.clientNetns}, hold(m.clusterIP, migrationHeldOther)...)...)
	return hs
}

// stopHolds ends the holds and returns their verdicts.
func (m *migration) stopHolds(hs heldSet) map[string]lab.HoldResult {
	res := map[string]lab.HoldResult{}
	for name, h := range hs {
		_ = h.Proc.Signal(syscall.SIGTERM)
		r, err := h.Wait(m.ctx)
		if err != nil {
			m.t.Errorf("%s: %v", name, err)
			continue
		}
		if r.Broken > 0 {
			m.t.Logf("%s: %d of %d held connections broke (%v): %s", name, r.Broken, r.Opened, r.Errors, h.Proc.Tail(3))
		}
		res[name] = r
	}
	return res
}

// step runs one step of the guide with fresh held connections and records its figures.
func (m *migration) step(name string, f func()) { m.stepKnown(name, "", f) }

// stepKnown is step for a step whose held LoadBalancer connections break by design (why says
// why): the figure is reported, not failed.
func (m *migration) stepKnown(name, why string, f func()) {
	t := m.t
	hs := m.startHolds(name)
	t.Logf("=== step %s (load %s)", name, loadAvg())
	start := time.Now()
	f()
	took := time.Since(start)
	time.Sleep(migrationSettle)
	res := m.stopHolds(hs)
	if m.arp != nil {
		t.Logf("step %s: the router's ARP entry for %s: %s", name, m.lb, m.arp.changes(start.Add(-time.Second)))
	}
	// Probes sent in the last second may still be in flight: the window ends before them.
	row := migrationRow{step: name, took: took, held: res, gap: m.windows(start, time.Now().Add(-1100*time.Millisecond)), lbChange: m.lbChanges()}
	m.rows = append(m.rows, row)
	t.Logf("step %s: %.1f s; %s", name, took.Seconds(), row.summary())
	if r, ok := res["LoadBalancer"]; ok && r.Broken*100 > r.Opened && why != "" {
		t.Logf("step %s: %d of %d held LoadBalancer connections broke, over the goal of 1 %%, as expected: %s", name, r.Broken, r.Opened, why)
	} else if ok && r.Broken*100 > r.Opened {
		t.Errorf("step %s: %d of %d held LoadBalancer connections broke (goal: at most 1 %%)", name, r.Broken, r.Opened)
	}
	if row.lbChange != "" {
		t.Errorf("step %s: LoadBalancer IPs changed: %s", name, row.lbChange)
	}
	for _, w := range row.gap {
		if w.open {
			m.diagnose(name)
			break
		}
	}
}

// diagnose logs what the proxies on each node look like: the pods, their last log lines, the nft
// tables and whether kube-proxy's has rules.
func (m *migration) diagnose(what string) {
	t, ctx, c := m.t, m.ctx, m.c
	out, _ := c.Kubectl(ctx, "", "get", "pods", "-A", "-o", "wide")
	t.Logf("%s: new connections not back: pods:\n%s", what, out)
	for _, sel := range []string{"k8s-app=kube-proxy", "app.kubernetes.io/component=node"} {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			logs, _ := c.Kubectl(ctx, "", "-n", p.Namespace, "logs", p.Name, "--tail=15")
			t.Logf("%s: logs of %s on %s:\n%s", what, p.Name, p.Spec.NodeName, logs)
		}
	}
	for _, n := range c.Nodes {
		tables, _ := c.Lab.Exec(n.Name, "nft", "list", "tables")
		kp, _ := c.Lab.Exec(n.Name, "sh", "-c", "nft list table ip kube-proxy 2>&1 | wc -l; nft list table ip kube-proxy 2>&1 | grep -c 'dnat to'")
		t.Logf("%s: %s: nft tables [%s]; ip kube-proxy lines / dnat rules: %s", what, n.Name,
			strings.Join(strings.Fields(tables), " "), strings.Join(strings.Fields(kp), " / "))
	}
}

// migrationCluster builds the cluster a path starts from, closed when the test ends (on failure
// after logging the proxies' state).
func migrationCluster(t *testing.T, spec Spec) *Cluster {
	t.Helper()
	if os.Getenv(EnvClusterTests) == "" {
		t.Skipf("set %s=1 to build a real cluster (make test does)", EnvClusterTests)
	}
	lab.SkipUnlessRoot(t)
	if !fileExists(filepath.Join(binDir(t), "images", "labserver.tar")) {
		t.Fatalf("bin/images/labserver.tar missing (make test-images)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	spec.Logf, spec.BinDir = logf, os.Getenv(EnvBinDir)
	c, err := Up(ctx, spec)
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the cluster: %v", err)
		}
	})
	t.Logf("cluster (%s %s, MetalLB %q) up in %.0f s", spec.Proxy, spec.KubeProxyMode, spec.MetalLB, time.Since(start).Seconds())
	return c
}

func (m *migration) windows(from, to time.Time) map[string]probeWindow {
	w := map[string]probeWindow{}
	for name, p := range m.probers {
		w[name] = p.window(from, to)
	}
	return w
}

func (m *migration) stopProbers() {
	for _, p := range m.probers {
		p.close()
	}
}

var migrationOrder = []string{"LoadBalancer", "NodePort", "ClusterIP"}

func (r migrationRow) summary() string {
	var parts []string
	for _, k := range migrationOrder {
		h, okh := r.held[k]
		g, okg := r.gap[k]
		if !okh && !okg {
			continue
		}
		s := k + ":"
		if okh {
			s += fmt.Sprintf(" held broken %d/%d", h.Broken, h.Opened)
		}
		if okg {
			s += " new " + g.String()
		}
		parts = append(parts, s)
	}
	lb := "LB IPs unchanged"
	if r.lbChange != "" {
		lb = "LB IPs changed: " + r.lbChange
	}
	return strings.Join(parts, "; ") + "; " + lb
}

// checkLeftovers lists what is left of kube-proxy in each node's kernel (nftables tables and
// chains, legacy iptables tables) and of kube-proxy and MetalLB in the API, and fails on any of
// kube-proxy's rules.
func (m *migration) checkLeftovers(mode string) {
	t, ctx, c := m.t, m.ctx, m.c
	for _, n := range c.Nodes {
		tables, err := c.Lab.Exec(n.Name, "nft", "list", "tables")
		if err != nil {
			t.Errorf("%s: nft list tables: %v: %s", n.Name, err, tables)
		}
		ruleset, _ := c.Lab.Exec(n.Name, "nft", "list", "ruleset")
		var kube []string
		for _, l := range strings.Split(ruleset, "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "table ") && strings.Contains(l, "kube-proxy") ||
				strings.HasPrefix(l, "chain ") && strings.Contains(strings.ToUpper(l), "KUBE-") {
				kube = append(kube, strings.TrimSuffix(l, " {"))
			}
		}
		legacy, _ := c.Lab.Exec(n.Name, "cat", "/proc/net/ip_tables_names", "/proc/net/ip6_tables_names")
		if rl, _ := c.Lab.Exec(n.Name, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet"); strings.TrimSpace(rl) != "0" {
			kube = append(kube, "net.ipv4.conf.all.route_localnet="+strings.TrimSpace(rl))
		}
		t.Logf("%s after the migration: nft tables [%s]; legacy xtables tables [%s]; kube-proxy's: %v", n.Name,
			strings.Join(strings.Fields(strings.ReplaceAll(tables, "table ", "")), " "), strings.Join(strings.Fields(legacy), " "), kube)
		if mode == KubeProxyIPTables {
			// Legacy xtables rules are not in nft's view: iptables-save from kube-proxy's image.
			out := m.nodePod(n.Name, "xtables-check", `for s in iptables-legacy-save iptables-nft-save iptables-save ip6tables-legacy-save ip6tables-nft-save; do command -v $s >/dev/null && $s 2>/dev/null | sed "s/^/$s: /"; done; true`)
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "KUBE-") {
					kube = append(kube, l)
				}
			}
			t.Logf("%s: iptables-save from kube-proxy's image: %d lines, %d of kube-proxy's", n.Name, strings.Count(out, "\n"), len(kube))
		}
		if len(kube) > 0 {
			t.Errorf("%s: kube-proxy's rules left in the kernel: %v", n.Name, kube)
		}
	}
	objs, _ := c.Kubectl(ctx, "", "get", "all,sa,cm,rolebinding,clusterrolebinding", "-A", "-o", "name", "-l", "k8s-app=kube-proxy")
	kp, _ := c.Kubectl(ctx, "", "get", "sa,cm", "-n", "kube-system", "-o", "name", "--field-selector", "metadata.name=kube-proxy")
	crb, _ := c.Kubectl(ctx, "", "get", "clusterrolebinding", "kubeadm:node-proxier", "-o", "name", "--ignore-not-found")
	t.Logf("kube-proxy's objects left in the API: %s", strings.Join(strings.Fields(objs+" "+kp+" "+crb), " "))
	mlb, _ := c.Kubectl(ctx, "", "get", "all,sa,cm,secret,validatingwebhookconfiguration", "-n", "metallb-system", "-o", "name")
	t.Logf("MetalLB's namespace after the migration: %s", strings.Join(strings.Fields(mlb), " "))
}

// report logs the table docs/migration.md shows.
func (m *migration) report(p migrationPath) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "migration %s (load %s):\n", p.name, loadAvg())
	sb.WriteString("| step | took | held broken (LB / NodePort / ClusterIP) | longest new-connection gap (LB / NodePort / ClusterIP) | LB IP changed? |\n|---|---|---|---|---|\n")
	for _, r := range m.rows {
		var held, gaps []string
		for _, k := range migrationOrder {
			if h, ok := r.held[k]; ok {
				held = append(held, fmt.Sprintf("%d/%d", h.Broken, h.Opened))
			} else {
				held = append(held, "–")
			}
			if g, ok := r.gap[k]; ok && g.sent > 0 {
				gaps = append(gaps, g.gapString())
			} else {
				gaps = append(gaps, "–")
			}
		}
		changed := "no"
		if r.lbChange != "" {
			changed = "yes: " + r.lbChange
		}
		took := "–"
		if r.took > 0 {
			took = fmt.Sprintf("%.0f s", r.took.Seconds())
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s |\n", r.step, took, strings.Join(held, " / "), strings.Join(gaps, " / "), changed)
	}
	m.t.Log(sb.String())
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// namedNetns is the path of a named network namespace.
func namedNetns(name string) string { return "/run/netns/" + name }

// prober opens a new TCP connection to addr from a network namespace every interval and records
// each outcome (connected and the server's greeting read within a second).
type prober struct {
	mu   sync.Mutex
	recs []probeOutcome
	stop chan struct{}
	done chan struct{}
}

type probeOutcome struct {
	sent time.Time
	err  string // "" answered
}

func startProber(nsPath, addr string, every time.Duration) *prober {
	p := &prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var inflight sync.WaitGroup
		defer inflight.Wait()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				o := probeIn(nsPath, addr)
				p.mu.Lock()
				p.recs = append(p.recs, o)
				p.mu.Unlock()
			}()
		}
	}()
	return p
}

func (p *prober) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// probeIn connects to addr from the network namespace at nsPath and reads the greeting.
func probeIn(nsPath, addr string) probeOutcome {
	o := probeOutcome{sent: time.Now()}
	deadline := o.sent.Add(time.Second)
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		// The socket is made in the namespace the thread is in; the thread goes back (or, if it
		// cannot, is retired with the locked goroutine).
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- dialed{err: err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- dialed{err: err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- dialed{err: err}
			return
		}
		d := net.Dialer{Deadline: deadline}
		conn, err := d.Dial("tcp", addr)
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- dialed{conn, err}
	}()
	r := <-ch
	if r.err != nil {
		o.err = errKind(r.err)
		return o
	}
	defer r.c.Close()
	_ = r.c.SetDeadline(deadline)
	line, err := bufio.NewReader(r.c).ReadString('\n')
	switch {
	case err != nil:
		o.err = errKind(err)
	case !strings.Contains(line, "name="):
		o.err = "garbled"
	}
	return o
}

// probeWindow summarises the probes sent in a time window.
type probeWindow struct {
	sent, failed int
	// gap is the longest run of failed probes: from its first probe's send to the send of the next
	// probe that answered (or to the window's end: open).
	gap  time.Duration
	open bool
	errs map[string]int
}

func (w probeWindow) gapString() string {
	if w.failed == 0 {
		return "0"
	}
	s := fmt.Sprintf("%.1f s", w.gap.Seconds())
	if w.open {
		s += " (not back)"
	}
	return s
}

func (w probeWindow) String() string {
	if w.sent == 0 {
		return "no probes"
	}
	return fmt.Sprintf("%d/%d failed %v, longest gap %s", w.failed, w.sent, w.errs, w.gapString())
}

func (p *prober) window(from, to time.Time) probeWindow {
	p.mu.Lock()
	recs := slices.Clone(p.recs)
	p.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool { return recs[i].sent.Before(recs[j].sent) })
	w := probeWindow{errs: map[string]int{}}
	var runStart time.Time
	for _, r := range recs {
		if r.sent.Before(from) || r.sent.After(to) {
			continue
		}
		w.sent++
		if r.err != "" {
			w.failed++
			w.errs[r.err]++
			if runStart.IsZero() {
				runStart = r.sent
			}
			continue
		}
		if !runStart.IsZero() {
			w.gap = max(w.gap, r.sent.Sub(runStart))
			runStart = time.Time{}
		}
	}
	if !runStart.IsZero() && to.Sub(runStart) > w.gap {
		w.gap, w.open = to.Sub(runStart), true
	}
	return w
}

// arpWatch polls the router's neighbour entry for an IP every 100 ms and keeps its changes.
type arpWatch struct {
	mu      sync.Mutex
	changed []string // "15:04:05.000 node1"
	last    string
	since   []time.Time
	stop    chan struct{}
	done    chan struct{}
}

func startARPWatch(c *Cluster, ip string, macs map[string]string) *arpWatch {
	w := &arpWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			out, _ := c.Lab.Exec(lab.RoleRouter, "ip", "neigh", "show", ip)
			who := "none"
			f := strings.Fields(out)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "lladdr" {
					who = macs[f[i+1]]
					if who == "" {
						who = f[i+1]
					}
				}
			}
			if len(f) > 0 && who == "none" {
				who = f[len(f)-1] // INCOMPLETE, FAILED
			}
			w.mu.Lock()
			if who != w.last {
				w.last = who
				w.changed = append(w.changed, time.Now().Format("15:04:05.000")+" "+who)
				w.since = append(w.since, time.Now())
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// changes lists the entry's changes since from, after the state it had then.
func (w *arpWatch) changes(from time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for i, at := range w.since {
		if at.Before(from) {
			out = []string{"was " + strings.SplitN(w.changed[i], " ", 2)[1]}
			continue
		}
		out = append(out, w.changed[i])
	}
	return strings.Join(out, ", ")
}

func (w *arpWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}
