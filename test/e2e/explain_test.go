package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
)

// TestExplainAgreesWithProbes runs `vipgate node` in a lab node, then for a set of packets asks
// `vipgate explain` (inside the node's namespace, reading the live ruleset back from the kernel)
// where each goes, and sends real connections the same way: the pods that answer must be exactly
// the candidates explain lists, the source they see must be masqueraded exactly when explain says so,
// and a packet explain drops or rejects must time out or be refused. `vipgate status` is checked on
// the way (it is how the test knows the node has synced).
func TestExplainAgreesWithProbes(t *testing.T) {
	l := lab.NewForTest(t, lab.Spec{Nodes: []lab.NodeSpec{
		{Name: "node1", Pods: []string{"web-1", "web-2"}},
		{Name: "node2", Pods: []string{"web-3"}},
	}})
	bin := vipgateBinary(t)
	root, err := lab.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The demo manifests, plus an eTP=Local Service whose only endpoint is on node2.
	manifests := t.TempDir()
	demo, _ := filepath.Glob(filepath.Join(root, "deploy", "examples", "demo", "*.yaml"))
	for _, f := range demo {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(manifests, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(manifests, "remote-only.yaml"), []byte(exRemoteOnly), 0o644); err != nil {
		t.Fatal(err)
	}
	node1 := l.Node("node1")
	cfgPath := filepath.Join(t.TempDir(), "node1.yaml")
	if err := os.WriteFile(cfgPath, []byte(labNodeConfig(node1)), 0o644); err != nil {
		t.Fatal(err)
	}
	proc, err := l.Start("node1", "", bin, "node", "--config", cfgPath, "--manifests", manifests)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vipgate node log:\n%s", proc.Tail(40))
		}
	})
	// The router sends the VIPs to node1, as an announcement would.
	for _, vip := range []string{"203.0.113.10", "203.0.113.11", "203.0.113.12", "2001:db8:ff::10", "2001:db8:ff::11"} {
		a := netip.MustParseAddr(vip)
		if err := l.AddRoute(netip.PrefixFrom(a, a.BitLen()), "node1"); err != nil {
			t.Fatal(err)
		}
	}

	st := exWaitSynced(t, l, bin, proc)
	t.Run("status", func(t *testing.T) {
		if st.Node != "node1" || st.Table != "vipgate" || st.Services < 5 || st.Endpoints == 0 || len(st.Tables) != 2 {
			t.Errorf("status: %+v", st)
		}
		out, err := l.Exec("node1", bin, "status")
		if err != nil || !strings.Contains(out, "node:      node1") || !strings.Contains(out, "IPv4:") {
			t.Errorf("vipgate status: %v\n%s", err, out)
		}
		t.Logf("vipgate status:\n%s", out)
		if _, err := exec.LookPath("curl"); err == nil {
			m, err := l.Exec("node1", "curl", "-sf", "http://127.0.0.1:10249/metrics")
			for _, want := range []string{"vipgate_sync_duration_seconds_bucket", "vipgate_nftables_elements{family=\"ipv4\",set=\"service-ips\"}", "vipgate_last_sync_timestamp_seconds", "go_goroutines"} {
				if err != nil || !strings.Contains(m, want) {
					t.Errorf("/metrics lacks %q (%v)", want, err)
				}
			}
			// Only localhost: the node's LAN address does not serve the admin endpoint.
			if _, err := l.Exec("lanclient", "curl", "-sf", "--max-time", "2", "http://"+node1.IPv4.String()+":10249/metrics"); err == nil {
				t.Errorf("the admin endpoint answers on the LAN address")
			}
		}
	})

	podByIP := map[netip.Addr]string{}
	for _, p := range l.Pods() {
		podByIP[p.IPv4] = p.Name
		if p.IPv6.IsValid() {
			podByIP[p.IPv6] = p.Name
		}
	}
	cases := []struct {
		name, from, proto string
		src               netip.Addr // the from role's address
		to                netip.AddrPort
		want              string // DNAT, DROP, REJECT
	}{
		{"eTP=Cluster VIP from outside", "client", "tcp", lab.Clientv4, netip.MustParseAddrPort("203.0.113.11:80"), "DNAT"},
		{"eTP=Cluster VIP from outside, UDP", "client", "udp", lab.Clientv4, netip.MustParseAddrPort("203.0.113.11:80"), "DNAT"},
		{"eTP=Local VIP from outside", "client", "tcp", lab.Clientv4, netip.MustParseAddrPort("203.0.113.10:80"), "DNAT"},
		{"eTP=Cluster VIP IPv6", "client", "tcp", lab.Clientv6, netip.MustParseAddrPort("[2001:db8:ff::11]:80"), "DNAT"},
		{"eTP=Local VIP IPv6", "client", "tcp", lab.Clientv6, netip.MustParseAddrPort("[2001:db8:ff::10]:80"), "DNAT"},
		{"NodePort from the LAN", "lanclient", "tcp", lab.LANClientv4, netip.AddrPortFrom(node1.IPv4, 30080), "DNAT"},
		{"ClusterIP from a pod (one candidate is the pod itself: hairpin)", "web-1", "tcp", l.Pod("web-1").IPv4, netip.MustParseAddrPort("10.96.0.10:80"), "DNAT"},
		{"ClusterIP from a pod, UDP", "web-2", "udp", l.Pod("web-2").IPv4, netip.MustParseAddrPort("10.96.0.10:80"), "DNAT"},
		{"eTP=Local, no local endpoint", "client", "tcp", lab.Clientv4, netip.MustParseAddrPort("203.0.113.12:80"), "DROP"},
		{"undefined port of a ClusterIP", "web-1", "tcp", l.Pod("web-1").IPv4, netip.MustParseAddrPort("10.96.0.10:81"), "REJECT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := l.Exec("node1", bin, "explain", "--from", tc.src.String(), "--to", tc.to.String()+"/"+tc.proto, "--output", "json")
			if err != nil {
				t.Fatalf("vipgate explain: %v\n%s", err, out)
			}
			var rep struct {
				Ruleset    string
				Outcome    string
				Summary    string
				Candidates []struct {
					Endpoint         string
					Masquerade       bool
					MasqueradeReason string
				}
				Why []string
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("decoding explain output: %v\n%s", err, out)
			}
			t.Logf("explain: %s (%s) %v", rep.Outcome, rep.Summary, rep.Why)
			if rep.Ruleset != "kernel" || rep.Outcome != tc.want {
				t.Fatalf("explain says %s from the %s ruleset, want %s from the kernel", rep.Outcome, rep.Ruleset, tc.want)
			}
			if tc.want != "DNAT" {
				r, err := l.Probe(tc.from, tc.proto, tc.to.String())
				if err != nil {
					t.Fatal(err)
				}
				wantErr := map[string]string{"DROP": "timeout", "REJECT": "refused"}[tc.want]
				if r.Err != wantErr {
					t.Errorf("probe: %v, explain says %s so want %s", r, tc.want, wantErr)
				}
				return
			}
			wantPods := map[string]bool{}
			masqPod := map[string]bool{}
			for _, c := range rep.Candidates {
				ap := netip.MustParseAddrPort(c.Endpoint)
				pod, ok := podByIP[ap.Addr()]
				if !ok {
					t.Fatalf("candidate %s is no lab pod", c.Endpoint)
				}
				wantPods[pod] = true
				masqPod[pod] = c.Masquerade
			}
			// Enough connections that missing one of three endpoints is a 3*(2/3)^60 ~ 1e-10 chance.
			s, err := l.ProbeMany(tc.from, tc.proto, tc.to.String(), 60, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if s.OK != s.Sent {
				t.Errorf("%d of %d probes failed: %v", s.Sent-s.OK, s.Sent, s.Errors)
			}
			var got, want []string
			for p := range s.Pods {
				got = append(got, p)
			}
			for p := range wantPods {
				want = append(want, p)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("pods that answered: %v; explain's candidates: %v", got, want)
			}
			// The answers that saw the client's own address must be exactly those of the pods explain
			// says are reached without masquerade (per candidate: a hairpin masquerades one of them).
			wantKept := 0
			for p, n := range s.Pods {
				if !masqPod[p] {
					wantKept += n
				}
			}
			if kept := s.Sources[tc.src.String()]; kept != wantKept {
				t.Errorf("%d answers saw the client source %s, want %d (sources %v, pods %v, masquerade %v)", kept, tc.src, wantKept, s.Sources, s.Pods, masqPod)
			}
		})
	}
}

