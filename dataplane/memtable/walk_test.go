package memtable_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/proxy"
)

// The random walk both tests take: a handful of Services whose every field the engine reads changes
// at random, one or a few at a time, from a seed. Unchanged Services and slices keep their pointers
// between steps, as a real source's snapshots do, so the proxier's incremental path is the one taken
// (it finds changes by pointer).

const walkServices = 8

// The choices are small on purpose: Services contest the same LoadBalancer and external IPs and
// NodePorts (claims.go decides who holds them), ranges overlap between Services, and an external IP
// may become a node address (then it is refused).
var (
	rangeChoices = [][]string{
		nil,
		{"10.244.1.5/32", "192.0.2.11/32"},
		{"0.0.0.0/1", "128.0.0.0/1"},
		{"255.0.0.0/32"},
		{"198.51.100.0/24"},
		{"198.51.100.0/25", "203.0.113.0/24"},
		{"2001:db8::/32"},
		{"192.0.2.0/24", "2001:db8:1::/64"},
	}
	vipChoices      = [][]string{nil, {"203.0.113.14"}, {"203.0.113.15"}, {"203.0.113.14", "2001:db8:ff::14"}, {"2001:db8:ff::15"}}
	extChoices      = [][]string{nil, {"203.0.113.50"}, {"203.0.113.14"}, {"203.0.113.50", "2001:db8:ff::50"}, {"192.0.2.11"}}
	algChoices      = []string{"", "random", "round-robin", "source-hash", "maglev"}
	distChoices     = []string{"", "PreferClose", "PreferSameNode"}
	protoChoices    = [][]cluster.Protocol{{cluster.TCP}, {cluster.UDP}, {cluster.TCP, cluster.UDP}, {cluster.SCTP, cluster.TCP, cluster.UDP}}
	affinityChoices = []time.Duration{0, 10800 * time.Second, 60 * time.Second}
)

// svcSpec is one Service of the walk, in the few numbers that choose its every field.
type svcSpec struct {
	Present  bool
	Type     int // 0 ClusterIP, 1 NodePort, 2 LoadBalancer, 3 ExternalName
	Headless bool
	Fams     int // 0 IPv4, 1 IPv6, 2 both
	Ports    int // 1..3
	Protos   int // protoChoices
	NPShift  int // 0: own NodePorts; 1: the next Service's (contested)
	TgtPort  int // 0: 8080+j; 1: 9090+j (endpoint ports move)
	Eps      [2]int
	EpBits   int // readiness, serving, terminating, node and hints of each endpoint
	Local    bool
	IntLocal bool
	Affinity int
	Ranges   int
	VIPs     int
	ExtIPs   int
	Alg      int
	Dist     int
}

// walk is the state of a walk: the specs, and the objects built from them (kept while unchanged).
type walk struct {
	rng      *rand.Rand
	specs    [walkServices]svcSpec
	svcs     [walkServices]*cluster.Service
	slices   [walkServices][]*cluster.EndpointSlice
	node2    int // 0: node2 has 192.0.2.12; 1: also 203.0.113.50 (an external IP becomes a node address)
	extCIDR  bool
	nodes    map[string]*cluster.Node
	log      []string // what each step changed, for a failure's report
	stepDesc string
}

func newWalk(seed uint64) *walk {
	w := &walk{rng: rand.New(rand.NewPCG(seed, seed^0x5eed))}
	// Start with half of the Services present, each of a random shape.
	for i := range w.specs {
		w.specs[i] = w.randomSpec()
		w.specs[i].Present = i%2 == 0
		w.rebuild(i, true)
	}
	w.rebuildNodes()
	return w
}

