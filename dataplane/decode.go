package dataplane

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// This file is the inverse of netlink.go: it reads vipgate's table back from the kernel and decodes
// it into the model (a Flat), so that `vipgate explain` traces a packet through the rules the kernel
// really holds, not through what vipgate believes it programmed.
//
// Rules are decoded by proposal and proof: the expressions of a rule suggest a candidate match or
// action (its parameters taken from the expressions), the encoder of netlink.go encodes the
// candidate, and the candidate is accepted only if that encoding equals the kernel's expressions
// (after normalising what the kernel legitimately rewrites, such as register numbering). So the
// decoder can never accept a shape netlink.go does not emit, and a rule that matches no known shape is
// an error that names its chain and rule — never skipped.
//
// Sets and elements are read with our own netlink dump rather than google/nftables v0.3.0, whose
// decoders lose the key type of verdict maps (setsFromMsg overwrites KeyType with the data type) and
// the verdict of verdict-map elements (decodeElement only keeps NFTA_DATA_VALUE).

// KernelSet is a set as the kernel describes it (NFT_MSG_GETSET).
type KernelSet struct {
	Name       string
	Flags      uint32
	KeyType    uint32
	KeyLen     uint32
	DataType   uint32
	DataLen    uint32
	Timeout    time.Duration
	HasData    bool
	HasTimeout bool
}

// KernelElement is a set element as the kernel describes it (NFT_MSG_GETSETELEM).
type KernelElement struct {
	Key         []byte
	Data        []byte
	IntervalEnd bool
	// Verdict is set for verdict-map elements.
	Verdict *expr.Verdict
}

// KernelTable is everything the kernel holds for one table, undecoded.
type KernelTable struct {
	Family cluster.Family
	Name   string
	// Chains in kernel order, and the rules of each.
	Chains   []*nftables.Chain
	Rules    map[string][]*nftables.Rule
	Sets     []KernelSet
	Elements map[string][]KernelElement
	// Netdev tables (gateway_netdev.go): the devices of each base chain's hook, and the names of the
	// namespace's interfaces by index (fwd names its device by index).
	Devices map[string][]string
	Ifnames map[uint32]string
}

// nftDataVerdict is NFT_DATA_VERDICT, the data type the kernel reports for verdict maps.
const nftDataVerdict = 0xffffff00

// ReadTable reads table name of family f back from the kernel (the namespace of NetNSFd, else the
// current one) and decodes it into the model. Dynamic sets (session-affinity clients) are runtime
// state, not program, and their elements are left out.
func (n *NetlinkProgrammer) ReadTable(f cluster.Family, name string) (*Flat, error) {
	kt, err := n.ReadKernelTable(f, name)
	if err != nil {
		return nil, err
	}
	return DecodeTable(kt, n.Decode)
}

// ReadKernelTable reads table name of family f from the kernel without decoding it.
func (n *NetlinkProgrammer) ReadKernelTable(f cluster.Family, name string) (*KernelTable, error) {
	fam := tableFamily(f)
	fname := familyName(f)
	// A lasting connection: one socket for the whole read instead of one per chain listed.
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if n.NetNSFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(n.NetNSFd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink connection: %w", err)
	}
	defer c.CloseLasting()
	// The family's tables are listed and searched rather than the one asked for (ListTableOfFamily):
	// its "not exactly one table" answer is an untyped error only its text tells apart.
	tables, err := c.ListTablesOfFamily(fam)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("reading table %s %s (reading nftables needs CAP_NET_ADMIN; run as root): %w", fname, name, err)
		}
		return nil, fmt.Errorf("reading table %s %s: %w", fname, name, err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == name && t.Family == fam })
	if i < 0 {
		return nil, &TableNotFoundError{Family: f, Table: name}
	}
	t := tables[i]
	kt := &KernelTable{Family: f, Name: name, Rules: map[string][]*nftables.Rule{}, Elements: map[string][]KernelElement{}}
	chains, err := c.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("listing chains of %s %s: %w", fname, name, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != name {
			continue
		}
		kt.Chains = append(kt.Chains, ch)
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return nil, fmt.Errorf("listing rules of chain %s in %s %s: %w", ch.Name, fname, name, err)
		}
		kt.Rules[ch.Name] = rules
	}
	raw, err := n.rawConn()
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	if isNetdev(f) {
		if kt.Devices, err = dumpChainDevices(raw, f, name); err != nil {
			return nil, fmt.Errorf("listing chains of %s %s: %w", fname, name, err)
		}
		if kt.Ifnames, err = n.ifnames(); err != nil {
			return nil, fmt.Errorf("listing interfaces: %w", err)
		}
	}
	ruleExprs, err := dumpRuleExprs(raw, f, name)
	if err != nil {
		return nil, fmt.Errorf("listing rules of %s %s: %w", fname, name, err)
	}
	if err := completeRuleExprs(kt, ruleExprs); err != nil {
		return nil, fmt.Errorf("table %s %s: %w", fname, name, err)
	}
	if kt.Sets, err = dumpSets(raw, f, name); err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", fname, name, err)
	}
	for _, s := range kt.Sets {
		if s.Flags&unix.NFT_SET_EVAL != 0 {
			continue // dynamic: filled by packets
		}
		els, err := dumpElements(raw, f, name, s.Name)
		if err != nil {
			return nil, fmt.Errorf("listing elements of set %s in %s %s: %w", s.Name, fname, name, err)
		}
		kt.Elements[s.Name] = els
	}
	return kt, nil
}

