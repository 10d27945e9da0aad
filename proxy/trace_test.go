package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netns"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// The fixture: one node ("node1", zone-a) of a dual-stack cluster, and a set of Services covering every
// semantic the tracer must get right. Helpers are prefixed "tr" to stay out of the way of the other
// test files of the package.

const trNode = "node1"

var (
	trNodeIP4 = netip.MustParseAddr("192.0.2.11")
	trNodeIP6 = netip.MustParseAddr("2001:db8:1::11")
)

func trBaseConfig(fam cluster.Family, masqAll bool) BaseConfig {
	return BaseConfig{
		Family:        fam,
		MasqueradeAll: masqAll,
		MasqueradeBit: 14,
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2001:db8:244::/48")},
		ServiceCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("2001:db8:96::/108")},
		NodePortIPs:   []netip.Addr{trNodeIP4, netip.MustParseAddr("127.0.0.1"), trNodeIP6, netip.IPv6Loopback()},
	}
}

func trNodeInfo(fam cluster.Family) NodeInfo {
	return NodeInfo{Family: fam, NodeName: trNode, Zone: "zone-a", NodeIPs: []netip.Addr{trNodeIP4, trNodeIP6}, PodTrafficKnown: true}
}

// trHost treats the node IPs and loopback as local.
var trHost = dataplane.HostInfo{IsLocal: func(a netip.Addr) bool {
	return a == trNodeIP4 || a == trNodeIP6 || a.IsLoopback()
}}

// trService is a Service with its EndpointSlices.
type trService struct {
	svc    *cluster.Service
	slices []*cluster.EndpointSlice
}

func trAddrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// trEp is a ready endpoint on node.
func trEp(addr, node string) cluster.Endpoint {
	return cluster.Endpoint{Addresses: trAddrs(addr), Ready: true, Serving: true, NodeName: node}
}

// trSlice builds the slice of key for the family of the first endpoint, with one port named name.
func trSlice(key cluster.ServiceKey, fam cluster.Family, ports []cluster.EndpointPort, eps ...cluster.Endpoint) *cluster.EndpointSlice {
	return &cluster.EndpointSlice{Namespace: key.Namespace, Name: key.Name + "-" + map[cluster.Family]string{cluster.IPv4: "v4", cluster.IPv6: "v6"}[fam],
		Service: key, Family: fam, Ports: ports, Endpoints: eps}
}

var trHTTP = []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}

// trSimple is a Service with one TCP port 80 -> 8080 ("http") and the given endpoints of one family.
func trSimple(name string, typ cluster.ServiceType, clusterIPs []string, fam cluster.Family, eps ...cluster.Endpoint) trService {
	key := cluster.ServiceKey{Namespace: "ns1", Name: name}
	svc := &cluster.Service{Key: key, Type: typ, ClusterIPs: trAddrs(clusterIPs...),
		Ports: []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}}
	s := trService{svc: svc}
	if len(eps) > 0 {
		s.slices = []*cluster.EndpointSlice{trSlice(key, fam, trHTTP, eps...)}
	}
	return s
}

