package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// This file is the route forwarding fast path (forwarding: route with gateway.Config.FastPath): the
// connection table and Maglev of gateway_route.go and gateway_conntable.go, in a table of the netdev
// family whose ingress chains end in
//
//	fwd ip to <node address> device <the node's device>
//
// rather than in `dup to <node address> ... drop` at prerouting. `dup` copies the packet
// (pskb_copy) and looks up an output route for every packet; fwd hands the packet itself to the
// neighbour layer of the node's device (nf_fwd_netdev: neigh_xmit), before the IP stack sees it.
// Measured on 64-byte UDP, the dup shape costs ~1 µs a packet more than plain forwarding and the fwd
// shape ~0.3 µs (docs/gateway-results.md, "Per-packet cost").
//
// What the IP stack did and fwd does not: no ICMP errors (time exceeded, fragmentation needed) and
// no check of the TTL, which fwd decrements (nft_fwd_neigh_eval) but forwards even at 0; no IP input
// validation either. A design choice, as in Katran's or Unimog's XDP forwarding. What the netdev
// chains do not handle they pass on (accept), and the family's table of gateway_route.go does it as
// before: packets arriving on a device without an ingress chain, fragments (all of a datagram's:
// only the first carries ports), protocols other than TCP, UDP and SCTP (not in service-ips), VIP
// ports without nodes (the reject needs the IP stack), source-hash VIP ports (their chain is empty
// here), and packets whose node a full gateway-flows or a missing gateway-conns element leaves
// without a rule (for IPv6 also the stateless rule's: see buildGatewayNetdevBase). Frames sent to
// another host's MAC address (PACKET_OTHERHOST) are not taken either: the IP stack drops them.
//
// The netdev table is a failure domain of its own (gateway.Proxier.Sync): when the kernel refuses
// its transaction, the gateway deletes it and goes on with the family's table alone, and writes it
// from scratch at a later sync; it never re-creates the family's table (and so its connection
// table) for it.
//
// One netdev table per family (nft's payload matches in a netdev table need `meta protocol` as a
// dependency; the encoder adds it to every rule, as nft does to the rules it parses), named
// NetdevTableName, holding the same sets and elements as the family's table (the Service parts are
// shared) and one ingress base chain per device: google/nftables v0.3.0 writes a single
// NFTA_HOOK_DEV per chain. The library has no fwd expression either: the encoder writes a dup with
// a device register and the batch turns it into fwd (rewriteFwd) before it is sent.

// HookIngress is the netdev family's ingress hook.
const HookIngress Hook = "ingress"

// netdevFamily marks a Tx's, Ruleset's or Flat's Family as a netdev table whose payload matches are
// of the IP family it is or-ed with (NetdevFamily).
const netdevFamily cluster.Family = 0x100

// NetdevFamily is the Family of family f's netdev table (the fast path's).
func NetdevFamily(f cluster.Family) cluster.Family { return f | netdevFamily }

// isNetdev says whether f is a netdev table's Family; ipFamily is the IP family of its packets.
func isNetdev(f cluster.Family) bool           { return f&netdevFamily != 0 }
func ipFamily(f cluster.Family) cluster.Family { return f &^ netdevFamily }

// NetdevTableName is the name of the fast path's netdev table of family f: netdev tables share one
// namespace, so the IPv4 and IPv6 tables need different names.
func NetdevTableName(table string, f cluster.Family) string {
	if ipFamily(f) == cluster.IPv6 {
		return table + "-fwd6"
	}
	return table + "-fwd4"
}

// ActFwdJhashMap is ActDupJhashMap of the netdev table: the node Maglev gives the flow's slot,
// reached by fwd through Action.Device:
//
//	fwd ip to ip daddr . meta l4proto . th dport . jhash ... map @Map device "Device"
//
// The number follows the connection table's kinds (136-138) with room; lbalgo.go has 130-134.
const ActFwdJhashMap ActionKind = 144

// txTableName names tx's table in errors: "IPv4 table vipgate", "netdev table vipgate-fwd4".
func txTableName(tx *Tx) string {
	if isNetdev(tx.Family) {
		return "netdev table " + tx.Table
	}
	return fmt.Sprintf("IPv%d table %s", tx.Family, tx.Table)
}

