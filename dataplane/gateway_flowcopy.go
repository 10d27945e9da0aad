package dataplane

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// This file carries the connection table across the route forwarding fast path's transitions. With
// the fast path on, each family has two connection tables: the netdev table's gateway-flows, which
// the packets the fast path takes write, and the family table's, which the others write (packets of
// devices without an ingress chain, fragments). When the netdev table is deleted (the fast path goes
// off: the configuration, a failed netdev transaction, a layout without a fast path) or written
// afresh (a device re-created, a retry after a failure, a restart), its flows would be dealt again
// by Maglev on their next packet, and a flow whose slot moved since it began would change node and
// be reset. So the gateway copies them:
//
//	before a netdev transaction that deletes or replaces the table:
//	    netdev gateway-flows  ->  family gateway-flows
//	a netdev transaction that creates the table goes in two:
//	    1. the table, its sets and its chains but the ingress ones (no packet reaches it yet)
//	    2. family gateway-flows  ->  netdev gateway-flows
//	    3. the ingress chains (the fast path takes the packets from here on)
//	a retry after a failed netdev transaction goes whole, and only once the kernel took it:
//	    family gateway-flows  ->  netdev gateway-flows
//
// Both maps are declared by one Set value (the netdev table shares the family table's sets) and
// encoded by one encoder for the IP family, so their keys have the same layout (flowKeyLen), and both
// tables' marks are GatewayNodeID of the same node addresses: an entry is copied as it is, its key
// and node id unchanged. What is translated is its life: the destination's entry gets the map's
// timeout (what the next packet's update restarts) and the life the source's entry had left, so a
// copy neither prolongs an idle flow nor shortens it. Entries whose node is no longer a node of any
// VIP port (not in any gateway-conns) are left out: their flows are dealt again anyway, and a stale
// entry would only keep Maglev's new choice from being remembered until it expires.
//
// The copy is bounded and best effort: the source is read as a stream (a full map is 1,048,576
// entries), written in transactions of flowCopyBatch entries, and a failure is logged, reported in
// gateway.SyncReport.FlowCopies and otherwise ignored: forwarding goes on as without the copy. All
// the copies of one Sync share one budget (flowCopyBudget), because the sync runs them and every
// other change, a node's death too, waits for the sync. An entry the destination already holds with
// another node (a packet wrote it meanwhile, or the destination learnt the flow itself) makes the
// kernel refuse its whole transaction (EEXIST, and an abort that costs a synchronize_rcu); the
// transaction goes again without the entries the kernel named (extended ACK: the first refused of
// each message; without it, the transaction is split until they are found), and they are left as
// the destination has them. Packets choose the keys, so the refused transactions of a copy are capped
// (flowCopyMaxAborts): past it the copy stops, truncated. An entry the destination holds with the
// same node is accepted and gets the copied life (the kernel updates an existing element's timeout
// and expiration: so does 6.18, TestGatewayFlowCopyClash).

// GatewayFlow is one entry of a gateway-flows map as the kernel holds it: the flow key (flowKeyLen
// bytes), the node id (host order, as the packets' mark), the element's timeout (0: the map's; the
// kernel lists no other for the entries the packets write) and the life it has left.
type GatewayFlow struct {
	Key     []byte
	Mark    uint32
	Timeout time.Duration
	Expires time.Duration
}

// GatewayFlowStore reads and writes the kernel's gateway-flows maps. NetlinkProgrammer implements it;
// a gateway.Proxier whose Programmer does not (the recording fakes of unit tests) copies nothing.
// A zero deadline is none.
type GatewayFlowStore interface {
	// ReadGatewayFlows streams the entries of table's flow map set (gateway-flows) to each, in chunks whose slices each
	// may keep only until it returns. A table or map that does not exist is ErrNoFlowsMap; a dump
	// cut by the deadline, or that the kernel reports interrupted, is ErrFlowCopyTruncated (after
	// the entries it read).
	ReadGatewayFlows(f cluster.Family, table, set string, deadline time.Time, each func([]GatewayFlow) error) error
	// GatewayFlowWriter returns a writer of table's flow map set whose transactions end by deadline.
	GatewayFlowWriter(f cluster.Family, table, set string, deadline time.Time) (GatewayFlowWriter, error)
}

