package speaker

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// BGPInput is everything the BGP decision depends on.
type BGPInput struct {
	Self  string
	State *cluster.State
}

// Problem is an object the decision could not use, and why.
type Problem struct{ Object, Reason string }

// DecideBGP turns the MetalLB BGPPeers and BGPAdvertisements of the State into this node's BGP
// sessions and advertisements:
//   - peers: every BGPPeer whose nodeSelectors match this node (MetalLB v1beta2 fields);
//   - routes: every LoadBalancer IP in a pool that a BGPAdvertisement selects, when the
//     advertisement's nodeSelectors match this node and, for externalTrafficPolicy Local, this node
//     has a ready endpoint of the Service (eTP=Cluster: every eligible node advertises, so the router
//     spreads flows over them by ECMP; eTP=Local: a node withdraws as soon as its last endpoint goes).
//
// Prefixes are the IP with the advertisement's aggregationLength(V6) (default /32, /128);
// advertisements of the same prefix are merged (highest localPref, union of communities and peers).
func DecideBGP(in BGPInput) ([]bgp.PeerConfig, []bgp.Advertisement, []VIPDecision, []Problem) {
	st := in.State
	if st == nil || st.MetalLB == nil {
		return nil, nil, nil, nil
	}
	var problems []Problem
	self := st.Nodes[in.Self]
	var selfLabels map[string]string
	if self != nil {
		selfLabels = self.Labels
	}
	bfd := map[string]*metallbv1beta1.BFDProfile{}
	for _, p := range st.MetalLB.BFDProfiles {
		bfd[p.Name] = p
	}
	var peers []bgp.PeerConfig
	for _, p := range st.MetalLB.BGPPeers {
		if !selects(p.Spec.NodeSelectors, selfLabels) {
			continue
		}
		name := p.Namespace + "/" + p.Name
		addr, err := netip.ParseAddr(p.Spec.Address)
		if err != nil || p.Spec.MyASN == 0 || p.Spec.ASN == 0 {
			problems = append(problems, Problem{"BGPPeer " + name, fmt.Sprintf("peerAddress %q, myASN %d, peerASN %d: need an address and non-zero ASNs", p.Spec.Address, p.Spec.MyASN, p.Spec.ASN)})
			continue
		}
		password, reason := peerPassword(p, st.MetalLB.Secrets)
		if reason != "" {
			problems = append(problems, Problem{"BGPPeer " + name, reason + "; not peering"})
			continue
		}
		pc := bgp.PeerConfig{Name: name, MyASN: p.Spec.MyASN, PeerASN: p.Spec.ASN, PeerAddress: addr, PeerPort: p.Spec.Port,
			EBGPMultiHop: p.Spec.EBGPMultiHop, Password: password, GracefulRestart: p.Spec.EnableGracefulRestart}
		if a, err := netip.ParseAddr(p.Spec.SrcAddress); err == nil {
			pc.SourceAddress = a
		}
		if a, err := netip.ParseAddr(p.Spec.RouterID); err == nil {
			pc.RouterID = a
		}
		if p.Spec.HoldTime != nil {
			pc.HoldTime = p.Spec.HoldTime.Duration
		}
		if p.Spec.KeepaliveTime != nil {
			pc.KeepaliveTime = p.Spec.KeepaliveTime.Duration
		}
		if p.Spec.ConnectTime != nil {
			pc.ConnectTime = p.Spec.ConnectTime.Duration
		}
		if p.Spec.BFDProfile != "" {
			prof, ok := bfd[p.Spec.BFDProfile]
			if !ok {
				problems = append(problems, Problem{"BGPPeer " + name, "bfdProfile " + p.Spec.BFDProfile + " does not exist; peering without BFD"})
			} else {
				pc.BFD = bfdProfile(prof)
			}
		}
		peers = append(peers, pc)
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })

	communities := map[string]string{}
	for _, c := range st.MetalLB.Communities {
		for _, a := range c.Spec.Communities {
			communities[a.Name] = a.Value
		}
	}
	byPrefix := map[netip.Prefix]*bgp.Advertisement{}
	var decisions []VIPDecision
	keys := make([]cluster.ServiceKey, 0, len(st.Services))
	for k, svc := range st.Services {
		if svc.Type == cluster.TypeLoadBalancer && len(svc.LoadBalancerIPs) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		svc := st.Services[k]
		ready := readyNodes(st.EndpointSlices[k])
		for _, ip := range svc.LoadBalancerIPs {
			pool := poolFor(st.MetalLB.IPAddressPools, ip)
			if pool == nil {
				continue
			}
			for _, ad := range st.MetalLB.BGPAdvertisements {
				if ad.Namespace != pool.Namespace || !adSelectsPool(ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, pool) {
					continue
				}
				d := VIPDecision{IP: ip, Service: k}
				switch {
				case !selects(ad.Spec.NodeSelectors, selfLabels):
					d.Reason = "BGPAdvertisement " + ad.Name + " does not select this node"
				case svc.ExternalPolicyLocal && !ready[in.Self]:
					d.Reason = "externalTrafficPolicy Local and no ready endpoint on this node"
				default:
					bits := ip.BitLen()
					if ip.Is4() && ad.Spec.AggregationLength != nil {
						bits = int(*ad.Spec.AggregationLength)
					}
					if ip.Is6() && ad.Spec.AggregationLengthV6 != nil {
						bits = int(*ad.Spec.AggregationLengthV6)
					}
					pfx, err := ip.Prefix(bits)
					if err != nil {
						problems = append(problems, Problem{"BGPAdvertisement " + ad.Namespace + "/" + ad.Name, err.Error()})
						continue
					}
					a := byPrefix[pfx]
					if a == nil {
						a = &bgp.Advertisement{Prefix: pfx}
						byPrefix[pfx] = a
					}
					a.LocalPref = max(a.LocalPref, ad.Spec.LocalPref)
					for _, c := range ad.Spec.Communities {
						v := c
						if alias, ok := communities[c]; ok {
							v = alias
						}
						if large, ok := strings.CutPrefix(v, "large:"); ok {
							a.LargeCommunities = append(a.LargeCommunities, large)
						} else {
							a.Communities = append(a.Communities, v)
						}
					}
					for _, p := range ad.Spec.Peers {
						a.Peers = append(a.Peers, peerName(pool.Namespace, p))
					}
					d.Owner = in.Self
					d.Reason = "advertised by BGP"
				}
				decisions = append(decisions, d)
			}
		}
	}
	ads := make([]bgp.Advertisement, 0, len(byPrefix))
	for _, a := range byPrefix {
		slices.Sort(a.Communities)
		a.Communities = slices.Compact(a.Communities)
		slices.Sort(a.LargeCommunities)
		a.LargeCommunities = slices.Compact(a.LargeCommunities)
		slices.Sort(a.Peers)
		a.Peers = slices.Compact(a.Peers)
		ads = append(ads, *a)
	}
	sort.Slice(ads, func(i, j int) bool { return ads[i].Prefix.String() < ads[j].Prefix.String() })
	return peers, ads, decisions, problems
}

