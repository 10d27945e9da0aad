package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
)

// TestMetalLBV016Examples: every MetalLB object in MetalLB's own examples of go.mod's version
// (configsamples/*.yaml and the ```yaml blocks of the website's configuration pages) decodes
// through the file source's strict decoder, and v0.16's new fields land in the typed objects:
// serviceSelectors on L2/BGP advertisements, localASN on BGPPeer. Kinds vipgate does not read
// (FRR-K8s' FRRConfiguration, apps/v1 Deployments of the samples) are skipped.
func TestMetalLBV016Examples(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.universe.tf/metallb").Output()
	if err != nil {
		t.Skipf("MetalLB module not in the module cache: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	var docs []struct{ src, doc string }
	samples, _ := filepath.Glob(filepath.Join(dir, "configsamples", "*.yaml"))
	pages, _ := filepath.Glob(filepath.Join(dir, "website", "content", "configuration", "*.md"))
	fence := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	for _, f := range append(samples, pages...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks := [][]byte{data}
		if strings.HasSuffix(f, ".md") {
			blocks = nil
			for _, m := range fence.FindAllSubmatch(data, -1) {
				blocks = append(blocks, m[1])
			}
		}
		for _, b := range blocks {
			parts, err := splitDocuments(b)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, p := range parts {
				docs = append(docs, struct{ src, doc string }{filepath.Base(f), string(p)})
			}
		}
	}
	var n, selectors, localASN int
	for _, d := range docs {
		if !strings.Contains(d.doc, "apiVersion: metallb.io/") || strings.Contains(d.doc, "kind: FRRConfiguration") ||
			strings.Contains(d.doc, "kind: ServiceL2Status") || strings.Contains(d.doc, "kind: ServiceBGPStatus") ||
			strings.Contains(d.doc, "kind: ConfigurationState") {
			continue
		}
		for _, got := range decodeDocument([]byte(d.doc)) {
			if got.err != nil {
				t.Errorf("%s: %s %s: %v\n%s", d.src, got.kind, got.name, got.err, d.doc)
				continue
			}
			n++
			switch o := got.metallb.(type) {
			case *metallbv1beta1.L2Advertisement:
				selectors += len(o.Spec.ServiceSelectors)
			case *metallbv1beta1.BGPAdvertisement:
				selectors += len(o.Spec.ServiceSelectors)
			case *metallbv1beta2.BGPPeer:
				if o.Spec.LocalASN != 0 {
					localASN++
				}
			}
		}
	}
	t.Logf("%d MetalLB objects decoded from %d example documents; %d serviceSelectors, %d peers with localASN", n, len(docs), selectors, localASN)
	if n == 0 || selectors < 4 || localASN < 1 {
		t.Errorf("expected MetalLB v0.16's examples (the website's serviceSelectors pairs and the localASN peer): %d objects, %d serviceSelectors, %d localASN", n, selectors, localASN)
	}
}
