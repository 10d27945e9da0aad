package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// The known-flow rule, run by every packet of a route gateway's established flows, loads each value
// once: one flow key (one hash for IPv6) for both the lookup and the timeout refresh, and the node
// id the lookup found is the gateway-conns key's last register and the refresh's data.
func TestGatewayFlowRecallEncoding(t *testing.T) {
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		e := &encoder{f: f, t: &nftables.Table{Name: "vipgate", Family: tableFamily(f)}, sets: map[string]*nftables.Set{},
			kinds: map[string]*Set{}, chains: map[string]*nftables.Chain{}}
		// The connection table's maps as the gateway declares them (gateway/conntable.go).
		conntable := []*Set{
			{Name: MapGatewayRouteIDs, Kind: KindTupleMark}, {Name: MapGatewayPrevIDs, Kind: KindTupleMark},
			{Name: MapGatewayConns, Kind: KindTupleAddr}, {Name: MapGatewayFlows, Kind: KindGatewayFlows, Timeout: time.Hour},
		}
		for _, s := range append(conntable, &Set{Name: MapGatewayRoutes, Kind: KindTupleAddr}) {
			e.kinds[s.Name] = s
		}
		xs, err := e.action(Action{Kind: ActFlowRecall, Set: MapGatewayFlows, Conns: MapGatewayConns})
		if err != nil {
			t.Fatalf("%v: %v", f, err)
		}
		var hashes, loads int
		var lookups []*expr.Lookup
		var dyn *expr.Dynset
		var dup *expr.Dup
		for _, x := range xs {
			switch x := x.(type) {
			case *expr.Hash:
				hashes++
			case *expr.Payload:
				loads++
			case *expr.Lookup:
				lookups = append(lookups, x)
			case *expr.Dynset:
				dyn = x
			case *expr.Dup:
				dup = x
			}
		}
		wantHashes, wantLoads := 0, 4+2 // the flow key; daddr and dport of the gateway-conns key
		if f == cluster.IPv6 {
			wantHashes, wantLoads = 1, 4+2
		}
		if hashes != wantHashes || loads != wantLoads || len(lookups) != 2 || dyn == nil || dup == nil {
			t.Fatalf("%v: %d hashes, %d payload loads, %d lookups, dynset %v, dup %v; want %d, %d, 2, one each",
				f, hashes, loads, len(lookups), dyn != nil, dup != nil, wantHashes, wantLoads)
		}
		flows, conns := lookups[0], lookups[1]
		if flows.SetName != MapGatewayFlows || conns.SetName != MapGatewayConns {
			t.Fatalf("%v: lookups in %s, %s", f, flows.SetName, conns.SetName)
		}
		if dyn.Operation != unix.NFT_DYNSET_OP_UPDATE || dyn.SrcRegKey != flows.SourceRegister || dyn.SrcRegData != flows.DestRegister {
			t.Errorf("%v: update key reg %d data reg %d, want the flows lookup's %d and %d", f, dyn.SrcRegKey, dyn.SrcRegData, flows.SourceRegister, flows.DestRegister)
		}
		if dup.RegAddr != conns.DestRegister {
			t.Errorf("%v: dup from reg %d, want the conns lookup's data reg %d", f, dup.RegAddr, conns.DestRegister)
		}
		// The conns key ends with the node id: its last 4-byte register is the flows lookup's data.
		if last := conns.SourceRegister + e.addrRegs() + 2; last != flows.DestRegister {
			t.Errorf("%v: conns key's id register %d, flows data in %d", f, last, flows.DestRegister)
		}
		if _, ok := xs[len(xs)-1].(*expr.Verdict); !ok {
			t.Errorf("%v: last expression %T, want the drop verdict", f, xs[len(xs)-1])
		}
	}
}

