package conntrack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	ctnetlink "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"

	"github.com/vipgate/vipgate/cluster"
)

var (
	ctA  = netip.MustParseAddr
	ctAP = netip.MustParseAddrPort
)

// ctTuples builds an entry's original and reply tuples: client -> vip, DNATed to endpoint.
func ctTuples(proto uint8, client, vip, endpoint netip.AddrPort) (orig, reply ctnetlink.Tuple) {
	orig.Proto.Protocol, reply.Proto.Protocol = proto, proto
	orig.IP.SourceAddress, orig.Proto.SourcePort = client.Addr(), client.Port()
	orig.IP.DestinationAddress, orig.Proto.DestinationPort = vip.Addr(), vip.Port()
	reply.IP.SourceAddress, reply.Proto.SourcePort = endpoint.Addr(), endpoint.Port()
	reply.IP.DestinationAddress, reply.Proto.DestinationPort = client.Addr(), client.Port()
	return orig, reply
}

func TestStaleFlowMatching(t *testing.T) {
	client := ctAP("10.244.9.9:40000")
	vip := ctAP("10.96.0.10:53")
	ep := ctAP("10.244.1.5:5353")
	cases := []struct {
		name   string
		filter StaleFlow
		proto  uint8
		vip    netip.AddrPort
		ep     netip.AddrPort
		want   bool
	}{
		{"full match", StaleFlow{Proto: 17, OrigDst: vip.Addr(), OrigDstPort: 53, ReplySrc: ep.Addr(), ReplySrcPort: 5353}, 17, vip, ep, true},
		{"other protocol", StaleFlow{Proto: 17, OrigDst: vip.Addr(), OrigDstPort: 53, ReplySrc: ep.Addr()}, 6, vip, ep, false},
		{"other endpoint", StaleFlow{Proto: 17, OrigDst: vip.Addr(), ReplySrc: ctA("10.244.1.6")}, 17, vip, ep, false},
		{"other endpoint port", StaleFlow{Proto: 17, ReplySrc: ep.Addr(), ReplySrcPort: 5354}, 17, vip, ep, false},
		{"other service port", StaleFlow{Proto: 17, OrigDst: vip.Addr(), OrigDstPort: 54}, 17, vip, ep, false},
		{"service IP:port, any endpoint", StaleFlow{Proto: 17, OrigDst: vip.Addr(), OrigDstPort: 53}, 17, vip, ep, true},
		{"NodePort on any address", StaleFlow{Proto: 17, OrigDstPort: 30053, ReplySrc: ep.Addr()}, 17, ctAP("192.0.2.1:30053"), ep, true},
		{"NodePort, other endpoint", StaleFlow{Proto: 17, OrigDstPort: 30053, ReplySrc: ctA("10.244.1.6")}, 17, ctAP("192.0.2.1:30053"), ep, false},
		{"IPv4-mapped filter address", StaleFlow{Proto: 17, ReplySrc: ctA("::ffff:10.244.1.5")}, 17, vip, ep, true},
		{"SCTP", StaleFlow{Proto: 132, ReplySrc: ep.Addr()}, 132, vip, ep, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig, reply := ctTuples(tc.proto, client, tc.vip, tc.ep)
			if got := tc.filter.matches(orig, reply); got != tc.want {
				t.Errorf("%s matches %s: got %v, want %v", tc.filter, orig, got, tc.want)
			}
			// The index must agree with the plain filter.
			if got := newCtFilterIndex([]StaleFlow{tc.filter}).matches(orig, reply); got != tc.want {
				t.Errorf("index of %s matches %s: got %v, want %v", tc.filter, orig, got, tc.want)
			}
		})
	}
}

