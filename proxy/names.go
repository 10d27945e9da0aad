package proxy

import (
	"slices"
	"strconv"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/tablenames"
)

// The node's names: the fixed chains and sets of its table besides those it shares with the
// gateway's (tablenames: base chains, services, masquerading, firewall-check, service-ips,
// firewall-ips), and the names of its per-Service and shared chains. They follow kube-proxy's
// nftables mode where the job is the same. The engine names none of them (it is told what it needs
// as options: DiffOptions.Sharable, ExplainRole, DecodeOptions); ChainReject, the chain a verdict
// map's reject goes to, is the engine's (dataplane.ChainReject).
const (
	ChainMarkForMasquerade      = "mark-for-masquerade"
	ChainServiceEndpointsCheck  = "service-endpoints-check"
	ChainNodePortEndpointsCheck = "nodeport-endpoints-check"
	ChainClusterIPsCheck        = "cluster-ips-check"

	SetClusterIPs          = "cluster-ips"
	SetNodePortIPs         = "nodeport-ips"
	SetClusterCIDRs        = "cluster-cidrs"
	SetServiceCIDRs        = "service-cidrs"
	MapServiceNodePorts    = "service-nodeports"
	MapNoEndpointServices  = "no-endpoint-services"
	MapNoEndpointNodePorts = "no-endpoint-nodeports"
	SetHairpin             = "hairpin-connections"
	// The endpoint maps: (entry, endpoint index) -> endpoint. "endpoints" holds the endpoint set of the
	// entry's own traffic policy; "endpoints-cluster" the cluster-wide set that pod and host traffic to an
	// externalTrafficPolicy=Local entry short-circuits to.
	MapEndpoints                = "endpoints"
	MapEndpointsCluster         = "endpoints-cluster"
	MapNodePortEndpoints        = "nodeport-endpoints"
	MapNodePortEndpointsCluster = "nodeport-endpoints-cluster"
)

// Comments of the per-Service rules, as the rules carry them (the netlink edge writes them into the
// rule's userdata; RestoreComments puts them back on tables written before that). The fw- chain's
// is shared with the gateway (tablenames.CommentNotInSourceRanges).
const (
	CommentMasquerade        = "masquerade"
	CommentShortCircuitPods  = "short-circuit pod traffic"
	CommentMasqueradeLocal   = "masquerade local traffic"
	CommentShortCircuitLocal = "short-circuit local traffic"
)

// Chain names. Besides the fixed chains above, a table holds chains of two sorts, and their names
// say what they are: the chains of one Service port (named after it: <prefix><ns>/<name>/<proto>/<port>,
// see tablenames.ServicePortName), and the shared endpoint pickers. The names are built and parsed
// here only; build.go, pickers.go, comments.go and explain.go read them through ChainName and
// ParseChainName.

// ChainRole says what a chain of vipgate's table is for.
type ChainRole uint8

// The chain roles.
const (
	ChainRoleUnknown ChainRole = iota
	// ChainRoleFixed: one of the fixed chains of BuildBase (baseChains and the Chain* constants).
	ChainRoleFixed
	// ChainRoleFirewall: fw-<port>, the loadBalancerSourceRanges check of a Service port.
	ChainRoleFirewall
	// ChainRoleExternal: ext-<port>, externalTrafficPolicy=Cluster traffic of a Service port whose
	// picker is its own (affinity, round-robin): masquerade, then pick.
	ChainRoleExternal
	// ChainRoleExternalLocalIP / ChainRoleExternalLocalNodePort: local-ip-<port> / local-np-<port>,
	// externalTrafficPolicy=Local traffic to a Service port's IP entries / NodePort.
	ChainRoleExternalLocalIP
	ChainRoleExternalLocalNodePort
	// ChainRoleAffinity: aff-<port>-<policy>, the session-affinity picker of a Service port.
	ChainRoleAffinity
	// ChainRoleRoundRobin: rr-<port>-<policy>, the round-robin picker of a Service port.
	ChainRoleRoundRobin
	// ChainRolePick: pick-[sh-|mg-]<map>-<n>, a shared picker (random, source-hash, maglev).
	ChainRolePick
	// ChainRoleMasqPick: masq-pick-<picker>, a shared picker's masquerading twin.
	ChainRoleMasqPick
)

var chainRoleNames = [...]string{"unknown", "fixed", "firewall", "external", "external-local-ip", "external-local-nodeport",
	"affinity", "round-robin", "pick", "masq-pick"}

func (r ChainRole) String() string {
	if int(r) < len(chainRoleNames) {
		return chainRoleNames[r]
	}
	return "ChainRole(" + strconv.Itoa(int(r)) + ")"
}