// trFixture is every Service of the flow tests (IPv4 and IPv6 objects side by side).
func trFixture() []trService {
	var out []trService
	add := func(s trService, edit func(*cluster.Service)) {
		if edit != nil {
			edit(s.svc)
		}
		out = append(out, s)
	}
	v4, v6 := cluster.IPv4, cluster.IPv6

	// web: dual-stack ClusterIP with TCP, UDP and SCTP ports; one endpoint here, one on node2.
	webKey := cluster.ServiceKey{Namespace: "ns1", Name: "web"}
	webPorts := []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}, {Name: "dns", Protocol: cluster.UDP, Port: 5353}, {Name: "sctp", Protocol: cluster.SCTP, Port: 9999}}
	out = append(out, trService{
		svc: &cluster.Service{Key: webKey, Type: cluster.TypeClusterIP, ClusterIPs: trAddrs("10.96.0.10", "2001:db8:96::10"),
			Ports: []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}, {Name: "dns", Protocol: cluster.UDP, Port: 53}, {Name: "sctp", Protocol: cluster.SCTP, Port: 9999}}},
		slices: []*cluster.EndpointSlice{
			trSlice(webKey, v4, webPorts, trEp("10.244.1.10", trNode), trEp("10.244.2.10", "node2")),
			trSlice(webKey, v6, webPorts, trEp("2001:db8:244:1::10", trNode), trEp("2001:db8:244:2::10", "node2")),
		},
	})
	// empty: no endpoints at all (and a NodePort).
	add(trSimple("empty", cluster.TypeNodePort, []string{"10.96.0.11", "2001:db8:96::11"}, v4), func(s *cluster.Service) { s.Ports[0].NodePort = 30090 })
	// headless and ExternalName Services are not handled.
	add(trSimple("headless", cluster.TypeClusterIP, nil, v4, trEp("10.244.1.20", trNode)), func(s *cluster.Service) { s.Headless = true })
	add(trSimple("extname", cluster.TypeExternalName, nil, v4), nil)
	// np: NodePort 30080, eTP=Cluster.
	add(trSimple("np", cluster.TypeNodePort, []string{"10.96.0.12"}, v4, trEp("10.244.1.10", trNode), trEp("10.244.2.10", "node2")),
		func(s *cluster.Service) { s.Ports[0].NodePort = 30080 })
	// lb: LoadBalancer and external IP, eTP=Cluster.
	add(trSimple("lb", cluster.TypeLoadBalancer, []string{"10.96.0.13"}, v4, trEp("10.244.1.10", trNode), trEp("10.244.2.10", "node2")),
		func(s *cluster.Service) {
			s.Ports[0].NodePort = 30081
			s.LoadBalancerIPs = trAddrs("198.51.100.10")
			s.ExternalIPs = trAddrs("203.0.113.100")
		})
	// lb-local: eTP=Local, one endpoint here and one on node2 (dual-stack).
	lbLocal := trSimple("lb-local", cluster.TypeLoadBalancer, []string{"10.96.0.14", "2001:db8:96::14"}, v4, trEp("10.244.1.11", trNode), trEp("10.244.2.11", "node2"))
	lbLocal.slices = append(lbLocal.slices, trSlice(lbLocal.svc.Key, v6, trHTTP, trEp("2001:db8:244:1::11", trNode), trEp("2001:db8:244:2::11", "node2")))
	add(lbLocal, func(s *cluster.Service) {
		s.Ports[0].NodePort = 30082
		s.LoadBalancerIPs = trAddrs("198.51.100.11", "2001:db8:100::11")
		s.ExternalPolicyLocal = true
		s.HealthCheckNodePort = 32000
	})
	// lb-local-none: eTP=Local with endpoints only on node2.
	add(trSimple("lb-local-none", cluster.TypeLoadBalancer, []string{"10.96.0.15"}, v4, trEp("10.244.2.12", "node2")),
		func(s *cluster.Service) {
			s.Ports[0].NodePort = 30083
			s.LoadBalancerIPs = trAddrs("198.51.100.12")
			s.ExternalPolicyLocal = true
		})
	// itp-local and itp-local-none: internalTrafficPolicy Local.
	add(trSimple("itp-local", cluster.TypeClusterIP, []string{"10.96.0.16"}, v4, trEp("10.244.1.13", trNode), trEp("10.244.2.13", "node2")),
		func(s *cluster.Service) { s.InternalPolicyLocal = true })
	add(trSimple("itp-local-none", cluster.TypeClusterIP, []string{"10.96.0.17"}, v4, trEp("10.244.2.14", "node2")),
		func(s *cluster.Service) { s.InternalPolicyLocal = true })
	// terminating: nothing ready; one endpoint still serving while terminating, one not serving.
	add(trSimple("terminating", cluster.TypeClusterIP, []string{"10.96.0.18"}, v4,
		cluster.Endpoint{Addresses: trAddrs("10.244.1.15"), Serving: true, Terminating: true, NodeName: trNode},
		cluster.Endpoint{Addresses: trAddrs("10.244.2.15"), Terminating: true, NodeName: "node2"}), nil)
	// affinity: ClientIP session affinity, three endpoints, and an external IP (eTP=Cluster).
	aff := trSimple("affinity", cluster.TypeClusterIP, []string{"10.96.0.19", "2001:db8:96::19"}, v4,
		trEp("10.244.1.16", trNode), trEp("10.244.2.16", "node2"), trEp("10.244.3.16", "node3"))
	aff.slices = append(aff.slices, trSlice(aff.svc.Key, v6, trHTTP, trEp("2001:db8:244:1::16", trNode), trEp("2001:db8:244:2::16", "node2")))
	add(aff, func(s *cluster.Service) {
		s.AffinityTimeout = 3 * time.Hour
		s.ExternalIPs = trAddrs("203.0.113.101")
	})
	// lb-fw: loadBalancerSourceRanges (one range holds the node IP, so the VIP is an allowed source too).
	add(trSimple("lb-fw", cluster.TypeLoadBalancer, []string{"10.96.0.20"}, v4, trEp("10.244.1.10", trNode), trEp("10.244.2.10", "node2")),
		func(s *cluster.Service) {
			s.Ports[0].NodePort = 30084
			s.LoadBalancerIPs = trAddrs("198.51.100.13")
			s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("192.0.2.0/24")}
		})
	// topo: zone hints; node1 is in zone-a.
	topo := trSimple("topo", cluster.TypeClusterIP, []string{"10.96.0.21"}, v4,
		trEp("10.244.1.17", trNode), trEp("10.244.2.17", "node2"), trEp("10.244.3.17", "node3"))
	for i, z := range []string{"zone-a", "zone-a", "zone-b"} {
		topo.slices[0].Endpoints[i].Topology = &cluster.EndpointTopology{ZoneHints: []string{z}}
	}
	add(topo, func(s *cluster.Service) { s.TrafficDistribution = "PreferClose" })
	// named: a named targetPort that resolves to different numbers on different pods (the upstream
	// e2e "should support named targetPorts that resolve to different ports on different
	// endpoints"). The EndpointSlice controller then writes one slice per port mapping, each with the
	// numbers of its own endpoints; slice b also lists its ports in another order than the Service.
	namedKey := cluster.ServiceKey{Namespace: "ns1", Name: "named"}
	namedA := trSlice(namedKey, v4, []cluster.EndpointPort{{Name: "mutable-named-port", Protocol: cluster.TCP, Port: 8080}, {Name: "metrics", Protocol: cluster.TCP, Port: 9100}},
		trEp("10.244.1.18", trNode))
	namedA.Name = "named-a"
	namedB := trSlice(namedKey, v4, []cluster.EndpointPort{{Name: "metrics", Protocol: cluster.TCP, Port: 9101}, {Name: "mutable-named-port", Protocol: cluster.TCP, Port: 8081}},
		trEp("10.244.2.18", "node2"))
	namedB.Name = "named-b"
	// A slice of pods that do not name the port at all: they serve no Service port.
	namedC := trSlice(namedKey, v4, nil, trEp("10.244.3.18", "node3"))
	namedC.Name = "named-c"
	out = append(out, trService{
		svc: &cluster.Service{Key: namedKey, Type: cluster.TypeNodePort, ClusterIPs: trAddrs("10.96.0.22"),
			Ports: []cluster.ServicePort{{Name: "mutable-named-port", Protocol: cluster.TCP, Port: 8001, NodePort: 30086}, {Name: "metrics", Protocol: cluster.TCP, Port: 9090}}},
		slices: []*cluster.EndpointSlice{namedA, namedB, namedC},
	})
	// np6: an IPv6-only NodePort Service.
	np6 := trSimple("np6", cluster.TypeNodePort, []string{"2001:db8:96::12"}, v6, trEp("2001:db8:244:1::10", trNode), trEp("2001:db8:244:2::10", "node2"))
	add(np6, func(s *cluster.Service) { s.Ports[0].NodePort = 30085 })
	return out
}

