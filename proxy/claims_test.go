package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// claimSvc builds a Service for the claim tests: one port per "PROTO/port" (NodePort when given as
// "PROTO/port/nodePort"), and a ready endpoint so that every entry leads somewhere.
func claimSvc(st *cluster.State, name string, created time.Time, uid, clusterIP string, external, lb []string, ports ...string) *cluster.Service {
	key := cluster.ServiceKey{Namespace: "claims", Name: name}
	svc := &cluster.Service{Key: key, Type: cluster.TypeClusterIP, Created: created, UID: uid,
		ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, IPFamilies: []cluster.Family{cluster.IPv4}}
	for _, a := range external {
		svc.ExternalIPs = append(svc.ExternalIPs, netip.MustParseAddr(a))
	}
	if len(lb) > 0 {
		svc.Type = cluster.TypeLoadBalancer
		for _, a := range lb {
			svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, netip.MustParseAddr(a))
		}
	}
	es := &cluster.EndpointSlice{Namespace: "claims", Name: name + "-a", Service: key, Family: cluster.IPv4,
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(len(st.Services) + 10)})}, Ready: true, Serving: true, NodeName: "node1"}}}
	for i, p := range ports {
		f := strings.Split(p, "/")
		sp := cluster.ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: cluster.Protocol(f[0])}
		fmt.Sscan(f[1], &sp.Port)
		if len(f) == 3 {
			fmt.Sscan(f[2], &sp.NodePort)
			if svc.Type == cluster.TypeClusterIP {
				svc.Type = cluster.TypeNodePort
			}
		}
		svc.Ports = append(svc.Ports, sp)
		es.Ports = append(es.Ports, cluster.EndpointPort{Name: sp.Name, Protocol: sp.Protocol, Port: 8080})
	}
	st.Services[key] = svc
	st.EndpointSlices[key] = []*cluster.EndpointSlice{es}
	return svc
}

func newClaimState() *cluster.State {
	return &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
}

// holder says which Service the IPv4 entry addr:port/proto leads to ("" when none), by the
// endpoint its elements DNAT to.
func holder(t *testing.T, p *Proxier, st *cluster.State, addr string, proto uint8, port uint16) string {
	t.Helper()
	flat := p.Flatten(cluster.IPv4)
	r := dataplane.Trace(flat, dataplane.HostInfo{IsLocal: func(netip.Addr) bool { return false }},
		dataplane.Packet{Src: netip.MustParseAddr("198.51.100.10"), Dst: netip.MustParseAddr(addr), Proto: proto, Port: port})
	if len(r.Candidates) == 0 {
		return ""
	}
	ep := r.Candidates[0].Endpoint.Addr()
	for k, slices_ := range st.EndpointSlices {
		if slices_[0].Endpoints[0].Addresses[0] == ep {
			return k.Name
		}
	}
	return "?" + ep.String()
}

func claimConfig() Config {
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	// Let external IPs (anywhere, the service CIDR too) through the policy: these tests are about
	// conflicts.
	cfg.ExternalIPs.AllowedCIDRs = allowAnyExternalIP
	cfg.ExternalIPs.AllowClusterCIDRs = true
	return cfg
}