// GatewayFlowWriter adds entries to one gateway-flows map, each call one kernel transaction.
type GatewayFlowWriter interface {
	Add(flows []GatewayFlow) error
	Close() error
}

// ErrNoFlowsMap: the table, or its gateway-flows map, does not exist (nothing to copy from).
var ErrNoFlowsMap = errors.New("no such flow map")

// ErrFlowCopyTruncated: a copy stopped before its end, by its sync's budget, by its cap of refused
// transactions, or on a dump the kernel interrupted. The entries it wrote stay.
var ErrFlowCopyTruncated = errors.New("copy truncated")

// flowCopyBatch is the number of entries a copy writes per kernel transaction, flowCopyMsg per
// netlink message of it: an entry is ~64 bytes of attributes, and the list that holds them is one
// attribute, whose length (16 bits) must stay under 64 KiB.
const (
	flowCopyBatch = 8192
	flowCopyMsg   = 512
)

// flowKeyLen is the length of a gateway-flows key of family f in the kernel: IPv4 saddr . sport .
// daddr . dport, each field in its own 4-byte register (ports padded), and IPv6 the 32-bit hash of
// the 4-tuple (gateway_conntable.go).
func flowKeyLen(f cluster.Family) int {
	if ipFamily(f) == cluster.IPv6 {
		return 4
	}
	return 16
}

// The kernel side: NetlinkProgrammer reads a map's elements by a dump it parses as it arrives (not
// collected first: a full map's dump is ~80 MB), and writes them in batches of its own, because
// google/nftables v0.3.0 writes no NFTA_SET_ELEM_EXPIRATION (an element's life left).

// ReadGatewayFlows implements GatewayFlowStore.
func (n *NetlinkProgrammer) ReadGatewayFlows(f cluster.Family, table, set string, deadline time.Time, each func([]GatewayFlow) error) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.NetNSFd})
	if err != nil {
		return fmt.Errorf("opening netfilter netlink socket: %w", err)
	}
	defer c.Close()
	forceBuffers(c, 8<<20)
	if !deadline.IsZero() {
		if err := c.SetReadDeadline(deadline); err != nil {
			return err
		}
	}
	if _, err := c.Send(flowsMsg(f, table, set, unix.NFT_MSG_GETSETELEM, netlink.Request|netlink.Dump, nil)); err != nil {
		return fmt.Errorf("dumping %s: %w", set, err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	chunk := make([]GatewayFlow, 0, 1024)
	interrupted := false
	for {
		nr, rerr, err := recvRaw(rc, buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: dumping %s: the deadline passed", ErrFlowCopyTruncated, set)
			}
			return err
		}
		if rerr != nil {
			return fmt.Errorf("dumping %s: %w", set, rerr)
		}
		done, intr, err := parseFlowDump(buf[:nr], func(fl GatewayFlow) error {
			chunk = append(chunk, fl)
			if len(chunk) == cap(chunk) {
				err := each(chunk)
				chunk = chunk[:0]
				return err
			}
			return nil
		})
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%s %s: %w", TableString(f, table), set, ErrNoFlowsMap)
			}
			return err
		}
		interrupted = interrupted || intr
		if done {
			break
		}
	}
	if len(chunk) > 0 {
		if err := each(chunk); err != nil {
			return err
		}
	}
	if interrupted {
		// The map's generation changed during the dump (a transaction): entries may be missing.
		return fmt.Errorf("%w: dumping %s: interrupted by a change (NLM_F_DUMP_INTR)", ErrFlowCopyTruncated, set)
	}
	return nil
}

