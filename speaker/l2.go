package speaker

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/cluster"
)

// L2Input is everything the L2 decision depends on. DecideL2 does no I/O: the caller gathers the
// membership View and this host's links.
type L2Input struct {
	// Self is this host's node name.
	Self string
	// Live are the members that may own VIPs (Members.View().Candidates): alive, and themselves
	// hearing a majority. Self announces only if it is in Live.
	Live map[string]bool
	// Links are this host's interfaces and the prefixes on them. They choose the interfaces when an
	// L2Advertisement names none (the ones whose subnet holds the VIP), and they tell which named
	// interfaces exist. nil means "unknown": named interfaces are taken as given and DefaultInterface
	// answers for the rest.
	Links []Link
	// DefaultInterface is used when Links is nil and an L2Advertisement names no interfaces.
	DefaultInterface string
	State            *cluster.State
}

// Link is one interface of this host and its addresses (with prefix lengths).
type Link struct {
	Name     string
	Prefixes []netip.Prefix
}

// VIPDecision is the outcome for one LoadBalancer IP, for status, logs and tests.
type VIPDecision struct {
	IP      netip.Addr
	Service cluster.ServiceKey
	// Owner is the node that announces the IP ("" when no node may).
	Owner string
	// Interfaces are where Self announces the IP (only when Self is the owner and can).
	Interfaces []string
	// Reason explains why the IP is not announced, or not from every interface asked for
	// ("" when all is well). Problem says the reason is a configuration error worth a warning,
	// not a normal state such as "no ready endpoint".
	Reason  string
	Problem bool
}

// ExcludeFromLBLabel marks nodes that must not announce LoadBalancer IPs (as in MetalLB and the
// Kubernetes service controller).
const ExcludeFromLBLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// DecideL2 decides, for every LoadBalancer IP, which node announces it, and returns the IPs Self
// announces with their interfaces. Modelled on MetalLB's layer2 ShouldAnnounce:
//
//   - The IP must be in an IPAddressPool that an L2Advertisement selects (ipAddressPools,
//     ipAddressPoolSelectors, or neither = every pool of the namespace).
//   - A Service without any endpoint that can serve is not announced (nothing would answer).
//   - Candidates are the Live members that an advertisement's nodeSelectors match and that are not
//     labelled ExcludeFromLBLabel; with externalTrafficPolicy Local only those with a local endpoint
//     that can serve (EndpointSlice nodeName), so traffic never reaches a node that would drop it.
//   - The owner is the candidate with the lowest sha256(node "#" IP) (rendezvous hashing): every
//     member computes the same owner from the same inputs, IPs spread evenly over the candidates,
//     and when one goes away only its IPs move.
//
// An IP that several Services share (allow-shared-ip) gets one owner: the candidates of all of them.
func DecideL2(in L2Input) (owned map[netip.Addr][]string, decisions []VIPDecision) {
	owned = map[netip.Addr][]string{}
	st := in.State
	if st == nil {
		return owned, nil
	}
	members := make([]string, 0, len(in.Live))
	for n, ok := range in.Live {
		if ok {
			members = append(members, n)
		}
	}
	slices.Sort(members)

	// Group by IP first: the owner is a property of the IP, not of each Service.
	type user struct {
		svc *cluster.Service
		eps []*cluster.EndpointSlice
	}
	users := map[netip.Addr][]user{}
	var ips []netip.Addr
	for _, svc := range st.Services {
		if svc.Type != cluster.TypeLoadBalancer {
			continue
		}
		for _, ip := range svc.LoadBalancerIPs {
			if _, ok := users[ip]; !ok {
				ips = append(ips, ip)
			}
			users[ip] = append(users[ip], user{svc, st.EndpointSlices[svc.Key]})
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	var pools []*metallbv1beta1.IPAddressPool
	var ads []*metallbv1beta1.L2Advertisement
	if st.MetalLB != nil {
		pools, ads = st.MetalLB.IPAddressPools, st.MetalLB.L2Advertisements
	}

	for _, ip := range ips {
		us := users[ip]
		slices.SortFunc(us, func(a, b user) int { return strings.Compare(a.svc.Key.String(), b.svc.Key.String()) })
		d := VIPDecision{IP: ip, Service: us[0].svc.Key}
		emit := func() {
			for _, u := range us {
				d.Service = u.svc.Key
				decisions = append(decisions, d)
			}
		}
		pool := poolFor(pools, ip)
		if pool == nil {
			// Not necessarily a problem (the IP may be announced by BGP or by someone else), but it
			// is never ours to answer for by L2.
			d.Reason = "no IPAddressPool contains this IP"
			d.Problem = len(ads) > 0
			emit()
			continue
		}
		poolAds := l2AdsFor(ads, pool)
		if len(poolAds) == 0 {
			d.Reason = fmt.Sprintf("pool %s/%s has no L2Advertisement", pool.Namespace, pool.Name)
			// A pool announced by BGP only is fine; one announced by nothing is a mistake.
			d.Problem = st.MetalLB == nil || !bgpAdvertised(st.MetalLB.BGPAdvertisements, pool)
			emit()
			continue
		}
		candidates := map[string]bool{}
		serving := false
		for _, u := range us {
			local := readyNodes(u.eps)
			serving = serving || len(local) > 0 || anyServing(u.eps)
			for _, n := range members {
				if !nodeEligible(poolAds, nodeLabels(st, n)) {
					continue
				}
				if u.svc.ExternalPolicyLocal && !local[n] {
					continue
				}
				candidates[n] = true
			}
		}
		if !serving {
			d.Reason = "no endpoint can serve"
			emit()
			continue
		}
		d.Owner = rendezvousOwner(candidates, ip)
		switch {
		case d.Owner == "":
			d.Reason = "no live eligible node"
			if us[0].svc.ExternalPolicyLocal {
				d.Reason = "no live eligible node with a local endpoint (externalTrafficPolicy Local)"
			}
		case d.Owner == in.Self:
			d.Interfaces, d.Reason = interfacesFor(poolAds, nodeLabels(st, in.Self), ip, in.Links, in.DefaultInterface)
			d.Problem = d.Reason != ""
			if len(d.Interfaces) > 0 {
				owned[ip] = d.Interfaces
			}
		}
		emit()
	}
	return owned, decisions
}

// rendezvousOwner returns the candidate with the lowest sha256(node "#" ip), "" if there is none:
// MetalLB sorts the nodes by that hash and takes the first, so a single-stack Service gets the same
// node under vipgate as under MetalLB.
func rendezvousOwner(candidates map[string]bool, ip netip.Addr) string {
	var best string
	var bestHash [32]byte
	for n := range candidates {
		h := sha256.Sum256([]byte(n + "#" + ip.String()))
		if c := bytes.Compare(h[:], bestHash[:]); best == "" || c < 0 || (c == 0 && n < best) {
			best, bestHash = n, h
		}
	}
	return best
}

// canServe is MetalLB's EndpointCanServe: ready, or serving (a terminating endpoint still serving).
func canServe(ep cluster.Endpoint) bool { return ep.Ready || ep.Serving }

// readyNodes lists the nodes that hold an endpoint of the Service that can serve (ready, or still
// serving while terminating: MetalLB's EndpointCanServe).
func readyNodes(slices_ []*cluster.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			if canServe(ep) && ep.NodeName != "" {
				out[ep.NodeName] = true
			}
		}
	}
	return out
}

