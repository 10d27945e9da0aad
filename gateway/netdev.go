package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	vnl "github.com/vishvananda/netlink"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// Route forwarding's fast path (FastPath) as the gateway plans it: which ingress devices, the nodes'
// device, and the netdev table's rules. The netdev family, the fwd kind and their netlink encoding
// are the engine's: dataplane/gateway_netdev.go.

// FastPath configures the route forwarding fast path.
type FastPath struct {
	// Devices are the interfaces VIP traffic arrives on, each with an ingress chain. Empty: every up
	// interface except loopback (re-read at each sync). The nodes' interface is one of them: a
	// one-armed gateway (router, gateways and nodes on one LAN, the usual ECMP layout) receives
	// the VIP traffic there; elsewhere it costs the nodes' packets through the gateway one set lookup.
	Devices []string
	// NodeDevice returns the interface the gateway sends to a node address by, and false when the
	// node is not on a directly connected subnet (fwd needs it on-link). nil: RouteDevice.
	NodeDevice func(netip.Addr) (string, bool, error)
	// Interfaces lists the candidate ingress interfaces when Devices is empty (nil: UpInterfaces).
	Interfaces func() ([]string, error)
	// Index returns an interface's index, 0 when there is none, and MTU its MTU (0: unknown); nil:
	// in the current network namespace. Tests that program another namespace set them.
	Index func(string) int
	MTU   func(string) int
	// OmitMissing leaves the devices that do not exist (Index 0) out of the plan, with a warning
	// for those of Devices, rather than giving them a chain: kernels that do not hook a device by
	// its name when it appears (6.1 and 6.6 LTS; 6.18 does) refuse the chain, and with it the whole
	// netdev table. The running gateway sets it; render, which may plan for another machine's
	// devices, does not.
	OmitMissing bool
}

// UpInterfaces lists the names of the interfaces that are up, except loopback and the devices that
// have a master (bridge ports, bond slaves). Those are no sensible ingress: their frames belong to
// the bridge or bond, which is up itself and listed (a bridge port's ingress chain would also take
// frames the bridge switches between its other ports). veths are kept: the e2e labs' links are.
func UpInterfaces() ([]string, error) {
	links, err := vnl.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagUp != 0 && a.Flags&net.FlagLoopback == 0 && a.MasterIndex == 0 {
			out = append(out, a.Name)
		}
	}
	return out, nil
}

// interfaceIndex is the index of interface name in the current network namespace, 0 when there is
// none; interfaceMTU its MTU.
func interfaceIndex(name string) int {
	if i, err := net.InterfaceByName(name); err == nil {
		return i.Index
	}
	return 0
}

func interfaceMTU(name string) int {
	if i, err := net.InterfaceByName(name); err == nil {
		return i.MTU
	}
	return 0
}

// netdevPlan is what one sync's fast path of one family is: the ingress devices and the one device
// every node is reached by, or why there is no fast path (the family's table then forwards alone).
type netdevPlan struct {
	ingress []string
	nodeDev string
	why     string
	// nodeIndex is nodeDev's interface index in this namespace (0: unknown). fwd holds the index,
	// not the name: a device re-created under the same name needs the rules written again.
	nodeIndex int
	// ingressIndex are the ingress devices' indexes (0: no such device), for the same reason: the
	// kernel deletes a base chain whose only device is unregistered, and a device re-created under
	// its name is not hooked again. A change rebuilds the netdev table.
	ingressIndex []int
	// transient: why is a failed lookup (netlink route get, the interface list), which a link flap
	// can cause, rather than a layout without a fast path. The gateway keeps its previous plan.
	transient bool
	// bigMTU names the ingress devices whose MTU is larger than the nodes' device's: fwd checks no
	// MTU and sends no ICMP "fragmentation needed", so a packet too big for the nodes' link is lost
	// without a word to its sender (path MTU discovery breaks). A warning, not a reason to refuse.
	bigMTU string
	// missing names the devices of FastPath.Devices that do not exist, left out of the
	// plan; a warning as bigMTU is (SyncReport.FastPathWarnings).
	missing string
}

