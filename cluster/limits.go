package cluster

import "fmt"

// ServiceLimits bound what one Service may cost a node or a gateway (serviceLimits in the
// NodeConfig and the GatewayConfig). Anyone who may create a Service in a namespace chooses its
// ports, externalIPs, loadBalancerSourceRanges and vipgate.io/lb-algorithm, and each entry (an
// address x a port) becomes map elements, each port with source ranges a chain of rules: without a
// bound a 19 KB object (400 externalIPs x 200 ports) is 80,200 entries, and a 500-port maglev
// Service half a million elements. A Service over a limit is not programmed at all (its cluster IP
// rejects connections, as an undefined port does) and is reported with the reason, like any other
// rejection (log, a Warning Event on the Service, /status); every other Service is programmed.
type ServiceLimits struct {
	// MaxEntries bounds a Service's entries: its ports x (its cluster IP, external IPs and
	// LoadBalancer IPs of one family, and its NodePort) on a node, its ports x LoadBalancer IPs on a
	// gateway (0: DefaultMaxServiceEntries).
	MaxEntries int
	// MaxElements bounds what a Service's part of one family's table holds: set and map elements,
	// and its own rules counted as RuleCost elements each (0: DefaultMaxServiceElements).
	MaxElements int
}

// Defaults and bounds of ServiceLimits.
const (
	// DefaultMaxServiceEntries admits a Service of MaxServicePorts ports on its cluster IP alone,
	// or 100 ports on 199 addresses.
	DefaultMaxServiceEntries = MaxServicePorts
	// DefaultMaxServiceElements is 2^17 elements: measured on kernel 6.18, a map element costs
	// 95-115 bytes of kernel memory (slab growth of a 50,500-element endpoint map: 101-115), so a
	// Service at the limit holds at most ~14 MiB of kernel state, and is built and sent in well
	// under a second (a 102,701-element Service: ~0.1 s to build, ~0.5 s to program). It holds a maglev Service port of 650 endpoints
	// (65,537 slots) on two entries, or a gateway's 128 VIP ports of 1,021 slots.
	DefaultMaxServiceElements = 1 << 17
	// RuleCost is what one rule of a Service's own chains (source ranges, affinity, round-robin)
	// counts against MaxElements: a rule with its expressions costs the kernel about what two
	// elements do.
	RuleCost = 2
	// maxServiceLimit is the largest value either limit may be configured to.
	maxServiceLimit = 1 << 24
)

// WithDefaults returns l with every unset limit at its default.
func (l ServiceLimits) WithDefaults() ServiceLimits {
	if l.MaxEntries == 0 {
		l.MaxEntries = DefaultMaxServiceEntries
	}
	if l.MaxElements == 0 {
		l.MaxElements = DefaultMaxServiceElements
	}
	return l
}

// serviceLimitsFile is serviceLimits in a config file.
type serviceLimitsFile struct {
	MaxEntries  int `json:"maxEntries"`
	MaxElements int `json:"maxElements"`
}

// parseServiceLimits checks and returns a config file's serviceLimits (unset fields stay 0: the
// defaults, which the dataplane applies).
func parseServiceLimits(f serviceLimitsFile) (ServiceLimits, error) {
	for _, v := range []struct {
		field string
		n     int
	}{{"serviceLimits.maxEntries", f.MaxEntries}, {"serviceLimits.maxElements", f.MaxElements}} {
		if v.n < 0 || v.n > maxServiceLimit {
			return ServiceLimits{}, fmt.Errorf("%s: %d is out of range 1-%d (0 or unset: the default)", v.field, v.n, maxServiceLimit)
		}
	}
	return ServiceLimits(f), nil
}