// trFlat builds the table of one family from the fixed base and the given Services, the way the
// proxier does: every Service's part, plus the shared chains they use.
func trFlat(t testing.TB, fam cluster.Family, masqAll bool, svcs []trService) *dataplane.Flat {
	t.Helper()
	rs := &dataplane.Ruleset{Family: fam, Table: "vipgate", Base: BuildBase(trBaseConfig(fam, masqAll)),
		Services: map[cluster.ServiceKey]*dataplane.Part{}, Shared: map[string]*dataplane.Chain{}}
	for _, s := range svcs {
		p := BuildService(trNodeInfo(fam), s.svc, s.slices)
		rs.Services[s.svc.Key] = p
		for _, u := range p.Uses {
			c := SharedChain(u)
			if c == nil {
				t.Fatalf("Service %s uses %q, which is not a shared chain", s.svc.Key, u)
			}
			rs.Shared[u] = c
		}
	}
	return rs.Flatten()
}

// trFlow is one packet and what must become of it: "ip:port, ip:port" (with " masq" at the end when
// every candidate is masqueraded, or after each one that is when they differ), or DROP, REJECT,
// ACCEPT.
type trFlow struct {
	name     string
	src, dst string
	proto    uint8 // default TCP
	port     uint16
	fromHost bool
	output   string
}

func trRunFlows(t *testing.T, f *dataplane.Flat, flows []trFlow) {
	t.Helper()
	for _, tc := range flows {
		t.Run(tc.name, func(t *testing.T) {
			proto := tc.proto
			if proto == 0 {
				proto = dataplane.ProtoTCP
			}
			p := dataplane.Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst), Proto: proto, Port: tc.port, FromHost: tc.fromHost}
			res := dataplane.Trace(f, trHost, p)
			if diff := cmp.Diff(tc.output, res.String()); diff != "" {
				t.Errorf("packet %s -> %s:%d (%s, fromHost=%v): wrong outcome (-want +got):\n%s\ntrace:\n%s",
					tc.src, tc.dst, tc.port, dataplane.ProtoName(proto), tc.fromHost, diff, res.Explain())
			}
		})
	}
}

const (
	outside = "203.0.113.5"    // a client beyond the node
	podHere = "10.244.1.99"    // a pod on this node (not an endpoint of anything)
	podAway = "10.244.3.5"     // a pod on another node, routed through us
	bad     = "198.51.100.200" // a client outside every source range
)

