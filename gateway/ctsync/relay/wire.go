// Package relay carries conntrackd's sync datagrams between two gateways over the LAN, each one
// authenticated and replay-safe, and rate-limited. conntrackd's FTFW channel has no
// authentication of its own: whoever can send it a datagram can put entries into the gateway's
// kernel conntrack table (NAT bindings included) and make it send its whole table. So each
// gateway's conntrackd listens and sends on loopback only (ctsync.Render), where nothing from the
// LAN can reach it, and the relay of each gateway carries its datagrams to the peer's relay:
//
//	conntrackd --127.0.0.2:P--> relay ==LAN, HMAC-SHA256==> peer relay --127.0.0.1:P--> peer conntrackd
//
// The threat model (docs/gateway.md, "What the sync channel trusts"): anyone on the LAN can send to
// the relay's port, and may hold the peer's address while the peer is down; nobody without the
// key can make the relay hand conntrackd a datagram, nor replay one the peer sent.
//
// Why HMAC-SHA256 and not an AEAD: what must be protected is the integrity and freshness of what
// reaches conntrackd, not the secrecy of the flow tuples (an attacker who can read the sync
// datagrams sits where it sees the flows themselves). HMAC has no nonce that must never repeat
// across restarts and key rotations (an AEAD's nonce reuse gives away the key stream and the
// authenticator key), and it is the membership heartbeats' primitive already (speaker/).
//
// Keys: the membership key file's keys (the first signs, any verifies, as in a rotation), never
// used as they are: each direction's key is HKDF-SHA256(key, salt "vipgate conntrack-sync relay
// v1", info "<sender address> > <receiver address>"), so the channel's keys are not the
// heartbeats', and a gateway's datagrams reflected back to it do not verify.
//
// Freshness (see session.go): each relay has an instance number, random at start, and a challenge,
// random at start and renewed whenever a second instance of the peer presents it. A datagram
// carries the receiver's challenge as the sender last heard it, and a sequence number of the
// sender's instance; the receiver takes only datagrams that carry its current challenge, from the
// one peer instance bound to that challenge, with a sequence number it has not seen. A datagram
// recorded before the receiver (re)started carries an old challenge; one recorded since, a seen
// sequence number or another instance. Neither clocks nor state on disk are needed. A stale
// datagram is answered with a hello (the peer may simply not know the current challenge), at most
// once a second per (instance, challenge) and from budgets of its own, so replayed recordings cannot
// starve a handshake; a sequence number may jump at most maxSeqJump ahead, and a bound instance
// whose datagrams keep failing the window gets a new challenge (a key holder who moved the window
// cannot lock the peer out for longer than it keeps at it).
package relay

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Wire format of a relay datagram (big endian):
//
//	0  magic "VGCS"
//	4  version (1)
//	5  kind (kindHello, kindData)
//	6  flags (flagNeedChallenge, flagOtherBound)
//	7  0
//	8  sender's instance
//	16 sender's challenge (what datagrams to the sender must carry)
//	24 echo: the receiver's challenge as the sender knows it (0: unknown)
//	32 sequence number (of the sender's instance, from 1, never reused)
//	40 payload: conntrackd's datagram (kindData), nothing (kindHello)
//	-16 HMAC-SHA256 of everything before, with the direction's key, truncated to 16 bytes
const (
	headerLen = 40
	tagLen    = 16
	// Overhead is what the relay adds to each conntrackd datagram.
	Overhead = headerLen + tagLen
	// MaxPayload is the largest conntrackd datagram the relay carries (a UDP datagram's payload
	// less the relay's overhead).
	MaxPayload = 65507 - Overhead
	version    = 1
)

var magic = [4]byte{'V', 'G', 'C', 'S'}

// kind says what a relay datagram carries.
type kind uint8

const (
	// kindHello carries no payload: it tells the receiver the sender's challenge.
	kindHello kind = 1
	// kindData carries one conntrackd datagram.
	kindData kind = 2
)