// parseFlowDump reads one recvmsg's worth of a gateway-flows dump: each element to each; done at
// the dump's end (NLMSG_DONE); intr when a message says the dump was interrupted (NLM_F_DUMP_INTR);
// a netlink error, or a dump that ended in one (NLMSG_DONE's errno), as its errno.
func parseFlowDump(b []byte, each func(GatewayFlow) error) (done, intr bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		typ := binary.NativeEndian.Uint16(b[4:])
		flags := binary.NativeEndian.Uint16(b[6:])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return false, intr, errors.New("malformed netlink message in the dump")
		}
		intr = intr || flags&unix.NLM_F_DUMP_INTR != 0
		body := b[unix.NLMSG_HDRLEN:l]
		b = b[min((l+3)&^3, len(b)):]
		switch typ {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			// Both begin with an errno (negative, 0: none); a dump the kernel cut short ends in
			// an NLMSG_DONE that carries its error.
			if len(body) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(body)); e != 0 {
					return false, intr, syscall.Errno(-e)
				}
			}
			if typ == unix.NLMSG_DONE {
				return true, intr, nil
			}
			continue
		}
		if len(body) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(body[4:])
		if err != nil {
			return false, intr, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					var fl GatewayFlow
					list.Nested(func(el *netlink.AttributeDecoder) error {
						for el.Next() {
							switch el.Type() {
							case unix.NFTA_SET_ELEM_KEY:
								fl.Key = dataValue(el)
							case unix.NFTA_SET_ELEM_DATA:
								if v := dataValue(el); len(v) == 4 {
									fl.Mark = binary.NativeEndian.Uint32(v)
								}
							case unix.NFTA_SET_ELEM_TIMEOUT:
								fl.Timeout = time.Duration(el.Uint64()) * time.Millisecond
							case unix.NFTA_SET_ELEM_EXPIRATION:
								fl.Expires = time.Duration(el.Uint64()) * time.Millisecond
							}
						}
						return el.Err()
					})
					if err := each(fl); err != nil {
						return err
					}
				}
				return list.Err()
			})
		}
		if err := ad.Err(); err != nil {
			return false, intr, err
		}
	}
	return false, intr, nil
}

// dataValue reads the NFTA_DATA_VALUE inside the nested attribute at ad.
func dataValue(ad *netlink.AttributeDecoder) []byte {
	var v []byte
	ad.Nested(func(d *netlink.AttributeDecoder) error {
		for d.Next() {
			if d.Type() == unix.NFTA_DATA_VALUE {
				v = d.Bytes()
			}
		}
		return d.Err()
	})
	return v
}

// flowsMsg is a message of type typ about table's gateway-flows, with attrs after the table's and
// the map's names.
func flowsMsg(f cluster.Family, table, set string, typ uint16, flags netlink.HeaderFlags, attrs []byte) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	head, _ := ae.Encode() // two strings: cannot fail
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: flags},
		Data:   append(append([]byte{byte(tableFamily(f)), unix.NFNETLINK_V0, 0, 0}, head...), attrs...),
	}
}

// forceBuffers sizes c's buffers to size (SO_*BUFFORCE: root lifts the sysctl caps), best effort:
// a smaller buffer only means more reads, or a batch the kernel refuses (EMSGSIZE) as an error.
func forceBuffers(c *netlink.Conn, size int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], size) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], size)
			}
		}
	})
}

// netlinkFlowWriter is NetlinkProgrammer's GatewayFlowWriter: one socket for all of a copy's
// transactions, kept across a refused one (its replies are all read) and replaced after any other
// error (replies may be left on it).
type netlinkFlowWriter struct {
	n        *NetlinkProgrammer
	f        cluster.Family
	table    string
	set      string
	deadline time.Time
	c        *netlink.Conn
}

// GatewayFlowWriter implements GatewayFlowStore.
func (n *NetlinkProgrammer) GatewayFlowWriter(f cluster.Family, table, set string, deadline time.Time) (GatewayFlowWriter, error) {
	return &netlinkFlowWriter{n: n, f: f, table: table, set: set, deadline: deadline}, nil
}

