package gateway

import (
	"cmp"
	"net/netip"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Config is the gateway's configuration (cmd/vipgate fills it from a GatewayConfig file).
type Config struct {
	Table      string
	Forwarding cluster.Forwarding
	SNAT       cluster.SNATMode
	// Nodes are used for nodePort forwarding when the State knows no nodes.
	Nodes []cluster.Node
	// MaglevSize is the number of slots per VIP port (a prime). 0: derived from the number of
	// backends, maglev.SizeFor of the largest backend count of the family's VIP ports.
	MaglevSize    int
	MasqueradeBit int
	// Families lists the families to program (default: IPv4 and IPv6).
	Families []cluster.Family
	// DrainTimeout is how long a draining node keeps its established flows (default
	// DefaultDrainTimeout); after it the node leaves the connection table.
	DrainTimeout time.Duration
	// FlowTimeout is how long an idle flow keeps its entry in the connection table (forwarding:
	// route; default dataplane.DefaultGatewayFlowTimeout), and how long after a Maglev table change the
	// previous table's moved slots are daisy chained.
	FlowTimeout time.Duration
	// FastPath, with forwarding: route, also programs each family's route forwarding in a netdev
	// table whose ingress chains fwd the packets to the nodes (netdev.go); nil: only the
	// family's table, which dups them.
	FastPath *FastPath
	// NATPath, with forwarding direct or nodePort, also gives each VIP port's Maglev table to the
	// NAT fast path (natpath.go, gateway/natpath: a tc BPF program that forwards the
	// flows it takes without the IP stack and conntrack); nil: only the family's table.
	NATPath *NATPath
	// Limits bound what one Service may cost (budget.go; zero fields: the defaults).
	Limits cluster.ServiceLimits
}

func (c Config) withDefaults() Config {
	c.Table = cmp.Or(c.Table, cluster.DefaultTableName)
	c.Forwarding = cmp.Or(c.Forwarding, cluster.ForwardNodePort)
	c.SNAT = cmp.Or(c.SNAT, cluster.SNATAuto)
	c.MasqueradeBit = cmp.Or(c.MasqueradeBit, cluster.DefaultMasqueradeBit)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.FlowTimeout = cmp.Or(c.FlowTimeout, dataplane.DefaultGatewayFlowTimeout)
	if len(c.Families) == 0 {
		c.Families = []cluster.Family{cluster.IPv4, cluster.IPv6}
	}
	return c
}

// HealthTarget is one node's healthCheckNodePort, which the gateway probes for Services with
// externalTrafficPolicy Local and nodePort forwarding.
type HealthTarget struct {
	Addr netip.Addr
	Port uint16
}

// String formats the target as addr:port.
func (h HealthTarget) String() string { return netip.AddrPortFrom(h.Addr, h.Port).String() }

// Health says which health targets answered 200 at their last probe. A target that is missing has
// not answered yet and is not used.
type Health map[HealthTarget]bool

// toNodes says the gateway sends VIP traffic to nodes (nodePort or route forwarding), not to pods.
func (cfg Config) toNodes() bool {
	return cfg.Forwarding == cluster.ForwardNodePort || cfg.Forwarding == cluster.ForwardRoute
}
