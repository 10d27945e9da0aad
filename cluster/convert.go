package cluster

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// PortRange is an inclusive range of L4 ports.
type PortRange struct {
	Min, Max uint16
}

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port int32) bool {
	return port >= int32(r.Min) && port <= int32(r.Max)
}

// String formats the range as kube-apiserver's --service-node-port-range flag does ("30000-32767").
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// NodePortRange is the range every nodePort and healthCheckNodePort must lie in. vipgate uses the
// Kubernetes default range; it is a variable so that a cluster with a different
// --service-node-port-range can be supported by setting it before any conversion runs.
var NodePortRange = PortRange{Min: 30000, Max: 32767}

// MaxAffinityTimeout is the longest ClientIP session-affinity timeout Kubernetes accepts (one day).
const MaxAffinityTimeout = 86400 * time.Second

// DefaultAffinityTimeout is the ClientIP session-affinity timeout when the Service gives none (3 hours).
const DefaultAffinityTimeout = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second

// ServiceNameLabel is the EndpointSlice label that names the owning Service.
const ServiceNameLabel = discoveryv1.LabelServiceName

// ZoneLabel is the well-known node label holding the node's zone.
const ZoneLabel = corev1.LabelTopologyZone

// Limits of one object. The first three are the API server's own (k8s.io/kubernetes
// pkg/apis/discovery/validation: maxEndpoints, maxAddresses, maxPorts), so an object over them cannot
// come from a cluster, only from a file or a forged watch. The API does not bound the number of
// Service ports; vipgate refuses more ports than one EndpointSlice may hold, since a Service with
// more could never have endpoints for all of them (every slice lists all the ports it serves), and
// because every port is a verdict-map element per entry: a 65,535-port Service is a denial of
// service on the node, not a Service.
const (
	MaxSliceEndpoints    = 1000
	MaxEndpointAddresses = 100
	MaxSlicePorts        = 20000
	MaxServicePorts      = MaxSlicePorts
)

// limitBroadcast is the IPv4 limited broadcast address.
var limitBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// SpecialAddrClass says what kind of special address a is, "" for an ordinary address. Such an
// address is never a Service entry (cluster IP, external IP, LoadBalancer IP) or an endpoint: a
// Service on 127.0.0.1 or 0.0.0.0 answers on the node's own loopback or on every local address,
// one on 169.254.169.254 captures the cloud metadata service, and multicast or broadcast
// destinations are local to the segment (the CVE-2020-8554 class of capture). The API server
// refuses the same classes in spec.externalIPs and EndpointSlice addresses (ValidateNonSpecialIP,
// ValidateEndpointIP) but not in status.loadBalancer.ingress, and files and forged objects bypass it
// altogether, so vipgate checks every field itself.
func SpecialAddrClass(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.Is4() && a.As4()[0] == 0:
		return "unspecified (0.0.0.0/8, \"this network\")"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a == limitBroadcast:
		return "broadcast"
	}
	return ""
}

// checkNotSpecial refuses a special address in field f (see SpecialAddrClass); what says what the
// address would have been ("a Service entry", "an endpoint").
func checkNotSpecial(f string, a netip.Addr, what string) error {
	if class := SpecialAddrClass(a); class != "" {
		return &AddrError{Addr: a, Err: fieldErr(f, "%s is a special address (%s), never %s: it would capture traffic of the node itself or of its network", a, class, what)}
	}
	return nil
}

// AddrError is an object's error about one of its addresses (a special address where none may
// be). A Rejection made from it carries the address (Rejection.Addr, see ErrorAddr), so that
// programs find the rejections of an address without reading their text.
type AddrError struct {
	Addr netip.Addr
	Err  error
}

func (e *AddrError) Error() string { return e.Err.Error() }
func (e *AddrError) Unwrap() error { return e.Err }

// ErrorAddr returns the address err is about (an *AddrError in its chain), zero if none.
func ErrorAddr(err error) netip.Addr {
	if ae, ok := errors.AsType[*AddrError](err); ok {
		return ae.Addr
	}
	return netip.Addr{}
}

