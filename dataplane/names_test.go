package dataplane

// Sample set names for the engine's own tests: the node's (proxy/names.go) and the gateway's
// (gateway/names.go), which the engine's source never spells (nodenames_test.go); its tests may.
const (
	MapGatewayRoutes = "gateway-routes"
	MapServiceIPs    = "service-ips"
	MapEndpoints     = "endpoints"
	SetClusterIPs    = "cluster-ips"
	SetHairpin       = "hairpin-connections"

	// The connection table's maps.
	MapGatewayConns    = "gateway-conns"
	MapGatewayRouteIDs = "gateway-route-ids"
	MapGatewayFlows    = "gateway-flows"
	MapGatewayPrevIDs  = "gateway-route-prev"
)