func TestConntrackServingIndex(t *testing.T) {
	client := ctAP("10.244.9.9:40000")
	ix := newCtServingIndex(map[PortKey]ServicePort{
		{Service: cluster.ServiceKey{Namespace: "a", Name: "dns"}, Port: "dns", Proto: 17}: {
			VIPs: []netip.Addr{ctA("10.96.0.10"), ctA("2001:db8:96::10")}, Port: 53, NodePort: 30053,
			Endpoints: []netip.AddrPort{ctAP("10.244.1.5:5353"), ctAP("[2001:db8:244::5]:5353")},
		},
		// Its port number collides with a's NodePort: its VIP entries are judged by its endpoints only.
		{Service: cluster.ServiceKey{Namespace: "a", Name: "odd"}, Port: "", Proto: 17}: {
			VIPs: []netip.Addr{ctA("10.96.0.11")}, Port: 30053,
			Endpoints: []netip.AddrPort{ctAP("10.244.1.9:30053")},
		},
	})
	cases := []struct {
		name      string
		proto     uint8
		client    netip.AddrPort
		vip, from netip.AddrPort
		want      bool
	}{
		{"serving endpoint", 17, client, ctAP("10.96.0.10:53"), ctAP("10.244.1.5:5353"), false},
		{"gone endpoint", 17, client, ctAP("10.96.0.10:53"), ctAP("10.244.1.6:5353"), true},
		{"endpoint's port changed", 17, client, ctAP("10.96.0.10:53"), ctAP("10.244.1.5:53"), true},
		{"not DNATed", 17, client, ctAP("10.96.0.10:53"), ctAP("10.96.0.10:53"), true},
		{"IPv6 serving", 17, ctAP("[2001:db8:9::9]:1"), ctAP("[2001:db8:96::10]:53"), ctAP("[2001:db8:244::5]:5353"), false},
		{"IPv6 gone", 17, ctAP("[2001:db8:9::9]:1"), ctAP("[2001:db8:96::10]:53"), ctAP("[2001:db8:244::6]:5353"), true},
		{"NodePort on a node address, serving", 17, client, ctAP("192.0.2.1:30053"), ctAP("10.244.1.5:5353"), false},
		{"NodePort, gone endpoint", 17, client, ctAP("192.0.2.1:30053"), ctAP("10.244.1.6:5353"), true},
		{"VIP whose port is a NodePort number", 17, client, ctAP("10.96.0.11:30053"), ctAP("10.244.1.9:30053"), false},
		{"not a Service", 17, client, ctAP("10.96.0.99:53"), ctAP("10.244.1.6:5353"), false},
		{"TCP is left alone", 6, client, ctAP("10.96.0.10:53"), ctAP("10.244.1.6:5353"), false},
		{"other protocol on the port", 132, client, ctAP("10.96.0.10:53"), ctAP("10.244.1.6:5353"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig, reply := ctTuples(tc.proto, tc.client, tc.vip, tc.from)
			if got := ix.stale(orig, reply); got != tc.want {
				t.Errorf("stale(%s, reply from %s) = %v, want %v", orig, tc.from, got, tc.want)
			}
		})
	}
}

func TestStaleFlowValidate(t *testing.T) {
	for _, f := range []StaleFlow{
		{OrigDst: ctA("10.96.0.1")},   // no protocol
		{Proto: 17},                   // every UDP entry
		{Proto: 17, ReplySrcPort: 53}, // every UDP reply from port 53, anywhere
	} {
		if err := f.validate(); err == nil {
			t.Errorf("validate(%s) = nil, want error", f)
		}
	}
}

// TestStaleFlows is the decision on views as the leaf sees them (dataplane's TestStaleFlowsFromStates
// builds them from States).
func TestStaleFlows(t *testing.T) {
	key := PortKey{Service: cluster.ServiceKey{Namespace: "demo", Name: "dns"}, Port: "dns", Proto: 17}
	port := func(eps ...string) map[PortKey]ServicePort {
		p := ServicePort{VIPs: []netip.Addr{ctA("10.96.0.10")}, Port: 53, NodePort: 30053}
		for _, e := range eps {
			p.Endpoints = append(p.Endpoints, ctAP(e))
		}
		return map[PortKey]ServicePort{key: p}
	}
	allTo := []StaleFlow{{Proto: 17, OrigDstPort: 30053}, {Proto: 17, OrigDst: ctA("10.96.0.10"), OrigDstPort: 53}}
	cases := []struct {
		name      string
		prev, cur map[PortKey]ServicePort
		want      []StaleFlow
	}{
		{"nothing changed", port("10.244.1.5:5353"), port("10.244.1.5:5353"), nil},
		{"endpoint removed", port("10.244.1.5:5353", "10.244.1.6:5353"), port("10.244.1.5:5353"), []StaleFlow{
			{Proto: 17, OrigDstPort: 30053, ReplySrc: ctA("10.244.1.6"), ReplySrcPort: 5353},
			{Proto: 17, OrigDst: ctA("10.96.0.10"), OrigDstPort: 53, ReplySrc: ctA("10.244.1.6"), ReplySrcPort: 5353},
		}},
		{"zero to some endpoints", port(), port("10.244.1.5:5353"), allTo},
		{"first sync after start", nil, port("10.244.1.5:5353"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := StaleFlows(tc.prev, tc.cur)
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("StaleFlows (-want +got):\n%s", diff)
			}
		})
	}
}

