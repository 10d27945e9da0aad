package dataplane

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// This file is the gateway's connection table for routed forwarding (forwarding: route): an
// established flow keeps its node while that node is still a node of its VIP port, whatever the
// Maglev table says since; new flows take Maglev. It is a dynamic nftables map, flow -> node id,
// with a timeout that each packet of the flow restarts, in the chain the VIP port's packets go to
// (filter prerouting at raw priority, before conntrack: the gateway still keeps no conntrack state):
//
//	chain gateway-route
//	    meta mark set <flow> map @gateway-flows
//	        dup to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns
//	        update @gateway-flows { <flow> : meta mark } drop                                 # a known flow
//	    meta mark set ip daddr . meta l4proto . th dport . jhash ... map @gateway-route-ids
//	        dup to ip daddr . meta l4proto . th dport . meta mark map @gateway-conns
//	        add @gateway-flows { <flow> : meta mark } drop                                    # Maglev
//	    dup to <VIP port> . jhash ... map @gateway-routes drop                                # the map is full
//
// Only a known flow whose node is still in gateway-conns refreshes its entry: the dup's map lookup
// ends the rule on a miss, before the update. A stale entry (its node left) is not refreshed, so it
// expires; meanwhile its packets are re-dealt by Maglev (or daisy chained), whose rules `add` the
// entry: add neither overwrites an existing element's data nor restarts its timeout (nor does
// update overwrite the data; it only restarts the timeout: nft_dynset_eval), so the stale entry
// ages out and the flow's next packet after that is remembered with its new node.
//
// <flow> is `ip saddr . th sport . ip daddr . th dport` (IPv4) and `jhash ip6 saddr . th sport . ip6
// daddr . th dport mod 4294967291 seed GatewayFlowSeed` (IPv6): nft 1.0.6 aborts on a dynamic map
// update with a key longer than 16 bytes (netlink_linearize.c: `dreg < ctx->reg_low`), so the
// protocol is not in the key and an IPv6 flow is known by a 32-bit hash of its 4-tuple (two IPv6
// flows with the same hash share an entry: the second follows the first one's node, a node of its
// VIP port anyway).
//
// Why not the kernel's conntrack with the node in the ct mark: in route forwarding the original packet
// is dropped after its copy went to the node, and conntrack only keeps ("confirms") a connection when
// its packet leaves the host's last hook; a dropped packet's new connection is thrown away, so every
// packet would be new (measured: TestGatewayConnTable broke 317-340 of 1,000 connections that way). The
// map's entry is written by the packet itself.
//
// gateway-conns maps (VIP port, node id) to the node for every node a VIP port may still send to: its
// Maglev backends and the nodes draining from it. A flow whose node left (unhealthy, removed, drained
// past the deadline) misses it and is re-dealt by Maglev (the add keeps the element's old data, so
// each of its packets is re-dealt the same way until the unrefreshed entry expires). gateway-route-ids is the
// Maglev table again with node ids as data: nft cannot store an address in a mark. The packet mark
// is used as the register between the statements; the copy `dup` sends leaves with it (a mark does
// not leave the host).
//
// Drain: a node marked draining gets no new flows — it is not a Maglev backend — but its established
// flows keep it through gateway-conns until they end (the entry expires) or the drain deadline passes.

// The maps above are named by the role (gateway/names.go): an action of the connection table
// carries their names (Action.Set: the flows, Conns: the nodes, Map: the slots of ActFlowPick and
// ActFlowDaisy), and the decoder reads them back from the rule's expressions.

// DefaultGatewayFlowTimeout is how long an idle flow keeps its entry in gateway-flows by default
// (each packet restarts it; gateway.Config.FlowTimeout); GatewayFlowsMax bounds the map (a full map
// sends new flows by Maglev alone, statelessly).
const (
	DefaultGatewayFlowTimeout = time.Hour
	GatewayFlowsMax           = 1 << 20
)

// GatewayFlowSeed is the seed of the IPv6 flow key's hash (any fixed value; the key is local).
const GatewayFlowSeed uint32 = 0x666c6f77 // "flow"

// gatewayFlowModulus is the IPv6 flow key hash's modulus: the largest 32-bit prime.
const gatewayFlowModulus uint32 = 4294967291

