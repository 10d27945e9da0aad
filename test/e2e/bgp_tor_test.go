package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

// bgpLab is three nodes running `vipgate node` with BGP from MetalLB objects in a manifest directory.
type bgpLab struct {
	t     *testing.T
	l     *lab.Lab
	bin   string
	dir   string
	w     *ndWriter
	procs map[string]*lab.Proc
}

func newBGPLab(t *testing.T, nodes ...lab.NodeSpec) *bgpLab {
	t.Helper()
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: nodes})
	dir := t.TempDir()
	b := &bgpLab{t: t, l: l, bin: vipgateBinary(t), dir: dir, w: &ndWriter{t: t, dir: filepath.Join(dir, "manifests")}, procs: map[string]*lab.Proc{}}
	if err := os.Mkdir(b.w.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range b.procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(25))
			}
		}
	})
	return b
}

// start starts (or restarts, with a new log) `vipgate node` on a node.
func (b *bgpLab) start(name string, args ...string) *lab.Proc {
	b.t.Helper()
	n := b.l.Node(name)
	cfg := filepath.Join(b.dir, name+".yaml")
	if err := os.WriteFile(cfg, []byte(labNodeConfig(n)), 0o644); err != nil {
		b.t.Fatal(err)
	}
	log := filepath.Join(b.dir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
	p, err := b.l.Start(name, log, append([]string{b.bin, "node", "--config", cfg, "--manifests", b.w.dir}, args...)...)
	if err != nil {
		b.t.Fatal(err)
	}
	b.procs[name] = p
	return p
}

// frrNextHops lists the next hops zebra installed for prefix (what the router forwards by).
func frrNextHops(f *routers.FRR, prefix string) []string {
	out, err := f.Vtysh("show ip route " + prefix + " json")
	if err != nil {
		return nil
	}
	var m map[string][]struct {
		Selected bool `json:"selected"`
		Nexthops []struct {
			IP     string `json:"ip"`
			Active bool   `json:"active"`
		} `json:"nexthops"`
	}
	if json.Unmarshal([]byte(out), &m) != nil {
		return nil
	}
	var hops []string
	for _, r := range m[prefix] {
		if !r.Selected {
			continue
		}
		for _, nh := range r.Nexthops {
			if nh.Active {
				hops = append(hops, nh.IP)
			}
		}
	}
	slices.Sort(hops)
	return slices.Compact(hops)
}

// waitFor polls cond every 10 ms and returns how long it took (fatal after timeout).
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// frrToR is FRR (bgpd + bfdd, zebra installing the routes) as the top-of-rack router of three nodes
// running `vipgate node`, eBGP (nodes AS 64513, router AS 64512) with BFD 100 ms x 3 from a MetalLB
// BFDProfile, and one eTP=Cluster LoadBalancer VIP (203.0.113.80) with an endpoint on every node.
type frrToR struct {
	*bgpLab
	frr *routers.FRR
	// all are the nodes' addresses, sorted: the next hops the VIP should have.
	all []string
}

const torVIP = "203.0.113.80/32"

// newFRRToR starts FRR and writes the manifests; the caller starts the nodes (b.start).
func newFRRToR(t *testing.T) *frrToR {
	t.Helper()
	routers.RequireRoot(t, "/usr/lib/frr/bgpd", "/usr/lib/frr/bfdd", "/usr/lib/frr/zebra", "vtysh")
	b := newBGPLab(t, lab.NodeSpec{Name: "n1", Pods: []string{"f1"}}, lab.NodeSpec{Name: "n2", Pods: []string{"f2"}}, lab.NodeSpec{Name: "n3", Pods: []string{"f3"}})
	l := b.l
	var peers []routers.FRRPeer
	var nodeDocs []string
	var all []string
	for _, n := range l.Nodes() {
		peers = append(peers, routers.FRRPeer{Neighbor: n.IPv4, PeerASN: 64513, BFDProfile: "fast"})
		all = append(all, n.IPv4.String())
		nodeDocs = append(nodeDocs, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\nstatus:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, n.IPv4))
	}
	slices.Sort(all)
	bgpd := routers.FRRBGPConfig(netip.MustParseAddr("192.0.2.1"), 64512, peers...)
	// ECMP over the nodes: FRR installs up to 8 equal eBGP paths.
	bgpd = strings.Replace(bgpd, " address-family ipv4 unicast\n", " address-family ipv4 unicast\n  maximum-paths 8\n", 1)
	frr := routers.StartFRR(t, l.NS(lab.RoleRouter), routers.FRRConfig{BGPD: bgpd, BFDD: routers.FRRBFDConfig("fast", 100*time.Millisecond, 100*time.Millisecond, 3)})

	b.w.write("metallb.yaml", append(nodeDocs, metallbDoc("IPAddressPool", "tor", `addresses: [203.0.113.64/26]`), metallbDoc("BFDProfile", "fast", `{receiveInterval: 100, transmitInterval: 100, detectMultiplier: 3}`), metallbDoc("Community", "names", `communities:
- {name: no-advertise-to-peers, value: "65535:65282"}`), metallbDoc("BGPPeer", "tor", `myASN: 64513
peerASN: 64512
peerAddress: 192.0.2.1
holdTime: 9s
connectTime: 1s
bfdProfile: fast`), metallbDoc("BGPAdvertisement", "tor", `ipAddressPools: [tor]
communities: ["65000:100", "large:64512:1:2", no-advertise-to-peers]`))...)
	f1, f2, f3 := l.Pod("f1"), l.Pod("f2"), l.Pod("f3")
	b.w.write("svc.yaml",
		ndService("torweb", "LoadBalancer", "10.96.6.1", "Cluster", []ndPort{{"http", "TCP", 80, 30600, "http"}}, ndStatus("203.0.113.80")),
		ndSlice("torweb", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(f1, "n1"), ndEp(f2, "n2"), ndEp(f3, "n3")))
	return &frrToR{bgpLab: b, frr: frr, all: all}
}

