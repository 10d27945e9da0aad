package bfd

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"time"
)

// AuthType is the Auth Type of RFC 5880 section 4.1: how a packet is authenticated.
type AuthType uint8

// The authentication types of RFC 5880 section 4.1. vipgate implements the keyed digests; Simple
// Password (the password in clear on the wire) is refused.
const (
	AuthNone                AuthType = 0
	AuthSimplePassword      AuthType = 1
	AuthKeyedMD5            AuthType = 2
	AuthMeticulousKeyedMD5  AuthType = 3
	AuthKeyedSHA1           AuthType = 4
	AuthMeticulousKeyedSHA1 AuthType = 5
)

var authNames = [...]string{
	AuthNone:                "none",
	AuthSimplePassword:      "simple-password",
	AuthKeyedMD5:            "keyed-md5",
	AuthMeticulousKeyedMD5:  "meticulous-keyed-md5",
	AuthKeyedSHA1:           "keyed-sha1",
	AuthMeticulousKeyedSHA1: "meticulous-keyed-sha1",
}

// String is the type as written in configuration ("meticulous-keyed-sha1", ...).
func (t AuthType) String() string {
	if int(t) < len(authNames) {
		return authNames[t]
	}
	return fmt.Sprintf("auth-type-%d", uint8(t))
}

// ParseAuthType reads a type as String writes it; "" is AuthNone. Simple Password is refused.
func ParseAuthType(s string) (AuthType, error) {
	if s == "" {
		return AuthNone, nil
	}
	for t, n := range authNames {
		if n == s && AuthType(t) != AuthSimplePassword {
			return AuthType(t), nil
		}
	}
	return AuthNone, fmt.Errorf("unknown BFD authentication type %q (keyed-md5, meticulous-keyed-md5, keyed-sha1, meticulous-keyed-sha1)", s)
}

// Meticulous reports whether every packet must carry a higher sequence number than the last
// (RFC 5880 6.7.3, 6.7.4); the plain keyed types accept a repeated one.
func (t AuthType) Meticulous() bool {
	return t == AuthMeticulousKeyedMD5 || t == AuthMeticulousKeyedSHA1
}

// digestLen is the length of the type's digest (and the most key bytes it takes); 0 for a type
// vipgate does not implement.
func (t AuthType) digestLen() int {
	switch t {
	case AuthKeyedMD5, AuthMeticulousKeyedMD5:
		return md5.Size
	case AuthKeyedSHA1, AuthMeticulousKeyedSHA1:
		return sha1.Size
	}
	return 0
}

// Auth is the authentication of one session: RFC 5880 keyed MD5 or SHA1 with one key. Both sides
// must agree on the type, the key ID and the key.
type Auth struct {
	Type  AuthType
	KeyID uint8
	// Key is the shared secret: 1-16 bytes for MD5, 1-20 for SHA1 (zero-padded on the wire).
	Key string
}

// Validate checks that a is usable: a keyed type with a key of the right length, or no type and
// no key.
func (a Auth) Validate() error {
	switch {
	case a.Type == AuthNone && a.Key == "":
		return nil
	case a.Type == AuthNone:
		return fmt.Errorf("a BFD authentication key without a type")
	case a.Type.digestLen() == 0:
		return fmt.Errorf("BFD authentication type %s is not supported (keyed-md5, meticulous-keyed-md5, keyed-sha1, meticulous-keyed-sha1)", a.Type)
	case a.Key == "":
		return fmt.Errorf("BFD authentication %s without a key", a.Type)
	case len(a.Key) > a.Type.digestLen():
		return fmt.Errorf("BFD authentication key of %d bytes: %s takes at most %d", len(a.Key), a.Type, a.Type.digestLen())
	}
	return nil
}

// AuthSection is a packet's Authentication Section (RFC 5880 sections 4.2-4.4), as received or to
// be sent. Only the keyed types parse; Digest holds DigestLen bytes.
type AuthSection struct {
	Type     AuthType
	KeyID    uint8
	Reserved uint8
	Seq      uint32
	Digest   [sha1.Size]byte
}

