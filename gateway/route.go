package gateway

import (
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// The table of forwarding: route (the packet unchanged to a node, no NAT, no conntrack state). Its
// kinds' encoding and tracing are the engine's: dataplane/gateway_route.go.

// buildGatewayRouteBase is BuildBase for forwarding: route.
func buildGatewayRouteBase(cfg Config, f cluster.Family, vips []netip.Addr, size int, sh bool) *dataplane.Part {
	p := &dataplane.Part{}
	rejectVIP := dataplane.Rule{
		Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetGatewayVIPs}},
		Action:  dataplane.Action{Kind: dataplane.ActReject},
		Comment: "a VIP port without backends",
	}
	p.Chains = []*dataplane.Chain{
		// Every packet to a VIP port with nodes is sent on by gateway-route before conntrack sees it;
		// what is left (a port without nodes, or no Service) is rejected where it would be forwarded
		// or delivered. No output rule: the copies dup sends pass the output hook.
		{Name: ChainGatewayPrerouting, Type: dataplane.FilterType, Hook: dataplane.HookPrerouting, Priority: dataplane.PriorityRaw,
			Comment: "VIP traffic to its node, before conntrack", Rules: []dataplane.Rule{
				{Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetGatewayVIPs}}, Action: dataplane.Action{Kind: dataplane.ActJump, Chain: tablenames.ChainServices}},
			}},
		{Name: tablenames.ChainFilterForward, Type: dataplane.FilterType, Hook: dataplane.HookForward, Priority: dataplane.PriorityFilter, Rules: []dataplane.Rule{rejectVIP}},
		{Name: tablenames.ChainFilterInput, Type: dataplane.FilterType, Hook: dataplane.HookInput, Priority: dataplane.PriorityFilter, Rules: []dataplane.Rule{rejectVIP}},
		{Name: tablenames.ChainServices, Comment: "VIP dispatch", Rules: []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapServiceIPs}}}},
		// The connection table first (conntable.go): a known flow keeps its node.
		{Name: ChainGatewayRoute, Comment: "Maglev: a fixed hash of the flow picks the node; the packet goes there unchanged", Rules: gatewayConntableRules(size)},
	}
	if sh {
		p.Chains = append(p.Chains, &dataplane.Chain{Name: ChainGatewayRouteSH, Comment: "source-hash: a fixed hash of the client address picks the node", Rules: []dataplane.Rule{
			{Action: dataplane.Action{Kind: dataplane.ActDupSrcHashMap, Map: MapGatewayRoutesSH, Value: uint32(size)}},
		}})
	}
	p.Sets = []*dataplane.Set{
		{Name: SetGatewayVIPs, Kind: dataplane.KindAddr, Comment: "LoadBalancer IPs this gateway forwards"},
		{Name: tablenames.MapServiceIPs, Kind: dataplane.KindTupleVmap, Comment: "VIP ports with nodes"},
		{Name: MapGatewayRoutes, Kind: dataplane.KindTupleAddr, Comment: "VIP . proto . port . Maglev slot -> node"},
	}
	p.Sets = append(p.Sets, gatewayConntableSets(cfg.FlowTimeout)...)
	if sh {
		p.Sets = append(p.Sets, &dataplane.Set{Name: MapGatewayRoutesSH, Kind: dataplane.KindTupleAddr, Comment: "source-hash VIP . proto . port . Maglev slot -> node"})
	}
	p.Elements = gatewayVIPElements(f, vips)
	return p
}
