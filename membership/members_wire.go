package membership

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The heartbeat datagram, version 3 (binary, big-endian):
//
//	magic   "VGH3"                       4 bytes
//	flags   bit 0: the sender is ready   1 byte
//	nameLen, name (the sender)           1 + up to 253 bytes
//	counter                              8 bytes: the sender's boot time (unix ns) + a sequence: it
//	                                     grows with every datagram of one run of the sender
//	echo                                 8 bytes: the highest counter the sender has accepted from
//	                                     the receiver (0: none yet)
//	digest                               8 bytes: sha256 of the sender's sorted member list
//	heardLen, heard                      2 + ceil(members/8) bytes: bit i set = the sender vouches
//	                                     for the i-th member of that sorted list
//	mac                                  32 bytes: HMAC-SHA256(key, receiver name || 0 || all the above)
//
// The MAC covers everything, and the receiver's name too, so a datagram for n2 does not verify at
// n3. The echo makes a captured datagram useless: the receiver accepts a datagram only if it echoes
// a counter of its current run (between its boot counter and the last one it sent, so a datagram
// captured before its restart does not count, whatever the clocks), and only if (echo, counter) is
// greater than in the last datagram it accepted from that sender (a replay is not). The receiver's
// own counter is what orders the datagrams; the sender's only orders those sent between two of the
// receiver's, so no counter value, forged or after a restart with the clock behind, locks a sender
// out (Members.checkLocked).
const (
	heartbeatMagic = "VGH3"
	macSize        = sha256.Size
	// MaxHeartbeat bounds a heartbeat datagram: 1232 bytes fits any IPv6 path (1280-byte minimum MTU
	// less 48 bytes of IPv6 and UDP headers), so a heartbeat is never fragmented.
	MaxHeartbeat = 1232
	// fixed is the size of everything but the name and the heard bitmap.
	heartbeatFixed = 4 + 1 + 1 + 8 + 8 + 8 + 2 + macSize
	// MaxMembers is the largest member list whose heartbeat fits MaxHeartbeat with a 253-byte name.
	MaxMembers = (MaxHeartbeat - heartbeatFixed - 253) * 8
)

// heartbeat is one decoded datagram.
type heartbeat struct {
	name    string
	ready   bool
	counter uint64
	echo    uint64
	digest  uint64
	heard   []byte
}

// errOversize is returned by appendHeartbeat when a heartbeat would not fit MaxHeartbeat.
var errOversize = errors.New("heartbeat larger than the datagram bound")

// appendHeartbeat appends hb without its MAC (see seal).
func appendHeartbeat(b []byte, hb *heartbeat) ([]byte, error) {
	if len(hb.name) == 0 || len(hb.name) > 253 {
		return b, fmt.Errorf("member name %q: want 1-253 bytes", hb.name)
	}
	if n := heartbeatFixed + len(hb.name) + len(hb.heard); n > MaxHeartbeat {
		return b, fmt.Errorf("%w: %d bytes (%d members, name %d bytes) > %d", errOversize, n, 8*len(hb.heard), len(hb.name), MaxHeartbeat)
	}
	var flags byte
	if hb.ready {
		flags = 1
	}
	b = append(b, heartbeatMagic...)
	b = append(b, flags, byte(len(hb.name)))
	b = append(b, hb.name...)
	b = binary.BigEndian.AppendUint64(b, hb.counter)
	b = binary.BigEndian.AppendUint64(b, hb.echo)
	b = binary.BigEndian.AppendUint64(b, hb.digest)
	b = binary.BigEndian.AppendUint16(b, uint16(len(hb.heard)))
	return append(b, hb.heard...), nil
}

// mac computes the MAC of body for receiver to.
func mac(key []byte, to string, body []byte, out []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(to))
	h.Write([]byte{0})
	h.Write(body)
	return h.Sum(out)
}

// dropReason says why a datagram was not taken into account: the label of
// vipgate_speaker_heartbeats_rejected_total.
type dropReason string