// whyNoNodes is planNetdev's reason for a family without nodes: nothing to forward, so the sync
// does not report it as a fast path that is off (SyncReport.NoFastPath).
const whyNoNodes = "no nodes"

// planNetdev decides family f's fast path for the node addresses nodes. All nodes must be on-link
// through one device: fwd's device is fixed per rule (a node -> device map would cost a lookup per
// packet, for a layout that is rare: the nodes of one cluster on several of the gateway's subnets).
func planNetdev(fp *FastPath, nodes []netip.Addr) netdevPlan {
	if len(nodes) == 0 {
		return netdevPlan{why: whyNoNodes}
	}
	nodeDevice := fp.NodeDevice
	if nodeDevice == nil {
		nodeDevice = RouteDevice
	}
	var devs []string
	for _, a := range nodes {
		dev, onLink, err := nodeDevice(a)
		switch {
		case err != nil:
			return netdevPlan{why: fmt.Sprintf("node %s: %v", a, err), transient: true}
		case !onLink:
			return netdevPlan{why: fmt.Sprintf("node %s is not on a directly connected subnet (fwd needs it on-link)", a)}
		}
		if !slices.Contains(devs, dev) {
			devs = append(devs, dev)
		}
	}
	if len(devs) > 1 {
		slices.Sort(devs)
		return netdevPlan{why: fmt.Sprintf("the nodes are reached by several devices (%v); the fast path needs one", devs)}
	}
	ingress := slices.Clone(fp.Devices)
	if len(ingress) == 0 {
		list := fp.Interfaces
		if list == nil {
			list = UpInterfaces
		}
		all, err := list()
		if err != nil {
			return netdevPlan{why: fmt.Sprintf("listing interfaces: %v", err), transient: true}
		}
		ingress = all
	}
	slices.Sort(ingress)
	ingress = slices.Compact(ingress)
	if len(ingress) == 0 {
		return netdevPlan{why: "no ingress devices"}
	}
	chains := map[string]string{}
	for _, d := range ingress {
		if other, ok := chains[IngressChainName(d)]; ok {
			return netdevPlan{why: fmt.Sprintf("ingress devices %q and %q would share the chain %s (an nft chain name has no such characters): rename one, or list the devices in routeFastPath.devices",
				other, d, IngressChainName(d))}
		}
		chains[IngressChainName(d)] = d
	}
	index, mtu := fp.Index, fp.MTU
	if index == nil {
		index = interfaceIndex
	}
	if mtu == nil {
		mtu = interfaceMTU
	}
	plan := netdevPlan{nodeDev: devs[0], nodeIndex: index(devs[0])}
	nodeMTU := mtu(devs[0])
	var big, missing []string
	for _, d := range ingress {
		// OmitMissing: a device that does not exist gets no chain, and the others keep the fast
		// path; one that appears later changes the plan's indexes, and the next sync writes the
		// table with its chain.
		i := index(d)
		if i == 0 && fp.OmitMissing {
			missing = append(missing, d)
			continue
		}
		plan.ingress, plan.ingressIndex = append(plan.ingress, d), append(plan.ingressIndex, i)
		if m := mtu(d); nodeMTU > 0 && m > nodeMTU {
			big = append(big, fmt.Sprintf("%s (%d)", d, m))
		}
	}
	if len(plan.ingress) == 0 {
		return netdevPlan{why: fmt.Sprintf("no ingress device exists: %s", strings.Join(missing, ", "))}
	}
	if len(missing) > 0 && len(fp.Devices) > 0 {
		// Listed by the operator (a misspelt or not yet created device): said on /status. A
		// device of the interface list that went away since it was listed is no one's mistake.
		plan.missing = fmt.Sprintf("ingress devices that do not exist (no chain until they do): %s", strings.Join(missing, ", "))
	}
	if len(big) > 0 {
		plan.bigMTU = fmt.Sprintf("ingress devices with an MTU larger than %s's (%d): %s; fwd sends no ICMP fragmentation needed, so larger packets are lost",
			devs[0], nodeMTU, strings.Join(big, ", "))
	}
	return plan
}

