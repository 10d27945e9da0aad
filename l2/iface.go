package l2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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

// Interface is one interface of this host, as speaker.DecideL2 needs it (speaker.Link): its
// addresses, and the facts that decide whether it is one of "all interfaces" for an L2Advertisement
// that names none (speaker.ExcludedInterface, MetalLB's rule; see README.md).
type Interface struct {
	Name string
	// Kind is the netlink link type ("device", "veth", "bridge", "dummy", ...), for logs.
	Kind string
	// Prefixes are its addresses with their prefix lengths, masked; link-local ones left out.
	Prefixes []netip.Prefix
	// Master is the bridge or bond the interface is enslaved to ("" if none).
	Master string
	// NoARP is IFF_NOARP: point-to-point tunnels (WireGuard, ipip), some dummies.
	NoARP bool
}

// linksAndAddrs lists this host's links and their addresses by link index: one dump of every
// address, grouped by link (a dump per link would be one more chance per link to be interrupted by
// pod churn).
func linksAndAddrs() ([]netlink.Link, map[int][]netlink.Addr, error) {
	links, err := dumpRetry(netlink.LinkList)
	if err != nil {
		return nil, nil, fmt.Errorf("listing interfaces: %w", err)
	}
	all, err := dumpRetry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing addresses: %w", err)
	}
	byLink := map[int][]netlink.Addr{}
	for _, ad := range all {
		byLink[ad.LinkIndex] = append(byLink[ad.LinkIndex], ad)
	}
	return links, byLink, nil
}

// Interfaces lists this host's interfaces that are up and not loopback (nothing is answered on
// the others), with their prefixes, in the network namespace of the calling thread.
func Interfaces() ([]Interface, error) {
	links, byLink, err := linksAndAddrs()
	if err != nil {
		return nil, err
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []Interface
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagUp == 0 || a.Flags&net.FlagLoopback != 0 {
			continue
		}
		ifc := Interface{Name: a.Name, Kind: l.Type(), NoARP: a.RawFlags&unix.IFF_NOARP != 0}
		if a.MasterIndex != 0 {
			ifc.Master = names[a.MasterIndex]
			if ifc.Master == "" {
				ifc.Master = fmt.Sprintf("ifindex %d", a.MasterIndex)
			}
		}
		for _, ad := range byLink[a.Index] {
			if ad.IPNet == nil {
				continue
			}
			if p, err := netip.ParsePrefix(ad.IPNet.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				ifc.Prefixes = append(ifc.Prefixes, p.Masked())
			}
		}
		out = append(out, ifc)
	}
	return out, nil
}

// dumpRetry runs a netlink dump again when the kernel says it was interrupted by a change (routine
// while pods come and go: netlink.ErrDumpInterrupted), and after three tries takes the last, partial
// but consistent-enough answer rather than none (the next recompute lists again).
func dumpRetry[T any](dump func() ([]T, error)) ([]T, error) {
	var out []T
	var err error
	for range 3 {
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return out, nil
}
