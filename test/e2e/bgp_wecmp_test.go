package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

const wecmpVIP = "203.0.113.81"

// kernelWeights reads the route to ip from the router namespace's kernel: next hop address ->
// weight. zebra installs a multipath route as a nexthop group object (`nhid N`; `ip nexthop show
// id N` lists its members and weights) or, on kernels without them, as `nexthop via X weight W`.
func kernelWeights(t *testing.T, l *lab.Lab, ip string) map[string]int {
	t.Helper()
	ipj := func(args ...string) []map[string]any {
		argv := routers.InNetns(l.NS(lab.RoleRouter), append([]string{"ip", "-j"}, args...)...)
		out, err := routers.Run(argv[0], argv[1:]...)
		if err != nil {
			return nil
		}
		var v []map[string]any
		if json.Unmarshal([]byte(out), &v) != nil {
			return nil
		}
		return v
	}
	num := func(v any) int { f, _ := v.(float64); return int(f) }
	routes := ipj("route", "show", ip+"/32")
	if len(routes) != 1 {
		return nil
	}
	out := map[string]int{}
	r := routes[0]
	if gw, ok := r["gateway"].(string); ok {
		out[gw] = 1
	}
	if hops, ok := r["nexthops"].([]any); ok {
		for _, h := range hops {
			m, _ := h.(map[string]any)
			w := max(num(m["weight"]), 1)
			out[fmt.Sprint(m["gateway"])] = w
		}
	}
	if id, ok := r["nhid"]; ok {
		groups := ipj("nexthop", "show", "id", strconv.Itoa(num(id)))
		if len(groups) != 1 {
			return nil
		}
		members, _ := groups[0]["group"].([]any)
		if len(members) == 0 {
			if gw, ok := groups[0]["gateway"].(string); ok {
				out[gw] = 1
			}
		}
		for _, m := range members {
			mm, _ := m.(map[string]any)
			nh := ipj("nexthop", "show", "id", strconv.Itoa(num(mm["id"])))
			if len(nh) != 1 {
				return nil
			}
			out[fmt.Sprint(nh[0]["gateway"])] = max(num(mm["weight"]), 1)
		}
	}
	return out
}

// frrWeights reads zebra's selected route to ip ("show ip route json"): next hop -> weight (0 when
// zebra reports none, i.e. equal).
func frrWeights(f *routers.FRR, ip string) map[string]int {
	out, err := f.Vtysh("show ip route " + ip + "/32 json")
	if err != nil {
		return nil
	}
	var m map[string][]struct {
		Selected bool `json:"selected"`
		Nexthops []struct {
			IP     string `json:"ip"`
			Active bool   `json:"active"`
			Weight int    `json:"weight"`
		} `json:"nexthops"`
	}
	if json.Unmarshal([]byte(out), &m) != nil {
		return nil
	}
	w := map[string]int{}
	for _, r := range m[ip+"/32"] {
		if !r.Selected {
			continue
		}
		for _, nh := range r.Nexthops {
			if nh.Active {
				w[nh.IP] = nh.Weight
			}
		}
	}
	return w
}

// share is n1's fraction of the weight in w (next hop -> weight).
func share(w map[string]int, hop string) float64 {
	total := 0
	for _, v := range w {
		total += v
	}
	if total == 0 {
		return math.NaN()
	}
	return float64(w[hop]) / float64(total)
}