// fieldErr builds an error that names the offending field first, so a log line or a Rejection tells
// the user exactly what to fix.
func fieldErr(field string, format string, args ...any) error {
	return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
}

// parseIP parses one textual IP strictly (no zones, no leading zeros) and unmaps IPv4-in-IPv6 so that
// the family is unambiguous.
func parseIP(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, fieldErr(field, "%q is not a valid IP address", s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fieldErr(field, "%q: IPv6 zones are not allowed", s)
	}
	return a.Unmap(), nil
}

// parsePrefix parses one CIDR. Like kube-proxy it tolerates surrounding whitespace (the API's
// validation lets it through) and host bits (the API lets "10.0.0.1/8" through too); the prefix is
// masked so that consumers see the network.
func parsePrefix(field, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fieldErr(field, "%q is not a valid CIDR", s)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fieldErr(field, "%q: IPv6 zones are not allowed", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fieldErr(field, "%q: IPv4-mapped IPv6 prefixes are not allowed", s)
	}
	return p.Masked(), nil
}

// checkName validates an object name with the given Kubernetes name rule.
func checkName(field, value string, rule func(string) []string) error {
	if value == "" {
		return fieldErr(field, "required")
	}
	if msgs := rule(value); len(msgs) > 0 {
		return fieldErr(field, "%q is invalid: %s", value, strings.Join(msgs, "; "))
	}
	return nil
}

// checkMeta validates a namespaced object's name and namespace. Names end up in nftables comments and
// chain names, so they are held to the API's own rules even when they come from a file.
func checkMeta(namespace, name string, nameRule func(string) []string) error {
	if err := checkName("metadata.name", name, nameRule); err != nil {
		return err
	}
	return checkName("metadata.namespace", namespace, validation.IsDNS1123Label)
}

// protocolOf resolves a port's protocol. Kubernetes defaults an empty protocol to TCP; anything it
// does not know is an error rather than being silently proxied as TCP.
func protocolOf(field string, p corev1.Protocol) (Protocol, error) {
	switch p {
	case "", corev1.ProtocolTCP:
		return TCP, nil
	case corev1.ProtocolUDP:
		return UDP, nil
	case corev1.ProtocolSCTP:
		return SCTP, nil
	}
	return "", fieldErr(field, "unsupported protocol %q (want TCP, UDP or SCTP)", p)
}

// checkPort validates a port number in 1-65535.
func checkPort(field string, port int32) error {
	if port < 1 || port > 65535 {
		return fieldErr(field, "%d is out of range 1-65535", port)
	}
	return nil
}

// familyOfAPI maps an API IP family name.
func familyOfAPI(field string, f corev1.IPFamily) (Family, error) {
	switch f {
	case corev1.IPv4Protocol:
		return IPv4, nil
	case corev1.IPv6Protocol:
		return IPv6, nil
	}
	return 0, fieldErr(field, "unknown IP family %q (want IPv4 or IPv6)", f)
}

// familyName spells a Family as the API does.
func familyName(f Family) string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// ServiceFromAPI converts and validates a v1 Service. It reads the Service the way kube-proxy does
// (defaults, policies, which load-balancer ingress entries count) and rejects, with an error naming the
// field, anything the dataplane could not program faithfully. svc is not modified.
func ServiceFromAPI(svc *corev1.Service) (*Service, error) {
	if svc == nil {
		return nil, errors.New("nil Service")
	}
	if err := checkMeta(svc.Namespace, svc.Name, validation.IsDNS1035Label); err != nil {
		return nil, err
	}
	spec := &svc.Spec
	out := &Service{
		Key:         ServiceKey{Namespace: svc.Namespace, Name: svc.Name},
		Type:        TypeClusterIP,
		Created:     svc.CreationTimestamp.Time,
		UID:         string(svc.UID),
		Labels:      maps.Clone(svc.Labels),
		Annotations: maps.Clone(svc.Annotations),
	}
	switch spec.Type {
	case "", corev1.ServiceTypeClusterIP:
	case corev1.ServiceTypeNodePort:
		out.Type = TypeNodePort
	case corev1.ServiceTypeLoadBalancer:
		out.Type = TypeLoadBalancer
	case corev1.ServiceTypeExternalName:
		out.Type = TypeExternalName
	default:
		return nil, fieldErr("spec.type", "unknown Service type %q", spec.Type)
	}
	if spec.IPFamilyPolicy != nil {
		out.IPFamilyPolicy = string(*spec.IPFamilyPolicy)
	}
	if spec.LoadBalancerIP != "" {
		a, err := parseIP("spec.loadBalancerIP", spec.LoadBalancerIP)
		if err != nil {
			return nil, err
		}
		out.RequestedLoadBalancerIP = a
	}
	if spec.LoadBalancerClass != nil {
		out.LoadBalancerClass = *spec.LoadBalancerClass
	}

	if err := serviceFamilies(spec, out); err != nil {
		return nil, err
	}
	if err := servicePorts(spec, out); err != nil {
		return nil, err
	}
	if err := servicePolicies(svc, out); err != nil {
		return nil, err
	}
	if err := serviceExternalAddrs(svc, out); err != nil {
		return nil, err
	}
	return out, nil
}

