package speaker

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// This file answers "who announces this VIP, and why" for `vipgate explain --service/--vip`: for
// every speaker, whether it may own the VIP by L2 (and why not: membership, nodeSelectors,
// serviceSelectors, externalTrafficPolicy Local, preferredNodeSelectors, link state) and what it
// advertises by BGP to which peers (communities, localPref, AS path prepend). It decides with the
// deciders themselves (DecideL2, DecideBGP) on the State narrowed to the VIP's Services, so the
// owner and the routes are the ones the speakers compute; the per-node reasons replay the
// decider's filters in its order. Pure: the Controller's Explain gathers a running speaker's views.

// ExplainQuery names what to explain: the LoadBalancer IPs of Service, or the one IP VIP.
type ExplainQuery struct {
	Service cluster.ServiceKey
	VIP     netip.Addr
}

// Explanation is the speaker's side of `vipgate explain --service/--vip`, and the JSON the
// admin endpoint's /explain serves.
type Explanation struct {
	// Node is the node whose view this is: the agent that answered, or offline the config's node.
	Node string `json:"node"`
	// Live: a running speaker's decisions, with its membership view, links and sessions. Otherwise
	// computed from a State with every speaker assumed alive.
	Live bool `json:"live"`
	// Notes say what the explanation assumes or cannot know.
	Notes []string         `json:"notes,omitempty"`
	VIPs  []VIPExplanation `json:"vips"`
}

// VIPExplanation is one LoadBalancer IP: the Services that use it, and how it is announced.
type VIPExplanation struct {
	IP       netip.Addr     `json:"ip"`
	Services []ServicePorts `json:"services"`
	// Pool is the IPAddressPool ("namespace/name") that holds the IP ("": none).
	Pool string `json:"pool,omitempty"`
	// NotAnnounced says why no speaker announces the IP at all ("" when L2 or BGP covers it).
	NotAnnounced string          `json:"notAnnounced,omitempty"`
	L2           *L2Explanation  `json:"l2,omitempty"`
	BGP          *BGPExplanation `json:"bgp,omitempty"`
}

// ServicePorts is a Service that uses a VIP, and its ports (what explain traces).
type ServicePorts struct {
	Service string `json:"service"`
	// ExternalTrafficPolicy is "Local" or "Cluster".
	ExternalTrafficPolicy string        `json:"externalTrafficPolicy"`
	Ports                 []ServicePort `json:"ports"`
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
}