// buildGatewayNetdevBase is the netdev table's own part, next to inet, the base of the family's
// table (buildGatewayRouteBase, size slots per VIP port): the same sets and elements (the Service
// parts fill both tables), ingress chains, the dispatch, and the route chain with fwd.
func buildGatewayNetdevBase(f cluster.Family, inet *dataplane.Part, size int, plan netdevPlan) *dataplane.Part {
	p := &dataplane.Part{Sets: inet.Sets, Elements: inet.Elements}
	// The route chain's rules with fwd through the nodes' device; the known flow's is the ingress
	// chains' (below).
	var recall dataplane.Rule
	rules := slices.DeleteFunc(gatewayConntableRules(size), func(r dataplane.Rule) bool {
		if r.Action.Kind == dataplane.ActFlowRecall {
			recall = r
			return true
		}
		return false
	})
	for i := range rules {
		rules[i].Action.Device = plan.nodeDev
		if rules[i].Action.Kind == dataplane.ActDupJhashMap {
			rules[i].Action.Kind = dataplane.ActFwdJhashMap
		}
	}
	recall.Action.Device = plan.nodeDev
	for _, dev := range plan.ingress {
		p.Chains = append(p.Chains, &dataplane.Chain{Name: IngressChainName(dev), Type: dataplane.FilterType, Hook: dataplane.HookIngress, Priority: dataplane.PriorityFilter,
			Devices: []string{dev}, Comment: "VIP traffic to its node, before the IP stack", Rules: []dataplane.Rule{
				// A datagram's fragments must all go one way: only the first carries the ports the
				// rules match, so taking it here would part it from the others; all go on to the
				// family's table (return: the policy's accept). A later fragment would not match
				// the rules below anyway: the kernel loads no th dport from a packet with a
				// fragment offset (nft_payload checks pkt->fragoff).
				{Matches: []dataplane.Match{{Kind: dataplane.MatchFragment}}, Action: dataplane.Action{Kind: dataplane.ActReturn}, Comment: "fragments: all of them to the IP stack's path"},
				// A known flow, straight from the ingress chain: the packets of established flows,
				// nearly all of them, skip the dispatch's lookup and its goto. Only frames sent to
				// this host: the ingress hook also sees those the IP stack drops (PACKET_OTHERHOST:
				// a promiscuous device, e.g. under tcpdump, or frames flooded by a switch to the
				// other gateway of the LAN), which fwd would send to the nodes as duplicates.
				// gateway-conns holds (VIP port, node) only for the VIP ports whose dispatch is the
				// route chain (Maglev, with nodes: gatewayConnElements), so a flow that matches here
				// is one the dispatch would have sent there, whose first rule this was; a flow
				// whose VIP port or node is gone misses here and is dispatched as a new one.
				{Matches: []dataplane.Match{{Kind: dataplane.MatchPktTypeHost}}, Action: recall.Action, Comment: recall.Comment},
				// The dispatch of the other packets: service-ips holds only the VIP ports the fast
				// path takes (with nodes), so a packet it does not hold — traffic to no VIP, a VIP
				// port without nodes, another protocol — falls off the chain to the policy's
				// accept. The family's table keeps its gateway-vips check (its VIP ports without
				// nodes are rejected there). Traffic to no VIP pays the three rules' checks and
				// two lookups (gateway-flows, service-ips), on every device of the plan.
				{Matches: []dataplane.Match{{Kind: dataplane.MatchPktTypeHost}}, Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapServiceIPs}},
			}})
	}
	if f == cluster.IPv6 {
		// The stateless rule (gateway-flows is full) needs more registers than nft 1.0.6 allocates
		// for an IPv6 key, hash and device ("BUG: register reg_low 16 invalid"): an operator could
		// not load what render prints. Those packets go on to the family's table, which dups them.
		rules = rules[:len(rules)-1]
	}
	p.Chains = append(p.Chains,
		&dataplane.Chain{Name: ChainGatewayRoute, Comment: "Maglev: a fixed hash of the flow picks the node; the packet goes there unchanged", Rules: rules})
	if slices.ContainsFunc(inet.Chains, func(c *dataplane.Chain) bool { return c.Name == ChainGatewayRouteSH }) {
		// Source-hash VIP ports go on to the family's table, which dups them: an empty chain
		// returns to the ingress chain, whose policy accepts.
		p.Chains = append(p.Chains, &dataplane.Chain{Name: ChainGatewayRouteSH, Comment: "source-hash: left to the IP stack's table"})
	}
	return p
}