// serviceFamilies resolves ClusterIPs, Headless and IPFamilies.
func serviceFamilies(spec *corev1.ServiceSpec, out *Service) error {
	for i, f := range spec.IPFamilies {
		fam, err := familyOfAPI(fmt.Sprintf("spec.ipFamilies[%d]", i), f)
		if err != nil {
			return err
		}
		if slices.Contains(out.IPFamilies, fam) {
			return fieldErr(fmt.Sprintf("spec.ipFamilies[%d]", i), "duplicate family %s", f)
		}
		out.IPFamilies = append(out.IPFamilies, fam)
	}

	ips := spec.ClusterIPs
	field := "spec.clusterIPs"
	if len(ips) == 0 && spec.ClusterIP != "" {
		ips, field = []string{spec.ClusterIP}, "spec.clusterIP"
	} else if spec.ClusterIP != "" && len(ips) > 0 && spec.ClusterIP != ips[0] {
		err := fieldErr("spec.clusterIP", "%q differs from spec.clusterIPs[0] %q", spec.ClusterIP, ips[0])
		if a, perr := netip.ParseAddr(spec.ClusterIP); perr == nil {
			return &AddrError{Addr: a.Unmap(), Err: err} // explain finds the rejection by spec.clusterIP's address
		}
		return err
	}

	// ExternalName Services are never proxied (kube-proxy skips them even if a cluster IP is set).
	if out.Type == TypeExternalName {
		if spec.ExternalName == "" {
			return fieldErr("spec.externalName", "required for type ExternalName")
		}
		return nil
	}
	if len(ips) > 0 && ips[0] == corev1.ClusterIPNone {
		if len(ips) > 1 {
			return fieldErr(field, "\"None\" must be the only value")
		}
		if out.Type != TypeClusterIP {
			return fieldErr(field, "\"None\" (headless) is only valid for type ClusterIP, not %s", out.Type)
		}
		out.Headless = true
		return nil
	}
	if len(ips) == 0 {
		// The API server allocates cluster IPs; a file has nobody to do it, and kube-proxy skips a
		// Service without one. Say so instead of silently ignoring the Service.
		return fieldErr("spec.clusterIP", "required (vipgate does not allocate cluster IPs; use \"None\" for a headless Service)")
	}
	if len(ips) > 2 {
		return fieldErr(field, "at most two cluster IPs (one per family), got %d", len(ips))
	}
	for i, s := range ips {
		f := fmt.Sprintf("%s[%d]", field, i)
		if field == "spec.clusterIP" {
			f = field
		}
		a, err := parseIP(f, s)
		if err != nil {
			return err
		}
		if err := checkNotSpecial(f, a, "a cluster IP"); err != nil {
			return err
		}
		fam := FamilyOf(a)
		if i < len(out.IPFamilies) && out.IPFamilies[i] != fam {
			return &AddrError{Addr: a, Err: fieldErr(f, "%s is %s but spec.ipFamilies[%d] is %s", a, familyName(fam), i, familyName(out.IPFamilies[i]))}
		}
		if i == 1 && FamilyOf(out.ClusterIPs[0]) == fam {
			return &AddrError{Addr: a, Err: fieldErr(f, "%s has the same family as %s (dual-stack needs one IPv4 and one IPv6)", a, out.ClusterIPs[0])}
		}
		out.ClusterIPs = append(out.ClusterIPs, a)
	}
	if len(out.IPFamilies) > len(out.ClusterIPs) {
		return fieldErr("spec.ipFamilies", "lists %d families but there are %d cluster IPs", len(out.IPFamilies), len(out.ClusterIPs))
	}
	if len(out.IPFamilies) == 0 {
		// Files rarely spell out ipFamilies; the API server derives them from the cluster IPs.
		for _, a := range out.ClusterIPs {
			out.IPFamilies = append(out.IPFamilies, FamilyOf(a))
		}
	}
	return nil
}

