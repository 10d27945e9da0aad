package cluster

import (
	"cmp"
	"slices"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MetalLBConfig holds the MetalLB configuration objects of a snapshot, as MetalLB's own API types so
// that a cluster's existing MetalLB manifests work unchanged. Each slice is sorted by namespace/name.
// The objects are decoded strictly but not yet validated; they are shared between snapshots and must
// not be modified.
type MetalLBConfig struct {
	IPAddressPools    []*metallbv1beta1.IPAddressPool
	L2Advertisements  []*metallbv1beta1.L2Advertisement
	BGPAdvertisements []*metallbv1beta1.BGPAdvertisement
	Communities       []*metallbv1beta1.Community
	BFDProfiles       []*metallbv1beta1.BFDProfile
	BGPPeers          []*metallbv1beta2.BGPPeer
	// Secrets are the basic-auth Secrets BGPPeers' passwordSecret may name (file source).
	Secrets []*corev1.Secret
}

// IsEmpty reports whether the configuration holds no object at all.
func (c *MetalLBConfig) IsEmpty() bool {
	return c == nil || len(c.IPAddressPools)+len(c.L2Advertisements)+len(c.BGPAdvertisements)+
		len(c.Communities)+len(c.BFDProfiles)+len(c.BGPPeers)+len(c.Secrets) == 0
}

// add appends one decoded MetalLB object to the slice of its kind; other types are ignored.
func (c *MetalLBConfig) add(obj metav1.Object) {
	switch o := obj.(type) {
	case *metallbv1beta1.IPAddressPool:
		c.IPAddressPools = append(c.IPAddressPools, o)
	case *metallbv1beta1.L2Advertisement:
		c.L2Advertisements = append(c.L2Advertisements, o)
	case *metallbv1beta1.BGPAdvertisement:
		c.BGPAdvertisements = append(c.BGPAdvertisements, o)
	case *metallbv1beta1.Community:
		c.Communities = append(c.Communities, o)
	case *metallbv1beta1.BFDProfile:
		c.BFDProfiles = append(c.BFDProfiles, o)
	case *metallbv1beta2.BGPPeer:
		c.BGPPeers = append(c.BGPPeers, o)
	case *corev1.Secret:
		c.Secrets = append(c.Secrets, o)
	}
}

// sort orders every slice by namespace/name so that snapshots compare independently of input order.
func (c *MetalLBConfig) sort() {
	sortByName(c.IPAddressPools)
	sortByName(c.L2Advertisements)
	sortByName(c.BGPAdvertisements)
	sortByName(c.Communities)
	sortByName(c.BFDProfiles)
	sortByName(c.BGPPeers)
	sortByName(c.Secrets)
}

// equal reports whether both configurations hold the very same objects (pointer identity).
func (c *MetalLBConfig) equal(o *MetalLBConfig) bool {
	if c == nil || o == nil {
		return c == o
	}
	return slices.Equal(c.IPAddressPools, o.IPAddressPools) &&
		slices.Equal(c.L2Advertisements, o.L2Advertisements) &&
		slices.Equal(c.BGPAdvertisements, o.BGPAdvertisements) &&
		slices.Equal(c.Communities, o.Communities) &&
		slices.Equal(c.BFDProfiles, o.BFDProfiles) &&
		slices.Equal(c.BGPPeers, o.BGPPeers) &&
		slices.Equal(c.Secrets, o.Secrets)
}

func sortByName[T metav1.Object](s []T) {
	slices.SortStableFunc(s, func(a, b T) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
}