// Action kinds of the connection table, after lbalgo.go's.
const (
	// ActFlowRecall: a known flow goes to its remembered node, if that is still in gateway-conns,
	// and its entry's timeout restarts.
	ActFlowRecall ActionKind = 136
	// ActFlowPick: Maglev picks the node (gateway-route-ids, Value slots), gateway-flows remembers it,
	// the packet goes there.
	ActFlowPick ActionKind = 137
	// ActFlowDaisy: a TCP packet without SYN that no entry knows (a connection another gateway
	// carried until it died) goes to the node the previous Maglev table gave its slot
	// (gateway-route-prev, only slots whose node changed and is still a node of the VIP port, and
	// only for the flow timeout after the change: daisyWindow in gateway/conntable.go), remembered as
	// by ActFlowPick: daisy chaining.
	ActFlowDaisy ActionKind = 138
)

// KindTupleMark: Addr . inet_proto . inet_service . mark (slot) : mark (node id). An element's
// DataAddr is the node; the kernel holds GatewayNodeID(DataAddr).
const KindTupleMark SetKind = 65

// KindGatewayFlows: the flow key (IPv4: ipv4_addr . inet_service . ipv4_addr . inet_service; IPv6:
// a 32-bit hash) : mark (node id), dynamic, with a timeout. Runtime state: never listed back.
const KindGatewayFlows SetKind = 66

// GatewayNodeID is the id a node address is remembered by in a connection's ct mark: the IPv4
// address itself, or the low 32 bits of an IPv6 address (its interface id's tail). 0 means "no node"
// (a connection's mark before Maglev chose), so an address whose id would be 0 has none (ok false).
// Two IPv6 nodes of one gateway with the same low 32 bits: the second (by name) gets no table entry
// (GatewayConnIDs) and its flows follow Maglev only.
func GatewayNodeID(a netip.Addr) (uint32, bool) {
	a = a.Unmap()
	var id uint32
	if a.Is4() {
		b := a.As4()
		id = binary.BigEndian.Uint32(b[:])
	} else {
		b := a.As16()
		id = binary.BigEndian.Uint32(b[12:])
	}
	return id, id != 0
}

// flowKey loads the gateway-flows key of the packet into reg32 on (4 registers for IPv4, 1 for IPv6:
// the 4-tuple, 40 bytes in reg32 0..9, hashed into reg32 0; jhash reads its input before it writes).
func (e *encoder) flowKey() []expr.Any {
	if e.f != cluster.IPv6 {
		return []expr.Any{e.loadSaddr(reg32), loadSport(reg32 + 1), e.loadDaddr(reg32 + 2), loadDport(reg32 + 3)}
	}
	in := uint32(reg32)
	return []expr.Any{e.loadSaddr(in), loadSport(in + 4), e.loadDaddr(in + 5), loadDport(in + 9),
		&expr.Hash{SourceRegister: in, DestRegister: reg32, Length: 40, Modulus: gatewayFlowModulus, Seed: GatewayFlowSeed, Type: expr.HashTypeJenkins}}
}

// connNode looks up the node of the packet's VIP port whose id is the packet mark, into dreg; no
// match (the rule ends) when the VIP port has no such node.
func (e *encoder) connNode(conns string, dreg uint32) ([]expr.Any, error) {
	l, err := e.mapLookup(conns, reg32, dreg)
	if err != nil {
		return nil, err
	}
	key, next := e.tupleKey()
	return append(key, &expr.Meta{Key: expr.MetaKeyMARK, Register: next}, l), nil
}

// Registers of the fast path's fwd (gateway_netdev.go) after a gateway-flows add: the node's
// address stays in fwdAddrReg (reg32 12..15) while the flow key (up to reg32 9) and the mark (reg32 4)
// are loaded for the add, and the device index goes to fwdDevReg.
const (
	fwdAddrReg = reg32 + 12
	fwdDevReg  = reg32 + 11
)

// flowUpdate writes the packet's gateway-flows entry with the packet mark as data: op update also
// restarts an existing entry's timeout, op add leaves an existing entry as it is.
func (e *encoder) flowUpdate(flowsMap string, op uint32) ([]expr.Any, error) {
	s, err := e.setRef(flowsMap)
	if err != nil {
		return nil, err
	}
	data := uint32(reg32 + 4)
	return append(e.flowKey(), &expr.Meta{Key: expr.MetaKeyMARK, Register: data},
		&expr.Dynset{SrcRegKey: reg32, SrcRegData: data, SetName: s.Name, SetID: s.ID, Operation: op}), nil
}