// servicePorts converts and checks spec.ports.
func servicePorts(spec *corev1.ServiceSpec, out *Service) error {
	if len(spec.Ports) == 0 && !out.Headless && out.Type != TypeExternalName {
		return fieldErr("spec.ports", "required for a Service that is not headless")
	}
	if len(spec.Ports) > MaxServicePorts {
		return fieldErr("spec.ports", "%d ports, more than the %d an EndpointSlice may hold", len(spec.Ports), MaxServicePorts)
	}
	type protoPort struct {
		proto Protocol
		port  int32
	}
	seenPort := map[protoPort]int{}
	seenNodePort := map[protoPort]int{}
	seenName := map[string]int{}
	for i, p := range spec.Ports {
		f := fmt.Sprintf("spec.ports[%d]", i)
		proto, err := protocolOf(f+".protocol", p.Protocol)
		if err != nil {
			return err
		}
		if err := checkPort(f+".port", p.Port); err != nil {
			return err
		}
		if j, dup := seenPort[protoPort{proto, p.Port}]; dup {
			return fieldErr(f+".port", "%s/%d duplicates spec.ports[%d]", proto, p.Port, j)
		}
		seenPort[protoPort{proto, p.Port}] = i
		// Endpoint ports are matched to Service ports by name, so names must tell ports apart.
		if p.Name == "" && len(spec.Ports) > 1 {
			return fieldErr(f+".name", "required when a Service has more than one port")
		}
		// A Service port name is a DNS-1123 label (up to 63 characters), as the API server validates
		// it; it is matched to EndpointSlice port names, not to container port names, so the stricter
		// IANA_SVC_NAME rule (15 characters) of container ports does not apply to it.
		if p.Name != "" {
			if msgs := validation.IsDNS1123Label(p.Name); len(msgs) > 0 {
				return fieldErr(f+".name", "%q is invalid: %s", p.Name, strings.Join(msgs, "; "))
			}
		}
		if j, dup := seenName[p.Name]; dup {
			return fieldErr(f+".name", "%q duplicates spec.ports[%d]", p.Name, j)
		}
		seenName[p.Name] = i

		sp := ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)}
		if p.NodePort != 0 {
			if out.Type != TypeNodePort && out.Type != TypeLoadBalancer {
				return fieldErr(f+".nodePort", "only valid for types NodePort and LoadBalancer, not %s", out.Type)
			}
			if !NodePortRange.Contains(p.NodePort) {
				return fieldErr(f+".nodePort", "%d is outside the NodePort range %s", p.NodePort, NodePortRange)
			}
			if j, dup := seenNodePort[protoPort{proto, p.NodePort}]; dup {
				return fieldErr(f+".nodePort", "%s/%d duplicates spec.ports[%d].nodePort", proto, p.NodePort, j)
			}
			seenNodePort[protoPort{proto, p.NodePort}] = i
			sp.NodePort = uint16(p.NodePort)
		} else if out.Type == TypeNodePort {
			// The API server allocates node ports; a file must give them.
			return fieldErr(f+".nodePort", "required for type NodePort (vipgate does not allocate node ports)")
		}
		out.Ports = append(out.Ports, sp)
	}
	return nil
}

