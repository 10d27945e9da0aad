package cluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// cmpOpts lets cmp compare netip values (they have unexported fields).
var cmpOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}, netip.AddrPort{})

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// baseService is a valid single-stack ClusterIP Service; test cases mutate a fresh copy.
func baseService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: "10.96.0.10",
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
}

func TestServiceFromAPIGood(t *testing.T) {
	key := ServiceKey{Namespace: "demo", Name: "web"}
	labels := map[string]string{"app": "web"}
	tests := []struct {
		name   string
		mutate func(*corev1.Service)
		want   *Service
	}{
		{
			name:   "ClusterIP",
			mutate: func(*corev1.Service) {},
			want: &Service{Key: key, Type: TypeClusterIP, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}, Labels: labels},
		},
		{
			name: "empty type and protocol default to ClusterIP and TCP",
			mutate: func(s *corev1.Service) {
				s.Spec.Type = ""
				s.Spec.Ports[0].Protocol = ""
			},
			want: &Service{Key: key, Type: TypeClusterIP, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}, Labels: labels},
		},
		{
			name: "dual-stack NodePort with affinity and local policies",
			mutate: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.ClusterIPs = []string{"10.96.0.10", "2001:db8::10"}
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 80, NodePort: 30080},
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, NodePort: 30053},
				}
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
			},
			want: &Service{Key: key, Type: TypeNodePort, ClusterIPs: addrs("10.96.0.10", "2001:db8::10"),
				IPFamilies: []Family{IPv4, IPv6},
				Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: 30080},
					{Name: "dns", Protocol: UDP, Port: 53, NodePort: 30053}},
				ExternalPolicyLocal: true, InternalPolicyLocal: true, AffinityTimeout: 3 * time.Hour,
				TrafficDistribution: "PreferSameNode", Labels: labels},
		},
		{
			name: "LoadBalancer with ingress, source ranges and health check",
			mutate: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 31000
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.LoadBalancerClass = ptr.To("vipgate.io/lb")
				s.Spec.LoadBalancerSourceRanges = []string{" 192.0.2.0/24", "198.51.100.7/24", "2001:db8::/32"}
				s.Spec.ExternalIPs = []string{"203.0.113.9", "2001:db8::9"} // v6 dropped: no v6 cluster IP
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "203.0.113.1"},
					{Hostname: "lb.example.com"},
					{IP: "203.0.113.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)},
					{IP: "203.0.113.3", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)},
				}
			},
			want: &Service{Key: key, Type: TypeLoadBalancer, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports:           []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: 31000}},
				ExternalIPs:     addrs("203.0.113.9"),
				LoadBalancerIPs: addrs("203.0.113.1", "203.0.113.3"),
				// Host bits are masked; IPv6 ranges stay (consumers filter by family).
				LoadBalancerSourceRanges: prefixes("192.0.2.0/24", "198.51.100.0/24", "2001:db8::/32"),
				ExternalPolicyLocal:      true, HealthCheckNodePort: 32000, AffinityTimeout: time.Minute,
				LoadBalancerClass: "vipgate.io/lb", Labels: labels},
		},
		{
			name: "source ranges from the annotation, zero CIDR opens its family",
			mutate: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Annotations = map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "192.0.2.0/24, 0.0.0.0/0,2001:db8::/48"}
			},
			want: &Service{Key: key, Type: TypeLoadBalancer, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports:                    []ServicePort{{Name: "http", Protocol: TCP, Port: 80}},
				LoadBalancerSourceRanges: prefixes("2001:db8::/48"), Labels: labels,
				Annotations: map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "192.0.2.0/24, 0.0.0.0/0,2001:db8::/48"}},
		},
		{
			name: "headless",
			mutate: func(s *corev1.Service) {
				s.Spec.ClusterIP = corev1.ClusterIPNone
				s.Spec.Ports = nil
			},
			want: &Service{Key: key, Type: TypeClusterIP, Headless: true, Labels: labels},
		},
		{
			name: "ExternalName ignores its cluster IP",
			mutate: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeExternalName
				s.Spec.ExternalName = "db.example.com"
			},
			want: &Service{Key: key, Type: TypeExternalName, Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}, Labels: labels},
		},
		{
			// The upstream e2e test "should support named targetPorts that resolve to different ports
			// on different endpoints" names its port "mutable-named-port": a DNS-1123 label, longer
			// than the 15 characters of a container port name (IANA_SVC_NAME).
			name: "port name longer than 15 characters",
			mutate: func(s *corev1.Service) {
				s.Spec.Ports[0].Name = "mutable-named-port"
				s.Spec.Ports[0].TargetPort = intstr.FromString("mutable-port")
			},
			want: &Service{Key: key, Type: TypeClusterIP, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports: []ServicePort{{Name: "mutable-named-port", Protocol: TCP, Port: 80}}, Labels: labels},
		},
		{
			name: "eTP Local without external reachability means nothing",
			mutate: func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.TrafficDistribution = ptr.To("SomethingNew")
			},
			want: &Service{Key: key, Type: TypeClusterIP, ClusterIPs: addrs("10.96.0.10"), IPFamilies: []Family{IPv4},
				Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}, Labels: labels},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseService()
			tc.mutate(in)
			got, err := ServiceFromAPI(in)
			if err != nil {
				t.Fatalf("ServiceFromAPI: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpOpts); diff != "" {
				t.Errorf("ServiceFromAPI (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServiceFromAPIRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.Service)
		// field must appear in the error.
		field string
	}{
		{"no name", func(s *corev1.Service) { s.Name = "" }, "metadata.name"},
		{"bad name", func(s *corev1.Service) { s.Name = "Web_1" }, "metadata.name"},
		{"no namespace", func(s *corev1.Service) { s.Namespace = "" }, "metadata.namespace"},
		{"unknown type", func(s *corev1.Service) { s.Spec.Type = "Magic" }, "spec.type"},
		{"no cluster IP", func(s *corev1.Service) { s.Spec.ClusterIP = "" }, "spec.clusterIP"},
		{"unparsable cluster IP", func(s *corev1.Service) { s.Spec.ClusterIP = "10.96.0.300" }, "spec.clusterIP"},
		{"cluster IP with zone", func(s *corev1.Service) { s.Spec.ClusterIP = "fe80::1%eth0" }, "spec.clusterIP"},
		{"cluster IP of the wrong family", func(s *corev1.Service) {
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		}, "spec.clusterIP"},
		{"two IPv4 cluster IPs", func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.10", "10.96.0.11"}
		}, "spec.clusterIPs[1]"},
		{"clusterIP disagrees with clusterIPs", func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.11"}
		}, "spec.clusterIP"},
		{"unknown family", func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{"IPv5"} }, "spec.ipFamilies[0]"},
		{"headless NodePort", func(s *corev1.Service) {
			s.Spec.ClusterIP = "None"
			s.Spec.Type = corev1.ServiceTypeNodePort
		}, "spec.clusterIP"},
		{"no ports", func(s *corev1.Service) { s.Spec.Ports = nil }, "spec.ports"},
		{"port 0", func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }, "spec.ports[0].port"},
		{"port too large", func(s *corev1.Service) { s.Spec.Ports[0].Port = 65536 }, "spec.ports[0].port"},
		{"unknown protocol", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }, "spec.ports[0].protocol"},
		{"duplicate port", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "again", Port: 80})
		}, "spec.ports[1].port"},
		{"unnamed second port", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: 443})
		}, "spec.ports[1].name"},
		{"port name not a DNS label", func(s *corev1.Service) { s.Spec.Ports[0].Name = "HTTP_1" }, "spec.ports[0].name"},
		{"port name longer than a DNS label", func(s *corev1.Service) { s.Spec.Ports[0].Name = strings.Repeat("p", 64) }, "spec.ports[0].name"},
		{"duplicate port name", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "http", Port: 443})
		}, "spec.ports[1].name"},
		{"nodePort below range", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 8080
		}, "spec.ports[0].nodePort"},
		{"nodePort above range", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 32768
		}, "spec.ports[0].nodePort"},
		{"nodePort missing for NodePort", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, "spec.ports[0].nodePort"},
		{"nodePort on ClusterIP", func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30000 }, "spec.ports[0].nodePort"},
		{"unknown eTP", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = "Nearby" }, "spec.externalTrafficPolicy"},
		{"unknown iTP", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicy("Nearby"))
		}, "spec.internalTrafficPolicy"},
		{"healthCheckNodePort without eTP Local", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.HealthCheckNodePort = 32000
		}, "spec.healthCheckNodePort"},
		{"healthCheckNodePort out of range", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 99
		}, "spec.healthCheckNodePort"},
		{"negative affinity timeout", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](-1)}}
		}, "timeoutSeconds"},
		{"huge affinity timeout", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](86401)}}
		}, "timeoutSeconds"},
		{"unknown affinity", func(s *corev1.Service) { s.Spec.SessionAffinity = "Cookie" }, "spec.sessionAffinity"},
		{"bad external IP", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113"} }, "spec.externalIPs[0]"},
		{"bad ingress IP", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "nope"}}
		}, "status.loadBalancer.ingress[0].ip"},
		{"bad source range", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/33"}
		}, "spec.loadBalancerSourceRanges[0]"},
		{"bad source range annotation", func(s *corev1.Service) {
			s.Annotations = map[string]string{corev1.AnnotationLoadBalancerSourceRangesKey: "192.0.2.0/24,nonsense"}
		}, "load-balancer-source-ranges"},
		{"ExternalName without name", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }, "spec.externalName"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseService()
			tc.mutate(in)
			got, err := ServiceFromAPI(in)
			if err == nil {
				t.Fatalf("ServiceFromAPI accepted it: %+v", got)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name the field %q", err, tc.field)
			}
		})
	}
}

