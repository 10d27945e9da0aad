package e2e

// The deploy/ directory is tested here, in four layers:
//
//   - TestDeployRBACMatchesCode: the RBAC of each component grants exactly the API access its code
//     makes — no less (it would be denied in a real cluster) and no more (least privilege). The
//     access is found by scanning vipgate's Go source for client-go calls (deployAPIPatterns); a
//     call the scan does not understand, or a file making calls that no component is known to run,
//     fails the test, so the RBAC cannot silently fall behind the code.
//   - TestDeployNodeConfig, TestDeployFlags, TestDeployChartMatchesManifests: the node ConfigMap is a
//     valid NodeConfig once the DaemonSet's downward-API variables are set; every flag the
//     DaemonSet and Deployment pass exists in the vipgate binary; the chart renders the same objects
//     as deploy/manifests.
//   - TestDeployDryRun (root): every manifest and the rendered chart (several value sets) pass
//     `kubectl apply --dry-run=server --validate=strict` against a real kube-apiserver with MetalLB's
//     CRDs installed.
//   - TestDeploySystemdUnit: systemd-analyze verify, and the capability bounding set.
//
// The chart is rendered with Helm's own Go library (test/helmtools, a separate module pinned to
// helm.sh/helm/v3 v3.19.0, so the main module does not carry Helm's dependencies). Building it
// takes about two minutes the first time, so -short skips the tests that need it.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// The two in-cluster components, and the gateway (outside the cluster, with a kubeconfig of its
// ServiceAccount), and the ServiceAccount-name suffixes that identify them (the plain manifests use
// vipgate-node, vipgate-controller and vipgate-gateway, the chart <fullname>-node, -controller and
// -gateway). componentAdmin is code that runs with an administrator's kubeconfig (`vipgate gateway
// kubeconfig`): no RBAC of vipgate's grants it, so it is only checked to be understood.
const (
	componentNode       = "node"
	componentController = "controller"
	componentGateway    = "gateway"
	componentAdmin      = "admin"
)

// deployNamespace is where the plain manifests install vipgate.
const deployNamespace = "vipgate-system"

// ---------------------------------------------------------------------------------------------
// What the code uses.

// apiAccess is one permission: a verb on a resource, cluster-wide or in the component's own
// namespace, optionally limited to one object name.
type apiAccess struct {
	Group, Resource, Verb string
	Namespaced            bool   // granted by a Role in the component's namespace
	Name                  string // resourceNames entry ("" = any)
}

func (a apiAccess) String() string {
	s := a.Verb + " " + a.Resource
	if a.Group != "" {
		s += "." + a.Group
	}
	if a.Name != "" {
		s += "/" + a.Name
	}
	if a.Namespaced {
		s += " (own namespace)"
	}
	return s
}

// deployNamed is the resourceNames entry of an access the code makes by object name, with names
// the deployment chooses (the node agent's --bgp-password-secrets): any names granted for it are
// used, and granting none is fine (the component then reads none).
const deployNamed = "(names the deployment lists)"

// deployAPIPattern recognises one kind of API use in Go source.
type deployAPIPattern struct {
	what string
	re   *regexp.Regexp
	// access turns a match into the permissions it needs; leaseName is the controller's Lease name.
	access func(m []string, leaseName string) []apiAccess
}

// groupOfClient maps a typed client-go group accessor to its API group.
var groupOfClient = map[string]string{
	"Core": "", "CoreV1": "",
	"Discovery": "discovery.k8s.io", "DiscoveryV1": "discovery.k8s.io",
	"Coordination": "coordination.k8s.io", "CoordinationV1": "coordination.k8s.io",
	"Events": "events.k8s.io", "EventsV1": "events.k8s.io",
	"Networking": "networking.k8s.io", "NetworkingV1": "networking.k8s.io",
}

// verbOfMethod maps a typed client method to the RBAC verb and the subresource it touches.
var verbOfMethod = map[string][2]string{
	"Get": {"get", ""}, "List": {"list", ""}, "Watch": {"watch", ""}, "Create": {"create", ""},
	"Update": {"update", ""}, "Patch": {"patch", ""}, "Apply": {"patch", ""}, "Delete": {"delete", ""},
	"DeleteCollection": {"deletecollection", ""}, "UpdateStatus": {"update", "status"},
	"ApplyStatus": {"patch", "status"}, "CreateToken": {"create", "token"},
}

