package speaker

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
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

// Problem is an object the decision could not use, and why. Accepted marks a report about fields
// vipgate does not implement on an object it otherwise uses (an Event reason other than "Rejected"
// fits it better, e.g. "Unsupported").
type Problem struct {
	Object   ObjectRef
	Reason   string
	Accepted bool
}

// ObjectRef names a MetalLB object: its Kind ("BGPPeer") and namespace/name. Callers point at the
// object with it (an Event) and key reports by it, without taking a string apart.
type ObjectRef struct {
	Kind, Namespace, Name string
}

// String is "Kind namespace/name", as logs and the ConfigurationState name the object.
func (o ObjectRef) String() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// DecideBGP turns the MetalLB BGPPeers and BGPAdvertisements of the State into this node's BGP
// sessions and advertisements:
//   - peers: every BGPPeer whose nodeSelectors match this node (MetalLB v1beta2 fields);
//   - routes: every LoadBalancer IP in a pool that a BGPAdvertisement selects, when the
//     advertisement's nodeSelectors match this node and, for externalTrafficPolicy Local, this node
//     has a ready endpoint of the Service (eTP=Cluster: every eligible node advertises, so the router
//     spreads flows over them by ECMP; eTP=Local: a node withdraws as soon as its last endpoint goes).
//
// An advertisement with serviceSelectors (MetalLB v0.16) covers only the Services they select.
// Prefixes are the IP with the advertisement's aggregationLength(V6) (default /32, /128);
// advertisements of the same prefix are merged (highest localPref and asPathPrepend, union of
// communities and peers). With an advertisement annotated vipgate.io/weighted-ecmp, eTP=Local routes
// carry the link bandwidth community in proportion to this node's ready endpoints (wecmp.go).
// BGPPeer fields vipgate does not implement are reported as Problems (the peer is used without them,
// or not at all when they replace its address or AS number), never silently ignored.
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
		if reason := peerUnusable(p); reason != "" {
			problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: reason + "; not peering"})
			continue
		}
		addr, err := netip.ParseAddr(p.Spec.Address)
		if err != nil || p.Spec.MyASN == 0 || p.Spec.ASN == 0 {
			problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: fmt.Sprintf("peerAddress %q, myASN %d, peerASN %d: need an address and non-zero ASNs", p.Spec.Address, p.Spec.MyASN, p.Spec.ASN)})
			continue
		}
		password, reason := peerPassword(p, st.MetalLB.Secrets)
		if reason != "" {
			problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: reason + "; not peering"})
			continue
		}
		if ignored := peerIgnoredFields(p); len(ignored) > 0 {
			problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: unsupportedReason(ignored), Accepted: true})
		}
		pc := bgp.PeerConfig{Name: name, MyASN: p.Spec.MyASN, LocalASN: p.Spec.LocalASN, PeerASN: p.Spec.ASN, PeerAddress: addr, PeerPort: p.Spec.Port,
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
				problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: "bfdProfile " + p.Spec.BFDProfile + " does not exist; peering without BFD"})
			} else if auth, reason := peerBFDAuth(p, st.MetalLB.Secrets); reason != "" {
				problems = append(problems, Problem{Object: ObjectRef{"BGPPeer", p.Namespace, p.Name}, Reason: reason + "; peering without BFD"})
			} else {
				pc.BFD = bfdProfile(prof)
				pc.BFD.Auth = auth
				if pc.BFD.EchoMode {
					problems = append(problems, Problem{Object: ObjectRef{"BFDProfile", prof.Namespace, prof.Name},
						Reason: "field spec.echoMode is not supported by vipgate; ignored (asynchronous mode only)", Accepted: true})
				}
				if v, ok := prof.Annotations[BFDMaxDetectTimeAnnotation]; ok {
					if d, err := time.ParseDuration(v); err != nil || d <= 0 || d > time.Hour {
						problems = append(problems, Problem{Object: ObjectRef{"BFDProfile", prof.Namespace, prof.Name},
							Reason: fmt.Sprintf("annotation %s: %q is not a duration in (0, 1h]; using the default", BFDMaxDetectTimeAnnotation, v), Accepted: true})
					} else {
						pc.BFD.MaxDetectTime = d
					}
				}
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
	// An advertisement whose serviceSelectors MetalLB would refuse (CEL rule of v0.16: only with
	// the default /32 and /128 aggregation, since an aggregate cannot belong to one Service) or that
	// do not parse is reported and left out; the others keep working.
	badAd := map[*metallbv1beta1.BGPAdvertisement]bool{}
	for _, ad := range st.MetalLB.BGPAdvertisements {
		if reason := bgpAdServiceSelectorProblem(ad); reason != "" {
			badAd[ad] = true
			problems = append(problems, Problem{Object: ObjectRef{"BGPAdvertisement", ad.Namespace, ad.Name}, Reason: reason + "; not advertising through it"})
		}
	}
	// weighted ECMP (wecmp.go): the annotation of each advertisement, read once.
	weighted := map[*metallbv1beta1.BGPAdvertisement]bool{}
	for _, ad := range st.MetalLB.BGPAdvertisements {
		on, reason := weightedECMP(ad)
		weighted[ad] = on
		if reason != "" {
			problems = append(problems, Problem{Object: ObjectRef{"BGPAdvertisement", ad.Namespace, ad.Name}, Reason: reason, Accepted: true})
		}
	}
	byPrefix := map[netip.Prefix]*bgp.Advertisement{}
	linkBW := map[netip.Prefix]*linkBWVote{}
	decPrefix := map[int]netip.Prefix{} // index in decisions -> the prefix it advertises
	var decisions []VIPDecision
	keys := make([]cluster.ServiceKey, 0, len(st.Services))
	for k, svc := range st.Services {
		if svc.Type == cluster.TypeLoadBalancer && len(svc.LoadBalancerIPs) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	poolIdx := cluster.NewPoolIndex(st.MetalLB.IPAddressPools) // once per call
	for _, k := range keys {
		svc := st.Services[k]
		ready := readyNodes(st.EndpointSlices[k])
		for _, ip := range svc.LoadBalancerIPs {
			pool := poolIdx.PoolOf(ip)
			if pool == nil {
				continue
			}
			for _, ad := range st.MetalLB.BGPAdvertisements {
				if ad.Namespace != pool.Namespace || !adSelectsPool(ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, pool) {
					continue
				}
				// serviceSelectors (v0.16): this advertisement covers only the Services it selects;
				// another advertisement of the pool may still cover this one.
				if badAd[ad] {
					continue
				}
				d := VIPDecision{IP: ip, Service: k}
				switch {
				case !serviceSelected(ad.Spec.ServiceSelectors, svc.Labels):
					d.Reason = "BGPAdvertisement " + ad.Name + "'s serviceSelectors do not select this Service"
				case !selects(ad.Spec.NodeSelectors, selfLabels):
					d.Reason = "BGPAdvertisement " + ad.Name + " does not select this node"
				case excludedFromLB(selfLabels):
					// As MetalLB's BGP speaker (nodeLabeledExcludeBalancers).
					d.Reason = "this node is labelled " + ExcludeFromLBLabel
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
						problems = append(problems, Problem{Object: ObjectRef{"BGPAdvertisement", ad.Namespace, ad.Name}, Reason: err.Error()})
						continue
					}
					a := byPrefix[pfx]
					if a == nil {
						a = &bgp.Advertisement{Prefix: pfx}
						byPrefix[pfx] = a
					}
					a.LocalPref = max(a.LocalPref, ad.Spec.LocalPref)
					// asPathPrepend (MetalLB v0.16.2): as localPref, the highest of the
					// advertisements of the prefix (MetalLB refuses overlapping ones that differ).
					a.ASPathPrepend = max(a.ASPathPrepend, ad.Spec.AsPathPrepend)
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
					// Weighted ECMP (wecmp.go): what this advertisement says of the prefix's link
					// bandwidth.
					decPrefix[len(decisions)] = pfx
					v := linkBW[pfx]
					if v == nil {
						v = &linkBWVote{}
						linkBW[pfx] = v
					}
					v.want = v.want || weighted[ad]
					v.off = v.off || !svc.ExternalPolicyLocal || bits != ip.BitLen()
					if weighted[ad] && svc.ExternalPolicyLocal { // counted only when asked for
						v.endpoints = max(v.endpoints, localEndpoints(st.EndpointSlices[k], in.Self, cluster.FamilyOf(ip)))
					}
					d.Owner = in.Self
					d.Reason = "advertised by BGP"
					if n := ad.Spec.AsPathPrepend; n > 0 {
						d.Reason += fmt.Sprintf(" (BGPAdvertisement %s: AS path prepended %d times towards eBGP peers)", ad.Name, n)
					}
				}
				decisions = append(decisions, d)
			}
		}
	}
	// The AS in the link bandwidth community: this node's, as its first peer sees it (receivers
	// read only the bandwidth).
	var lbAS uint32
	if len(peers) > 0 {
		lbAS = peers[0].MyASN
		if peers[0].LocalASN != 0 {
			lbAS = peers[0].LocalASN
		}
	}
	for i, pfx := range decPrefix {
		if v := linkBW[pfx]; v != nil && v.want {
			if v.off {
				decisions[i].Reason += "; weighted ECMP off (externalTrafficPolicy Cluster or an aggregated prefix)"
			} else {
				decisions[i].Reason += fmt.Sprintf("; weighted ECMP: link bandwidth %d Mbit/s for %d ready local endpoints", min(v.endpoints, MaxWeightedEndpoints), v.endpoints)
			}
		}
	}
	ads := make([]bgp.Advertisement, 0, len(byPrefix))
	for pfx, a := range byPrefix {
		if v := linkBW[pfx]; v != nil && v.want && !v.off {
			a.LinkBandwidth = LinkBandwidthFor(v.endpoints, lbAS)
		}
		slices.Sort(a.Communities)
		a.Communities = slices.Compact(a.Communities)
		slices.Sort(a.LargeCommunities)
		a.LargeCommunities = slices.Compact(a.LargeCommunities)
		slices.Sort(a.Peers)
		a.Peers = slices.Compact(a.Peers)
		ads = append(ads, *a)
	}
	sort.Slice(ads, func(i, j int) bool { return ads[i].Prefix.String() < ads[j].Prefix.String() })
	return peers, ads, decisions, mergeProblems(problems)
}