// Add writes flows in one batch (one transaction) of NEWSETELEM messages of flowCopyMsg elements.
// A batch refused for entries the map holds with another node is a *flowClashError naming them.
func (w *netlinkFlowWriter) Add(flows []GatewayFlow) error {
	if w.c == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.n.NetNSFd})
		if err != nil {
			return fmt.Errorf("opening netfilter netlink socket: %w", err)
		}
		forceBuffers(c, 8<<20)
		// Best effort: the offending element of each refused message (extended ACK), without the
		// message echoed back (capped). A kernel without them leaves addSplitting to split.
		_ = c.SetOption(netlink.ExtendedAcknowledge, true)
		_ = c.SetOption(netlink.CapAcknowledge, true)
		w.c = c
	}
	msgs := []netlink.Message{batchMsg(unix.NFNL_MSG_BATCH_BEGIN)}
	for i := 0; i < len(flows); i += flowCopyMsg {
		elems, err := encodeFlowElements(flows[i:min(i+flowCopyMsg, len(flows))])
		if err != nil {
			return err
		}
		msgs = append(msgs, flowsMsg(w.f, w.table, w.set, unix.NFT_MSG_NEWSETELEM, netlink.Request|netlink.Acknowledge|netlink.Create, elems))
	}
	msgs = append(msgs, batchMsg(unix.NFNL_MSG_BATCH_END))
	clean, err := w.exchange(msgs)
	if err != nil {
		if !clean {
			w.c.Close()
			w.c = nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && !w.deadline.IsZero() {
			err = fmt.Errorf("%w: %w", ErrFlowCopyTruncated, err)
		}
		return fmt.Errorf("adding %d entries to %s %s: %w", len(flows), TableString(w.f, w.table), w.set, err)
	}
	return nil
}

// flowClashError is a transaction the kernel refused for entries the map holds with another node
// (EEXIST). At are those it named, by index in the transaction: the first of each message that
// held one (extended ACK); none when the kernel named none.
type flowClashError struct {
	err error
	at  []int
}

func (e *flowClashError) Error() string {
	return fmt.Sprintf("%v (%d entries named)", e.err, len(e.at))
}

func (e *flowClashError) Unwrap() error { return e.err }

// nlmsgerrAttrOffs is NLMSGERR_ATTR_OFFS: the offset, in the refused message, of the attribute the
// kernel blames.
const nlmsgerrAttrOffs = 2

// exchange sends a batch (msgs: its begin, NEWSETELEM messages, its end) and reads the replies to
// its NEWSETELEM messages: the kernel answers each of them once, an acknowledgement or its error,
// each in a datagram of its own (nfnetlink's batch goes on after an error to report all). clean
// says the socket holds no reply of the batch: all were read, or a refused entry's (EEXIST) was
// the only kind of error; after any other, the caller drops the socket rather than trust what is
// left on it.
func (w *netlinkFlowWriter) exchange(msgs []netlink.Message) (clean bool, err error) {
	// A kernel that answers nothing must not hold the sync forever.
	deadline := w.deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(10 * time.Second)
	}
	if err := w.c.SetDeadline(deadline); err != nil {
		return false, err
	}
	sent, err := w.c.SendMessages(msgs)
	if err != nil {
		return false, err
	}
	// The NEWSETELEM messages by sequence number: which flows each carries.
	bySeq := map[uint32]int{}
	for i, m := range sent[1 : len(sent)-1] {
		bySeq[m.Header.Sequence] = i
	}
	rc, err := w.c.SyscallConn()
	if err != nil {
		return false, err
	}
	buf := make([]byte, 64<<10)
	var clash *flowClashError
	var other error
	for got := 0; got < len(bySeq); {
		nr, rerr, err := recvRaw(rc, buf)
		if err != nil {
			return false, cmp.Or(other, err)
		}
		if rerr != nil {
			return false, cmp.Or(other, rerr)
		}
		for b := buf[:nr]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return false, errors.New("malformed netlink reply")
			}
			typ, flags := binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint16(b[6:])
			body := b[unix.NLMSG_HDRLEN:l]
			b = b[min((l+3)&^3, len(b)):]
			if typ != unix.NLMSG_ERROR || len(body) < 4+unix.NLMSG_HDRLEN {
				continue
			}
			errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(body)))
			i, ok := bySeq[binary.NativeEndian.Uint32(body[4+8:])]
			if !ok {
				if errno != 0 {
					// The batch's own (its begin: the kernel could not take it, ENOMEM): no
					// other reply comes.
					return false, cmp.Or(other, error(errno))
				}
				continue
			}
			got++
			if errno == 0 {
				continue
			}
			if errno != unix.EEXIST {
				other = cmp.Or(other, error(errno))
				continue
			}
			if clash == nil {
				clash = &flowClashError{err: errno}
			}
			if j, ok := blamedElement(body, flags, sent[1+i]); ok {
				clash.at = append(clash.at, i*flowCopyMsg+j)
			}
		}
	}
	switch {
	case other != nil:
		return false, other
	case clash != nil:
		return true, clash
	}
	return true, nil
}