func TestTraceFlowsIPv4(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	trRunFlows(t, f, []trFlow{
		// ClusterIP, every protocol; pods keep their source, others are masqueraded.
		{name: "pod to ClusterIP TCP", src: podHere, dst: "10.96.0.10", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080"},
		{name: "pod to ClusterIP UDP", src: podAway, dst: "10.96.0.10", proto: dataplane.ProtoUDP, port: 53, output: "10.244.1.10:5353, 10.244.2.10:5353"},
		{name: "pod to ClusterIP SCTP", src: podHere, dst: "10.96.0.10", proto: dataplane.ProtoSCTP, port: 9999, output: "10.244.1.10:9999, 10.244.2.10:9999"},
		{name: "outside to ClusterIP", src: outside, dst: "10.96.0.10", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "host to ClusterIP", src: trNodeIP4.String(), dst: "10.96.0.10", port: 80, fromHost: true, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "hairpin", src: "10.244.1.10", dst: "10.96.0.10", port: 80, output: "10.244.1.10:8080 masq, 10.244.2.10:8080"},
		{name: "hairpin UDP", src: "10.244.1.10", dst: "10.96.0.10", proto: dataplane.ProtoUDP, port: 53, output: "10.244.1.10:5353 masq, 10.244.2.10:5353"},
		{name: "undefined port of a ClusterIP", src: podHere, dst: "10.96.0.10", port: 81, output: "REJECT"},
		{name: "undefined protocol of a ClusterIP", src: podHere, dst: "10.96.0.10", proto: dataplane.ProtoUDP, port: 80, output: "REJECT"},
		{name: "host to undefined port of a ClusterIP", src: trNodeIP4.String(), dst: "10.96.0.10", port: 81, fromHost: true, output: "REJECT"},
		{name: "unallocated ClusterIP", src: podHere, dst: "10.96.99.99", port: 80, output: "DROP"},
		{name: "not Service traffic", src: outside, dst: "10.244.2.10", port: 8080, output: "ACCEPT"},
		{name: "to the node itself", src: outside, dst: trNodeIP4.String(), port: 22, output: "ACCEPT"},

		// No endpoints.
		{name: "no endpoints", src: podHere, dst: "10.96.0.11", port: 80, output: "REJECT"},
		{name: "no endpoints from host", src: trNodeIP4.String(), dst: "10.96.0.11", port: 80, fromHost: true, output: "REJECT"},
		{name: "no endpoints NodePort", src: outside, dst: trNodeIP4.String(), port: 30090, output: "REJECT"},

		// Headless: the pod IP is reached directly, untouched.
		{name: "headless endpoint", src: podHere, dst: "10.244.1.20", port: 8080, output: "ACCEPT"},

		// NodePort.
		{name: "NodePort from outside", src: outside, dst: trNodeIP4.String(), port: 30080, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "NodePort from host", src: trNodeIP4.String(), dst: trNodeIP4.String(), port: 30080, fromHost: true, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "NodePort on localhost is not handled", src: "127.0.0.1", dst: "127.0.0.1", port: 30080, fromHost: true, output: "ACCEPT"},
		{name: "NodePort on another address", src: outside, dst: "192.0.2.99", port: 30080, output: "ACCEPT"},
		{name: "undefined NodePort", src: outside, dst: trNodeIP4.String(), port: 30999, output: "ACCEPT"},

		// LoadBalancer / external IP, eTP=Cluster.
		{name: "LB IP eTP=Cluster", src: outside, dst: "198.51.100.10", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "external IP eTP=Cluster", src: outside, dst: "203.0.113.100", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "LB IP undefined port", src: outside, dst: "198.51.100.10", port: 81, output: "ACCEPT"},

		// eTP=Local.
		{name: "LB IP eTP=Local from outside", src: outside, dst: "198.51.100.11", port: 80, output: "10.244.1.11:8080"},
		{name: "LB IP eTP=Local from a pod", src: podHere, dst: "198.51.100.11", port: 80, output: "10.244.1.11:8080, 10.244.2.11:8080"},
		{name: "LB IP eTP=Local from the host", src: trNodeIP4.String(), dst: "198.51.100.11", port: 80, fromHost: true, output: "10.244.1.11:8080, 10.244.2.11:8080 masq"},
		{name: "LB IP eTP=Local hairpin", src: "10.244.1.11", dst: "198.51.100.11", port: 80, output: "10.244.1.11:8080 masq, 10.244.2.11:8080"},
		{name: "NodePort eTP=Local from outside", src: outside, dst: trNodeIP4.String(), port: 30082, output: "10.244.1.11:8080"},
		{name: "NodePort eTP=Local from the host", src: trNodeIP4.String(), dst: trNodeIP4.String(), port: 30082, fromHost: true, output: "10.244.1.11:8080, 10.244.2.11:8080 masq"},
		{name: "ClusterIP of an eTP=Local Service", src: outside, dst: "10.96.0.14", port: 80, output: "10.244.1.11:8080, 10.244.2.11:8080 masq"},
		{name: "eTP=Local, no local endpoint", src: outside, dst: "198.51.100.12", port: 80, output: "DROP"},
		{name: "eTP=Local NodePort, no local endpoint", src: outside, dst: trNodeIP4.String(), port: 30083, output: "DROP"},
		{name: "eTP=Local, no local endpoint, from a pod", src: podAway, dst: "198.51.100.12", port: 80, output: "10.244.2.12:8080"},
		{name: "eTP=Local, no local endpoint, from the host", src: trNodeIP4.String(), dst: "198.51.100.12", port: 80, fromHost: true, output: "10.244.2.12:8080 masq"},
		{name: "eTP=Local, no local endpoint, ClusterIP", src: podHere, dst: "10.96.0.15", port: 80, output: "10.244.2.12:8080"},

		// iTP=Local.
		{name: "iTP=Local", src: podHere, dst: "10.96.0.16", port: 80, output: "10.244.1.13:8080"},
		{name: "iTP=Local, none local", src: podHere, dst: "10.96.0.17", port: 80, output: "DROP"},

		// Terminating fallback, session affinity, topology.
		{name: "terminating fallback", src: podHere, dst: "10.96.0.18", port: 80, output: "10.244.1.15:8080"},
		{name: "session affinity", src: podHere, dst: "10.96.0.19", port: 80, output: "10.244.1.16:8080, 10.244.2.16:8080, 10.244.3.16:8080"},
		{name: "session affinity from outside", src: outside, dst: "10.96.0.19", port: 80, output: "10.244.1.16:8080, 10.244.2.16:8080, 10.244.3.16:8080 masq"},
		{name: "session affinity external IP", src: podHere, dst: "203.0.113.101", port: 80, output: "10.244.1.16:8080, 10.244.2.16:8080, 10.244.3.16:8080 masq"},
		{name: "session affinity hairpin", src: "10.244.1.16", dst: "10.96.0.19", port: 80, output: "10.244.1.16:8080 masq, 10.244.2.16:8080, 10.244.3.16:8080"},
		{name: "topology hints", src: podHere, dst: "10.96.0.21", port: 80, output: "10.244.1.17:8080, 10.244.2.17:8080"},

		// Named targetPort resolving to different numbers: each endpoint with its own slice's port.
		{name: "named targetPort, different ports per slice", src: podHere, dst: "10.96.0.22", port: 8001, output: "10.244.1.18:8080, 10.244.2.18:8081"},
		{name: "named targetPort, second Service port", src: podHere, dst: "10.96.0.22", port: 9090, output: "10.244.1.18:9100, 10.244.2.18:9101"},
		{name: "named targetPort NodePort", src: outside, dst: trNodeIP4.String(), port: 30086, output: "10.244.1.18:8080, 10.244.2.18:8081 masq"},

		// loadBalancerSourceRanges.
		{name: "source range allowed", src: outside, dst: "198.51.100.13", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "source range denied", src: bad, dst: "198.51.100.13", port: 80, output: "DROP"},
		{name: "source range denies pods too", src: podHere, dst: "198.51.100.13", port: 80, output: "DROP"},
		{name: "source range holding the node IP admits the VIP as source", src: "198.51.100.13", dst: "198.51.100.13", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "host to LB IP in a source range", src: trNodeIP4.String(), dst: "198.51.100.13", port: 80, fromHost: true, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "source range does not cover the ClusterIP", src: bad, dst: "10.96.0.20", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "source range does not cover the NodePort", src: bad, dst: trNodeIP4.String(), port: 30084, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
	})
}

func TestTraceFlowsMasqueradeAll(t *testing.T) {
	f := trFlat(t, cluster.IPv4, true, trFixture())
	trRunFlows(t, f, []trFlow{
		{name: "pod to ClusterIP", src: podHere, dst: "10.96.0.10", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "outside to ClusterIP", src: outside, dst: "10.96.0.10", port: 80, output: "10.244.1.10:8080, 10.244.2.10:8080 masq"},
		{name: "eTP=Local from outside keeps the source", src: outside, dst: "198.51.100.11", port: 80, output: "10.244.1.11:8080"},
	})
}

func TestTraceFlowsIPv6(t *testing.T) {
	f := trFlat(t, cluster.IPv6, false, trFixture())
	const (
		out6  = "2001:db8:ffff::5"
		pod6  = "2001:db8:244:1::99"
		node6 = "2001:db8:1::11"
	)
	trRunFlows(t, f, []trFlow{
		{name: "pod to ClusterIP", src: pod6, dst: "2001:db8:96::10", port: 80, output: "[2001:db8:244:1::10]:8080, [2001:db8:244:2::10]:8080"},
		{name: "pod to ClusterIP UDP", src: pod6, dst: "2001:db8:96::10", proto: dataplane.ProtoUDP, port: 53, output: "[2001:db8:244:1::10]:5353, [2001:db8:244:2::10]:5353"},
		{name: "outside to ClusterIP", src: out6, dst: "2001:db8:96::10", port: 80, output: "[2001:db8:244:1::10]:8080, [2001:db8:244:2::10]:8080 masq"},
		{name: "hairpin", src: "2001:db8:244:1::10", dst: "2001:db8:96::10", port: 80, output: "[2001:db8:244:1::10]:8080 masq, [2001:db8:244:2::10]:8080"},
		{name: "undefined port", src: pod6, dst: "2001:db8:96::10", port: 81, output: "REJECT"},
		{name: "unallocated ClusterIP", src: pod6, dst: "2001:db8:96::99", port: 80, output: "DROP"},
		{name: "no endpoints", src: pod6, dst: "2001:db8:96::11", port: 80, output: "REJECT"},
		{name: "NodePort", src: out6, dst: node6, port: 30085, output: "[2001:db8:244:1::10]:8080, [2001:db8:244:2::10]:8080 masq"},
		{name: "NodePort on ::1 is not handled", src: "::1", dst: "::1", port: 30085, fromHost: true, output: "ACCEPT"},
		{name: "eTP=Local from outside", src: out6, dst: "2001:db8:100::11", port: 80, output: "[2001:db8:244:1::11]:8080"},
		{name: "eTP=Local from a pod", src: pod6, dst: "2001:db8:100::11", port: 80, output: "[2001:db8:244:1::11]:8080, [2001:db8:244:2::11]:8080"},
		{name: "eTP=Local from the host", src: node6, dst: "2001:db8:100::11", port: 80, fromHost: true, output: "[2001:db8:244:1::11]:8080, [2001:db8:244:2::11]:8080 masq"},
		{name: "session affinity", src: pod6, dst: "2001:db8:96::19", port: 80, output: "[2001:db8:244:1::16]:8080, [2001:db8:244:2::16]:8080"},
		{name: "IPv4 packet is not seen by the ip6 table", src: podHere, dst: "10.96.0.10", port: 80, output: "ACCEPT"},
	})
}

func TestTraceExcludedServices(t *testing.T) {
	for _, s := range trFixture() {
		if s.svc.Key.Name != "headless" && s.svc.Key.Name != "extname" {
			continue
		}
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			p := BuildService(trNodeInfo(fam), s.svc, s.slices)
			if len(p.Chains)+len(p.Sets)+len(p.Elements) != 0 {
				t.Errorf("%s (IPv%d) owns rules: %+v", s.svc.Key, fam, p)
			}
		}
	}
}

func TestTraceResult(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	res := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr("10.244.1.10"), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80})
	type cand struct {
		Endpoint   string
		Masquerade bool
	}
	var got []cand
	for _, c := range res.Candidates {
		got = append(got, cand{c.Endpoint.String(), c.Masquerade})
		if c.Why == "" {
			t.Errorf("candidate %s has no Why", c.Endpoint)
		}
	}
	want := []cand{{"10.244.1.10:8080", true}, {"10.244.2.10:8080", false}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("candidates (-want +got):\n%s", diff)
	}
	if res.Outcome != dataplane.OutcomeDNAT {
		t.Errorf("outcome %s, want DNAT", res.Outcome)
	}
	log := res.Explain()
	for _, s := range []string{"prerouting nat-prerouting", "goto pick-endpoints-2", "hairpin", "routing", "postrouting"} {
		if !strings.Contains(log, s) {
			t.Errorf("trace log lacks %q:\n%s", s, log)
		}
	}
	t.Logf("trace of a hairpin connection:\n%s", log)
}