// TableNotFoundError says that the table ReadTable or ReadKernelTable was asked for does not exist
// in the network namespace it looked in.
type TableNotFoundError struct {
	Family cluster.Family
	Table  string
}

func (e *TableNotFoundError) Error() string {
	return fmt.Sprintf("table %s %s does not exist in this network namespace (is vipgate node running here?)", familyName(e.Family), e.Table)
}

func familyName(f cluster.Family) string {
	if isNetdev(f) {
		return "netdev"
	}
	if f == cluster.IPv6 {
		return "ip6"
	}
	return "ip"
}

// rawConn opens a plain nfnetlink socket for the dumps google/nftables decodes lossily.
func (n *NetlinkProgrammer) rawConn() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.NetNSFd})
	if err != nil {
		return nil, fmt.Errorf("opening netfilter netlink socket: %w", err)
	}
	// A dump of a big map is many messages, a full sync one big batch: large buffers avoid ENOBUFS
	// and EMSGSIZE.
	if err := n.socketBuffers(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func nfMsg(f cluster.Family, typ uint16, attrs []netlink.Attribute) (netlink.Message, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return netlink.Message{}, err
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ),
			Flags: netlink.Request | netlink.Dump,
		},
		// nfgenmsg: family, version NFNETLINK_V0, resource id 0.
		Data: append([]byte{byte(tableFamily(f)), unix.NFNETLINK_V0, 0, 0}, data...),
	}, nil
}

func dumpSets(c *netlink.Conn, f cluster.Family, table string) ([]KernelSet, error) {
	msg, err := nfMsg(f, unix.NFT_MSG_GETSET, []netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: []byte(table + "\x00")}})
	if err != nil {
		return nil, err
	}
	var out []KernelSet
	err = dumpEach(c, msg, func(ad *netlink.AttributeDecoder) error {
		var s KernelSet
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_NAME:
				s.Name = ad.String()
			case unix.NFTA_SET_FLAGS:
				s.Flags = ad.Uint32()
			case unix.NFTA_SET_KEY_TYPE:
				s.KeyType = ad.Uint32()
			case unix.NFTA_SET_KEY_LEN:
				s.KeyLen = ad.Uint32()
			case unix.NFTA_SET_DATA_TYPE:
				s.DataType, s.HasData = ad.Uint32(), true
			case unix.NFTA_SET_DATA_LEN:
				s.DataLen = ad.Uint32()
			case unix.NFTA_SET_TIMEOUT:
				s.Timeout, s.HasTimeout = time.Duration(ad.Uint64())*time.Millisecond, true
			}
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("decoding set: %w", err)
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

// dumpEach runs a netlink dump and calls each with the attributes of every reply (after the nfgenmsg
// header), big-endian as nftables sends them.
func dumpEach(c *netlink.Conn, msg netlink.Message, each func(*netlink.AttributeDecoder) error) error {
	replies, err := c.Execute(msg)
	if err != nil {
		return err
	}
	for _, r := range replies {
		if len(r.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(r.Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		if err := each(ad); err != nil {
			return err
		}
	}
	return nil
}

// Bounds of dumpElements' retries: a dump is read again after dumpRetryWait, doubling, at most
// dumpAttempts times in all (about 0.3 s of waiting).
const (
	dumpAttempts  = 6
	dumpRetryWait = 10 * time.Millisecond
)

// dumpElements dumps the elements of a set. A dump of many elements takes several messages, and
// for each the kernel walks the set from its start again, skipping the elements it has sent
// (nf_tables_dump_set, iter.skip). A hash set (nft_set_hash's rhashtable) that is being resized,
// which it does in a worker after a large insertion such as a full sync, changes its walk order
// between those walks: the messages then repeat some elements and leave as many others out (a
// Maglev table of 3,063 elements read back at once after it was written: 47 repeated). A walk
// visits every element at least once, so a dump without repeats is complete; one with repeats is
// read again once the resize has had time to end, and after dumpAttempts an error says so rather
// than returning a set with elements missing.
func dumpElements(c *netlink.Conn, f cluster.Family, table, set string) ([]KernelElement, error) {
	wait := dumpRetryWait
	for attempt := 1; ; attempt++ {
		out, err := dumpElementsOnce(c, f, table, set)
		if err != nil {
			return nil, err
		}
		n := repeatedElements(out)
		if n == 0 {
			return out, nil
		}
		if attempt == dumpAttempts {
			return nil, fmt.Errorf("the kernel's dump repeated %d of %d elements (and so left as many out) in each of %d attempts: the set's hash table is still being resized", n, len(out), dumpAttempts)
		}
		time.Sleep(wait)
		wait *= 2
	}
}

// repeatedElements counts the elements of a dump that an earlier one in it has already given: the
// same key (and, for an interval set, the same end flag: one range's end may be the next's start).
func repeatedElements(els []KernelElement) int {
	idx := make([]int, len(els))
	for i := range idx {
		idx[i] = i
	}
	compare := func(i, j int) int {
		return cmp.Or(bytes.Compare(els[i].Key, els[j].Key), cmp.Compare(boolInt(els[i].IntervalEnd), boolInt(els[j].IntervalEnd)))
	}
	slices.SortFunc(idx, compare)
	n := 0
	for k := 1; k < len(idx); k++ {
		if compare(idx[k-1], idx[k]) == 0 {
			n++
		}
	}
	return n
}

// dumpElementsOnce is one dump of a set's elements, as the kernel sends it.
func dumpElementsOnce(c *netlink.Conn, f cluster.Family, table, set string) ([]KernelElement, error) {
	msg, err := nfMsg(f, unix.NFT_MSG_GETSETELEM, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	var out []KernelElement
	err = dumpEach(c, msg, func(ad *netlink.AttributeDecoder) error {
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					if list.Type() != unix.NFTA_LIST_ELEM {
						continue
					}
					var e KernelElement
					list.Nested(func(el *netlink.AttributeDecoder) error {
						return decodeElementAttrs(el, &e)
					})
					out = append(out, e)
				}
				return nil
			})
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("decoding elements: %w", err)
		}
		return nil
	})
	return out, err
}