// deployAPIPatterns are the shapes of API use vipgate's code has. Each line of Go source that
// mentions a client-go API accessor must match one of them (deployAPIAccessor), or the test fails.
var deployAPIPatterns = []deployAPIPattern{
	{
		// factory.Core().V1().Services().Informer(): a shared informer lists and watches.
		what: "shared informer",
		re:   regexp.MustCompile(`\.(Core|Discovery|Coordination|Networking)\(\)\.V1\(\)\.(\w+)\(\)`),
		access: func(m []string, _ string) []apiAccess {
			g, r := groupOfClient[m[1]], strings.ToLower(m[2])
			return []apiAccess{{Group: g, Resource: r, Verb: "list"}, {Group: g, Resource: r, Verb: "watch"}}
		},
	},
	{
		// EventSinkImpl{Interface: client.CoreV1().Events("")}: client-go's record package creates
		// Events and patches them when it aggregates repeats (tools/record/event.go recordToSink).
		what: "event recorder (core/v1)",
		re:   regexp.MustCompile(`EventSinkImpl\{Interface:\s*[\w.]*\.CoreV1\(\)\.Events\(`),
		access: func([]string, string) []apiAccess {
			return []apiAccess{{Resource: "events", Verb: "create"}, {Resource: "events", Verb: "patch"}}
		},
	},
	{
		// client.CoreV1().Services(ns).UpdateStatus(...): one typed call.
		what: "typed client call",
		re:   regexp.MustCompile(`\.(CoreV1|DiscoveryV1|CoordinationV1|EventsV1|NetworkingV1)\(\)\.(\w+)\([^()]*\)\.(\w+)\(`),
		access: func(m []string, _ string) []apiAccess {
			vm, ok := verbOfMethod[m[3]]
			if !ok {
				return nil // reported as not understood
			}
			r := strings.ToLower(m[2])
			if vm[1] != "" {
				r += "/" + vm[1]
			}
			return []apiAccess{{Group: groupOfClient[m[1]], Resource: r, Verb: vm[0]}}
		},
	},
	{
		// resourcelock.LeaseLock{...}: leader election gets, creates and updates its one Lease
		// (tools/leaderelection/resourcelock/leaselock.go), in the namespace it is given.
		what: "leader election (LeaseLock)",
		re:   regexp.MustCompile(`resourcelock\.LeaseLock\{`),
		access: func(_ []string, lease string) []apiAccess {
			return []apiAccess{
				{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespaced: true},
				{Group: "coordination.k8s.io", Resource: "leases", Verb: "get", Namespaced: true, Name: lease},
				{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespaced: true, Name: lease},
			}
		},
	},
	{
		// coreinformers.NewFilteredSecretInformer(client, ns, ...): a standalone informer of one
		// namespace (the component's own) lists and watches there. With byName(name) on the same
		// line (cluster/bgpsecrets.go: fieldSelector metadata.name=NAME), it reads that one object,
		// which a rule with resourceNames grants: the names are the deployment's (deployNamed).
		what: "namespaced informer",
		re:   regexp.MustCompile(`coreinformers\.NewFiltered(\w+)Informer\((.*\bbyName\()?`),
		access: func(m []string, _ string) []apiAccess {
			r, name := strings.ToLower(m[1])+"s", ""
			if m[2] != "" {
				name = deployNamed
			}
			return []apiAccess{{Resource: r, Verb: "list", Namespaced: true, Name: name}, {Resource: r, Verb: "watch", Namespaced: true, Name: name}}
		},
	},
	{
		// dyn.Resource(gvrServiceL2Statuses).Namespace(ns).UpdateStatus(...) in cluster/mlbstatus:
		// one dynamic call on a MetalLB kind, named by its gvr<Resource> variable. Status objects
		// live in the component's own namespace (.Namespace(ns): a Role); IPAddressPool status is
		// written in the pool's namespace (.Namespace(u.GetNamespace()): cluster-wide).
		what: "MetalLB status write (cluster/mlbstatus)",
		re:   regexp.MustCompile(`\.Resource\(gvr(\w+)\)\.Namespace\((ns|u\.GetNamespace\(\))\)\.(\w+)\(`),
		access: func(m []string, _ string) []apiAccess {
			vm, ok := verbOfMethod[m[3]]
			if !ok {
				return nil // reported as not understood
			}
			r := strings.ToLower(m[1])
			if vm[1] != "" {
				r += "/" + vm[1]
			}
			return []apiAccess{{Group: "metallb.io", Resource: r, Verb: vm[0], Namespaced: m[2] == "ns"}}
		},
	},
	{
		// metallbv1beta1.GroupVersion.WithResource("ipaddresspools") in the MetalLB kinds table,
		// started with dynamicinformer ForResource(...).Informer(): list and watch.
		what: "MetalLB dynamic informer",
		re:   regexp.MustCompile(`metallbv1beta\d\.GroupVersion\.WithResource\("(\w+)"\)`),
		access: func(m []string, _ string) []apiAccess {
			return []apiAccess{{Group: "metallb.io", Resource: m[1], Verb: "list"}, {Group: "metallb.io", Resource: m[1], Verb: "watch"}}
		},
	},
}

// deployAPIAccessor finds lines that use the API in some way. Lines matching it but none of
// deployAPIPatterns (and not harmless, deployAPIHarmless) fail the test: the scan must understand
// every API use to keep the RBAC honest.
var deployAPIAccessor = regexp.MustCompile(`\.(CoreV1|DiscoveryV1|CoordinationV1|EventsV1|AppsV1|RbacV1|NetworkingV1|[A-Z][A-Za-z]*V1(alpha|beta)?\d*)\(\)|\.Resource\(|ForResource\(|resourcelock\.|tools/events|informers\.New\w*Informer\(`)

// deployAPIHarmless are accessor lines that grant nothing by themselves: the Lease client handed to
// LeaseLock (its calls are LeaseLock's, counted above), the dynamic informer of a resource from the
// MetalLB kinds table (counted by its WithResource entry), the resourcelock config struct.
var deployAPIHarmless = regexp.MustCompile(`^\s*Client:\s+[\w.]*\.CoordinationV1\(\),$|m\.factory\.ForResource\(metallbKinds\[i\]\.gvr\)\.Informer\(\)|resourcelock\.ResourceLockConfig\{`)