// mergeProblems joins the problems of one object into one, in order, so that a consumer keeping
// the last reason per object (and logging on change) sees one stable reason per object. The merged
// problem is Accepted only if every part is.
func mergeProblems(in []Problem) []Problem {
	var out []Problem
	at := map[ObjectRef]int{}
	for _, p := range in {
		if i, ok := at[p.Object]; ok {
			if !strings.Contains(out[i].Reason, p.Reason) {
				out[i].Reason += "; " + p.Reason
			}
			out[i].Accepted = out[i].Accepted && p.Accepted
			continue
		}
		at[p.Object] = len(out)
		out = append(out, p)
	}
	return out
}

// unsupportedReason words the report of fields vipgate accepts but does not act on.
func unsupportedReason(fields []string) string {
	if len(fields) == 1 {
		return "field " + fields[0] + " is not supported by vipgate; ignored (the rest of the object is in use)"
	}
	return "fields " + strings.Join(fields, ", ") + " are not supported by vipgate; ignored (the rest of the object is in use)"
}

// peerUnusable says why a BGPPeer cannot be peered with at all ("" when it can): the MetalLB
// v0.15/v0.16 fields that replace the peer's address or AS number with something vipgate does not
// implement. The object is accepted (nothing else is affected) but no session is opened.
func peerUnusable(p *metallbv1beta2.BGPPeer) string {
	switch {
	case p.Spec.Interface != "" && p.Spec.Address == "":
		return fmt.Sprintf("field spec.interface (unnumbered BGP over %q) is not supported by vipgate: set peerAddress", p.Spec.Interface)
	case p.Spec.DynamicASN != "" && p.Spec.ASN == 0:
		return fmt.Sprintf("field spec.dynamicASN (%q) is not supported by vipgate: set peerASN", p.Spec.DynamicASN)
	case p.Spec.VRFName != "":
		// Peering from the default VRF instead would send the routes somewhere the user did not ask.
		return fmt.Sprintf("field spec.vrf (%q) is not supported by vipgate (it peers from the node's default VRF only)", p.Spec.VRFName)
	}
	return ""
}