// blamedElement is the index, in the refused message m, of the element an error reply (body, with
// its header's flags) blames by its extended ACK offset, if it names one.
func blamedElement(body []byte, flags uint16, m netlink.Message) (int, bool) {
	if flags&unix.NLM_F_ACK_TLVS == 0 {
		return 0, false
	}
	// The errno and the refused message's header, then the message's payload unless capped.
	tlvs := body[4+unix.NLMSG_HDRLEN:]
	if flags&unix.NLM_F_CAPPED == 0 {
		l := int(binary.NativeEndian.Uint32(body[4:])) - unix.NLMSG_HDRLEN
		if l < 0 || (l+3)&^3 > len(tlvs) {
			return 0, false
		}
		tlvs = tlvs[(l+3)&^3:]
	}
	ad, err := netlink.NewAttributeDecoder(tlvs)
	if err != nil {
		return 0, false
	}
	off := -1
	for ad.Next() {
		if ad.Type() == nlmsgerrAttrOffs {
			off = int(ad.Uint32()) - unix.NLMSG_HDRLEN
		}
	}
	if off < 0 || ad.Err() != nil {
		return 0, false
	}
	// Walk m's attributes (after the nfgenmsg) to the elements' list, and along it to the blamed
	// element.
	return attrIndexAt(m.Data, 4, off)
}

// attrIndexAt finds off in data, whose attributes begin at pos: the index of the element of the
// NFTA_SET_ELEM_LIST_ELEMENTS list that begins there.
func attrIndexAt(data []byte, pos, off int) (int, bool) {
	for pos+4 <= len(data) {
		l := int(binary.NativeEndian.Uint16(data[pos:]))
		typ := binary.NativeEndian.Uint16(data[pos+2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || pos+l > len(data) {
			return 0, false
		}
		if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			for i, p := 0, pos+4; p+4 <= pos+l; i++ {
				el := int(binary.NativeEndian.Uint16(data[p:]))
				if el < 4 {
					return 0, false
				}
				if p == off {
					return i, true
				}
				p += (el + 3) &^ 3
			}
			return 0, false
		}
		pos += (l + 3) &^ 3
	}
	return 0, false
}

// Close releases the writer's socket.
func (w *netlinkFlowWriter) Close() error {
	if w.c == nil {
		return nil
	}
	err := w.c.Close()
	w.c = nil
	return err
}

// batchMsg is a batch's begin or end message for the nftables subsystem.
func batchMsg(typ uint16) netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES},
	}
}

// encodeFlowElements is the NFTA_SET_ELEM_LIST_ELEMENTS attribute of flows: key, node id (the mark,
// host order, as the packets' mark writes it), timeout and life left.
func encodeFlowElements(flows []GatewayFlow) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
		for _, fl := range flows {
			list.Nested(unix.NFTA_LIST_ELEM, func(el *netlink.AttributeEncoder) error {
				el.Nested(unix.NFTA_SET_ELEM_KEY, func(k *netlink.AttributeEncoder) error {
					k.Bytes(unix.NFTA_DATA_VALUE, fl.Key)
					return nil
				})
				el.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
					d.Bytes(unix.NFTA_DATA_VALUE, binary.NativeEndian.AppendUint32(nil, fl.Mark))
					return nil
				})
				if fl.Timeout > 0 {
					el.Uint64(unix.NFTA_SET_ELEM_TIMEOUT, uint64(fl.Timeout.Milliseconds()))
				}
				if fl.Expires > 0 {
					el.Uint64(unix.NFTA_SET_ELEM_EXPIRATION, uint64(fl.Expires.Milliseconds()))
				}
				return nil
			})
		}
		return nil
	})
	return ae.Encode()
}

// recvRaw reads one datagram of the netlink socket behind rc into buf, waiting (under the
// socket's read deadline) while there is none: err is the wait's (a passed deadline), rerr the
// receive's.
func recvRaw(rc syscall.RawConn, buf []byte) (n int, rerr, err error) {
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
		return rerr != unix.EAGAIN
	})
	return n, rerr, err
}
