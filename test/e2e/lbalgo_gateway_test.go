package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/test/lab"
)

// TestGatewayLBAlgorithms: `vipgate gateway` (direct forwarding, in the lab's lanclient namespace, as
// in TestGateway) with a maglev VIP (the default), a source-hash VIP and a round-robin VIP (refused
// on gateways: it keeps Maglev and says why). Source-hash sends every connection of the client to
// the pod its address hashes to — predicted from the kernel's jhash and the Maglev table, and named
// by the tracer over the table read back from the gateway's kernel.
func TestGatewayLBAlgorithms(t *testing.T) {
	lab.SkipUnlessRoot(t)
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	l := lab.NewForTest(t, lab.Spec{IPv4Only: true, Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"a1", "a2"}},
		{Name: "node2", Pods: []string{"b1"}},
	}})
	bin := gwBinary(t)
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := l.Pod("a1"), l.Pod("a2"), l.Pod("b1")
	gwIP, client := lab.LANClientv4, lab.Clientv4
	gwSh(t, l, lab.RoleRouter, "ip", "route", "add", "203.0.113.0/24", "via", gwIP.String())
	gwSh(t, l, lab.RoleLANClient, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for _, n := range l.Nodes() {
		gwSh(t, l, lab.RoleLANClient, "ip", "route", "add", n.PodCIDRv4.String(), "via", n.IPv4.String())
		gwSh(t, l, n.Name, "ip", "route", "add", lab.ClientNetv4.String(), "via", gwIP.String())
	}
	w := &gwWriter{t: t, dir: manifests}
	annotated := func(svc, alg string) string {
		if alg == "" {
			return svc
		}
		return strings.Replace(svc, "  namespace: e2e\n", "  namespace: e2e\n  annotations: {"+cluster.LBAlgorithmAnnotation+": "+alg+"}\n", 1)
	}
	vips := []struct{ name, clusterIP, vip, alg string }{
		{"web", "10.96.6.1", "203.0.113.50", ""},
		{"sh", "10.96.6.2", "203.0.113.52", string(cluster.LBSourceHash)},
		{"rr", "10.96.6.3", "203.0.113.53", string(cluster.LBRoundRobin)},
	}
	for _, v := range vips {
		w.write(v.name+".yaml",
			annotated(gwService(v.name, "LoadBalancer", v.clusterIP, "Cluster", []gwPort{{"http", "TCP", 80, 0, "http"}}, gwStatus(v.vip)), v.alg),
			gwSlice(v.name, "IPv4", []gwSlicePort{{"http", "TCP", 8080}}, gwEp(a1, "node1"), gwEp(a2, "node1"), gwEp(b1, "node2")))
	}
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(gwConfig("direct", gwIP, l.Node("node1"), l.Node("node2"))), 0o644); err != nil {
		t.Fatal(err)
	}
	gw, err := l.Start(lab.RoleLANClient, filepath.Join(dir, "gateway.log"), bin, "gateway", "--config", cfg, "--manifests", manifests)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- vipgate gateway:\n%s", gw.Tail(40))
		}
	})
	for _, v := range vips {
		gwWait(t, l, "client", "tcp", v.vip+":80", func(r lab.ProbeResult) bool { return r.OK() })
	}

	t.Run("source-hash keeps the client on one pod, as predicted and traced", func(t *testing.T) {
		s := gwMany(t, l, "client", "tcp", "203.0.113.52:80", 200)
		if len(s.Pods) != 1 {
			t.Fatalf("200 connections from %s reached %v: want one pod", client, s.Pods)
		}
		backends := []string{
			netip.AddrPortFrom(a1.IPv4, 8080).String(), netip.AddrPortFrom(a2.IPv4, 8080).String(), netip.AddrPortFrom(b1.IPv4, 8080).String(),
		}
		m := maglev.SizeFor(len(backends))
		table, err := maglev.Table(backends, m)
		if err != nil {
			t.Fatal(err)
		}
		want := backends[table[dataplane.SourceHashSlot(client, uint32(m))]]
		var got string
		for p := range s.Pods {
			got = netip.AddrPortFrom(l.Pod(p).IPv4, 8080).String()
		}
		if got != want {
			t.Errorf("every connection reached %s; the jhash of %s and the Maglev table predict %s", got, client, want)
		}
		fd, err := os.Open("/run/netns/" + l.NS(lab.RoleLANClient))
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		f, err := (&dataplane.NetlinkProgrammer{NetNSFd: int(fd.Fd())}).ReadTable(cluster.IPv4, "vipgate")
		if err != nil {
			t.Fatalf("reading the gateway's table: %v", err)
		}
		r := dataplane.Trace(f, dataplane.HostInfo{}, dataplane.Packet{Src: client, Dst: netip.MustParseAddr("203.0.113.52"), Proto: dataplane.ProtoTCP, Port: 80})
		if r.Outcome != dataplane.OutcomeDNAT || len(r.Candidates) != 1 || r.Candidates[0].Endpoint.String() != got {
			t.Errorf("tracer over the gateway's kernel table: %s, want DNAT to %s\n%s", r, got, r.Explain())
		}
		t.Logf("source-hash on the gateway: 200 of 200 connections from %s to %s (slot %d of %d); tracer agrees",
			client, got, dataplane.SourceHashSlot(client, uint32(m)), m)
	})

	t.Run("maglev spreads the flows", func(t *testing.T) {
		s := gwMany(t, l, "client", "tcp", "203.0.113.50:80", 150)
		if len(s.Pods) != 3 {
			t.Errorf("150 connections reached %v: want all 3 pods", s.Pods)
		}
		t.Logf("maglev on the gateway, 150 connections: %v", s.Pods)
	})

	t.Run("round-robin is refused on a gateway and keeps Maglev", func(t *testing.T) {
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(gw.Log(), "round-robin is not done by gateways") {
			if time.Now().After(deadline) {
				t.Fatalf("no refusal of round-robin in the gateway's log:\n%s", gw.Tail(20))
			}
			time.Sleep(50 * time.Millisecond)
		}
		s := gwMany(t, l, "client", "tcp", "203.0.113.53:80", 60)
		if len(s.Pods) < 2 {
			t.Errorf("60 connections reached %v: want Maglev's spread", s.Pods)
		}
	})
}