// fwdTo is `fwd <family> to <address in addrReg> device dev`: the device's index into devReg, then a
// dup with a device register, which rewriteFwd turns into fwd in the batch (google/nftables v0.3.0
// has no fwd expression). vipgate's own dups never have a device.
func (e *encoder) fwdTo(addrReg, devReg uint32, dev string) ([]expr.Any, error) {
	if !e.netdev {
		return nil, fmt.Errorf("fwd to device %q outside a netdev table", dev)
	}
	if dev == "" {
		return nil, errors.New("fwd without a device")
	}
	index := e.ifindex
	if index == nil {
		index = ifindexIn(0)
	}
	i, err := index(dev)
	if err != nil {
		return nil, fmt.Errorf("fwd device %q: %w", dev, err)
	}
	return []expr.Any{
		&expr.Immediate{Register: devReg, Data: hostU32(uint32(i))},
		&expr.Dup{RegAddr: addrReg, RegDev: devReg, IsRegDevSet: true},
	}, nil
}

// encodeFwdJhashMap encodes ActFwdJhashMap.
func encodeFwdJhashMap(e *encoder, a Action) ([]expr.Any, error) {
	xs, err := e.gatewayJhashLookup(Action{Kind: ActDupJhashMap, Map: a.Map, Value: a.Value})
	if err != nil {
		return nil, err
	}
	fwd, err := e.fwdTo(reg1, reg32+4, a.Device)
	if err != nil {
		return nil, err
	}
	return append(xs, fwd...), nil
}

// fwdText is the nft spelling of `fwd <family> to <to> device "dev"`.
func fwdText(fam nftFamily, to, dev string) (string, error) {
	if dev == "" {
		return "", errors.New("fwd without a device")
	}
	if !fam.netdev {
		return "", fmt.Errorf("fwd to device %q outside a netdev table", dev)
	}
	return fmt.Sprintf("fwd %s to %s device %s", fam.table, to, quote(dev)), nil
}

func fwdJhashMapText(f *Flat, fam nftFamily, a Action) (string, error) {
	if a.Value == 0 {
		return "", fmt.Errorf("jhash modulus 0")
	}
	sh := hashShape{tuple: true, flow: true}
	s, err := fwdText(fam, fmt.Sprintf("%s daddr . meta l4proto . th dport . %s map @%s", fam.table, jhashText(fam.table, sh, a.Value), a.Map), a.Device)
	if err != nil {
		return "", err
	}
	return s, needSet(f, a.Map, KindTupleAddr)
}

func fwdJhashMapHint(h hints) Action {
	return Action{Kind: ActFwdJhashMap, Map: h.set, Value: h.modulus}
}

// traceFwdJhashMap traces ActFwdJhashMap as ActDupJhashMap, naming the device.
func traceFwdJhashMap(c actCall, st pstate, a Action) (pstate, bool) {
	if a.Value == 0 {
		c.fail(errors.New("jhash modulus 0"))
		return st, false
	}
	c.t.jhashBranches(st, c.ch, c.idx, c.text, a, KindTupleAddr, c.by, c.done, func(b pstate, ep netip.AddrPort, slots int) {
		c.match(b, fmt.Sprintf("match: fwd unchanged to node %s by device %s (%d of %d slots)", ep.Addr(), a.Device, slots, a.Value))
		c.t.sendTo(b, netip.AddrPortFrom(ep.Addr(), st.port), fmt.Sprintf("forwarded by %s to %s dev %s", c.by, ep.Addr(), a.Device))
	})
	return st, false
}

// protoDependency is what nft puts before a netdev rule's payload matches: `meta protocol ip` (or
// ip6), the ethertype in network byte order.
func (e *encoder) protoDependency() []expr.Any {
	eth := []byte{0x08, 0x00}
	if e.f == cluster.IPv6 {
		eth = []byte{0x86, 0xdd}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: eth},
	}
}

// Netlink attributes of the fwd expression (linux/netfilter/nf_tables.h).
const (
	nftaFwdSregDev  = 1
	nftaFwdSregAddr = 2
	nftaFwdNfproto  = 3
)