// L2Explanation is DecideL2's answer for one IP, and each speaker's part in it.
type L2Explanation struct {
	// Advertisements are the L2Advertisements ("namespace/name") that cover the IP's pool and one
	// of its Services.
	Advertisements []string `json:"advertisements,omitempty"`
	// Owner is the node that answers ARP/NDP for the IP ("": none); Reason DecideL2's reason
	// (why none, or what it could not honour), Problem whether that is a configuration error.
	Owner      string `json:"owner,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Problem    bool   `json:"problem,omitempty"`
	Preference string `json:"preference,omitempty"`
	// Interfaces and Announce are where the owner answers and announces a takeover: known when
	// the owner is the node explaining (its links); otherwise the interfaces the advertisements
	// name, and InterfacesNote says what is not known here.
	Interfaces     []string `json:"interfaces,omitempty"`
	Announce       []string `json:"announce,omitempty"`
	InterfacesNote string   `json:"interfacesNote,omitempty"`
	Nodes          []L2Node `json:"nodes"`
}

// L2Node is one speaker's part in an IP's L2 decision.
type L2Node struct {
	Node string `json:"node"`
	// Candidate: the decider may make it the owner; Owner: it is.
	Candidate bool `json:"candidate"`
	Owner     bool `json:"owner,omitempty"`
	// Score is its preferredNodeSelectors weight (0: none).
	Score  int64  `json:"score,omitempty"`
	Reason string `json:"reason"`
}

// BGPExplanation is DecideBGP's answer for one IP on each speaker.
type BGPExplanation struct {
	// Advertisements are the BGPAdvertisements ("namespace/name") that cover the IP's pool.
	Advertisements []string `json:"advertisements,omitempty"`
	// Reason says why no node advertises the IP by BGP ("" when some advertisement covers it).
	Reason string    `json:"reason,omitempty"`
	Nodes  []BGPNode `json:"nodes,omitempty"`
}

// BGPNode is what one speaker advertises of an IP.
type BGPNode struct {
	Node       string `json:"node"`
	Advertised bool   `json:"advertised"`
	// Reasons are DecideBGP's, one per advertisement that covers the IP's pool.
	Reasons []string   `json:"reasons"`
	Routes  []BGPRoute `json:"routes,omitempty"`
}

// BGPRoute is one route a speaker sends for the IP, and the sessions that carry it.
type BGPRoute struct {
	Prefix           netip.Prefix `json:"prefix"`
	LocalPref        uint32       `json:"localPref,omitempty"`
	Communities      []string     `json:"communities,omitempty"`
	LargeCommunities []string     `json:"largeCommunities,omitempty"`
	ASPathPrepend    uint8        `json:"asPathPrepend,omitempty"`
	// OnlyPeers is the advertisements' peers list (empty: every peer).
	OnlyPeers []string  `json:"onlyPeers,omitempty"`
	Peers     []BGPPeer `json:"peers"`
}

// BGPPeer is a session a route goes out on.
type BGPPeer struct {
	// Name is the BGPPeer ("namespace/name").
	Name    string     `json:"name"`
	Address netip.Addr `json:"address"`
	MyASN   uint32     `json:"myASN"`
	PeerASN uint32     `json:"peerASN"`
	// State is the session's state (live, the node explaining only).
	State string `json:"state,omitempty"`
}

// ExplainInput is what ExplainVIPs explains from.
type ExplainInput struct {
	State *cluster.State
	Query ExplainQuery
	// Self is the node whose view this is: its Links (or DefaultInterface) are known, the other
	// speakers' are not.
	Self             string
	Links            []Link
	DefaultInterface string
	// Speakers are the nodes that run a speaker (Self is added).
	Speakers []string
	// Live are the speakers that may own VIPs (View.Candidates), or with Segments the views of
	// Self's segments (as L2Input); nil Live and Segments: every speaker, the offline assumption.
	Live         map[string]bool
	Segments     []L2Segment
	SegmentViews map[string]View
	// L2Off, when set, says why L2 announces nothing here (no membership).
	L2Off string
	// Decided are a running speaker's L2 decisions (Controller.decisions): owner, reason and
	// interfaces come from them rather than from deciding again. Withdrawals are its link-aware
	// withdrawals.
	Decided     []VIPDecision
	Withdrawals []Withdrawal
	// Sessions are Self's BGP sessions (live); BGPNote says why Self sends nothing by BGP.
	Sessions []bgp.PeerStatus
	BGPNote  string
}

// ExplainVIPs explains the LoadBalancer IPs in.Query names. An unknown Service is an error; an IP
// no Service uses is explained as not announced.
func ExplainVIPs(in ExplainInput, live bool) (Explanation, error) {
	st := in.State
	if st == nil {
		return Explanation{}, errors.New("no State")
	}
	out := Explanation{Node: in.Self, Live: live, VIPs: []VIPExplanation{}}
	var ips []netip.Addr
	switch q := in.Query; {
	case q.Service != (cluster.ServiceKey{}):
		svc := st.Services[q.Service]
		if svc == nil {
			return Explanation{}, fmt.Errorf("no Service %s", q.Service)
		}
		if svc.Type != cluster.TypeLoadBalancer || len(svc.LoadBalancerIPs) == 0 {
			out.Notes = append(out.Notes, fmt.Sprintf("Service %s has no LoadBalancer IP (type %s): nothing is announced for it", q.Service, svc.Type))
		}
		ips = slices.Clone(svc.LoadBalancerIPs)
	case q.VIP.IsValid():
		ips = []netip.Addr{q.VIP.Unmap()}
	default:
		return Explanation{}, errors.New("explain needs a Service or a VIP")
	}
	nodes := slices.Clone(in.Speakers)
	if in.Self != "" {
		nodes = append(nodes, in.Self)
	}
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	for _, ip := range ips {
		out.VIPs = append(out.VIPs, explainVIP(in, ip, nodes))
	}
	return out, nil
}

// explainVIP explains one IP over nodes.
func explainVIP(in ExplainInput, ip netip.Addr, nodes []string) VIPExplanation {
	st := in.State
	e := VIPExplanation{IP: ip, Services: []ServicePorts{}}
	// The State narrowed to the IP's Services: the deciders then cost one IP, not the cluster.
	sub := *st
	sub.Services, sub.EndpointSlices = map[cluster.ServiceKey]*cluster.Service{}, map[cluster.ServiceKey][]*cluster.EndpointSlice{}
	var users []*cluster.Service
	for k, svc := range st.Services {
		if svc.Type == cluster.TypeLoadBalancer && slices.Contains(svc.LoadBalancerIPs, ip) {
			users = append(users, svc)
			sub.Services[k], sub.EndpointSlices[k] = svc, st.EndpointSlices[k]
		}
	}
	slices.SortFunc(users, func(a, b *cluster.Service) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	for _, u := range users {
		sp := ServicePorts{Service: u.Key.String(), ExternalTrafficPolicy: "Cluster", Ports: []ServicePort{}}
		if u.ExternalPolicyLocal {
			sp.ExternalTrafficPolicy = "Local"
		}
		for _, p := range u.Ports {
			sp.Ports = append(sp.Ports, ServicePort{Name: p.Name, Port: p.Port, Protocol: string(p.Protocol)})
		}
		e.Services = append(e.Services, sp)
	}
	if len(users) == 0 {
		e.NotAnnounced = "no LoadBalancer Service has this IP (the speakers announce LoadBalancer IPs only)"
		return e
	}
	if st.MetalLB == nil {
		e.NotAnnounced = "no MetalLB configuration (IPAddressPools, advertisements): the speakers announce nothing"
		return e
	}
	pool := cluster.NewPoolIndex(st.MetalLB.IPAddressPools).PoolOf(ip)
	if pool == nil {
		e.NotAnnounced = "no IPAddressPool contains this IP"
		return e
	}
	e.Pool = pool.Namespace + "/" + pool.Name
	e.L2 = explainL2(in, &sub, ip, users, pool, nodes)
	e.BGP = explainBGP(in, &sub, ip, pool, nodes)
	if e.L2.Owner == "" && !slices.ContainsFunc(e.BGP.Nodes, func(n BGPNode) bool { return n.Advertised }) {
		e.NotAnnounced = "no speaker announces it: " + cmpOr(e.L2.Reason, e.BGP.Reason, "see L2 and BGP below")
	}
	return e
}

func cmpOr(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// explainL2 is DecideL2's answer for ip, with each node's part.
func explainL2(in ExplainInput, st *cluster.State, ip netip.Addr, users []*cluster.Service, pool *metallbv1beta1.IPAddressPool, nodes []string) *L2Explanation {
	out := &L2Explanation{Nodes: []L2Node{}}
	poolAds := l2AdsFor(st.MetalLB.L2Advertisements, pool)
	if len(poolAds) == 0 {
		out.Reason = fmt.Sprintf("pool %s/%s has no L2Advertisement", pool.Namespace, pool.Name)
		return out
	}
	svcLabels := make([]map[string]string, len(users))
	for i, u := range users {
		svcLabels[i] = u.Labels
	}
	svcAds, _ := l2AdsForServices(poolAds, svcLabels)
	for _, ad := range svcAds {
		out.Advertisements = append(out.Advertisements, ad.Namespace+"/"+ad.Name)
	}

	// The decision: a running speaker's own, or DecideL2 on the narrowed State.
	live := in.Live
	if live == nil && in.Segments == nil {
		live = map[string]bool{}
		for _, n := range nodes {
			live[n] = true
		}
	}
	decided := in.Decided
	if decided == nil {
		_, decided = DecideL2(L2Input{Self: in.Self, Live: live, Links: in.Links, DefaultInterface: in.DefaultInterface,
			State: st, Segments: in.Segments, SegmentViews: in.SegmentViews})
	}
	if i := slices.IndexFunc(decided, func(d VIPDecision) bool { return d.IP == ip }); i >= 0 {
		d := decided[i]
		out.Owner, out.Reason, out.Problem, out.Preference = d.Owner, d.Reason, d.Problem, d.Preference
		out.Interfaces, out.Announce = d.Interfaces, d.Announce
	}
	if in.L2Off != "" {
		out.Reason = in.L2Off
	}
	if out.Owner != "" && out.Owner != in.Self {
		out.Interfaces, out.InterfacesNote = namedInterfaces(svcAds, nodeLabels(st, out.Owner))
		out.Announce = out.Interfaces
	}
	if len(svcAds) == 0 {
		return out
	}

	// Each node, through the decider's filters in its order.
	alive, aliveNote := aliveFor(in, live, pool)
	sels := newSelectorCache()
	anyCluster := false
	local := map[string]bool{}
	for _, u := range users {
		if !u.ExternalPolicyLocal {
			anyCluster = true
			continue
		}
		for n := range readyNodes(st.EndpointSlices[u.Key]) {
			local[n] = true
		}
	}
	cands := map[string]bool{}
	reasons := map[string]string{}
	for _, n := range nodes {
		l := nodeLabels(st, n)
		_, excluded := l[ExcludeFromLBLabel]
		switch {
		case excluded:
			reasons[n] = "labelled " + ExcludeFromLBLabel
		case !sels.eligible(svcAds, l):
			if sels.eligible(poolAds, l) {
				reasons[n] = "only L2Advertisements whose serviceSelectors do not select this Service select this node"
			} else {
				reasons[n] = fmt.Sprintf("no L2Advertisement of pool %s/%s selects this node (nodeSelectors)", pool.Namespace, pool.Name)
			}
		case isWitness(l):
			reasons[n] = "a witness (" + WitnessLabel + "): votes in the segment, never announces"
		case n == in.Self && withdrawnReason(in, pool) != "":
			reasons[n] = "withdrawn from the IP's L2 segment (link-aware ownership): " + withdrawnReason(in, pool)
		case alive != nil && !alive[n]:
			reasons[n] = aliveNote
		case !anyCluster && !local[n]:
			reasons[n] = "externalTrafficPolicy Local and no endpoint that can serve on this node"
		default:
			cands[n] = true
		}
	}
	scores, _ := preferredScores(svcAds, st, cands)
	top := cands
	var topScore int64
	if scores != nil {
		top = topScored(cands, scores)
		for n := range top {
			topScore = scores[n]
		}
	}
	for _, n := range nodes {
		ln := L2Node{Node: n, Candidate: cands[n], Owner: n == out.Owner && out.Owner != "", Score: scores[n], Reason: reasons[n]}
		switch {
		case !cands[n]:
		case !top[n]:
			ln.Reason = fmt.Sprintf("candidate, but preferredNodeSelectors weigh it %d, below the top weight %d", scores[n], topScore)
		case ln.Owner && len(top) == 1:
			ln.Reason = "owner: the only candidate"
			if scores != nil {
				ln.Reason += fmt.Sprintf(" of the top preferredNodeSelectors weight %d", topScore)
			}
		case ln.Owner:
			ln.Reason = fmt.Sprintf("owner: the lowest rendezvous hash sha256(node#IP) among %d candidates", len(top))
			if scores != nil {
				ln.Reason += fmt.Sprintf(" of the top preferredNodeSelectors weight %d", topScore)
			}
		case out.Owner != "":
			ln.Reason = "candidate; the rendezvous hash ranks " + out.Owner + " first"
		default:
			ln.Reason = "candidate; no owner: " + out.Reason
		}
		out.Nodes = append(out.Nodes, ln)
	}
	return out
}

// aliveFor returns the nodes the membership lets own the pool's VIPs (nil: unknown here) and the
// reason given to the others.
func aliveFor(in ExplainInput, live map[string]bool, pool *metallbv1beta1.IPAddressPool) (map[string]bool, string) {
	if in.L2Off != "" {
		return map[string]bool{}, "L2 is off here: " + in.L2Off
	}
	if in.Segments == nil {
		return live, "not a candidate in the membership (dead, not hearing a majority, or withdrawn)"
	}
	key := pool.Namespace + "/" + pool.Name
	for _, g := range in.Segments {
		if !slices.Contains(g.Pools, key) {
			continue
		}
		if v, ok := in.SegmentViews[g.Key]; ok {
			return v.Candidates, fmt.Sprintf("not a candidate in %s's view of the IP's L2 segment (dead, not hearing a majority of its %d members, or withdrawn)", in.Self, len(g.Members))
		}
		return nil, "" // not Self's segment: its members decide
	}
	return map[string]bool{}, "no speaker of the IP's pool runs (no L2 segment)"
}

// withdrawnReason is why Self withdrew from the pool's segment ("" if it did not).
func withdrawnReason(in ExplainInput, pool *metallbv1beta1.IPAddressPool) string {
	key := pool.Namespace + "/" + pool.Name
	for _, w := range in.Withdrawals {
		if slices.Contains(w.Segment.Pools, key) {
			return w.Reason
		}
	}
	return ""
}

// namedInterfaces are the interfaces the advertisements that select a node name; note says what
// cannot be known away from the node (an advertisement naming none: its links).
func namedInterfaces(ads []*metallbv1beta1.L2Advertisement, labels map[string]string) (named []string, note string) {
	allOf := false
	for _, ad := range ads {
		if !selects(ad.Spec.NodeSelectors, labels) {
			continue
		}
		named = append(named, ad.Spec.Interfaces...)
		allOf = allOf || len(ad.Spec.Interfaces) == 0
	}
	slices.Sort(named)
	named = slices.Compact(named)
	if allOf {
		note = "an L2Advertisement names no interface: the owner answers on its interfaces whose subnet holds the IP and on every interface not excluded, announcing on the former (its links are not known here)"
	}
	return named, note
}

// explainBGP is DecideBGP's answer for ip on each node.
func explainBGP(in ExplainInput, st *cluster.State, ip netip.Addr, pool *metallbv1beta1.IPAddressPool, nodes []string) *BGPExplanation {
	out := &BGPExplanation{}
	for _, ad := range st.MetalLB.BGPAdvertisements {
		if ad.Namespace == pool.Namespace && adSelectsPool(ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, pool) {
			out.Advertisements = append(out.Advertisements, ad.Namespace+"/"+ad.Name)
		}
	}
	if len(out.Advertisements) == 0 {
		out.Reason = fmt.Sprintf("pool %s/%s has no BGPAdvertisement", pool.Namespace, pool.Name)
		return out
	}
	states := map[string]string{}
	for _, s := range in.Sessions {
		states[s.Name] = string(s.State)
	}
	for _, n := range nodes {
		peers, ads, decisions, _ := DecideBGP(BGPInput{Self: n, State: st})
		bn := BGPNode{Node: n, Reasons: []string{}}
		for _, d := range decisions {
			if d.IP != ip {
				continue
			}
			bn.Advertised = bn.Advertised || d.Owner == n
			if !slices.Contains(bn.Reasons, d.Reason) {
				bn.Reasons = append(bn.Reasons, d.Reason)
			}
		}
		if len(bn.Reasons) == 0 {
			bn.Reasons = append(bn.Reasons, "no usable BGPAdvertisement covers the IP here (see the configuration problems in vipgate status)")
		}
		for _, a := range ads {
			if !bn.Advertised || !a.Prefix.Contains(ip) {
				continue
			}
			r := BGPRoute{Prefix: a.Prefix, LocalPref: a.LocalPref, Communities: a.Communities, LargeCommunities: a.LargeCommunities,
				ASPathPrepend: a.ASPathPrepend, OnlyPeers: a.Peers, Peers: []BGPPeer{}}
			for _, p := range peers {
				if (len(a.Peers) > 0 && !slices.Contains(a.Peers, p.Name)) || !carries(p, ip) {
					continue
				}
				bp := BGPPeer{Name: p.Name, Address: p.PeerAddress, MyASN: p.MyASN, PeerASN: p.PeerASN}
				if p.LocalASN != 0 {
					bp.MyASN = p.LocalASN
				}
				if n == in.Self {
					bp.State = states[p.Name]
				}
				r.Peers = append(r.Peers, bp)
			}
			bn.Routes = append(bn.Routes, r)
		}
		if bn.Advertised && !slices.ContainsFunc(bn.Routes, func(r BGPRoute) bool { return len(r.Peers) > 0 }) {
			bn.Reasons = append(bn.Reasons, "but no BGPPeer that selects this node carries it: no session sends it")
		}
		if n == in.Self && in.BGPNote != "" && bn.Advertised {
			bn.Reasons = append(bn.Reasons, in.BGPNote)
		}
		out.Nodes = append(out.Nodes, bn)
	}
	return out
}

// Explain explains the LoadBalancer IPs q names as this running speaker sees them now: its State,
// its L2 decisions, its membership views, its links' withdrawals and its BGP sessions. Other
// speakers' BGP routes are decided from the same State (they decide from it alone); their
// sessions' states are not known here.
func (c *Controller) Explain(q ExplainQuery) (Explanation, error) {
	var links []Link
	if c.opts.Links != nil {
		links = c.opts.Links()
	}
	c.mu.Lock()
	if c.st == nil {
		c.mu.Unlock()
		return Explanation{}, errors.New("the speaker has no State yet")
	}
	in := ExplainInput{State: c.st, Query: q, Self: c.opts.Self, Links: links, DefaultInterface: c.opts.DefaultInterface,
		Segments: c.segments, Decided: c.decisions, Withdrawals: slices.Clone(c.withdrawals)}
	if in.Decided == nil {
		in.Decided = []VIPDecision{} // decided, nothing: not "decide again"
	}
	peers := c.opts.FixedPeers
	if peers == nil {
		peers = NodeMembers(c.st)
	}
	for n := range peers {
		in.Speakers = append(in.Speakers, n)
	}
	if m := c.opts.Members; m != nil {
		in.Live, in.SegmentViews = m.View().Candidates, m.SegmentViews()
		if in.Live == nil {
			in.Live = map[string]bool{}
		}
	} else {
		in.L2Off = c.opts.L2Disabled
		if in.L2Off == "" {
			in.L2Off = "no membership runs"
		}
	}
	switch {
	case c.bgp != nil:
		in.Sessions = c.bgp.Status()
	case c.bgpErr != "":
		in.BGPNote = "not sent: BGP is not running (" + c.bgpErr + ")"
	}
	// Deciding for every speaker runs outside the lock: the State and the decisions are replaced,
	// never changed in place, so in's copies stay as they were.
	c.mu.Unlock()
	e, err := ExplainVIPs(in, true)
	if err != nil {
		return e, err
	}
	e.Notes = append(e.Notes, "other speakers' routes are decided here from the same State; their sessions' states are not known here")
	return e, nil
}
