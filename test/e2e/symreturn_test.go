package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/test/lab"
)

// TestSymmetricReturn is issue #32 item 5 (MetalLB#1983) on real packets. node1 has the lab's eth0
// (default route via the lab router, "router A") and a second NIC eth1 on another LAN, where
// router B sits with a client network behind it:
//
//	clientb 203.0.113.70/26 -- (203.0.113.65) rtrb (203.0.113.1) -- 203.0.113.11/26 eth1 node1 eth0 -- router A
//
// Router B routes the VIPs to node1's eth1. Without symmetricReturn, node1 answers clientb by its
// main table's default route, out of eth0 to router A, which has no route to clientb's network:
// every connection fails, to a VIP DNAT'd to the pod web1 on node1, to one DNAT'd (and
// masqueraded) to web2 on node2, whose replies come back to node1 over eth0, and to a server
// node1 runs itself on its eth1 address; IPv4 and IPv6. With symmetricReturn on eth1, 100 of 100
// new connections of each work, and 100 held ones stay up; with it turned off again, vipgate
// removes its table, ip rules and routes.
func TestSymmetricReturn(t *testing.T) {
	lab.SkipUnlessRoot(t)
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{{Name: "node1", Pods: []string{"web1"}}, {Name: "node2", Pods: []string{"web2"}}}})
	node1, web1, web2 := l.Node("node1"), l.Pod("web1"), l.Pod("web2")
	nsNode, rtrb, clientb := l.NS("node1"), l.Prefix()+"rtrb", l.Prefix()+"clientb"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The second LAN: namespaces with the lab's prefix (so a sweep of a dead run finds them),
	// deleted before the lab.
	ip("netns", "add", rtrb)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", rtrb).Run() })
	ip("netns", "add", clientb)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", clientb).Run() })
	for _, cmds := range []struct {
		ns   string
		cmds []string
	}{
		{rtrb, []string{
			"link add lan2 type veth peer name eth1 netns " + nsNode,
			"link add cli1 type veth peer name eth0 netns " + clientb,
			"addr add 203.0.113.1/26 dev lan2",
			"addr add 203.0.113.65/26 dev cli1",
			"addr add 2001:db8:3::1/64 dev lan2 nodad",
			"addr add 2001:db8:4::1/64 dev cli1 nodad",
			"link set lo up", "link set lan2 up", "link set cli1 up",
			"route add 203.0.113.200/32 via 203.0.113.11",
			"route add 2001:db8:ff::200/128 via 2001:db8:3::11",
			"route add 203.0.113.201/32 via 203.0.113.11",
			"route add 2001:db8:ff::201/128 via 2001:db8:3::11",
		}},
		{nsNode, []string{"addr add 203.0.113.11/26 dev eth1", "addr add 2001:db8:3::11/64 dev eth1 nodad", "link set eth1 up"}},
		{clientb, []string{
			"addr add 203.0.113.70/26 dev eth0", "addr add 2001:db8:4::70/64 dev eth0 nodad",
			"link set lo up", "link set eth0 up",
			"route add default via 203.0.113.65", "route add default via 2001:db8:4::1",
		}},
	} {
		if err := lab.IPBatch(cmds.ns, cmds.cmds); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("ip", "netns", "exec", rtrb, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding in router B: %v %s", err, out)
	}

	// A server node1 answers itself, on its eth1 address.
	bin, err := l.LabServer()
	if err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(l.Dir(), "host.ready")
	host, err := l.Start("node1", filepath.Join(l.Dir(), "host-labserver.log"), bin, "serve", "--name", "host", "--port", "9090", "--ready", ready)
	if err != nil {
		t.Fatal(err)
	}
	dpEventually(t, 10*time.Second, "the host server is ready", func() string {
		if _, err := os.Stat(ready); err != nil {
			return host.Tail(5)
		}
		return ""
	})

	manifests := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	// web is on node1 (DNAT to a local pod); remote on node2 (DNAT and masquerade, so the pod's
	// replies come back to node1 over eth0 before they are sent to the client).
	svc := `apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Cluster
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50, "2001:db8:96::50"]
  ports: [{name: tcp, protocol: TCP, port: 80, targetPort: 8080}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.200}, {ip: "2001:db8:ff::200"}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-ipv4, namespace: e2e, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints:
- addresses: [` + fmt.Sprintf("%q", web1.IPv4) + `]
  nodeName: node1
  conditions: {ready: true, serving: true, terminating: false}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-ipv6, namespace: e2e, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints:
- addresses: [` + fmt.Sprintf("%q", web1.IPv6) + `]
  nodeName: node1
  conditions: {ready: true, serving: true, terminating: false}
`
	remote := strings.NewReplacer("name: web,", "name: remote,", "service-name: web}", "service-name: remote}", "name: web-ipv", "name: remote-ipv",
		"10.96.0.50", "10.96.0.51", "2001:db8:96::50", "2001:db8:96::51", "203.0.113.200", "203.0.113.201", "2001:db8:ff::200", "2001:db8:ff::201",
		fmt.Sprintf("%q", web1.IPv4), fmt.Sprintf("%q", web2.IPv4), fmt.Sprintf("%q", web1.IPv6), fmt.Sprintf("%q", web2.IPv6), "nodeName: node1", "nodeName: node2").Replace(svc)
	if err := os.WriteFile(filepath.Join(manifests, "remote.yaml"), []byte(remote), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	vg := vipgateBinary(t)
	cfgPath := filepath.Join(l.Dir(), "node1-nodeconfig.yaml")
	run := 0
	startVIPGate := func(extra string) *lab.Proc {
		t.Helper()
		run++
		if err := os.WriteFile(cfgPath, []byte(lab.NodeConfig(node1)+"logLevel: debug\n"+extra), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start("node1", filepath.Join(l.Dir(), fmt.Sprintf("node1-vipgate-%d.log", run)), vg, "node", "--config", cfgPath, "--manifests", manifests)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("vipgate log, run %d:\n%s", run, p.Tail(30))
			}
		})
		dpEventually(t, 15*time.Second, "vipgate synced", func() string {
			if exited, err := p.Exited(); exited {
				t.Fatalf("vipgate exited: %v\n%s", err, p.Tail(20))
			}
			if !strings.Contains(p.Log(), "synced") {
				return "no sync yet"
			}
			return ""
		})
		return p
	}
	// probe100 opens 100 new TCP connections from ns to target (1 s timeout each) and returns how
	// many got an answer, and from whom.
	probe100 := func(ns, target string) lab.ProbeSummary {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "probe", "--tcp", target, "--timeout", "1s", "--count", "100", "--interval", "10ms").CombinedOutput()
		s, ok := lab.ParseProbeSummary(string(out))
		if !ok {
			t.Fatalf("probe %s from %s: no summary:\n%s", target, ns, out)
		}
		return s
	}
	targets := []struct{ name, addr, answer string }{
		{"IPv4 VIP DNAT'd to a local pod", "203.0.113.200:80", "web1"},
		{"IPv4 server on the host", "203.0.113.11:9090", "host"},
		{"IPv6 VIP DNAT'd to a local pod", "[2001:db8:ff::200]:80", "web1"},
		{"IPv6 server on the host", "[2001:db8:3::11]:9090", "host"},
		{"IPv4 VIP DNAT'd to a pod on node2", "203.0.113.201:80", "web2"},
		{"IPv6 VIP DNAT'd to a pod on node2", "[2001:db8:ff::201]:80", "web2"},
	}

	// Off: router B itself (on eth1's own subnet) gets answers, clientb (behind it) none.
	p := startVIPGate("")
	for _, tg := range targets {
		if s := probe100(rtrb, tg.addr); s.OK != 100 || s.Pods[tg.answer] != 100 {
			t.Fatalf("%s from router B without symmetricReturn: %d of 100 (%v %v); the lab is broken", tg.name, s.OK, s.Pods, s.Errors)
		}
		s := probe100(clientb, tg.addr)
		t.Logf("without symmetricReturn: %s: %d of 100 connections work (errors %v)", tg.name, s.OK, s.Errors)
		if s.OK != 0 {
			t.Errorf("%s without symmetricReturn: %d of 100 work; the replies must leave by eth0 and be lost", tg.name, s.OK)
		}
	}
	if err := p.Stop(); err != nil {
		t.Logf("stopping vipgate: %v", err)
	}

	// Only new connections are marked, so the half-open entries the failed connections left in
	// node1's conntrack table (SYN_RECV, 60 s) would keep their path for a client port that is used
	// again; they go.
	if out, err := exec.Command("ip", "netns", "exec", nsNode, "conntrack", "-F").CombinedOutput(); err != nil {
		t.Fatalf("conntrack -F: %v %s", err, out)
	}

	// On, for eth1 with router B as its gateway.
	p = startVIPGate("symmetricReturn:\n  interfaces: [{name: eth1, gateways: [203.0.113.1, \"2001:db8:3::1\"]}]\n")
	dpEventually(t, 15*time.Second, "the symmetric return's rules", func() string {
		out, _ := exec.Command("ip", "-n", nsNode, "rule", "show", "table", "1700").CombinedOutput()
		out6, _ := exec.Command("ip", "-n", nsNode, "-6", "rule", "show", "table", "1700").CombinedOutput()
		if w := "fwmark 0x1000/0x3000 lookup 1700 proto 118"; !strings.Contains(string(out), w) || !strings.Contains(string(out6), w) {
			return string(out)
		}
		return ""
	})
	if out, err := exec.Command("ip", "-n", nsNode, "route", "show", "table", "1700").CombinedOutput(); err != nil || !strings.Contains(string(out), "default via 203.0.113.1 dev eth1") {
		t.Fatalf("table 1700: %v\n%s", err, out)
	}
	if out, err := exec.Command("ip", "-n", nsNode, "-6", "route", "show", "table", "1700").CombinedOutput(); err != nil || !strings.Contains(string(out), "default via 2001:db8:3::1 dev eth1") {
		t.Fatalf("IPv6 table 1700: %v\n%s", err, out)
	}
	for _, tg := range targets {
		s := probe100(clientb, tg.addr)
		t.Logf("with symmetricReturn: %s: %d of 100 connections work (answered by %v, errors %v)", tg.name, s.OK, s.Pods, s.Errors)
		if s.OK != 100 || s.Pods[tg.answer] != 100 {
			t.Errorf("%s with symmetricReturn: %d of 100 work (%v %v), want 100 from %s", tg.name, s.OK, s.Pods, s.Errors, tg.answer)
		}
	}
	// 100 held connections per target, pinged every 200 ms for 3 s: the established flows' replies
	// keep their path too.
	for _, tg := range targets {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", clientb, bin, "hold", "--tcp", tg.addr, "--conns", "100", "--duration", "3s").CombinedOutput()
		cancel()
		if !strings.Contains(string(out), "opened=100 ") || !strings.Contains(string(out), "conns=100 broken=0 ") {
			t.Errorf("%s: holding 100 connections with symmetricReturn: %v\n%s", tg.name, err, out)
		} else {
			t.Logf("with symmetricReturn: %s: 100 held connections, 0 broken", tg.name)
		}
	}
	spoofIntoExistingFlow(t, l, rtrb, nsNode)
	if err := p.Stop(); err != nil {
		t.Logf("stopping vipgate: %v", err)
	}
	// Stopping leaves everything in place (replies keep their path while vipgate restarts).
	if out, _ := exec.Command("ip", "-n", nsNode, "rule").CombinedOutput(); !strings.Contains(string(out), "lookup 1700") {
		t.Errorf("the ip rule went with vipgate's stop:\n%s", out)
	}

	// Off again: vipgate removes its table, rules and routes.
	gone := func() string {
		rules, _ := exec.Command("ip", "-n", nsNode, "rule").CombinedOutput()
		routes, _ := exec.Command("ip", "-n", nsNode, "route", "show", "table", "all", "proto", "118").CombinedOutput()
		tables, _ := exec.Command("ip", "netns", "exec", nsNode, "nft", "list", "tables").CombinedOutput()
		if strings.Contains(string(rules), "1700") || strings.Contains(string(routes), " dev ") || strings.Contains(string(tables), "vipgate-return") {
			return fmt.Sprintf("rules:\n%s\nroutes:\n%s\ntables:\n%s", rules, routes, tables)
		}
		return ""
	}
	p = startVIPGate("")
	dpEventually(t, 15*time.Second, "the symmetric return removed", gone)
	s := probe100(clientb, targets[0].addr)
	if s.OK != 0 {
		t.Errorf("VIP with symmetricReturn off again: %d of 100 work", s.OK)
	}
	if err := p.Stop(); err != nil {
		t.Logf("stopping vipgate: %v", err)
	}

	// On once more, then `vipgate node --cleanup` removes it with the Service tables.
	p = startVIPGate("symmetricReturn:\n  interfaces: [{name: eth1, gateways: [203.0.113.1]}]\n")
	dpEventually(t, 15*time.Second, "the symmetric return's rules", func() string {
		if gone() == "" {
			return "not programmed"
		}
		return ""
	})
	if err := p.Stop(); err != nil {
		t.Logf("stopping vipgate: %v", err)
	}
	if out, err := l.Exec("node1", vg, "node", "--config", cfgPath, "--cleanup"); err != nil {
		t.Fatalf("vipgate node --cleanup: %v\n%s", err, out)
	}
	if left := gone(); left != "" {
		t.Errorf("after --cleanup:\n%s", left)
	}
}

