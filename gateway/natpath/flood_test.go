package natpath

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFloodKeepsEstablished is issue #27's acceptance test, with real connections and packets:
// 1,000 established TCP connections through the program (half direct, half masqueraded) in a flow
// table of 2,048 entries, then a SYN flood of 10x the table (20,480 SYNs, every source port a new
// flow, many of whose first masquerade candidates are an established flow's port) from a flooder
// on another interface of the gateway. Afterwards every connection still works and every server
// answer reaches its own client: each server stream carries the id its client sent. Before, the
// flood evicted the established flows from the (LRU) table: their packets went to the stack,
// which had no NAT for them, and a masquerade port freed that way went to a flooder's flow with
// the server's data.
func TestFloodKeepsEstablished(t *testing.T) {
	const conns, tableSize = 1000, 2048
	l := newTestLab(t)
	flooder := addFlooder(t, l)
	// The servers: the first line is the client's id; each later line is answered with a line of
	// that id, 100 times.
	serve := func(c net.Conn) {
		br := bufio.NewReader(c)
		id, err := br.ReadString('\n')
		if err != nil {
			return
		}
		answer := []byte(strings.Repeat(strings.TrimSpace(id)+",", 100) + "\n")
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	}
	tcpListen(t, l.backend, netip.AddrPortFrom(podsV4[0], 8080), serve)
	tcpListen(t, l.backend, netip.AddrPortFrom(netip.IPv4Unspecified(), 30080), serve)
	p := l.load(t, Config{FlowEntries: tableSize})
	if err := in(l.gw, func() error {
		f0, err := net.InterfaceByName("f0")
		if err != nil {
			return err
		}
		return p.Attach(append(gwIndexes(), f0.Index))
	}); err != nil {
		t.Fatal(err)
	}
	direct, masq := netip.AddrPortFrom(vipV4, 80), netip.AddrPortFrom(vipV4, 81)
	if err := p.Sync([]VIPPort{
		{VIP: vipV4, Proto: 6, Port: 80, Table: []netip.AddrPort{netip.AddrPortFrom(podsV4[0], 8080)}},
		{VIP: vipV4, Proto: 6, Port: 81, SNAT: true, Table: []netip.AddrPort{netip.AddrPortFrom(nodeV4, 30080)}},
	}); err != nil {
		t.Fatal(err)
	}
	type conn struct {
		c  *net.TCPConn
		br *bufio.Reader
		id string
	}
	cs := make([]conn, conns)
	ask := func(c conn) error {
		_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.c.Write([]byte("ping\n")); err != nil {
			return err
		}
		line, err := c.br.ReadString('\n')
		if err != nil {
			return err
		}
		for _, got := range strings.Split(strings.TrimSuffix(line, ",\n"), ",") {
			if got != c.id {
				return fmt.Errorf("the server's answer carries id %q: another client's stream", got)
			}
		}
		return nil
	}
	for i := range cs {
		dst := direct
		if i%2 == 1 {
			dst = masq
		}
		c := dialTCP(t, l.client, dst)
		defer c.Close()
		cs[i] = conn{c, bufio.NewReader(c), fmt.Sprintf("client-%d", i)}
		if _, err := c.Write([]byte(cs[i].id + "\n")); err != nil {
			t.Fatal(err)
		}
		if err := ask(cs[i]); err != nil {
			t.Fatalf("connection %d before the flood: %v", i, err)
		}
	}
	flows, err := p.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	est := 0
	for _, f := range flows {
		if !f.Unconfirmed {
			est++
		}
	}
	if est != 2*conns {
		t.Errorf("%d established entries, want the %d connections' %d", est, conns, 2*conns)
	}

	before, _ := p.Counters()
	sent := synFlood(t, flooder, netip.MustParseAddr("203.0.113.200"), []netip.AddrPort{direct, masq}, 10*tableSize)
	time.Sleep(time.Second) // the SYN-ACKs and the flooder's RSTs
	after, _ := p.Counters()
	t.Logf("%d SYNs sent; counters during the flood: new %d, snat_full %d, full %d, no_syn %d, forwarded %d, replies %d",
		sent, after.New-before.New, after.SNATFull-before.SNATFull, after.Full-before.Full, after.NoSYN-before.NoSYN,
		after.Forwarded-before.Forwarded, after.Replies-before.Replies)
	if after.New-before.New < uint64(sent)/2 {
		t.Errorf("only %d of the %d flood SYNs taken as new flows: the flood did not reach the table", after.New-before.New, sent)
	}

	broken, wrong := 0, 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range cs {
		wg.Go(func() {
			err := ask(cs[i])
			if err == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(err.Error(), "another client's") {
				wrong++
			} else {
				broken++
			}
			if broken+wrong <= 5 {
				t.Errorf("connection %d (%s) after the flood: %v", i, cs[i].c.RemoteAddr(), err)
			}
		})
	}
	wg.Wait()
	if broken != 0 || wrong != 0 {
		t.Errorf("after the flood: %d of %d connections broken, %d received another client's stream", broken, conns, wrong)
	}
}

// addFlooder adds a namespace on a third interface of the lab's gateway (f0, 203.0.113.193/26;
// the flooder 203.0.113.200/26, its default route via the gateway) and returns its name; the
// backend routes that subnet via the gateway.
func addFlooder(t *testing.T, l *testLab) string {
	t.Helper()
	ns := fmt.Sprintf("vgt%d-np%d-f", os.Getpid(), labSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for _, c := range []struct {
		ns   string
		cmds []string
	}{
		{l.gw, []string{"link add f0 type veth peer name eth0 netns " + ns, "addr add 203.0.113.193/26 dev f0", "link set f0 up"}},
		{ns, []string{"addr add 203.0.113.200/26 dev eth0", "link set eth0 up", "link set lo up", "route add default via 203.0.113.193"}},
		{l.backend, []string{"route add 203.0.113.192/26 via 192.0.2.1"}},
	} {
		cmd := exec.Command("ip", "-n", c.ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(strings.Join(c.cmds, "\n") + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("netns %s: ip -batch: %v: %s", c.ns, err, out)
		}
	}
	return ns
}

// synFlood sends n TCP SYNs from src (source ports 1024 up, one new flow each) to the targets in
// turn, from namespace ns through a raw socket, and returns how many it sent.
func synFlood(t *testing.T, ns string, src netip.Addr, targets []netip.AddrPort, n int) int {
	t.Helper()
	sent := 0
	err := in(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for i := range n {
			dst := targets[i%len(targets)]
			pkt := frame(pktSpec{src: netip.AddrPortFrom(src, uint16(1024+i)), dst: dst, proto: 6, tcpFlags: 0x02,
				seq: uint32(i) * 7919, window: 64240})[14:]
			binary.BigEndian.PutUint16(pkt[4:], uint16(i)) // IP id
			pkt[10], pkt[11] = 0, 0
			binary.BigEndian.PutUint16(pkt[10:], ^sum16(pkt[:20], 0))
			if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
				return fmt.Errorf("SYN %d: %w", i, err)
			}
			sent++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sent
}
