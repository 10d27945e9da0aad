package natpath

import (
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The XDP attach point: natpath.c built with -DNATPATH_XDP (natpath_xdp_bpfel.o), the same
// program run before the kernel allocates an skb, on the maps of the tc program (one flow table,
// one Maglev table per VIP port, one deny list, one seed). The tc program stays attached behind it
// on every device: what the XDP program cannot finish (a next hop not resolved yet, an egress
// device that takes no XDP frames, a route it cannot use, a frame to another MAC address) it
// hands to the tc program untouched and before changing any state; what it leaves to the stack it
// marks in the packet's metadata with this load's random mark, which the tc program passes on
// without looking again.
//
// What differs from the tc program, by design:
//   - An XDP redirect bypasses the egress device's qdisc (tc's goes through it).
//   - XDP sees the frame as the driver delivers it: a device that strips VLAN tags on receive
//     (rxvlan offload) hands tagged frames over as untagged ones, which the tc program tells
//     by vlan_present (a tagged frame of a VLAN the host has no device for is dropped, of one
//     it has is that device's). So the XDP program runs only where that offload is off, in
//     any mode; tagged frames then reach it in band (not IP: the stack's).
//   - The checksums are updated by hand as complete ones: frames from the wire have complete
//     checksums, but a veth's peer sends CHECKSUM_PARTIAL packets (the sum not computed yet)
//     unless its tx checksum offload is off. AttachAuto keeps veths on tc; AttachXDP on a veth
//     is for peers that compute their checksums (ethtool -K <peer> tx off).
//   - XDP_REDIRECT to a veth needs its peer to take XDP frames (an XDP program or GRO on the
//     peer: the kernel's NETDEV_XDP_ACT_NDO_XMIT, read at each Attach): else the frame goes to
//     the tc program, whose redirect works anywhere.
//
// Threat model. The XDP program reads what the tc program reads (every frame on the device:
// anyone on the link sends them) with the same checks (the fuzz target and the crafted-frame
// tests run both). Its one new channel is the mark to the tc program: a frame from the wire has
// no metadata; one redirected in by another XDP program may have some, which the XDP program
// strips (handed over) or overwrites with the mark (left to the stack), so on a device where it
// runs nothing else reaches the tc program. On a device without it, a forged mark must guess 32
// random bits, and a right guess only makes the tc program leave the packet to the stack, whose
// nftables table forwards it with the same policy (TestXDPMetadata).

//go:embed natpath_xdp_bpfel.o
var xdpObject []byte

const (
	xdpProgName   = "vipgate_natxdp"
	mapXDPDevs    = "vg_xdp_devs"
	xdpDevValSize = 8 // struct xdp_dev
	// xdpDevsMax is vg_xdp_devs' size (XDP_DEVS): interface indexes below it. The gateway's NICs
	// have low ones (from boot); a device above runs the tc program alone.
	xdpDevsMax = 65536
)

// AttachMode says where the program runs on a device.
type AttachMode string

const (
	// AttachAuto: XDP (with tc behind it) on devices whose driver runs XDP natively and which
	// show none of the shapes XDP cannot tell (VLAN offload, veth), tc elsewhere.
	AttachAuto AttachMode = "auto"
	// AttachXDP: XDP with tc behind it on every device; a device without native XDP is an error
	// (its tc program still forwards).
	AttachXDP AttachMode = "xdp"
	// AttachTC: the tc program alone.
	AttachTC AttachMode = "tc"
)

// ParseAttachMode reads an attach mode ("" is AttachAuto).
func ParseAttachMode(s string) (AttachMode, error) {
	switch m := AttachMode(s); m {
	case "":
		return AttachAuto, nil
	case AttachAuto, AttachXDP, AttachTC:
		return m, nil
	}
	return "", fmt.Errorf("natpath attach mode %q: auto, xdp or tc", s)
}

// xdpDevBytes is struct xdp_dev.
func xdpDevBytes(mac net.HardwareAddr, xmit bool) []byte {
	b := make([]byte, xdpDevValSize)
	copy(b, mac)
	if xmit {
		b[6] = 1
	}
	return b
}

// Netdev generic netlink (linux/netdev.h).
const (
	netdevCmdDevGet      = 1
	netdevAttrIfindex    = 1
	netdevAttrXDPFeature = 3
	netdevXDPActBasic    = 1 << 0
	netdevXDPActNdoXmit  = 1 << 2
)

// xdpFeatures reads device ifindex's XDP features (NETDEV_XDP_ACT_*) from the netdev generic
// netlink family (Linux 6.3).
func xdpFeatures(ifindex int) (uint64, error) {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return 0, fmt.Errorf("the netdev netlink family: %w", err)
	}
	c, err := mnl.Dial(unix.NETLINK_GENERIC, nil)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ae := mnl.NewAttributeEncoder()
	ae.Uint32(netdevAttrIfindex, uint32(ifindex))
	attrs, err := ae.Encode()
	if err != nil {
		return 0, err
	}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: mnl.HeaderType(fam.ID), Flags: mnl.Request},
		Data:   append([]byte{netdevCmdDevGet, 1, 0, 0}, attrs...), // genlmsghdr: command, version
	})
	if err != nil {
		return 0, fmt.Errorf("interface %d's XDP features: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := mnl.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == netdevAttrXDPFeature {
				return ad.Uint64(), nil
			}
		}
	}
	return 0, fmt.Errorf("interface %d: no XDP features in the answer", ifindex)
}