// A ruleset the tracer cannot evaluate must fail loudly, never be half-understood.
func TestTraceErrors(t *testing.T) {
	pkt := dataplane.Packet{Src: netip.MustParseAddr(podHere), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80}
	cases := []struct {
		name string
		edit func(f *dataplane.Flat)
		want string
	}{
		{"unknown match kind", func(f *dataplane.Flat) {
			c := f.Chains[tablenames.ChainServices]
			c.Rules = append([]dataplane.Rule{{Matches: []dataplane.Match{{Kind: 200}}, Action: dataplane.Action{Kind: dataplane.ActDrop}}}, c.Rules...)
		}, "unknown match kind 200"},
		{"unknown action kind", func(f *dataplane.Flat) {
			c := f.Chains[tablenames.ChainServices]
			c.Rules = append([]dataplane.Rule{{Action: dataplane.Action{Kind: 200}}}, c.Rules...)
		}, "unknown action kind 200"},
		{"missing set", func(f *dataplane.Flat) { delete(f.Sets, SetClusterCIDRs) }, `missing set "cluster-cidrs"`},
		{"set of the wrong kind", func(f *dataplane.Flat) { f.Sets[tablenames.MapServiceIPs].Kind = dataplane.KindAddr }, `set "service-ips" has kind`},
		{"missing chain", func(f *dataplane.Flat) {
			c := f.Chains[tablenames.ChainServices]
			c.Rules = append([]dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: "nowhere"}}}, c.Rules...)
		}, `missing chain "nowhere"`},
		{"dnat in a filter chain", func(f *dataplane.Flat) {
			c := f.Chains[tablenames.ChainFilterPreroutingPreDNAT]
			c.Rules = append([]dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: tablenames.ChainServices}}}, c.Rules...)
		}, "the kernel only allows it in nat chains"},
		{"jump loop", func(f *dataplane.Flat) {
			c := f.Chains[tablenames.ChainServices]
			c.Rules = append([]dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: tablenames.ChainServices}}}, c.Rules...)
		}, "nested jumps"},
		{"unknown verdict", func(f *dataplane.Flat) {
			els := f.Elements[tablenames.MapServiceIPs]
			for i := range els {
				els[i].Verdict = 9
			}
		}, "unknown verdict kind 9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := trFlat(t, cluster.IPv4, false, trFixture())
			// The edits change shared chains: give this flat its own copies.
			for n, c := range f.Chains {
				cc := *c
				cc.Rules = append([]dataplane.Rule(nil), c.Rules...)
				f.Chains[n] = &cc
			}
			for n, s := range f.Sets {
				ss := *s
				f.Sets[n] = &ss
			}
			tc.edit(f)
			res := dataplane.Trace(f, trHost, pkt)
			if res.Outcome != dataplane.OutcomeError || !strings.Contains(res.Reason, tc.want) {
				t.Errorf("got %s (%s), want ERROR containing %q", res.Outcome, res.Reason, tc.want)
			}
		})
	}
}