// deployUnits says which component runs which source files' API calls. kubesource*.go is the
// Kubernetes source, used by the node agent (cmd/vipgate/source.go) and — when lbcontroller.go
// builds one — by the controller too.
var deployUnits = []struct {
	file       *regexp.Regexp
	components func(src map[string]string) []string
}{
	{regexp.MustCompile(`^cluster/kubesource[\w]*\.go$`), func(src map[string]string) []string {
		var cs []string
		if strings.Contains(src["cmd/vipgate/source.go"], "cluster.NewKubeSource(") {
			cs = append(cs, componentNode)
			if gatewayUsesSource(src) {
				cs = append(cs, componentGateway)
			}
		}
		if strings.Contains(src["cluster/lbcontroller.go"], "NewKubeSource(") {
			cs = append(cs, componentController)
		}
		return cs
	}},
	{regexp.MustCompile(`^cluster/lb(controller|finalizer)\.go$`), func(map[string]string) []string { return []string{componentController} }},
	// The speaker pods (L2 members): only the node agent's speaker asks the source for them
	// (cmd/vipgate/speaker.go).
	{regexp.MustCompile(`^cluster/speakerpods\.go$`), func(src map[string]string) []string {
		if strings.Contains(src["cmd/vipgate/speaker.go"], ".WatchSpeakerPods(") {
			return []string{componentNode}
		}
		return nil
	}},
	// MetalLB's status resources (cluster/mlbstatus): the node agent's speaker writes
	// ServiceL2Status, ServiceBGPStatus and its ConfigurationState (cmd/vipgate/speaker.go); the
	// controller its ConfigurationState and the IPAddressPool counters (cluster/lbcontroller.go);
	// both watch their own pod, the owner of what they write (kinds_state.go).
	{regexp.MustCompile(`^cluster/mlbstatus/kinds\.go$`), func(src map[string]string) []string {
		return mlbstatusUsers(src, true, false)
	}},
	{regexp.MustCompile(`^cluster/mlbstatus/kinds_state\.go$`), func(src map[string]string) []string {
		return mlbstatusUsers(src, true, true)
	}},
	{regexp.MustCompile(`^cluster/mlbstatus/kinds_pool\.go$`), func(src map[string]string) []string {
		return mlbstatusUsers(src, false, true)
	}},
	// The BGP password Secrets: only the node agent asks the source for them (cmd/vipgate/source.go).
	{regexp.MustCompile(`^cluster/bgpsecrets\.go$`), func(src map[string]string) []string {
		if !strings.Contains(src["cmd/vipgate/source.go"], ".WatchBGPSecrets(") {
			return nil
		}
		if gatewayUsesSource(src) {
			return []string{componentNode, componentGateway}
		}
		return []string{componentNode}
	}},
	// `vipgate gateway kubeconfig` asks for the gateway's token with the administrator's kubeconfig.
	{regexp.MustCompile(`^cluster/gatewaykubeconfig\.go$`), func(map[string]string) []string { return []string{componentAdmin} }},
}

// gatewayUsesSource says whether `vipgate gateway` builds its Kubernetes source with the node's
// newSource (cmd/vipgate/source.go: the Kubernetes source, BGP Secrets with POD_NAMESPACE).
func gatewayUsesSource(src map[string]string) bool {
	return strings.Contains(src["cmd/vipgate/gateway.go"], "newSource(")
}

// mlbstatusUsers lists the components that start a cluster/mlbstatus writer, among node and controller.
func mlbstatusUsers(src map[string]string, node, controller bool) []string {
	var cs []string
	if node && strings.Contains(src["cmd/vipgate/speaker.go"], "mlbstatus.New(") {
		cs = append(cs, componentNode)
		// The gateway runs the node's speaker (newSpeakerWith) and hands it its source: the
		// status writer starts there too, with POD_NAMESPACE set.
		if strings.Contains(src["cmd/vipgate/gateway.go"], ".setEventer(") {
			cs = append(cs, componentGateway)
		}
	}
	if controller && strings.Contains(src["cluster/lbcontroller.go"], "mlbstatus.New(") {
		cs = append(cs, componentController)
	}
	return cs
}

// codeAPIAccess scans the module's non-test Go source outside test/ and returns, per component,
// the access its code needs; problems are API uses the scan does not understand.
func codeAPIAccess(root, leaseName string) (need map[string]map[apiAccess][]string, problems []string, err error) {
	src := map[string]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == "test" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || (rel != "." && fileExists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir // test harnesses are not deployed; nested modules are not vipgate
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		src[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading the source: %w", err)
	}
	need = map[string]map[apiAccess][]string{componentNode: {}, componentController: {}, componentGateway: {}, componentAdmin: {}}
	files := make([]string, 0, len(src))
	for f := range src {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		var found []apiAccess
		var where []string
		for i, line := range strings.Split(src[f], "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			matched := false
			for _, p := range deployAPIPatterns {
				for _, m := range p.re.FindAllStringSubmatch(line, -1) {
					acc := p.access(m, leaseName)
					if len(acc) == 0 {
						problems = append(problems, fmt.Sprintf("%s:%d: %s %q: method not mapped to a verb", f, i+1, p.what, m[0]))
					}
					for _, a := range acc {
						found = append(found, a)
						where = append(where, fmt.Sprintf("%s:%d", f, i+1))
					}
					matched = true
				}
			}
			if !matched && deployAPIAccessor.MatchString(line) && !deployAPIHarmless.MatchString(line) {
				problems = append(problems, fmt.Sprintf("%s:%d: API use not understood by the RBAC scan: %s", f, i+1, strings.TrimSpace(line)))
			}
		}
		if len(found) == 0 {
			continue
		}
		var comps []string
		for _, u := range deployUnits {
			if u.file.MatchString(f) {
				comps = u.components(src)
				break
			}
		}
		if comps == nil {
			problems = append(problems, fmt.Sprintf("%s calls the Kubernetes API but no component is known to run it: add it to deployUnits (and its access to the RBAC)", f))
		}
		for _, c := range comps {
			for i, a := range found {
				need[c][a] = append(need[c][a], where[i])
			}
		}
	}
	return need, problems, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ---------------------------------------------------------------------------------------------
// What the manifests grant.

// deployObject is one object of a manifest stream, with its raw JSON.
type deployObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	raw []byte
}

func (o deployObject) key() string {
	return o.Kind + " " + strings.TrimPrefix(o.Metadata.Namespace+"/", "/") + o.Metadata.Name
}

// decodeInto decodes the object strictly (unknown fields are errors) into a typed API object.
func (o deployObject) decodeInto(t *testing.T, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(o.raw, into); err != nil {
		t.Fatalf("%s: %v", o.key(), err)
	}
}

// readObjects splits YAML streams into objects.
func readObjects(t *testing.T, data []byte) []deployObject {
	t.Helper()
	var objs []deployObject
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("splitting YAML: %v", err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("YAML document: %v\n%s", err, doc)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue // a document of comments only
		}
		var o deployObject
		if err := yaml.Unmarshal(j, &o); err != nil {
			t.Fatalf("object: %v\n%s", err, doc)
		}
		o.raw = j
		objs = append(objs, o)
	}
}