// ctNetns is a network namespace created for one test, with a locked OS thread inside it that runs
// whatever must be created in the namespace (netlink and UDP sockets keep their namespace afterwards).
type ctNetns struct {
	name  string
	calls chan func()
	done  chan struct{}
}

func ctNewNetns(t *testing.T) *ctNetns {
	t.Helper()
	n := &ctNetns{name: fmt.Sprintf("vgt%d-ct", os.Getpid()), calls: make(chan func()), done: make(chan struct{})}
	ready := make(chan error)
	go func() {
		defer close(n.done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ready <- fmt.Errorf("getting current netns: %w", err)
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(n.name) // also moves this thread into it
		if err != nil {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			} // else the thread stays locked and exits with this goroutine, never reused
			ready <- fmt.Errorf("creating netns %s: %w", n.name, err)
			return
		}
		_ = ns.Close()
		ready <- nil
		for fn := range n.calls {
			fn()
		}
		if err := netns.Set(orig); err != nil {
			return // leave the thread locked: Go discards it when the goroutine exits
		}
		runtime.UnlockOSThread()
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(n.calls)
		<-n.done
		if err := netns.DeleteNamed(n.name); err != nil {
			t.Errorf("deleting netns %s: %v", n.name, err)
		}
	})
	return n
}

// do runs fn on the thread inside the namespace and waits for it.
func (n *ctNetns) do(fn func()) {
	finished := make(chan struct{})
	n.calls <- func() { defer close(finished); fn() }
	<-finished
}

// sh runs a command inside the namespace (setup only: addresses, routes and a DNAT rule).
func (n *ctNetns) sh(t *testing.T, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.name}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// ctKey is an entry's identity for comparing table contents.
type ctKey struct {
	Proto       uint8
	Client, VIP netip.AddrPort
	ReplySrc    netip.AddrPort
}

func (k ctKey) String() string {
	return fmt.Sprintf("%d %s->%s reply-src %s", k.Proto, k.Client, k.VIP, k.ReplySrc)
}

func ctDumpKeys(t *testing.T, conn *ctnetlink.Conn) []string {
	t.Helper()
	flows, err := conn.Dump(nil)
	if err != nil {
		t.Fatalf("dumping conntrack: %v", err)
	}
	var keys []string
	for _, f := range flows {
		keys = append(keys, ctKey{
			Proto:    f.TupleOrig.Proto.Protocol,
			Client:   netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort),
			VIP:      netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort),
			ReplySrc: netip.AddrPortFrom(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort),
		}.String())
	}
	slices.Sort(keys)
	return keys
}

// ctCreate creates a DNATed-looking entry client -> vip with replies from endpoint.
func ctCreate(t *testing.T, conn *ctnetlink.Conn, k ctKey) {
	t.Helper()
	f := ctnetlink.NewFlow(k.Proto, 0, k.Client.Addr(), k.VIP.Addr(), k.Client.Port(), k.VIP.Port(), 300, 0)
	f.TupleReply.IP.SourceAddress = k.ReplySrc.Addr()
	f.TupleReply.Proto.SourcePort = k.ReplySrc.Port()
	if err := conn.Create(f); err != nil {
		t.Fatalf("creating conntrack entry %s: %v", k, err)
	}
}