// xdpDevice is what Attach needs to know of a device for XDP.
type xdpDevice struct {
	mac net.HardwareAddr
	// xmit: it takes XDP frames (redirect target); native: its driver runs XDP programs.
	xmit, native bool
	// noXDP: why the XDP program must not run there (any mode); autoTC: why AttachAuto leaves
	// it on tc ("": it need not).
	noXDP, autoTC string
}

// inspectDevice reads device i (decide: also what AttachAuto needs to decide).
func inspectDevice(i int, decide bool) (xdpDevice, error) {
	var d xdpDevice
	l, err := netlink.LinkByIndex(i)
	if err != nil {
		return d, err
	}
	d.mac = l.Attrs().HardwareAddr
	if f, err := xdpFeatures(i); err == nil {
		d.xmit = f&netdevXDPActNdoXmit != 0
		d.native = f&netdevXDPActBasic != 0
	}
	if !decide {
		return d, nil
	}
	stripped, err := rxVLANStripped(l.Attrs().Name)
	switch {
	case err != nil:
		d.noXDP = "its offloads cannot be read: " + err.Error()
	case stripped:
		d.noXDP = "it strips VLAN tags on receive (XDP would see a tagged frame as untagged): ethtool -K " + l.Attrs().Name + " rxvlan off rx-vlan-stag-hw-parse off"
	case l.Type() == "veth":
		d.autoTC = "a veth (its peer may send partial checksums)"
	}
	return d, nil
}

// attachXDP attaches the XDP program natively to device i, replacing an XDP program of ours (a
// previous run's) in one step, never another's.
func attachXDP(i int, prog *ebpf.Program) error {
	l, err := netlink.LinkByIndex(i)
	if err != nil {
		return err
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached && x.ProgId != 0 && !isOurXDP(ebpf.ProgramID(x.ProgId)) {
		return fmt.Errorf("interface %s has another XDP program (id %d)", l.Attrs().Name, x.ProgId)
	}
	return netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_DRV_MODE)
}

// detachXDP detaches the XDP program of device i if it is ours.
func detachXDP(i int) error {
	l, err := netlink.LinkByIndex(i)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached || !isOurXDP(ebpf.ProgramID(x.ProgId)) {
		return nil
	}
	return netlink.LinkSetXdpFdWithFlags(l, -1, nl.XDP_FLAGS_DRV_MODE)
}

func isOurXDP(id ebpf.ProgramID) bool {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return false
	}
	defer prog.Close()
	info, err := prog.Info()
	return err == nil && info.Name == xdpProgName
}

// attachedXDP lists the devices of this network namespace with an XDP program of ours.
func attachedXDP() []int {
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	var out []int
	for _, l := range links {
		if x := l.Attrs().Xdp; x != nil && x.Attached && isOurXDP(ebpf.ProgramID(x.ProgId)) {
			out = append(out, l.Attrs().Index)
		}
	}
	return out
}

// loadSpec reads a program object and sizes its maps for cfg.
func loadSpec(obj []byte, cfg Config) (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("NAT fast path: reading the program: %w", err)
	}
	spec.Maps[mapFlows].MaxEntries = uint32(cfg.FlowEntries)
	spec.Maps[mapNew].MaxEntries = uint32(cfg.NewFlowEntries)
	spec.Maps[mapDeny].MaxEntries = maxDenySources
	spec.Maps[mapVIPs].MaxEntries = maxVIPPorts
	spec.Maps[mapMaglev].MaxEntries = maxVIPPorts
	spec.Maps[mapMaglev].InnerMap = innerSpec(1)
	return spec, nil
}