// TestClaimsClusterIPWins: a Service whose externalIPs name another Service's cluster IP never takes
// its entries, whichever is older and whatever the names, incrementally and after a restart.
func TestClaimsClusterIPWins(t *testing.T) {
	old, young := time.Unix(1_700_000_000, 0), time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name             string
		attackerCreated  time.Time
		attackerName     string
		attackerFirstRun bool
	}{
		{"attacker older, sorts first, synced first", old, "aaa", true},
		{"attacker younger, sorts first", young, "aaa", false},
		{"attacker older, sorts last", old, "zzz", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newClaimState()
			victimAt := young
			if tc.attackerCreated.Equal(young) {
				victimAt = old
			}
			p := NewProxier(hclog.NewNullLogger(), claimConfig(), nopProgrammer{})
			if tc.attackerFirstRun {
				claimSvc(st, tc.attackerName, tc.attackerCreated, "u1", "10.96.0.99", []string{"10.96.0.10"}, nil, "UDP/53", "TCP/80")
				if _, err := p.Sync(st); err != nil {
					t.Fatal(err)
				}
				if got := holder(t, p, st, "10.96.0.10", dataplane.ProtoUDP, 53); got != tc.attackerName {
					t.Fatalf("before kube-dns exists, 10.96.0.10:53 goes to %q", got)
				}
				st = &cluster.State{Services: cloneMap(st.Services), EndpointSlices: mapsSlices(st.EndpointSlices)}
			} else {
				claimSvc(st, tc.attackerName, tc.attackerCreated, "u1", "10.96.0.99", []string{"10.96.0.10"}, nil, "UDP/53", "TCP/80")
			}
			claimSvc(st, "kube-dns", victimAt, "u2", "10.96.0.10", nil, nil, "UDP/53")
			rep, err := p.Sync(st)
			if err != nil {
				t.Fatal(err)
			}
			if got := holder(t, p, st, "10.96.0.10", dataplane.ProtoUDP, 53); got != "kube-dns" {
				t.Errorf("10.96.0.10 UDP 53 goes to %q, want kube-dns", got)
			}
			// The attacker keeps what nobody else claims.
			if got := holder(t, p, st, "10.96.0.10", dataplane.ProtoTCP, 80); got != tc.attackerName {
				t.Errorf("10.96.0.10 TCP 80 goes to %q, want %s (uncontested)", got, tc.attackerName)
			}
			want := []cluster.Rejection{{Kind: "Service", Object: "claims/" + tc.attackerName, Addr: netip.MustParseAddr("10.96.0.10"),
				Reason: "udp 10.96.0.10:53 is held by Service claims/kube-dns (a cluster IP entry always wins over an external or LoadBalancer IP entry); not programmed for this Service"}}
			if diff := cmp.Diff(want, rep.Conflicts); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
			// A restart (full sync from scratch) gives the same.
			p2 := NewProxier(hclog.NewNullLogger(), claimConfig(), nopProgrammer{})
			rep2, err := p2.Sync(st)
			if err != nil {
				t.Fatal(err)
			}
			if got := holder(t, p2, st, "10.96.0.10", dataplane.ProtoUDP, 53); got != "kube-dns" {
				t.Errorf("after a restart 10.96.0.10 UDP 53 goes to %q", got)
			}
			if diff := cmp.Diff(rep.Conflicts, rep2.Conflicts); diff != "" {
				t.Errorf("conflicts differ after a restart:\n%s", diff)
			}
			// kube-dns goes away: the attacker gets the entry (it is no longer anyone's).
			st = &cluster.State{Services: cloneMap(st.Services), EndpointSlices: mapsSlices(st.EndpointSlices)}
			delete(st.Services, cluster.ServiceKey{Namespace: "claims", Name: "kube-dns"})
			rep, err = p.Sync(st)
			if err != nil {
				t.Fatal(err)
			}
			if got := holder(t, p, st, "10.96.0.10", dataplane.ProtoUDP, 53); got != tc.attackerName || len(rep.Conflicts) != 0 {
				t.Errorf("after kube-dns left: holder %q, conflicts %v", got, rep.Conflicts)
			}
		})
	}
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func mapsSlices(m map[cluster.ServiceKey][]*cluster.EndpointSlice) map[cluster.ServiceKey][]*cluster.EndpointSlice {
	return cloneMap(m)
}

