package proxy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// SyntheticState builds n Services with m endpoints each, the benchmark mix of kube-proxy's
// kpbench: 85% ClusterIP, 10% NodePort, 5% LoadBalancer (1 in 5 of those externalTrafficPolicy
// Local), 2% session affinity, one TCP port each; endpoint 0 of every Service is on node1. Used by
// the tests, the benchmarks and `make bench`.
func SyntheticState(n, m int) *cluster.State {
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
	for i := 0; i < n; i++ {
		key := cluster.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i)}
		svc := &cluster.Service{Key: key, Type: cluster.TypeClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []cluster.ServicePort{{Protocol: cluster.TCP, Port: 80}}}
		// NodePorts are unique: the NodePort and LoadBalancer Services before i, 3 in every 20. They
		// pass 32767 (the default range) above ~18,000 Services, as with a wider
		// --service-node-port-range; the dataplane takes them.
		nodePort := uint16(30000 + i/20*3)
		switch i % 20 {
		case 10:
			nodePort++
		case 15:
			nodePort += 2
		}
		switch {
		case i%20 == 10:
			svc.Type = cluster.TypeLoadBalancer
			svc.Ports[0].NodePort = nodePort
			svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})}
			if i%100 == 10 {
				svc.ExternalPolicyLocal = true
				svc.HealthCheckNodePort = uint16(32000 + i%700)
			}
		case i%10 == 5:
			svc.Type = cluster.TypeNodePort
			svc.Ports[0].NodePort = nodePort
		}
		if i%50 == 7 {
			svc.AffinityTimeout = 10800 * time.Second
		}
		es := &cluster.EndpointSlice{Namespace: "bench", Name: key.Name + "-1", Service: key, Family: cluster.IPv4,
			Ports: []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 8080}}}
		for j := 0; j < m; j++ {
			k := i*m + j
			node := "node2"
			if j == 0 {
				node = "node1"
			}
			es.Endpoints = append(es.Endpoints, cluster.Endpoint{
				Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(k >> 8), byte(k)})},
				Ready:     true, Serving: true, NodeName: node})
		}
		st.Services[key] = svc
		st.EndpointSlices[key] = []*cluster.EndpointSlice{es}
	}
	return st
}