// loadXDP loads the XDP program on the tc program's maps (every vg_ map they both have).
func (p *Path) loadXDP(cfg Config) error {
	spec, err := loadSpec(xdpObject, cfg)
	if err != nil {
		return err
	}
	shared := map[string]*ebpf.Map{}
	for name := range spec.Maps {
		if m := p.coll.Maps[name]; m != nil && strings.HasPrefix(name, "vg_") {
			shared[name] = m
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: shared})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("the kernel's verifier refuses the XDP program: %v", ve)
		}
		return fmt.Errorf("loading the XDP program: %w", err)
	}
	p.xdpColl, p.xdp, p.xdpDevs = coll, coll.Programs[xdpProgName], coll.Maps[mapXDPDevs]
	return nil
}

func (p *Path) closeColls() {
	if p.xdpColl != nil {
		p.xdpColl.Close()
	}
	p.coll.Close()
}

// xdpMark is a random mark, not 0 (vg_config's xdp_mark).
func xdpMark() uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:])
		if m := binary.LittleEndian.Uint32(b[:]); m != 0 {
			return m
		}
	}
}

// dropXDPs takes the XDP program away from every device but those of want (before the tc
// program behind it goes).
func (p *Path) dropXDPs(want []int) error {
	var errs []error
	for i := range p.xdpOn {
		if !slices.Contains(want, i) {
			errs = append(errs, detachXDP(i))
			delete(p.xdpOn, i)
		}
	}
	for i := range p.xdpWhy {
		if !slices.Contains(want, i) {
			delete(p.xdpWhy, i)
		}
	}
	for i := range p.xdpDevSet {
		if !slices.Contains(want, i) {
			errs = append(errs, p.xdpDevs.Put(uint32(i), make([]byte, xdpDevValSize)))
			delete(p.xdpDevSet, i)
		}
	}
	return errors.Join(errs...)
}

// attachXDPs runs the XDP program in front of the tc program on the devices of want where the
// mode says so (want: devices the tc program is attached to). Each call also rereads whether
// each device takes XDP frames (a veth's peer may have changed).
func (p *Path) attachXDPs(want []int) error {
	var errs []error
	for _, i := range want {
		if !p.attached[i] {
			continue // the tc program is not behind it
		}
		_, decided := p.xdpWhy[i]
		d, err := inspectDevice(i, !p.xdpOn[i] && !decided)
		if err != nil {
			errs = append(errs, fmt.Errorf("interface %d: %w", i, err))
			continue
		}
		if p.xdpDevs != nil && i < xdpDevsMax {
			if err := p.xdpDevs.Put(uint32(i), xdpDevBytes(d.mac, d.xmit)); err != nil {
				errs = append(errs, fmt.Errorf("interface %d: %w", i, err))
				continue
			}
			p.xdpDevSet[i] = true
		}
		if i >= xdpDevsMax {
			d.noXDP = fmt.Sprintf("interface index %d beyond the XDP program's table (%d)", i, xdpDevsMax)
		}
		if p.xdpOn[i] || decided {
			continue
		}
		why := ""
		switch {
		case p.cfg.Attach == AttachTC:
			why = "attach mode tc"
		case p.xdp == nil:
			why = fmt.Sprint(p.xdpErr)
		case d.noXDP != "" && p.cfg.Attach == AttachXDP:
			errs = append(errs, fmt.Errorf("XDP on interface %d: %s", i, d.noXDP))
			continue
		case d.noXDP != "":
			why = d.noXDP
		case p.cfg.Attach == AttachAuto && d.autoTC != "":
			why = d.autoTC
		case p.cfg.Attach == AttachAuto && !d.native:
			why = "no native XDP"
		}
		if why != "" {
			p.xdpWhy[i] = why
			errs = append(errs, detachXDP(i)) // a previous run's
			continue
		}
		if err := attachXDP(i, p.xdp); err != nil {
			if p.cfg.Attach == AttachXDP {
				errs = append(errs, fmt.Errorf("XDP on interface %d: %w", i, err))
			} else {
				p.xdpWhy[i] = err.Error()
			}
			continue
		}
		p.xdpOn[i] = true
	}
	return errors.Join(errs...)
}

// AttachedXDP returns the interfaces the XDP program runs on (in front of the tc program), and
// why each other attached interface runs the tc program alone.
func (p *Path) AttachedXDP() (on []int, tcOnly map[int]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.xdpOn {
		on = append(on, i)
	}
	slices.Sort(on)
	return on, maps.Clone(p.xdpWhy)
}
