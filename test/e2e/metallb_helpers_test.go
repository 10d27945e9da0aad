package e2e

import (
	"fmt"
	"strings"
)

// metallbDoc is a MetalLB object in metallb-system: kind (BGPPeer is v1beta2, the others v1beta1),
// name and its spec, as YAML lines (indented here) or one flow mapping ("{...}").
func metallbDoc(kind, name, spec string) string {
	version := "v1beta1"
	if kind == "BGPPeer" {
		version = "v1beta2"
	}
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "{") {
		spec = " " + spec + "\n"
	} else {
		spec = "\n  " + strings.ReplaceAll(spec, "\n", "\n  ") + "\n"
	}
	return fmt.Sprintf("apiVersion: metallb.io/%s\nkind: %s\nmetadata: {name: %s, namespace: metallb-system}\nspec:%s", version, kind, name, spec)
}