func TestServiceFromAPINodePortRangeVariable(t *testing.T) {
	old := NodePortRange
	t.Cleanup(func() { NodePortRange = old })
	NodePortRange = PortRange{Min: 20000, Max: 20100}
	in := baseService()
	in.Spec.Type = corev1.ServiceTypeNodePort
	in.Spec.Ports[0].NodePort = 20050
	if _, err := ServiceFromAPI(in); err != nil {
		t.Fatalf("nodePort inside a custom range refused: %v", err)
	}
	in.Spec.Ports[0].NodePort = 30000
	if _, err := ServiceFromAPI(in); err == nil || !strings.Contains(err.Error(), "20000-20100") {
		t.Fatalf("nodePort outside a custom range: err = %v, want one naming the range", err)
	}
}

func baseSlice() *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web-abc12",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}},
		},
	}
}

func TestEndpointSliceFromAPIGood(t *testing.T) {
	svc := ServiceKey{Namespace: "demo", Name: "web"}
	tests := []struct {
		name   string
		mutate func(*discoveryv1.EndpointSlice)
		want   *EndpointSlice
	}{
		{
			name:   "nil conditions mean ready and serving",
			mutate: func(*discoveryv1.EndpointSlice) {},
			want: &EndpointSlice{Namespace: "demo", Name: "web-abc12", Service: svc, Family: IPv4,
				Ports:     []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}},
				Endpoints: []Endpoint{{Addresses: addrs("10.244.1.5"), Ready: true, Serving: true}}},
		},
		{
			name: "conditions, topology and hints",
			mutate: func(es *discoveryv1.EndpointSlice) {
				es.Ports[0].Name = nil
				es.Ports[0].Protocol = nil
				es.Endpoints = []discoveryv1.Endpoint{
					{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)},
						NodeName: ptr.To("node-a"), Zone: ptr.To("z1"),
						Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}}},
					{Addresses: []string{"10.244.2.5"}, Conditions: discoveryv1.EndpointConditions{
						Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
				}
			},
			want: &EndpointSlice{Namespace: "demo", Name: "web-abc12", Service: svc, Family: IPv4,
				Ports: []EndpointPort{{Name: "", Protocol: TCP, Port: 8080}},
				Endpoints: []Endpoint{
					{Addresses: addrs("10.244.1.5"), NodeName: "node-a",
						Topology: &EndpointTopology{Zone: "z1", ZoneHints: []string{"z1"}, NodeHints: []string{"node-a"}}},
					{Addresses: addrs("10.244.2.5"), Serving: true, Terminating: true},
				}},
		},
		{
			name: "IPv6",
			mutate: func(es *discoveryv1.EndpointSlice) {
				es.AddressType = discoveryv1.AddressTypeIPv6
				es.Endpoints[0].Addresses = []string{"2001:db8:1::5"}
			},
			want: &EndpointSlice{Namespace: "demo", Name: "web-abc12", Service: svc, Family: IPv6,
				Ports:     []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}},
				Endpoints: []Endpoint{{Addresses: addrs("2001:db8:1::5"), Ready: true, Serving: true}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseSlice()
			tc.mutate(in)
			got, err := EndpointSliceFromAPI(in)
			if err != nil {
				t.Fatalf("EndpointSliceFromAPI: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpOpts); diff != "" {
				t.Errorf("EndpointSliceFromAPI (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEndpointSliceFromAPIRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*discoveryv1.EndpointSlice)
		field  string
	}{
		{"no service-name label", func(es *discoveryv1.EndpointSlice) { es.Labels = nil }, "kubernetes.io/service-name"},
		{"no name", func(es *discoveryv1.EndpointSlice) { es.Name = "" }, "metadata.name"},
		{"no namespace", func(es *discoveryv1.EndpointSlice) { es.Namespace = "" }, "metadata.namespace"},
		{"FQDN", func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }, "addressType"},
		{"unknown address type", func(es *discoveryv1.EndpointSlice) { es.AddressType = "IPX" }, "addressType"},
		{"no addresses", func(es *discoveryv1.EndpointSlice) { es.Endpoints[0].Addresses = nil }, "endpoints[0].addresses"},
		{"unparsable address", func(es *discoveryv1.EndpointSlice) { es.Endpoints[0].Addresses = []string{"10.244.1"} }, "endpoints[0].addresses[0]"},
		{"address of the wrong family", func(es *discoveryv1.EndpointSlice) {
			es.Endpoints[0].Addresses = []string{"2001:db8::5"}
		}, "endpoints[0].addresses[0]"},
		{"port missing", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Port = nil }, "ports[0].port"},
		{"port 0", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Port = ptr.To[int32](0) }, "ports[0].port"},
		{"port too large", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Port = ptr.To[int32](70000) }, "ports[0].port"},
		{"unknown protocol", func(es *discoveryv1.EndpointSlice) { es.Ports[0].Protocol = ptr.To(corev1.Protocol("GRE")) }, "ports[0].protocol"},
		{"duplicate port name", func(es *discoveryv1.EndpointSlice) {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr.To("http"), Port: ptr.To[int32](9090)})
		}, "ports[1].name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := baseSlice()
			tc.mutate(in)
			got, err := EndpointSliceFromAPI(in)
			if err == nil {
				t.Fatalf("EndpointSliceFromAPI accepted it: %+v", got)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name the field %q", err, tc.field)
			}
		})
	}
}

