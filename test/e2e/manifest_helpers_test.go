package e2e

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/lab"
)

// The manifests of the dataplane tests are built as real Kubernetes API objects and marshalled to
// YAML, so they are exactly what kubectl or the API server would hand vipgate (field names, defaults,
// quoting) and a typo in a test cannot silently become an unknown field.

// dpE2eNamespace is the namespace of every object the dataplane tests write.
const dpE2eNamespace = "e2e"

// dpSvcPort is one port of a test Service. Its EndpointSlice port is derived from it: named like the
// Service port, numbered like the target.
type dpSvcPort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	// Target is the pod port; TargetName, when set, makes the Service refer to it by name (a named
	// container port), as Deployments usually do.
	Target     int32
	TargetName string
	NodePort   int32
}

// dpTcpUDP returns a TCP and a UDP port (named prefix-tcp and prefix-udp) from port to the pod's target
// port, both on nodePort (0 for none).
func dpTcpUDP(prefix string, port, target, nodePort int32) []dpSvcPort {
	return []dpSvcPort{
		{Name: prefix + "-tcp", Protocol: corev1.ProtocolTCP, Port: port, Target: target, NodePort: nodePort},
		{Name: prefix + "-udp", Protocol: corev1.ProtocolUDP, Port: port, Target: target, NodePort: nodePort},
	}
}

// dpSvcSpec is the part of a Service the tests vary.
type dpSvcSpec struct {
	Name string
	// Type defaults to ClusterIP.
	Type corev1.ServiceType
	// ClusterIPs, primary first; "None" makes the Service headless. A second address of the other
	// family makes it dual-stack.
	ClusterIPs []string
	Ports      []dpSvcPort
	// ExternalLocal and InternalLocal set externalTrafficPolicy and internalTrafficPolicy to Local.
	ExternalLocal, InternalLocal bool
	HealthCheckNodePort          int32
	// LoadBalancerIPs go to status.loadBalancer.ingress, ExternalIPs to spec.externalIPs.
	LoadBalancerIPs, ExternalIPs []string
	SourceRanges                 []string
	// ClientIPAffinity sets sessionAffinity: ClientIP (default timeout).
	ClientIPAffinity bool
}

// service renders spec as a v1 Service.
func dpService(spec dpSvcSpec) *corev1.Service {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: dpE2eNamespace},
		Spec: corev1.ServiceSpec{
			Type:                     spec.Type,
			ClusterIPs:               spec.ClusterIPs,
			Selector:                 map[string]string{"app": spec.Name},
			ExternalIPs:              spec.ExternalIPs,
			LoadBalancerSourceRanges: spec.SourceRanges,
			HealthCheckNodePort:      spec.HealthCheckNodePort,
		},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if len(spec.ClusterIPs) > 0 {
		svc.Spec.ClusterIP = spec.ClusterIPs[0]
	}
	if spec.ClusterIPs[0] != corev1.ClusterIPNone {
		for _, s := range spec.ClusterIPs {
			fam := corev1.IPv4Protocol
			if netip.MustParseAddr(s).Is6() {
				fam = corev1.IPv6Protocol
			}
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, fam)
		}
		policy := corev1.IPFamilyPolicySingleStack
		if len(spec.ClusterIPs) > 1 {
			policy = corev1.IPFamilyPolicyRequireDualStack
		}
		svc.Spec.IPFamilyPolicy = &policy
	}
	if spec.ExternalLocal {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	} else if spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if spec.InternalLocal {
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	if spec.ClientIPAffinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	for _, p := range spec.Ports {
		target := intstr.FromInt32(p.Target)
		if p.TargetName != "" {
			target = intstr.FromString(p.TargetName)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: target, NodePort: p.NodePort,
		})
	}
	for _, ip := range spec.LoadBalancerIPs {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return svc
}

// dpEndpoint is one pod behind a Service, with its conditions.
type dpEndpoint struct {
	Pod *lab.Pod
	// Ready, Serving and Terminating are the EndpointSlice conditions.
	Ready, Serving, Terminating bool
	// Zones are hints.forZones.
	Zones []string
	// IPv4 overrides the pod's IPv4 address (an address nothing answers on).
	IPv4 string
}

