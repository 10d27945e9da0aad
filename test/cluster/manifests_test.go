package testcluster

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// readManifest decodes every non-empty document of a multi-document YAML file.
func readManifest(t *testing.T, path string) []unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var objs []unstructured.Unstructured
	r := k8syaml.NewYAMLReader(bufio.NewReader(f))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		var m map[string]any
		if err := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), 4096).Decode(&m); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		if len(m) == 0 {
			continue // comments only
		}
		u := unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			t.Errorf("%s: document %d lacks apiVersion, kind or metadata.name: %v", path, i, m)
		}
		objs = append(objs, u)
	}
	return objs
}

func TestManifestsDecode(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("manifests", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no manifests/*.yaml")
	}
	for _, f := range files {
		if objs := readManifest(t, f); len(objs) == 0 {
			t.Errorf("%s: no objects", f)
		}
	}
}

// TestKubeProxyManifest checks the settings E2E-NOTES.md relies on: the mode placeholder and no conntrack
// sysctl writes (every field that defaults to a write is set explicitly to "leave it").
func TestKubeProxyManifest(t *testing.T) {
	objs := readManifest(t, filepath.Join("manifests", "kube-proxy.yaml"))
	kinds := map[string]unstructured.Unstructured{}
	for _, o := range objs {
		kinds[o.GetKind()] = o
	}
	for _, k := range []string{"ServiceAccount", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if _, ok := kinds[k]; !ok {
			t.Errorf("no %s", k)
		}
	}
	cm := kinds["ConfigMap"]
	conf, _, _ := unstructured.NestedString(cm.Object, "data", "config.conf")
	var kpc map[string]any
	if err := yaml.UnmarshalStrict([]byte(conf), &kpc); err != nil {
		t.Fatalf("config.conf: %v", err)
	}
	// The harness fills in the mode (Spec.KubeProxyMode: nftables or iptables).
	if kpc["kind"] != "KubeProxyConfiguration" || kpc["mode"] != "KUBE_PROXY_MODE" || kpc["clusterCIDR"] != "10.244.0.0/16" {
		t.Errorf("config.conf: wrong kind, mode or clusterCIDR: %v", kpc)
	}
	ct, _ := kpc["conntrack"].(map[string]any)
	for field, want := range map[string]any{
		"maxPerCore": float64(0), "min": float64(0),
		"tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s", "udpTimeout": "0s", "udpStreamTimeout": "0s",
		"tcpBeLiberal": false,
	} {
		if got, ok := ct[field]; !ok || got != want {
			t.Errorf("conntrack.%s = %v (set: %v), want %v", field, got, ok, want)
		}
	}
	kc, _, _ := unstructured.NestedString(cm.Object, "data", "kubeconfig.conf")
	if !strings.Contains(kc, "server: APISERVER_URL") {
		t.Error("kubeconfig.conf lacks the APISERVER_URL placeholder")
	}
	ds := kinds["DaemonSet"]
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("DaemonSet containers: %v", containers)
	}
	c := containers[0].(map[string]any)
	if c["image"] != "registry.k8s.io/kube-proxy:v1.36.3" {
		t.Errorf("image %v", c["image"])
	}
	if hn, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Error("DaemonSet is not hostNetwork")
	}
	if l, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "metadata", "labels", "k8s-app"); l != "kube-proxy" {
		t.Error("pods lack k8s-app=kube-proxy (the e2e restart test looks for it)")
	}
}
