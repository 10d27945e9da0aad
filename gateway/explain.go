package gateway

import (
	"slices"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// ExplainRole is what the gateway's tables mean to `vipgate explain` (dataplane.Explain): a
// candidate reached through a masquerading picker is the gateway's SNAT; a drop by a fw- chain is
// loadBalancerSourceRanges; service-ips and firewall-ips hold the VIPs.
var ExplainRole = dataplane.ExplainRole{
	Masquerade: explainMasquerade,
	Verdict:    explainVerdict,
	EntrySets:  []string{tablenames.MapServiceIPs, tablenames.MapFirewallIPs},
}

// explainMasquerade says MasqGatewaySNAT for a candidate whose branch went through one of the
// gateway's masquerading pickers (MasqNone otherwise).
func explainMasquerade(_ *dataplane.Flat, c dataplane.Candidate) (dataplane.MasqReason, dataplane.RuleRef) {
	if slices.ContainsFunc(c.Jumps, func(j dataplane.Jump) bool {
		return j.To == ChainGatewayMasqPick || j.To == ChainGatewayMasqPickSH
	}) {
		return dataplane.MasqGatewaySNAT, dataplane.RuleRef{}
	}
	return dataplane.MasqNone, dataplane.RuleRef{}
}

// explainVerdict says VerdictSourceRange for a drop by a VIP port's fw- chain
// (tablenames.FirewallChain).
func explainVerdict(chain string, _ dataplane.Outcome) (dataplane.VerdictReason, string) {
	if key, proto, port, ok := tablenames.ParseFirewallChain(chain); ok {
		return dataplane.VerdictSourceRange, tablenames.ServicePort(key, proto, port)
	}
	return dataplane.VerdictOther, ""
}
