package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

// TestBGPSpeaker: BIRD 2 in the lab router peers (iBGP, AS 64512) with vipgate on three nodes, from
// MetalLB BGPPeer / BGPAdvertisement / IPAddressPool objects. An externalTrafficPolicy=Cluster VIP is
// in the router's table with one next hop per node (ECMP, merged into the kernel) and reachable from
// the client behind the router; an eTP=Local VIP has only the nodes with a local endpoint as next
// hops, and a node withdraws when its last endpoint goes (the time to the router is reported).
func TestBGPSpeaker(t *testing.T) {
	routers.RequireRoot(t, "bird", "birdc")
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "n1", Pods: []string{"g1"}},
		{Name: "n2", Pods: []string{"g2"}},
		{Name: "n3", Pods: []string{"g3"}},
	}})
	var conf strings.Builder
	conf.WriteString("router id 192.0.2.1;\nlog stderr all;\nprotocol device {}\nprotocol kernel { ipv4 { export all; }; merge paths on; }\n")
	for _, n := range l.Nodes() {
		fmt.Fprintf(&conf, "protocol bgp %s {\n  local 192.0.2.1 as 64512;\n  neighbor %s as 64512;\n  direct;\n  hold time 9;\n  connect retry time 1;\n  ipv4 { import all; export none; };\n}\n", n.Name, n.IPv4)
	}
	bird := routers.StartBIRD(t, l.NS("router"), conf.String())

	bin := vipgateBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	w := &ndWriter{t: t, dir: manifests}
	var docs []string
	for _, n := range l.Nodes() {
		docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\nstatus:\n  addresses: [{type: InternalIP, address: %q}]\n", n.Name, n.IPv4))
	}
	docs = append(docs, metallbDoc("IPAddressPool", "bgp", `addresses: [203.0.113.64/26]`), metallbDoc("BGPPeer", "tor", `myASN: 64512
peerASN: 64512
peerAddress: 192.0.2.1
holdTime: 9s
connectTime: 1s`), metallbDoc("BGPAdvertisement", "bgp", `ipAddressPools: [bgp]
localPref: 150
communities: ["65000:100"]`))
	w.write("metallb.yaml", docs...)
	g1, g2, g3 := l.Pod("g1"), l.Pod("g2"), l.Pod("g3")
	w.write("svc.yaml",
		ndService("bgpweb", "LoadBalancer", "10.96.4.1", "Cluster", []ndPort{{"http", "TCP", 80, 30300, "http"}}, ndStatus("203.0.113.70")),
		ndSlice("bgpweb", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(g1, "n1"), ndEp(g2, "n2"), ndEp(g3, "n3")),
		ndService("bgplocal", "LoadBalancer", "10.96.4.2", "Local", []ndPort{{"http", "TCP", 80, 30301, "http"}}, ndStatus("203.0.113.71")),
		ndSlice("bgplocal", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(g1, "n1"), ndEp(g2, "n2")))
	procs := map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		cfg := filepath.Join(dir, n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(ndNodeConfig(n, "zone-a")), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, filepath.Join(dir, n.Name+".log"), bin, "node", "--config", cfg, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(25))
			}
		}
	})

	nextHops := bird.NextHops
	waitHops := func(prefix string, want []string) time.Duration {
		start := time.Now()
		for {
			got := nextHops(prefix)
			if slices.Equal(got, want) {
				return time.Since(start)
			}
			if time.Since(start) > 30*time.Second {
				out, _ := bird.Birdc("show", "route", "all")
				t.Fatalf("%s: next hops %v, want %v\n%s", prefix, got, want, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	all := []string{"192.0.2.11", "192.0.2.12", "192.0.2.13"}
	waitHops("203.0.113.70/32", all)
	out, _ := bird.Birdc("show", "route", "for", "203.0.113.70/32", "all")
	if !strings.Contains(out, "BGP.local_pref: 150") || !strings.Contains(out, "(65000,100)") {
		t.Errorf("localPref 150 and community 65000:100 not at the router:\n%s", out)
	}
	waitHops("203.0.113.71/32", []string{"192.0.2.11", "192.0.2.12"})
	s := ndMany(t, l, "client", "tcp", "203.0.113.70:80", 30)
	t.Logf("client -> BGP VIP through ECMP: %v", s.Pods)
	ndWait(t, l, "client", "tcp", "203.0.113.71:80", func(r lab.ProbeResult) bool { return r.Pod == "g1" || r.Pod == "g2" })

	// n2's last endpoint of the eTP=Local Service goes: n2 withdraws.
	start := time.Now()
	w.write("svc.yaml",
		ndService("bgpweb", "LoadBalancer", "10.96.4.1", "Cluster", []ndPort{{"http", "TCP", 80, 30300, "http"}}, ndStatus("203.0.113.70")),
		ndSlice("bgpweb", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(g1, "n1"), ndEp(g2, "n2"), ndEp(g3, "n3")),
		ndService("bgplocal", "LoadBalancer", "10.96.4.2", "Local", []ndPort{{"http", "TCP", 80, 30301, "http"}}, ndStatus("203.0.113.71")),
		ndSlice("bgplocal", "IPv4", []ndSlicePort{{"http", "TCP", 8080}}, ndEp(g1, "n1")))
	waitHops("203.0.113.71/32", []string{"192.0.2.11"})
	t.Logf("eTP=Local: manifest written -> n2's route gone at the router in %v (includes the file source's 50 ms debounce)", time.Since(start).Round(time.Millisecond))
}