// ctUDPExchange sends one datagram from client to vip and waits for the echo, so the kernel creates
// a real (DNATed) conntrack entry.
func ctUDPExchange(t *testing.T, n *ctNetns, client, vip, endpoint netip.AddrPort) {
	t.Helper()
	var srv, cli *net.UDPConn
	var err error
	n.do(func() {
		if srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(endpoint)); err != nil {
			return
		}
		cli, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(client), net.UDPAddrFromAddrPort(vip))
	})
	if err != nil {
		t.Fatalf("opening UDP sockets: %v", err)
	}
	defer srv.Close()
	defer cli.Close()
	go func() {
		buf := make([]byte, 64)
		_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if m, from, err := srv.ReadFromUDPAddrPort(buf); err == nil {
			_, _ = srv.WriteToUDPAddrPort(buf[:m], from)
		}
	}()
	if _, err := cli.Write([]byte("ping")); err != nil {
		t.Fatalf("sending to %s: %v", vip, err)
	}
	_ = cli.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if _, err := cli.Read(buf); err != nil {
		t.Fatalf("no echo from %s via %s: %v", endpoint, vip, err)
	}
}

func TestConntrackCleanerInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	n := ctNewNetns(t)

	// A DNAT like the dataplane's: Service 10.96.0.10:53 / [2001:db8:96::10]:53 -> endpoint :5353 on lo.
	n.sh(t, "", "ip", "link", "set", "lo", "up")
	for _, a := range []string{"10.244.1.1/32", "10.244.1.2/32"} {
		n.sh(t, "", "ip", "addr", "add", a, "dev", "lo")
	}
	for _, a := range []string{"2001:db8:244::1/128", "2001:db8:244::2/128"} {
		n.sh(t, "", "ip", "addr", "add", a, "dev", "lo", "nodad")
	}
	n.sh(t, "", "ip", "route", "add", "10.96.0.0/16", "dev", "lo")
	n.sh(t, "", "ip", "-6", "route", "add", "2001:db8:96::/64", "dev", "lo")
	n.sh(t, `table inet vgtest {
	chain out {
		type nat hook output priority -100;
		ip daddr 10.96.0.10 udp dport 53 dnat ip to 10.244.1.1:5353
		ip6 daddr 2001:db8:96::10 udp dport 53 dnat ip6 to [2001:db8:244::1]:5353
	}
}
`, "nft", "-f", "-")

	var conn *ctnetlink.Conn
	var cleaner Cleaner
	var err error
	n.do(func() {
		if conn, err = ctnetlink.Dial(nil); err != nil {
			return
		}
		cleaner, err = NewCleaner(hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: io.Discard}))
	})
	if err != nil {
		t.Fatalf("opening conntrack in netns: %v", err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		_ = cleaner.(io.Closer).Close()
	})

	// Real entries through the DNAT rule.
	ctUDPExchange(t, n, ctAP("10.244.1.2:40000"), ctAP("10.96.0.10:53"), ctAP("10.244.1.1:5353"))
	ctUDPExchange(t, n, ctAP("10.244.1.2:40001"), ctAP("10.96.0.10:53"), ctAP("10.244.1.1:5353"))
	ctUDPExchange(t, n, ctAP("[2001:db8:244::2]:40000"), ctAP("[2001:db8:96::10]:53"), ctAP("[2001:db8:244::1]:5353"))

	// Entries made with ctnetlink, for cases lo cannot produce (NodePort from outside, other protocols).
	kept := []ctKey{
		{17, ctAP("10.244.9.9:40010"), ctAP("10.96.0.20:53"), ctAP("10.244.3.8:5353")},                    // other endpoint
		{6, ctAP("10.244.9.9:40000"), ctAP("10.96.0.20:53"), ctAP("10.244.3.7:5353")},                     // TCP
		{17, ctAP("198.51.100.9:40011"), ctAP("192.0.2.10:30054"), ctAP("10.244.3.7:5353")},               // other NodePort
		{17, ctAP("[2001:db8:9::9]:40010"), ctAP("[2001:db8:96::20]:53"), ctAP("[2001:db8:244::8]:5353")}, // other v6 endpoint
		{17, ctAP("10.244.9.9:40002"), ctAP("10.96.0.30:124"), ctAP("10.96.0.30:124")},                    // other port of a zero-endpoint Service
	}
	stale := []ctKey{
		{17, ctAP("10.244.9.9:40000"), ctAP("10.96.0.20:53"), ctAP("10.244.3.7:5353")},                    // ClusterIP -> gone endpoint
		{17, ctAP("198.51.100.9:40001"), ctAP("192.0.2.10:30053"), ctAP("10.244.3.7:5353")},               // NodePort -> gone endpoint
		{17, ctAP("198.51.100.9:40002"), ctAP("198.51.100.77:30053"), ctAP("10.244.3.7:5353")},            // NodePort, another node address
		{17, ctAP("[2001:db8:9::9]:40000"), ctAP("[2001:db8:96::20]:53"), ctAP("[2001:db8:244::7]:5353")}, // v6 -> gone endpoint
		{132, ctAP("10.244.9.9:40000"), ctAP("10.96.0.40:9999"), ctAP("10.244.3.7:9999")},                 // SCTP
		{17, ctAP("10.244.9.9:40002"), ctAP("10.96.0.30:123"), ctAP("10.96.0.30:123")},                    // zero endpoints, not NATed
		{17, ctAP("10.244.9.9:40003"), ctAP("10.96.0.30:123"), ctAP("10.244.3.9:123")},                    // zero endpoints, NATed
	}
	for _, k := range slices.Concat(kept, stale) {
		ctCreate(t, conn, k)
	}
	realV4 := []string{
		ctKey{17, ctAP("10.244.1.2:40000"), ctAP("10.96.0.10:53"), ctAP("10.244.1.1:5353")}.String(),
		ctKey{17, ctAP("10.244.1.2:40001"), ctAP("10.96.0.10:53"), ctAP("10.244.1.1:5353")}.String(),
	}
	realV6 := ctKey{17, ctAP("[2001:db8:244::2]:40000"), ctAP("[2001:db8:96::10]:53"), ctAP("[2001:db8:244::1]:5353")}.String()
	before := ctDumpKeys(t, conn)
	for _, k := range slices.Concat(realV4, []string{realV6}) {
		if !slices.Contains(before, k) {
			t.Fatalf("the UDP exchange left no entry %q; table:\n%s", k, strings.Join(before, "\n"))
		}
	}

	filters := []StaleFlow{
		{Proto: 17, OrigDst: ctA("10.96.0.10"), OrigDstPort: 53, ReplySrc: ctA("10.244.1.1"), ReplySrcPort: 5353},
		{Proto: 17, OrigDst: ctA("10.96.0.20"), OrigDstPort: 53, ReplySrc: ctA("10.244.3.7"), ReplySrcPort: 5353},
		{Proto: 17, OrigDstPort: 30053, ReplySrc: ctA("10.244.3.7"), ReplySrcPort: 5353},
		{Proto: 17, OrigDst: ctA("2001:db8:96::20"), OrigDstPort: 53, ReplySrc: ctA("2001:db8:244::7")},
		{Proto: 132, OrigDst: ctA("10.96.0.40"), OrigDstPort: 9999, ReplySrc: ctA("10.244.3.7"), ReplySrcPort: 9999},
		{Proto: 17, OrigDst: ctA("10.96.0.30"), OrigDstPort: 123},
		// Matches nothing: a filter for an entry that already expired.
		{Proto: 17, OrigDst: ctA("10.96.0.99"), OrigDstPort: 53, ReplySrc: ctA("10.244.3.99")},
	}
	deleted, err := cleaner.Delete(filters)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantDeleted := len(stale) + len(realV4)
	if deleted != wantDeleted {
		t.Errorf("Delete removed %d entries, want %d", deleted, wantDeleted)
	}
	var want []string
	for _, k := range kept {
		want = append(want, k.String())
	}
	want = append(want, realV6)
	slices.Sort(want)
	if diff := cmp.Diff(want, ctDumpKeys(t, conn)); diff != "" {
		t.Errorf("table after Delete (-want +got):\n%s", diff)
	}

	// Deleting again finds nothing, without error; an over-broad filter is refused outright.
	if deleted, err := cleaner.Delete(filters); err != nil || deleted != 0 {
		t.Errorf("second Delete = %d, %v; want 0, nil", deleted, err)
	}
	if _, err := cleaner.Delete([]StaleFlow{{Proto: 17}}); err == nil {
		t.Errorf("Delete of every UDP entry: got nil error")
	}
	if diff := cmp.Diff(want, ctDumpKeys(t, conn)); diff != "" {
		t.Errorf("table after refused Delete (-want +got):\n%s", diff)
	}

	t.Run("reconcile", func(t *testing.T) {
		// Made before the Service had rules: not DNATed, would bypass the endpoints forever.
		unNATed := ctKey{17, ctAP("10.244.9.9:40020"), ctAP("10.96.0.20:53"), ctAP("10.96.0.20:53")}
		ctCreate(t, conn, unNATed)
		view := map[PortKey]ServicePort{
			{Service: cluster.ServiceKey{Namespace: "demo", Name: "dns"}, Port: "dns", Proto: 17}: {
				VIPs: []netip.Addr{ctA("10.96.0.20"), ctA("2001:db8:96::20")}, Port: 53, NodePort: 30054,
				Endpoints: []netip.AddrPort{ctAP("10.244.3.8:5353"), ctAP("[2001:db8:244::8]:5353")},
			},
			{Service: cluster.ServiceKey{Namespace: "demo", Name: "v6"}, Port: "", Proto: 17}: {
				VIPs: []netip.Addr{ctA("2001:db8:96::10")}, Port: 53,
				Endpoints: []netip.AddrPort{ctAP("[2001:db8:244::9]:5353")},
			},
		}
		deleted, err := cleaner.(Reconciler).Reconcile(view)
		if err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		gone := []string{
			unNATed.String(),
			kept[2].String(), // NodePort 30054 answered by 10.244.3.7, not an endpoint
			realV6,           // endpoint [2001:db8:244::1]:5353 is not in the view
		}
		if deleted != len(gone) {
			t.Errorf("Reconcile deleted %d, want %d", deleted, len(gone))
		}
		var want []string
		for _, k := range slices.Concat(kept[:2], kept[3:]) {
			want = append(want, k.String())
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, ctDumpKeys(t, conn)); diff != "" {
			t.Errorf("table after Reconcile (-want +got):\n%s", diff)
		}
	})
	t.Run("stale entry outlives the rule until cleaned", func(t *testing.T) { ctBlackhole(t, n, cleaner) })
	t.Run("scale", func(t *testing.T) { ctScale(t, conn, cleaner) })
}