// rewriteFwdMsgs turns the dups with a device register of the NEWRULE messages in msgs into fwd
// expressions of family nfproto (see fwdTo). A rule it cannot rewrite is never sent as it is: in a
// netdev table a dup with a device is nft_dup_netdev, which would copy the frames out raw. It
// empties that message to the bare nfgenmsg header, which the kernel would refuse (no table), and
// returns the first such rule as an error: netlink_batch.go's take sends nothing then.
func rewriteFwdMsgs(msgs []netlink.Message, nfproto uint32) error {
	newRule := netlink.HeaderType(nfnlSubsysNftables<<8 | unix.NFT_MSG_NEWRULE)
	var first error
	for i := range msgs {
		if msgs[i].Header.Type != newRule || len(msgs[i].Data) < 4 {
			continue
		}
		d, err := rewriteFwdRule(msgs[i].Data, nfproto)
		switch {
		case err != nil:
			msgs[i].Data = msgs[i].Data[:4]
			if first == nil {
				first = fmt.Errorf("message %d of the batch: %w", i, err)
			}
		case d != nil:
			msgs[i].Data = d
		}
	}
	return first
}

// rawAttr is one netlink attribute: its type with flags, and its payload without padding.
type rawAttr struct {
	typ  uint16
	data []byte
}

func parseRawAttrs(b []byte) ([]rawAttr, bool) {
	var out []rawAttr
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil, false
		}
		out = append(out, rawAttr{typ: binary.NativeEndian.Uint16(b[2:]), data: b[4:n]})
		b = b[min(nlaAlign(n), len(b)):]
	}
	return out, len(b) == 0
}

// errFwdRewrite is why a netdev rule could not be sent: its dup with a device register was not
// turned into fwd.
var errFwdRewrite = errors.New("cannot rewrite the dup with a device into fwd (it would be nft_dup_netdev)")

// rewriteFwdRule returns the rule message data with its dups with a device register as fwds (nil:
// it has none), or an error when it cannot parse the rule or a dup of it.
func rewriteFwdRule(data []byte, nfproto uint32) ([]byte, error) {
	attrs, ok := parseRawAttrs(data[4:])
	if !ok {
		return nil, fmt.Errorf("%w: malformed rule attributes", errFwdRewrite)
	}
	changed := false
	out := append([]byte(nil), data[:4]...)
	for _, a := range attrs {
		if a.typ&^unix.NLA_F_NESTED == unix.NFTA_RULE_EXPRESSIONS {
			elems, ok := parseRawAttrs(a.data)
			if !ok {
				return nil, fmt.Errorf("%w: malformed expression list", errFwdRewrite)
			}
			var list []byte
			for _, el := range elems {
				d, err := dupToFwd(el.data, nfproto)
				if err != nil {
					return nil, err
				}
				if d != nil {
					el.data, changed = d, true
				}
				list = appendAttr(list, el.typ, el.data)
			}
			a.data = list
		}
		out = appendAttr(out, a.typ, a.data)
	}
	if !changed {
		return nil, nil
	}
	return out, nil
}

// dupToFwd rewrites one expression (NFTA_LIST_ELEM payload) if it is a dup with a device register
// (nil: it is another expression). A dup it cannot read is an error: every dup of a netdev table
// is vipgate's fwd.
func dupToFwd(el []byte, nfproto uint32) ([]byte, error) {
	attrs, ok := parseRawAttrs(el)
	if !ok {
		return nil, fmt.Errorf("%w: malformed expression", errFwdRewrite)
	}
	if len(attrs) == 0 || attrs[0].typ != unix.NFTA_EXPR_NAME || string(attrs[0].data) != "dup\x00" {
		return nil, nil
	}
	if len(attrs) != 2 {
		return nil, fmt.Errorf("%w: %d attributes, want a name and data", errFwdRewrite, len(attrs))
	}
	params, ok := parseRawAttrs(attrs[1].data)
	if !ok {
		return nil, fmt.Errorf("%w: malformed dup data", errFwdRewrite)
	}
	var addr, dev []byte
	for _, p := range params {
		switch p.typ {
		case unix.NFTA_DUP_SREG_ADDR:
			addr = p.data
		case unix.NFTA_DUP_SREG_DEV:
			dev = p.data
		}
	}
	if len(addr) != 4 || len(dev) != 4 {
		return nil, fmt.Errorf("%w: address register %d bytes, device register %d bytes, want 4 and 4", errFwdRewrite, len(addr), len(dev))
	}
	var fwd []byte
	fwd = appendAttrBE32(fwd, nftaFwdSregDev, binary.BigEndian.Uint32(dev))
	fwd = appendAttrBE32(fwd, nftaFwdSregAddr, binary.BigEndian.Uint32(addr))
	fwd = appendAttrBE32(fwd, nftaFwdNfproto, nfproto)
	out := appendAttrString(nil, unix.NFTA_EXPR_NAME, "fwd")
	return appendAttr(out, attrs[1].typ, fwd), nil
}