// A picker whose modulus is larger than the endpoints in the map makes some random choices miss: the
// kernel's lookup fails and the packet falls through. The tracer must show those branches.
func TestTraceMissingEndpointIndex(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	els := f.Elements[MapEndpoints][:0:0]
	for _, e := range f.Elements[MapEndpoints] {
		if !(e.Addr == netip.MustParseAddr("10.96.0.10") && e.Port == 80 && e.Index == 1) {
			els = append(els, e)
		}
	}
	f.Elements[MapEndpoints] = els
	res := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(podHere), Dst: netip.MustParseAddr("10.96.0.10"), Proto: dataplane.ProtoTCP, Port: 80})
	if diff := cmp.Diff("10.244.1.10:8080, REJECT", res.String()); diff != "" {
		t.Errorf("(-want +got):\n%s\n%s", diff, res.Explain())
	}
	if res.Outcome != dataplane.OutcomeMixed {
		t.Errorf("outcome %s, want MIXED", res.Outcome)
	}
}

// Session affinity's trace (its descriptor's, dataplane/kinds.go: TestAffinityKindsTrace): the recall rule's lookup misses (the maps are
// empty at trace time), every endpoint's DNAT rule records the client and DNATs, and each says so as
// values; an affinity DNAT outside a nat chain fails the trace.
func TestTraceAffinitySteps(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, trFixture())
	res := dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(podHere), Dst: netip.MustParseAddr("10.96.0.19"), Proto: dataplane.ProtoTCP, Port: 80})
	var recalls, dnats []dataplane.Step
	for _, s := range res.Steps {
		switch {
		case s.Action == dataplane.ActAffinityRecall:
			recalls = append(recalls, s)
		case s.Action == dataplane.ActAffinityDNAT && s.Kind == dataplane.StepMatch:
			dnats = append(dnats, s)
		}
	}
	if len(recalls) == 0 {
		t.Fatalf("no recall step:\n%s", res.Explain())
	}
	for _, s := range recalls {
		if s.Kind != dataplane.StepNoMatch || !strings.Contains(s.Note, "affinity maps are empty at trace time") {
			t.Errorf("recall step %+v: want a miss on an empty map", s)
		}
	}
	var eps []string
	for _, s := range dnats {
		if !strings.Contains(s.Note, "client recorded in @") {
			t.Errorf("affinity DNAT step %+v", s)
		}
		eps = append(eps, s.Endpoint.String())
	}
	slices.Sort(eps)
	if diff := cmp.Diff([]string{"10.244.1.16:8080", "10.244.2.16:8080", "10.244.3.16:8080"}, eps); diff != "" {
		t.Errorf("affinity DNAT endpoints (-want +got):\n%s", diff)
	}
	for _, c := range res.Candidates {
		if c.Rule.Action != dataplane.ActAffinityDNAT {
			t.Errorf("candidate %s decided by %+v, want an affinity DNAT", c.Endpoint, c.Rule)
		}
	}

	// An affinity DNAT in a filter chain: the kernel would refuse it, so must the tracer.
	var aff *dataplane.Chain
	for _, c := range f.Chains {
		if slices.ContainsFunc(c.Rules, func(r dataplane.Rule) bool { return r.Action.Kind == dataplane.ActAffinityDNAT }) {
			aff = c
			break
		}
	}
	if aff == nil {
		t.Fatal("no chain with an affinity DNAT")
	}
	c := *f.Chains[tablenames.ChainFilterPreroutingPreDNAT]
	c.Rules = append([]dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: aff.Name}}}, c.Rules...)
	f.Chains[c.Name] = &c
	res = dataplane.Trace(f, trHost, dataplane.Packet{Src: netip.MustParseAddr(podHere), Dst: netip.MustParseAddr("10.96.0.19"), Proto: dataplane.ProtoTCP, Port: 80})
	if res.Outcome != dataplane.OutcomeError || !strings.Contains(res.Reason, "the kernel only allows it in nat chains") {
		t.Errorf("affinity DNAT in a filter chain: %s (%s), want ERROR", res.Outcome, res.Reason)
	}
}

// ---- The tracer against the kernel ----
//
// TestTraceAgreesWithKernel loads the rendered fixture into a network namespace that plays the node,
// sends real TCP connections from a client namespace, from a namespace that holds every pod address
// and from the node itself, and checks that what the kernel does is what the tracer says: which
// endpoints answer, whether they see the client's address or the node's (masquerade), and whether the
// connection is refused (REJECT) or never answered (DROP).

// trNS is a named network namespace with an open handle.
type trNS struct {
	name string
	h    netns.NsHandle
}

