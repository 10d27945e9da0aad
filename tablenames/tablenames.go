// Package tablenames holds the names the node's table (proxy/) and the gateway's (gateway/) share:
// their base chains, the Service dispatch and masquerading chains, the loadBalancerSourceRanges
// check (firewall-check, firewall-ips, the fw- chain of a Service port) and the Service IP map.
// They follow kube-proxy's nftables mode where the job is the same, so an operator who knows
// `nft list table ip kube-proxy` can read `nft list table ip vipgate`. They name kernel objects
// that hold live flows: they never change.
//
// The nftables engine (dataplane/) names none of them: it imports neither this package nor the
// roles (dataplane/nodenames_test.go, dataplane/imports_test.go). Each role's own names are its
// own: the node's in proxy/names.go, the gateway's in gateway/.
package tablenames

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// The base chains.
const (
	ChainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	ChainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	ChainFilterInput             = "filter-input"
	ChainFilterForward           = "filter-forward"
	ChainFilterOutput            = "filter-output"
	ChainNATPrerouting           = "nat-prerouting"
	ChainNATOutput               = "nat-output"
	ChainNATPostrouting          = "nat-postrouting"
)

// The regular chains and the sets both roles' tables have.
const (
	// ChainServices dispatches Service (VIP) traffic by MapServiceIPs.
	ChainServices = "services"
	// ChainMasquerading source-NATs what a role marked for it.
	ChainMasquerading = "masquerading"
	// ChainFirewallCheck sends new connections to an address of MapFirewallIPs to the fw- chain
	// of its Service port (FirewallChain).
	ChainFirewallCheck = "firewall-check"

	MapServiceIPs  = "service-ips"
	MapFirewallIPs = "firewall-ips"
)

// CommentNotInSourceRanges is the comment of a fw- chain's drop rule.
const CommentNotInSourceRanges = "not in loadBalancerSourceRanges"

// PrefixFirewall begins the name of a Service port's fw- chain (FirewallChain).
const PrefixFirewall = "fw-"

// FirewallChain is the name of the fw- chain of a Service port, which checks
// loadBalancerSourceRanges: "fw-" and ServicePortName.
func FirewallChain(key cluster.ServiceKey, proto uint8, port uint16) string {
	return PrefixFirewall + ServicePortName(key, proto, port)
}

// ParseFirewallChain takes a fw- chain's name apart (ok false for any other name).
func ParseFirewallChain(name string) (key cluster.ServiceKey, proto uint8, port uint16, ok bool) {
	rest, ok := strings.CutPrefix(name, PrefixFirewall)
	if !ok {
		return cluster.ServiceKey{}, 0, 0, false
	}
	return ParseServicePortName(rest)
}

// ServicePort spells a Service port for people: "ns/name port 80/tcp".
func ServicePort(key cluster.ServiceKey, proto uint8, port uint16) string {
	return fmt.Sprintf("%s port %d/%s", key, port, dataplane.ProtoName(proto))
}

// chainSafe makes s usable as a field of ServicePortName: an nft identifier holds letters, digits
// and / - _ . only, and / separates the fields. cluster admits only DNS labels as namespaces and
// names, which pass unchanged.
func chainSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '.'
	}, s)
}

// ServicePortName is the readable base of a Service port's own chains: ns/name/proto/port.
func ServicePortName(key cluster.ServiceKey, proto uint8, port uint16) string {
	return fmt.Sprintf("%s/%s/%s/%d", chainSafe(key.Namespace), chainSafe(key.Name), dataplane.ProtoName(proto), port)
}

// ParseServicePortName is the inverse of ServicePortName.
func ParseServicePortName(s string) (cluster.ServiceKey, uint8, uint16, bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" {
		return cluster.ServiceKey{}, 0, 0, false
	}
	var proto uint8
	switch parts[2] {
	case "tcp":
		proto = dataplane.ProtoTCP
	case "udp":
		proto = dataplane.ProtoUDP
	case "sctp":
		proto = dataplane.ProtoSCTP
	default:
		p, err := strconv.ParseUint(parts[2], 10, 8)
		if err != nil {
			return cluster.ServiceKey{}, 0, 0, false
		}
		proto = uint8(p)
	}
	port, err := strconv.ParseUint(parts[3], 10, 16)
	if err != nil || port == 0 {
		return cluster.ServiceKey{}, 0, 0, false
	}
	return cluster.ServiceKey{Namespace: parts[0], Name: parts[1]}, proto, uint16(port), true
}
