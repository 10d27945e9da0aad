package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/netlink"
	ctnetlink "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
)

// dfService is a UDP (and TCP) LoadBalancer Service with a cluster IP, an external IP, a
// LoadBalancer IP and a NodePort, and one endpoint.
func dfService(name, clusterIP, extIP, lbIP, endpoint string, nodePort uint16) (*cluster.Service, *cluster.EndpointSlice) {
	key := cluster.ServiceKey{Namespace: "df", Name: name}
	svc := &cluster.Service{Key: key, Type: cluster.TypeLoadBalancer, ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53, NodePort: nodePort},
			{Name: "dns-tcp", Protocol: cluster.TCP, Port: 53, NodePort: nodePort}}}
	if extIP != "" {
		svc.ExternalIPs = []netip.Addr{netip.MustParseAddr(extIP)}
	}
	if lbIP != "" {
		svc.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(lbIP)}
	}
	es := &cluster.EndpointSlice{Namespace: "df", Name: name + "-1", Service: key, Family: cluster.IPv4,
		Ports:     []cluster.EndpointPort{{Name: "dns", Protocol: cluster.UDP, Port: 5353}, {Name: "dns-tcp", Protocol: cluster.TCP, Port: 5353}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr(endpoint)}, Ready: true, Serving: true, NodeName: "node1"}}}
	return svc, es
}

func dfState(svcs ...any) *cluster.State {
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{}}
	for i := 0; i < len(svcs); i += 2 {
		svc, es := svcs[i].(*cluster.Service), svcs[i+1].(*cluster.EndpointSlice)
		st.Services[svc.Key] = svc
		st.EndpointSlices[svc.Key] = []*cluster.EndpointSlice{es}
	}
	return st
}

