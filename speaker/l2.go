package speaker

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// L2Input is everything the L2 decision depends on. DecideL2 does no I/O: the caller gathers the
// membership View and this host's links.
type L2Input struct {
	// Self is this host's node name.
	Self string
	// Live are the members that may own VIPs (Membership.View().Candidates): alive, and themselves
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
	// Segments are the L2 segments of State (L2Segments) and SegmentViews the membership's view of
	// those that hold Self (Membership.SegmentViews). With Segments set, an IP's candidates are the
	// candidates of its pool's segment and Live is not used; an IP whose segment does not hold Self
	// gets no owner here (the segment's members decide it among themselves). Without: Live, one
	// membership for every IP.
	Segments     []L2Segment
	SegmentViews map[string]View
	// Owners, if set, keeps the owners between calls so that a membership change does not hash
	// every candidate for every IP again (OwnerCache); the owners are the same with or without it.
	Owners *OwnerCache
}

// Link is one interface of this host and its addresses (with prefix lengths).
type Link struct {
	Name     string
	Prefixes []netip.Prefix
	// Master is the bridge or bond the link is enslaved to ("" if none), NoARP its IFF_NOARP flag
	// (l2.Interfaces reads both). With the name, they decide whether the link is one of "all
	// interfaces" (ExcludedInterface).
	Master string
	NoARP  bool
}

// ExcludedNames are the interface names MetalLB's speaker leaves out of "all interfaces" by default
// (v0.16.2, unchanged since v0.16.1: the metallb-excludel2 ConfigMap of its manifests, announcedInterfacesToExclude),
// followed by vipgate's additions: other CNIs' host-side devices, never a node's uplink. Where a
// MetalLB user edited that ConfigMap, the L2Advertisement names the interfaces instead.
var ExcludedNames = []*regexp.Regexp{
	// MetalLB's list, unchanged.
	regexp.MustCompile(`^docker.*`), regexp.MustCompile(`^cbr.*`), regexp.MustCompile(`^dummy.*`),
	regexp.MustCompile(`^virbr.*`), regexp.MustCompile(`^lxcbr.*`), regexp.MustCompile(`^veth.*`),
	regexp.MustCompile(`^lo$`), regexp.MustCompile(`^cali.*`), regexp.MustCompile(`^tunl.*`),
	regexp.MustCompile(`^flannel.*`), regexp.MustCompile(`^kube-ipvs.*`), regexp.MustCompile(`^cni.*`),
	regexp.MustCompile(`^nodelocaldns.*`), regexp.MustCompile(`^lxc.*`),
	// vipgate's additions: Cilium, Calico VXLAN, kube-router, Weave, Antrea, OVN-Kubernetes.
	regexp.MustCompile(`^cilium_.*`), regexp.MustCompile(`^vxlan[.-]calico$`), regexp.MustCompile(`^kube-bridge$`),
	regexp.MustCompile(`^weave$`), regexp.MustCompile(`^antrea-.*`), regexp.MustCompile(`^ovn-k8s-.*`),
	regexp.MustCompile(`^genev_sys_.*`),
}

// ExcludedInterface is MetalLB's rule for "all interfaces" (its internal/layer2 announcer.go,
// updateInterfaces): a link enslaved to a bridge or bond (the master answers for it), a NOARP link,
// or one whose name ExcludedNames match is not answered on. Down and loopback links are not listed
// at all. It returns why l is excluded, "" if it is not.
func ExcludedInterface(l Link) string {
	switch {
	case l.Master != "":
		return "enslaved to " + l.Master
	case l.NoARP:
		return "NOARP"
	}
	for _, re := range ExcludedNames {
		if re.MatchString(l.Name) {
			return "name matches " + re.String()
		}
	}
	return ""
}