// servicePolicies resolves traffic policies, health-check node port, session affinity and traffic
// distribution.
func servicePolicies(svc *corev1.Service, out *Service) error {
	spec := &svc.Spec
	switch spec.ExternalTrafficPolicy {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
	case corev1.ServiceExternalTrafficPolicyLocal:
		// As kube-proxy's apiservice.ExternalPolicyLocal: the policy only means something for traffic
		// that arrives from outside, i.e. Services reachable from outside.
		out.ExternalPolicyLocal = out.Type == TypeNodePort || out.Type == TypeLoadBalancer || len(spec.ExternalIPs) > 0
	default:
		return fieldErr("spec.externalTrafficPolicy", "unknown policy %q (want Cluster or Local)", spec.ExternalTrafficPolicy)
	}
	if spec.InternalTrafficPolicy != nil {
		switch *spec.InternalTrafficPolicy {
		case "", corev1.ServiceInternalTrafficPolicyCluster:
		case corev1.ServiceInternalTrafficPolicyLocal:
			out.InternalPolicyLocal = true
		default:
			return fieldErr("spec.internalTrafficPolicy", "unknown policy %q (want Cluster or Local)", *spec.InternalTrafficPolicy)
		}
	}

	if hc := spec.HealthCheckNodePort; hc != 0 {
		if out.Type != TypeLoadBalancer || !out.ExternalPolicyLocal {
			return fieldErr("spec.healthCheckNodePort", "only valid for type LoadBalancer with externalTrafficPolicy Local")
		}
		if !NodePortRange.Contains(hc) {
			return fieldErr("spec.healthCheckNodePort", "%d is outside the NodePort range %s", hc, NodePortRange)
		}
		for i, p := range out.Ports {
			if p.NodePort == uint16(hc) && p.Protocol == TCP {
				return fieldErr("spec.healthCheckNodePort", "%d collides with spec.ports[%d].nodePort", hc, i)
			}
		}
		out.HealthCheckNodePort = uint16(hc)
	}

	switch spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		if spec.SessionAffinityConfig != nil && spec.SessionAffinityConfig.ClientIP != nil {
			return fieldErr("spec.sessionAffinityConfig", "set but spec.sessionAffinity is not ClientIP")
		}
	case corev1.ServiceAffinityClientIP:
		out.AffinityTimeout = DefaultAffinityTimeout
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			secs := *c.ClientIP.TimeoutSeconds
			if secs < 1 || time.Duration(secs)*time.Second > MaxAffinityTimeout {
				return fieldErr("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is out of range 1-%d", secs, int(MaxAffinityTimeout/time.Second))
			}
			out.AffinityTimeout = time.Duration(secs) * time.Second
		}
	default:
		return fieldErr("spec.sessionAffinity", "unknown affinity %q (want None or ClientIP)", spec.SessionAffinity)
	}

	if td := spec.TrafficDistribution; td != nil {
		switch *td {
		case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone,
			corev1.ServiceTrafficDistributionPreferSameNode:
			out.TrafficDistribution = *td
		default:
			// kube-proxy ignores values it does not know (newer API servers may add some); so do we,
			// rather than refusing a Service the API server accepted.
		}
	}
	return nil
}