// manifestObjects reads every file of deploy/manifests.
func manifestObjects(t *testing.T) []deployObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(moduleRoot(t), "deploy/manifests/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/manifests (%v)", err)
	}
	var objs []deployObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, readObjects(t, b)...)
	}
	return objs
}

// grantedAccess expands the (Cluster)Roles bound to each component's ServiceAccount.
func grantedAccess(t *testing.T, objs []deployObject) map[string]map[apiAccess]bool {
	t.Helper()
	clusterRoles := map[string]rbacv1.ClusterRole{}
	roles := map[string]rbacv1.Role{}
	for _, o := range objs {
		switch o.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			o.decodeInto(t, &r)
			clusterRoles[r.Name] = r
		case "Role":
			var r rbacv1.Role
			o.decodeInto(t, &r)
			roles[r.Namespace+"/"+r.Name] = r
		}
	}
	out := map[string]map[apiAccess]bool{componentNode: {}, componentController: {}, componentGateway: {}}
	grant := func(subjects []rbacv1.Subject, rules []rbacv1.PolicyRule, namespaced bool, where string) {
		for _, s := range subjects {
			var comp string
			switch {
			case s.Kind == "ServiceAccount" && strings.HasSuffix(s.Name, "-"+componentNode):
				comp = componentNode
			case s.Kind == "ServiceAccount" && strings.HasSuffix(s.Name, "-"+componentController):
				comp = componentController
			case s.Kind == "ServiceAccount" && strings.HasSuffix(s.Name, "-"+componentGateway):
				comp = componentGateway
			default:
				t.Errorf("%s: subject %s %s is not a vipgate component", where, s.Kind, s.Name)
				continue
			}
			for _, r := range rules {
				names := r.ResourceNames
				if len(names) == 0 {
					names = []string{""}
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							for _, n := range names {
								if g == "*" || res == "*" || v == "*" {
									t.Errorf("%s: wildcard in %+v", where, r)
								}
								out[comp][apiAccess{Group: g, Resource: res, Verb: v, Namespaced: namespaced, Name: n}] = true
							}
						}
					}
				}
			}
		}
	}
	for _, o := range objs {
		switch o.Kind {
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			o.decodeInto(t, &b)
			cr, ok := clusterRoles[b.RoleRef.Name]
			if b.RoleRef.Kind != "ClusterRole" || !ok {
				t.Errorf("ClusterRoleBinding %s refers to %s %s, which is not in the manifests", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
				continue
			}
			grant(b.Subjects, cr.Rules, false, "ClusterRoleBinding "+b.Name)
		case "RoleBinding":
			var b rbacv1.RoleBinding
			o.decodeInto(t, &b)
			r, ok := roles[b.Namespace+"/"+b.RoleRef.Name]
			if b.RoleRef.Kind != "Role" || !ok {
				t.Errorf("RoleBinding %s refers to %s %s, which is not in the manifests (a RoleBinding to a ClusterRole would grant more than needed)", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
				continue
			}
			for _, s := range b.Subjects {
				if s.Namespace != b.Namespace {
					t.Errorf("RoleBinding %s/%s: subject %s is in namespace %q: the Lease must be in the component's own namespace", b.Namespace, b.Name, s.Name, s.Namespace)
				}
			}
			grant(b.Subjects, r.Rules, true, "RoleBinding "+b.Name)
		}
	}
	return out
}

// leaseNameOf returns the controller Deployment's --lease-name (the code's default if absent).
func leaseNameOf(t *testing.T, objs []deployObject) string {
	t.Helper()
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		o.decodeInto(t, &d)
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--lease-name="); ok {
				return v
			}
		}
	}
	return "vipgate-controller" // cmd/vipgate/lbcontroller.go's default
}

