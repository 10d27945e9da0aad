package l2

import (
	"fmt"
	"net"
	"net/netip"
)

// DefaultInterface returns the name of the interface that holds nodeIP's
// subnet: the interface with nodeIP itself if there is one, otherwise the
// interface with the longest prefix containing nodeIP. It is the default
// interface to answer on for VIPs of that subnet. It looks in the network
// namespace of the calling thread.
func DefaultInterface(nodeIP netip.Addr) (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing interfaces: %w", err)
	}
	var prefixes []ifacePrefix
	for _, ifi := range ifaces {
		addrs, err := ifi.Addrs()
		if err != nil {
			return "", fmt.Errorf("listing addresses of %s: %w", ifi.Name, err)
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				prefixes = append(prefixes, ifacePrefix{iface: ifi.Name, prefix: p})
			}
		}
	}
	name, ok := interfaceFor(prefixes, nodeIP)
	if !ok {
		return "", fmt.Errorf("no interface has an address in the subnet of %s", nodeIP)
	}
	return name, nil
}

// ifacePrefix is one interface address with its prefix length.
type ifacePrefix struct {
	iface  string
	prefix netip.Prefix
}

// interfaceFor picks the interface for ip from the host's addresses: an
// exact address match wins over a containing subnet, because a node IP may
// also fall inside a broader prefix on another interface (a /16 on a
// bridge, say).
func interfaceFor(prefixes []ifacePrefix, ip netip.Addr) (string, bool) {
	ip = ip.Unmap()
	for _, p := range prefixes {
		if p.prefix.Addr().Unmap() == ip {
			return p.iface, true
		}
	}
	best, bestBits := "", -1
	for _, p := range prefixes {
		masked := netip.PrefixFrom(p.prefix.Addr().Unmap(), p.prefix.Bits())
		if masked.Contains(ip) && p.prefix.Bits() > bestBits {
			best, bestBits = p.iface, p.prefix.Bits()
		}
	}
	return best, bestBits >= 0
}