// TestClaimsOldestWins: between two external IP claims the older Service holds the entry, whatever
// the names and the order of arrival, and keeps it across restarts; uid breaks a tie of the
// (one-second) creation timestamps.
func TestClaimsOldestWins(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name       string
		aAt, zAt   time.Time
		aUID, zUID string
		want       string
		why        string
	}{
		{"older sorts last", t0.Add(time.Hour), t0, "u1", "u2", "zzz", "the oldest Service wins: it was created first"},
		{"older sorts first", t0, t0.Add(time.Hour), "u1", "u2", "aaa", "the oldest Service wins: it was created first"},
		{"same second, uid decides", t0, t0, "b-uid", "a-uid", "zzz", "the oldest Service wins: created in the same second, it has the smaller uid"},
		{"only one states its age", time.Time{}, t0, "", "", "zzz", "it states its creationTimestamp and this Service does not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, order := range [][]string{{"aaa", "zzz"}, {"zzz", "aaa"}} {
				st := newClaimState()
				p := NewProxier(hclog.NewNullLogger(), claimConfig(), nopProgrammer{})
				var rep *dataplane.SyncReport
				for _, n := range order {
					at, uid, cip := tc.aAt, tc.aUID, "10.96.0.1"
					if n == "zzz" {
						at, uid, cip = tc.zAt, tc.zUID, "10.96.0.2"
					}
					st = &cluster.State{Services: cloneMap(st.Services), EndpointSlices: mapsSlices(st.EndpointSlices)}
					claimSvc(st, n, at, uid, cip, []string{"203.0.113.7"}, nil, "TCP/443")
					var err error
					if rep, err = p.Sync(st); err != nil {
						t.Fatal(err)
					}
				}
				if got := holder(t, p, st, "203.0.113.7", dataplane.ProtoTCP, 443); got != tc.want {
					t.Errorf("order %v: 203.0.113.7:443 goes to %q, want %q", order, got, tc.want)
				}
				loser := "aaa"
				if tc.want == "aaa" {
					loser = "zzz"
				}
				want := []cluster.Rejection{{Kind: "Service", Object: "claims/" + loser, Addr: netip.MustParseAddr("203.0.113.7"),
					Reason: "tcp 203.0.113.7:443 is held by Service claims/" + tc.want + " (" + tc.why + "); not programmed for this Service"}}
				if diff := cmp.Diff(want, rep.Conflicts); diff != "" {
					t.Errorf("order %v: conflicts (-want +got):\n%s", order, diff)
				}
			}
		})
	}
}

// allowAnyExternalIP is the externalIPs.allowedCIDRs that allows every address, kube-proxy's
// behaviour (the default allows none).
var allowAnyExternalIP = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// TestAddressScreen: the externalIPs policy refuses per address, and says why.
func TestAddressScreen(t *testing.T) {
	base := &AddressScreen{
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodeAddrs:    map[netip.Addr]bool{netip.MustParseAddr("192.0.2.11"): true, netip.MustParseAddr("192.0.2.12"): true},
	}
	// off is the default policy: no externalIPs at all (KEP-5707); base allows them anywhere.
	off := *base
	base.Policy = cluster.ExternalIPPolicy{AllowedCIDRs: allowAnyExternalIP}
	allowed := *base
	allowed.Policy = cluster.ExternalIPPolicy{AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25")}}
	open := *base
	open.Policy = cluster.ExternalIPPolicy{AllowedCIDRs: allowAnyExternalIP, AllowNodeIPs: true, AllowClusterCIDRs: true}
	for _, tc := range []struct {
		screen   *AddressScreen
		addr     string
		external bool
		want     string // a word of the reason, "" for allowed
	}{
		{base, "203.0.113.200", true, ""},
		{base, "10.96.0.10", true, "service CIDR"},
		{base, "10.96.0.10", false, "service CIDR"},
		{base, "10.244.1.5", true, "pod"},
		{base, "192.0.2.12", true, "node's address"},
		{base, "192.0.2.11", false, "node's address"},
		{base, "127.0.0.1", true, "loopback"},
		{base, "169.254.169.254", false, "link-local"},
		{&allowed, "203.0.113.200", true, "allowedCIDRs"},
		{&allowed, "203.0.113.200", false, ""}, // LoadBalancer IPs are not subject to allowedCIDRs
		{&allowed, "203.0.113.20", true, ""},
		{&open, "10.96.0.10", true, ""},
		{&open, "192.0.2.11", false, ""},
		{&open, "224.0.0.251", true, "multicast"},
		{nil, "10.96.0.10", true, ""},
		{&off, "203.0.113.200", true, "externalIPs are off"},
		{&off, "2001:db8::1", true, "externalIPs are off"},
		{&off, "203.0.113.200", false, ""}, // LoadBalancer IPs are not externalIPs
	} {
		got := tc.screen.refuse(netip.MustParseAddr(tc.addr), tc.external)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("refuse(%s, external=%v) = %q, want %q", tc.addr, tc.external, got, tc.want)
		}
	}
}