// checkRBAC compares what the code needs with what objs grant, both ways.
func checkRBAC(t *testing.T, objs []deployObject) {
	t.Helper()
	need, problems, err := codeAPIAccess(moduleRoot(t), leaseNameOf(t, objs))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	granted := grantedAccess(t, objs)
	comps := []string{componentNode, componentController}
	// The gateway's RBAC is optional (the chart's gateway.rbac.create): checked where it is.
	if slices.ContainsFunc(objs, func(o deployObject) bool {
		return o.Kind == "ServiceAccount" && strings.HasSuffix(o.Metadata.Name, "-"+componentGateway)
	}) {
		comps = append(comps, componentGateway)
	}
	for _, comp := range comps {
		if len(need[comp]) == 0 {
			t.Errorf("%s: the scan found no API use at all; deployUnits or deployAPIPatterns are out of date", comp)
		}
		var missing, extra, ok []string
		for a, where := range need[comp] {
			switch {
			case granted[comp][a]:
				ok = append(ok, a.String())
			case a.Name == deployNamed:
				// By names the deployment lists: granting none is fine, named grants are below.
			default:
				missing = append(missing, fmt.Sprintf("%s (used at %s)", a, strings.Join(slices.Compact(where), ", ")))
			}
		}
		for a := range granted[comp] {
			named := a
			named.Name = deployNamed
			if _, used := need[comp][named]; used && a.Name != "" {
				ok = append(ok, a.String())
				continue
			}
			if _, used := need[comp][a]; !used {
				extra = append(extra, a.String())
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		sort.Strings(ok)
		for _, m := range missing {
			t.Errorf("%s: the code needs %s but the RBAC does not grant it", comp, m)
		}
		for _, e := range extra {
			t.Errorf("%s: the RBAC grants %s but the code never uses it", comp, e)
		}
		t.Logf("%s: %d permissions, each used by the code: %s", comp, len(ok), strings.Join(ok, "; "))
	}
}

// TestDeployRBACMatchesCode: the manifests' and the chart's RBAC grant exactly what the code uses.
func TestDeployRBACMatchesCode(t *testing.T) {
	t.Run("manifests", func(t *testing.T) { checkRBAC(t, manifestObjects(t)) })
	t.Run("chart", func(t *testing.T) {
		checkRBAC(t, readObjects(t, renderChart(t, "")))
	})
	t.Run("chart-custom-lease", func(t *testing.T) {
		checkRBAC(t, readObjects(t, renderChart(t, "fullnameOverride: vg\ncontroller:\n  leaseName: vg-leader\n")))
	})
	// BGP password Secrets: the Role grants the listed names only, and the agent is told the same.
	t.Run("chart-bgp-secrets", func(t *testing.T) {
		objs := readObjects(t, renderChart(t, deployVariants["custom"])) // bgp.passwordSecrets: [tor, tor-bfd]
		checkRBAC(t, objs)
		checkSecretNames(t, objs, []string{"tor", "tor-bfd"})
	})
	// The gateways' RBAC: the same check, and their Secrets Role grants exactly the listed names.
	t.Run("chart-gateway", func(t *testing.T) {
		objs := readObjects(t, renderChart(t, deployVariants["gateway"])) // gateway.rbac.passwordSecrets: [tor-gw]
		checkRBAC(t, objs)
		var names []string
		for _, o := range objs {
			if o.Kind == "Role" && o.Metadata.Name == "vipgate-gateway-bgp-secrets" {
				var r rbacv1.Role
				o.decodeInto(t, &r)
				for _, rule := range r.Rules {
					names = append(names, rule.ResourceNames...)
				}
			}
		}
		if !slices.Equal(names, []string{"tor-gw"}) {
			t.Errorf("the gateway's Secrets Role grants %q, want [tor-gw]", names)
		}
	})
	t.Run("manifests-no-secrets", func(t *testing.T) { checkSecretNames(t, manifestObjects(t), nil) })
	t.Run("chart-no-secrets", func(t *testing.T) { checkSecretNames(t, readObjects(t, renderChart(t, "")), nil) })
}

// checkSecretNames: every rule of objs on Secrets names exactly names (resourceNames, none: no
// rule on Secrets at all), and the node DaemonSet's --bgp-password-secrets lists the same.
func checkSecretNames(t *testing.T, objs []deployObject, names []string) {
	t.Helper()
	rules := 0
	for _, o := range objs {
		var rs []rbacv1.PolicyRule
		switch o.Kind {
		case "Role":
			var r rbacv1.Role
			o.decodeInto(t, &r)
			rs = r.Rules
		case "ClusterRole":
			var r rbacv1.ClusterRole
			o.decodeInto(t, &r)
			rs = r.Rules
		}
		for _, r := range rs {
			if !slices.Contains(r.Resources, "secrets") {
				continue
			}
			rules++
			if o.Kind != "Role" || !slices.Equal(r.ResourceNames, names) || len(names) == 0 {
				t.Errorf("%s %s grants %v on secrets with resourceNames %q, want a Role with exactly %q", o.Kind, o.Metadata.Name, r.Verbs, r.ResourceNames, names)
			}
		}
	}
	if len(names) > 0 && rules == 0 {
		t.Errorf("no Role grants the Secrets %q", names)
	}
	ds, _ := daemonSetOf(t, objs)
	var arg []string
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--bgp-password-secrets="); ok {
			arg = strings.Split(v, ",")
		}
	}
	if !slices.Equal(arg, names) {
		t.Errorf("the node agent's --bgp-password-secrets is %q, want %q", arg, names)
	}
}

// ---------------------------------------------------------------------------------------------
// Helm rendering through test/helmtools.

var (
	helmRenderOnce sync.Once
	helmRenderBin  string
	helmRenderErr  error
)

