package main

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// The synthetic cluster. Services are decided by their index i, so every run (and every size) builds
// the same Service i. The mix is kube-proxy's kpbench mix (../shared/bench-kubeproxy), so the
// kube-proxy figures in the table compare like with like, plus session affinity:
//
//	85% ClusterIP; 10% NodePort (i%10 == 5); 5% LoadBalancer (i%20 == 10)
//	externalTrafficPolicy: Local on 1 in 10 NodePort (i%100 == 5) and 1 in 5 LoadBalancer (i%100 == 10)
//	  Services, the LoadBalancer ones with a healthCheckNodePort
//	sessionAffinity: ClientIP on 2% (i%50 == 7)
//	one TCP port (80 -> 8080), one EndpointSlice of m ready endpoints, endpoint 0 on this node
//
// Unlike proxy.SyntheticState, no two Services claim the same entry: NodePorts are unique and
// count up from 30001, healthCheckNodePorts count down from 32767 (they make no nftables entries);
// both stay in Kubernetes' default range 30000-32767 up to ~17,000 Services, beyond that the
// NodePorts go past 32767 as with a wider --service-node-port-range (the library takes them; `vipgate
// node` would refuse them, so the control-plane test stays below). LoadBalancer IPs come from
// 203.0.113.0/24 shared by port (MetalLB's allow-shared-ip), 250 Services per port. An entry claimed
// twice would be refused and retried on every sync, which would measure conflict handling instead of
// syncing.
//
// Beyond clusterIPServices (60,000) the service CIDR of the lab (10.96.0.0/16) has no addresses left:
// Service i >= 60,000 shares the cluster IP of Service i-60,000 on another port (1080 instead of 80;
// LoadBalancer ports likewise +1000), as a LoadBalancer IP is shared by port. Every (IP, protocol,
// port) entry, chain, rule and endpoint element is still its own, so the rules and set elements per
// Service are as before; anything kept per address (not per entry) counts 60,000 addresses instead
// of 100,000. A real cluster of 100,000 Services has a wider service CIDR
// (kubeadm's default is a /12).
const (
	// maxServices is the largest size the generator makes.
	maxServices = 100000
	// clusterIPServices is what the address plan holds of cluster IPs: 10.96.0.16-10.96.255.255 minus
	// the addresses the bench reserves at the top.
	clusterIPServices = 60000
	// firstNodePort is the NodePort of the first NodePort/LoadBalancer Service; 30000 is the
	// measured Service's (measuredNodePort).
	firstNodePort = 30001
	// lastHealthCheckPort is the healthCheckNodePort of the first eTP=Local LoadBalancer Service;
	// the next ones count down.
	lastHealthCheckPort = 32767
	// benchNamespace holds every synthetic Service.
	benchNamespace = "bench"
	// thisNode is the node the bench programs (the lab's node1).
	thisNode = "node1"
)

// clusterIPOf is Service i's cluster IP: 10.96.0.16 onwards (shared by port beyond 60,000).
func clusterIPOf(i int) netip.Addr {
	k := 16 + i%clusterIPServices
	return netip.AddrFrom4([4]byte{10, 96, byte(k >> 8), byte(k)})
}

// endpointIP is the k-th synthetic endpoint address: 10.244.2.1 to 10.244.255.250, wrapping (at
// 10,000 x 10 Services share backends, as in kpbench; rule counts do not depend on it). 10.244.0.0/24
// and 10.244.1.0/24 are left to the lab's node1 pods.
func endpointIP(k int) netip.Addr {
	k %= 254 * 250
	return netip.AddrFrom4([4]byte{10, 244, byte(2 + k/250), byte(1 + k%250)})
}

// serviceKey names synthetic Service i.
func serviceKey(i int) cluster.ServiceKey {
	return cluster.ServiceKey{Namespace: benchNamespace, Name: fmt.Sprintf("svc-%05d", i)}
}