// The reasons a heartbeat is dropped.
const (
	dropMalformed  dropReason = "malformed"
	dropOversize   dropReason = "oversize"
	dropNotMember  dropReason = "not-member"
	dropWrongSrc   dropReason = "wrong-source"
	dropBadMAC     dropReason = "bad-mac"
	dropReplay     dropReason = "replay"
	dropUnfreshed  dropReason = "not-fresh"
	dropPartition  dropReason = "test-partition"
	acceptedReason dropReason = ""
)

// allDropReasons lists the label values, so the counter shows every one at 0.
var allDropReasons = []dropReason{dropMalformed, dropOversize, dropNotMember, dropWrongSrc, dropBadMAC, dropReplay, dropUnfreshed}

// parseHeartbeat decodes the header of b (without checking the MAC: see verify); hb.heard aliases b.
func parseHeartbeat(b []byte, hb *heartbeat) dropReason {
	if len(b) > MaxHeartbeat {
		return dropOversize
	}
	if len(b) < heartbeatFixed+1 || string(b[:4]) != heartbeatMagic {
		return dropMalformed
	}
	flags, nl := b[4], int(b[5])
	p := b[6:]
	if nl == 0 || len(p) < nl+8+8+8+2 || flags&^1 != 0 {
		return dropMalformed
	}
	hb.name = string(p[:nl])
	hb.ready = flags&1 != 0
	p = p[nl:]
	hb.counter = binary.BigEndian.Uint64(p)
	hb.echo = binary.BigEndian.Uint64(p[8:])
	hb.digest = binary.BigEndian.Uint64(p[16:])
	hl := int(binary.BigEndian.Uint16(p[24:]))
	p = p[26:]
	if len(p) != hl+macSize {
		return dropMalformed
	}
	hb.heard = p[:hl]
	return acceptedReason
}

// verify checks b's MAC for receiver self against every key (the first one signs, any verifies:
// two are active during a rotation).
func verify(keys [][]byte, self string, b []byte) bool {
	body, sum := b[:len(b)-macSize], b[len(b)-macSize:]
	var buf [macSize]byte
	for _, k := range keys {
		if hmac.Equal(mac(k, self, body, buf[:0]), sum) {
			return true
		}
	}
	return false
}

// SegmentKey identifies a sorted member list, so a heard bitmap is read only against the list it
// was written for: the digest a heartbeat carries, and the key of SegmentViews. It is on the wire
// (nodes of different versions must agree on it); the speaker does not need it (it keys its
// segments by their members, View.Members).
func SegmentKey(sorted []string) uint64 {
	h := sha256.Sum256([]byte(strings.Join(sorted, "\n")))
	return binary.BigEndian.Uint64(h[:8])
}

// bitmap is a set of member indexes.
type bitmap []byte

func newBitmap(n int) bitmap         { return make(bitmap, (n+7)/8) }
func (b bitmap) set(i int)           { b[i/8] |= 1 << (i % 8) }
func (b bitmap) equal(o []byte) bool { return slices.Equal(b, o) }
func (b bitmap) clone() bitmap       { return slices.Clone(b) }
func (b bitmap) forEach(f func(i int)) {
	for j, w := range b {
		for w != 0 {
			k := trailingZeros8(w)
			f(8*j + k)
			w &= w - 1
		}
	}
}

func trailingZeros8(w byte) int {
	n := 0
	for w&1 == 0 {
		w >>= 1
		n++
	}
	return n
}

// ParseKeys reads a membership key file: one key per line (blank lines and lines starting
// with # are skipped), each at least MinKeyLen characters; the first key signs, every key verifies.
// ReadKeyFile checks the file itself first. A Kubernetes Secret created with
// `--from-literal=key=$(openssl rand -hex 32)` and mounted as a file is such a file with one key;
// during a rotation it holds two lines (new key first once every member has both).
func ParseKeys(data []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < MinKeyLen {
			return nil, fmt.Errorf("line %d: a %d-character key, want at least %d (128 bits as hex; e.g. openssl rand -hex 32)", i+1, len(line), MinKeyLen)
		}
		keys = append(keys, []byte(line))
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in the file")
	}
	return keys, nil
}