// ctEchoServer answers every datagram on addr with tag until closed.
func ctEchoServer(t *testing.T, n *ctNetns, addr netip.AddrPort, tag string) *net.UDPConn {
	t.Helper()
	var srv *net.UDPConn
	var err error
	n.do(func() { srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr)) })
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			_, _ = srv.WriteToUDPAddrPort([]byte(tag), from)
		}
	}()
	return srv
}

// ctAsk sends one datagram on cli and returns the answer.
func ctAsk(t *testing.T, cli *net.UDPConn) string {
	t.Helper()
	if _, err := cli.Write([]byte("?")); err != nil {
		t.Fatalf("sending: %v", err)
	}
	_ = cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	m, err := cli.Read(buf)
	if err != nil {
		return "no answer: " + err.Error()
	}
	return string(buf[:m])
}

// ctBlackhole shows the failure the cleaner exists for, in the kernel: after the Service's rule moves
// to a new endpoint, a UDP client that keeps its source port still reaches the old endpoint through
// its conntrack entry; once the entry StaleFlows picks is deleted, it reaches the new one.
func ctBlackhole(t *testing.T, n *ctNetns, cleaner Cleaner) {
	n.sh(t, "", "ip", "addr", "add", "10.244.1.3/32", "dev", "lo")
	oldEP, newEP := ctEchoServer(t, n, ctAP("10.244.1.1:5353"), "old"), ctEchoServer(t, n, ctAP("10.244.1.3:5353"), "new")
	defer oldEP.Close()
	defer newEP.Close()
	var cli *net.UDPConn
	var err error
	n.do(func() {
		cli, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(ctAP("10.244.1.2:40100")), net.UDPAddrFromAddrPort(ctAP("10.96.0.10:53")))
	})
	if err != nil {
		t.Fatalf("dialing: %v", err)
	}
	defer cli.Close()

	if got := ctAsk(t, cli); got != "old" {
		t.Fatalf("first answer %q, want old", got)
	}
	// The dataplane moves the Service to the new endpoint.
	n.sh(t, `flush chain inet vgtest out
add rule inet vgtest out ip daddr 10.96.0.10 udp dport 53 dnat ip to 10.244.1.3:5353
`, "nft", "-f", "-")
	if got := ctAsk(t, cli); got != "old" {
		t.Fatalf("answer after the rule change %q, want old (the conntrack entry still points there)", got)
	}

	key := PortKey{Service: cluster.ServiceKey{Namespace: "demo", Name: "dns"}, Port: "dns", Proto: 17}
	prev := map[PortKey]ServicePort{key: {VIPs: []netip.Addr{ctA("10.96.0.10")}, Port: 53, Endpoints: []netip.AddrPort{ctAP("10.244.1.1:5353")}}}
	cur := map[PortKey]ServicePort{key: {VIPs: []netip.Addr{ctA("10.96.0.10")}, Port: 53, Endpoints: []netip.AddrPort{ctAP("10.244.1.3:5353")}}}
	filters := StaleFlows(prev, cur)
	deleted, err := cleaner.Delete(filters)
	if err != nil || deleted != 1 {
		t.Fatalf("Delete(%v) = %d, %v; want 1, nil", filters, deleted, err)
	}
	if got := ctAsk(t, cli); got != "new" {
		t.Errorf("answer after cleanup %q, want new", got)
	}
}