// TestBGPWeightedECMP (issue #32, MetalLB #1): FRR (eBGP, maximum-paths 8) is the router of two
// nodes running `vipgate node`, with an externalTrafficPolicy=Local VIP; n1 has 1 ready endpoint
// and n2 3. With the BGPAdvertisement annotated vipgate.io/weighted-ecmp: "false" the router splits
// new flows evenly. With "true" each node sends the link bandwidth community (1 and 3 Mbit/s), FRR
// installs next hop weights 1:3 in zebra and in the router namespace's kernel, and 400 new TCP
// flows from the client behind the router (fib_multipath_hash_policy=1 in the router namespace: L4
// hashing) split about 1:3 between the nodes. Then n2's endpoints churn (3 -> 2 -> 1 -> 2 -> 1
// within a second): n2 sends the first change at once and the rest as one UPDATE when its 5 s hold
// ends, the weights end 1:1, and new flows split about evenly.
func TestBGPWeightedECMP(t *testing.T) {
	routers.RequireRoot(t, "/usr/lib/frr/bgpd", "/usr/lib/frr/zebra", "vtysh")
	b := newBGPLab(t, lab.NodeSpec{Name: "n1", Pods: []string{"a1"}}, lab.NodeSpec{Name: "n2", Pods: []string{"b1", "b2", "b3"}})
	l := b.l
	if out, err := l.Exec(lab.RoleRouter, "sysctl", "-w", "net.ipv4.fib_multipath_hash_policy=1"); err != nil {
		t.Fatalf("L4 multipath hashing in the router namespace: %v %s", err, out)
	}
	var peers []routers.FRRPeer
	var nodeDocs []string
	for _, n := range l.Nodes() {
		peers = append(peers, routers.FRRPeer{Neighbor: n.IPv4, PeerASN: 64513})
		nodeDocs = append(nodeDocs, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\nstatus:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, n.IPv4))
	}
	n1, n2 := l.Node("n1").IPv4.String(), l.Node("n2").IPv4.String()
	bgpd := routers.FRRBGPConfig(netip.MustParseAddr("192.0.2.1"), 64512, peers...)
	// Multipath over the nodes (one AS, so no as-path multipath-relax is needed); FRR weighs the
	// paths by their link bandwidth when all of them carry one (its default).
	bgpd = strings.Replace(bgpd, " address-family ipv4 unicast\n", " address-family ipv4 unicast\n  maximum-paths 8\n", 1)
	frr := routers.StartFRR(t, l.NS(lab.RoleRouter), routers.FRRConfig{BGPD: bgpd})

	metallb := func(weighted string) {
		b.w.write("metallb.yaml", append(slices.Clone(nodeDocs), metallbDoc("IPAddressPool", "tor", `addresses: [203.0.113.64/26]`), metallbDoc("BGPPeer", "tor", `myASN: 64513
peerASN: 64512
peerAddress: 192.0.2.1
holdTime: 9s
connectTime: 1s`), `apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata:
  name: tor
  namespace: metallb-system
  annotations: {vipgate.io/weighted-ecmp: "`+weighted+`"}
spec:
  ipAddressPools: [tor]
`)...)
	}
	metallb("false")
	svc := func(n2Pods ...string) {
		eps := []string{ndEp(l.Pod("a1"), "n1")}
		for _, p := range n2Pods {
			eps = append(eps, ndEp(l.Pod(p), "n2"))
		}
		b.w.write("svc.yaml",
			ndService("wecmp", "LoadBalancer", "10.96.6.2", "Local", []ndPort{{"http", "TCP", 80, 30610, "http"}}, ndStatus(wecmpVIP)),
			ndSlice("wecmp", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, eps...))
	}
	svc("b1", "b2", "b3")
	for _, n := range l.Nodes() {
		b.start(n.Name)
	}

	// flows opens 400 TCP connections (new source ports) to the VIP and returns n1's share of the
	// answered ones. The split is the subject here: a few probes lost to a loaded machine (1 s
	// timeout) are logged, more than 5 % fail the test.
	flows := func() (float64, map[string]int) {
		s, err := l.ProbeMany(lab.RoleClient, "tcp", wecmpVIP+":80", 400, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.OK < 380 {
			t.Errorf("%d of 400 flows answered (%v)", s.OK, s.Errors)
		} else if s.OK < 400 {
			t.Logf("%d of 400 flows answered (%v)", s.OK, s.Errors)
		}
		perNode := map[string]int{}
		for pod, c := range s.Pods {
			perNode[l.Pod(pod).Node.Name] += c
		}
		return float64(perNode["n1"]) / float64(perNode["n1"]+perNode["n2"]), perNode
	}

	// Without weighted ECMP: equal weights, although n2 has three times n1's endpoints.
	waitFor(t, "both next hops in FRR's FIB", 30*time.Second, func() bool {
		return slices.Equal(frrNextHops(frr, wecmpVIP+"/32"), []string{n1, n2})
	})
	waitFor(t, "kernel multipath route", 10*time.Second, func() bool { return len(kernelWeights(t, l, wecmpVIP)) == 2 })
	got, perNode := flows()
	t.Logf("weighted ECMP off, 1:3 endpoints: zebra weights %v, kernel weights %v; 400 new TCP flows split %v: n1 %.1f%%",
		frrWeights(frr, wecmpVIP), kernelWeights(t, l, wecmpVIP), perNode, 100*got)
	if got < 0.375 || got > 0.625 {
		t.Errorf("without weighted ECMP n1 got %.1f%% of the flows, want about 50%%", 100*got)
	}

	// On: 1 : 3.
	metallb("true")
	waitFor(t, "FRR's weights 1:3", 30*time.Second, func() bool {
		w := frrWeights(frr, wecmpVIP)
		return len(w) == 2 && math.Abs(share(w, n1)-0.25) < 0.02
	})
	out, _ := frr.Vtysh("show bgp ipv4 unicast " + wecmpVIP + "/32")
	t.Logf("FRR's BGP paths:\n%s", out)
	for _, want := range []string{"1.000 Mbps", "3.000 Mbps"} {
		if !strings.Contains(out, want) {
			t.Errorf("link bandwidth %s not in FRR's paths", want)
		}
	}
	waitFor(t, "kernel weights 1:3", 10*time.Second, func() bool {
		w := kernelWeights(t, l, wecmpVIP)
		return len(w) == 2 && math.Abs(share(w, n1)-0.25) < 0.02
	})
	t.Logf("1:3 endpoints: zebra weights %v, kernel weights %v", frrWeights(frr, wecmpVIP), kernelWeights(t, l, wecmpVIP))
	got, perNode = flows()
	t.Logf("1:3 endpoints: 400 new TCP flows split %v: n1 %.1f%% (weights say 25%%, equal ECMP 50%%)", perNode, 100*got)
	// 400 flows at p = 0.25: sd 2.2 points; halfway to equal ECMP is 37.5%.
	if got < 0.125 || got > 0.375 {
		t.Errorf("n1 got %.1f%% of the flows, want about 25%%", 100*got)
	}

	// Churn on n2: 3 -> 2 -> 1 -> 2 -> 1 endpoints, 250 ms apart (the file source takes each one
	// on its own: 50 ms debounce). n2's first change goes out at once, the rest when the hold ends.
	before := updatesFrom(t, frr, n2)
	start := time.Now()
	for _, pods := range [][]string{{"b1", "b2"}, {"b1"}, {"b1", "b2"}, {"b1"}} {
		svc(pods...)
		time.Sleep(250 * time.Millisecond)
	}
	waitFor(t, "FRR's weights 1:1", 30*time.Second, func() bool {
		w := frrWeights(frr, wecmpVIP)
		return len(w) == 2 && math.Abs(share(w, n1)-0.5) < 0.02
	})
	settled := time.Since(start)
	time.Sleep(time.Second) // anything late would show in the count
	updates := updatesFrom(t, frr, n2) - before
	t.Logf("4 endpoint changes on n2 within 0.75 s: %d UPDATEs from n2 at FRR; weights 1:1 at FRR %v after the first change was written",
		updates, settled.Round(time.Millisecond))
	if updates >= 4 {
		t.Errorf("n2 sent %d UPDATEs for 4 endpoint changes within a second: the changes were not coalesced", updates)
	}
	waitFor(t, "kernel weights 1:1", 10*time.Second, func() bool {
		w := kernelWeights(t, l, wecmpVIP)
		return len(w) == 2 && math.Abs(share(w, n1)-0.5) < 0.02
	})
	t.Logf("1:1 endpoints: zebra weights %v, kernel weights %v", frrWeights(frr, wecmpVIP), kernelWeights(t, l, wecmpVIP))
	got, perNode = flows()
	t.Logf("1:1 endpoints: 400 new TCP flows split %v: n1 %.1f%% (weights say 50%%)", perNode, 100*got)
	if got < 0.375 || got > 0.625 {
		t.Errorf("n1 got %.1f%% of the flows, want about 50%%", 100*got)
	}
	if !slices.Equal(frrNextHops(frr, wecmpVIP+"/32"), []string{n1, n2}) {
		t.Errorf("next hops %v, want both nodes", frrNextHops(frr, wecmpVIP+"/32"))
	}
}

// updatesFrom is how many UPDATE messages FRR received from neighbor.
func updatesFrom(t *testing.T, f *routers.FRR, neighbor string) int {
	t.Helper()
	out, err := f.Vtysh("show bgp neighbors " + neighbor + " json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]struct {
		MessageStats struct {
			UpdatesRecv int `json:"updatesRecv"`
		} `json:"messageStats"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("parsing neighbor JSON: %v: %s", err, out)
	}
	return m[neighbor].MessageStats.UpdatesRecv
}