func decodeElementAttrs(ad *netlink.AttributeDecoder, e *KernelElement) error {
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_KEY:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					if d.Type() == unix.NFTA_DATA_VALUE {
						e.Key = d.Bytes()
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_DATA:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				d.ByteOrder = binary.BigEndian
				for d.Next() {
					switch d.Type() {
					case unix.NFTA_DATA_VALUE:
						e.Data = d.Bytes()
					case unix.NFTA_DATA_VERDICT:
						v := &expr.Verdict{}
						d.Nested(func(vd *netlink.AttributeDecoder) error {
							vd.ByteOrder = binary.BigEndian
							for vd.Next() {
								switch vd.Type() {
								case unix.NFTA_VERDICT_CODE:
									v.Kind = expr.VerdictKind(int32(vd.Uint32()))
								case unix.NFTA_VERDICT_CHAIN:
									v.Chain = vd.String()
								}
							}
							return nil
						})
						e.Verdict = v
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_FLAGS:
			e.IntervalEnd = ad.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		}
	}
	return nil
}

// CompareBaseChains orders base chains as the decoder puts them: filter before nat, then by
// priority, then by hook along the packet's path (prerouting, input, forward, output,
// postrouting, ingress); chains equal in all three keep the kernel's order. A role that builds its
// base chains in this order reads its table back as rendered (the node's schema does:
// proxy's TestBaseChainsInDecodeOrder), and the tracer meets base chains of one hook and priority
// in the same order either way.
func CompareBaseChains(a, b *Chain) int {
	return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Priority, b.Priority), cmp.Compare(hookRank(a.Hook), hookRank(b.Hook)))
}

// hookRank is a hook's place along a packet's path (HookIngress, and any other, last).
func hookRank(h Hook) int {
	switch h {
	case HookPrerouting:
		return 0
	case HookInput:
		return 1
	case HookForward:
		return 2
	case HookOutput:
		return 3
	case HookPostrouting:
		return 4
	}
	return 5
}

// DecodeOptions are what a role tells the decoder about its tables; decoding needs neither.
type DecodeOptions struct {
	// RestoreComments puts back rule comments in the chains of f in legacy: chains none of whose
	// rules carries a comment in its userdata, written by a vipgate from before netlink.go put
	// rule comments there, which a vipgate adopting such a table keeps until it changes them.
	// The role knows its rules' comments (the node's: proxy.RestoreComments). Nil: such chains
	// have none.
	RestoreComments func(f *Flat, legacy map[string]bool)
}

