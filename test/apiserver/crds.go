package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/test/lab"
)

// MetalLBModule is the module whose CRDs InstallMetalLBCRDs applies (the version is go.mod's).
const MetalLBModule = "go.universe.tf/metallb"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallMetalLBCRDs applies MetalLB's CRDs (config/crd/bases of the go.universe.tf/metallb module
// in the Go module cache, the version go.mod requires) and waits until the API server serves them.
func (s *Server) InstallMetalLBCRDs(t testing.TB) {
	t.Helper()
	crds, err := MetalLBCRDs(t.Logf)
	if err != nil {
		t.Fatalf("reading MetalLB CRDs: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var names []string
	for _, crd := range crds {
		_, err := s.Dynamic.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, name := range names {
		err := s.waitFor(func(ctx context.Context) error {
			crd, err := s.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not established yet", name)
		})
		if err != nil {
			t.Fatalf("waiting for CRD %s: %v", name, err)
		}
	}
	// Established means the API server accepts requests; discovery (which informers and RESTMappers
	// read) follows a moment later.
	for _, gv := range []string{"metallb.io/v1beta1", "metallb.io/v1beta2"} {
		if err := s.waitFor(func(context.Context) error {
			_, err := s.Client.Discovery().ServerResourcesForGroupVersion(gv)
			return err
		}); err != nil {
			t.Fatalf("waiting for %s in discovery: %v", gv, err)
		}
	}
	t.Logf("installed %d MetalLB CRDs", len(names))
}

// MetalLBCRDs reads MetalLB's CRDs (config/crd/bases of the go.universe.tf/metallb module in the Go
// module cache, the version go.mod requires), with fixInt32Maximums applied; logf (may be nil)
// hears about each fix.
func MetalLBCRDs(logf func(string, ...any)) ([]*unstructured.Unstructured, error) {
	dir, err := metallbCRDDir()
	if err != nil {
		return nil, fmt.Errorf("finding MetalLB CRDs: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no MetalLB CRDs in %s (%v)", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f, err)
		}
		for _, crd := range objs {
			if crd.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if fixed := fixInt32Maximums(crd.Object, ""); len(fixed) > 0 && logf != nil {
				logf("CRD %s: dropped format int32 from %v (maximum beyond int32; this kube-apiserver refuses every value there)", crd.GetName(), fixed)
			}
			out = append(out, crd)
		}
	}
	return out, nil
}

// fixInt32Maximums removes `format: int32` from integer schemas whose maximum does not fit an int32,
// and returns their paths. MetalLB v0.15.2 declares its uint32 ASN fields (BGPPeer myASN, peerASN)
// that way, and kube-apiserver v1.36 then rejects *every* value of the field ("Maximum boundary
// value must be of type integer with format int32"), so BGPPeers could not be created at all. The
// fix keeps the 0-4294967295 range check. MetalLB v0.16.1's CRDs no longer declare it (the fix finds
// nothing there); it stays for older versions. v0.16.1's config/crd/bases also carries the status
// CRDs (servicel2statuses, servicebgpstatuses, configurationstates), installed with the rest.
func fixInt32Maximums(node any, path string) []string {
	var fixed []string
	switch n := node.(type) {
	case map[string]any:
		if n["type"] == "integer" && n["format"] == "int32" {
			if max, ok := n["maximum"].(int64); ok && max > math.MaxInt32 {
				delete(n, "format")
				fixed = append(fixed, path)
			} else if max, ok := n["maximum"].(float64); ok && max > math.MaxInt32 {
				delete(n, "format")
				fixed = append(fixed, path)
			}
		}
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fixed = append(fixed, fixInt32Maximums(n[k], path+"."+k)...)
		}
	case []any:
		for i, v := range n {
			fixed = append(fixed, fixInt32Maximums(v, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return fixed
}

// metallbCRDDir locates config/crd/bases of the MetalLB module with `go list -m`.
func metallbCRDDir() (string, error) {
	cmd := exec.Command(lab.GoBinary(), "list", "-m", "-f", "{{.Dir}}", MetalLBModule)
	if _, file, _, ok := runtime.Caller(0); ok {
		cmd.Dir = filepath.Dir(file) // inside the vipgate module, whose go.mod pins the version
	}
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("go list -m %s: %w: %s", MetalLBModule, err, ee.Stderr)
		}
		return "", fmt.Errorf("go list -m %s: %w", MetalLBModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s is not in the module cache (run `go mod download %s`)", MetalLBModule, MetalLBModule)
	}
	return filepath.Join(dir, "config", "crd", "bases"), nil
}

// readObjects reads every document of a YAML file as an unstructured object.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
}