func anyServing(slices_ []*cluster.EndpointSlice) bool {
	for _, es := range slices_ {
		for _, ep := range es.Endpoints {
			if canServe(ep) {
				return true
			}
		}
	}
	return false
}

// nodeLabels returns the labels of a node; a member without a Node object (members from the
// configuration, manifests without Nodes) has only its hostname label, the same on every member.
func nodeLabels(st *cluster.State, name string) map[string]string {
	if n, ok := st.Nodes[name]; ok && n != nil && n.Labels != nil {
		return n.Labels
	}
	return map[string]string{"kubernetes.io/hostname": name}
}

func nodeEligible(ads []*metallbv1beta1.L2Advertisement, labels map[string]string) bool {
	if _, excluded := labels[ExcludeFromLBLabel]; excluded {
		return false
	}
	for _, ad := range ads {
		if selects(ad.Spec.NodeSelectors, labels) {
			return true
		}
	}
	return false
}

// interfacesFor chooses where Self announces ip: the union of the interfaces the advertisements
// matching Self name; an advertisement naming none stands for the interfaces whose subnet holds the
// IP (a neighbour only asks for addresses it considers on-link). The reason lists what could not be
// honoured: a named interface that does not exist here, or a VIP on no attached subnet.
func interfacesFor(ads []*metallbv1beta1.L2Advertisement, self map[string]string, ip netip.Addr, links []Link, def string) ([]string, string) {
	var out, missing []string
	offSubnet := false
	exists := func(name string) bool {
		return links == nil || slices.ContainsFunc(links, func(l Link) bool { return l.Name == name })
	}
	for _, ad := range ads {
		if !selects(ad.Spec.NodeSelectors, self) {
			continue
		}
		if len(ad.Spec.Interfaces) > 0 {
			for _, name := range ad.Spec.Interfaces {
				if exists(name) {
					out = append(out, name)
				} else {
					missing = append(missing, name)
				}
			}
			continue
		}
		if links == nil {
			if def != "" {
				out = append(out, def)
			} else {
				offSubnet = true
			}
			continue
		}
		found := false
		for _, l := range links {
			if slices.ContainsFunc(l.Prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
				out = append(out, l.Name)
				found = true
			}
		}
		offSubnet = offSubnet || !found
	}
	slices.Sort(out)
	out = slices.Compact(out)
	var reasons []string
	if len(missing) > 0 {
		slices.Sort(missing)
		reasons = append(reasons, fmt.Sprintf("L2Advertisement interface(s) %s not found on this node", strings.Join(slices.Compact(missing), ", ")))
	}
	if offSubnet {
		reasons = append(reasons, "the IP is on no subnet attached to this node (name the interface in the L2Advertisement)")
	}
	return out, strings.Join(reasons, "; ")
}