// renderChart renders deploy/helm/vipgate with Helm's engine (release "vipgate" in vipgate-system),
// after running Helm's chart linter; values is an extra values file's content ("" for none).
// The renderer is built once per test binary.
func renderChart(t *testing.T, values string) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: building the Helm renderer (test/helmtools) takes minutes the first time")
	}
	root := moduleRoot(t)
	helmRenderOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vgt-helmrender-")
		if err != nil {
			helmRenderErr = err
			return
		}
		// Left for the process: the test binary exits soon after; the file is small.
		helmRenderBin = filepath.Join(dir, "helmrender")
		cmd := exec.Command(lab.GoBinary(), "build", "-o", helmRenderBin, ".")
		cmd.Dir = filepath.Join(root, "test/helmtools")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			helmRenderErr = fmt.Errorf("building test/helmtools: %w\n%s", err, out)
		}
	})
	if helmRenderErr != nil {
		t.Fatal(helmRenderErr)
	}
	args := []string{"-chart", filepath.Join(root, "deploy/helm/vipgate"), "-namespace", deployNamespace, "-name", "vipgate", "-lint"}
	if values != "" {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", f)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmRenderBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("rendering the chart: %v\n%s", err, stderr.String())
	}
	return stdout.Bytes()
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := lab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// ---------------------------------------------------------------------------------------------
// Config, flags, chart vs manifests.

// deployVariants are the chart value sets the tests render besides the defaults.
var deployVariants = map[string]string{
	"no-controller": "controller:\n  enabled: false\n",
	// The gateways' ServiceAccount and RBAC (off by default), with a BGP password Secret.
	"gateway": "gateway:\n  rbac:\n    create: true\n    passwordSecrets: [tor-gw]\n",
	// As the plain manifests (12-rbac-gateway.yaml): the gateways' RBAC without Secrets.
	"gateway-manifests": "gateway:\n  rbac:\n    create: true\n",
	"custom": `fullnameOverride: vg
rbac:
  create: true
imagePullSecrets: [{name: regcred}]
apiServer: {host: 192.0.2.10, port: 6443}
bgp: {passwordSecrets: [tor, tor-bfd]}
node:
  extraArgs: [--bgp-shutdown-drain=10s]
  nodeSelector: {kubernetes.io/os: linux}
  config:
    clusterCIDRs: [10.244.0.0/16]
    serviceCIDRs: [10.96.0.0/16]
    masqueradeAll: true
    logLevel: debug
controller:
  replicas: 3
  loadBalancerClass: vipgate.io/lb
  leaseName: vg-leader
  podDisruptionBudget: {enabled: false}
`,
}

// daemonSetOf returns the DaemonSet and the ConfigMap it mounts.
func daemonSetOf(t *testing.T, objs []deployObject) (*appsv1.DaemonSet, *corev1.ConfigMap) {
	t.Helper()
	var ds *appsv1.DaemonSet
	cms := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		switch o.Kind {
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			o.decodeInto(t, ds)
		case "ConfigMap":
			cm := &corev1.ConfigMap{}
			o.decodeInto(t, cm)
			cms[cm.Name] = cm
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			if cm := cms[v.ConfigMap.Name]; cm != nil {
				return ds, cm
			}
			t.Fatalf("DaemonSet mounts ConfigMap %s, which is not there", v.ConfigMap.Name)
		}
	}
	t.Fatal("the DaemonSet mounts no ConfigMap")
	return nil, nil
}

// envRefRE is the ${NAME} form cluster.LoadNodeConfig expands.
var envRefRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// checkNodeConfig loads the DaemonSet's NodeConfig the way vipgate does, with the downward-API
// variables set as the kubelet would on a single-stack and a dual-stack node.
func checkNodeConfig(t *testing.T, objs []deployObject) {
	ds, cm := daemonSetOf(t, objs)
	data, ok := cm.Data["node.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no node.yaml", cm.Name)
	}
	env := map[string]string{}
	for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for _, m := range envRefRE.FindAllStringSubmatch(data, -1) {
		if _, ok := env[m[1]]; !ok {
			t.Errorf("node.yaml refers to ${%s} but the DaemonSet does not set it from the downward API", m[1])
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["NODE_IPS"] != "status.hostIPs" {
		t.Errorf("downward API: NODE_NAME=%q NODE_IPS=%q, want spec.nodeName and status.hostIPs", env["NODE_NAME"], env["NODE_IPS"])
	}
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ips := range []string{"192.0.2.11", "192.0.2.11,2001:db8::11"} {
		t.Setenv("NODE_NAME", "node-a")
		t.Setenv("NODE_IPS", ips)
		cfg, err := cluster.LoadNodeConfig(path)
		if err != nil {
			t.Errorf("NODE_IPS=%s: %v\n%s", ips, err, data)
			continue
		}
		if cfg.NodeName != "node-a" || len(cfg.NodeIPs) != strings.Count(ips, ",")+1 {
			t.Errorf("NODE_IPS=%s: nodeName %q, nodeIPs %v", ips, cfg.NodeName, cfg.NodeIPs)
		}
	}
}

// TestDeployNodeConfig: the node ConfigMap (manifests and chart) is a valid NodeConfig on every node.
func TestDeployNodeConfig(t *testing.T) {
	t.Run("manifests", func(t *testing.T) { checkNodeConfig(t, manifestObjects(t)) })
	t.Run("chart", func(t *testing.T) { checkNodeConfig(t, readObjects(t, renderChart(t, ""))) })
	t.Run("chart-custom", func(t *testing.T) { checkNodeConfig(t, readObjects(t, renderChart(t, deployVariants["custom"]))) })
	t.Run("chart-refuses-nodeName", func(t *testing.T) {
		if testing.Short() {
			t.Skip("-short")
		}
		// The chart supplies nodeName and nodeIPs itself; a value would be a duplicate key.
		renderChart(t, "")
		cmd := exec.Command(helmRenderBin, "-chart", filepath.Join(moduleRoot(t), "deploy/helm/vipgate"), "-f", "/dev/stdin")
		cmd.Stdin = strings.NewReader("node:\n  config:\n    nodeName: x\n")
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "leave out nodeName") {
			t.Errorf("want the chart to refuse node.config.nodeName, got %v:\n%s", err, out)
		}
	})
}