// authHeaderLen is the part of a keyed Authentication Section before the digest: Type, Len,
// Key ID, Reserved, Sequence Number.
const authHeaderLen = 8

// maxPacketLen is the longest Control packet vipgate parses: with a keyed SHA1 section.
const maxPacketLen = packetLen + authHeaderLen + sha1.Size

// len is the Auth Len field of the section.
func (a *AuthSection) len() int { return authHeaderLen + a.Type.digestLen() }

// parseAuth reads the Authentication Section b (the bytes from offset 24 to the packet's Length).
// It must be a keyed MD5 or SHA1 section whose Auth Len is that of its type and fills b exactly
// (RFC 5880 6.8.6: a section that does not match its type is discarded).
func parseAuth(b []byte) (AuthSection, DropReason) {
	if len(b) < 2 {
		return AuthSection{}, DropAuthMalformed
	}
	a := AuthSection{Type: AuthType(b[0])}
	n := a.Type.digestLen()
	if n == 0 {
		// Simple Password or a type RFC 5880 does not define.
		return AuthSection{}, DropAuthType
	}
	if int(b[1]) != authHeaderLen+n || len(b) != authHeaderLen+n {
		return AuthSection{}, DropAuthMalformed
	}
	a.KeyID, a.Reserved = b[2], b[3]
	a.Seq = binary.BigEndian.Uint32(b[4:8])
	copy(a.Digest[:], b[8:8+n])
	return a, DropNone
}

// appendAuth appends the section in wire format, with its digest as it is.
func (a *AuthSection) append(b []byte) []byte {
	b = append(b, byte(a.Type), byte(a.len()), a.KeyID, a.Reserved)
	b = binary.BigEndian.AppendUint32(b, a.Seq)
	return append(b, a.Digest[:a.Type.digestLen()]...)
}

// digest computes the digest of a packet in wire format b (with its Authentication Section): the
// hash of the packet with the key, zero-padded, in place of the digest (RFC 5880 6.7.3, 6.7.4).
// b is changed: its digest field holds the padded key afterwards.
func digest(b []byte, t AuthType, key string) (sum [sha1.Size]byte) {
	n := t.digestLen()
	field := b[len(b)-n:]
	clear(field)
	copy(field, key)
	switch t {
	case AuthKeyedMD5, AuthMeticulousKeyedMD5:
		s := md5.Sum(b)
		copy(sum[:], s[:])
	case AuthKeyedSHA1, AuthMeticulousKeyedSHA1:
		sum = sha1.Sum(b)
	}
	return sum
}

// AppendSigned appends p in wire format to b, with its Authentication Section's digest computed
// with key. p must carry an Authentication Section (AuthPresent).
func (p *Packet) AppendSigned(b []byte, key string) []byte {
	start := len(b)
	b = p.Append(b)
	n := p.Auth.Type.digestLen()
	sum := digest(b[start:], p.Auth.Type, key)
	copy(b[len(b)-n:], sum[:n])
	return b
}

// verify reports whether p's digest is the one key gives (constant time).
func (p *Packet) verify(key string) bool {
	var buf [maxPacketLen]byte
	b := p.Append(buf[:0])
	n := p.Auth.Type.digestLen()
	sum := digest(b, p.Auth.Type, key)
	return n > 0 && subtle.ConstantTimeCompare(sum[:n], p.Auth.Digest[:n]) == 1
}

// authState is a session's side of RFC 5880 6.8.1's authentication variables.
type authState struct {
	// xmitSeq is bfd.XmitAuthSeq: the sequence number of our next packet (random at start, then
	// one more per packet, for every keyed type).
	xmitSeq uint32
	// rcvSeq is bfd.RcvAuthSeq, valid while seqKnown (bfd.AuthSeqKnown); seqKnownUntil is when
	// it is forgotten: two detection times after the last authenticated packet (RFC 5880 6.8.1),
	// so that a peer that restarted with another sequence number is accepted again.
	rcvSeq        uint32
	seqKnown      bool
	seqKnownUntil time.Time
	// confirmed is set once rcvSeq comes from a packet naming our local discriminator (Your
	// Discriminator nonzero: the engine has matched it to ours). Until then the window is only
	// tentative: any packet with Your Discriminator zero may have been recorded long ago and
	// replayed, and must not lock the real peer's sequence numbers out (see authenticate).
	confirmed bool
	// seqAdvancedAt is when rcvSeq last increased: the plain keyed types may repeat a sequence
	// number, but not for longer than maxSeqRepeat (see authenticate).
	seqAdvancedAt time.Time
}

