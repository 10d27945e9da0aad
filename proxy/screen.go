package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// AddressScreen decides which external IPs and LoadBalancer IPs of a Service may become entries on
// this node (the NodeConfig's externalIPs policy). The Service's cluster IPs are the API server's
// to allocate and are never screened here; special addresses never got this far (the sources reject
// the object, see cluster.SpecialAddrClass).
type AddressScreen struct {
	Policy       cluster.ExternalIPPolicy
	ServiceCIDRs []netip.Prefix
	ClusterCIDRs []netip.Prefix
	// NodeAddrs are the addresses of the nodes: this node's (config and NodePort addresses) and
	// every Node the source knows.
	NodeAddrs map[netip.Addr]bool
}

// ExternalIPsOffReason is the refusal of every spec.externalIPs address on a node whose
// externalIPs.allowedCIDRs is empty, the default: Kubernetes deprecated externalIPs (KEP-5707), and
// future conformance expects a service proxy not to support them unless told to, as the API
// server's DenyServiceExternalIPs admission refuses them all.
const ExternalIPsOffReason = "externalIPs are off on this node (deprecated, KEP-5707): vipgate programs them only inside the NodeConfig's externalIPs.allowedCIDRs, which is empty"

// refuse says why address a may not be an entry ("" if it may); external is true for
// spec.externalIPs, false for a LoadBalancer IP.
func (s *AddressScreen) refuse(a netip.Addr, external bool) string {
	if s == nil {
		return ""
	}
	if class := cluster.SpecialAddrClass(a); class != "" {
		// The sources reject these objects already; kept here so that no path can program one.
		return "a special address (" + class + ") is never a Service entry"
	}
	if external && !slices.ContainsFunc(s.Policy.AllowedCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
		if len(s.Policy.AllowedCIDRs) == 0 {
			return ExternalIPsOffReason
		}
		return fmt.Sprintf("outside externalIPs.allowedCIDRs %v", s.Policy.AllowedCIDRs)
	}
	if !s.Policy.AllowNodeIPs && s.NodeAddrs[a] {
		return "it is a node's address (allow with externalIPs.allowNodeIPs)"
	}
	if !s.Policy.AllowClusterCIDRs {
		for _, l := range []struct {
			what     string
			prefixes []netip.Prefix
		}{{"the service CIDR", s.ServiceCIDRs}, {"the cluster (pod) CIDR", s.ClusterCIDRs}} {
			for _, p := range l.prefixes {
				if p.Contains(a) {
					return fmt.Sprintf("inside %s %s (allow with externalIPs.allowClusterCIDRs)", l.what, p)
				}
			}
		}
	}
	return ""
}

// screen returns the addresses of in (already of one family) that may be entries, and records the
// others in refused.
func (s *AddressScreen) screen(in []netip.Addr, external bool, refused *[]dataplane.Refusal) []netip.Addr {
	if s == nil || len(in) == 0 {
		return in
	}
	out := in[:0:0]
	for _, a := range in {
		if why := s.refuse(a, external); why != "" {
			field := "status.loadBalancer.ingress"
			if external {
				field = "spec.externalIPs"
			}
			*refused = append(*refused, dataplane.Refusal{Field: field, Addr: a, Reason: why})
			continue
		}
		out = append(out, a)
	}
	return out
}