// peerIgnoredFields lists the set BGPPeer fields vipgate accepts and does not act on, by their
// MetalLB names (spec.*). Fields it honours (localASN, disableMP: one session per family is what
// vipgate always does) are not listed.
func peerIgnoredFields(p *metallbv1beta2.BGPPeer) []string {
	var out []string
	if p.Spec.Interface != "" {
		out = append(out, "spec.interface") // with a peerAddress: vipgate dials the address
	}
	if p.Spec.DynamicASN != "" {
		out = append(out, "spec.dynamicASN") // with a peerASN: the ASN is expected
	}
	if p.Spec.DualStackAddressFamily {
		// IPv4 routes over an IPv6 session and vice versa need a next hop of the other family,
		// which GoBGP's next-hop-self does not provide: each session keeps its own family.
		out = append(out, "spec.dualStackAddressFamily")
	}
	return out
}

// bgpAdServiceSelectorProblem says why a BGPAdvertisement's serviceSelectors cannot be used ("" when
// they can): combined with a non-default aggregation length (MetalLB's CRD refuses this), or a
// selector that does not parse.
func bgpAdServiceSelectorProblem(ad *metallbv1beta1.BGPAdvertisement) string {
	if len(ad.Spec.ServiceSelectors) == 0 {
		return ""
	}
	if l := ad.Spec.AggregationLength; l != nil && *l != 32 {
		return fmt.Sprintf("serviceSelectors and aggregationLength %d are mutually exclusive (only the default 32)", *l)
	}
	if l := ad.Spec.AggregationLengthV6; l != nil && *l != 128 {
		return fmt.Sprintf("serviceSelectors and aggregationLengthV6 %d are mutually exclusive (only the default 128)", *l)
	}
	return adServiceSelectorProblem(ad.Spec.ServiceSelectors)
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

// vipgate's BFD settings that MetalLB's BFDProfile lacks, as annotations. On a BGPPeer with a
// bfdProfile, RFC 5880 authentication of its BFD session: the type (keyed-md5,
// meticulous-keyed-md5, keyed-sha1, meticulous-keyed-sha1), the key ID (default 1, BIRD's for its
// first password) and the basic-auth Secret whose "password" is the key (in the peer's namespace,
// read like passwordSecret's). On a BFDProfile, the bound of the detection time a router's packets
// can ask for (a Go duration; default 5s, never below receiveInterval x detectMultiplier).
const (
	BFDAuthAnnotation          = "vipgate.io/bfd-auth"
	BFDAuthKeyIDAnnotation     = "vipgate.io/bfd-auth-key-id"
	BFDAuthSecretAnnotation    = "vipgate.io/bfd-auth-secret"
	BFDMaxDetectTimeAnnotation = "vipgate.io/bfd-max-detect-time"
)

// peerBFDAuth returns the BFD authentication a BGPPeer's annotations ask for; reason says why they
// cannot be used (never the key itself). A peer whose authentication is unusable gets no BFD
// session rather than an unauthenticated one.
func peerBFDAuth(p *metallbv1beta2.BGPPeer, secrets []*corev1.Secret) (bgp.BFDAuth, string) {
	typ, ok := p.Annotations[BFDAuthAnnotation]
	if !ok {
		if _, ok := p.Annotations[BFDAuthSecretAnnotation]; ok {
			return bgp.BFDAuth{}, fmt.Sprintf("annotation %s without %s", BFDAuthSecretAnnotation, BFDAuthAnnotation)
		}
		return bgp.BFDAuth{}, ""
	}
	auth := bgp.BFDAuth{Type: typ, KeyID: 1}
	if v, ok := p.Annotations[BFDAuthKeyIDAnnotation]; ok {
		id, err := strconv.ParseUint(v, 10, 8)
		if err != nil {
			return bgp.BFDAuth{}, fmt.Sprintf("annotation %s: %q is not a key ID (0-255)", BFDAuthKeyIDAnnotation, v)
		}
		auth.KeyID = uint8(id)
	}
	name := p.Annotations[BFDAuthSecretAnnotation]
	if name == "" {
		return bgp.BFDAuth{}, fmt.Sprintf("annotation %s needs %s (a %s Secret with the key as %q)", BFDAuthAnnotation, BFDAuthSecretAnnotation,
			corev1.SecretTypeBasicAuth, corev1.BasicAuthPasswordKey)
	}
	for _, s := range secrets {
		if s.Namespace == p.Namespace && s.Name == name {
			auth.Key = string(s.Data[corev1.BasicAuthPasswordKey])
		}
	}
	if auth.Key == "" {
		return bgp.BFDAuth{}, fmt.Sprintf("BFD authentication Secret %s/%s does not exist or has no %q key (vipgate reads Secrets of type %s from its manifest directory, or from its own namespace through the API)",
			p.Namespace, name, corev1.BasicAuthPasswordKey, corev1.SecretTypeBasicAuth)
	}
	if err := auth.Validate(); err != nil {
		return bgp.BFDAuth{}, fmt.Sprintf("BFD authentication (Secret %s/%s): %v", p.Namespace, name, err)
	}
	return auth, ""
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

// excludedFromLB says whether a node with these labels carries ExcludeFromLBLabel (any value).
func excludedFromLB(labels map[string]string) bool {
	_, ok := labels[ExcludeFromLBLabel]
	return ok
}