// TestRepeatedElements: a set dump that gives an element twice (the kernel's walk of a hash set
// being resized; dumpElements reads it again) is told from a complete one, and an interval set's
// range end is not a repeat of the next range's start at the same key.
func TestRepeatedElements(t *testing.T) {
	el := func(key byte, end bool) KernelElement {
		return KernelElement{Key: []byte{10, 0, 0, key}, IntervalEnd: end}
	}
	for _, c := range []struct {
		name string
		els  []KernelElement
		want int
	}{
		{"none", nil, 0},
		{"distinct", []KernelElement{el(3, false), el(1, false), el(2, false)}, 0},
		{"one repeated", []KernelElement{el(3, false), el(1, false), el(3, false)}, 1},
		{"one three times, one twice", []KernelElement{el(1, false), el(2, false), el(1, false), el(2, false), el(1, false)}, 3},
		{"an end and a start at one key", []KernelElement{el(1, false), el(2, true), el(2, false), el(3, true)}, 0},
	} {
		if got := repeatedElements(c.els); got != c.want {
			t.Errorf("%s: %d repeated, want %d", c.name, got, c.want)
		}
	}
}

// TestParseFlowDumpEnd: a dump that ends in an error (NLMSG_DONE carrying an errno) is that error,
// not a complete dump, and a message flagged NLM_F_DUMP_INTR says the dump was interrupted.
func TestParseFlowDumpEnd(t *testing.T) {
	msg := func(typ, flags uint16, body []byte) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(unix.NLMSG_HDRLEN+len(body)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, flags)
		b = append(b, make([]byte, 8)...) // sequence, port id
		return append(b, body...)
	}
	errno := func(e int32) []byte { return binary.NativeEndian.AppendUint32(nil, uint32(e)) }
	none := func(GatewayFlow) error { return nil }
	if done, intr, err := parseFlowDump(msg(unix.NLMSG_DONE, unix.NLM_F_MULTI, errno(0)), none); !done || intr || err != nil {
		t.Errorf("a dump's end: done %v, interrupted %v, err %v; want done", done, intr, err)
	}
	if done, _, err := parseFlowDump(msg(unix.NLMSG_DONE, unix.NLM_F_MULTI, errno(-int32(unix.EBUSY))), none); done || !errors.Is(err, unix.EBUSY) {
		t.Errorf("a dump ended by an error: done %v, err %v; want EBUSY", done, err)
	}
	// An element message flagged interrupted (its body: an nfgenmsg and no attribute), then the end.
	b := append(msg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, make([]byte, 4)), msg(unix.NLMSG_DONE, unix.NLM_F_MULTI, errno(0))...)
	if done, intr, err := parseFlowDump(b, none); !done || !intr || err != nil {
		t.Errorf("an interrupted dump: done %v, interrupted %v, err %v; want done and interrupted", done, intr, err)
	}
}

// TestActionKindsDistinct: every action kind the decoder knows is a number of its own (the kinds
// outside model.go's iota are numbered by hand; the fast path's once collided with lbalgo.go's).
func TestActionKindsDistinct(t *testing.T) {
	seen := map[ActionKind]bool{}
	for _, k := range actionKinds {
		if seen[k] {
			t.Errorf("action kind %d is listed twice: two kinds share a number", k)
		}
		seen[k] = true
	}
	if !seen[ActFwdJhashMap] {
		t.Errorf("ActFwdJhashMap is not in the decoder's kinds")
	}
}