// TestBGPFRRToR: an eTP=Cluster VIP has all three nodes as next hops in the router's FIB (ECMP)
// and answers the client behind the router; its communities (standard, large, and one named by a
// Community object) arrive; when a node dies (link down, then SIGKILL), its next hop leaves the
// router's FIB — the time is reported (target <= 1 s).
func TestBGPFRRToR(t *testing.T) {
	x := newFRRToR(t)
	b, l, frr, all := x.bgpLab, x.l, x.frr, x.all
	for _, n := range l.Nodes() {
		b.start(n.Name)
	}

	waitFor(t, "three ECMP next hops in FRR's FIB", 30*time.Second, func() bool { return slices.Equal(frrNextHops(frr, torVIP), all) })
	for _, n := range l.Nodes() {
		waitFor(t, "BFD up with "+n.Name, 10*time.Second, func() bool { up, _ := frr.BFDUp(n.IPv4); return up })
	}
	out, _ := frr.Vtysh("show bgp ipv4 unicast 203.0.113.80/32 json")
	for _, want := range []string{"65000:100", "64512:1:2", "noAdvertise"} {
		if !strings.Contains(out, want) {
			t.Errorf("community %s did not arrive at FRR:\n%s", want, out)
		}
	}
	s := ndMany(t, l, lab.RoleClient, "tcp", "203.0.113.80:80", 30)
	t.Logf("client -> VIP through FRR (ECMP over %v): %v", all, s.Pods)

	// n3 dies: BFD (100 ms x 3) tells FRR, which takes n3 out of the ECMP group.
	if out, err := l.Exec("n3", "ip", "link", "set", "eth0", "down"); err != nil {
		t.Fatalf("n3 link down: %v %s", err, out)
	}
	if err := b.procs["n3"].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := waitFor(t, "n3 out of FRR's FIB", 15*time.Second, func() bool { return slices.Equal(frrNextHops(frr, torVIP), all[:2]) })
	t.Logf("n3 dead (link down + SIGKILL) -> its next hop gone from FRR's FIB in %v (BFD 100 ms x 3; hold time 9 s without BFD)", gone.Round(time.Millisecond))
	// The endpoint controller would now drop n3's pod from the slice; then every connection works.
	f1, f2 := l.Pod("f1"), l.Pod("f2")
	b.w.write("svc.yaml",
		ndService("torweb", "LoadBalancer", "10.96.6.1", "Cluster", []ndPort{{"http", "TCP", 80, 30600, "http"}}, ndStatus("203.0.113.80")),
		ndSlice("torweb", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(f1, "n1"), ndEp(f2, "n2")))
	ndWait(t, l, lab.RoleClient, "tcp", "203.0.113.80:80", func(r lab.ProbeResult) bool { return r.OK() })
	time.Sleep(300 * time.Millisecond)
	ndMany(t, l, lab.RoleClient, "tcp", "203.0.113.80:80", 20)
}