// exWaitSynced waits until `vipgate status` in node1 reports a sync, and returns that status.
func exWaitSynced(t *testing.T, l *lab.Lab, bin string, proc *lab.Proc) exStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := l.Exec("node1", bin, "status", "--output", "json", "--timeout", "2s")
		if err == nil {
			var st exStatus
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("decoding status: %v\n%s", err, out)
			}
			if st.LastSync != nil {
				return st
			}
		}
		if exited, _ := proc.Exited(); exited {
			t.Fatalf("vipgate node exited:\n%s", proc.Tail(40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("vipgate node did not sync within 30s (last status: %v %s):\n%s", err, out, proc.Tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// exStatus is the part of /status the test reads.
type exStatus struct {
	Node      string
	Table     string
	Services  int
	Endpoints int
	LastSync  *struct{ Full bool }
	Tables    []struct{ Family, Chains int }
}

// exRemoteOnly is an eTP=Local LoadBalancer whose only endpoint is on node2: node1 drops its traffic.
const exRemoteOnly = `apiVersion: v1
kind: Service
metadata: {name: remote-only, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32020
  ports:
    - {name: tcp, port: 80, targetPort: 8080, nodePort: 30090, protocol: TCP}
status:
  loadBalancer:
    ingress:
      - ip: 203.0.113.12
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: remote-only-ipv4
  namespace: demo
  labels: {kubernetes.io/service-name: remote-only}
addressType: IPv4
ports:
  - {name: tcp, port: 8080, protocol: TCP}
endpoints:
  - addresses: ["10.244.2.11"]
    nodeName: node2
    conditions: {ready: true, serving: true, terminating: false}
`