// chainDevicesText is a base chain's ` devices = { ... }` (empty for a chain without devices), after
// checking that devices and hook go together: the ingress hook only in a netdev table, with devices.
func chainDevicesText(fam nftFamily, c *Chain) (string, error) {
	switch {
	case (c.Hook == HookIngress) != fam.netdev:
		return "", fmt.Errorf("hook %s in a table of family %s", c.Hook, fam.tableFamily())
	case c.Hook != HookIngress && len(c.Devices) > 0:
		return "", fmt.Errorf("devices on hook %s", c.Hook)
	case c.Hook == HookIngress && len(c.Devices) == 0:
		return "", errors.New("an ingress chain without devices")
	}
	if len(c.Devices) == 0 {
		return "", nil
	}
	q := make([]string, len(c.Devices))
	for i, d := range c.Devices {
		if d == "" || len(d) >= unix.IFNAMSIZ {
			return "", fmt.Errorf("device name %q", d)
		}
		q[i] = quote(d)
	}
	return " devices = { " + strings.Join(q, ", ") + " }", nil
}

// ifindexIn returns the interface index lookup of the network namespace nsFd (0: the current one),
// where the encoder's fwd devices are (NetlinkProgrammer.NetNSFd).
func ifindexIn(nsFd int) func(string) (int, error) {
	return func(name string) (int, error) {
		if nsFd == 0 {
			i, err := net.InterfaceByName(name)
			if err != nil {
				return 0, err
			}
			return i.Index, nil
		}
		h, err := vnl.NewHandleAt(netns.NsHandle(nsFd))
		if err != nil {
			return 0, err
		}
		defer h.Close()
		l, err := h.LinkByName(name)
		if err != nil {
			return 0, err
		}
		return l.Attrs().Index, nil
	}
}

// decodeFwd reads a fwd expression's attributes (NFTA_EXPR_DATA) as the dup with a device register
// that the encoder writes for it (fwdTo).
func decodeFwd(data []byte) (*expr.Dup, error) {
	attrs, ok := parseRawAttrs(data)
	if !ok {
		return nil, errors.New("malformed attributes")
	}
	d := &expr.Dup{IsRegDevSet: true}
	var dev, addr bool
	for _, a := range attrs {
		if len(a.data) != 4 {
			continue
		}
		switch a.typ {
		case nftaFwdSregDev:
			d.RegDev, dev = binary.BigEndian.Uint32(a.data), true
		case nftaFwdSregAddr:
			d.RegAddr, addr = binary.BigEndian.Uint32(a.data), true
		}
	}
	if !dev || !addr {
		return nil, errors.New("not a fwd to an address and a device (vipgate writes no other)")
	}
	return d, nil
}

// fwdDevice is the name of the device a rule's fwd goes through ("" without one): the index that
// the last immediate before the fwd put into its device register (fwdTo).
func (e *encoder) fwdDevice(xs []expr.Any) string {
	for i, x := range xs {
		d, ok := x.(*expr.Dup)
		if !ok || !d.IsRegDevSet {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			if im, ok := xs[j].(*expr.Immediate); ok && im.Register == d.RegDev && len(im.Data) == 4 {
				if name, ok := e.ifnames[binary.NativeEndian.Uint32(im.Data)]; ok {
					return name
				}
				return fmt.Sprintf("#%d", binary.NativeEndian.Uint32(im.Data)) // no such interface: the proof fails
			}
		}
	}
	return ""
}