// VIPDecision is the outcome for one LoadBalancer IP, for status, logs and tests.
type VIPDecision struct {
	IP      netip.Addr
	Service cluster.ServiceKey
	// Owner is the node that announces the IP ("" when no node may).
	Owner string
	// Interfaces are where Self answers ARP/NDP for the IP (only when Self is the owner and can).
	Interfaces []string
	// Announce are the interfaces among Interfaces where a takeover is announced (gratuitous ARP,
	// unsolicited NA): the named ones, and for an advertisement naming none the preferred ones —
	// those whose subnet holds the IP, else every interface it is answered on.
	Announce []string
	// Preference says how the L2Advertisements' preferredNodeSelectors (MetalLB v0.16.2) weighed
	// in the owner ("" when none has any): the owner's score, or that no preferred node is a
	// candidate and the hash chose among the others. Shown in /status; never a problem.
	Preference string
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
//   - preferredNodeSelectors (MetalLB v0.16.2) come first: a candidate's score is the sum of the
//     weights of the preferences that match it, over the advertisements of the IP that make it
//     eligible; the candidates with the highest score are ordered by the hash, the others never
//     win while one of them is a candidate. When no preferred node is a candidate (all dead, or
//     none eligible), the hash orders every candidate, as without preferences.
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
	owners := in.Owners
	if owners == nil {
		owners = NewOwnerCache()
	}
	owners.begin()
	defer owners.end()
	defer func() { in.Owners.observeOwners(in.Self, decisions) }() // vipgate_l2_owner_changes_total

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

	// The candidates of each pool, computed once per call (not once per IP): the Live members, or
	// the candidates of the pool's segment, that an advertisement selects; never a witness.
	poolSeg := map[string]*L2Segment{}
	for i := range in.Segments {
		for _, p := range in.Segments[i].Pools {
			poolSeg[p] = &in.Segments[i]
		}
	}
	sels := newSelectorCache()
	poolIdx := cluster.NewPoolIndex(pools) // once per call: the allocator's reading of the pools
	type candSet struct {
		key       string
		cands     map[string]bool
		notMember string
		owners    *ownerSet // brought up to date once per call, on first use
	}
	byPool := map[*metallbv1beta1.IPAddressPool]*candSet{}
	poolCands := func(pool *metallbv1beta1.IPAddressPool, poolAds []*metallbv1beta1.L2Advertisement) *candSet {
		if c := byPool[pool]; c != nil {
			return c
		}
		c := &candSet{key: pool.Namespace + "/" + pool.Name, cands: map[string]bool{}}
		byPool[pool] = c
		if in.Segments == nil {
			for _, n := range members {
				if l := nodeLabels(st, n); sels.eligible(poolAds, l) && !isWitness(l) {
					c.cands[n] = true
				}
			}
			return c
		}
		g := poolSeg[c.key]
		if g == nil {
			return c // no speaker can announce it: "no live eligible node"
		}
		v, ok := in.SegmentViews[g.Key]
		if !ok {
			c.notMember = fmt.Sprintf("this node is not in the IP's L2 segment (%d speakers); they decide its owner", len(g.Members))
			return c
		}
		for n := range v.Candidates {
			if _, member := slices.BinarySearch(g.Members, n); member && !isWitness(nodeLabels(st, n)) {
				c.cands[n] = true
			}
		}
		return c
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
		pool := poolIdx.PoolOf(ip)
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
		pc := poolCands(pool, poolAds)
		if pc.notMember != "" {
			d.Reason = pc.notMember
			emit()
			continue
		}
		// serviceSelectors (MetalLB v0.16): only the advertisements that select one of the IP's
		// Services count, for its candidates and its interfaces.
		svcLabels := make([]map[string]string, len(us))
		for i, u := range us {
			svcLabels[i] = u.svc.Labels
		}
		svcAds, narrowed := l2AdsForServices(poolAds, svcLabels)
		if len(svcAds) == 0 {
			d.Reason = fmt.Sprintf("no L2Advertisement of pool %s/%s selects this Service (serviceSelectors)", pool.Namespace, pool.Name)
			emit()
			continue
		}
		cands := pc.cands
		if narrowed {
			cands = l2CandidatesFor(sels, st, pc.cands, svcAds)
		}
		var candidates map[string]bool
		serving, anyLocal := false, false
		for _, u := range us {
			local := readyNodes(u.eps)
			serving = serving || len(local) > 0 || anyServing(u.eps)
			if !u.svc.ExternalPolicyLocal {
				continue
			}
			anyLocal = true
			if candidates == nil {
				candidates = map[string]bool{}
			}
			for n := range local {
				if cands[n] {
					candidates[n] = true
				}
			}
		}
		if !serving {
			d.Reason = "no endpoint can serve"
			emit()
			continue
		}
		// preferredNodeSelectors (MetalLB v0.16.2): the candidates with the highest summed weight
		// come first, the hash orders the rest; none preferred, the hash alone (the cache).
		final := cands
		if anyLocal {
			if len(us) > 1 {
				// Shared with an eTP=Cluster Service: every candidate of the pool.
				for _, u := range us {
					if !u.svc.ExternalPolicyLocal {
						maps.Copy(candidates, cands)
						break
					}
				}
			}
			final = candidates
		}
		scores, prefs := preferredScores(svcAds, st, final)
		if prefs {
			d.Preference = preferenceNote(scores, final)
		}
		if scores != nil {
			d.Owner = rendezvousOwner(topScored(final, scores), ip)
		} else if !anyLocal && narrowed {
			d.Owner = rendezvousOwner(cands, ip)
		} else if !anyLocal {
			// The pool's candidates as they are: the cache keeps their owners between calls.
			if pc.owners == nil {
				pc.owners = owners.set(pc.key, pc.cands)
			}
			d.Owner = pc.owners.owner(ip, owners.gen)
		} else {
			d.Owner = rendezvousOwner(candidates, ip)
		}
		switch {
		case d.Owner == "":
			d.Reason = "no live eligible node"
			if us[0].svc.ExternalPolicyLocal {
				d.Reason = "no live eligible node with a local endpoint (externalTrafficPolicy Local)"
			}
		case d.Owner == in.Self:
			d.Interfaces, d.Announce, d.Reason = interfacesFor(svcAds, nodeLabels(st, in.Self), ip, in.Links, in.DefaultInterface)
			d.Problem = d.Reason != ""
			if len(d.Interfaces) > 0 {
				owned[ip] = d.Interfaces
			}
		}
		emit()
	}
	return owned, decisions
}

