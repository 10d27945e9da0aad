package e2e

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestDeployGrafanaDashboard renders the chart with grafanaDashboard.enabled and checks the
// ConfigMap Grafana's dashboard sidecar loads: the sidecar's label, the namespace asked for, and the
// dashboard byte for byte as deploy/helm/vipgate/dashboards/vipgate.json (the one copy; its metrics
// are checked by deploy/grafana). Off by default: nothing is rendered.
func TestDeployGrafanaDashboard(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy/helm/vipgate/dashboards/vipgate.json"))
	if err != nil {
		t.Fatal(err)
	}
	find := func(objs []deployObject) *deployObject {
		for i, o := range objs {
			if o.Kind == "ConfigMap" && o.Metadata.Name == "vipgate-grafana-dashboard" {
				return &objs[i]
			}
		}
		return nil
	}
	t.Run("default-off", func(t *testing.T) {
		if o := find(readObjects(t, renderChart(t, ""))); o != nil {
			t.Errorf("the dashboard ConfigMap is rendered by default")
		}
	})
	t.Run("enabled", func(t *testing.T) {
		o := find(readObjects(t, renderChart(t, "grafanaDashboard:\n  enabled: true\n  namespace: monitoring\n  annotations: {grafana_folder: vipgate}\n")))
		if o == nil {
			t.Fatal("no ConfigMap vipgate-grafana-dashboard with grafanaDashboard.enabled")
		}
		var cm corev1.ConfigMap
		o.decodeInto(t, &cm)
		if cm.Namespace != "monitoring" || cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "vipgate" {
			t.Errorf("namespace %q, labels %v, annotations %v: want monitoring, grafana_dashboard=1, grafana_folder=vipgate", cm.Namespace, cm.Labels, cm.Annotations)
		}
		if got := cm.Data["vipgate.json"]; got+"\n" != string(want) {
			t.Errorf("the ConfigMap's vipgate.json (%d bytes) differs from dashboards/vipgate.json (%d bytes)", len(got), len(want))
		}
	})
}