// TestRewriteFwd: a dup with a device register becomes fwd; a dup that cannot be read (here one
// without its device register) is never sent as it is, which in a netdev table would be
// nft_dup_netdev: its message is emptied, so the kernel refuses the batch, and the error names it.
func TestRewriteFwd(t *testing.T) {
	dup := func(params []byte) []byte {
		el := appendAttrString(nil, unix.NFTA_EXPR_NAME, "dup")
		el = appendAttr(el, unix.NLA_F_NESTED|unix.NFTA_EXPR_DATA, params)
		list := appendAttr(nil, unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, el)
		rule := append([]byte{unix.NFPROTO_NETDEV, 0, 0, 0}, appendAttrString(nil, unix.NFTA_RULE_TABLE, "t")...)
		return appendAttr(rule, unix.NLA_F_NESTED|unix.NFTA_RULE_EXPRESSIONS, list)
	}
	good := appendAttrBE32(appendAttrBE32(nil, unix.NFTA_DUP_SREG_ADDR, 1), unix.NFTA_DUP_SREG_DEV, 2)
	bad := appendAttrBE32(nil, unix.NFTA_DUP_SREG_ADDR, 1)
	newRule := netlink.HeaderType(nfnlSubsysNftables<<8 | unix.NFT_MSG_NEWRULE)
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: newRule}, Data: dup(good)},
		{Header: netlink.Header{Type: newRule}, Data: dup(bad)},
	}
	err := rewriteFwdMsgs(msgs, unix.NFPROTO_IPV4)
	if err == nil || !strings.Contains(err.Error(), "message 1 of the batch") || !errors.Is(err, errFwdRewrite) {
		t.Errorf("a dup without a device: error %v", err)
	}
	if !bytes.Contains(msgs[0].Data, []byte("fwd\x00")) || bytes.Contains(msgs[0].Data, []byte("dup\x00")) {
		t.Errorf("the dup with a device was not rewritten into fwd: % x", msgs[0].Data)
	}
	if len(msgs[1].Data) != 4 {
		t.Errorf("the dup that could not be rewritten is sent: % x", msgs[1].Data)
	}
	msgs = []netlink.Message{{Header: netlink.Header{Type: newRule}, Data: dup(good)}}
	if err := rewriteFwdMsgs(msgs, unix.NFPROTO_IPV4); err != nil {
		t.Errorf("a dup with a device: %v", err)
	}
}

// TestRewriteFwdEmptiedRuleRefused: the kernel refuses the bare NEWRULE that rewriteFwd leaves of a
// rule it cannot rewrite, and so the whole batch (in a throwaway namespace): nothing is programmed.
func TestRewriteFwdEmptiedRuleRefused(t *testing.T) {
	_, fd := testNetns(t)
	prog := &NetlinkProgrammer{NetNSFd: fd}
	defer prog.Close()
	b, err := newBatch(NetdevFamily(cluster.IPv4), "t")
	if err != nil {
		t.Fatal(err)
	}
	b.put(netlink.HeaderType(nfnlSubsysNftables<<8|unix.NFT_MSG_NEWTABLE), netlink.Request|netlink.Create,
		appendAttrString([]byte{unix.NFPROTO_NETDEV, 0, 0, 0}, unix.NFTA_TABLE_NAME, "t"))
	b.put(netlink.HeaderType(nfnlSubsysNftables<<8|unix.NFT_MSG_NEWRULE), netlink.Request|netlink.Create|netlink.Append,
		[]byte{unix.NFPROTO_NETDEV, 0, 0, 0})
	if err := prog.send(b); err == nil {
		t.Fatal("the kernel took a bare NEWRULE")
	}
	if _, err := prog.ReadTable(NetdevFamily(cluster.IPv4), "t"); err == nil {
		t.Errorf("the refused batch's table exists")
	}
}

