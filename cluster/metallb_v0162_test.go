package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vipgate/vipgate/test/apiserver"
)

// TestValidateMetalLBv0162 checks the bounds of MetalLB v0.16.2's new fields as a manifest
// directory reads them (no CRD schema there): a bad object is refused with the field's name.
func TestValidateMetalLBv0162(t *testing.T) {
	for _, c := range []struct {
		kind, spec string
		err        string // "" = accepted
	}{
		{"BGPAdvertisement", `{"asPathPrepend": 3}`, ""},
		{"BGPAdvertisement", `{}`, ""},
		{"BGPAdvertisement", `{"asPathPrepend": 11}`, "spec.asPathPrepend: 11 is outside 1-10"},
		{"BGPAdvertisement", `{"asPathPrepend": 300}`, "asPathPrepend"}, // not a uint8: does not decode
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 50, "preference": {"matchLabels": {"zone": "a"}}}]}`, ""},
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 100, "preference": {}}]}`, ""},
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 0, "preference": {}}]}`, "spec.preferredNodeSelectors[0].weight: 0 is outside 1-100"},
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 1, "preference": {}}, {"weight": 101, "preference": {}}]}`, "spec.preferredNodeSelectors[1].weight: 101"},
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "Near"}]}}]}`,
			`spec.preferredNodeSelectors[0].preference: not a label selector: "Near" is not a valid label selector operator`},
		{"L2Advertisement", `{"preferredNodeSelectors": [{"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}]}`,
			"spec.preferredNodeSelectors[0].preference: not a label selector"},
	} {
		js := `{"apiVersion": "metallb.io/v1beta1", "kind": "` + c.kind + `", "metadata": {"name": "x", "namespace": "metallb-system"}, "spec": ` + c.spec + `}`
		_, err := decodeMetalLB([]byte(js), c.kind, metallbV1beta1Kinds)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s %s: %v, want accepted", c.kind, c.spec, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s %s: %v, want an error with %q", c.kind, c.spec, err, c.err)
		}
	}
}

// TestKubeSourceMetalLBv0162 runs the node's Kubernetes source against a real kube-apiserver
// serving MetalLB v0.16.2's CRDs (test/apiserver installs them from the module this one
// requires): asPathPrepend and preferredNodeSelectors reach the State (a v0.16.1 CRD would have
// pruned them), the API server itself refuses the values outside the CRD's bounds, and an
// L2Advertisement whose preference does not parse — which no CRD schema catches — is refused
// alone: listed in State.Rejected with a Warning Event "Rejected" on it, while the others are read.
func TestKubeSourceMetalLBv0162(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustFor(t)
	obj := func(kind, name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metallb.io/v1beta1", "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": "default"}, "spec": spec}}
	}
	l2ads := srv.Dynamic.Resource(metallbKinds[1].gvr).Namespace("default")
	bgpads := srv.Dynamic.Resource(metallbKinds[2].gvr).Namespace("default")
	must(srv.Dynamic.Resource(metallbKinds[0].gvr).Namespace("default").Create(ctx,
		obj("IPAddressPool", "lan", map[string]any{"addresses": []any{"203.0.113.0/28"}}), metav1.CreateOptions{}))
	must(bgpads.Create(ctx, obj("BGPAdvertisement", "prepend", map[string]any{"asPathPrepend": int64(3)}), metav1.CreateOptions{}))
	must(l2ads.Create(ctx, obj("L2Advertisement", "prefer-a", map[string]any{"preferredNodeSelectors": []any{
		map[string]any{"weight": int64(50), "preference": map[string]any{"matchLabels": map[string]any{"zone": "a"}}}}}), metav1.CreateOptions{}))
	must(l2ads.Create(ctx, obj("L2Advertisement", "badsel", map[string]any{"preferredNodeSelectors": []any{
		map[string]any{"weight": int64(5), "preference": map[string]any{"matchExpressions": []any{
			map[string]any{"key": "zone", "operator": "Near"}}}}}}), metav1.CreateOptions{}))

	// The CRD's own bounds: the API server refuses these before vipgate sees them.
	for _, c := range []struct {
		name string
		res  interface {
			Create(context.Context, *unstructured.Unstructured, metav1.CreateOptions, ...string) (*unstructured.Unstructured, error)
		}
		o *unstructured.Unstructured
	}{
		{"asPathPrepend 11", bgpads, obj("BGPAdvertisement", "prepend11", map[string]any{"asPathPrepend": int64(11)})},
		{"weight 101", l2ads, obj("L2Advertisement", "heavy", map[string]any{"preferredNodeSelectors": []any{
			map[string]any{"weight": int64(101), "preference": map[string]any{}}}})},
	} {
		if _, err := c.res.Create(ctx, c.o, metav1.CreateOptions{}); err == nil {
			t.Errorf("%s: created; want the API server (MetalLB v0.16.2's CRD) to refuse it", c.name)
		} else {
			t.Logf("%s: refused by the API server: %v", c.name, err)
		}
	}

	src := NewKubeSource(srv.RESTConfig(), "node1", hclog.New(&hclog.LoggerOptions{Name: "kube", Level: hclog.Info, Output: testWriter{t}}))
	rec := runTestSource(t, ctx, src)
	st := rec.wait(t, "the v0.16.2 objects", func(st *State) bool {
		return st.MetalLB != nil && len(st.MetalLB.L2Advertisements) == 1 && len(st.MetalLB.BGPAdvertisements) == 1
	})
	if got := st.MetalLB.BGPAdvertisements[0].Spec.AsPathPrepend; got != 3 {
		t.Errorf("BGPAdvertisement prepend: asPathPrepend %d, want 3 (pruned by an older CRD?)", got)
	}
	want := []metallbv1beta1.PreferredNodeSelector{{Weight: 50, Preference: metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}}}
	if ad := st.MetalLB.L2Advertisements[0]; ad.Name != "prefer-a" || len(ad.Spec.PreferredNodeSelectors) != 1 ||
		ad.Spec.PreferredNodeSelectors[0].Weight != want[0].Weight || ad.Spec.PreferredNodeSelectors[0].Preference.MatchLabels["zone"] != "a" {
		t.Errorf("L2Advertisement %s: preferredNodeSelectors %+v, want %+v", ad.Name, ad.Spec.PreferredNodeSelectors, want)
	}
	var rejected *Rejection
	for i, r := range st.Rejected {
		if r.Object == "default/badsel" {
			rejected = &st.Rejected[i]
		}
	}
	if rejected == nil || rejected.Kind != "L2Advertisement" || !strings.Contains(rejected.Reason, "spec.preferredNodeSelectors[0].preference") {
		t.Fatalf("Rejected %+v, want L2Advertisement default/badsel with its preference's reason", st.Rejected)
	}
	ev := waitEvent(t, ctx, srv.Client, "badsel")
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "L2Advertisement" || !strings.Contains(ev.Message, "preferredNodeSelectors[0].preference") {
		t.Errorf("event %+v", ev)
	}
	t.Logf("rejected alone: %s (Event: %s)", rejected.Reason, ev.Message)
}