// ifindexOf is the index lookup of the interfaces named in names (by index).
func ifindexOf(names map[uint32]string) func(string) (int, error) {
	return func(name string) (int, error) {
		for i, n := range names {
			if n == name {
				return int(i), nil
			}
		}
		return 0, fmt.Errorf("no interface %q", name)
	}
}

// ifnames lists the interfaces of the programmer's network namespace by index.
func (n *NetlinkProgrammer) ifnames() (map[uint32]string, error) {
	var h *vnl.Handle
	var err error
	if n.NetNSFd != 0 {
		h, err = vnl.NewHandleAt(netns.NsHandle(n.NetNSFd))
	} else {
		h, err = vnl.NewHandle()
	}
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]string, len(links))
	for _, l := range links {
		out[uint32(l.Attrs().Index)] = l.Attrs().Name
	}
	return out, nil
}

// Netlink attributes of a chain's hook devices (linux/netfilter/nf_tables.h).
const (
	nftaHookDevs    = 4 // NFTA_HOOK_DEVS
	nftaDeviceName  = 1 // NFTA_DEVICE_NAME
	nftaChainHook   = unix.NFTA_CHAIN_HOOK
	nftaChainName   = unix.NFTA_CHAIN_NAME
	nftaChainTable  = unix.NFTA_CHAIN_TABLE
	nftaHookDevAttr = unix.NFTA_HOOK_DEV
)

// dumpChainDevices lists the hook devices of table's base chains (google/nftables v0.3.0 does not
// read them), by chain name.
func dumpChainDevices(c *netlink.Conn, f cluster.Family, table string) (map[string][]string, error) {
	msg, err := nfMsg(f, unix.NFT_MSG_GETCHAIN, []netlink.Attribute{{Type: unix.NFTA_CHAIN_TABLE, Data: []byte(table + "\x00")}})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	err = dumpEach(c, msg, func(ad *netlink.AttributeDecoder) error {
		var name, tbl string
		var devs []string
		for ad.Next() {
			switch ad.Type() {
			case nftaChainName:
				name = ad.String()
			case nftaChainTable:
				tbl = ad.String()
			case nftaChainHook:
				ad.Nested(func(h *netlink.AttributeDecoder) error {
					var one string
					for h.Next() {
						switch h.Type() {
						case nftaHookDevAttr:
							one = h.String()
						case nftaHookDevs:
							h.Nested(func(d *netlink.AttributeDecoder) error {
								for d.Next() {
									if d.Type() == nftaDeviceName {
										devs = append(devs, d.String())
									}
								}
								return d.Err()
							})
						}
					}
					if len(devs) == 0 && one != "" {
						devs = []string{one}
					}
					return h.Err()
				})
			}
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("decoding chain: %w", err)
		}
		if tbl == table && len(devs) > 0 {
			out[name] = devs
		}
		return nil
	})
	return out, err
}

// MatchFragment: the packet is a fragment, first or not (IPv4: `ip frag-off & 0x3fff != 0`, the
// more-fragments flag or an offset; IPv6: `exthdr frag exists`). Like the gateway's action kinds, the
// number is far from model.go's iota range.
const MatchFragment MatchKind = 64

// fragmentMatch encodes MatchFragment as nft does.
func (e *encoder) fragmentMatch() []expr.Any {
	if e.f == cluster.IPv6 {
		return []expr.Any{
			&expr.Exthdr{DestRegister: reg1, Type: unix.IPPROTO_FRAGMENT, Offset: 0, Len: 1, Flags: unix.NFT_EXTHDR_F_PRESENT, Op: expr.ExthdrOpIpv6},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{1}},
		}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: []byte{0x3f, 0xff}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0, 0}},
	}
}

// fragmentText is MatchFragment's nft spelling.
func fragmentText(fam nftFamily) string {
	if fam.table == "ip6" {
		return "exthdr frag exists"
	}
	return "ip frag-off & 0x3fff != 0"
}

// MatchPktTypeHost: the frame is addressed to this host (`meta pkttype host`: PACKET_HOST, not a
// broadcast, multicast or another host's frame that a promiscuous device passes up).
const MatchPktTypeHost MatchKind = 65

// pktTypeHostMatch encodes MatchPktTypeHost as nft does.
func pktTypeHostMatch() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.PACKET_HOST}},
	}
}