// ctScale measures one Delete against a large table: 20000 unrelated entries and 2000 stale ones
// behind 200 filters (a Service losing 200 endpoints).
func ctScale(t *testing.T, conn *ctnetlink.Conn, cleaner Cleaner) {
	if testing.Short() {
		t.Skip("short")
	}
	const unrelated, endpoints, perEndpoint = 20000, 200, 10
	start := time.Now()
	for i := range unrelated {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 100 + byte(i/60000), byte(i / 250 % 240)}), uint16(1024+i%250))
		ctCreate(t, conn, ctKey{17, client, ctAP("10.96.1.1:53"), ctAP("10.244.50.1:5353")})
	}
	var filters []StaleFlow
	for e := range endpoints {
		ep := netip.AddrFrom4([4]byte{10, 244, 60, byte(e)})
		filters = append(filters, StaleFlow{Proto: 17, OrigDst: ctA("10.96.2.2"), OrigDstPort: 53, ReplySrc: ep, ReplySrcPort: 5353})
		for c := range perEndpoint {
			client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 70, byte(e)}), uint16(2000+c))
			ctCreate(t, conn, ctKey{17, client, ctAP("10.96.2.2:53"), netip.AddrPortFrom(ep, 5353)})
		}
	}
	t.Logf("created %d entries in %v", unrelated+endpoints*perEndpoint, time.Since(start))

	all, err := conn.Dump(nil)
	if err != nil {
		t.Fatalf("dumping: %v", err)
	}
	total := len(all)

	start = time.Now()
	deleted, err := cleaner.Delete(filters)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if deleted != endpoints*perEndpoint {
		t.Errorf("deleted %d, want %d", deleted, endpoints*perEndpoint)
	}
	t.Logf("Delete: %d filters over %d entries, %d deleted in %v", len(filters), total, deleted, elapsed)

	start = time.Now()
	if _, err := cleaner.Delete(filters); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	t.Logf("Delete with nothing to delete (dump + match only) over %d entries: %v", total-deleted, time.Since(start))
	if err := conn.Flush(); err != nil && !errors.Is(err, io.EOF) {
		t.Errorf("flushing: %v", err)
	}
}
