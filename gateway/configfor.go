package gateway

import "github.com/vipgate/vipgate/cluster"

// ConfigFor is the gateway's dataplane view of a GatewayConfig, as `vipgate gateway` runs it and
// `vipgate render` and `vipgate explain` build it.
func ConfigFor(cfg *cluster.GatewayConfig) Config {
	return Config{
		Table:        cfg.TableName,
		Forwarding:   cfg.Forwarding,
		SNAT:         cfg.SNAT,
		Nodes:        cfg.Nodes,
		MaglevSize:   cfg.MaglevTableSize,
		DrainTimeout: cfg.DrainTimeout, // 0: the dataplane's default (5m)
		FlowTimeout:  cfg.FlowTimeout,  // 0: the dataplane's default (1h)
		FastPath:     fastPathFor(cfg),
		Limits:       cfg.ServiceLimits,
	}
}

// fastPathFor is the route forwarding fast path of cfg (nil: off). The nodes' device and, without
// configured devices, the ingress interfaces are looked up at each sync (netlink route get, the up
// interfaces), so a node that moves or an interface that comes up later is seen.
func fastPathFor(cfg *cluster.GatewayConfig) *FastPath {
	if !cfg.RouteFastPath || cfg.Forwarding != cluster.ForwardRoute {
		return nil
	}
	return &FastPath{Devices: cfg.RouteFastPathDevices}
}
