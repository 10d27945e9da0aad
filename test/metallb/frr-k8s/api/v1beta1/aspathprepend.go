package v1beta1

// AsPathPrependPrefixes is a list of prefixes announced with their AS path prepended, as frr-k8s
// v0.0.27 (which the module proxy this is built from does not serve) declares it. Added by
// vipgate's test/metallb (see its README): MetalLB v0.16.2 compiles against it and uses it in
// FRR-K8s mode only, never in native BGP mode.
type AsPathPrependPrefixes struct {
	Prefixes      []string `json:"prefixes,omitempty"`
	AsPathPrepend uint8    `json:"asPathPrepend,omitempty"`
}

// DeepCopyInto copies the receiver into out.
func (in *AsPathPrependPrefixes) DeepCopyInto(out *AsPathPrependPrefixes) {
	*out = *in
	if in.Prefixes != nil {
		out.Prefixes = append([]string(nil), in.Prefixes...)
	}
}
