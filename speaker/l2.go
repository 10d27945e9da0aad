package speaker

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/cluster"
)

type metallbv1beta1L2 = metallbv1beta1.L2Advertisement

// L2Input is everything the L2 decision depends on.
type L2Input struct {
	// Self is this host's node name.
	Self string
	// Live says which members are alive (Self included). Quorum is true when Self sees enough of the
	// members to act (see Members): without it this host announces nothing.
	Live   map[string]bool
	Quorum bool
	// DefaultInterface answers when an L2Advertisement names no interfaces.
	DefaultInterface string
	State            *cluster.State
}

// VIPDecision is the outcome for one LoadBalancer IP, for status and tests.
type VIPDecision struct {
	IP      netip.Addr
	Service cluster.ServiceKey
	// Owner is the node that announces the IP ("" when no node may).
	Owner      string
	Interfaces []string
	Reason     string
}

// DecideL2 decides, for every LoadBalancer IP, which live node announces it, and returns the IPs Self
// owns with their interfaces. The owner is the candidate with the highest sha256(node "#" ip)
// (rendezvous hashing): every node computes the same owner from the same inputs, IPs spread over the
// nodes, and when a node goes away only its IPs move. With externalTrafficPolicy Local only nodes
// with a ready local endpoint are candidates, so traffic is never sent to a node that would drop it.
func DecideL2(in L2Input) (owned map[netip.Addr][]string, decisions []VIPDecision) {
	owned = map[netip.Addr][]string{}
	st := in.State
	if st == nil || st.MetalLB == nil || len(st.MetalLB.L2Advertisements) == 0 {
		return owned, nil
	}
	keys := make([]cluster.ServiceKey, 0, len(st.Services))
	for k, svc := range st.Services {
		if svc.Type == cluster.TypeLoadBalancer && len(svc.LoadBalancerIPs) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	nodes := make([]string, 0, len(st.Nodes))
	for n := range st.Nodes {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, k := range keys {
		svc := st.Services[k]
		withEndpoints := readyNodes(st.EndpointSlices[k])
		for _, ip := range svc.LoadBalancerIPs {
			d := VIPDecision{IP: ip, Service: k}
			pool := poolFor(st.MetalLB.IPAddressPools, ip)
			if pool == nil {
				d.Reason = "no IPAddressPool contains this IP"
				decisions = append(decisions, d)
				continue
			}
			ads := l2AdsFor(st.MetalLB.L2Advertisements, pool)
			if len(ads) == 0 {
				d.Reason = fmt.Sprintf("pool %s has no L2Advertisement", pool.Name)
				decisions = append(decisions, d)
				continue
			}
			var best string
			var bestHash [32]byte
			for _, n := range nodes {
				node := st.Nodes[n]
				if !in.Live[n] || !nodeEligible(ads, node) {
					continue
				}
				if svc.ExternalPolicyLocal && !withEndpoints[n] {
					continue
				}
				h := sha256.Sum256([]byte(n + "#" + ip.String()))
				if best == "" || slices.Compare(h[:], bestHash[:]) > 0 {
					best, bestHash = n, h
				}
			}
			d.Owner = best
			switch {
			case best == "":
				d.Reason = "no live eligible node"
				if svc.ExternalPolicyLocal {
					d.Reason = "no live eligible node with a ready local endpoint"
				}
			case best == in.Self && !in.Quorum:
				d.Reason = "this node does not see a majority of the members: not announcing"
			case best == in.Self:
				d.Interfaces = interfacesFor(ads, st.Nodes[in.Self], in.DefaultInterface)
				owned[ip] = d.Interfaces
			}
			decisions = append(decisions, d)
		}
	}
	return owned, decisions
}

// readyNodes lists the nodes that hold a ready endpoint of the Service.
func readyNodes(slices_ []*cluster.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			if ep.Ready && ep.NodeName != "" {
				out[ep.NodeName] = true
			}
		}
	}
	return out
}

func nodeEligible(ads []*metallbv1beta1L2, node *cluster.Node) bool {
	for _, ad := range ads {
		if selects(ad.Spec.NodeSelectors, node.Labels) {
			return true
		}
	}
	return false
}

func interfacesFor(ads []*metallbv1beta1L2, node *cluster.Node, def string) []string {
	var out []string
	for _, ad := range ads {
		if node != nil && !selects(ad.Spec.NodeSelectors, node.Labels) {
			continue
		}
		if len(ad.Spec.Interfaces) == 0 {
			out = append(out, def)
			continue
		}
		out = append(out, ad.Spec.Interfaces...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