// serviceExternalAddrs converts externalIPs, load-balancer ingress IPs and source ranges.
func serviceExternalAddrs(svc *corev1.Service, out *Service) error {
	spec := &svc.Spec
	served := func(a netip.Addr) bool { return slices.Contains(out.IPFamilies, FamilyOf(a)) }
	for i, s := range spec.ExternalIPs {
		f := fmt.Sprintf("spec.externalIPs[%d]", i)
		a, err := parseIP(f, s)
		if err != nil {
			return err
		}
		if err := checkNotSpecial(f, a, "an external IP"); err != nil {
			return err
		}
		// kube-proxy programs an external IP only for the families the Service has cluster IPs in.
		if served(a) && !slices.Contains(out.ExternalIPs, a) {
			out.ExternalIPs = append(out.ExternalIPs, a)
		}
	}

	if out.Type == TypeLoadBalancer {
		for i, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" {
				continue // hostname-only ingress (cloud load balancers): nothing for the node to do
			}
			f := fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i)
			a, err := parseIP(f, ing.IP)
			if err != nil {
				return err
			}
			// Checked whatever the ipMode: a status that names such an address is not to be
			// trusted in any part (the API server does not check it, any status writer can).
			if err := checkNotSpecial(f, a, "a LoadBalancer IP"); err != nil {
				return err
			}
			// ipMode Proxy means the load balancer delivers to the node with its own address as
			// destination; kube-proxy does not capture such IPs, and neither do we.
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			if served(a) && !slices.Contains(out.LoadBalancerIPs, a) {
				out.LoadBalancerIPs = append(out.LoadBalancerIPs, a)
			}
		}
	}

	ranges, field := spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(ranges) == 0 {
		// The legacy annotation applies only when the field is empty (as the API server's
		// GetLoadBalancerSourceRanges reads it).
		if v := strings.TrimSpace(svc.Annotations[corev1.AnnotationLoadBalancerSourceRangesKey]); v != "" {
			ranges, field = strings.Split(v, ","), "metadata.annotations["+corev1.AnnotationLoadBalancerSourceRangesKey+"]"
		}
	}
	var prefixes []netip.Prefix
	anyFamily := map[Family]bool{}
	for i, s := range ranges {
		p, err := parsePrefix(fmt.Sprintf("%s[%d]", field, i), s)
		if err != nil {
			return err
		}
		if p.Bits() == 0 {
			// A zero-length CIDR allows everyone of that family, as an empty list does.
			anyFamily[FamilyOf(p.Addr())] = true
			continue
		}
		if !slices.Contains(prefixes, p) {
			prefixes = append(prefixes, p)
		}
	}
	// Ranges are per family (kube-proxy filters them by family): a family with no ranges left is
	// open to everyone, which is what the consumers read from an absent family.
	for _, p := range prefixes {
		if !anyFamily[FamilyOf(p.Addr())] {
			out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, p)
		}
	}
	return nil
}