// preferredScores is MetalLB v0.16.2's preference score of each candidate (its config
// preferredNodeScores summed over the Service's advertisements by the speaker's
// preferredScoresFor): for every advertisement whose nodeSelectors make the candidate eligible,
// the weights of its preferredNodeSelectors whose preference matches the candidate's labels (an
// empty preference matches every node). scores is nil when no candidate scores above zero; prefs
// says whether some advertisement has preferredNodeSelectors at all. A weight outside 1-100 or a
// preference that does not parse counts for nothing (cluster refuses such an advertisement).
func preferredScores(ads []*metallbv1beta1.L2Advertisement, st *cluster.State, cands map[string]bool) (scores map[string]int64, prefs bool) {
	for _, ad := range ads {
		if len(ad.Spec.PreferredNodeSelectors) == 0 {
			continue
		}
		prefs = true
		for n, ok := range cands {
			if !ok {
				continue
			}
			l := nodeLabels(st, n)
			if !selects(ad.Spec.NodeSelectors, l) {
				continue
			}
			for _, p := range ad.Spec.PreferredNodeSelectors {
				if p.Weight < 1 || p.Weight > 100 || !selects([]metav1.LabelSelector{p.Preference}, l) {
					continue
				}
				if scores == nil {
					scores = map[string]int64{}
				}
				scores[n] += int64(p.Weight)
			}
		}
	}
	return scores, prefs
}

// topScored returns the candidates with the highest score.
func topScored(cands map[string]bool, scores map[string]int64) map[string]bool {
	var top int64
	for n, ok := range cands {
		if ok {
			top = max(top, scores[n])
		}
	}
	out := map[string]bool{}
	for n, ok := range cands {
		if ok && scores[n] == top {
			out[n] = true
		}
	}
	return out
}