// TestBGPFRRToRBFDFirst is the race behind a CI failure: BGP coming up after BFD. FRR 8.4 creates
// its BFD session for a BGP neighbor before the session is Established (local address unknown),
// and when BGP establishes it deletes that session and creates a new one (new discriminator, local
// address set: bgpd's bgp_peer_bfd_update_source). With GoBGP's BFD, BFD came up with FRR's first
// session while BGP was still connecting, and the replacement reset BGP on both sides, in a loop.
// Here TCP port 179 is blocked at the router for the first 4 s: vipgate holds each BFD session
// until its BGP session is Established (FRR's first sessions never come up), FRR still replaces
// them, and every BGP session establishes once and never drops, on either side (FRR's
// connectionsDropped, GoBGP's "Peer Down" in vipgate's log). bgp/'s TestFRRBFDRouterReplacesSession
// covers BFD being up with FRR's first session.
func TestBGPFRRToRBFDFirst(t *testing.T) {
	x := newFRRToR(t)
	b, l, frr, all := x.bgpLab, x.l, x.frr, x.all
	nft := func(args ...string) {
		t.Helper()
		argv := routers.InNetns(l.NS(lab.RoleRouter), append([]string{"nft"}, args...)...)
		routers.MustRun(t, argv[0], argv[1:]...)
	}
	nft("add", "table", "inet", "bgpblock")
	for _, hook := range []string{"input", "output"} {
		nft("add", "chain", "inet", "bgpblock", hook, "{ type filter hook "+hook+" priority 0; }")
		nft("add", "rule", "inet", "bgpblock", hook, "tcp", "dport", "179", "drop")
		nft("add", "rule", "inet", "bgpblock", hook, "tcp", "sport", "179", "drop")
	}
	start := time.Now()
	for _, n := range l.Nodes() {
		b.start(n.Name)
	}
	// While BGP is blocked: FRR has its first BFD sessions, and none comes up.
	first := map[string]uint32{}
	bfdUpEarly := 0
	for time.Since(start) < 4*time.Second {
		peers, err := frr.BFDPeers()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range peers {
			first[p.Peer] = p.ID
			if p.Status == "up" {
				bfdUpEarly++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if est, _ := frr.Established(l.Node("n1").IPv4); est {
		t.Fatalf("BGP established although port 179 is blocked")
	}
	nft("delete", "table", "inet", "bgpblock")
	t.Logf("FRR's first BFD sessions %v; seen up before BGP in %d polls; port 179 unblocked after %v", first, bfdUpEarly, time.Since(start).Round(time.Millisecond))
	if len(first) != 3 {
		t.Errorf("FRR had %d BFD sessions before BGP, want 3: %v", len(first), first)
	}
	if bfdUpEarly > 0 {
		t.Errorf("BFD came up before BGP was established (vipgate holds it until then)")
	}

	up := waitFor(t, "three ECMP next hops in FRR's FIB", 30*time.Second, func() bool { return slices.Equal(frrNextHops(frr, torVIP), all) })
	t.Logf("all three next hops in FRR's FIB %v after the unblock", up.Round(time.Millisecond))
	for _, n := range l.Nodes() {
		waitFor(t, "BFD up with "+n.Name, 10*time.Second, func() bool { up, _ := frr.BFDUp(n.IPv4); return up })
	}
	// Long enough for anything FRR's session replacement could break to show: GoBGP's BFD expired
	// FRR's new session after 3 s (detect multiplier 3 x 1 s slow-start interval).
	time.Sleep(8 * time.Second)

	nbrs, err := frr.Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	peers, err := frr.BFDPeers()
	if err != nil {
		t.Fatal(err)
	}
	replaced := 0
	for _, p := range peers {
		if p.Status != "up" {
			t.Errorf("FRR BFD session with %s is %s", p.Peer, p.Status)
		}
		if id, ok := first[p.Peer]; ok && id != p.ID {
			replaced++
		}
	}
	for _, n := range l.Nodes() {
		nb := nbrs[n.IPv4]
		downs := strings.Count(b.procs[n.Name].Log(), "Peer Down")
		t.Logf("%s: FRR state %s, established %d, dropped %d (last reset: %q); vipgate \"Peer Down\" %d",
			n.Name, nb.BGPState, nb.ConnectionsEstablished, nb.ConnectionsDropped, nb.LastResetDueTo, downs)
		if nb.BGPState != "Established" || nb.ConnectionsEstablished != 1 || nb.ConnectionsDropped != 0 || downs != 0 {
			t.Errorf("%s: the BGP session flapped (FRR: %s, established %d, dropped %d; vipgate Peer Down %d)",
				n.Name, nb.BGPState, nb.ConnectionsEstablished, nb.ConnectionsDropped, downs)
		}
	}
	if replaced != 3 {
		t.Errorf("FRR replaced %d of its 3 BFD sessions when BGP established (%v -> %+v): the case this test is about did not happen", replaced, first, peers)
	}
}

// birdECMPConfig is a BIRD router (AS 64512) that installs what it learns into the kernel, merging
// equal paths, with one session per neighbor; extra goes into every bgp protocol.
func birdECMPConfig(extra string, neighbors ...*lab.Node) string {
	var conf strings.Builder
	conf.WriteString("router id 192.0.2.1;\nlog stderr all;\nprotocol device {}\n" +
		"protocol kernel { ipv4 { export all; }; merge paths on; }\nprotocol kernel { ipv6 { export all; }; merge paths on; }\n")
	for _, n := range neighbors {
		fmt.Fprintf(&conf, "protocol bgp %s {\n  local 192.0.2.1 as 64512;\n  neighbor %s as 64512;\n  direct;\n  hold time 9;\n  connect retry time 1;\n%s  ipv4 { import all; export none; };\n}\n",
			n.Name, n.IPv4, extra)
	}
	return conf.String()
}

// TestBGPRestartNoFlap: `vipgate node` restarts (SIGTERM, then a new process) under graceful restart
// (enableGracefulRestart on the BGPPeer, BIRD as helper): the router keeps the route the whole time
// (polled every 20 ms) and a client connecting every 10 ms through the VIP loses nothing — the rules
// stay in the kernel and the route at the router while vipgate is away.
func TestBGPRestartNoFlap(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	b := newBGPLab(t, lab.NodeSpec{Name: "n1", Pods: []string{"r1"}})
	l := b.l
	n1 := l.Node("n1")
	bird := routers.StartBIRD(t, l.NS(lab.RoleRouter), birdECMPConfig("  graceful restart on;\n", n1))
	b.w.write("metallb.yaml", metallbDoc("IPAddressPool", "gr", `addresses: [203.0.113.88/29]`), metallbDoc("BGPPeer", "tor", `myASN: 64512
peerASN: 64512
peerAddress: 192.0.2.1
holdTime: 9s
connectTime: 1s
enableGracefulRestart: true`), metallbDoc("BGPAdvertisement", "gr", `ipAddressPools: [gr]`))
	b.w.write("svc.yaml",
		ndService("grweb", "LoadBalancer", "10.96.6.9", "Cluster", []ndPort{{"http", "TCP", 80, 30609, "http"}}, ndStatus("203.0.113.90")),
		ndSlice("grweb", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(l.Pod("r1"), "n1")))
	b.start("n1")
	vip := netip.MustParsePrefix("203.0.113.90/32")
	present := func() bool {
		routes, err := bird.Routes()
		if err != nil {
			return false
		}
		_, ok := routers.Find(routes, vip)
		return ok
	}
	waitFor(t, "the VIP at BIRD", 30*time.Second, present)
	ndWait(t, l, lab.RoleClient, "tcp", "203.0.113.90:80", func(r lab.ProbeResult) bool { return r.OK() })

	stop := make(chan struct{})
	type watch struct {
		polls, missing int
	}
	watched := make(chan watch)
	go func() {
		var w watch
		for {
			select {
			case <-stop:
				watched <- w
				return
			case <-time.After(20 * time.Millisecond):
			}
			w.polls++
			if !present() {
				w.missing++
			}
		}
	}()
	probed := make(chan lab.ProbeSummary)
	go func() {
		s, _ := l.ProbeMany(lab.RoleClient, "tcp", "203.0.113.90:80", 400, 10*time.Millisecond)
		probed <- s
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	if err := b.procs["n1"].Stop(); err != nil {
		t.Fatal(err)
	}
	b.start("n1")
	waitFor(t, "the session re-established", 30*time.Second, func() bool { up, _ := bird.Established(n1.IPv4); return up })
	back := time.Since(start)
	s := <-probed
	close(stop)
	w := <-watched
	t.Logf("vipgate restarted with graceful restart: session back after %v; route missing at BIRD in %d of %d polls (every 20 ms); %d of %d connections (every 10 ms) failed",
		back.Round(time.Millisecond), w.missing, w.polls, s.Lost, s.Sent)
	if w.missing > 0 || s.Lost > 0 {
		t.Errorf("the restart flapped: route missing in %d polls, %d connections failed (%v)", w.missing, s.Lost, s.Errors)
	}
}

// TestBGPScale1000: one node advertises 1,000 LoadBalancer IPs (IPv6, one Service each, from the
// manifest directory) over IPv6 sessions to two routers, BIRD and FRR. Reported: the time from
// `vipgate node` starting to every prefix in both routers' tables.
func TestBGPScale1000(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc", "/usr/lib/frr/bgpd", "vtysh")
	const n = 1000
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{{Name: "n1", Pods: []string{"s1"}}}})
	dir := t.TempDir()
	b := &bgpLab{t: t, l: l, bin: vipgateBinary(t), dir: dir, w: &ndWriter{t: t, dir: filepath.Join(dir, "manifests")}, procs: map[string]*lab.Proc{}}
	if err := os.Mkdir(b.w.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n1 := l.Node("n1")
	bird := routers.StartBIRD(t, l.NS(lab.RoleRouter), fmt.Sprintf("router id 192.0.2.1;\nprotocol device {}\n"+
		"protocol bgp n1 {\n  local 2001:db8:1::1 as 64512;\n  neighbor %s as 64512;\n  direct;\n  hold time 9;\n  connect retry time 1;\n  ipv6 { import all; export none; };\n}\n", n1.IPv6))
	lanRouter := netip.MustParseAddr("2001:db8:1::100")
	frr := routers.StartFRR(t, l.NS(lab.RoleLANClient), routers.FRRConfig{
		BGPD: routers.FRRBGPConfig(lab.LANClientv4, 64512, routers.FRRPeer{Neighbor: n1.IPv6, PeerASN: 64512})})
	b.w.write("metallb.yaml", metallbDoc("IPAddressPool", "many", `addresses: ["2001:db8:ff::/112"]`), metallbDoc("BGPPeer", "bird", `{myASN: 64512, peerASN: 64512, peerAddress: "2001:db8:1::1", holdTime: 9s, connectTime: 1s}`), fmt.Sprintf(metallbDoc("BGPPeer", "frr", `{myASN: 64512, peerASN: 64512, peerAddress: %q, holdTime: 9s, connectTime: 1s}`), lanRouter), metallbDoc("BGPAdvertisement", "many", `ipAddressPools: [many]`))
	s1 := l.Pod("s1")
	var docs []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("v%04d", i)
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: e2e}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  ipFamilies: [IPv6]
  clusterIP: "2001:db8:96::%x"
  clusterIPs: ["2001:db8:96::%x"]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
status:
  loadBalancer:
    ingress: [{ip: "2001:db8:ff::%x"}]
`, name, 0x1000+i, 0x1000+i, 0x1000+i), ndSlice(name, "IPv6", []ndSlicePort{{"http", "TCP", 8080}}, ndEp6(s1, "n1")))
	}
	b.w.write("svc.yaml", docs...)
	start := time.Now()
	b.start("n1")
	t.Cleanup(func() {
		if t.Failed() {
			c, err := bird.Count()
			out, _ := frr.Vtysh("show bgp ipv6 unicast summary")
			proto, _ := bird.Birdc("show", "protocols", "all")
			t.Logf("BIRD: %d routes (%v)\n%s\nFRR:\n%s\nvipgate:\n%s", c, err, proto, out, b.procs["n1"].Tail(30))
		}
	})
	var atBIRD, atFRR time.Duration
	waitFor(t, "1,000 prefixes at both routers", 120*time.Second, func() bool {
		if atBIRD == 0 {
			if c, err := bird.Count(); err == nil && c >= n {
				atBIRD = time.Since(start)
			}
		}
		if atFRR == 0 {
			out, err := frr.Vtysh("show bgp ipv6 unicast summary json")
			if m := regexp.MustCompile(`"pfxRcd":\s*(\d+)`).FindStringSubmatch(out); err == nil && m != nil {
				if c, _ := strconv.Atoi(m[1]); c >= n {
					atFRR = time.Since(start)
				}
			}
		}
		return atBIRD > 0 && atFRR > 0
	})
	t.Logf("%d VIPs (IPv6, one Service each): vipgate node started -> all in BIRD after %v, all in FRR after %v",
		n, atBIRD.Round(time.Millisecond), atFRR.Round(time.Millisecond))
}

// TestBGPPasswordSecret: the BGPPeer's TCP MD5 password comes from a basic-auth Secret
// (passwordSecret) in the manifest directory. With the wrong password in the Secret the session never
// establishes (BIRD drops the unsigned-as-expected segments); once the Secret is fixed it does; a
// BGPPeer naming a missing Secret is reported and the other peer is unaffected.
func TestBGPPasswordSecret(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	b := newBGPLab(t, lab.NodeSpec{Name: "n1", Pods: []string{"m1"}})
	n1 := b.l.Node("n1")
	bird := routers.StartBIRD(t, b.l.NS(lab.RoleRouter), birdECMPConfig("  password \"s3cret-md5\";\n", n1))
	peers := metallbDoc("BGPPeer", "tor", `myASN: 64512
peerASN: 64512
peerAddress: 192.0.2.1
connectTime: 1s
passwordSecret: {name: tor-md5}`) + "---\n" + metallbDoc("BGPPeer", "ghost", `myASN: 64512
peerASN: 64512
peerAddress: 192.0.2.99
passwordSecret: {name: missing}`)
	secret := func(pw string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: tor-md5, namespace: metallb-system}\ntype: kubernetes.io/basic-auth\nstringData: {password: %q}\n", pw)
	}
	b.w.write("peers.yaml", peers, secret("wrong-password"))
	p := b.start("n1")
	time.Sleep(4 * time.Second)
	if up, _ := bird.Established(n1.IPv4); up {
		t.Fatalf("the session established with the wrong MD5 password")
	}
	if !strings.Contains(p.Log(), "passwordSecret metallb-system/missing does not exist") {
		t.Errorf("the peer with a missing Secret is not reported:\n%s", p.Tail(20))
	}
	if strings.Contains(p.Log(), "wrong-password") {
		t.Errorf("the log shows the password")
	}
	b.w.write("peers.yaml", peers, secret("s3cret-md5"))
	d := waitFor(t, "the session with the right password", 30*time.Second, func() bool { up, _ := bird.Established(n1.IPv4); return up })
	t.Logf("wrong MD5 password from the Secret: no session for 4 s; Secret fixed -> established after %v", d.Round(time.Millisecond))
}
