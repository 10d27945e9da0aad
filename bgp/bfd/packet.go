package bfd

import (
	"encoding/binary"
	"time"
)

// State is a BFD session state, as carried in the Sta field (RFC 5880 section 4.1).
type State uint8

// The session states (RFC 5880 section 4.1).
const (
	StateAdminDown State = 0
	StateDown      State = 1
	StateInit      State = 2
	StateUp        State = 3
)

var stateNames = [...]string{StateAdminDown: "admindown", StateDown: "down", StateInit: "init", StateUp: "up"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "invalid"
}

// Diag is the diagnostic code of a packet: why the sender's session last changed state.
type Diag uint8

// The diagnostic codes of RFC 5880 section 4.1.
const (
	DiagNone                  Diag = 0
	DiagDetectTimeExpired     Diag = 1
	DiagEchoFailed            Diag = 2
	DiagNeighborDown          Diag = 3
	DiagForwardingReset       Diag = 4
	DiagPathDown              Diag = 5
	DiagConcatPathDown        Diag = 6
	DiagAdminDown             Diag = 7
	DiagReverseConcatPathDown Diag = 8
)

var diagNames = [...]string{
	DiagNone:                  "none",
	DiagDetectTimeExpired:     "control detection time expired",
	DiagEchoFailed:            "echo function failed",
	DiagNeighborDown:          "neighbor signaled session down",
	DiagForwardingReset:       "forwarding plane reset",
	DiagPathDown:              "path down",
	DiagConcatPathDown:        "concatenated path down",
	DiagAdminDown:             "administratively down",
	DiagReverseConcatPathDown: "reverse concatenated path down",
}

func (d Diag) String() string {
	if int(d) < len(diagNames) {
		return diagNames[d]
	}
	return "unknown"
}

// Packet is a BFD Control packet (RFC 5880 section 4.1), with its Authentication Section when
// AuthPresent (keyed MD5 or SHA1 only: section 4.3, 4.4).
type Packet struct {
	Diag  Diag
	State State
	// Poll asks the receiver to answer with Final (a Poll Sequence, section 6.5).
	Poll, Final bool
	// ControlPlaneIndependent is the C bit: the sender's BFD does not share fate with its control
	// plane. vipgate's BFD runs in the BGP process, so it never sets it.
	ControlPlaneIndependent bool
	// AuthPresent is the A bit; Demand the D bit (the sender asks us to stop periodic packets);
	// Multipoint the M bit, which must be zero.
	AuthPresent, Demand, Multipoint bool
	DetectMult                      uint8
	MyDiscr, YourDiscr              uint32
	// The intervals travel in microseconds.
	DesiredMinTx, RequiredMinRx, RequiredMinEchoRx time.Duration
	// Auth is the Authentication Section, when AuthPresent.
	Auth AuthSection
}

const (
	version = 1
	// packetLen is the length of a Control packet without Authentication Section; the minimum.
	packetLen = 24
	// minAuthLen is the minimum length of a packet with the A bit set (RFC 5880 6.8.6).
	minAuthLen = 26
)

const (
	flagPoll        = 0x20
	flagFinal       = 0x10
	flagCPI         = 0x08
	flagAuth        = 0x04
	flagDemand      = 0x02
	flagMultipoint  = 0x01
	maxWireInterval = time.Duration(1<<32-1) * time.Microsecond
)

// Append appends p in wire format to b.
func (p *Packet) Append(b []byte) []byte {
	flags := byte(p.State) << 6
	for _, f := range [...]struct {
		set bool
		bit byte
	}{{p.Poll, flagPoll}, {p.Final, flagFinal}, {p.ControlPlaneIndependent, flagCPI}, {p.AuthPresent, flagAuth}, {p.Demand, flagDemand}, {p.Multipoint, flagMultipoint}} {
		if f.set {
			flags |= f.bit
		}
	}
	length := packetLen
	if p.AuthPresent {
		length += p.Auth.len()
	}
	b = append(b, version<<5|byte(p.Diag)&0x1f, flags, p.DetectMult, byte(length))
	b = binary.BigEndian.AppendUint32(b, p.MyDiscr)
	b = binary.BigEndian.AppendUint32(b, p.YourDiscr)
	for _, d := range [...]time.Duration{p.DesiredMinTx, p.RequiredMinRx, p.RequiredMinEchoRx} {
		b = binary.BigEndian.AppendUint32(b, wireInterval(d))
	}
	if p.AuthPresent {
		b = p.Auth.append(b)
	}
	return b
}

func wireInterval(d time.Duration) uint32 {
	switch {
	case d <= 0:
		return 0
	case d >= maxWireInterval:
		return 1<<32 - 1
	}
	return uint32(d / time.Microsecond)
}

// Parse decodes a Control packet and applies the checks of RFC 5880 section 6.8.6 that need no
// session: version, lengths, Detect Mult, Multipoint, My Discriminator, and the shape of the
// Authentication Section (a keyed MD5 or SHA1 one, filling the packet to its Length; the digest
// and the sequence number are the session's to check). Every field is read from b within its
// bounds; the cost is the same for any input.
func Parse(b []byte) (Packet, DropReason) {
	if len(b) < packetLen {
		return Packet{}, DropShort
	}
	if b[0]>>5 != version {
		return Packet{}, DropVersion
	}
	length := int(b[3])
	flags := b[1]
	if length < packetLen || length > len(b) || flags&flagAuth != 0 && length < minAuthLen {
		return Packet{}, DropLength
	}
	p := Packet{
		Diag:                    Diag(b[0] & 0x1f),
		State:                   State(flags >> 6),
		Poll:                    flags&flagPoll != 0,
		Final:                   flags&flagFinal != 0,
		ControlPlaneIndependent: flags&flagCPI != 0,
		AuthPresent:             flags&flagAuth != 0,
		Demand:                  flags&flagDemand != 0,
		Multipoint:              flags&flagMultipoint != 0,
		DetectMult:              b[2],
		MyDiscr:                 binary.BigEndian.Uint32(b[4:8]),
		YourDiscr:               binary.BigEndian.Uint32(b[8:12]),
		DesiredMinTx:            time.Duration(binary.BigEndian.Uint32(b[12:16])) * time.Microsecond,
		RequiredMinRx:           time.Duration(binary.BigEndian.Uint32(b[16:20])) * time.Microsecond,
		RequiredMinEchoRx:       time.Duration(binary.BigEndian.Uint32(b[20:24])) * time.Microsecond,
	}
	switch {
	case p.DetectMult == 0:
		return Packet{}, DropDetectMult
	case p.Multipoint:
		return Packet{}, DropMultipoint
	case p.MyDiscr == 0:
		return Packet{}, DropZeroMyDiscr
	case p.Poll && p.Final:
		// RFC 5880 6.5: a packet never carries both; such a sender is broken.
		return Packet{}, DropPollFinal
	case !p.AuthPresent:
		// Bytes after Length are not part of the packet (RFC 5880 6.8.6 only bounds Length
		// by the datagram).
		return p, DropNone
	}
	a, why := parseAuth(b[packetLen:length])
	if why != DropNone {
		return Packet{}, why
	}
	p.Auth = a
	return p, DropNone
}
