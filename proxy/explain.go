package proxy

import (
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// ExplainRole is what the node's table means to `vipgate explain` (dataplane.Explain): why a
// candidate is masqueraded, by the chain that marked it; why a packet is dropped or rejected, by the
// chain of the rule; which sets hold Service addresses. The names are the node's schema's.
var ExplainRole = dataplane.ExplainRole{
	Masquerade: explainMasquerade,
	Verdict:    explainVerdict,
	EntrySets:  []string{tablenames.MapServiceIPs, MapNoEndpointServices, tablenames.MapFirewallIPs},
}

// explainMasquerade says why candidate c was masqueraded by the first jump to the chain that marks
// for masquerade (MasqNone without one: hairpin or other, the engine tells).
func explainMasquerade(_ *dataplane.Flat, c dataplane.Candidate) (dataplane.MasqReason, dataplane.RuleRef) {
	var mark dataplane.RuleRef
	for _, j := range c.Jumps {
		if j.To == ChainMarkForMasquerade && j.Rule.Action == dataplane.ActJump {
			mark = j.Rule
			break
		}
	}
	if mark.Chain == "" {
		return dataplane.MasqNone, mark
	}
	if mark.Chain == tablenames.ChainServices {
		return dataplane.MasqClusterIPFromOutside, mark
	}
	cn, _ := ParseChainName(mark.Chain)
	switch cn.Role {
	case ChainRoleMasqPick, ChainRoleExternal:
		return dataplane.MasqExternalCluster, mark
	case ChainRoleExternalLocalIP, ChainRoleExternalLocalNodePort:
		return dataplane.MasqLocalFromHost, mark
	}
	return dataplane.MasqMarkedByChain, mark
}

// explainVerdict says why a rule of chain dropped or rejected (o) the packet.
func explainVerdict(chain string, o dataplane.Outcome) (dataplane.VerdictReason, string) {
	switch {
	case chain == dataplane.ChainReject:
		return dataplane.VerdictNoEndpoints, ""
	case chain == ChainServiceEndpointsCheck || chain == ChainNodePortEndpointsCheck:
		return dataplane.VerdictNoLocalEndpoints, ""
	case chain == ChainClusterIPsCheck && o == dataplane.OutcomeReject:
		return dataplane.VerdictClusterIPNoPort, ""
	case chain == ChainClusterIPsCheck:
		return dataplane.VerdictClusterIPUnallocated, ""
	}
	if cn, ok := ParseChainName(chain); ok && cn.Role == ChainRoleFirewall {
		return dataplane.VerdictSourceRange, cn.ServicePort()
	}
	return dataplane.VerdictOther, ""
}