// PerServicePort says whether chains of role r belong to one Service port.
func (r ChainRole) PerServicePort() bool {
	return r >= ChainRoleFirewall && r <= ChainRoleRoundRobin
}

// Name prefixes. The prefixes of the per-Service chains are prefix-free: none is the beginning of
// another, so the prefix a name starts with is its role whatever the namespace that follows (a
// namespace is a DNS label and may itself begin with "ip-" or "local-"). The eTP=Local chains were
// ext-ip- and ext-np- once, which an ext- chain of namespace "ip-…" or "np-…" could not be told
// from; a table that still has them is adopted by deleting them (adopt.go, TestAdoptLegacyChainNames).
const (
	prefixFirewall      = tablenames.PrefixFirewall
	prefixExternal      = "ext-"
	prefixExternalIP    = "local-ip-"
	prefixExternalNP    = "local-np-"
	prefixAffinity      = "aff-"
	prefixRoundRobin    = "rr-"
	prefixPick          = "pick-"
	prefixMasqPick      = "masq-pick-"
	prefixPickSrcHash   = "sh-"
	prefixPickMaglev    = "mg-"
	PolicyCluster       = "cluster"
	PolicyLocal         = "local"
	policySuffixCluster = "-" + PolicyCluster
	policySuffixLocal   = "-" + PolicyLocal
)

// ChainName is a chain name taken apart: what ParseChainName returns and String builds back.
type ChainName struct {
	Role ChainRole
	// Fixed is the name of a ChainRoleFixed chain.
	Fixed string
	// Service, Proto and Port name the Service port of a per-Service chain (Role.PerServicePort).
	Service cluster.ServiceKey
	Proto   uint8
	Port    uint16
	// Policy is "cluster" or "local" for ChainRoleAffinity and ChainRoleRoundRobin: which traffic
	// policy's endpoint set the chain picks from.
	Policy string
	// Map, Size and Algorithm describe a shared picker (ChainRolePick, ChainRoleMasqPick): its
	// endpoint map, its endpoint count (the Maglev table size for maglev) and its algorithm
	// (cluster.LBRandom, LBSourceHash or LBMaglev).
	Map       string
	Size      int
	Algorithm cluster.LBAlgorithm
}

// String builds the chain's name.
func (c ChainName) String() string {
	switch {
	case c.Role == ChainRoleFixed:
		return c.Fixed
	case c.Role.PerServicePort():
		return PerPortChain(c.Role, tablenames.ServicePortName(c.Service, c.Proto, c.Port), c.Policy)
	case c.Role == ChainRolePick:
		return PickChainFor(c.Algorithm, c.Map, c.Size)
	case c.Role == ChainRoleMasqPick:
		return prefixMasqPick + strings.TrimPrefix(PickChainFor(c.Algorithm, c.Map, c.Size), prefixPick)
	}
	return ""
}

// ServicePort spells the Service port of a per-Service chain for people: "ns/name port 80/tcp".
func (c ChainName) ServicePort() string { return tablenames.ServicePort(c.Service, c.Proto, c.Port) }

// PerPortChain names the chain of role r of the Service port whose servicePortName is port (policy:
// for affinity and round-robin chains).
func PerPortChain(r ChainRole, port, policy string) string {
	switch r {
	case ChainRoleFirewall:
		return prefixFirewall + port
	case ChainRoleExternal:
		return prefixExternal + port
	case ChainRoleExternalLocalIP:
		return prefixExternalIP + port
	case ChainRoleExternalLocalNodePort:
		return prefixExternalNP + port
	case ChainRoleAffinity:
		return prefixAffinity + port + "-" + policy
	case ChainRoleRoundRobin:
		return prefixRoundRobin + port + "-" + policy
	}
	return ""
}

// isFixedChain says whether name is one of BuildBase's chains.
func isFixedChain(name string) bool {
	switch name {
	case tablenames.ChainServices, tablenames.ChainMasquerading, ChainMarkForMasquerade, ChainServiceEndpointsCheck,
		ChainNodePortEndpointsCheck, dataplane.ChainReject, ChainClusterIPsCheck, tablenames.ChainFirewallCheck:
		return true
	}
	return slices.ContainsFunc(baseChains, func(c baseChain) bool { return c.name == name })
}