// synthService builds synthetic Service i with m endpoints and its EndpointSlice.
func synthService(i, m int) (*cluster.Service, *cluster.EndpointSlice) {
	key := serviceKey(i)
	svc := &cluster.Service{Key: key, Type: cluster.TypeClusterIP, IPFamilies: []cluster.Family{cluster.IPv4},
		ClusterIPs: []netip.Addr{clusterIPOf(i)},
		Ports:      []cluster.ServicePort{{Protocol: cluster.TCP, Port: uint16(portBase(i))}}}
	// The node-port index counts the NodePort and LoadBalancer Services before i: 3 in every 20.
	npIndex := i / 20 * 3
	switch i % 20 {
	case 10:
		npIndex++
	case 15:
		npIndex += 2
	}
	switch {
	case i%20 == 10:
		lb := i / 20 // the LoadBalancer Service's own index
		svc.Type = cluster.TypeLoadBalancer
		svc.Ports[0].Port = uint16(portBase(i) + lb/250)
		svc.Ports[0].NodePort = uint16(firstNodePort + npIndex)
		svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + lb%250)})}
		if i%100 == 10 {
			svc.ExternalPolicyLocal = true
			svc.HealthCheckNodePort = uint16(lastHealthCheckPort - i/100)
		}
	case i%10 == 5:
		svc.Type = cluster.TypeNodePort
		svc.Ports[0].NodePort = uint16(firstNodePort + npIndex)
		svc.ExternalPolicyLocal = i%100 == 5
	}
	if i%50 == 7 {
		svc.AffinityTimeout = 10800 * time.Second
	}
	es := &cluster.EndpointSlice{Namespace: benchNamespace, Name: key.Name + "-abcde", Service: key, Family: cluster.IPv4,
		Ports: []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 8080}},
		// Exact capacity, as cluster's conversion of an EndpointSlice allocates it.
		Endpoints: make([]cluster.Endpoint, 0, m)}
	for j := 0; j < m; j++ {
		node := "node2"
		if j == 0 {
			node = thisNode
		}
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{endpointIP(i*m + j)},
			Ready: true, Serving: true, NodeName: node})
	}
	return svc, es
}

// portBase is Service i's port: 80, or 1080 where it shares its cluster IP (i >= 60,000).
func portBase(i int) int { return 80 + 1000*(i/clusterIPServices) }

// synthState is a cluster of n synthetic Services with m endpoints each.
func synthState(n, m int) *cluster.State {
	st := &cluster.State{Services: make(map[cluster.ServiceKey]*cluster.Service, n),
		EndpointSlices: make(map[cluster.ServiceKey][]*cluster.EndpointSlice, n)}
	for i := 0; i < n; i++ {
		svc, es := synthService(i, m)
		st.Services[svc.Key] = svc
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{es}
	}
	return st
}

// mix counts the Service kinds of a state, for the table's description of what was programmed.
type mix struct {
	ClusterIP, NodePort, LoadBalancer, LocalPolicy, Affinity, Endpoints int
}

func mixOf(st *cluster.State) mix {
	var m mix
	for k, svc := range st.Services {
		switch svc.Type {
		case cluster.TypeClusterIP:
			m.ClusterIP++
		case cluster.TypeNodePort:
			m.NodePort++
		case cluster.TypeLoadBalancer:
			m.LoadBalancer++
		}
		if svc.ExternalPolicyLocal {
			m.LocalPolicy++
		}
		if svc.AffinityTimeout > 0 {
			m.Affinity++
		}
		for _, es := range st.EndpointSlices[k] {
			m.Endpoints += len(es.Endpoints)
		}
	}
	return m
}

func (m mix) String() string {
	n := m.ClusterIP + m.NodePort + m.LoadBalancer
	pct := func(x int) string { return fmt.Sprintf("%.0f%%", 100*float64(x)/float64(max(n, 1))) }
	return fmt.Sprintf("%s ClusterIP, %s NodePort, %s LoadBalancer; %s eTP=Local, %s session affinity; %.0f endpoints per Service",
		pct(m.ClusterIP), pct(m.NodePort), pct(m.LoadBalancer), pct(m.LocalPolicy), pct(m.Affinity), float64(m.Endpoints)/float64(max(n, 1)))
}