// EndpointSliceFromAPI converts and validates a discovery.k8s.io/v1 EndpointSlice, reading conditions
// and hints the way kube-proxy does. es is not modified.
func EndpointSliceFromAPI(es *discoveryv1.EndpointSlice) (*EndpointSlice, error) {
	if es == nil {
		return nil, errors.New("nil EndpointSlice")
	}
	if err := checkMeta(es.Namespace, es.Name, validation.IsDNS1123Subdomain); err != nil {
		return nil, err
	}
	svcName := es.Labels[ServiceNameLabel]
	if err := checkName("metadata.labels["+ServiceNameLabel+"]", svcName, validation.IsDNS1035Label); err != nil {
		return nil, err
	}
	out := &EndpointSlice{
		Namespace: es.Namespace,
		Name:      es.Name,
		Service:   ServiceKey{Namespace: es.Namespace, Name: svcName},
	}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		out.Family = IPv4
	case discoveryv1.AddressTypeIPv6:
		out.Family = IPv6
	case discoveryv1.AddressTypeFQDN:
		return nil, fieldErr("addressType", "FQDN slices are not supported (kube-proxy ignores them too)")
	default:
		return nil, fieldErr("addressType", "unknown address type %q (want IPv4 or IPv6)", es.AddressType)
	}

	// The API server's limits, checked before anything is converted: an oversized slice from a file
	// costs nothing but this rejection.
	if len(es.Endpoints) > MaxSliceEndpoints {
		return nil, fieldErr("endpoints", "%d endpoints, more than the %d the API allows in one EndpointSlice", len(es.Endpoints), MaxSliceEndpoints)
	}
	if len(es.Ports) > MaxSlicePorts {
		return nil, fieldErr("ports", "%d ports, more than the %d the API allows in one EndpointSlice", len(es.Ports), MaxSlicePorts)
	}
	seenName := map[string]int{}
	for i, p := range es.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		var ep EndpointPort
		// A nil name is "" for us: kube-proxy drops such ports, but hand-written slices omit the name of
		// their single port all the time, and "" is what a single unnamed Service port matches.
		if p.Name != nil {
			ep.Name = *p.Name
		}
		if j, dup := seenName[ep.Name]; dup {
			return nil, fieldErr(f+".name", "%q duplicates ports[%d]", ep.Name, j)
		}
		seenName[ep.Name] = i
		var proto corev1.Protocol
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		var err error
		if ep.Protocol, err = protocolOf(f+".protocol", proto); err != nil {
			return nil, err
		}
		if p.Port == nil {
			return nil, fieldErr(f+".port", "required")
		}
		if err := checkPort(f+".port", *p.Port); err != nil {
			return nil, err
		}
		ep.Port = uint16(*p.Port)
		out.Ports = append(out.Ports, ep)
	}

	// Exact capacities: a node holds every slice of the cluster, and append's doubling left a third of
	// this memory unused (measured at 10,000 Services x 10 endpoints).
	out.Endpoints = make([]Endpoint, 0, len(es.Endpoints))
	for i, e := range es.Endpoints {
		f := fmt.Sprintf("endpoints[%d]", i)
		if len(e.Addresses) == 0 {
			return nil, fieldErr(f+".addresses", "at least one address is required")
		}
		if len(e.Addresses) > MaxEndpointAddresses {
			return nil, fieldErr(f+".addresses", "%d addresses, more than the %d the API allows", len(e.Addresses), MaxEndpointAddresses)
		}
		ep := Endpoint{Addresses: make([]netip.Addr, 0, len(e.Addresses))}
		for j, s := range e.Addresses {
			af := fmt.Sprintf("%s.addresses[%d]", f, j)
			a, err := parseIP(af, s)
			if err != nil {
				return nil, err
			}
			if FamilyOf(a) != out.Family {
				return nil, fieldErr(af, "%s is not %s as the slice's addressType says", a, familyName(out.Family))
			}
			if err := checkNotSpecial(af, a, "an endpoint"); err != nil {
				return nil, err
			}
			ep.Addresses = append(ep.Addresses, a)
		}
		c := e.Conditions
		ep.Ready = c.Ready == nil || *c.Ready
		ep.Serving = ep.Ready
		if c.Serving != nil {
			ep.Serving = *c.Serving
		}
		ep.Terminating = c.Terminating != nil && *c.Terminating
		if e.NodeName != nil {
			ep.NodeName = *e.NodeName
		}
		var topo EndpointTopology
		if e.Zone != nil {
			topo.Zone = *e.Zone
		}
		if e.Hints != nil {
			for _, z := range e.Hints.ForZones {
				topo.ZoneHints = append(topo.ZoneHints, z.Name)
			}
			for _, n := range e.Hints.ForNodes {
				topo.NodeHints = append(topo.NodeHints, n.Name)
			}
		}
		if topo.Zone != "" || topo.ZoneHints != nil || topo.NodeHints != nil {
			ep.Topology = &topo
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out, nil
}

// NodeFromAPI converts a v1 Node: its name, labels, zone label and InternalIP/ExternalIP addresses.
func NodeFromAPI(n *corev1.Node) (*Node, error) {
	if n == nil {
		return nil, errors.New("nil Node")
	}
	if err := checkName("metadata.name", n.Name, validation.IsDNS1123Subdomain); err != nil {
		return nil, err
	}
	out := &Node{Name: n.Name, Labels: maps.Clone(n.Labels), Zone: n.Labels[ZoneLabel], Unschedulable: n.Spec.Unschedulable,
		ToBeDeleted: nodeToBeDeleted(n)}
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, "vipgate.io/") {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for i, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue // hostnames and DNS names are not addresses vipgate can use
		}
		ip, err := parseIP(fmt.Sprintf("status.addresses[%d].address", i), a.Address)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out.Addresses, ip) {
			out.Addresses = append(out.Addresses, ip)
		}
	}
	return out, nil
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is about to delete
// (kube-proxy's healthcheck.ToBeDeletedTaint).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeToBeDeleted is kube-proxy's node (in)eligibility: a deletion timestamp, or the autoscaler's
// ToBeDeletedTaint.
func nodeToBeDeleted(n *corev1.Node) bool {
	if n.DeletionTimestamp != nil {
		return true
	}
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ToBeDeletedTaint })
}

// dns1123Subdomain is the name rule of most namespaced kinds.
func dns1123Subdomain(s string) []string { return validation.IsDNS1123Subdomain(s) }