// TestConntableNamesFromRule: the connection table's actions use the maps their rule names (the
// gateway's names, or any others), the decoder reads the names back from the expressions (decode
// by re-encoding), the node map a rule names is declared keyed by the mark, and the slot maps'
// node ids are resolved by it.
func TestConntableNamesFromRule(t *testing.T) {
	for _, n := range []struct{ flows, conns, ids, prev string }{
		{MapGatewayFlows, MapGatewayConns, MapGatewayRouteIDs, MapGatewayPrevIDs},
		{"t-flows", "t-nodes", "t-slots", "t-slots-before"},
	} {
		for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			sets := []*Set{{Name: n.ids, Kind: KindTupleMark}, {Name: n.prev, Kind: KindTupleMark},
				{Name: n.conns, Kind: KindTupleAddr}, {Name: n.flows, Kind: KindGatewayFlows, Timeout: time.Hour},
				{Name: MapGatewayRoutes, Kind: KindTupleAddr}}
			e := &encoder{f: f, t: &nftables.Table{Name: "vipgate", Family: tableFamily(f)}, sets: map[string]*nftables.Set{},
				kinds: map[string]*Set{}, chains: map[string]*nftables.Chain{}}
			for _, s := range sets {
				e.kinds[s.Name] = s
			}
			actions := []Action{
				{Kind: ActFlowRecall, Set: n.flows, Conns: n.conns},
				{Kind: ActFlowDaisy, Map: n.prev, Set: n.flows, Conns: n.conns, Value: 1021},
				{Kind: ActFlowPick, Map: n.ids, Set: n.flows, Conns: n.conns, Value: 1021},
			}
			for _, a := range actions {
				xs, err := e.action(a)
				if err != nil {
					t.Fatalf("%v %v: %v", f, a, err)
				}
				r, err := decodeRule(e, xs)
				if err != nil || r.Action != a {
					t.Errorf("%v: %+v decodes to %+v (%v)", f, a, r.Action, err)
				}
			}

			node := netip.MustParseAddr("192.0.2.11")
			vip := netip.MustParseAddr("203.0.113.50")
			if f == cluster.IPv6 {
				node, vip = netip.MustParseAddr("2001:db8::11"), netip.MustParseAddr("2001:db8::50")
			}
			id, _ := GatewayNodeID(node)
			fl := &Flat{Family: f, Table: "vipgate", Chains: map[string]*Chain{}, Sets: map[string]*Set{}, Elements: map[string][]Element{}}
			for _, s := range sets {
				fl.Sets[s.Name] = s
				fl.SetOrder = append(fl.SetOrder, s.Name)
			}
			fl.Chains["route"] = &Chain{Name: "route"}
			for _, a := range actions {
				fl.Chains["route"].Rules = append(fl.Chains["route"].Rules, Rule{Action: a})
			}
			fl.ChainOrder = []string{"route"}
			text := RenderString(fl)
			ip := "ip"
			if f == cluster.IPv6 {
				ip = "ip6"
			}
			if want := "map " + n.conns + " {\n\t\ttypeof " + ip + " daddr . meta l4proto . th dport . meta mark : " + ip + " daddr\n"; !strings.Contains(text, want) {
				t.Errorf("%v: the node map %s is not declared keyed by the mark:\n%s", f, n.conns, text)
			}
			if strings.Contains(text, "map "+MapGatewayRoutes+" {\n\t\ttypeof "+ip+" daddr . meta l4proto . th dport . meta mark") {
				t.Errorf("%v: %s, a map no rule names as its node map, is declared keyed by the mark", f, MapGatewayRoutes)
			}

			// The ids decodeMarkElement leaves (as IPv4 addresses) resolve by the rules' node map.
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], id)
			fl.Elements[n.conns] = []Element{{Set: n.conns, Addr: vip, Proto: ProtoTCP, Port: 80, Index: id, DataAddr: node}}
			fl.Elements[n.ids] = []Element{{Set: n.ids, Addr: vip, Proto: ProtoTCP, Port: 80, Index: 7, DataAddr: netip.AddrFrom4(b)}}
			if err := resolveGatewayMarks(fl); err != nil || fl.Elements[n.ids][0].DataAddr != node {
				t.Errorf("%v: resolving %s by %s: %v, %v", f, n.ids, n.conns, fl.Elements[n.ids][0].DataAddr, err)
			}
			// Without a rule naming it, a slot map's ids resolve by nothing: an error, not a guess.
			fl.Elements[n.ids][0].DataAddr = netip.AddrFrom4(b)
			fl.Chains["route"].Rules = nil
			if err := resolveGatewayMarks(fl); err == nil || !strings.Contains(err.Error(), n.ids) {
				t.Errorf("%v: resolving %s without a rule naming its node map: %v", f, n.ids, err)
			}
		}
	}
}