// ready returns the pods as ready, serving endpoints.
func dpReady(pods ...*lab.Pod) []dpEndpoint {
	eps := make([]dpEndpoint, len(pods))
	for i, p := range pods {
		eps[i] = dpEndpoint{Pod: p, Ready: true, Serving: true}
	}
	return eps
}

// terminating returns the pods as terminating endpoints that are (serving=true) or are not
// (serving=false) still serving. Terminating endpoints are never ready.
func dpTerminating(serving bool, pods ...*lab.Pod) []dpEndpoint {
	eps := make([]dpEndpoint, len(pods))
	for i, p := range pods {
		eps[i] = dpEndpoint{Pod: p, Serving: serving, Terminating: true}
	}
	return eps
}

// dpEndpointSlices renders the EndpointSlices of spec's Service: one per family of its cluster IPs (IPv4
// for a headless Service), with every endpoint's address of that family.
func dpEndpointSlices(spec dpSvcSpec, eps []dpEndpoint) []*discoveryv1.EndpointSlice {
	families := []cluster.Family{cluster.IPv4}
	if len(spec.ClusterIPs) > 1 {
		families = append(families, cluster.IPv6)
	} else if spec.ClusterIPs[0] != corev1.ClusterIPNone && netip.MustParseAddr(spec.ClusterIPs[0]).Is6() {
		families = []cluster.Family{cluster.IPv6}
	}
	var out []*discoveryv1.EndpointSlice
	for _, fam := range families {
		es := &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name:      fmt.Sprintf("%s-ipv%d", spec.Name, fam),
				Namespace: dpE2eNamespace,
				Labels:    map[string]string{discoveryv1.LabelServiceName: spec.Name},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if fam == cluster.IPv6 {
			es.AddressType = discoveryv1.AddressTypeIPv6
		}
		for _, p := range spec.Ports {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: dpPtr(p.Name), Protocol: dpPtr(p.Protocol), Port: dpPtr(p.Target)})
		}
		for _, e := range eps {
			addr := e.Pod.IPv4.String()
			if fam == cluster.IPv6 {
				addr = e.Pod.IPv6.String()
			} else if e.IPv4 != "" {
				addr = e.IPv4
			}
			ep := discoveryv1.Endpoint{
				Addresses: []string{addr},
				NodeName:  dpPtr(e.Pod.Node.Name),
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: dpE2eNamespace, Name: e.Pod.Name},
				Conditions: discoveryv1.EndpointConditions{
					Ready: dpPtr(e.Ready), Serving: dpPtr(e.Serving), Terminating: dpPtr(e.Terminating),
				},
			}
			if len(e.Zones) > 0 {
				ep.Hints = &discoveryv1.EndpointHints{}
				for _, z := range e.Zones {
					ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
				}
			}
			es.Endpoints = append(es.Endpoints, ep)
		}
		out = append(out, es)
	}
	return out
}

// dpManifest renders a Service and its EndpointSlices (nil eps: no slice at all) as one multi-document
// YAML file.
func dpManifest(spec dpSvcSpec, eps []dpEndpoint) string {
	objs := []any{dpService(spec)}
	if eps != nil {
		for _, es := range dpEndpointSlices(spec, eps) {
			objs = append(objs, es)
		}
	}
	return dpYamlDocs(objs...)
}

// dpYamlDocs marshals objects into one multi-document YAML text. Strings are taken as ready-made
// documents, which is how tests put broken YAML next to good objects.
func dpYamlDocs(objs ...any) string {
	docs := make([]string, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(string); ok {
			docs = append(docs, s)
			continue
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			// Only a programming error in a test can get here: the objects are plain API types.
			panic(fmt.Sprintf("marshalling %T: %v", o, err))
		}
		docs = append(docs, string(b))
	}
	return strings.Join(docs, "---\n")
}

func dpPtr[T any](v T) *T { return &v }