// spoofIntoExistingFlow is the LAN attacker on the opted-in interface: a UDP flow from the lab's
// client (behind router A, so it arrives on eth0) to node1's own server is under way; router B's
// namespace, on eth1's LAN, sends a packet with that flow's addresses and ports into eth1. Only
// new connections are marked, so the flow's replies stay on eth0: the client gets an answer to
// every datagram, the forged one's included, and the flow's conntrack mark stays 0. (Were an
// established flow marked by a packet on eth1, its replies would go to router B, which has no
// route to the client.)
func spoofIntoExistingFlow(t *testing.T, l *lab.Lab, rtrb, nsNode string) {
	t.Helper()
	client := netip.MustParseAddrPort("198.51.100.10:40000")
	server := &net.UDPAddr{IP: net.ParseIP("192.0.2.11"), Port: 9090}
	if err := lab.IPBatch(rtrb, []string{"route add 192.0.2.11/32 via 203.0.113.11"}); err != nil {
		t.Fatal(err)
	}
	var c, forger *net.UDPConn
	if err := lab.InNetns(l.NS(lab.RoleClient), func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(client))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// IP_TRANSPARENT: the forger binds and sends from the client's address, which router B's namespace
	// does not have.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1) }); err != nil {
			return err
		}
		return serr
	}}
	if err := lab.InNetns(rtrb, func() error {
		pc, err := lc.ListenPacket(context.Background(), "udp4", client.String())
		if err == nil {
			forger = pc.(*net.UDPConn)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	answers := func(n int) int {
		got := 0
		buf := make([]byte, 1500)
		for got < n {
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Read(buf); err != nil {
				break
			}
			got++
		}
		return got
	}
	if _, err := c.WriteToUDP([]byte("hello\n"), server); err != nil {
		t.Fatalf("client: %v", err)
	}
	if got := answers(1); got != 1 {
		t.Fatalf("the client's UDP flow to node1 over eth0 gets no answer")
	}
	if _, err := forger.WriteToUDP([]byte("forged\n"), server); err != nil {
		t.Fatalf("forger: %v", err)
	}
	if _, err := c.WriteToUDP([]byte("again\n"), server); err != nil {
		t.Fatal(err)
	}
	if got := answers(2); got != 2 {
		t.Errorf("after a forged packet into eth1, the client got %d of 2 answers: the flow's replies were taken to eth1", got)
	}
	out, err := exec.Command("ip", "netns", "exec", nsNode, "conntrack", "-L", "-p", "udp", "--orig-src", "198.51.100.10", "--sport", "40000").Output()
	if err != nil || !strings.Contains(string(out), "mark=0 ") {
		t.Errorf("the flow's conntrack entry: %v\n%s", err, out)
	} else {
		t.Logf("a forged packet into eth1 left the existing flow alone: %s", strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
	}
}
