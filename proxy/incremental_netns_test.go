package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// TestIncrementalTableMatchesFullBuild: after every incremental sync the kernel's table (read back
// from a throwaway namespace) is the table a full sync of the same state builds, through a seeded
// random walk of LoadBalancer Services that edit their loadBalancerSourceRanges (the upstream e2e
// sequence among them: a pod and its node, "allow all" as 0.0.0.0/1 + 128.0.0.0/1, "deny all" as
// 255.0.0.0/32, one family only), move between LoadBalancer IPs they contest with each other, change
// traffic policy, endpoints and ports, and come and go. A table that drifts from the state lets in
// whom the state's ranges keep out, or keeps out whom they let in, until the next full sync.
func TestIncrementalTableMatchesFullBuild(t *testing.T) {
	_, fd := testNetns(t)
	prog := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	cfg := testConfig()
	p := NewProxier(hclog.NewNullLogger(), cfg, prog)
	rng := rand.New(rand.NewPCG(2, 2))
	rangeChoices := [][]string{
		nil,
		{"10.244.1.5/32", "192.0.2.11/32"}, // a pod and its node (the node's IP: the VIPs are sources too)
		{"0.0.0.0/1", "128.0.0.0/1"},       // "allow all"
		{"255.0.0.0/32"},                   // "deny all, essentially"
		{"198.51.100.0/24"},
		{"2001:db8::/32"}, // IPv6 only
		{"192.0.2.0/24", "2001:db8:1::/64"},
	}
	vipChoices := [][]string{{"203.0.113.14"}, {"203.0.113.15"}, {"203.0.113.14", "2001:db8:ff::14"}, nil}
	type svcState struct {
		present           bool
		ranges, vips, eps int
		local, secondPort bool
	}
	const services = 5
	ss := make([]svcState, services)
	state := func() *cluster.State {
		st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
		for i, s := range ss {
			if !s.present {
				continue
			}
			var eps []cluster.Endpoint
			for j := range s.eps {
				node := trNode
				if j%2 == 1 {
					node = "node2"
				}
				eps = append(eps, trEp(fmt.Sprintf("10.244.%d.%d", j%2+1, 10+i*10+j), node))
			}
			sv := trSimple(fmt.Sprintf("lb%d", i), cluster.TypeLoadBalancer,
				[]string{fmt.Sprintf("10.96.0.%d", 20+i), fmt.Sprintf("2001:db8:96::%d", 20+i)}, cluster.IPv4, eps...)
			svc := sv.svc
			svc.UID = fmt.Sprintf("uid-%d", i) // unique, as the API server's: no ties between claims
			svc.IPFamilies = []cluster.Family{cluster.IPv4, cluster.IPv6}
			svc.Ports[0].NodePort = uint16(30080 + i)
			if s.secondPort {
				svc.Ports = append(svc.Ports, cluster.ServicePort{Name: "dns", Protocol: cluster.UDP, Port: 53, NodePort: uint16(30180 + i)})
			}
			svc.ExternalPolicyLocal = s.local
			if s.local {
				svc.HealthCheckNodePort = uint16(31000 + i)
			}
			svc.LoadBalancerIPs = trAddrs(vipChoices[s.vips]...)
			for _, r := range rangeChoices[s.ranges] {
				svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
			st.Services[svc.Key] = svc
			if len(sv.slices) > 0 {
				st.EndpointSlices[svc.Key] = sv.slices
			}
		}
		return st
	}
	for step := range 150 {
		before := fmt.Sprintf("%+v", ss)
		i := rng.IntN(services)
		switch rng.IntN(6) {
		case 0:
			ss[i].present = !ss[i].present
		case 1, 2:
			ss[i].ranges = rng.IntN(len(rangeChoices))
		case 3:
			ss[i].vips = rng.IntN(len(vipChoices))
		case 4:
			ss[i].eps = rng.IntN(4)
			ss[i].local = rng.IntN(2) == 0
		case 5:
			ss[i].secondPort = !ss[i].secondPort
		}
		st := state()
		if _, err := p.Sync(st); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		// The claim table holds each live Service's claim on an entry once, and nobody else's.
		for f, fs := range p.fams {
			for k, o := range fs.claims.owner {
				if st.Services[o.svc.Key] == nil {
					t.Fatalf("step %d, IPv%d: entry %s/%d/%d is held by %s, which is gone", step, f, k.addr, k.proto, k.port, o.svc.Key)
				}
			}
			for k, cs := range fs.claims.others {
				seen := map[cluster.ServiceKey]bool{fs.claims.owner[k].svc.Key: true}
				for _, c := range cs {
					if st.Services[c.svc.Key] == nil || seen[c.svc.Key] {
						t.Fatalf("step %d, IPv%d: entry %s/%d/%d: claims %v held by %s: a claim of a Service that is gone or a second claim of one",
							step, f, k.addr, k.proto, k.port, cs, fs.claims.owner[k].svc.Key)
					}
					seen[c.svc.Key] = true
				}
			}
		}
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			live, err := prog.ReadTable(f, "vipgate")
			if err != nil {
				t.Fatalf("step %d: reading the IPv%d table: %v", step, f, err)
			}
			rs, _, err := BuildRuleset(cfg, f, st)
			if err != nil {
				t.Fatal(err)
			}
			if ok, why := flatEqualInUse(live, rs.Flatten()); !ok {
				t.Fatalf("step %d, IPv%d: the kernel's table is not what a full sync builds: %s\nServices before: %s\nServices after:  %+v", step, f, why, before, ss)
			}
		}
	}
}