// do runs fn on a thread inside the namespace. Sockets created there stay in it.
func (n trNS) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(n.h); err != nil {
		return fmt.Errorf("entering netns %s: %w", n.name, err)
	}
	defer netns.Set(orig)
	return fn()
}

func trSh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func trNewNS(t *testing.T, suffix string) trNS {
	t.Helper()
	name := fmt.Sprintf("vgt%d-%s", os.Getpid(), suffix)
	trSh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("opening netns %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	for _, s := range []string{"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"} {
		trSh(t, "ip", "netns", "exec", name, "sysctl", "-qw", s)
	}
	trSh(t, "ip", "-n", name, "link", "set", "lo", "up")
	return trNS{name: name, h: h}
}

// trKernelLab is the node, a client beyond it and one namespace per pod address (pods must not share
// a namespace: a reply between two of them would skip the node and its reverse NAT).
type trKernelLab struct {
	node, client trNS
	pods         map[netip.Addr]trNS
}

func trNewKernelLab(t *testing.T, podAddrs []netip.Addr) *trKernelLab {
	l := &trKernelLab{node: trNewNS(t, "tn"), client: trNewNS(t, "tc"), pods: map[netip.Addr]trNS{}}
	n, c := l.node.name, l.client.name
	trSh(t, "ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// node <-> client: 203.0.113.0/24; the node IP 192.0.2.11 is on every link of the node.
	trSh(t, "ip", "-n", n, "link", "add", "vgc", "type", "veth", "peer", "name", "vgc", "netns", c)
	trSh(t, "ip", "-n", n, "addr", "add", "203.0.113.1/24", "dev", "vgc")
	trSh(t, "ip", "-n", n, "addr", "add", trNodeIP4.String()+"/32", "dev", "vgc")
	trSh(t, "ip", "-n", n, "link", "set", "vgc", "up")
	trSh(t, "ip", "-n", c, "addr", "add", outside+"/24", "dev", "vgc")
	trSh(t, "ip", "-n", c, "addr", "add", bad+"/32", "dev", "vgc")
	trSh(t, "ip", "-n", c, "link", "set", "vgc", "up")
	trSh(t, "ip", "-n", c, "route", "add", "default", "via", "203.0.113.1")
	// node <-> each pod: a veth with a /32 route, as a CNI would do it.
	for i, a := range podAddrs {
		pod := trNewNS(t, fmt.Sprintf("p%d", i))
		l.pods[a] = pod
		dev := fmt.Sprintf("vgp%d", i)
		trSh(t, "ip", "-n", n, "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", pod.name)
		trSh(t, "ip", "-n", n, "addr", "add", trNodeIP4.String()+"/32", "dev", dev)
		trSh(t, "ip", "-n", n, "link", "set", dev, "up")
		trSh(t, "ip", "-n", n, "route", "add", a.String()+"/32", "dev", dev, "src", trNodeIP4.String())
		trSh(t, "ip", "-n", pod.name, "addr", "add", a.String()+"/32", "dev", "eth0")
		trSh(t, "ip", "-n", pod.name, "link", "set", "eth0", "up")
		trSh(t, "ip", "-n", pod.name, "route", "add", trNodeIP4.String(), "dev", "eth0")
		trSh(t, "ip", "-n", pod.name, "route", "add", "default", "via", trNodeIP4.String(), "dev", "eth0")
		trServe(t, pod, 8080)
		trServe(t, pod, 8081) // the second number of the named targetPort
	}
	// The node's own traffic to Service IPs needs a route before DNAT re-routes it: any pod link will do.
	trSh(t, "ip", "-n", n, "route", "add", "default", "dev", "vgp0", "src", trNodeIP4.String())
	return l
}

// trServe answers every connection on port in the pods namespace with "local remote".
func trServe(t *testing.T, ns trNS, port uint16) {
	var ln net.Listener
	err := ns.do(func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listening on %d: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr())
			c.Close()
		}
	}()
}

// trDial makes one connection from ns (bound to src unless it is the node's own traffic) and returns
// the endpoint that answered and the source it saw, or the outcome DROP / REJECT.
func trDial(ns trNS, src netip.Addr, bind bool, dst netip.AddrPort) (ep, seen string, err error) {
	var conn net.Conn
	derr := ns.do(func() error {
		d := net.Dialer{Timeout: 700 * time.Millisecond}
		if bind {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		var err error
		conn, err = d.Dial("tcp4", dst.String())
		return err
	})
	switch {
	case errors.Is(derr, syscall.ECONNREFUSED):
		return "REJECT", "", nil
	case derr != nil && (errors.Is(derr, os.ErrDeadlineExceeded) || strings.Contains(derr.Error(), "timeout")):
		return "DROP", "", nil
	case derr != nil:
		return "", "", derr
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", "", fmt.Errorf("reading the answer of %s: %w", dst, err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return "", "", fmt.Errorf("bad answer %q", line)
	}
	seenAP, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return "", "", err
	}
	return f[0], seenAP.Addr().String(), nil
}

func TestTraceAgreesWithKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates network namespaces)")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skip("nft not installed")
	}
	svcs := trFixture()
	f := trFlat(t, cluster.IPv4, false, svcs)

	// Every IPv4 pod address of the fixture, plus the client pods of the flows.
	podSet := map[netip.Addr]bool{netip.MustParseAddr(podHere): true, netip.MustParseAddr(podAway): true}
	for _, s := range svcs {
		for _, sl := range s.slices {
			for _, e := range sl.Endpoints {
				if a := e.Addresses[0]; a.Is4() {
					podSet[a] = true
				}
			}
		}
	}
	var pods []netip.Addr
	for a := range podSet {
		pods = append(pods, a)
	}
	slices.SortFunc(pods, netip.Addr.Compare)
	lab := trNewKernelLab(t, pods)
	pod := func(a string) trNS { return lab.pods[netip.MustParseAddr(a)] }

	path := filepath.Join(t.TempDir(), "vipgate.nft")
	if err := os.WriteFile(path, []byte(dataplane.RenderString(f)), 0o644); err != nil {
		t.Fatal(err)
	}
	trSh(t, "ip", "netns", "exec", lab.node.name, nft, "-f", path)

	// The node's own addresses as the kernel sees them (the tracer's HostInfo must agree).
	host := dataplane.HostInfo{IsLocal: func(a netip.Addr) bool {
		return a == trNodeIP4 || a == netip.MustParseAddr("203.0.113.1") || a.IsLoopback()
	}}

	flows := []struct {
		name string
		from trNS
		src  string
		bind bool // bind the source address (not for the node's own traffic)
		dst  string
		port uint16
		host bool
	}{
		{"pod to ClusterIP", pod(podHere), podHere, true, "10.96.0.10", 80, false},
		{"outside to ClusterIP", lab.client, outside, true, "10.96.0.10", 80, false},
		{"hairpin", pod("10.244.1.10"), "10.244.1.10", true, "10.96.0.10", 80, false},
		{"host to ClusterIP", lab.node, trNodeIP4.String(), false, "10.96.0.10", 80, true},
		{"undefined port", pod(podHere), podHere, true, "10.96.0.10", 81, false},
		{"unallocated ClusterIP", pod(podHere), podHere, true, "10.96.99.99", 80, false},
		{"no endpoints", pod(podHere), podHere, true, "10.96.0.11", 80, false},
		{"no endpoints NodePort", lab.client, outside, true, trNodeIP4.String(), 30090, false},
		{"NodePort from outside", lab.client, outside, true, trNodeIP4.String(), 30080, false},
		{"NodePort from host", lab.node, trNodeIP4.String(), false, trNodeIP4.String(), 30080, true},
		{"LB IP eTP=Cluster", lab.client, outside, true, "198.51.100.10", 80, false},
		{"LB eTP=Local from outside", lab.client, outside, true, "198.51.100.11", 80, false},
		{"LB eTP=Local from a pod", pod(podAway), podAway, true, "198.51.100.11", 80, false},
		{"LB eTP=Local from the host", lab.node, trNodeIP4.String(), false, "198.51.100.11", 80, true},
		{"eTP=Local NodePort from outside", lab.client, outside, true, trNodeIP4.String(), 30082, false},
		{"eTP=Local none local", lab.client, outside, true, "198.51.100.12", 80, false},
		{"iTP=Local", pod(podHere), podHere, true, "10.96.0.16", 80, false},
		{"iTP=Local none local", pod(podHere), podHere, true, "10.96.0.17", 80, false},
		{"terminating", pod(podHere), podHere, true, "10.96.0.18", 80, false},
		{"topology", pod(podHere), podHere, true, "10.96.0.21", 80, false},
		{"affinity", pod(podHere), podHere, true, "10.96.0.19", 80, false},
		{"named targetPort", pod(podHere), podHere, true, "10.96.0.22", 8001, false},
		{"named targetPort NodePort", lab.client, outside, true, trNodeIP4.String(), 30086, false},
		{"source range allowed", lab.client, outside, true, "198.51.100.13", 80, false},
		{"source range denied", lab.client, bad, true, "198.51.100.13", 80, false},
	}
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			src, dst := netip.MustParseAddr(fl.src), netip.MustParseAddr(fl.dst)
			res := dataplane.Trace(f, host, dataplane.Packet{Src: src, Dst: dst, Proto: dataplane.ProtoTCP, Port: fl.port, FromHost: fl.host})
			// What the tracer predicts, as "endpoint seen-source" lines.
			want := map[string]bool{}
			for _, c := range res.Candidates {
				seen := fl.src
				if c.Masquerade {
					seen = trNodeIP4.String()
				}
				want[c.Endpoint.String()+" "+seen] = true
			}
			for _, o := range res.Others {
				want[string(o)] = true
			}
			if len(res.Candidates) == 0 {
				want = map[string]bool{string(res.Outcome): true}
			}
			// What the kernel does: enough connections to meet every endpoint (at most 3 here), fewer
			// for outcomes that cannot vary.
			tries := 40
			switch {
			case want["DROP"] && len(want) == 1:
				tries = 1 // each try waits for the dial timeout
			case len(want) == 1:
				tries = 3
			}
			got := map[string]bool{}
			for range tries {
				ep, seen, err := trDial(fl.from, src, fl.bind, netip.AddrPortFrom(dst, fl.port))
				if err != nil {
					t.Fatalf("connecting: %v", err)
				}
				got[strings.TrimSpace(ep+" "+seen)] = true
			}
			wantKeys, gotKeys := slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got))
			if fl.name == "affinity" {
				// A client sticks to the endpoint it met first: the kernel shows one of the candidates.
				if len(gotKeys) != 1 || !want[gotKeys[0]] {
					t.Errorf("affinity: kernel %v, tracer %v", gotKeys, wantKeys)
				}
				return
			}
			if diff := cmp.Diff(wantKeys, gotKeys); diff != "" {
				t.Errorf("tracer and kernel disagree (-tracer +kernel):\n%s\ntrace:\n%s", diff, res.Explain())
			}
		})
	}
}

func BenchmarkTrace(b *testing.B) {
	f := trFlat(b, cluster.IPv4, false, trFixture())
	p := dataplane.Packet{Src: netip.MustParseAddr(outside), Dst: netip.MustParseAddr("10.96.0.19"), Proto: dataplane.ProtoTCP, Port: 80}
	for b.Loop() {
		if r := dataplane.Trace(f, trHost, p); r.Outcome != dataplane.OutcomeDNAT {
			b.Fatal(r.Reason)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	f := trFlat(b, cluster.IPv4, false, trFixture())
	for b.Loop() {
		if err := dataplane.Render(io.Discard, f); err != nil {
			b.Fatal(err)
		}
	}
}
