package lab

import (
	"fmt"
	"net/netip"
)

// Fixed addresses of the lab. Other packages hard-code these, so they never
// change; see doc.go for the picture.
var (
	// LANv4 and LANv6 are the shared L2 segment (bridge br0 in the lan namespace).
	LANv4 = netip.MustParsePrefix("192.0.2.0/24")
	LANv6 = netip.MustParsePrefix("2001:db8:1::/64")
	// ClientNetv4 and ClientNetv6 are the network behind the router.
	ClientNetv4 = netip.MustParsePrefix("198.51.100.0/24")
	ClientNetv6 = netip.MustParsePrefix("2001:db8:2::/64")

	// RouterLANv4 and RouterLANv6 are the router's addresses on the LAN: every
	// node's and the lanclient's default gateway.
	RouterLANv4 = netip.MustParseAddr("192.0.2.1")
	RouterLANv6 = netip.MustParseAddr("2001:db8:1::1")
	// RouterClientv4 and RouterClientv6 are the router's addresses on the client net.
	RouterClientv4 = netip.MustParseAddr("198.51.100.1")
	RouterClientv6 = netip.MustParseAddr("2001:db8:2::1")

	// Clientv4 and Clientv6 are the client behind the router ("a user on the internet").
	Clientv4 = netip.MustParseAddr("198.51.100.10")
	Clientv6 = netip.MustParseAddr("2001:db8:2::10")
	// LANClientv4 and LANClientv6 are the client directly on the LAN.
	LANClientv4 = netip.MustParseAddr("192.0.2.100")
	LANClientv6 = netip.MustParseAddr("2001:db8:1::100")

	// ClusterCIDRv4 and ClusterCIDRv6 hold every pod CIDR.
	ClusterCIDRv4 = netip.MustParsePrefix("10.244.0.0/16")
	ClusterCIDRv6 = netip.MustParsePrefix("2001:db8:244::/48")
	// ServiceCIDRv4 and ServiceCIDRv6 are where ClusterIPs live; the lab itself
	// routes nothing there.
	ServiceCIDRv4 = netip.MustParsePrefix("10.96.0.0/16")
	ServiceCIDRv6 = netip.MustParsePrefix("2001:db8:96::/108")
)

// Limits that keep the address plan collision free: node LAN addresses are
// 192.0.2.(10+i) and must stay below the lanclient's .100; pod addresses are
// 10.244.i.(10+j) and must stay below .255.
const (
	MaxNodes       = 50
	MaxPodsPerNode = 200
)

// Interface names, the same in every lab.
const (
	// NodeUplink is the node's (and every pod's, and every client's) LAN-side interface.
	NodeUplink = "eth0"
	// NodePodBridge is the bridge on each node that its pods' veths plug into.
	NodePodBridge = "cbr0"
	// LANBridge is the bridge in the lan namespace.
	LANBridge = "br0"
	// RouterLANLink and RouterClientLink are the router's two interfaces.
	RouterLANLink    = "lan0"
	RouterClientLink = "cli0"
)

// The IPv6 addresses below are written with the decimal index in the text
// ("2001:db8:1::11" for node 1), exactly as people type them; the group is
// therefore read as hex by the parser. Keeping the textual form is what lets
// tests hard-code the addresses from the documentation.

// NodeIPv4 is node i's (1-based) LAN address: 192.0.2.(10+i).
func NodeIPv4(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
}

// NodeIPv6 is node i's (1-based) LAN address: 2001:db8:1::(10+i).
func NodeIPv6(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%d", 10+i))
}

// PodCIDRv4 is node i's pod network: 10.244.i.0/24.
func PodCIDRv4(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// PodCIDRv6 is node i's pod network: 2001:db8:244:i::/64.
func PodCIDRv6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("2001:db8:244:%d::/64", i))
}

// PodGatewayv4 is node i's address on its pod bridge: 10.244.i.1, the pods' default gateway.
func PodGatewayv4(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(i), 1})
}

// PodGatewayv6 is node i's address on its pod bridge: 2001:db8:244:i::1.
func PodGatewayv6(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:244:%d::1", i))
}

// PodIPv4 is the address of pod j (1-based) on node i: 10.244.i.(10+j).
func PodIPv4(i, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(i), byte(10 + j)})
}

// PodIPv6 is the address of pod j (1-based) on node i: 2001:db8:244:i::(10+j).
func PodIPv6(i, j int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:244:%d::%d", i, 10+j))
}