// claimFuzzState builds, from fuzz bytes, Services that claim overlapping entries: cluster IPs,
// external IPs and LoadBalancer IPs from a small pool (the external ones may be another Service's
// cluster IP), a few ports and NodePorts, creation times and uids that tie or are missing.
func claimFuzzState(data []byte) *cluster.State {
	f := &fuzzBytes{b: data}
	st := newClaimState()
	pool := []string{"10.96.0.10", "10.96.0.11", "10.96.0.12", "203.0.113.1", "203.0.113.2"}
	t0 := time.Unix(1_700_000_000, 0)
	n := 2 + f.pick(6)
	for i := 0; i < n; i++ {
		var created time.Time
		if c := f.pick(4); c > 0 {
			created = t0.Add(time.Duration(c) * time.Second)
		}
		uid := []string{"", "u-a", "u-b", fmt.Sprintf("u-%d", i)}[f.pick(4)]
		var ext, lb []string
		for j := f.pick(3); j > 0; j-- {
			ext = append(ext, pool[f.pick(len(pool))])
		}
		if f.pick(2) == 0 {
			lb = append(lb, pool[3+f.pick(2)])
		}
		var ports []string
		for j := 1 + f.pick(3); j > 0; j-- {
			p := fmt.Sprintf("%s/%d", []string{"TCP", "UDP"}[f.pick(2)], []int{53, 80, 443}[f.pick(3)])
			if f.pick(3) == 0 {
				p += fmt.Sprintf("/%d", 30000+f.pick(3))
			}
			ports = append(ports, p)
		}
		svc := claimSvc(st, fmt.Sprintf("s%d", i), created, uid, pool[f.pick(3)], ext, lb, ports...)
		// Two ports of one Service never share protocol and port, nor NodePort (as cluster/ checks).
		svc.Ports = dedupPorts(svc.Ports)
	}
	return st
}