func TestNodeFromAPI(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{ZoneLabel: "z1"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node-a"},
			{Type: corev1.NodeInternalIP, Address: "192.0.2.11"},
			{Type: corev1.NodeInternalIP, Address: "2001:db8::11"},
		}},
	}
	got, err := NodeFromAPI(n)
	if err != nil {
		t.Fatal(err)
	}
	want := &Node{Name: "node-a", Labels: map[string]string{ZoneLabel: "z1"}, Zone: "z1", Addresses: addrs("192.0.2.11", "2001:db8::11")}
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Errorf("NodeFromAPI (-want +got):\n%s", diff)
	}
	n.Status.Addresses[1].Address = "bad"
	if _, err := NodeFromAPI(n); err == nil || !strings.Contains(err.Error(), "status.addresses[1].address") {
		t.Errorf("bad node address: err = %v", err)
	}
}

func TestNodeFromAPIDrainFields(t *testing.T) {
	n, err := NodeFromAPI(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"vipgate.io/drain": "", "csi.volume.kubernetes.io/nodeid": "{\"big\":1}"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Unschedulable || len(n.Annotations) != 1 || n.Annotations["vipgate.io/drain"] != "" {
		t.Fatalf("got unschedulable=%v annotations=%v, want true and only vipgate.io/drain", n.Unschedulable, n.Annotations)
	}
}