// helpFlags returns the flags "vipgate CMD --help" lists.
func helpFlags(t *testing.T, bin, cmd string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(bin, cmd, "--help").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("vipgate %s --help lists no flags:\n%s", cmd, out)
	}
	return flags
}

// checkArgs checks that the containers' flags exist in the vipgate binary.
func checkArgs(t *testing.T, bin string, objs []deployObject) {
	t.Helper()
	known := map[string]map[string]bool{}
	check := func(kind string, args []string) {
		if len(args) == 0 {
			t.Errorf("%s: no args", kind)
			return
		}
		sub := args[0]
		if known[sub] == nil {
			known[sub] = helpFlags(t, bin, sub)
		}
		for _, a := range args[1:] {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !strings.HasPrefix(a, "-") || !known[sub][name] {
				t.Errorf("%s: vipgate %s has no flag %q (want --flag=value)", kind, sub, a)
			}
		}
	}
	for _, o := range objs {
		switch o.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			o.decodeInto(t, &ds)
			check("DaemonSet", ds.Spec.Template.Spec.Containers[0].Args)
		case "Deployment":
			var d appsv1.Deployment
			o.decodeInto(t, &d)
			check("Deployment", d.Spec.Template.Spec.Containers[0].Args)
		}
	}
}

// TestDeployFlags: every flag the manifests and the chart pass to vipgate exists.
func TestDeployFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the vipgate binary")
	}
	bin := vipgateBinary(t)
	t.Run("manifests", func(t *testing.T) { checkArgs(t, bin, manifestObjects(t)) })
	t.Run("chart", func(t *testing.T) { checkArgs(t, bin, readObjects(t, renderChart(t, ""))) })
	t.Run("chart-custom", func(t *testing.T) { checkArgs(t, bin, readObjects(t, renderChart(t, deployVariants["custom"]))) })
}

// TestDeployChartMatchesManifests: with default values the chart renders the objects of
// deploy/manifests (less the Namespace, which Helm creates with --create-namespace, and the
// gateways' RBAC, which gateway.rbac.create adds), with the same RBAC rules and the same privileges.
func TestDeployChartMatchesManifests(t *testing.T) {
	man := manifestObjects(t)
	chart := readObjects(t, renderChart(t, deployVariants["gateway-manifests"]))
	for _, o := range readObjects(t, renderChart(t, "")) {
		if strings.Contains(o.Metadata.Name, "-"+componentGateway) {
			t.Errorf("the chart renders %s by default; the gateways' RBAC is gateway.rbac.create's", o.key())
		}
	}
	keys := func(objs []deployObject) []string {
		var ks []string
		for _, o := range objs {
			// The chart generates the membership key Secret; with the manifests it is created by
			// hand (kubectl create secret), never committed.
			if o.Kind != "Namespace" && !(o.Kind == "Secret" && strings.HasSuffix(o.Metadata.Name, "-memberlist")) {
				ks = append(ks, o.key())
			}
		}
		sort.Strings(ks)
		return ks
	}
	if d := cmp.Diff(keys(man), keys(chart)); d != "" {
		t.Errorf("objects (-manifests +chart):\n%s", d)
	}
	rules := func(objs []deployObject) map[string][]rbacv1.PolicyRule {
		out := map[string][]rbacv1.PolicyRule{}
		for _, o := range objs {
			switch o.Kind {
			case "ClusterRole":
				var r rbacv1.ClusterRole
				o.decodeInto(t, &r)
				out[o.key()] = r.Rules
			case "Role":
				var r rbacv1.Role
				o.decodeInto(t, &r)
				out[o.key()] = r.Rules
			}
		}
		return out
	}
	if d := cmp.Diff(rules(man), rules(chart)); d != "" {
		t.Errorf("RBAC rules (-manifests +chart):\n%s", d)
	}
	mds, _ := daemonSetOf(t, man)
	cds, _ := daemonSetOf(t, chart)
	mp, cp := mds.Spec.Template.Spec, cds.Spec.Template.Spec
	for _, c := range []struct {
		what      string
		want, got any
	}{
		{"hostNetwork", mp.HostNetwork, cp.HostNetwork},
		{"pod securityContext", mp.SecurityContext, cp.SecurityContext},
		{"container securityContext", mp.Containers[0].SecurityContext, cp.Containers[0].SecurityContext},
		{"env", mp.Containers[0].Env, cp.Containers[0].Env},
		{"tolerations", mp.Tolerations, cp.Tolerations},
		{"probes", []any{mp.Containers[0].LivenessProbe, mp.Containers[0].ReadinessProbe}, []any{cp.Containers[0].LivenessProbe, cp.Containers[0].ReadinessProbe}},
	} {
		if d := cmp.Diff(c.want, c.got); d != "" {
			t.Errorf("DaemonSet %s (-manifests +chart):\n%s", c.what, d)
		}
	}
}

// deployContainers returns the first container of the node DaemonSet and of the controller
// Deployment (nil when the controller is disabled).
func deployContainers(t *testing.T, objs []deployObject) (node, controller *corev1.Container) {
	t.Helper()
	ds, _ := daemonSetOf(t, objs)
	node = &ds.Spec.Template.Spec.Containers[0]
	for _, o := range objs {
		if o.Kind == "Deployment" {
			var d appsv1.Deployment
			o.decodeInto(t, &d)
			controller = &d.Spec.Template.Spec.Containers[0]
		}
	}
	return node, controller
}

