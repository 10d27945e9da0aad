package gateway

import "strings"

// Names of the gateway table's own chains and sets. The names it shares with the node's table are
// tablenames'. The engine spells none of them (dataplane/nodenames_test.go): its gateway kinds take
// them from the rules built here (the connection table's maps: Action.Set, Conns and Map).
const (
	ChainGatewayPick     = "gateway-pick"
	ChainGatewayMasqPick = "gateway-masq-pick"
	// ChainGatewayPickSH and ChainGatewayMasqPickSH are the source-hash twins (lb-algorithm:
	// source-hash): the same Maglev table, keyed by a hash of the client address only.
	ChainGatewayPickSH     = "gateway-pick-sh"
	ChainGatewayMasqPickSH = "gateway-masq-pick-sh"
	SetGatewayVIPs         = "gateway-vips"
	MapGatewayBackends     = "gateway-backends"
	// MapGatewayBackendsSH holds the Maglev tables of the source-hash VIP ports: a map of its own, so
	// each map is bound by one rule and a slot is only ever read with the hash it was dealt for.
	MapGatewayBackendsSH = "gateway-backends-sh"
)

// Names of the routed mode's chains and map.
const (
	ChainGatewayPrerouting = "gateway-prerouting"
	ChainGatewayRoute      = "gateway-route"
	ChainGatewayRouteSH    = "gateway-route-sh"
	MapGatewayRoutes       = "gateway-routes"
	MapGatewayRoutesSH     = "gateway-routes-sh"
)

// Names of the route mode's connection table (dataplane/gateway_conntable.go): its flow map, node
// map, Maglev slot map and previous slot map. They hold live flows: they never change.
const (
	MapGatewayFlows    = "gateway-flows"
	MapGatewayConns    = "gateway-conns"
	MapGatewayRouteIDs = "gateway-route-ids"
	MapGatewayPrevIDs  = "gateway-route-prev"
)

// PrefixGatewayIngress begins the names of the fast path's netdev table base chains: one per
// ingress device (IngressChainName).
const PrefixGatewayIngress = "gateway-ingress-"

// IngressChainName is the name of device dev's ingress chain in the netdev table:
// PrefixGatewayIngress and the device name, with the characters an nft chain name may not have (an
// interface name may) as '_'.
func IngressChainName(dev string) string {
	return PrefixGatewayIngress + strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, dev)
}