func (w *walk) randomSpec() svcSpec {
	r := w.rng
	s := svcSpec{Present: true, Type: r.IntN(4), Headless: r.IntN(10) == 0, Fams: r.IntN(3), Ports: 1 + r.IntN(3),
		Protos: r.IntN(len(protoChoices)), NPShift: b2i(r.IntN(5) == 0), TgtPort: r.IntN(2), EpBits: r.IntN(1 << 12),
		Local: r.IntN(2) == 0, IntLocal: r.IntN(4) == 0, Affinity: r.IntN(len(affinityChoices)), Ranges: r.IntN(len(rangeChoices)),
		VIPs: r.IntN(len(vipChoices)), ExtIPs: r.IntN(len(extChoices)), Alg: r.IntN(len(algChoices)), Dist: r.IntN(len(distChoices))}
	s.Eps = [2]int{r.IntN(5), r.IntN(5)}
	return s
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// step changes one to three things and returns the state to sync.
func (w *walk) step() *cluster.State {
	var did []string
	for n := 1 + w.rng.IntN(3)/2; n > 0; n-- { // mostly one change, sometimes two
		did = append(did, w.change())
	}
	w.stepDesc = strings.Join(did, "; ")
	w.log = append(w.log, w.stepDesc)
	return w.state()
}

// change makes one random change and says which.
func (w *walk) change() string {
	r := w.rng
	i := r.IntN(walkServices)
	s := &w.specs[i]
	svcChanged := true
	var what string
	switch k := r.IntN(20); k {
	case 0, 1:
		s.Present = !s.Present
		what = fmt.Sprintf("present=%v", s.Present)
	case 2:
		*s = w.randomSpec()
		what = fmt.Sprintf("replaced by %+v", *s)
	case 3:
		s.Type = r.IntN(4)
		what = fmt.Sprintf("type=%d", s.Type)
	case 4:
		s.Ports = 1 + r.IntN(3)
		s.Protos = r.IntN(len(protoChoices))
		what = fmt.Sprintf("ports=%d protos=%d", s.Ports, s.Protos)
	case 5, 6, 7:
		s.Eps[r.IntN(2)] = r.IntN(5)
		svcChanged = false
		what = fmt.Sprintf("endpoints=%v", s.Eps)
	case 8, 9:
		s.EpBits = r.IntN(1 << 12)
		svcChanged = false
		what = fmt.Sprintf("endpoint conditions=%#x", s.EpBits)
	case 10:
		s.Local, s.IntLocal = r.IntN(2) == 0, r.IntN(3) == 0
		what = fmt.Sprintf("eTP local=%v iTP local=%v", s.Local, s.IntLocal)
	case 11:
		s.Affinity = r.IntN(len(affinityChoices))
		what = fmt.Sprintf("affinity=%v", affinityChoices[s.Affinity])
	case 12:
		s.Ranges = r.IntN(len(rangeChoices))
		what = fmt.Sprintf("ranges=%v", rangeChoices[s.Ranges])
	case 13:
		s.VIPs = r.IntN(len(vipChoices))
		what = fmt.Sprintf("LB IPs=%v", vipChoices[s.VIPs])
	case 14:
		s.ExtIPs = r.IntN(len(extChoices))
		what = fmt.Sprintf("external IPs=%v", extChoices[s.ExtIPs])
	case 15:
		s.Alg = r.IntN(len(algChoices))
		what = fmt.Sprintf("algorithm=%q", algChoices[s.Alg])
	case 16:
		s.Dist, s.Fams = r.IntN(len(distChoices)), r.IntN(3)
		what = fmt.Sprintf("distribution=%q families=%d", distChoices[s.Dist], s.Fams)
	case 17:
		s.NPShift, s.TgtPort, s.Headless = r.IntN(2), r.IntN(2), r.IntN(8) == 0
		what = fmt.Sprintf("nodeport shift=%d target ports=%d headless=%v", s.NPShift, s.TgtPort, s.Headless)
	case 18:
		w.node2 = 1 - w.node2
		w.rebuildNodes()
		return fmt.Sprintf("node2 addresses %d", w.node2)
	case 19:
		if r.IntN(4) == 0 {
			w.extCIDR = !w.extCIDR
			return fmt.Sprintf("extra ServiceCIDR %v", w.extCIDR)
		}
		// A Service whose objects are re-sent unchanged (new pointers): an update that changes
		// nothing the engine reads.
		what = "re-sent unchanged"
	}
	w.rebuild(i, svcChanged)
	return fmt.Sprintf("svc%d %s", i, what)
}

func (w *walk) rebuildNodes() {
	n2 := &cluster.Node{Name: "node2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.12")}}
	if w.node2 == 1 {
		n2.Addresses = append(n2.Addresses, netip.MustParseAddr("203.0.113.50"))
	}
	w.nodes = map[string]*cluster.Node{
		"node1": {Name: "node1", Zone: "zone-a", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8:1::11")}},
		"node2": n2,
	}
}

func (w *walk) state() *cluster.State {
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{},
		Nodes: w.nodes}
	if w.extCIDR {
		st.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}
	}
	for i, s := range w.specs {
		if !s.Present {
			continue
		}
		st.Services[w.svcs[i].Key] = w.svcs[i]
		if len(w.slices[i]) > 0 {
			st.EndpointSlices[w.svcs[i].Key] = w.slices[i]
		}
	}
	return st
}

func addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// rebuild makes new objects for Service i: its slices always, the Service itself if svc.
func (w *walk) rebuild(i int, svc bool) {
	s := w.specs[i]
	key := cluster.ServiceKey{Namespace: "walk", Name: fmt.Sprintf("svc%d", i)}
	protos := protoChoices[s.Protos]
	if svc || w.svcs[i] == nil {
		v := &cluster.Service{Key: key, Type: []cluster.ServiceType{cluster.TypeClusterIP, cluster.TypeNodePort, cluster.TypeLoadBalancer, cluster.TypeExternalName}[s.Type],
			Created: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), UID: fmt.Sprintf("uid-%d", i)}
		if v.Type != cluster.TypeExternalName {
			if s.Headless {
				v.Headless = true
			} else {
				if s.Fams != 1 {
					v.ClusterIPs = append(v.ClusterIPs, netip.AddrFrom4([4]byte{10, 96, 0, byte(20 + i)}))
				}
				if s.Fams != 0 {
					v.ClusterIPs = append(v.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("2001:db8:96::%x", 0x20+i)))
				}
			}
			switch s.Fams {
			case 0:
				v.IPFamilies = []cluster.Family{cluster.IPv4}
			case 1:
				v.IPFamilies = []cluster.Family{cluster.IPv6}
			default:
				v.IPFamilies = []cluster.Family{cluster.IPv4, cluster.IPv6}
			}
		}
		for j := range s.Ports {
			p := cluster.ServicePort{Name: fmt.Sprintf("p%d", j), Protocol: protos[j%len(protos)], Port: uint16(80 + j)}
			if v.Type == cluster.TypeNodePort || v.Type == cluster.TypeLoadBalancer {
				p.NodePort = uint16(30000 + ((i+s.NPShift)%walkServices)*10 + j)
			}
			v.Ports = append(v.Ports, p)
		}
		if v.Type == cluster.TypeLoadBalancer {
			v.LoadBalancerIPs = addrs(vipChoices[s.VIPs])
			for _, r := range rangeChoices[s.Ranges] {
				v.LoadBalancerSourceRanges = append(v.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
		}
		if v.Type != cluster.TypeExternalName {
			v.ExternalIPs = addrs(extChoices[s.ExtIPs])
		}
		v.ExternalPolicyLocal = s.Local && (v.Type == cluster.TypeNodePort || v.Type == cluster.TypeLoadBalancer || len(v.ExternalIPs) > 0)
		v.InternalPolicyLocal = s.IntLocal
		if v.ExternalPolicyLocal && v.Type == cluster.TypeLoadBalancer {
			v.HealthCheckNodePort = uint16(32000 + i)
		}
		v.AffinityTimeout = affinityChoices[s.Affinity]
		v.TrafficDistribution = distChoices[s.Dist]
		if a := algChoices[s.Alg]; a != "" {
			v.Annotations = map[string]string{cluster.LBAlgorithmAnnotation: a}
		}
		w.svcs[i] = v
	}
	w.slices[i] = nil
	for fi, family := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		if s.Eps[fi] == 0 {
			continue
		}
		es := &cluster.EndpointSlice{Namespace: "walk", Name: fmt.Sprintf("svc%d-%d", i, family), Service: key, Family: family}
		for j := range s.Ports {
			es.Ports = append(es.Ports, cluster.EndpointPort{Name: fmt.Sprintf("p%d", j), Protocol: protos[j%len(protos)],
				Port: uint16(8080 + 1010*s.TgtPort + j)})
		}
		for j := range s.Eps[fi] {
			bits := s.EpBits >> (3 * j)
			node := 1 + (bits>>2)&1
			var a netip.Addr
			if family == cluster.IPv4 {
				a = netip.AddrFrom4([4]byte{10, 244, byte(node), byte(10 + 8*i + j)})
			} else {
				a = netip.MustParseAddr(fmt.Sprintf("2001:db8:244:%d::%x", node, 0x10+8*i+j))
			}
			ready := bits&3 != 0
			ep := cluster.Endpoint{Addresses: []netip.Addr{a}, Ready: ready, Serving: ready || bits&3 == 0 && j%2 == 0,
				Terminating: !ready, NodeName: fmt.Sprintf("node%d", node)}
			if bits&3 == 2 {
				ep.Topology = &cluster.EndpointTopology{Zone: "zone-a", ZoneHints: []string{"zone-a"}, NodeHints: []string{"node1"}}
			}
			es.Endpoints = append(es.Endpoints, ep)
		}
		w.slices[i] = append(w.slices[i], es)
	}
}

// walkConfig is the node the walk programs: node1 of a dual-stack cluster.
func walkConfig() proxy.Config {
	return proxy.Config{
		NodeName:     "node1",
		Zone:         "zone-a",
		NodeIPs:      []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8:1::11")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2001:db8:244::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("2001:db8:96::/108")},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8:1::11")},
	}
}

var families = []cluster.Family{cluster.IPv4, cluster.IPv6}

// inUse returns f without the shared endpoint pickers nothing jumps to, which an incrementally
// synced table and a fresh build differ by, by design (proxy.WithoutUnusedPickers).
func inUse(f *dataplane.Flat) *dataplane.Flat { return proxy.WithoutUnusedPickers(f) }

// sorted returns f with its chains and sets in name order, base chains first: the order of a table
// built in one piece (Flatten) and of one grown by transactions (the kernel's creation order)
// differ, and the text should not.
func sorted(f *dataplane.Flat) *dataplane.Flat {
	out := *f
	out.ChainOrder = slices.Clone(f.ChainOrder)
	slices.SortFunc(out.ChainOrder, func(a, b string) int {
		ba, bb := f.Chains[a].IsBase(), f.Chains[b].IsBase()
		if ba != bb {
			if ba {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	out.SetOrder = slices.Sorted(slices.Values(f.SetOrder))
	return &out
}

// textDiff lists the lines only one of two texts has (at most max of them).
func textDiff(a, b string, max int) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			out = append(out, "- "+l)
			count[l]--
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] < 0 {
			out = append(out, "+ "+l)
			count[l]++
		}
	}
	if len(out) > max {
		out = append(out[:max], fmt.Sprintf("... %d more", len(out)-max))
	}
	return strings.Join(out, "\n")
}
