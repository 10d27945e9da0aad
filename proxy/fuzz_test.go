package proxy

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// fuzzBytes hands out fuzz input as small decisions.
type fuzzBytes struct{ b []byte }

func (f *fuzzBytes) next() byte {
	if len(f.b) == 0 {
		return 0
	}
	v := f.b[0]
	f.b = f.b[1:]
	return v
}

func (f *fuzzBytes) pick(n int) int { return int(f.next()) % n }

// fuzzState turns bytes into a small, valid desired state: the shapes vary (types, policies,
// families, ports, affinity, ranges, endpoint conditions), the validity rules of cluster/ hold.
func fuzzState(data []byte) *cluster.State {
	f := &fuzzBytes{b: data}
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
	protos := []cluster.Protocol{cluster.TCP, cluster.UDP, cluster.SCTP}
	types := []cluster.ServiceType{cluster.TypeClusterIP, cluster.TypeNodePort, cluster.TypeLoadBalancer, cluster.TypeExternalName}
	nsvc := 1 + f.pick(4)
	for i := 0; i < nsvc; i++ {
		key := cluster.ServiceKey{Namespace: "fz", Name: fmt.Sprintf("s%d", i)}
		svc := &cluster.Service{Key: key, Type: types[f.pick(len(types))]}
		fam := f.pick(3) // 0 v4, 1 v6, 2 dual
		if fam != 1 {
			svc.ClusterIPs = append(svc.ClusterIPs, netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)}))
		}
		if fam != 0 {
			svc.ClusterIPs = append(svc.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("2001:db8:96::%x", 10+i)))
		}
		svc.Headless = f.pick(10) == 0
		nports := 1 + f.pick(3)
		for j := 0; j < nports; j++ {
			p := cluster.ServicePort{Name: fmt.Sprintf("p%d", j), Protocol: protos[f.pick(3)], Port: uint16(80 + j)}
			if svc.Type == cluster.TypeNodePort || svc.Type == cluster.TypeLoadBalancer {
				p.NodePort = uint16(30000 + i*10 + j)
			}
			svc.Ports = append(svc.Ports, p)
		}
		if svc.Type == cluster.TypeLoadBalancer {
			svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)}))
			if fam != 0 {
				svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.MustParseAddr(fmt.Sprintf("2001:db8:ff::%x", 10+i)))
			}
			if f.pick(3) == 0 {
				svc.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:2::/64")}
			}
		}
		if f.pick(4) == 0 {
			svc.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(100 + i)})}
		}
		svc.ExternalPolicyLocal = f.pick(2) == 0
		svc.InternalPolicyLocal = f.pick(4) == 0
		if svc.ExternalPolicyLocal && svc.Type == cluster.TypeLoadBalancer {
			svc.HealthCheckNodePort = uint16(32000 + i)
		}
		if f.pick(4) == 0 {
			svc.AffinityTimeout = time.Duration(1+f.pick(100)) * time.Second
		}
		st.Services[key] = svc
		for _, family := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			es := &cluster.EndpointSlice{Namespace: "fz", Name: fmt.Sprintf("s%d-%d", i, family), Service: key, Family: family}
			for j, p := range svc.Ports {
				es.Ports = append(es.Ports, cluster.EndpointPort{Name: p.Name, Protocol: p.Protocol, Port: uint16(8080 + j)})
			}
			neps := f.pick(5)
			for j := 0; j < neps; j++ {
				var a netip.Addr
				if family == cluster.IPv4 {
					a = netip.AddrFrom4([4]byte{10, 244, byte(1 + f.pick(2)), byte(10 + j + 5*i)})
				} else {
					a = netip.MustParseAddr(fmt.Sprintf("2001:db8:244:%d::%x", 1+f.pick(2), 10+j+5*i))
				}
				ready := f.pick(3) != 0
				ep := cluster.Endpoint{Addresses: []netip.Addr{a}, Ready: ready, Serving: ready || f.pick(2) == 0,
					Terminating: !ready && f.pick(2) == 0, NodeName: []string{"node1", "node2"}[f.pick(2)]}
				if f.pick(5) == 0 {
					ep.Topology = &cluster.EndpointTopology{ZoneHints: []string{"zone-a"}}
				}
				es.Endpoints = append(es.Endpoints, ep)
			}
			st.EndpointSlices[key] = append(st.EndpointSlices[key], es)
		}
	}
	return st
}

// FuzzRuleset: any valid desired state builds, renders to a ruleset nft accepts, and traces without
// the tracer meeting a rule shape it does not know.
func FuzzRuleset(f *testing.F) {
	for _, seed := range [][]byte{{0}, {1, 2, 3, 4, 5}, bytes.Repeat([]byte{7}, 64), []byte("vipgate fuzz seed with several services")} {
		f.Add(seed)
	}
	canCheck := os.Geteuid() == 0
	if _, err := exec.LookPath("nft"); err != nil {
		canCheck = false
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		canCheck = false
	}
	cfg := testConfig()
	cfg.Zone = "zone-a"
	f.Fuzz(func(t *testing.T, data []byte) {
		st := fuzzState(data)
		var text strings.Builder
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			rs, _, err := BuildRuleset(cfg, fam, st)
			if err != nil {
				t.Fatalf("IPv%d ruleset did not build: %v", fam, err)
			}
			flat := rs.Flatten()
			if err := dataplane.Render(&text, flat); err != nil {
				t.Fatalf("render: %v", err)
			}
			src, dst := netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("10.96.0.10")
			if fam == cluster.IPv6 {
				src, dst = netip.MustParseAddr("2001:db8:2::10"), netip.MustParseAddr("2001:db8:96::a")
			}
			for _, proto := range []uint8{dataplane.ProtoTCP, dataplane.ProtoUDP} {
				r := dataplane.Trace(flat, dataplane.HostInfo{IsLocal: func(netip.Addr) bool { return false }}, dataplane.Packet{Src: src, Dst: dst, Proto: proto, Port: 80})
				if r.Outcome == "ERROR" {
					t.Fatalf("trace error: %s", r.Reason)
				}
			}
		}
		if canCheck {
			// unshare -n: nft checks inside a throwaway network namespace that dies with it.
			cmd := exec.Command("unshare", "-n", "nft", "-c", "-f", "-")
			cmd.Stdin = strings.NewReader(text.String())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -c rejects the rendered ruleset: %v\n%s", err, out)
			}
		}
	})
}