// flowRecall encodes ActFlowRecall, the rule every packet of a known flow runs, with each value
// loaded once: the flow key stays in its registers from the gateway-flows lookup to the update, and
// the node id lands in the last register of the gateway-conns key, where the update reads it (15
// expressions where loading each operand afresh took 19; IPv6 hashes the flow once, not twice). IPv4:
//
//	reg32 0..3  flow key (saddr . sport . daddr . dport)   -> lookup @gateway-flows, data (id) to 7
//	reg32 4..7  daddr . l4proto . dport . meta mark (= id) -> lookup @gateway-conns, data to 8
//	reg32 8     the node's address                         -> dup
//	update @gateway-flows { reg32 0..3 : reg32 7 }
//
// IPv6 the same with the flow key's hash in reg32 0 (its 40-byte input, 0..9, is consumed by the
// hash before the conns key overwrites 1..9), the conns key in 1..7 and the address in 8..11. The
// nft spelling (flowRecallText) is unchanged: nft lists the rule as the text says.
//
// In the netdev table (dev set) the update comes before a fwd through dev, which ends the rule.
func (e *encoder) flowRecall(a Action) ([]expr.Any, error) {
	dev := a.Device
	k := uint32(reg32 + 4) // the gateway-conns key, after the flow key
	if e.f == cluster.IPv6 {
		k = reg32 + 1
	}
	mark := k + e.addrRegs() + 2
	flows, err := e.mapLookup(a.Set, reg32, mark)
	if err != nil {
		return nil, err
	}
	conns, err := e.mapLookup(a.Conns, k, mark+1)
	if err != nil {
		return nil, err
	}
	s, err := e.setRef(a.Set)
	if err != nil {
		return nil, err
	}
	xs := append(e.flowKey(), flows,
		&expr.Meta{Key: expr.MetaKeyMARK, Register: mark, SourceRegister: true},
		// The id again, as the mark: nft's listing (1.0.6) aborts on a concatenation that ends in
		// a map's data (netlink_parse_concat_expr: consumed > 0).
		&expr.Meta{Key: expr.MetaKeyMARK, Register: mark},
		e.loadDaddr(k), loadL4Proto(k+e.addrRegs()), loadDport(k+e.addrRegs()+1),
		conns)
	if dev == "" {
		xs = append(xs, &expr.Dup{RegAddr: mark + 1})
	}
	// Reached only when the node is still one of the VIP port's (the conns lookup matched):
	// update restarts the entry's timeout.
	xs = append(xs, &expr.Dynset{SrcRegKey: reg32, SrcRegData: mark, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
	if dev == "" {
		return append(xs, &expr.Verdict{Kind: expr.VerdictDrop}), nil
	}
	fwd, err := e.fwdTo(mark+1, mark+1+e.addrRegs(), dev)
	if err != nil {
		return nil, err
	}
	return append(xs, fwd...), nil
}

// encodeFlowRecall encodes ActFlowRecall (flowRecall); encodeFlowPick ActFlowPick and
// ActFlowDaisy. Their descriptors are kinds_gateway.go's.
func encodeFlowRecall(e *encoder, a Action) ([]expr.Any, error) {
	return e.flowRecall(a)
}

func encodeFlowPick(e *encoder, a Action) ([]expr.Any, error) {
	var first []expr.Any
	if a.Kind == ActFlowDaisy {
		first = []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ProtoTCP}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 1, Mask: []byte{0x02}, Xor: []byte{0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0}},
		}
	}
	xs, err := e.jhashLookup(Action{Kind: ActDupJhashMap, Map: a.Map, Value: a.Value}, hashShape{tuple: true, flow: true})
	if err != nil {
		return nil, err
	}
	first = append(append(first, xs...), &expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true})
	addr := uint32(reg1)
	if a.Device != "" {
		addr = fwdAddrReg
	}
	node, err := e.connNode(a.Conns, addr)
	if err != nil {
		return nil, err
	}
	up, err := e.flowUpdate(a.Set, unix.NFT_DYNSET_OP_ADD)
	if err != nil {
		return nil, err
	}
	if a.Device == "" {
		xs := append(append(first, node...), &expr.Dup{RegAddr: reg1})
		return append(append(xs, up...), &expr.Verdict{Kind: expr.VerdictDrop}), nil
	}
	fwd, err := e.fwdTo(addr, fwdDevReg, a.Device)
	if err != nil {
		return nil, err
	}
	return append(append(append(first, node...), up...), fwd...), nil
}