// preferenceNote words VIPDecision.Preference.
func preferenceNote(scores map[string]int64, cands map[string]bool) string {
	live := 0
	for _, ok := range cands {
		if ok {
			live++
		}
	}
	if scores == nil {
		return fmt.Sprintf("preferredNodeSelectors: no preferred node is a live eligible candidate; owner by hash among %d", live)
	}
	top := topScored(cands, scores)
	var w int64
	for n := range top {
		w = scores[n]
	}
	return fmt.Sprintf("preferredNodeSelectors: owner among the %d of %d candidates with the top weight %d", len(top), live, w)
}

// rendezvousOwner returns the candidate with the lowest sha256(node "#" ip), "" if there is none:
// MetalLB sorts the nodes by that hash and takes the first, so a single-stack Service gets the same
// node under vipgate as under MetalLB. (OwnerCache keeps the result between calls.)
func rendezvousOwner(candidates map[string]bool, ip netip.Addr) string {
	best, _ := rendezvous(candidates, ip.String())
	return best
}

// isWitness reports whether a node's labels make it a witness (WitnessLabel): it votes, never
// announces.
func isWitness(labels map[string]string) bool {
	_, ok := labels[WitnessLabel]
	return ok
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

// interfacesFor chooses where Self answers for ip, and where it announces a takeover, as MetalLB:
// the union of what the advertisements matching Self ask for. An advertisement naming interfaces
// asks for those (answer and announce). One naming none means "all interfaces": it is answered on
// every link that is not excluded (ExcludedInterface), and on the links whose subnet holds the IP
// (the rule before, kept); the takeover is announced on the latter — a neighbour that considers the
// IP on-link asks there, so that is where a stale entry must be corrected — or, when no subnet holds
// it (a VIP routed on-link from another prefix), on every link it is answered on. The reason lists
// what could not be honoured: a named interface that does not exist here, or no link to answer on.
func interfacesFor(ads []*metallbv1beta1.L2Advertisement, self map[string]string, ip netip.Addr, links []Link, def string) (answer, announce []string, reason string) {
	var missing []string
	nowhere := false
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
					answer = append(answer, name)
					announce = append(announce, name)
				} else {
					missing = append(missing, name)
				}
			}
			continue
		}
		if links == nil {
			if def != "" {
				answer = append(answer, def)
				announce = append(announce, def)
			} else {
				nowhere = true
			}
			continue
		}
		var preferred, eligible []string
		for _, l := range links {
			onLink := slices.ContainsFunc(l.Prefixes, func(p netip.Prefix) bool { return p.Contains(ip) })
			if onLink {
				preferred = append(preferred, l.Name)
			}
			if onLink || ExcludedInterface(l) == "" {
				eligible = append(eligible, l.Name)
			}
		}
		answer = append(answer, eligible...)
		if len(preferred) > 0 {
			announce = append(announce, preferred...)
		} else {
			announce = append(announce, eligible...)
		}
		nowhere = nowhere || len(eligible) == 0
	}
	slices.Sort(answer)
	answer = slices.Compact(answer)
	slices.Sort(announce)
	announce = slices.Compact(announce)
	var reasons []string
	if len(missing) > 0 {
		slices.Sort(missing)
		reasons = append(reasons, fmt.Sprintf("L2Advertisement interface(s) %s not found on this node", strings.Join(slices.Compact(missing), ", ")))
	}
	if nowhere {
		reasons = append(reasons, "no interface to answer on: the IP is on no subnet attached to this node and every interface is excluded (name the interface in the L2Advertisement)")
	}
	return answer, announce, strings.Join(reasons, "; ")
}

// AnnouncedInterfaces returns, per Service, the interfaces this node answers ARP/NDP on for the
// Service's LoadBalancer IPs (sorted, once each), from the decisions of DecideL2; Services this node
// does not announce are absent. ServiceL2Status reports it (MetalLB's status.interfaces).
func AnnouncedInterfaces(decisions []VIPDecision) map[cluster.ServiceKey][]string {
	out := map[cluster.ServiceKey][]string{}
	for _, d := range decisions {
		if len(d.Interfaces) == 0 {
			continue
		}
		out[d.Service] = append(out[d.Service], d.Interfaces...)
	}
	for k, v := range out {
		slices.Sort(v)
		out[k] = slices.Compact(v)
	}
	return out
}