// dedupPorts drops ports that repeat an earlier port's protocol and port, or its NodePort.
func dedupPorts(in []cluster.ServicePort) []cluster.ServicePort {
	var out []cluster.ServicePort
	for _, p := range in {
		if slices.ContainsFunc(out, func(q cluster.ServicePort) bool {
			return q.Protocol == p.Protocol && (q.Port == p.Port || p.NodePort != 0 && q.NodePort == p.NodePort)
		}) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// canonical is what a ruleset holds, in a form that does not depend on how it was built: every map
// element sorted, and the conflicts.
func canonical(t *testing.T, p *Proxier, conflicts []cluster.Rejection) string {
	t.Helper()
	flat := p.Flatten(cluster.IPv4)
	var lines []string
	for set, els := range flat.Elements {
		for _, e := range els {
			lines = append(lines, fmt.Sprintf("%s %+v", set, e))
		}
	}
	slices.Sort(lines)
	for _, c := range conflicts {
		lines = append(lines, "conflict "+c.String())
	}
	return strings.Join(lines, "\n")
}

// FuzzConflictOrder: Services that claim overlapping entries give the same ruleset and the same
// conflicts whatever order they arrive in, one sync at a time or all at once, and after some of
// them leave and come back (the same Service objects: only the order differs).
func FuzzConflictOrder(f *testing.F) {
	for _, seed := range [][]byte{{0}, {5, 1, 2, 3, 4, 5, 6, 7, 8, 9}, []byte("conflicting claims of kube-dns"), {7, 0, 0, 2, 0, 1, 0, 0, 2, 0, 1, 0, 0, 2, 0, 1, 3, 3, 3}} {
		f.Add(seed, uint64(1))
	}
	cfg := claimConfig()
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		st := claimFuzzState(data)
		keys := slices.Collect(func(yield func(cluster.ServiceKey) bool) {
			for k := range st.Services {
				if !yield(k) {
					return
				}
			}
		})
		sortServiceKeys(keys)

		all := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
		rep, err := all.Sync(st)
		if err != nil {
			t.Fatal(err)
		}
		want := canonical(t, all, rep.Conflicts)

		rng := rand.New(rand.NewPCG(seed, uint64(len(data))))
		for round := 0; round < 3; round++ {
			order := slices.Clone(keys)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			p := NewProxier(hclog.NewNullLogger(), cfg, nopProgrammer{})
			cur := newClaimState()
			sync := func() *dataplane.SyncReport {
				r, err := p.Sync(&cluster.State{Services: cloneMap(cur.Services), EndpointSlices: mapsSlices(cur.EndpointSlices)})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			for _, k := range order {
				cur.Services[k], cur.EndpointSlices[k] = st.Services[k], st.EndpointSlices[k]
				sync()
			}
			// Churn: a few leave and come back, one sync each way.
			for _, k := range order[:rng.IntN(len(order)+1)] {
				delete(cur.Services, k)
				sync()
				cur.Services[k] = st.Services[k]
				sync()
			}
			got := canonical(t, p, sync().Conflicts)
			if got != want {
				t.Fatalf("arrival order %v gives a different result than one sync of all:\n%s", order, cmp.Diff(want, got))
			}
		}
	})
}

// TestClaimsOfManyEntries: a Service of many entries (past the linear search, claimsOf's index)
// claims each entry once, in the order of its part, and an external IP equal to its own cluster IP
// is claimed once, as a cluster IP, whichever comes first.
func TestClaimsOfManyEntries(t *testing.T) {
	svc, eps := hostileService(hostileShape{Name: "many", Ports: 30, ExternalIPs: 3, Endpoints: 1})
	svc.ExternalIPs = append(svc.ExternalIPs, svc.ClusterIPs[0]) // also its own cluster IP
	p := BuildService(hostileNodeInfo(), svc, eps)
	// The part lists the cluster IP entry, then the external ones, per port: put a duplicate of
	// the cluster IP entry first, as an external claim, to see it turned into a cluster IP claim.
	dup := p.Entries[0]
	p.Entries = append([]dataplane.EntryRef{dup}, p.Entries...)
	got := claimsOf(nil, svc, p)
	if want := 30 * 4; len(got) != want {
		t.Fatalf("%d claims, want %d (30 ports x cluster IP and 3 external IPs)", len(got), want)
	}
	seen := map[entryKey]bool{}
	for _, c := range got {
		if seen[c.k] {
			t.Errorf("%+v claimed twice", c.k)
		}
		seen[c.k] = true
		if c.c.external == (c.k.addr == svc.ClusterIPs[0]) {
			t.Errorf("%+v claimed as external %v", c.k, c.c.external)
		}
	}
	if want := claimsOfLinear(svc, p); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claimsOf differs from the linear search:\n%v\n%v", got, want)
	}
}

// claimsOfLinear is claimsOf by a linear search only: the specification of the indexed one.
func claimsOfLinear(svc *cluster.Service, part *dataplane.Part) []entryClaim {
	var out []entryClaim
	for _, e := range part.Entries {
		k := entryKey{e.NodePort, e.Addr, e.Proto, e.Port}
		c := claim{svc: svc, external: !e.NodePort && !slices.Contains(svc.ClusterIPs, e.Addr)}
		i := slices.IndexFunc(out, func(x entryClaim) bool { return x.k == k })
		switch {
		case i < 0:
			out = append(out, entryClaim{k, c})
		case out[i].c.external:
			out[i].c = c
		}
	}
	return out
}