const (
	// flagNeedChallenge: the sender does not know the receiver's challenge (a hello then asks for
	// one).
	flagNeedChallenge = 1
	// flagOtherBound: the sender's challenge is bound to another instance of the receiver than the
	// one it answers (the receiver restarted): the receiver must present it once in a hello, which
	// makes the sender renew it, before its data can get through.
	flagOtherBound = 2
)

// header is a relay datagram's header.
type header struct {
	kind     kind
	flags    uint8
	instance uint64
	chal     uint64
	echo     uint64
	seq      uint64
}

// salt is HKDF's salt for the relay's keys: a label no other use of the membership keys shares.
const salt = "vipgate conntrack-sync relay v1"

// MinKeyLen is the shortest key accepted (bytes), as the membership's.
const MinKeyLen = 16

// directionKey derives the key of the datagrams from -> to from a membership key.
func directionKey(key []byte, from, to netip.Addr) ([]byte, error) {
	return hkdf.Key(sha256.New, key, []byte(salt), from.Unmap().String()+" > "+to.Unmap().String(), sha256.Size)
}

// keySet is the derived keys of one direction: send[0]... the first signs, every one verifies.
type keySet [][]byte

// deriveKeys derives the keys of the direction from -> to from the membership keys.
func deriveKeys(keys [][]byte, from, to netip.Addr) (keySet, error) {
	if len(keys) == 0 {
		return nil, errors.New("conntrack sync relay: no key")
	}
	out := make(keySet, 0, len(keys))
	for i, k := range keys {
		if len(k) < MinKeyLen {
			return nil, fmt.Errorf("conntrack sync relay: key %d is %d bytes long, want at least %d", i+1, len(k), MinKeyLen)
		}
		d, err := directionKey(k, from, to)
		if err != nil {
			return nil, fmt.Errorf("conntrack sync relay: deriving a key: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}

// tag is the truncated HMAC of msg.
func tag(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)[:tagLen]
}

// seal appends the datagram of h and payload, signed with key, to dst.
func seal(dst []byte, key []byte, h header, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, magic[:]...)
	dst = append(dst, version, byte(h.kind), h.flags, 0)
	dst = binary.BigEndian.AppendUint64(dst, h.instance)
	dst = binary.BigEndian.AppendUint64(dst, h.chal)
	dst = binary.BigEndian.AppendUint64(dst, h.echo)
	dst = binary.BigEndian.AppendUint64(dst, h.seq)
	dst = append(dst, payload...)
	return append(dst, tag(key, dst[start:])...)
}

// Verdict says what became of a datagram: forwarded, or why not. Typed, so tests and metrics count
// the reasons.
type Verdict string

const (
	// Forwarded: handed on (to conntrackd, or to the peer).
	Forwarded Verdict = "forwarded"
	// Handshake: a valid hello, taken (no payload to hand on).
	Handshake Verdict = "handshake"
	// WrongSource: not from the peer's relay (LAN) or from conntrackd (loopback).
	WrongSource Verdict = "wrong_source"
	// Malformed: too short, too long, bad magic, version, kind or flags.
	Malformed Verdict = "malformed"
	// BadMAC: no key verifies it.
	BadMAC Verdict = "bad_mac"
	// Stale: it does not carry this relay's current challenge (recorded before this relay's
	// challenge was made, or the peer has not heard it yet: a hello is sent back).
	Stale Verdict = "stale"
	// Replayed: its sequence number was seen, or is older than the window.
	Replayed Verdict = "replayed"
	// TooFarAhead: its sequence number is more than maxSeqJump ahead of the newest seen.
	TooFarAhead Verdict = "too_far_ahead"
	// OtherInstance: another instance of the peer than the one bound to the challenge (the peer
	// restarted, or an old instance's datagram is replayed): the challenge is renewed.
	OtherInstance Verdict = "other_instance"
	// RateLimited: over the datagram budget.
	RateLimited Verdict = "rate_limited"
	// ResyncLimited: carries a resync request over the resync budget.
	ResyncLimited Verdict = "resync_limited"
	// Queued: from conntrackd while the handshake with the peer is not over (its challenge
	// unknown, or bound to this relay's previous instance); sent once it is (a hello goes now).
	Queued Verdict = "queued"
	// QueueFull: from conntrackd, dropped: the handshake is not over and the queue is full.
	QueueFull Verdict = "queue_full"
	// BadPayload: conntrackd's datagram is not a sequence of FTFW messages.
	BadPayload Verdict = "bad_payload"
)

// parse checks a datagram's layout (not its MAC) and returns its header and payload.
func parse(b []byte) (header, []byte, error) {
	var h header
	if len(b) < Overhead {
		return h, nil, fmt.Errorf("%d bytes, shorter than a relay header and tag", len(b))
	}
	if len(b) > MaxPayload+Overhead {
		return h, nil, fmt.Errorf("%d bytes, longer than a UDP datagram", len(b))
	}
	if [4]byte(b[:4]) != magic {
		return h, nil, errors.New("no relay magic")
	}
	if b[4] != version {
		return h, nil, fmt.Errorf("version %d, want %d", b[4], version)
	}
	h.kind, h.flags = kind(b[5]), b[6]
	if h.kind != kindHello && h.kind != kindData {
		return h, nil, fmt.Errorf("unknown kind %d", h.kind)
	}
	if h.flags&^(flagNeedChallenge|flagOtherBound) != 0 || b[7] != 0 {
		return h, nil, fmt.Errorf("unknown flags %#x %#x", h.flags, b[7])
	}
	h.instance = binary.BigEndian.Uint64(b[8:])
	h.chal = binary.BigEndian.Uint64(b[16:])
	h.echo = binary.BigEndian.Uint64(b[24:])
	h.seq = binary.BigEndian.Uint64(b[32:])
	payload := b[headerLen : len(b)-tagLen]
	switch {
	case h.instance == 0 || h.chal == 0 || h.seq == 0:
		return h, nil, errors.New("zero instance, challenge or sequence number")
	case h.kind == kindHello && len(payload) != 0:
		return h, nil, errors.New("a hello with a payload")
	case h.kind == kindData && len(payload) == 0:
		return h, nil, errors.New("data without a payload")
	}
	return h, payload, nil
}

// verify says whether one of keys signed b (a datagram that parse accepted).
func verify(keys keySet, b []byte) bool {
	body, t := b[:len(b)-tagLen], b[len(b)-tagLen:]
	ok := false
	for _, k := range keys {
		// Every key is tried: the time does not say which one verified.
		if hmac.Equal(tag(k, body), t) {
			ok = true
		}
	}
	return ok
}

// FTFW's message header (conntrackd's include/network.h, struct nethdr): type in the low nibble
// and version in the high nibble of the first byte, flags, length (big endian, the whole message),
// sequence number; control messages that ack, nack or ask for a resync are struct nethdr_ack, 16
// bytes.
const (
	ftfwHdrLen    = 8
	ftfwAckHdrLen = 16
	ftfwTypeCtl   = 10
	ftfwResync    = 1 << 1
	ftfwNack      = 1 << 2
	ftfwAck       = 1 << 3
)

// scanFTFW walks the FTFW messages of a conntrackd datagram as conntrackd's receiver does
// (sync-mode.c, channel_handler_routine: it stops at the first malformed message) and says how
// many it holds and whether one of them asks for a resync (a full table dump). ok is false when a
// malformed message ends the walk before the end.
func scanFTFW(p []byte) (msgs int, resync bool, ok bool) {
	for len(p) > 0 {
		if len(p) < ftfwHdrLen {
			return msgs, resync, false
		}
		typ, flags := p[0]&0x0f, p[1]
		n := int(binary.BigEndian.Uint16(p[2:]))
		ctl := typ == ftfwTypeCtl && flags&(ftfwResync|ftfwNack|ftfwAck) != 0
		switch {
		case n == 0 || n > len(p):
			return msgs, resync, false
		case ctl && n < ftfwAckHdrLen:
			return msgs, resync, false
		case n < ftfwHdrLen:
			return msgs, resync, false
		}
		if typ == ftfwTypeCtl && flags&ftfwResync != 0 {
			resync = true
		}
		msgs++
		p = p[n:]
	}
	return msgs, resync, true
}
