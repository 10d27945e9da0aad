// Package cluster holds vipgate's desired state: the Services, EndpointSlices and (later) MetalLB pools
// that the dataplane and the speaker act on, the sources that produce it (a directory of YAML files or
// the Kubernetes API), and LoadBalancer IP allocation.
//
// The model is deliberately smaller than the Kubernetes API types: it keeps exactly what the dataplane
// and the speaker need, already parsed and validated (netip addresses, resolved policies). A State is an
// immutable snapshot; sources build a new State for every change and reuse the *Service and
// *EndpointSlice pointers of objects that did not change, so consumers can find what changed by pointer
// comparison alone.
package cluster

import (
	"net/netip"
	"strings"
	"time"
)

// ServiceKey names a Service: its namespace and name.
type ServiceKey struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Protocol is a Service or endpoint port's L4 protocol, spelled as Kubernetes spells it.
type Protocol string

// The L4 protocols a Service port may use.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Family is an IP family.
type Family int

// IP families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// FamilyOf returns the family of addr.
func FamilyOf(addr netip.Addr) Family {
	if addr.Is4() || addr.Is4In6() {
		return IPv4
	}
	return IPv6
}

// ServiceType is the Kubernetes Service type.
type ServiceType string

// Service types.
const (
	TypeClusterIP    ServiceType = "ClusterIP"
	TypeNodePort     ServiceType = "NodePort"
	TypeLoadBalancer ServiceType = "LoadBalancer"
	TypeExternalName ServiceType = "ExternalName"
)

// ServicePort is one port of a Service.
type ServicePort struct {
	// Name matches the EndpointSlice port of the same name ("" for a single unnamed port).
	Name     string
	Protocol Protocol
	Port     uint16
	// NodePort is 0 when the port has none.
	NodePort uint16
}

// Service is the part of a v1 Service that vipgate acts on.
type Service struct {
	Key  ServiceKey
	Type ServiceType
	// Created (metadata.creationTimestamp) and UID (metadata.uid) order Services that claim the same
	// entry (IP, protocol, port): the oldest keeps it, whatever the names, so that nobody wins an
	// entry by choosing a name that sorts first (see ClaimOrder). Zero when a file does not say.
	Created time.Time
	UID     string
	// ClusterIPs holds the cluster IPs, at most one per family. Empty for headless and ExternalName
	// Services.
	ClusterIPs []netip.Addr
	// Headless is true for clusterIP: None.
	Headless bool
	Ports    []ServicePort
	// ExternalIPs is spec.externalIPs.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs is status.loadBalancer.ingress[].ip (only Services of type LoadBalancer).
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges restricts who may reach the LoadBalancer IPs (empty: everyone).
	LoadBalancerSourceRanges []netip.Prefix
	// ExternalPolicyLocal is externalTrafficPolicy: Local.
	ExternalPolicyLocal bool
	// InternalPolicyLocal is internalTrafficPolicy: Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort is spec.healthCheckNodePort (eTP=Local LoadBalancer Services), 0 if none.
	HealthCheckNodePort uint16
	// AffinityTimeout is sessionAffinity ClientIP's timeout; 0 means no session affinity.
	AffinityTimeout time.Duration
	// TrafficDistribution is spec.trafficDistribution ("", "PreferClose", "PreferSameZone",
	// "PreferSameNode").
	TrafficDistribution string
	// IPFamilies lists the Service's families in order (spec.ipFamilies).
	IPFamilies []Family
	// Labels and Annotations are kept for the speaker and the allocator (selectors, MetalLB annotations).
	Labels      map[string]string
	Annotations map[string]string
	// LoadBalancerClass is spec.loadBalancerClass ("" when unset).
	LoadBalancerClass string
	// IPFamilyPolicy is spec.ipFamilyPolicy ("SingleStack", "PreferDualStack", "RequireDualStack";
	// "" when unset), for LoadBalancer IP allocation.
	IPFamilyPolicy string
	// RequestedLoadBalancerIP is the deprecated spec.loadBalancerIP (invalid when unset).
	RequestedLoadBalancerIP netip.Addr
}

// EndpointPort is one port of an EndpointSlice.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// Endpoint is one endpoint of an EndpointSlice.
type Endpoint struct {
	// Addresses are the endpoint's addresses (of the slice's family); kube-proxy uses the first.
	Addresses []netip.Addr
	// Ready, Serving and Terminating are the EndpointSlice conditions. A nil ready condition counts as
	// ready, a nil serving condition as equal to ready, as in Kubernetes.
	Ready       bool
	Serving     bool
	Terminating bool
	// NodeName is the node the endpoint runs on ("" if unknown).
	NodeName string
	// Topology is the endpoint's zone and hints; nil when it has none. Few endpoints have any, and
	// a node holds every endpoint of the cluster (1,000,000 at 100,000 Services x 10): inline they
	// took 64 of the struct's 112 bytes. Read them through Zone, ZoneHints and NodeHints.
	Topology *EndpointTopology
}

// EndpointTopology is an endpoint's zone and topology hints.
type EndpointTopology struct {
	// Zone is the endpoint's zone ("" if unknown).
	Zone string
	// ZoneHints and NodeHints are hints.forZones[].name and hints.forNodes[].name.
	ZoneHints []string
	NodeHints []string
}