// ParseChainName takes a chain name of vipgate's node table apart. ok is false for a name vipgate's
// node table does not use (the gateway's fixed chains among them). Every name ChainName.String builds
// parses back to that ChainName (TestChainNameRoundTrip). The old names of the eTP=Local chains
// (ext-ip-…, ext-np-…) are not recognised as such: they read as the ext- chain of a namespace "ip-…"
// or "np-…", which is the ambiguity that retired them; the first sync after an upgrade deletes them.
func ParseChainName(name string) (ChainName, bool) {
	if isFixedChain(name) {
		return ChainName{Role: ChainRoleFixed, Fixed: name}, true
	}
	if rest, ok := strings.CutPrefix(name, prefixMasqPick); ok {
		c, ok := parsePicker(rest)
		c.Role = ChainRoleMasqPick
		return c, ok
	}
	if rest, ok := strings.CutPrefix(name, prefixPick); ok {
		return parsePicker(rest)
	}
	for _, pp := range perPortPrefixes {
		rest, ok := strings.CutPrefix(name, pp.prefix)
		if !ok {
			continue
		}
		c := ChainName{Role: pp.role}
		if pp.role == ChainRoleAffinity || pp.role == ChainRoleRoundRobin {
			if r, ok := strings.CutSuffix(rest, policySuffixCluster); ok {
				rest, c.Policy = r, PolicyCluster
			} else if r, ok := strings.CutSuffix(rest, policySuffixLocal); ok {
				rest, c.Policy = r, PolicyLocal
			} else {
				return ChainName{}, false
			}
		}
		if c.Service, c.Proto, c.Port, ok = tablenames.ParseServicePortName(rest); ok {
			return c, true
		}
	}
	return ChainName{}, false
}

// perPortPrefixes are the name prefixes of the per-Service chains. Being prefix-free, at most one of
// them matches a name, so their order does not matter.
var perPortPrefixes = []struct {
	prefix string
	role   ChainRole
}{
	{prefixFirewall, ChainRoleFirewall}, {prefixExternal, ChainRoleExternal},
	{prefixExternalIP, ChainRoleExternalLocalIP}, {prefixExternalNP, ChainRoleExternalLocalNodePort},
	{prefixAffinity, ChainRoleAffinity}, {prefixRoundRobin, ChainRoleRoundRobin},
}

// parsePicker parses what follows "pick-" in a shared picker's name.
func parsePicker(rest string) (ChainName, bool) {
	c := ChainName{Role: ChainRolePick, Algorithm: cluster.LBRandom}
	if r, ok := strings.CutPrefix(rest, prefixPickSrcHash); ok {
		c.Algorithm, rest = cluster.LBSourceHash, r
	} else if r, ok := strings.CutPrefix(rest, prefixPickMaglev); ok {
		c.Algorithm, rest = cluster.LBMaglev, r
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return ChainName{}, false
	}
	n, err := strconv.Atoi(rest[i+1:])
	if err != nil || n <= 0 || (c.Algorithm == cluster.LBMaglev && !maglev.IsPrime(n)) {
		return ChainName{}, false
	}
	c.Map, c.Size = rest[:i], n
	switch c.Map {
	case MapEndpoints, MapEndpointsCluster, MapNodePortEndpoints, MapNodePortEndpointsCluster:
		return c, true
	}
	return ChainName{}, false
}

// Shared endpoint-picking chains. One chain per (endpoint map, endpoint count) holds the only rule that
// binds the endpoint map: `dnat to <entry> . numgen random mod N map @map`. Services with the same
// endpoint count share it, so the number of rules bound to a big map stays at the number of distinct
// endpoint counts instead of the number of Services (see dataplane/README.md for the kernel figures).

// PickChain returns the name of the shared chain that picks one of n endpoints from map m.
func PickChain(m string, n int) string { return prefixPick + m + "-" + strconv.Itoa(n) }

// MasqPickChain returns the shared chain that marks for masquerade and then picks.
func MasqPickChain(m string, n int) string { return prefixMasqPick + m + "-" + strconv.Itoa(n) }

// PickChainFor returns the shared picker of map m for a balancing algorithm: PickChain for random;
// "pick-sh-<map>-<n>" for source-hash (jhash of the client address mod n); "pick-mg-<map>-<M>" for
// maglev, n being the Maglev table size M.
func PickChainFor(alg cluster.LBAlgorithm, m string, n int) string {
	switch alg {
	case cluster.LBSourceHash:
		return prefixPick + prefixPickSrcHash + m + "-" + strconv.Itoa(n)
	case cluster.LBMaglev:
		return prefixPick + prefixPickMaglev + m + "-" + strconv.Itoa(n)
	}
	return PickChain(m, n)
}

// IsPickChain says whether name is a shared picker (not its masquerading twin); MasqTwin names the
// twin of such a picker, PickOfTwin the picker of a twin, and IsMasqPickChain says whether name is a
// twin.
func IsPickChain(name string) bool     { return strings.HasPrefix(name, prefixPick) }
func MasqTwin(pick string) string      { return prefixMasqPick + strings.TrimPrefix(pick, prefixPick) }
func PickOfTwin(masq string) string    { return prefixPick + strings.TrimPrefix(masq, prefixMasqPick) }
func IsMasqPickChain(name string) bool { return strings.HasPrefix(name, prefixMasqPick) }
