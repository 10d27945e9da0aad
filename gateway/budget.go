package gateway

import (
	"fmt"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/tablenames"
)

// What one Service may cost on a gateway (serviceLimits), as proxy/budget.go does on a node.

// gatewayEntriesOverLimits says why svc is over limits on a gateway in family f ("" if it is not), before
// its entries are built: a gateway's entries are its ports x its LoadBalancer IPs of the family.
func gatewayEntriesOverLimits(limits cluster.ServiceLimits, svc *cluster.Service, f cluster.Family) string {
	vips := len(gatewayVIPs(svc, f))
	n := 0
	for _, sp := range svc.Ports {
		if dataplane.ProtoNumber(sp.Protocol) != 0 {
			n += vips
		}
	}
	return dataplane.EntriesOverLimit(limits, n, len(svc.Ports))
}

// gatewayElementsOverLimits says why a Service's gateway entries are over limits.MaxElements (""
// if they are not): each entry with backends holds a Maglev table (route forwarding: and its
// connection-table twin), sized as the family's table is (cfg.MaglevSize, or derived from the
// backends; a family whose largest Service needs a bigger table gives every Service that size, so
// this is the Service's own least cost), and each VIP port with source ranges its firewall-ips
// element and its port's fw- chain (a rule per range and the drop, cluster.RuleCost each).
func gatewayElementsOverLimits(cfg Config, limits cluster.ServiceLimits, entries []Entry) string {
	size := cfg.MaglevSize
	if size == 0 {
		most := 0
		for _, e := range entries {
			most = max(most, len(e.Backends))
		}
		size = maglev.SizeFor(most)
	}
	cost := 0
	fw := map[string]bool{}
	for _, e := range entries {
		cost++ // its service-ips element
		if len(e.SourceRanges) > 0 {
			// Its firewall-ips element, and its port's fw- chain once (gatewayFirewallRules).
			cost++
			if name := tablenames.ServicePortName(e.Service, e.Proto, e.Port); !fw[name] {
				fw[name] = true
				cost += cluster.RuleCost * (len(e.SourceRanges) + 1)
			}
		}
		if len(e.Backends) == 0 {
			continue
		}
		per := size
		if cfg.Forwarding == cluster.ForwardRoute && e.Algorithm != cluster.LBSourceHash {
			per *= 2
		}
		cost += per + len(e.Backends) + len(e.Draining)
	}
	if cost <= limits.MaxElements {
		return ""
	}
	return fmt.Sprintf("the Service is not programmed: its %d VIP ports need %d nftables elements (Maglev tables of %d slots), more than serviceLimits.maxElements %d",
		len(entries), cost, size, limits.MaxElements)
}