// Zone is the endpoint's zone ("" if unknown).
func (e *Endpoint) Zone() string {
	if e.Topology == nil {
		return ""
	}
	return e.Topology.Zone
}

// ZoneHints are the zones the endpoint is hinted for (hints.forZones[].name).
func (e *Endpoint) ZoneHints() []string {
	if e.Topology == nil {
		return nil
	}
	return e.Topology.ZoneHints
}

// NodeHints are the nodes the endpoint is hinted for (hints.forNodes[].name).
func (e *Endpoint) NodeHints() []string {
	if e.Topology == nil {
		return nil
	}
	return e.Topology.NodeHints
}

// EndpointSlice is the part of a discovery.k8s.io/v1 EndpointSlice that vipgate acts on.
type EndpointSlice struct {
	Namespace string
	Name      string
	// Service is the owning Service (from the kubernetes.io/service-name label).
	Service ServiceKey
	// Family is the slice's addressType (FQDN slices are rejected: kube-proxy ignores them too).
	Family    Family
	Ports     []EndpointPort
	Endpoints []Endpoint
}

// Node is what vipgate knows about a node (its own, or any for the speaker and the gateway).
type Node struct {
	Name   string
	Labels map[string]string
	// Zone is the topology.kubernetes.io/zone label.
	Zone      string
	Addresses []netip.Addr
	// Unschedulable is spec.unschedulable (cordoned, e.g. by kubectl drain).
	Unschedulable bool
	// ToBeDeleted says the Node is going away: metadata.deletionTimestamp is set, or it carries the
	// cluster autoscaler's ToBeDeletedByClusterAutoscaler taint. kube-proxy's /healthz then fails
	// (the node is not eligible for load-balancer traffic); vipgate's does the same.
	ToBeDeleted bool
	// Annotations are the Node's annotations under vipgate.io/ (the others are not kept: Nodes
	// carry large ones, e.g. CNI and CSI state).
	Annotations map[string]string
}

// Rejection records one input object that was refused, and why. Everything else keeps working.
type Rejection struct {
	// Kind and Object name the object ("Service", "demo/web"); Source says where it came from
	// ("file web.yaml document 2", "kubernetes").
	Kind   string
	Object string
	Source string
	Reason string
	// Addr is the address the rejection is about (a special or refused external IP, an entry
	// another Service holds), zero when it is about no one address. Programs select rejections by
	// it (vipgate explain lists those of its destination), never by reading Reason. One address,
	// not a list: each rejection is of one field's value, and a Rejection stays comparable (a map
	// key where conflicts are logged once).
	Addr netip.Addr
}

// ClaimOrder orders two Services that claim the same entry between equals: the one created first
// wins (metadata.creationTimestamp, which has a resolution of one second), then the smaller UID
// (unique and random in a cluster, so a tie cannot be steered), and only when neither says (a file
// without creationTimestamp and uid) the namespace/name. A Service with a creation time comes before
// one without: an object that states no age never takes an entry from one that does. It returns a
// negative number when a wins, positive when b wins, 0 only for the same Service.
func ClaimOrder(a, b *Service) int {
	switch {
	case a.Created.IsZero() != b.Created.IsZero():
		if a.Created.IsZero() {
			return 1
		}
		return -1
	case !a.Created.Equal(b.Created):
		return a.Created.Compare(b.Created)
	case (a.UID == "") != (b.UID == ""):
		if a.UID == "" {
			return 1
		}
		return -1
	case a.UID != b.UID:
		return strings.Compare(a.UID, b.UID)
	case a.Key.Namespace != b.Key.Namespace:
		return strings.Compare(a.Key.Namespace, b.Key.Namespace)
	}
	return strings.Compare(a.Key.Name, b.Key.Name)
}

// Equal reports whether r and o are the same rejection, every field alike. (go-cmp compares by it:
// Addr has no exported fields to compare.)
func (r Rejection) Equal(o Rejection) bool { return r == o }

// String formats the rejection for a log line.
func (r Rejection) String() string {
	s := r.Kind
	if r.Object != "" {
		s += " " + r.Object
	}
	if r.Source != "" {
		s += " (" + r.Source + ")"
	}
	return s + ": " + r.Reason
}

// State is one immutable snapshot of the desired state.
type State struct {
	Services map[ServiceKey]*Service
	// EndpointSlices lists each Service's slices, sorted by slice name.
	EndpointSlices map[ServiceKey][]*EndpointSlice
	// Nodes holds the nodes known to the source (the file source knows only its own node, if any).
	Nodes map[string]*Node
	// Rejected lists the objects of this snapshot that were refused.
	Rejected []Rejection
	// Pools, advertisements and peers (MetalLB kinds) are added by the allocator and speaker issues.
	MetalLB *MetalLBConfig
	// SpeakerNodes are the nodes a vipgate node agent pod is scheduled on (KubeSource with
	// WatchSpeakerPods): the L2 speakers' members. nil when not known (the file source, or no pod
	// watch): then every Node, or speaker.members, is a member.
	SpeakerNodes map[string]bool
	// ServiceCIDRs are the ranges of the cluster's ServiceCIDR objects (networking.k8s.io/v1, the
	// Kubernetes source), masked and sorted; nil with the file source. They extend the configured
	// service CIDRs, which stay the base (ServiceCIDRs(configured, st) is the union).
	ServiceCIDRs []netip.Prefix
}