// dfAddrFlows are the flows of fs that name a destination address (the frontend flows of
// deletedFlows), as "proto addr:port", sorted.
func dfAddrFlows(fs []conntrack.StaleFlow) []string {
	var out []string
	for _, f := range fs {
		if f.OrigDst.IsValid() && !f.ReplySrc.IsValid() {
			out = append(out, fmt.Sprintf("%d %s", f.Proto, netip.AddrPortFrom(f.OrigDst, f.OrigDstPort)))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestDeletedFlows: the conntrack flows a sync reports when a Service goes away (kubernetes#141371,
// Kubernetes 1.38): every UDP entry to its cluster IP, external IP and LoadBalancer IP on its port,
// not its NodePort, not TCP; likewise a port the Service drops, not an address it drops from a port
// it keeps. A Service deleted while syncs failed is found by the full sync that follows.
func TestDeletedFlows(t *testing.T) {
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	fail := &failingProgrammer{}
	p := NewProxier(hclog.NewNullLogger(), cfg, fail)
	dns, dnsEps := dfService("dns", "10.96.0.10", "203.0.113.53", "203.0.113.54", "10.244.1.1", 30053)
	other, otherEps := dfService("other", "10.96.0.11", "", "", "10.244.2.2", 30054)
	sync := func(st *cluster.State) *dataplane.SyncReport {
		t.Helper()
		rep, err := p.Sync(st)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	sync(dfState(dns, dnsEps, other, otherEps))

	rep := sync(dfState(other, otherEps))
	want := []string{"17 10.96.0.10:53", "17 203.0.113.53:53", "17 203.0.113.54:53"}
	if diff := cmp.Diff(want, dfAddrFlows(rep.StaleFlows)); diff != "" {
		t.Errorf("Service deleted: frontend flows (-want +got):\n%s", diff)
	}
	for _, f := range rep.StaleFlows {
		if !f.OrigDst.IsValid() && !f.ReplySrc.IsValid() {
			t.Errorf("a flow by port alone (%v): a NodePort's entries are not the Service's alone", f)
		}
	}

	// A port dropped from a living Service: its addresses on that port; an address dropped from a
	// port the Service keeps is not (kube-proxy's reconciler does not see it either).
	sync(dfState(dns, dnsEps, other, otherEps))
	fewer := *dns
	fewer.Ports = dns.Ports[1:] // UDP 53 gone
	fewer.ExternalIPs = nil
	rep = sync(dfState(&fewer, dnsEps, other, otherEps))
	if diff := cmp.Diff(want, dfAddrFlows(rep.StaleFlows)); diff != "" {
		t.Errorf("UDP port dropped: frontend flows (-want +got):\n%s", diff)
	}
	sync(dfState(dns, dnsEps, other, otherEps))
	noExt := *dns
	noExt.ExternalIPs = nil
	if got := dfAddrFlows(sync(dfState(&noExt, dnsEps, other, otherEps)).StaleFlows); len(got) != 0 {
		t.Errorf("external IP dropped, port kept: frontend flows %v, want none", got)
	}

	// Deleted while the kernel refused the syncs: the full sync that follows still reports it.
	sync(dfState(dns, dnsEps, other, otherEps))
	fail.fail = true
	if _, err := p.Sync(dfState(other, otherEps)); err == nil {
		t.Fatal("the failing programmer did not fail")
	}
	fail.fail = false
	rep = sync(dfState(other, otherEps))
	if !rep.Full {
		t.Fatal("the sync after a failure is not full")
	}
	if diff := cmp.Diff(want, dfAddrFlows(rep.StaleFlows)); diff != "" {
		t.Errorf("deleted during a failure, full sync: frontend flows (-want +got):\n%s", diff)
	}
}

// failingProgrammer accepts every transaction, or refuses every one while fail is set.
type failingProgrammer struct{ fail bool }

func (f *failingProgrammer) Apply(*dataplane.Tx) error {
	if f.fail {
		return errors.New("refused")
	}
	return nil
}

// dfCT is one conntrack entry: protocol, client, original destination, reply source.
type dfCT struct {
	proto                  uint8
	client, dst, replyFrom string
}

func (k dfCT) String() string {
	return fmt.Sprintf("%d %s -> %s (reply from %s)", k.proto, k.client, k.dst, k.replyFrom)
}

// TestDeletedServiceConntrackInNetns: real conntrack entries in a throwaway network namespace
// whose rules the Proxier programs; deleting the Service deletes (SyncReport.StaleFlows through the
// ctnetlink cleaner, as the node's runtime does) every UDP entry to its cluster IP, external IP and
// LoadBalancer IP, whoever answered it: also one DNATed to an endpoint that left long ago, and one
// made before its rules existed (not NATed). The entries of another Service, TCP, and a flow to the
// NodePort's number on another host stay.
func TestDeletedServiceConntrackInNetns(t *testing.T) {
	_, fd := testNetns(t)
	cfg := testConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	p := NewProxier(hclog.NewNullLogger(), cfg, &dataplane.NetlinkProgrammer{NetNSFd: fd})
	dns, dnsEps := dfService("dns", "10.96.0.10", "203.0.113.53", "203.0.113.54", "10.244.1.1", 30053)
	other, otherEps := dfService("other", "10.96.0.11", "", "", "10.244.2.2", 30054)
	if _, err := p.Sync(dfState(dns, dnsEps, other, otherEps)); err != nil {
		t.Fatal(err)
	}

	conn, err := ctnetlink.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatalf("conntrack in the netns: %v", err)
	}
	defer conn.Close()
	cleaner := dfCleanerIn(t, fd)
	stale := []dfCT{
		{17, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.1:5353"},      // its endpoint
		{17, "10.244.9.9:40001", "10.96.0.10:53", "10.244.3.7:5353"},      // an endpoint gone long ago
		{17, "198.51.100.9:40000", "203.0.113.53:53", "203.0.113.53:53"},  // external IP, before the rules (not NATed)
		{17, "198.51.100.9:40001", "203.0.113.54:53", "10.244.3.7:5353"},  // LoadBalancer IP
		{17, "198.51.100.9:40002", "192.0.2.11:30053", "10.244.1.1:5353"}, // its NodePort, to its endpoint
	}
	kept := []dfCT{
		{17, "10.244.9.9:40002", "10.96.0.11:53", "10.244.2.2:5353"},             // the other Service
		{6, "10.244.9.9:40003", "10.96.0.10:53", "10.244.3.7:5353"},              // TCP
		{17, "198.51.100.9:40003", "198.51.100.77:30053", "198.51.100.77:30053"}, // port 30053 of another host, through this node
	}
	for _, k := range slices.Concat(stale, kept) {
		f := ctnetlink.NewFlow(k.proto, 0, netip.MustParseAddrPort(k.client).Addr(), netip.MustParseAddrPort(k.dst).Addr(),
			netip.MustParseAddrPort(k.client).Port(), netip.MustParseAddrPort(k.dst).Port(), 300, 0)
		f.TupleReply.IP.SourceAddress = netip.MustParseAddrPort(k.replyFrom).Addr()
		f.TupleReply.Proto.SourcePort = netip.MustParseAddrPort(k.replyFrom).Port()
		if err := conn.Create(f); err != nil {
			t.Fatalf("creating conntrack entry %s: %v", k, err)
		}
	}

	rep, err := p.Sync(dfState(other, otherEps))
	if err != nil {
		t.Fatal(err)
	}
	n, err := cleaner.Delete(rep.StaleFlows)
	if err != nil {
		t.Fatal(err)
	}
	flows, err := conn.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range flows {
		got = append(got, dfCT{f.TupleOrig.Proto.Protocol,
			netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort).String(),
			netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort).String(),
			netip.AddrPortFrom(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort).String()}.String())
	}
	var want []string
	for _, k := range kept {
		want = append(want, k.String())
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("conntrack after the Service's deletion (-want +got):\n%s\nflows: %v", diff, rep.StaleFlows)
	}
	if n != len(stale) {
		t.Errorf("deleted %d entries, want %d", n, len(stale))
	}
}

// dfCleanerIn opens the node's conntrack cleaner (conntrack.NewCleaner) in the namespace fd: the
// socket stays there whichever thread uses it later.
func dfCleanerIn(t *testing.T, fd int) conntrack.Cleaner {
	t.Helper()
	type result struct {
		c   conntrack.Cleaner
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// If switching back fails, the goroutine ends still locked and Go retires the thread.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		c, cerr := conntrack.NewCleaner(hclog.NewNullLogger())
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("leaving the netns: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, cerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("conntrack cleaner in the netns: %v", r.err)
	}
	t.Cleanup(func() {
		if c, ok := r.c.(io.Closer); ok {
			_ = c.Close()
		}
	})
	return r.c
}