// flowKeyText is the nft spelling of the gateway-flows key.
func flowKeyText(ip string) string {
	if ip == "ip6" {
		return fmt.Sprintf("jhash ip6 saddr . th sport . ip6 daddr . th dport mod %d seed %#x", gatewayFlowModulus, GatewayFlowSeed)
	}
	return "ip saddr . th sport . ip daddr . th dport"
}

// conntableText is what the connection table's action kinds spell alike: the entry key, the flow
// key, the tail of a new flow's rule (add) and of a known flow's (update). err is the first of the
// maps the rules need that f lacks; ferr a fwd that cannot be spelled.
func conntableText(f *Flat, fam nftFamily, a Action) (key, flow, tail, recall string, err, ferr error) {
	ip := fam.table
	key = ip + " daddr . meta l4proto . th dport"
	flow = flowKeyText(ip)
	tail = fmt.Sprintf("dup to %[3]s . meta mark map @%[4]s add @%[1]s { %[2]s : meta mark } drop", a.Set, flow, key, a.Conns)
	recall = fmt.Sprintf("dup to %s . meta mark map @%s update @%s { %s : meta mark } drop", key, a.Conns, a.Set, flow)
	if a.Device != "" {
		// The fast path (gateway_netdev.go): fwd ends the rule, so the node's membership in
		// gateway-conns is tested before the add or update, as the dup's lookup does above.
		fwd, ferr := fwdText(fam, fmt.Sprintf("%s . meta mark map @%s", key, a.Conns), a.Device)
		if ferr != nil {
			return "", "", "", "", nil, ferr
		}
		check := fmt.Sprintf("%s . meta mark @%s", key, a.Conns)
		tail = fmt.Sprintf("%s add @%s { %s : meta mark } %s", check, a.Set, flow, fwd)
		recall = fmt.Sprintf("%s update @%s { %s : meta mark } %s", check, a.Set, flow, fwd)
	}
	need := []struct {
		name string
		kind SetKind
	}{{a.Set, KindGatewayFlows}, {a.Conns, KindTupleAddr}}
	if a.Kind != ActFlowRecall {
		need = append(need, struct {
			name string
			kind SetKind
		}{a.Map, KindTupleMark})
	}
	for _, c := range need {
		if e := needSet(f, c.name, c.kind); e != nil && err == nil {
			err = e
		}
	}
	return key, flow, tail, recall, err, nil
}

// flowRecallText spells ActFlowRecall, and flowSlotText ActFlowPick and ActFlowDaisy.
func flowRecallText(f *Flat, fam nftFamily, a Action) (string, error) {
	_, flow, _, recall, err, ferr := conntableText(f, fam, a)
	if ferr != nil {
		return "", ferr
	}
	return fmt.Sprintf("meta mark set %s map @%s %s", flow, a.Set, recall), err
}

// flowSlotText spells a connection table kind that marks a flow with the node its jhash slot
// leads to in the action's Map (ActFlowPick: the Maglev table; ActFlowDaisy: its previous slots). cond is the
// match in front (empty, or ending in a space). Both spell the flow hash, so both refuse a modulus
// of 0, and the tracer, which spells a rule before it runs it, never meets one.
func flowSlotText(cond string) func(f *Flat, fam nftFamily, a Action) (string, error) {
	return func(f *Flat, fam nftFamily, a Action) (string, error) {
		key, _, tail, _, err, ferr := conntableText(f, fam, a)
		if ferr != nil {
			return "", ferr
		}
		if a.Value == 0 {
			return "", fmt.Errorf("jhash modulus 0")
		}
		return fmt.Sprintf("%smeta mark set %s . %s map @%s %s", cond, key, jhashText(fam.table, hashShape{tuple: true, flow: true}, a.Value), a.Map, tail), err
	}
}

// traceFlowRecall, traceFlowDaisy and traceFlowPick trace the connection table's action kinds. A
// Packet is the first packet of a flow: ActFlowRecall finds no entry, ActFlowDaisy does not take a
// SYN, and ActFlowPick forks one branch per node the VIP port's slots lead to and sends the packet
// there.
func traceFlowRecall(c actCall, st pstate, a Action) (pstate, bool) {
	t, ch, idx, text, by := c.t, c.ch, c.idx, c.text, c.by
	if err := needSet(t.f, a.Set, KindGatewayFlows); err != nil {
		t.fail("%s: %v", by, err)
		return st, false
	}
	t.stepOf(st, StepNoMatch, ch.Name, idx, text, fmt.Sprintf("no match: a new flow is not in @%s yet", a.Set))
	return st, true
}