// DecodeTable decodes a table read from the kernel into the model. Anything that is not a shape
// netlink.go emits is an error naming where it is.
func DecodeTable(kt *KernelTable, o DecodeOptions) (*Flat, error) {
	fam := familyName(kt.Family)
	where := fmt.Sprintf("table %s %s", fam, kt.Name)
	f := &Flat{Family: kt.Family, Table: kt.Name, Chains: map[string]*Chain{}, Sets: map[string]*Set{}, Elements: map[string][]Element{}}
	enc := &encoder{f: ipFamily(kt.Family), netdev: isNetdev(kt.Family), sets: map[string]*nftables.Set{}, kinds: f.Sets, chains: map[string]*nftables.Chain{},
		ifnames: kt.Ifnames, ifindex: ifindexOf(kt.Ifnames)}

	for _, ks := range kt.Sets {
		s, err := decodeSet(enc, ks)
		if err != nil {
			return nil, fmt.Errorf("%s: set %s: %w", where, ks.Name, err)
		}
		f.Sets[s.Name] = s
		f.SetOrder = append(f.SetOrder, s.Name)
	}
	for _, name := range f.SetOrder {
		s := f.Sets[name]
		els, err := decodeElements(ipFamily(kt.Family), s, kt.Elements[name])
		if err != nil {
			return nil, fmt.Errorf("%s: set %s: %w", where, name, err)
		}
		if len(els) > 0 {
			f.Elements[name] = els
		}
	}
	var base, regular []string
	// legacy lists the chains none of whose rules carries userdata: written by a vipgate that did
	// not put comments there (or without comments at all), see DecodeOptions.RestoreComments.
	legacy := map[string]bool{}
	for _, kc := range kt.Chains {
		ch, err := decodeChain(kc, isNetdev(kt.Family), kt.Devices[kc.Name])
		if err != nil {
			return nil, fmt.Errorf("%s: chain %s: %w", where, kc.Name, err)
		}
		userdata := false
		for i, kr := range kt.Rules[kc.Name] {
			r, err := decodeRule(enc, kr.Exprs)
			if err != nil {
				return nil, fmt.Errorf("%s: chain %s rule %d (handle %d): %w", where, kc.Name, i, kr.Handle, err)
			}
			if c, ok := userDataComment(kr.UserData); ok {
				// Only a comment record counts: other or malformed userdata leaves the chain to
				// the guess of tables written before comments went to the kernel.
				userdata = true
				r.Comment = c
			}
			ch.Rules = append(ch.Rules, r)
		}
		if !userdata {
			legacy[ch.Name] = true
		}
		f.Chains[ch.Name] = ch
		if ch.IsBase() {
			base = append(base, ch.Name)
		} else {
			regular = append(regular, ch.Name)
		}
	}
	// Base chains first, in CompareBaseChains' order, so the table reads as rendered.
	slices.SortStableFunc(base, func(a, b string) int { return CompareBaseChains(f.Chains[a], f.Chains[b]) })
	f.ChainOrder = append(base, regular...)
	// The node ids of the connection table's slot maps, by the node map their rules name.
	if err := resolveGatewayMarks(f); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if o.RestoreComments != nil && len(legacy) > 0 {
		o.RestoreComments(f, legacy)
	}
	return f, nil
}

// decodeSet finds the one set kind whose encoding has this key, data and flags (trying every kind of
// kinds.go, allSetKinds).
func decodeSet(enc *encoder, ks KernelSet) (*Set, error) {
	if ks.Flags&unix.NFT_SET_ANONYMOUS != 0 {
		return nil, errors.New("anonymous set: vipgate never creates one")
	}
	var found []SetKind
	for _, k := range allSetKinds {
		ns, err := enc.nftSet(&Set{Name: ks.Name, Kind: k})
		if err != nil {
			return nil, err
		}
		if ks.KeyType != ns.KeyType.GetNFTMagic() || ks.KeyLen != ns.KeyType.Bytes {
			continue
		}
		if ks.Flags&unix.NFT_SET_MAP != 0 != ns.IsMap || ks.Flags&unix.NFT_SET_INTERVAL != 0 != ns.Interval ||
			ks.Flags&unix.NFT_SET_TIMEOUT != 0 != ns.HasTimeout || ks.Flags&unix.NFT_SET_EVAL != 0 != ns.Dynamic {
			continue
		}
		if ns.IsMap {
			want := ns.DataType.GetNFTMagic()
			if ns.DataType == nftables.TypeVerdict {
				want = nftDataVerdict
			}
			if ks.DataType != want {
				continue
			}
		}
		found = append(found, k)
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("key type %#x (%d bytes), data type %#x, flags %#x match %d of vipgate's set shapes, want exactly one",
			ks.KeyType, ks.KeyLen, ks.DataType, ks.Flags, len(found))
	}
	s := &Set{Name: ks.Name, Kind: found[0]}
	if setKindDescs[s.Kind].timeout {
		s.Timeout = ks.Timeout
	}
	return s, nil
}

