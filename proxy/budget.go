package proxy

import (
	"fmt"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// What one Service may cost (cluster.ServiceLimits). A namespace tenant writes its Service's
// ports, externalIPs, loadBalancerSourceRanges and vipgate.io/lb-algorithm; what the node builds
// from them is a product: entries = ports x addresses, elements = entries x (endpoints, or the
// Maglev table's slots), firewall rules = ports x source ranges. So the builder checks the product
// before it builds anything (MaxEntries) and its running cost while it builds (MaxElements): it
// stops at the first entry that would go over, so a Service over the limit costs the node at most
// the limit and one entry's work, never the product. Such a Service is refused as a whole (a
// partial Service would be a different Service: some ports, or some addresses, answering and
// others not), and reported with the reason like every other refusal (Part.Refused: the log, a
// Warning Event on the Service, /status); its cluster IP stays in cluster-ips, so clients are
// rejected at once as on an undefined port. Every other Service is built as ever.

// serviceEntries is the number of entries svc's ports make on a node with the given external and
// LoadBalancer IPs of one family: each port on the cluster IP, each address and its NodePort.
func serviceEntries(svc *cluster.Service, externalIPs, lbIPs int) int {
	perIP := 1 + externalIPs + lbIPs
	n := 0
	for _, sp := range svc.Ports {
		if dataplane.ProtoNumber(sp.Protocol) == 0 || sp.Port == 0 {
			continue
		}
		n += perIP
		if sp.NodePort != 0 && (svc.Type == cluster.TypeNodePort || svc.Type == cluster.TypeLoadBalancer) {
			n++
		}
	}
	return n
}

// elementsOverLimit says why a Service is over limits.MaxElements.
func elementsOverLimit(limits cluster.ServiceLimits, entries int) string {
	return fmt.Sprintf("the Service is not programmed: its %d entries need more nftables elements than serviceLimits.maxElements %d (rules count %d each)",
		entries, limits.MaxElements, cluster.RuleCost)
}

// cost is what the part built so far costs, in elements (rules count cluster.RuleCost each).
func (b *serviceBuilder) cost() int {
	return len(b.p.Elements) + len(b.p.Sets) + cluster.RuleCost*b.rules
}

// afford says whether the part may grow by more elements within the Service's limit; once it may
// not, the Service is over (b.over says why) and the builder adds nothing more.
func (b *serviceBuilder) afford(more int) bool {
	if b.over != "" {
		return false
	}
	if b.cost()+more > b.limits.MaxElements {
		b.over = elementsOverLimit(b.limits, b.entries)
		return false
	}
	return true
}