func traceFlowDaisy(c actCall, st pstate, a Action) (pstate, bool) {
	t, ch, idx, text, by := c.t, c.ch, c.idx, c.text, c.by
	if err := needSet(t.f, a.Map, KindTupleMark); err != nil {
		t.fail("%s: %v", by, err)
		return st, false
	}
	t.stepOf(st, StepNoMatch, ch.Name, idx, text, "no match: a new connection starts with a SYN (only a connection in progress that this gateway does not know goes to its slot's previous node)")
	return st, true
}

func traceFlowPick(c actCall, st pstate, a Action) (pstate, bool) {
	t, ch, idx, text, by, done := c.t, c.ch, c.idx, c.text, c.by, c.done
	pick := Action{Kind: ActFlowPick, Map: a.Map, Value: a.Value}
	t.jhashBranches(st, ch, idx, text, pick, KindTupleMark, by, done, func(b pstate, ep netip.AddrPort, slots int) {
		id, _ := GatewayNodeID(ep.Addr())
		key, _ := t.entryKey(b, true)
		key.Index = id
		if _, found, err := t.lookup(a.Conns, key, KindTupleAddr); err != nil || !found {
			t.fail("%s: node %s (id %d) chosen by Maglev is not in @%s", by, ep.Addr(), id, a.Conns)
			return
		}
		if a.Device != "" {
			t.stepOf(b, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: Maglev picks node %s (id %d, %d of %d slots), @%s remembers it for the flow's later packets; fwd unchanged by device %s",
				ep.Addr(), id, slots, a.Value, a.Set, a.Device))
			t.sendTo(b, netip.AddrPortFrom(ep.Addr(), b.port), fmt.Sprintf("forwarded by %s to %s dev %s", by, ep.Addr(), a.Device))
			return
		}
		t.stepOf(b, StepMatch, ch.Name, idx, text, fmt.Sprintf("match: Maglev picks node %s (id %d, %d of %d slots), @%s remembers it for the flow's later packets; sent unchanged, the original is dropped",
			ep.Addr(), id, slots, a.Value, a.Set))
		t.sendTo(b, netip.AddrPortFrom(ep.Addr(), b.port), "routed by "+by)
	})
	return st, false
}