// decodeElements turns kernel elements into model elements (an interval's start and end into one
// prefix element).
func decodeElements(f cluster.Family, s *Set, kes []KernelElement) ([]Element, error) {
	alen := 4
	if f == cluster.IPv6 {
		alen = 16
	}
	if d := setKindDescs[s.Kind]; d != nil && d.intervals {
		return decodeIntervals(s.Name, alen, kes)
	}
	out := make([]Element, 0, len(kes))
	for i, ke := range kes {
		el, err := decodeElement(s, alen, ke)
		if err != nil {
			return nil, fmt.Errorf("element %d (key %x): %w", i, ke.Key, err)
		}
		out = append(out, el)
	}
	return out, nil
}

// keyReader walks the 4-byte-aligned fields of a concatenated key.
type keyReader struct {
	b   []byte
	err error
}

func (r *keyReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("key too short: %d bytes left, field needs %d", len(r.b), n)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *keyReader) addr(alen int) netip.Addr {
	b := r.take(alen)
	if b == nil {
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// padded reads a field of n bytes padded to 4, and checks the padding is zero.
func (r *keyReader) padded(n int) []byte {
	b := r.take(4)
	if b == nil {
		return nil
	}
	for _, x := range b[n:] {
		if x != 0 && r.err == nil {
			r.err = fmt.Errorf("non-zero padding in field %x", b)
		}
	}
	return b[:n]
}

func (r *keyReader) proto() uint8 {
	b := r.padded(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *keyReader) port() uint16 {
	b := r.padded(2)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

func (r *keyReader) hostU32() uint32 {
	b := r.take(4)
	if b == nil {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

func (r *keyReader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d unexpected trailing bytes", len(r.b))
	}
	return r.err
}

// decodeElement decodes one element with its set kind's decoder (kinds.go).
func decodeElement(s *Set, alen int, ke KernelElement) (Element, error) {
	d := setKindDescs[s.Kind]
	if d == nil || d.decode == nil {
		return Element{Set: s.Name}, fmt.Errorf("set kind %d has no element decoder", s.Kind)
	}
	return d.decode(s, alen, ke)
}

// elementData is the shape of an element's data, for keyedElement.
type elementData uint8

const (
	dataNone     elementData = iota // a plain set: no data
	dataVerdict                     // a verdict map: goto or drop
	dataEndpoint                    // DataAddr . DataPort
	dataAddr                        // DataAddr
	dataRead                        // the kind's own: its read reads the data too
)

// keyedElement is the element decoder of a set kind whose elements read reads from the key (and,
// for dataRead, the data), with data of shape data.
func keyedElement(data elementData, read func(el *Element, k, d *keyReader, alen int)) func(s *Set, alen int, ke KernelElement) (Element, error) {
	return func(s *Set, alen int, ke KernelElement) (Element, error) {
		el := Element{Set: s.Name}
		k := &keyReader{b: ke.Key}
		d := &keyReader{b: ke.Data}
		read(&el, k, d, alen)
		return finishElement(el, k, d, data, alen, ke)
	}
}

// finishElement checks what is left of the key and reads the data of shape data.
func finishElement(el Element, k, d *keyReader, data elementData, alen int, ke KernelElement) (Element, error) {
	verdictMap, dataMap, addrMap, described := data == dataVerdict, data == dataEndpoint, data == dataAddr, data == dataRead
	if err := k.done(); err != nil {
		return el, fmt.Errorf("key: %w", err)
	}
	if ke.IntervalEnd {
		return el, errors.New("interval end in a set without intervals")
	}
	switch {
	case verdictMap:
		if ke.Verdict == nil {
			return el, errors.New("verdict map element without a verdict")
		}
		switch v := ke.Verdict; {
		case v.Kind == expr.VerdictGoto && v.Chain == ChainReject:
			el.Verdict, el.Chain = VerdictReject, ChainReject
		case v.Kind == expr.VerdictGoto && v.Chain != "":
			el.Verdict, el.Chain = VerdictGoto, v.Chain
		case v.Kind == expr.VerdictDrop:
			el.Verdict = VerdictDrop
		default:
			return el, fmt.Errorf("verdict %d (chain %q): vipgate's maps only hold goto and drop", v.Kind, v.Chain)
		}
	case described:
		if err := d.done(); err != nil {
			return el, fmt.Errorf("data: %w", err)
		}
	case dataMap, addrMap:
		el.DataAddr = d.addr(alen)
		if dataMap {
			el.DataPort = d.port()
		}
		if err := d.done(); err != nil {
			return el, fmt.Errorf("data: %w", err)
		}
	default:
		if ke.Data != nil || ke.Verdict != nil {
			return el, errors.New("data in a plain set")
		}
	}
	return el, nil
}

// decodeIntervals pairs interval starts with their ends and turns each range back into the prefix
// netlink.go encoded. A range that is not exactly one prefix was not written by vipgate.
func decodeIntervals(set string, alen int, kes []KernelElement) ([]Element, error) {
	type point struct {
		a   netip.Addr
		end bool
	}
	pts := make([]point, 0, len(kes))
	for _, ke := range kes {
		if len(ke.Key) != alen {
			return nil, fmt.Errorf("interval key %x: want %d bytes", ke.Key, alen)
		}
		a, _ := netip.AddrFromSlice(ke.Key)
		pts = append(pts, point{a, ke.IntervalEnd})
	}
	// Ascending; at the same address an end (of the range before) sorts before a start.
	slices.SortFunc(pts, func(x, y point) int {
		if c := x.a.Compare(y.a); c != 0 {
			return c
		}
		if x.end == y.end {
			return 0
		}
		if x.end {
			return -1
		}
		return 1
	})
	var out []Element
	for i := 0; i < len(pts); i++ {
		if pts[i].end {
			return nil, fmt.Errorf("interval end %s without a start", pts[i].a)
		}
		start := pts[i].a
		var end netip.Addr // invalid: to the end of the address space
		if i+1 < len(pts) && pts[i+1].end {
			end = pts[i+1].a
			i++
		}
		p, err := rangePrefix(start, end)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", set, err)
		}
		out = append(out, Element{Set: set, Prefix: p})
	}
	return out, nil
}

// rangePrefix returns the prefix that covers exactly [start, end) (end invalid: to the top).
func rangePrefix(start, end netip.Addr) (netip.Prefix, error) {
	for b := 0; b <= start.BitLen(); b++ {
		p := netip.PrefixFrom(start, b)
		if p.Masked().Addr() != start {
			continue
		}
		e, ok := prefixEnd(p)
		if ok == end.IsValid() && (!ok || e == end) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("interval [%s, %s) is not a single prefix", start, end)
}

func decodeChain(kc *nftables.Chain, netdev bool, devices []string) (*Chain, error) {
	ch := &Chain{Name: kc.Name}
	if kc.Hooknum == nil {
		return ch, nil
	}
	if netdev {
		// The netdev family's hooks are numbered apart: ingress is 0, as prerouting is in ip.
		if *kc.Hooknum != *nftables.ChainHookIngress || kc.Type != nftables.ChainTypeFilter {
			return nil, fmt.Errorf("hook %d type %q: vipgate's netdev chains are filter chains at ingress", *kc.Hooknum, kc.Type)
		}
		if len(devices) == 0 {
			return nil, errors.New("an ingress chain without devices")
		}
		ch.Type, ch.Hook, ch.Devices = FilterType, HookIngress, devices
		if kc.Priority != nil {
			ch.Priority = int(*kc.Priority)
		}
		if kc.Policy != nil && *kc.Policy != nftables.ChainPolicyAccept {
			return nil, fmt.Errorf("policy %d: vipgate's base chains accept", *kc.Policy)
		}
		return ch, nil
	}
	hooks := []struct {
		h  *nftables.ChainHook
		to Hook
	}{
		{nftables.ChainHookPrerouting, HookPrerouting}, {nftables.ChainHookInput, HookInput},
		{nftables.ChainHookForward, HookForward}, {nftables.ChainHookOutput, HookOutput},
		{nftables.ChainHookPostrouting, HookPostrouting},
	}
	for _, h := range hooks {
		if *kc.Hooknum == *h.h {
			ch.Hook = h.to
		}
	}
	if ch.Hook == "" {
		return nil, fmt.Errorf("hook %d is not one vipgate uses", *kc.Hooknum)
	}
	switch kc.Type {
	case nftables.ChainTypeNAT:
		ch.Type = NATType
	case nftables.ChainTypeFilter:
		ch.Type = FilterType
	default:
		return nil, fmt.Errorf("chain type %q is not one vipgate uses", kc.Type)
	}
	if kc.Priority != nil {
		ch.Priority = int(*kc.Priority)
	}
	if kc.Policy != nil && *kc.Policy != nftables.ChainPolicyAccept {
		return nil, fmt.Errorf("policy %d: vipgate's base chains accept", *kc.Policy)
	}
	return ch, nil
}

// hints are the parameters a run of expressions offers to candidate matches and actions: the first
// of each kind from the current position on. A wrong hint only makes a candidate fail its proof.
type hints struct {
	// set and set2 are the first two lookups' sets.
	set, set2, dynset string
	modulus           uint32
	mask, xor         []byte
	cmpData           []byte
	imm               [][]byte
	verdict           *expr.Verdict
}

func gatherHints(xs []expr.Any) hints {
	var h hints
	for _, x := range xs {
		switch e := x.(type) {
		case *expr.Lookup:
			if h.set != "" && h.set2 == "" {
				h.set2 = e.SetName
			}
			h.set = cmp.Or(h.set, e.SetName)
		case *expr.Dynset:
			h.dynset = cmp.Or(h.dynset, e.SetName)
		case *expr.Numgen:
			h.modulus = cmp.Or(h.modulus, e.Modulus)
		case *expr.Hash:
			h.modulus = cmp.Or(h.modulus, e.Modulus)
		case *expr.Bitwise:
			if h.mask == nil {
				h.mask, h.xor = e.Mask, e.Xor
			}
		case *expr.Cmp:
			if h.cmpData == nil {
				h.cmpData = e.Data
			}
		case *expr.Immediate:
			h.imm = append(h.imm, e.Data)
		case *expr.Verdict:
			if h.verdict == nil {
				h.verdict = e
			}
		}
	}
	return h
}

func u32(b []byte) uint32 {
	if len(b) != 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

// match is the candidate match of kind k the hints propose (its descriptor's hint, kinds.go).
func (h hints) match(k MatchKind) Match {
	var m Match
	if d := matchKindDescs[k]; d != nil {
		m = d.hint(h)
	}
	m.Kind = k
	return m
}

// action is the candidate action of kind k the hints propose (its descriptor's hint, kinds.go).
func (h hints) action(k ActionKind) Action {
	var a Action
	if d := actionKindDescs[k]; d != nil {
		a = d.hint(h)
	}
	a.Kind = k
	return a
}

// decodeRule decodes one rule: matches from the front, then one action that takes the rest.
func decodeRule(enc *encoder, xs []expr.Any) (Rule, error) {
	var r Rule
	if enc.netdev {
		// A netdev rule starts with the dependency of its payload matches (gateway_netdev.go).
		dep := enc.protoDependency()
		if len(xs) < len(dep) || !sameExprs(dep, xs[:len(dep)]) {
			return r, fmt.Errorf("no meta protocol match in front of [%s]", exprsText(xs))
		}
		xs = xs[len(dep):]
	}
	dev := enc.fwdDevice(xs)
	pos := 0
	for {
		rest := xs[pos:]
		h := gatherHints(rest)
		// The action, if it accounts for everything that is left. The candidates are every kind of
		// kinds.go, in ascending order.
		for _, k := range actionKinds {
			a := h.action(k)
			a.Device = dev
			want, err := enc.action(a)
			if err != nil {
				continue // e.g. a hinted set that the table does not have
			}
			if sameExprs(want, rest) {
				r.Action = a
				return r, nil
			}
		}
		matched := false
		for _, k := range matchKinds {
			m := h.match(k)
			want, err := enc.match(m)
			if err != nil || len(want) > len(rest) {
				continue
			}
			if sameExprs(want, rest[:len(want)]) {
				r.Matches = append(r.Matches, m)
				pos += len(want)
				matched = true
				break
			}
		}
		if !matched {
			return r, fmt.Errorf("no known match or action at expression %d of [%s]", pos, exprsText(xs))
		}
	}
}

// exprsText lists expressions for error messages.
func exprsText(xs []expr.Any) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = canonExpr(x)
	}
	return strings.Join(parts, "; ")
}

func sameExprs(a, b []expr.Any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if canonExpr(a[i]) != canonExpr(b[i]) {
			return false
		}
	}
	return true
}

// regIdx maps a register number to its storage: the kernel keeps registers as 4-byte slots and dumps
// a 16-byte register (1-4) whenever the slot is 16-byte aligned, so reg32 8 comes back as reg 1.
func regIdx(r uint32) uint32 {
	if r <= 4 {
		return r * 4
	}
	return r - 8 + 4
}

// canonExpr spells an expression with only what netlink.go sets and the kernel keeps, so the encoder's
// expressions and the kernel's compare equal exactly when they mean the same.
func canonExpr(x expr.Any) string {
	switch e := x.(type) {
	case *expr.Payload:
		c := *e
		c.DestRegister, c.SourceRegister = regIdx(c.DestRegister), regIdx(c.SourceRegister)
		return fmt.Sprintf("payload%+v", c)
	case *expr.Meta:
		c := *e
		c.Register = regIdx(c.Register)
		return fmt.Sprintf("meta%+v", c)
	case *expr.Ct:
		c := *e
		c.Register = regIdx(c.Register)
		return fmt.Sprintf("ct%+v", c)
	case *expr.Bitwise:
		return fmt.Sprintf("bitwise{sreg:%d dreg:%d len:%d mask:%x xor:%x}", regIdx(e.SourceRegister), regIdx(e.DestRegister), e.Len, e.Mask, e.Xor)
	case *expr.Cmp:
		return fmt.Sprintf("cmp{op:%d reg:%d data:%x}", e.Op, regIdx(e.Register), e.Data)
	case *expr.Lookup:
		dreg := "-"
		if e.IsDestRegSet {
			dreg = fmt.Sprint(regIdx(e.DestRegister))
		}
		return fmt.Sprintf("lookup{set:%s sreg:%d dreg:%s invert:%v}", e.SetName, regIdx(e.SourceRegister), dreg, e.Invert)
	case *expr.Dynset:
		// The kernel reports the set's timeout on the dynset; the encoder leaves it to the set.
		return fmt.Sprintf("dynset{set:%s sregkey:%d sregdata:%d op:%d invert:%v exprs:%d}", e.SetName, regIdx(e.SrcRegKey), regIdx(e.SrcRegData), e.Operation, e.Invert, len(e.Exprs))
	case *expr.Fib:
		c := *e
		c.Register = regIdx(c.Register)
		return fmt.Sprintf("fib%+v", c)
	case *expr.Numgen:
		c := *e
		c.Register = regIdx(c.Register)
		return fmt.Sprintf("numgen%+v", c)
	case *expr.Hash:
		return fmt.Sprintf("hash{sreg:%d dreg:%d len:%d mod:%d seed:%#x offset:%d type:%d}",
			regIdx(e.SourceRegister), regIdx(e.DestRegister), e.Length, e.Modulus, e.Seed, e.Offset, e.Type)
	case *expr.Dup:
		return fmt.Sprintf("dup{addr:%d dev:%d devset:%v}", regIdx(e.RegAddr), regIdx(e.RegDev), e.IsRegDevSet)
	case *expr.NAT:
		c := *e
		// The kernel fills in the range maxima from the minima and flags the given parts.
		norm := func(min, max uint32) (uint32, uint32) {
			if max == min {
				max = 0
			}
			return regIdx(min), regIdx(max)
		}
		c.RegAddrMin, c.RegAddrMax = norm(c.RegAddrMin, c.RegAddrMax)
		c.RegProtoMin, c.RegProtoMax = norm(c.RegProtoMin, c.RegProtoMax)
		c.Specified = false
		return fmt.Sprintf("nat%+v", c)
	case *expr.Masq:
		c := *e
		c.RegProtoMin, c.RegProtoMax = regIdx(c.RegProtoMin), regIdx(c.RegProtoMax)
		return fmt.Sprintf("masq%+v", c)
	case *expr.Reject:
		return fmt.Sprintf("reject%+v", *e)
	case *expr.Verdict:
		return fmt.Sprintf("verdict{kind:%d chain:%s}", e.Kind, e.Chain)
	case *expr.Immediate:
		return fmt.Sprintf("immediate{reg:%d data:%x}", regIdx(e.Register), e.Data)
	}
	return fmt.Sprintf("unknown %T %+v", x, x)
}

// FlatEqual reports whether two tables hold the same chains, rules, sets and elements, ignoring
// comments (vipgate's chain comments are not programmed, and rule comments are not program: a table
// written before they went into the rules' userdata lacks them) and element order. It returns a
// description of the first difference.
func FlatEqual(a, b *Flat) (bool, string) {
	if a.Family != b.Family || a.Table != b.Table {
		return false, fmt.Sprintf("table IPv%d %s vs IPv%d %s", a.Family, a.Table, b.Family, b.Table)
	}
	for _, n := range sortedKeys(a.Chains, b.Chains) {
		x, y := a.Chains[n], b.Chains[n]
		if x == nil || y == nil {
			return false, fmt.Sprintf("chain %s only on one side", n)
		}
		if x.Type != y.Type || x.Hook != y.Hook || x.Priority != y.Priority || len(x.Rules) != len(y.Rules) || !slices.Equal(x.Devices, y.Devices) {
			return false, fmt.Sprintf("chain %s: %+v vs %+v", n, *x, *y)
		}
		for i := range x.Rules {
			rx, ry := x.Rules[i], y.Rules[i]
			if rx.Action != ry.Action || !slices.Equal(rx.Matches, ry.Matches) {
				return false, fmt.Sprintf("chain %s rule %d: %+v vs %+v", n, i, rx, ry)
			}
		}
	}
	for _, n := range sortedKeys(a.Sets, b.Sets) {
		x, y := a.Sets[n], b.Sets[n]
		if x == nil || y == nil {
			return false, fmt.Sprintf("set %s only on one side", n)
		}
		if x.Kind != y.Kind || x.Timeout != y.Timeout {
			return false, fmt.Sprintf("set %s: %+v vs %+v", n, *x, *y)
		}
	}
	for _, n := range sortedKeys(a.Elements, b.Elements) {
		x, y := slices.Clone(a.Elements[n]), slices.Clone(b.Elements[n])
		slices.SortFunc(x, compareElements)
		slices.SortFunc(y, compareElements)
		if !slices.Equal(x, y) {
			for i := 0; i < max(len(x), len(y)); i++ {
				switch {
				case i >= len(x):
					return false, fmt.Sprintf("set %s: only the second has %+v", n, y[i])
				case i >= len(y):
					return false, fmt.Sprintf("set %s: only the first has %+v", n, x[i])
				case x[i] != y[i]:
					return false, fmt.Sprintf("set %s: %+v vs %+v", n, x[i], y[i])
				}
			}
		}
	}
	return true, ""
}

func sortedKeys[V any](a, b map[string]V) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