// peerPassword returns the TCP MD5 password of a BGPPeer: spec.password, or the "password" key of the
// basic-auth Secret spec.passwordSecret names (its namespace defaults to the peer's, as in MetalLB).
// reason says why the peer cannot be used (never the password itself).
func peerPassword(p *metallbv1beta2.BGPPeer, secrets []*corev1.Secret) (password, reason string) {
	ref := p.Spec.PasswordSecret
	if ref.Name == "" {
		return p.Spec.Password, ""
	}
	if p.Spec.Password != "" {
		return "", "both password and passwordSecret are set; set one"
	}
	ns := cmp.Or(ref.Namespace, p.Namespace)
	for _, s := range secrets {
		if s.Namespace == ns && s.Name == ref.Name {
			pw := s.Data[corev1.BasicAuthPasswordKey]
			if len(pw) == 0 {
				return "", fmt.Sprintf("passwordSecret %s/%s has no %q key", ns, ref.Name, corev1.BasicAuthPasswordKey)
			}
			return string(pw), ""
		}
	}
	return "", fmt.Sprintf("passwordSecret %s/%s does not exist (vipgate reads Secrets of type %s with a %q key from its manifest directory, or from its own namespace through the API)",
		ns, ref.Name, corev1.SecretTypeBasicAuth, corev1.BasicAuthPasswordKey)
}

func peerName(ns, name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return ns + "/" + name
}

func bfdProfile(p *metallbv1beta1.BFDProfile) *bgp.BFDProfile {
	out := &bgp.BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	if p.Spec.ReceiveInterval != nil {
		out.ReceiveInterval = time.Duration(*p.Spec.ReceiveInterval) * time.Millisecond
	}
	if p.Spec.TransmitInterval != nil {
		out.TransmitInterval = time.Duration(*p.Spec.TransmitInterval) * time.Millisecond
	}
	if p.Spec.DetectMultiplier != nil {
		out.DetectMultiplier = *p.Spec.DetectMultiplier
	}
	if p.Spec.EchoMode != nil {
		out.EchoMode = *p.Spec.EchoMode
	}
	if p.Spec.PassiveMode != nil {
		out.PassiveMode = *p.Spec.PassiveMode
	}
	if p.Spec.MinimumTTL != nil {
		out.MinimumTTL = *p.Spec.MinimumTTL
	}
	return out
}