// gatewayNetdevRuleset is family f's netdev table for the family's table grs: the fast path of plan,
// or, when plan has none (why), an empty table, so that nothing is left of an earlier fast path.
func gatewayNetdevRuleset(cfg Config, f cluster.Family, grs *Ruleset, plan netdevPlan) *dataplane.Ruleset {
	rs := &dataplane.Ruleset{Family: dataplane.NetdevFamily(f), Table: dataplane.NetdevTableName(cfg.Table, f), Base: &dataplane.Part{}, Services: map[cluster.ServiceKey]*dataplane.Part{}, Shared: map[string]*dataplane.Chain{}}
	if plan.why != "" {
		return rs
	}
	rs.Base = buildGatewayNetdevBase(f, grs.Ruleset.Base, grs.MaglevSize, plan)
	rs.Services = grs.Ruleset.Services
	return rs
}

// NetdevRuleset is family f's fast path netdev table for the family's table grs
// (BuildRuleset of cfg, f and st), as a gateway of cfg would program it in this network
// namespace now: planNetdev with cfg.FastPath's devices and lookups (`vipgate render` states them
// there to plan for another machine). Without one it returns nil and why, which is what the
// gateway logs ("off" when cfg has no fast path): the family's table then forwards alone.
func NetdevRuleset(cfg Config, f cluster.Family, st *cluster.State, grs *Ruleset) (*dataplane.Ruleset, string) {
	cfg = cfg.withDefaults()
	if cfg.Forwarding != cluster.ForwardRoute || cfg.FastPath == nil {
		return nil, "off"
	}
	// BuildRuleset starts its drain clock now, so no node is past its deadline.
	plan := planNetdev(cfg.FastPath, gatewayNodeAddrs(cfg, st, f, nil))
	if plan.why != "" {
		return nil, plan.why
	}
	return gatewayNetdevRuleset(cfg, f, grs, plan), ""
}

// gatewayNodeAddrs are the addresses of family f's nodes that forwarding uses (not those drained
// past their deadline).
func gatewayNodeAddrs(cfg Config, st *cluster.State, f cluster.Family, expired map[string]bool) []netip.Addr {
	var out []netip.Addr
	for _, n := range gatewayNodes(cfg, st, f) {
		if !expired[n.name] {
			out = append(out, n.addr)
		}
	}
	return out
}

// diffGatewayTables fills tx with the change from old (nil: none, tx is Full) to nw; sets holds the
// table's sets and is updated.
func diffGatewayTables(old, nw *dataplane.Ruleset, sets map[string]*dataplane.Set, tx *dataplane.Tx) {
	dataplane.DiffRulesets(old, nw, sets, tx, nil)
}

// RouteDevice is the interface of the gateway's route to a (netlink route get) and whether a is on
// that interface's link (no next hop in between).
func RouteDevice(a netip.Addr) (string, bool, error) {
	return routeDevice(a)
}

// routeDevice asks the kernel for its route to a (netlink route get).
func routeDevice(a netip.Addr) (string, bool, error) {
	routes, err := vnl.RouteGet(net.IP(a.Unmap().AsSlice()))
	if err != nil {
		return "", false, fmt.Errorf("route get %s: %w", a, err)
	}
	if len(routes) == 0 {
		return "", false, fmt.Errorf("route get %s: no route", a)
	}
	r := routes[0]
	link, err := vnl.LinkByIndex(r.LinkIndex)
	if err != nil {
		return "", false, fmt.Errorf("route get %s: device %d: %w", a, r.LinkIndex, err)
	}
	return link.Attrs().Name, r.Gw == nil, nil
}
