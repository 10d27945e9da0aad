package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// TestDeployManifestsDryRun: every manifest in deploy/manifests and the Helm chart's rendered output
// pass `kubectl apply --dry-run=server` against a real kube-apiserver with MetalLB's CRDs installed.
//
// No helm binary is available here, so the chart is rendered with Go's text/template: the chart uses
// only .Values, .Release.Namespace and `if`, which Helm renders the same way.
func TestDeployManifestsDryRun(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	srv.InstallMetalLBCRDs(t)
	root, err := lab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) (string, error) {
		out, err := exec.Command("kubectl", append([]string{"--kubeconfig", srv.Kubeconfig}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The namespace exists for real (namespaced dry-runs need it), everything else is a dry run.
	if out, err := kubectl("apply", "-f", filepath.Join(root, "deploy/manifests/00-namespace.yaml")); err != nil {
		t.Fatalf("creating the namespace: %v\n%s", err, out)
	}
	out, err := kubectl("apply", "--dry-run=server", "-f", filepath.Join(root, "deploy/manifests"))
	if err != nil {
		t.Fatalf("deploy/manifests: %v\n%s", err, out)
	}
	t.Logf("deploy/manifests (server dry run):\n%s", out)

	chart := filepath.Join(root, "deploy/helm/vipgate")
	raw, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	for _, controller := range []bool{true, false} {
		values["controller"].(map[string]any)["enabled"] = controller
		data := map[string]any{"Values": values, "Release": map[string]any{"Namespace": "vipgate-system", "Name": "vipgate"}}
		files, _ := filepath.Glob(filepath.Join(chart, "templates", "*.yaml"))
		var rendered bytes.Buffer
		for _, f := range files {
			tpl, err := template.New(filepath.Base(f)).Option("missingkey=error").ParseFiles(f)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := tpl.Execute(&b, data); err != nil {
				t.Fatalf("rendering %s: %v", f, err)
			}
			if s := strings.TrimSpace(b.String()); s != "" {
				rendered.WriteString("---\n" + s + "\n")
			}
		}
		path := filepath.Join(t.TempDir(), "chart.yaml")
		if err := os.WriteFile(path, rendered.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := kubectl("apply", "--dry-run=server", "-f", path)
		if err != nil {
			t.Fatalf("Helm chart (controller.enabled=%v): %v\n%s\n%s", controller, err, out, rendered.String())
		}
		if controller != strings.Contains(out, "vipgate-controller") {
			t.Errorf("controller.enabled=%v but the output says:\n%s", controller, out)
		}
	}
}
