package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// DecodeOptions are what the engine's decoder needs to know of the node's tables: the comments of
// tables written before rule comments were in the rules' userdata (NetlinkProgrammer.Decode for
// adoption and vipgate explain).
func DecodeOptions() dataplane.DecodeOptions {
	return dataplane.DecodeOptions{RestoreComments: RestoreComments}
}

// RestoreComments puts back the rule comments of the chains in legacy (dataplane.DecodeOptions):
// node tables written before the engine put rule comments into the rules' userdata, which a vipgate adopting such a table keeps
// until it changes them. Where the rule's chain and shape say which rule of build.go it is, the
// comment is build.go's, so traces of such a table still read like traces of the model ("DROP by
// fw-…#2 (not in loadBalancerSourceRanges)"). Chains with userdata keep exactly what it says.
func RestoreComments(f *dataplane.Flat, legacy map[string]bool) {
	if len(legacy) == 0 {
		return
	}
	// shape is a rule with its values cleared: the mark bit and prefixes vary by configuration.
	shape := func(r dataplane.Rule) string {
		r.Comment, r.Action.Value = "", 0
		ms := slices.Clone(r.Matches)
		for i := range ms {
			ms[i].Value, ms[i].Prefix = 0, netip.Prefix{}
		}
		r.Matches = ms
		return fmt.Sprintf("%+v", r)
	}
	known := map[string]string{}
	for _, masqAll := range []bool{false, true} {
		b := BuildBase(BaseConfig{Family: f.Family, MasqueradeAll: masqAll, MasqueradeBit: 14,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}})
		for _, c := range b.Chains {
			for _, r := range c.Rules {
				if r.Comment != "" {
					known[c.Name+"|"+shape(r)] = r.Comment
				}
			}
		}
	}
	for _, c := range f.Chains {
		if !legacy[c.Name] {
			continue
		}
		for i := range c.Rules {
			r := &c.Rules[i]
			if com, ok := known[c.Name+"|"+shape(*r)]; ok {
				r.Comment = com
				continue
			}
			r.Comment = serviceRuleComment(c.Name, *r)
		}
	}
}

// serviceRuleComment names the commented rules of the per-Service chains build.go writes.
func serviceRuleComment(chain string, r dataplane.Rule) string {
	has := func(k dataplane.MatchKind) bool {
		return len(r.Matches) == 1 && r.Matches[0].Kind == k
	}
	cn, _ := ParseChainName(chain)
	switch cn.Role {
	case ChainRoleFirewall:
		if len(r.Matches) == 0 && r.Action.Kind == dataplane.ActDrop {
			return tablenames.CommentNotInSourceRanges
		}
	case ChainRoleExternalLocalIP, ChainRoleExternalLocalNodePort:
		switch {
		case has(dataplane.MatchSaddrInSet) && r.Matches[0].Set == SetClusterCIDRs && r.Action.Kind == dataplane.ActGoto:
			return CommentShortCircuitPods
		case has(dataplane.MatchFibSaddrLocal) && r.Action.Kind == dataplane.ActJump && r.Action.Chain == ChainMarkForMasquerade:
			return CommentMasqueradeLocal
		case has(dataplane.MatchFibSaddrLocal) && r.Action.Kind == dataplane.ActGoto:
			return CommentShortCircuitLocal
		}
	case ChainRoleExternal:
		if len(r.Matches) == 0 && r.Action.Kind == dataplane.ActJump && r.Action.Chain == ChainMarkForMasquerade {
			return CommentMasquerade
		}
	}
	return ""
}