// tupleMarkNftSet, tupleMarkElement, tupleMarkDecl and tupleMarkText are KindTupleMark's netlink
// set, element encoding, declaration and element text (its descriptor is kinds_gateway.go's).
func tupleMarkNftSet(e *encoder, s *Set, ns *nftables.Set) {
	ns.KeyType = nftables.MustConcatSetType(e.addrType(), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
	ns.IsMap, ns.DataType = true, nftables.TypeMark
}

func tupleMarkElement(w *elementLists, key, val []byte, el Element, alen int) error {
	id, idOK := GatewayNodeID(el.DataAddr)
	if !idOK {
		return fmt.Errorf("set %s: node %v has no id", w.set.Name, el.DataAddr)
	}
	putU32(putPort(putProto(putAddr(key, el.Addr), el.Proto), el.Port), el.Index)
	putU32(val, id)
	w.element(key[:tupleAddrKeyLen(alen)], val[:4], nil, false)
	return nil
}

func tupleMarkDecl(fam nftFamily, s *Set) (string, []string) {
	return "map", []string{fmt.Sprintf("typeof %s daddr . meta l4proto . th dport . numgen random mod 1 : meta mark", fam.table)}
}

func tupleMarkText(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
	a, err := addrText(fam, e.Addr)
	if err != nil {
		return "", err
	}
	id, ok := GatewayNodeID(e.DataAddr)
	if !ok {
		return "", fmt.Errorf("node %v has no id", e.DataAddr)
	}
	return fmt.Sprintf("%s . %s . %d . %d : %d", a, ProtoName(e.Proto), e.Port, e.Index, id), nil
}

// gatewayConnsDecl declares a connection table's node map (gateway-conns: a set of KindTupleAddr
// that a rule names as its Action.Conns, connsMaps), keyed by the mark: nft refuses a mark looked
// up in a key typed by numgen (integer).
func gatewayConnsDecl(fam nftFamily) []string {
	return []string{fmt.Sprintf("typeof %[1]s daddr . meta l4proto . th dport . meta mark : %[1]s daddr", fam.table)}
}

// gatewayFlowsNftSet and gatewayFlowsDecl are KindGatewayFlows's netlink set and declaration.
func gatewayFlowsNftSet(e *encoder, s *Set, ns *nftables.Set) {
	ns.KeyType = nftables.TypeInteger
	if e.f != cluster.IPv6 {
		ns.KeyType = nftables.MustConcatSetType(e.addrType(), nftables.TypeInetService, e.addrType(), nftables.TypeInetService)
	}
	ns.IsMap, ns.DataType = true, nftables.TypeMark
	ns.HasTimeout, ns.Timeout, ns.Dynamic, ns.Size = true, s.Timeout, true, GatewayFlowsMax
}

func gatewayFlowsDecl(fam nftFamily, s *Set) (string, []string) {
	key := "ip saddr . th sport . ip daddr . th dport"
	if fam.table == "ip6" {
		key = "numgen random mod 1" // an integer: the hash of the flow
	}
	return "map", []string{"typeof " + key + " : meta mark", "flags dynamic,timeout",
		fmt.Sprintf("timeout %ds", max(int64(s.Timeout.Seconds()), 1)), fmt.Sprintf("size %d", GatewayFlowsMax)}
}

// decodeMarkElement decodes a KindTupleMark element: the node id goes to DataAddr as an IPv4
// address (resolveGatewayMarks turns it into the node's address).
func decodeMarkElement(s *Set, alen int, ke KernelElement) (Element, error) {
	el := Element{Set: s.Name}
	k := &keyReader{b: ke.Key}
	el.Addr, el.Proto, el.Port, el.Index = k.addr(alen), k.proto(), k.port(), k.hostU32()
	if err := k.done(); err != nil {
		return el, fmt.Errorf("key: %w", err)
	}
	d := &keyReader{b: ke.Data}
	id := d.hostU32()
	if err := d.done(); err != nil {
		return el, fmt.Errorf("data: %w", err)
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	el.DataAddr = netip.AddrFrom4(b)
	return el, nil
}

// connsMaps are the node maps the connection table actions of f name (Action.Conns), by the slot
// map (Action.Map) of those that have one.
func connsMaps(f *Flat) (all map[string]bool, bySlots map[string]string) {
	all, bySlots = map[string]bool{}, map[string]string{}
	for _, c := range f.Chains {
		for _, r := range c.Rules {
			a := r.Action
			if a.Conns == "" || (a.Kind != ActFlowRecall && a.Kind != ActFlowPick && a.Kind != ActFlowDaisy) {
				continue
			}
			all[a.Conns] = true
			if a.Map != "" {
				bySlots[a.Map] = a.Conns
			}
		}
	}
	return all, bySlots
}

// resolveGatewayMarks turns the node ids decodeMarkElement left in the KindTupleMark elements of f
// into node addresses, by the element of the same VIP port and id of the node map that the rules
// reading the KindTupleMark map name (Action.Conns).
func resolveGatewayMarks(f *Flat) error {
	_, bySlots := connsMaps(f)
	for name, s := range f.Sets {
		if s.Kind != KindTupleMark || len(f.Elements[name]) == 0 {
			continue
		}
		conns, ok := bySlots[name]
		if !ok {
			return fmt.Errorf("set %s: no rule names the node map its node ids are resolved by", name)
		}
		byID := map[Element]netip.Addr{}
		for _, c := range f.Elements[conns] {
			byID[Element{Addr: c.Addr, Proto: c.Proto, Port: c.Port, Index: c.Index}] = c.DataAddr
		}
		for i, el := range f.Elements[name] {
			b := el.DataAddr.As4()
			id := binary.BigEndian.Uint32(b[:])
			a, ok := byID[Element{Addr: el.Addr, Proto: el.Proto, Port: el.Port, Index: id}]
			if !ok {
				return fmt.Errorf("set %s: %s . %d . %d . %d : node id %d is in no element of %s", name, el.Addr, el.Proto, el.Port, el.Index, id, conns)
			}
			f.Elements[name][i].DataAddr = a
		}
	}
	return nil
}