// maxSeqRepeat is how long the plain keyed types (not meticulous) accept the same sequence number
// again. RFC 5880 6.7.3 lets a sender repeat it, and then one recorded Up packet, replayed, would
// reset the detection time of a dead peer for ever. Peers increase it at least once a second
// (BIRD) or on every packet (vipgate); a peer that keeps it longer sees its repeats dropped
// (DropAuthSeq) and its session time out.
const maxSeqRepeat = 3 * time.Second

// authenticate applies RFC 5880 6.7.3 / 6.7.4 and the A-bit rules of 6.8.6 to a packet for a
// session using auth, which arrived at at; detect is the session's detection time (bounded) and
// up whether the session is Up. On success the receive sequence number is updated.
//
// The window of 6.7.3/6.7.4 starts at the first packet accepted while bfd.AuthSeqKnown is false
// (after a start, a key change, or two detection times without packets). That first packet may
// be a replay: the packets that need no knowledge of our discriminator (Down or AdminDown, Your
// Discriminator zero) were valid once and can be recorded by anyone on the link. A window set by
// one would keep the real peer's sequence numbers out for good (one replay every two detection
// times). So a window set by such a packet is tentative: while the session is not Up, packets
// with Your Discriminator zero are taken whatever their number (all they can do is move Down to
// Init, which needs no proof), and the first authenticated packet naming our local discriminator
// sets the window for good. Such a packet can only be replayed within the life of our
// discriminator, and the session takes a new one whenever the remote session is forgotten
// (detection time expired, key changed): a recorded Init or Up packet then names an unknown
// discriminator, so replays can neither bring a session Up nor keep a dead peer's session Up.
func (st *authState) authenticate(at time.Time, auth Auth, detect time.Duration, up bool, p *Packet) DropReason {
	switch {
	case auth.Type == AuthNone && !p.AuthPresent:
		return DropNone
	case auth.Type == AuthNone, !p.AuthPresent, p.Auth.Type != auth.Type:
		// 6.8.6: an authenticated packet for a session without authentication, an
		// unauthenticated one for a session with it, or another type: discarded.
		return DropAuth
	case p.Auth.KeyID != auth.KeyID:
		return DropAuthKeyID
	case !p.verify(auth.Key):
		return DropAuthDigest
	}
	if st.seqKnown && !at.Before(st.seqKnownUntil) {
		st.seqKnown, st.confirmed = false, false
	}
	ours := p.YourDiscr != 0
	switch {
	case !st.seqKnown:
		st.seqAdvancedAt = at
	case !st.confirmed && (ours || !up):
		// Tentative window: see above.
		if ours || p.Auth.Seq != st.rcvSeq {
			st.seqAdvancedAt = at
		}
	default:
		// The window of 6.7.3/6.7.4, modulo 2^32: [rcv, rcv+3*DetectMult] for the keyed
		// types, (rcv, rcv+3*DetectMult] for the meticulous ones; a repeat only for
		// maxSeqRepeat.
		d := p.Auth.Seq - st.rcvSeq
		switch {
		case d > 3*uint32(p.DetectMult):
			return DropAuthSeq
		case d == 0 && (auth.Type.Meticulous() || at.Sub(st.seqAdvancedAt) >= maxSeqRepeat):
			return DropAuthSeq
		case d != 0:
			st.seqAdvancedAt = at
		}
	}
	st.rcvSeq, st.seqKnown = p.Auth.Seq, true
	st.confirmed = st.confirmed || ours
	st.seqKnownUntil = at.Add(2 * detect)
	return DropNone
}

// forget forgets the peer's sequence numbers (a new key, or a new local discriminator).
func (st *authState) forget() { st.seqKnown, st.confirmed = false, false }
