package cluster

import (
	"fmt"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The bounds MetalLB v0.16.2's CRDs put on its new fields (kubebuilder markers of
// api/v1beta1): BGPAdvertisement asPathPrepend 1-10 (0: unset), L2Advertisement
// preferredNodeSelectors[].weight 1-100.
const (
	maxASPathPrepend   = 10
	minPreferredWeight = 1
	maxPreferredWeight = 100
)

// validateMetalLB checks the fields of a MetalLB object that vipgate reads and that the API server
// may not have checked for it: a manifest directory has no CRD schema, and a label selector's
// operators and values are checked by nobody until it is parsed. An object that fails is refused
// alone (State.Rejected, a log line and a Warning Event "Rejected" on it), the others keep working;
// MetalLB would refuse its whole configuration instead. nil for every kind without such fields.
func validateMetalLB(obj metav1.Object) error {
	switch o := obj.(type) {
	case *metallbv1beta1.BGPAdvertisement:
		// uint8: a value above 255 does not decode at all.
		if p := o.Spec.AsPathPrepend; p > maxASPathPrepend {
			return fmt.Errorf("spec.asPathPrepend: %d is outside 1-%d (the number of times the AS number is prepended; 0 or unset: none)", p, maxASPathPrepend)
		}
	case *metallbv1beta1.L2Advertisement:
		for i, p := range o.Spec.PreferredNodeSelectors {
			f := fmt.Sprintf("spec.preferredNodeSelectors[%d]", i)
			if p.Weight < minPreferredWeight || p.Weight > maxPreferredWeight {
				return fmt.Errorf("%s.weight: %d is outside %d-%d", f, p.Weight, minPreferredWeight, maxPreferredWeight)
			}
			if _, err := metav1.LabelSelectorAsSelector(&o.Spec.PreferredNodeSelectors[i].Preference); err != nil {
				return fmt.Errorf("%s.preference: not a label selector: %w", f, err)
			}
		}
	}
	return nil
}