// TestDeployImageAndProbes: both ways to deploy use the same default image, and the readiness probe
// is /readyz (503 until the first sync is in the kernel), not /healthz (healthy from start-up on).
func TestDeployImageAndProbes(t *testing.T) {
	const wantImage = "ghcr.io/vipgate/vipgate:0.2.0"
	check := func(t *testing.T, objs []deployObject) {
		node, ctrl := deployContainers(t, objs)
		if ctrl == nil {
			t.Fatal("no controller Deployment")
		}
		if node.Image != wantImage || ctrl.Image != wantImage {
			t.Errorf("images %q (node) and %q (controller), want %q", node.Image, ctrl.Image, wantImage)
		}
		if p := node.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
			t.Errorf("node readiness probe %+v, want GET /readyz", p)
		}
		if p := node.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/livez" {
			t.Errorf("node liveness probe %+v, want GET /livez", p)
		}
	}
	t.Run("manifests", func(t *testing.T) { check(t, manifestObjects(t)) })
	t.Run("chart", func(t *testing.T) { check(t, readObjects(t, renderChart(t, ""))) })
}

// TestDeployAPIServerAddress: apiServer.host puts KUBERNETES_SERVICE_HOST/PORT on the node and
// controller containers (in-cluster config then dials the API server directly, not the "kubernetes"
// ClusterIP nothing programs before vipgate runs); by default neither ways to deploy set them.
func TestDeployAPIServerAddress(t *testing.T) {
	apiEnv := func(c *corev1.Container) map[string]string {
		out := map[string]string{}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "KUBERNETES_SERVICE_") {
				out[e.Name] = e.Value
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		objs func(t *testing.T) []deployObject
		want map[string]string
	}{
		{"manifests", manifestObjects, map[string]string{}},
		{"chart-default", func(t *testing.T) []deployObject { return readObjects(t, renderChart(t, "")) }, map[string]string{}},
		{"chart-custom", func(t *testing.T) []deployObject { return readObjects(t, renderChart(t, deployVariants["custom"])) },
			map[string]string{"KUBERNETES_SERVICE_HOST": "192.0.2.10", "KUBERNETES_SERVICE_PORT": "6443"}},
		{"chart-host-only", func(t *testing.T) []deployObject {
			return readObjects(t, renderChart(t, "apiServer: {host: \"2001:db8::10\"}\n"))
		}, map[string]string{"KUBERNETES_SERVICE_HOST": "2001:db8::10", "KUBERNETES_SERVICE_PORT": "6443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, ctrl := deployContainers(t, tc.objs(t))
			if d := cmp.Diff(tc.want, apiEnv(node)); d != "" {
				t.Errorf("node env (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.want, apiEnv(ctrl)); d != "" {
				t.Errorf("controller env (-want +got):\n%s", d)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// The real API server.

// TestDeployDryRun: every manifest and the rendered chart pass a server-side dry run with strict
// field validation against a real kube-apiserver that has MetalLB's CRDs.
func TestDeployDryRun(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	root := moduleRoot(t)
	run := func(args ...string) (string, error) {
		out, err := exec.Command(kubectl, append([]string{"--kubeconfig", srv.Kubeconfig}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The namespace must exist for real: a dry run of a namespaced object in a namespace that is
	// only dry-run-created fails.
	if out, err := run("apply", "-f", filepath.Join(root, "deploy/manifests/00-namespace.yaml")); err != nil {
		t.Fatalf("creating the namespace: %v\n%s", err, out)
	}
	dryRun := func(t *testing.T, path string, wantObjects int) {
		out, err := run("apply", "--dry-run=server", "--validate=strict", "-f", path)
		if err != nil {
			t.Fatalf("kubectl apply --dry-run=server -f %s: %v\n%s", path, err, out)
		}
		if n := strings.Count(out, "(server dry run)"); n != wantObjects {
			t.Errorf("%d objects accepted, want %d:\n%s", n, wantObjects, out)
		}
		t.Logf("%s", out)
	}
	t.Run("manifests", func(t *testing.T) {
		dryRun(t, filepath.Join(root, "deploy/manifests"), len(manifestObjects(t)))
	})
	for _, name := range []string{"default", "no-controller", "custom", "gateway"} {
		t.Run("chart-"+name, func(t *testing.T) {
			out := renderChart(t, deployVariants[name])
			path := filepath.Join(t.TempDir(), "chart.yaml")
			if err := os.WriteFile(path, out, 0o600); err != nil {
				t.Fatal(err)
			}
			dryRun(t, path, len(readObjects(t, out)))
		})
	}
}

// TestDeploySystemdUnit: the gateway unit passes systemd-analyze verify and bounds the
// capabilities to those the gateway needs (TestSystemdUnitGateway runs it under them).
func TestDeploySystemdUnit(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy/systemd/vipgate-gateway.service"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"CapabilityBoundingSet": "CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_BPF CAP_PERFMON CAP_SYS_ADMIN",
		"StateDirectory":        "vipgate",
		"Restart":               "always",
		"NoNewPrivileges":       "yes",
		"ProtectSystem":         "strict",
		"ExecStart":             "/usr/local/bin/vipgate gateway --config /etc/vipgate/gateway.yaml --kubeconfig /etc/vipgate/kubeconfig",
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			got[k] = v
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if _, bad := got["PrivateNetwork"]; bad {
		t.Error("PrivateNetwork would hide the host's interfaces from the gateway")
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	// verify checks that ExecStart's binary exists: point it at one that does.
	tmp := filepath.Join(t.TempDir(), "vipgate-gateway.service")
	if err := os.WriteFile(tmp, bytes.ReplaceAll(unit, []byte("/usr/local/bin/vipgate"), []byte("/bin/true")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", tmp).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
