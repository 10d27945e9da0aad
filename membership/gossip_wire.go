package membership

import (
	"encoding/binary"
	"fmt"
	"time"
)

// The gossip datagram (gossip mode, see gossip.go), binary, big-endian. The header up to the
// digest is the heartbeat's, so authentication and replay protection are exactly the heartbeat's:
//
//	magic   "VGG1"                            4 bytes
//	flags   bit 0: the sender is ready;       1 byte
//	        bit 1: a reply (push-pull: do not answer it)
//	nameLen, name (the sender)                1 + up to 253 bytes
//	counter, echo                             8 + 8 bytes, as in a heartbeat
//	digest                                    8 bytes: the segment (its sorted member list)
//	unit                                      2 bytes: the age unit, in 100 µs
//	total, offset, count                      2 + 2 + 2 bytes: members in the segment, and which
//	                                          of them this chunk carries
//	entries                                   count bytes: bit 7 ready, bits 0-6 age in units
//	                                          rounded up (127: unknown)
//	mac                                       32 bytes: HMAC-SHA256(key, receiver || 0 || above)
//
// A vector larger than one datagram goes in chunks, each a complete, authenticated datagram with
// its own counter.
const (
	gossipMagic = "VGG1"
	// gossipFixed is the size of everything but the name and the entries.
	gossipFixed = 4 + 1 + 1 + 8 + 8 + 8 + 2 + 2 + 2 + 2 + macSize
	gossipReply = 2
	// MaxGossipMembers is the largest segment a gossip vector describes (16-bit total and offset).
	MaxGossipMembers = 0xffff
)

// gossipChunk is one decoded gossip datagram.
type gossipChunk struct {
	name                 string
	ready, reply         bool
	counter, echo        uint64
	digest               uint64
	unit                 time.Duration
	total, offset, count int
	entries              []byte
}

// gossipPerChunk is how many entries fit one datagram for a sender name of nameLen bytes.
func gossipPerChunk(nameLen int) int { return MaxHeartbeat - gossipFixed - nameLen }

// appendGossip appends g without its MAC (see mac). An oversize chunk is an error, never a cut.
func appendGossip(b []byte, g *gossipChunk) ([]byte, error) {
	if len(g.name) == 0 || len(g.name) > 253 {
		return b, fmt.Errorf("member name %q: want 1-253 bytes", g.name)
	}
	if n := gossipFixed + len(g.name) + len(g.entries); n > MaxHeartbeat {
		return b, fmt.Errorf("%w: gossip chunk of %d bytes (%d entries, name %d bytes) > %d", errOversize, n, len(g.entries), len(g.name), MaxHeartbeat)
	}
	u := g.unit / (100 * time.Microsecond)
	if u < 1 || u > 0xffff || g.total > 0xffff || g.offset+len(g.entries) > g.total {
		return b, fmt.Errorf("gossip chunk: unit %v, entries %d+%d of %d out of range", g.unit, g.offset, len(g.entries), g.total)
	}
	var flags byte
	if g.ready {
		flags |= 1
	}
	if g.reply {
		flags |= gossipReply
	}
	b = append(b, gossipMagic...)
	b = append(b, flags, byte(len(g.name)))
	b = append(b, g.name...)
	b = binary.BigEndian.AppendUint64(b, g.counter)
	b = binary.BigEndian.AppendUint64(b, g.echo)
	b = binary.BigEndian.AppendUint64(b, g.digest)
	b = binary.BigEndian.AppendUint16(b, uint16(u))
	b = binary.BigEndian.AppendUint16(b, uint16(g.total))
	b = binary.BigEndian.AppendUint16(b, uint16(g.offset))
	b = binary.BigEndian.AppendUint16(b, uint16(len(g.entries)))
	return append(b, g.entries...), nil
}

// parseGossip decodes b (without checking the MAC: see verify); g.entries aliases b.
func parseGossip(b []byte, g *gossipChunk) dropReason {
	if len(b) > MaxHeartbeat {
		return dropOversize
	}
	if len(b) < gossipFixed+1 || string(b[:4]) != gossipMagic {
		return dropMalformed
	}
	flags, nl := b[4], int(b[5])
	p := b[6:]
	if nl == 0 || len(p) < nl+8+8+8+8 || flags&^(1|gossipReply) != 0 {
		return dropMalformed
	}
	g.name = string(p[:nl])
	g.ready, g.reply = flags&1 != 0, flags&gossipReply != 0
	p = p[nl:]
	g.counter = binary.BigEndian.Uint64(p)
	g.echo = binary.BigEndian.Uint64(p[8:])
	g.digest = binary.BigEndian.Uint64(p[16:])
	g.unit = time.Duration(binary.BigEndian.Uint16(p[24:])) * 100 * time.Microsecond
	g.total = int(binary.BigEndian.Uint16(p[26:]))
	g.offset = int(binary.BigEndian.Uint16(p[28:]))
	g.count = int(binary.BigEndian.Uint16(p[30:]))
	p = p[32:]
	if len(p) != g.count+macSize || g.unit == 0 || g.offset+g.count > g.total {
		return dropMalformed
	}
	g.entries = p[:g.count]
	return acceptedReason
}

// gossipEchoOffset is where the echo sits in a gossip chunk for a sender name of length n (as in a
// heartbeat).
func gossipEchoOffset(n int) int { return echoOffset(n) }
