package proxy

import (
	"net"
	"net/netip"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// ConfigFor is the proxy's view of a NodeConfig, as `vipgate node` runs it and `vipgate render`
// and `vipgate explain` build it: NodePort addresses are the local addresses inside
// nodePortAddresses (never loopback). A failure to list them is logged to log.
func ConfigFor(cfg *cluster.NodeConfig, log hclog.Logger) Config {
	var npIPs []netip.Addr
	seen := map[netip.Addr]bool{}
	addIP := func(a netip.Addr) {
		a = a.Unmap()
		if a.IsLoopback() || seen[a] {
			return
		}
		for _, p := range cfg.NodePortAddresses {
			if p.Contains(a) {
				seen[a] = true
				npIPs = append(npIPs, a)
				return
			}
		}
	}
	for _, a := range cfg.NodeIPs {
		addIP(a)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					addIP(ip)
				}
			}
		}
	} else {
		log.Warn("listing local addresses for nodePortAddresses", "err", err)
	}
	return Config{
		Table:         cfg.TableName,
		NodeName:      cfg.NodeName,
		Zone:          cfg.NodeZone,
		NodeIPs:       cfg.NodeIPs,
		ClusterCIDRs:  cfg.ClusterCIDRs,
		ServiceCIDRs:  cfg.ServiceCIDRs,
		NodePortIPs:   npIPs,
		MasqueradeAll: cfg.MasqueradeAll,
		MasqueradeBit: cfg.MasqueradeBit,
		ExternalIPs:   cfg.ExternalIPs,
		Limits:        cfg.ServiceLimits,
	}
}
