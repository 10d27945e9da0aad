// Package natpath is the gateway's NAT fast path: forwarding direct and nodePort as a tc (tcx)
// ingress BPF program (natpath.c), which takes a VIP port's packets before the IP stack, rewrites
// them as the family's nftables table would with conntrack (Maglev's backend; masquerade where the
// table does), and sends them to the next hop itself; replies are rewritten back the same way.
// What it does not take, the family's table forwards as before. Where the device allows, the same
// program built as an XDP program runs in front of it, before the kernel allocates an skb
// (Config.Attach, xdp.go), on the same maps; what XDP cannot finish it hands to the tc program.
//
// The package is a leaf: it knows VIP ports, Maglev tables and flows, not Services. The gateway
// (gateway/natpath.go) gives it the VIP ports of each sync and the stale flows to end.
//
// Ownership: Path owns the maps' contents but the flow tables' entries, which the program writes
// (the first packet of a flow writes its two entries among the unconfirmed flows, its
// confirmation moves them to the established table) and Path only reads and deletes (stale
// flows; ended ones, Sweep, which its own goroutine runs). One goroutine calls Path's methods (the
// gateway's sync loop); Flows, Counters, Sweep and Close may be called from others.
//
// Lifetime: as the gateway's nftables tables, the program stays attached when the process ends
// (tcx without a link: the kernel holds it, with its maps), and keeps forwarding with what it was
// last given. The next run's Load adopts its flow table, so established flows keep their backend
// and masquerade port across a restart or an upgrade, and Attach replaces the old program with
// the new one in one step on each interface. Detach (or Cleanup, from `vipgate gateway
// --cleanup`) takes it away.
package natpath

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The program, built from bpf/natpath.c by `make bpf` (clang -target bpf, DWARF stripped, BTF kept).
// TestObjectUpToDate rebuilds it where clang is installed and compares.
//
//go:embed natpath_bpfel.o
var object []byte

// Map and program names in natpath.c.
const (
	progName    = "vipgate_natpath"
	mapVIPs     = "vg_vips"
	mapMaglev   = "vg_maglev"
	mapFlows    = "vg_flows"
	mapNew      = "vg_new"
	mapDeny     = "vg_deny"
	mapConfig   = "vg_config"
	mapCounters = "vg_counters"
)

// Binary layouts of natpath.c's structs (TestLayouts checks them against its BTF).
const (
	vipKeySize  = 20 // struct vip_key
	vipValSize  = 16 // struct vip_val
	backendSize = 20 // struct backend
	flowKeySize = 40 // struct flow_key
	flowValSize = 64 // struct flow_val
	configSize  = 40 // struct config
	denyKeySize = 24 // struct deny_key
)

// Flags of struct vip_val and struct flow_val.
const (
	vipSNAT     = 1
	flowReply   = 1
	flowSNAT    = 2
	flowClosing = 4
	flowReplied = 8
)

// Defaults of Config.
const (
	DefaultFlowEntries = 262144
	DefaultTCPTimeout  = time.Hour
	DefaultUDPTimeout  = 2 * time.Minute
	// DefaultHashSeed is the flow hash's seed without a key: maglev.DefaultHashSeed (the package
	// imports nothing of the module; a test checks they are equal).
	DefaultHashSeed = 0x76697067
	// minNewFlowEntries is the least room for unconfirmed flows (Config.NewFlowEntries).
	minNewFlowEntries = 1024
	// DefaultSNATPortMin and DefaultSNATPortMax bound the masquerade ports: above Linux's default
	// ephemeral range (32768-60999), so the gateway's own connections never hold one.
	DefaultSNATPortMin = 61000
	DefaultSNATPortMax = 65535
	// closingTimeout is how long a TCP flow that saw a FIN or RST keeps its entry idle
	// (conntrack's TIME_WAIT; a SYN on it deals it again anyway).
	closingTimeout = 2 * time.Minute
	// maxDenySources bounds Config.DenySources (vg_deny's size).
	maxDenySources = 256
	// maxVIPPorts bounds the VIP ports (vg_vips) and the distinct Maglev tables (vg_maglev).
	maxVIPPorts = 65536
)

// Config sizes and tunes the fast path.
type Config struct {
	// FlowEntries is the established flow table's size in entries, two per flow (its forward and
	// its reply entry). Nothing evicts an established flow: while the table is full, new flows
	// are left to the stack (conntrack). 0: DefaultFlowEntries.
	FlowEntries int
	// NewFlowEntries is the room for flows not confirmed yet (TCP before its handshake completes,
	// UDP before the client's datagram after an answer), the least recently used evicted: a
	// flood of SYNs or unanswered datagrams evicts only its own kind. 0: a quarter of
	// FlowEntries, at least 1,024.
	NewFlowEntries int
	// HashSeed is the flow hash's seed, which must be the nftables rules' (the gateways' shared
	// one, derived from their key: maglev.DeriveHashSeed). 0: DefaultHashSeed.
	HashSeed uint32
	// DenySources are source prefixes no client can have (the cluster's pod networks): a new flow
	// from one is dropped, as the built-in martians are (loopback, 0.0.0.0/8, multicast, the
	// broadcast address; IPv6 ::, ::1, ff00::/8).
	DenySources []netip.Prefix
	// TCPTimeout and UDPTimeout: a flow idle that long is dealt again by Maglev (a masqueraded
	// flow gets a new port). 0: the defaults.
	TCPTimeout, UDPTimeout time.Duration
	// SNATPortMin..SNATPortMax are the masquerade ports (0, 0: the defaults).
	SNATPortMin, SNATPortMax uint16
	// Attach is where the program runs on each device (xdp.go): "" is AttachAuto.
	Attach AttachMode
}

func (c Config) withDefaults() Config {
	if c.FlowEntries == 0 {
		c.FlowEntries = DefaultFlowEntries
	}
	if c.NewFlowEntries == 0 {
		c.NewFlowEntries = max(c.FlowEntries/4, minNewFlowEntries)
	}
	if c.HashSeed == 0 {
		c.HashSeed = DefaultHashSeed
	}
	if c.TCPTimeout == 0 {
		c.TCPTimeout = DefaultTCPTimeout
	}
	if c.UDPTimeout == 0 {
		c.UDPTimeout = DefaultUDPTimeout
	}
	if c.SNATPortMin == 0 && c.SNATPortMax == 0 {
		c.SNATPortMin, c.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if c.Attach == "" {
		c.Attach = AttachAuto
	}
	return c
}

// Validate checks c.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.FlowEntries < 2 || c.FlowEntries > 1<<26:
		return fmt.Errorf("flow table size %d: must be 2 to %d entries", c.FlowEntries, 1<<26)
	case c.NewFlowEntries < 2 || c.NewFlowEntries > 1<<26:
		return fmt.Errorf("unconfirmed flow table size %d: must be 2 to %d entries", c.NewFlowEntries, 1<<26)
	case len(c.DenySources) > maxDenySources:
		return fmt.Errorf("%d denied source prefixes: at most %d", len(c.DenySources), maxDenySources)
	case c.TCPTimeout < time.Second || c.UDPTimeout < time.Second:
		return errors.New("flow timeouts must be at least 1s")
	case c.SNATPortMin == 0 || c.SNATPortMin > c.SNATPortMax:
		return fmt.Errorf("masquerade ports %d-%d: not a range of ports", c.SNATPortMin, c.SNATPortMax)
	}
	_, err := ParseAttachMode(string(c.Attach))
	return err
}

// VIPPort is one VIP port the fast path takes.
type VIPPort struct {
	VIP   netip.Addr
	Proto uint8 // 6 (TCP) or 17 (UDP)
	Port  uint16
	// SNAT masquerades the flows: the backend sees the gateway's address (the egress device's,
	// as masquerade picks it) and a port of Config's range.
	SNAT bool
	// Table is the Maglev table (slot -> backend: the pod, or the node and its NodePort). Its
	// length is the slot count M of the nftables rule, which it must equal slot for slot.
	Table []netip.AddrPort
}

// Key is a VIP port's identity.
func (v VIPPort) Key() VIPKey { return VIPKey{v.VIP.Unmap(), v.Proto, v.Port} }

// VIPKey identifies a VIP port.
type VIPKey struct {
	VIP   netip.Addr
	Proto uint8
	Port  uint16
}

// Flow is one entry of the flow table: a packet tuple as it arrives, and what it becomes.
type Flow struct {
	Proto    uint8
	Src, Dst netip.AddrPort
	// NewSrc and NewDst are the tuple after the rewrite.
	NewSrc, NewDst netip.AddrPort
	// Reply: the entry rewrites the replies (from the backend); else the client's packets.
	Reply bool
	// Unconfirmed: the flow is not confirmed yet (TCP: its handshake has not completed; UDP: no
	// client datagram after an answer yet), its entries among the unconfirmed flows (evicted first).
	Unconfirmed bool
	SNAT        bool
	// Closing: (TCP, forward entry) a FIN or RST passed; a SYN opens a new connection.
	Closing bool
	// Idle is how long ago the entry was last used (to a second).
	Idle time.Duration
}

// Counters are the program's counters, summed over CPUs.
type Counters struct {
	// New flows, a known flow's packets forwarded, replies forwarded.
	New, Forwarded, Replies uint64
	// Passed to the IP stack: a VIP port whose slot is empty; no usable next hop (MTU,
	// unreachable, forwarding off); no free masquerade port.
	NoBackend, NoRoute, SNATFull uint64
	// Neigh: forwarded through the neighbour layer (next hop not yet resolved).
	Neigh uint64
	// Left to the stack too: a TCP packet of a VIP port that is no flow's and opens no connection
	// (no SYN: a connection conntrack holds); a new flow whose reply tuple a live flow holds.
	NoSYN, Clash uint64
	// ICMP errors about the program's flows, translated and forwarded; later fragments of IPv4
	// UDP datagrams whose first fragment a flow took.
	ICMP, Frag uint64
	// Martian: new flows from a source no client can have, dropped. Full: new flows left to the
	// stack because the established table was full (and flows it could not confirm). Window: TCP
	// RSTs and FINs outside the window, forwarded without changing the flow's state.
	Martian, Full, Window uint64
}

// Path is the loaded program and its maps.
type Path struct {
	cfg      Config
	coll     *ebpf.Collection
	prog     *ebpf.Program
	vips     *ebpf.Map
	maglev   *ebpf.Map
	flows    *ebpf.Map // established
	newFlows *ebpf.Map // unconfirmed
	counters *ebpf.Map
	// xdp is the XDP program (nil: the kernel refused it, xdpErr says why), on the same maps;
	// xdpColl holds it and its own map, xdpDevs (vg_xdp_devs).
	xdp     *ebpf.Program
	xdpColl *ebpf.Collection
	xdpDevs *ebpf.Map
	xdpErr  error
	// stop ends the sweep (Close).
	stop chan struct{}
	done chan struct{}

	mu sync.Mutex
	// attached are the interfaces the program is attached to; old the programs of a previous run
	// still attached (by interface), which Attach replaces and Detach detaches.
	attached map[int]bool
	old      map[int]ebpf.ProgramID
	// xdpOn are the interfaces the XDP program runs on (in front of the tc program); xdpWhy
	// why the others it was asked for (AttachAuto) run the tc program alone.
	xdpOn  map[int]bool
	xdpWhy map[int]string
	// xdpDevSet are the interfaces with an entry in vg_xdp_devs.
	xdpDevSet map[int]bool
	// Adopted says the flow table is a previous run's (its flows go on).
	Adopted bool
	// CanMasquerade says the kernel gives the program the source address masquerade would use
	// (bpf_fib_lookup's BPF_FIB_LOOKUP_SRC, Linux 6.7); without it, Sync leaves masqueraded VIP
	// ports to the family's table.
	CanMasquerade bool
	// ports are the programmed VIP ports and the table each uses.
	ports map[VIPKey]portState
	// tables are the Maglev tables in vg_maglev, by content: VIP ports with the same backends
	// (every VIP port of nodePort forwarding with eTP=Cluster) share one.
	tables map[string]*table
	nextID uint32
	closed bool
}

type portState struct {
	snat  bool
	table *table
	// src is the table as Sync was given it, to tell an unchanged one without comparing slots.
	src []netip.AddrPort
}

// sameSlice says whether a and b are the same slice (the same elements in memory).
func sameSlice(a, b []netip.AddrPort) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

type table struct {
	id   uint32
	size int
	refs int
}

// Load loads the program and creates its maps (nothing is attached yet).
func Load(cfg Config) (*Path, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	spec, err := loadSpec(object, cfg)
	if err != nil {
		return nil, err
	}
	old, prev, err := findPrevious(cfg)
	if err != nil {
		return nil, fmt.Errorf("NAT fast path: %w", err)
	}
	opts := ebpf.CollectionOptions{}
	if prev != nil {
		for _, m := range prev {
			defer m.Close()
		}
		opts.MapReplacements = prev
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("NAT fast path: the kernel's verifier refuses the program: %v", ve)
		}
		return nil, fmt.Errorf("NAT fast path: loading the program: %w", err)
	}
	p := &Path{cfg: cfg, coll: coll, prog: coll.Programs[progName], vips: coll.Maps[mapVIPs], maglev: coll.Maps[mapMaglev],
		flows: coll.Maps[mapFlows], newFlows: coll.Maps[mapNew], counters: coll.Maps[mapCounters],
		stop: make(chan struct{}), done: make(chan struct{}),
		attached: map[int]bool{}, old: old, Adopted: prev != nil, CanMasquerade: kernelAtLeast(6, 7),
		ports: map[VIPKey]portState{}, tables: map[string]*table{}, nextID: 1,
		xdpOn: map[int]bool{}, xdpWhy: map[int]string{}, xdpDevSet: map[int]bool{}}
	if cfg.Attach != AttachTC {
		p.xdpErr = p.loadXDP(cfg)
		if p.xdpErr != nil && cfg.Attach == AttachXDP {
			coll.Close()
			return nil, fmt.Errorf("NAT fast path: %w", p.xdpErr)
		}
	}
	var c [configSize]byte
	binary.LittleEndian.PutUint64(c[0:], uint64(cfg.TCPTimeout))
	binary.LittleEndian.PutUint64(c[8:], uint64(cfg.UDPTimeout))
	binary.LittleEndian.PutUint64(c[16:], uint64(min(cfg.TCPTimeout, closingTimeout)))
	binary.LittleEndian.PutUint32(c[24:], uint32(cfg.SNATPortMin))
	binary.LittleEndian.PutUint32(c[28:], uint32(cfg.SNATPortMax)-uint32(cfg.SNATPortMin)+1)
	binary.LittleEndian.PutUint32(c[32:], cfg.HashSeed)
	binary.LittleEndian.PutUint32(c[36:], xdpMark())
	if err := coll.Maps[mapConfig].Put(uint32(0), c[:]); err != nil {
		p.closeColls()
		return nil, fmt.Errorf("NAT fast path: writing its settings: %w", err)
	}
	for _, pfx := range cfg.DenySources {
		if err := coll.Maps[mapDeny].Put(denyKey(pfx), uint32(1)); err != nil {
			p.closeColls()
			return nil, fmt.Errorf("NAT fast path: denying source %s: %w", pfx, err)
		}
	}
	go p.sweepLoop(sweepInterval(cfg))
	return p, nil
}

// denyKey is prefix pfx as vg_deny's LPM trie holds it (struct deny_key).
func denyKey(pfx netip.Prefix) []byte {
	pfx = pfx.Masked()
	b := make([]byte, denyKeySize)
	a := addrBytes(pfx.Addr())
	binary.LittleEndian.PutUint32(b, uint32(8+pfx.Bits()))
	b[4] = family(pfx.Addr())
	copy(b[5:], a[:])
	return b
}

// Attach attaches the program to the ingress of the interfaces given by index (replacing a previous
// run's program there in one step), and detaches it from every other. It attaches to as many as it
// can and returns the failures joined.
func (p *Path) Attach(ifindexes []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("NAT fast path: closed")
	}
	// The XDP program first: what it cannot finish it hands to the tc program behind it.
	errs := []error{p.dropXDPs(ifindexes)}
	for i := range p.attached {
		if !slices.Contains(ifindexes, i) {
			if err := detach(i, p.prog); err != nil {
				errs = append(errs, fmt.Errorf("detaching from interface %d: %w", i, err))
			}
			delete(p.attached, i)
		}
	}
	for i, id := range p.old {
		if !slices.Contains(ifindexes, i) {
			errs = append(errs, detachID(i, id))
			delete(p.old, i)
		}
	}
	for _, i := range ifindexes {
		if p.attached[i] {
			continue
		}
		opts := link.RawAttachProgramOptions{Target: i, Program: p.prog, Attach: ebpf.AttachTCXIngress}
		if !ethernet(i) {
			errs = append(errs, fmt.Errorf("interface %d is not an Ethernet device (the program reads Ethernet frames): left out", i))
			continue
		}
		if id, ok := p.old[i]; ok {
			// In the previous run's place, in one step: no packet meets neither or both. The
			// old program stays known (Detach, the next try) until it is replaced.
			prev, err := ebpf.NewProgramFromID(id)
			switch {
			case err == nil:
				opts.Anchor = link.ReplaceProgram(prev)
				err = link.RawAttachProgram(opts)
				prev.Close()
				if err != nil {
					errs = append(errs, fmt.Errorf("replacing the previous program on interface %d: %w", i, err))
					continue
				}
				delete(p.old, i)
				p.attached[i] = true
				continue
			case errors.Is(err, unix.ENOENT):
				delete(p.old, i) // gone meanwhile: attach anew
			default:
				errs = append(errs, fmt.Errorf("opening the previous program on interface %d: %w", i, err))
				continue
			}
		}
		if err := link.RawAttachProgram(opts); err != nil {
			errs = append(errs, fmt.Errorf("attaching to interface %d: %w", i, err))
			continue
		}
		p.attached[i] = true
	}
	errs = append(errs, p.attachXDPs(ifindexes))
	return errors.Join(errs...)
}

// Attached returns the indexes of the interfaces the program is attached to, sorted.
func (p *Path) Attached() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, 0, len(p.attached))
	for i := range p.attached {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// Detach detaches the program (and a previous run's) from every interface.
func (p *Path) Detach() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The XDP program first: what it cannot finish it hands to the tc program behind it.
	errs := []error{p.dropXDPs(nil)}
	for i := range p.attached {
		errs = append(errs, detach(i, p.prog))
		delete(p.attached, i)
	}
	for i, id := range p.old {
		errs = append(errs, detachID(i, id))
		delete(p.old, i)
	}
	return errors.Join(errs...)
}

// Cleanup detaches every NAT fast path program (of any run) from every interface of the current
// network namespace and returns how many it detached.
func Cleanup() (int, error) {
	found, err := attachedPrograms()
	if err != nil {
		return 0, err
	}
	var errs []error
	// The XDP programs first: what they cannot finish they hand to the tc program behind them.
	for _, i := range attachedXDP() {
		errs = append(errs, detachXDP(i))
	}
	for i, id := range found {
		errs = append(errs, detachID(i, id))
	}
	return len(found), errors.Join(errs...)
}

func detach(ifindex int, prog *ebpf.Program) error {
	err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		return nil // not attached (any more), or the interface is gone
	}
	return err
}

func detachID(ifindex int, id ebpf.ProgramID) error {
	prog, err := ebpf.NewProgramFromID(id)
	if errors.Is(err, unix.ENOENT) {
		return nil // gone
	}
	if err != nil {
		return fmt.Errorf("opening program %d (interface %d): %w", id, ifindex, err)
	}
	defer prog.Close()
	return detach(ifindex, prog)
}

// ethernet says whether interface i is an Ethernet device (a 6-byte hardware address: Ethernet,
// veth, bridges, bonds, VLANs), whose frames the program can read; tunnels (WireGuard, IPIP, tun)
// hand it packets without an Ethernet header.
func ethernet(i int) bool {
	ifi, err := net.InterfaceByIndex(i)
	return err == nil && len(ifi.HardwareAddr) == 6
}

// Ethernet says whether the named interface is an Ethernet device the program can be attached to.
func Ethernet(name string) bool {
	ifi, err := net.InterfaceByName(name)
	return err == nil && ethernet(ifi.Index)
}

// errCannotOpen is attachedPrograms' error for an attached program this process may not open
// (EPERM: opening a BPF object by id needs CAP_SYS_ADMIN). Such a program may be a previous run's,
// which could then neither be replaced nor detached: a new one attached beside it would run after
// it, and the old one would go on taking its stale VIP ports, so Load refuses instead.
var errCannotOpen = errors.New("a program attached to tcx ingress cannot be opened (opening BPF objects by id needs CAP_SYS_ADMIN): a previous run's program could be neither replaced nor detached")

// attachedPrograms finds the NAT fast path programs attached in this network namespace: the
// program on each interface's tcx ingress named like ours.
func attachedPrograms() (map[int]ebpf.ProgramID, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := map[int]ebpf.ProgramID{}
	for _, ifi := range ifs {
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			continue
		}
		for _, ap := range res.Programs {
			prog, err := ebpf.NewProgramFromID(ap.ID)
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
				return nil, fmt.Errorf("interface %s: %w", ifi.Name, errCannotOpen)
			}
			if err != nil {
				continue
			}
			info, err := prog.Info()
			prog.Close()
			if err == nil && info.Name == progName {
				out[ifi.Index] = ap.ID
			}
		}
	}
	return out, nil
}

// findPrevious finds a previous run's programs, and its flow tables (established and
// unconfirmed) if this configuration can use them (the same layout and sizes), by map name.
func findPrevious(cfg Config) (map[int]ebpf.ProgramID, map[string]*ebpf.Map, error) {
	old, err := attachedPrograms()
	if errors.Is(err, errCannotOpen) {
		return nil, nil, err
	}
	if err != nil || len(old) == 0 {
		return map[int]ebpf.ProgramID{}, nil, nil
	}
	want := map[string]struct {
		typ     ebpf.MapType
		entries int
	}{mapFlows: {ebpf.Hash, cfg.FlowEntries}, mapNew: {ebpf.LRUHash, cfg.NewFlowEntries}}
	for _, id := range old {
		maps, err := programMaps(id)
		if err != nil {
			continue
		}
		keep := map[string]*ebpf.Map{}
		for name, m := range maps {
			w, ok := want[name]
			if mi, err := m.Info(); ok && err == nil && mi.Type == w.typ && mi.KeySize == flowKeySize &&
				mi.ValueSize == flowValSize && mi.MaxEntries == uint32(w.entries) {
				keep[name] = m
				continue
			}
			m.Close()
		}
		if len(keep) == len(want) {
			return old, keep, nil
		}
		for _, m := range keep {
			m.Close()
		}
	}
	return old, nil, nil
}

// programMaps opens the maps of program id, by name (the caller closes them).
func programMaps(id ebpf.ProgramID) (map[string]*ebpf.Map, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, err
	}
	info, err := prog.Info()
	prog.Close()
	if err != nil {
		return nil, err
	}
	ids, _ := info.MapIDs()
	maps := map[string]*ebpf.Map{}
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			continue
		}
		if mi, err := m.Info(); err == nil {
			maps[mi.Name] = m
		} else {
			m.Close()
		}
	}
	return maps, nil
}

// Sync makes ports the VIP ports the program takes. A VIP port whose table or SNAT changed
// switches to its new table in one map update (a new flow sees the old table or the new one,
// never a mix); established flows keep their backend (their flow entries).
func (p *Path) Sync(ports []VIPPort) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("NAT fast path: closed")
	}
	want := make(map[VIPKey]VIPPort, len(ports))
	var errs []error
	for _, v := range ports {
		if err := checkPort(v); err != nil {
			errs = append(errs, err) // that VIP port alone is left to the table
			continue
		}
		if v.SNAT && !p.CanMasquerade {
			continue
		}
		want[v.Key()] = v
	}
	for k, st := range p.ports {
		if _, ok := want[k]; ok {
			continue
		}
		if err := p.vips.Delete(vipKeyBytes(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", k, err))
			continue
		}
		delete(p.ports, k)
		errs = append(errs, p.release(st.table))
	}
	for k, v := range want {
		st, ok := p.ports[k]
		if ok && st.snat == v.SNAT && sameSlice(st.src, v.Table) {
			continue // the table it was given last time: unchanged (the gateway reuses them)
		}
		content := tableContent(v.Table)
		if ok && st.snat == v.SNAT && p.tables[content] == st.table {
			p.ports[k] = portState{snat: v.SNAT, table: st.table, src: v.Table}
			continue
		}
		t, err := p.acquire(content, v.Table)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		var val [vipValSize]byte
		binary.LittleEndian.PutUint32(val[0:], t.id)
		binary.LittleEndian.PutUint32(val[4:], uint32(len(v.Table)))
		if v.SNAT {
			binary.LittleEndian.PutUint32(val[8:], vipSNAT)
		}
		if err := p.vips.Put(vipKeyBytes(k), val[:]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err), p.release(t))
			continue
		}
		if ok {
			errs = append(errs, p.release(st.table))
		}
		p.ports[k] = portState{snat: v.SNAT, table: t, src: v.Table}
	}
	return errors.Join(errs...)
}

func checkPort(v VIPPort) error {
	switch {
	case !v.VIP.IsValid():
		return errors.New("a VIP port without an address")
	case v.Proto != unix.IPPROTO_TCP && v.Proto != unix.IPPROTO_UDP:
		return fmt.Errorf("%s: protocol %d (TCP and UDP only)", v.Key(), v.Proto)
	case len(v.Table) == 0 || len(v.Table) > 1<<20:
		return fmt.Errorf("%s: a Maglev table of %d slots", v.Key(), len(v.Table))
	}
	for _, b := range v.Table {
		if !b.IsValid() || b.Port() == 0 || b.Addr().Unmap().Is4() != v.VIP.Unmap().Is4() {
			return fmt.Errorf("%s: backend %s is not of the VIP's family, or has no port", v.Key(), b)
		}
	}
	return nil
}

func (k VIPKey) String() string {
	return fmt.Sprintf("%s/%d:%d", k.VIP, k.Proto, k.Port)
}

// tableContent is a table's identity among the tables: a digest of its slots.
func tableContent(t []netip.AddrPort) string {
	h := sha256.New()
	for _, ap := range t {
		h.Write(backendBytes(ap))
	}
	return string(h.Sum(nil))
}

// acquire returns the table of that content, creating it (a map of its own, filled before any
// VIP port points to it) if none has it.
func (p *Path) acquire(content string, slots []netip.AddrPort) (*table, error) {
	if t := p.tables[content]; t != nil {
		t.refs++
		return t, nil
	}
	if len(p.tables) >= maxVIPPorts {
		return nil, fmt.Errorf("more than %d distinct Maglev tables", maxVIPPorts)
	}
	m, err := ebpf.NewMap(innerSpec(len(slots)))
	if err != nil {
		return nil, fmt.Errorf("creating a Maglev table of %d slots: %w", len(slots), err)
	}
	defer m.Close() // vg_maglev holds it
	keys := make([]uint32, len(slots))
	vals := make([]byte, 0, len(slots)*backendSize)
	for i, b := range slots {
		keys[i] = uint32(i)
		vals = append(vals, backendBytes(b)...)
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		// A kernel without batch operations on arrays: one at a time.
		for i := range slots {
			if err := m.Put(keys[i], vals[i*backendSize:(i+1)*backendSize]); err != nil {
				return nil, fmt.Errorf("filling a Maglev table: %w", err)
			}
		}
	}
	id := p.freeID()
	if err := p.maglev.Put(id, m); err != nil {
		return nil, fmt.Errorf("adding a Maglev table: %w", err)
	}
	t := &table{id: id, size: len(slots), refs: 1}
	p.tables[content] = t
	return t, nil
}

// innerSpec is a Maglev table of slots slots: an array of struct backend, BPF_F_INNER_MAP so that
// tables of any size fit vg_maglev.
func innerSpec(slots int) *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: "vg_maglev_tab", Type: ebpf.Array, KeySize: 4, ValueSize: backendSize,
		MaxEntries: uint32(slots), Flags: unix.BPF_F_INNER_MAP}
}

// freeID is a table id no table has.
func (p *Path) freeID() uint32 {
	for {
		id := p.nextID
		p.nextID++
		if p.nextID == 0 {
			p.nextID = 1
		}
		used := false
		for _, t := range p.tables {
			if t.id == id {
				used = true
				break
			}
		}
		if !used {
			return id
		}
	}
}

// release drops a reference to t, deleting it with the last.
func (p *Path) release(t *table) error {
	t.refs--
	if t.refs > 0 {
		return nil
	}
	for c, x := range p.tables {
		if x == t {
			delete(p.tables, c)
		}
	}
	if err := p.maglev.Delete(t.id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting Maglev table %d: %w", t.id, err)
	}
	return nil
}

// Ports returns how many VIP ports and distinct Maglev tables are programmed.
func (p *Path) Ports() (ports, tables int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ports), len(p.tables)
}

// Flows lists the flow tables, established then unconfirmed (at most limit entries; 0: all).
func (p *Path) Flows(limit int) ([]Flow, error) {
	var out []Flow
	err := p.walk(func(_ *ebpf.Map, k, v []byte, f Flow) bool {
		out = append(out, f)
		return limit == 0 || len(out) < limit
	})
	return out, err
}

// walk calls fn with every entry of the flow tables (the established, then the unconfirmed)
// until it returns false: batches of walkBatch entries a system call (one call per entry without
// batch operations).
func (p *Path) walk(fn func(m *ebpf.Map, k, v []byte, f Flow) bool) error {
	now, err := coarseNow()
	if err != nil {
		return err
	}
	for _, m := range []*ebpf.Map{p.flows, p.newFlows} {
		more, err := walkMap(m, now, m == p.newFlows, func(k, v []byte, f Flow) bool { return fn(m, k, v, f) })
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// walkMap walks one flow table (unconfirmed: its flows are); false when fn stopped it.
func walkMap(m *ebpf.Map, now uint64, unconfirmed bool, fn func(k, v []byte, f Flow) bool) (bool, error) {
	keys := make([][flowKeySize]byte, walkBatch)
	vals := make([][flowValSize]byte, walkBatch)
	decode := func(k, v []byte) Flow {
		f := decodeFlow(k, v, now)
		f.Unconfirmed = unconfirmed
		return f
	}
	var cur ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cur, keys, vals, nil)
		for i := range n {
			if !fn(keys[i][:], vals[i][:], decode(keys[i][:], vals[i][:])) {
				return false, nil
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return true, nil // the end
		case errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) && n == 0:
			var k, v []byte
			it := m.Iterate()
			for it.Next(&k, &v) {
				if !fn(k, v, decode(k, v)) {
					return false, nil
				}
			}
			return true, it.Err()
		case err != nil:
			return false, fmt.Errorf("reading the flow table: %w", err)
		}
	}
}

const walkBatch = 4096

// DeleteFlows deletes the flows stale says are stale: both entries of each (the client's and the
// replies'), looked at from the forward entry. It returns how many flows it deleted.
func (p *Path) DeleteFlows(stale func(Flow) bool) (int, error) {
	del := map[*ebpf.Map][][flowKeySize]byte{}
	n := 0
	err := p.walk(func(m *ebpf.Map, k, v []byte, f Flow) bool {
		if f.Reply {
			// The client's view of the flow: its forward entry's tuple, from the reply's.
			fwd := Flow{Proto: f.Proto, Src: f.NewDst, Dst: f.NewSrc, NewDst: f.Src, SNAT: f.SNAT}
			if !stale(fwd) {
				return true
			}
		} else {
			if !stale(f) {
				return true
			}
			n++
		}
		del[m] = append(del[m], [flowKeySize]byte(k))
		return true
	})
	if err != nil {
		return 0, err
	}
	var errs []error
	for m, keys := range del {
		errs = append(errs, deleteKeys(m, keys))
	}
	return n, errors.Join(errs...)
}

// deleteKeys deletes keys from m: one batch; entries the program (or the LRU) deleted meanwhile
// are skipped one by one.
func deleteKeys(m *ebpf.Map, keys [][flowKeySize]byte) error {
	for len(keys) > 0 {
		done, err := m.BatchDelete(keys, nil)
		if err == nil {
			break
		}
		if done < len(keys) && errors.Is(err, ebpf.ErrKeyNotExist) {
			keys = keys[done+1:] // that one is gone already
			continue
		}
		var errs []error
		for _, k := range keys[done:] {
			if err := m.Delete(k[:]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	return nil
}

// idleTimeout is natpath.c's idle_timeout: how long an entry with flags may stay unused.
func (c Config) idleTimeout(proto uint8, flags uint32) time.Duration {
	switch {
	case proto != unix.IPPROTO_TCP:
		return c.UDPTimeout
	case flags&flowClosing != 0 || flags&flowReplied == 0:
		return min(c.TCPTimeout, closingTimeout)
	}
	return c.TCPTimeout
}

// partnerKey is natpath.c's partner_key: the key of the other entry of the flow of entry k, v.
func partnerKey(k, v []byte) [flowKeySize]byte {
	var pk [flowKeySize]byte
	copy(pk[0:16], v[16:32])
	copy(pk[16:32], v[0:16])
	copy(pk[32:34], v[34:36])
	copy(pk[34:36], v[32:34])
	pk[36], pk[37] = k[36], k[37]
	return pk
}

// isPartner is natpath.c's is_partner: o (at the partner key of k, v) is that entry's partner.
func isPartner(o, k, v []byte) bool {
	fo, fv := binary.LittleEndian.Uint32(o[36:]), binary.LittleEndian.Uint32(v[36:])
	return (fo^fv)&flowReply != 0 && bytes.Equal(o[0:16], k[16:32]) && bytes.Equal(o[16:32], k[0:16]) &&
		bytes.Equal(o[32:34], k[34:36]) && bytes.Equal(o[34:36], k[32:34])
}

// Sweep deletes the established flows that ended: both directions idle past their timeouts (an
// entry whose partner is gone, once idle itself). The established table is a plain hash, so
// nothing else takes an idle flow's entries away but the program when it meets the flow again;
// unconfirmed flows are an LRU's, which evicts them. Load runs it every sweepInterval; it returns
// how many entries it deleted.
func (p *Path) Sweep() (int, error) {
	now, err := coarseNow()
	if err != nil {
		return 0, err
	}
	live := func(k, v []byte) bool {
		seen := binary.LittleEndian.Uint64(v[40:])
		return now < seen || time.Duration(now-seen) < p.cfg.idleTimeout(k[36], binary.LittleEndian.Uint32(v[36:]))
	}
	// One batched walk collects the idle entries (few, next to the live ones); each one's
	// partner is then looked up on its own.
	type entry struct {
		k [flowKeySize]byte
		v [flowValSize]byte
	}
	var idle []entry
	if _, err := walkMap(p.flows, now, false, func(k, v []byte, _ Flow) bool {
		if !live(k, v) {
			idle = append(idle, entry{[flowKeySize]byte(k), [flowValSize]byte(v)})
		}
		return true
	}); err != nil {
		return 0, err
	}
	var dead [][flowKeySize]byte
	for _, e := range idle {
		pk := partnerKey(e.k[:], e.v[:])
		if o, err := p.flows.LookupBytes(pk[:]); err == nil && o != nil && isPartner(o, e.k[:], e.v[:]) && live(pk[:], o) {
			continue
		}
		dead = append(dead, e.k)
	}
	// Each again as it is now: the program may have used the flow since the walk.
	n := 0
	var errs []error
	for _, k := range dead {
		v, err := p.flows.LookupBytes(k[:])
		if err != nil || v == nil || live(k[:], v) {
			continue
		}
		if err := p.flows.Delete(k[:]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// sweepInterval is how often Load's sweep runs: a quarter of the shortest idle timeout, 1 s to
// 30 s (a full table turns new flows away until it makes room).
func sweepInterval(c Config) time.Duration {
	return min(max(min(c.UDPTimeout, c.TCPTimeout, closingTimeout)/4, time.Second), 30*time.Second)
}

func (p *Path) sweepLoop(every time.Duration) {
	defer close(p.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			_, _ = p.Sweep() // a failed sweep: the next one tries again
		}
	}
}

// Counters sums the program's counters.
func (p *Path) Counters() (Counters, error) {
	var c Counters
	dst := []*uint64{&c.New, &c.Forwarded, &c.Replies, &c.NoBackend, &c.NoRoute, &c.SNATFull, &c.Neigh, &c.NoSYN, &c.Clash, &c.ICMP, &c.Frag,
		&c.Martian, &c.Full, &c.Window}
	for i, d := range dst {
		var per []uint64
		if err := p.counters.Lookup(uint32(i), &per); err != nil {
			return c, fmt.Errorf("reading counter %d: %w", i, err)
		}
		for _, x := range per {
			*d += x
		}
	}
	return c, nil
}

// Close lets go of the program and its maps without detaching it: the kernel keeps what is
// attached, which forwards with what it was last given (Detach first to take it away).
func (p *Path) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	close(p.stop)
	<-p.done
	p.closeColls()
	return nil
}

// addrBytes is an address as natpath.c holds it: 16 bytes, IPv4 in the first 4.
func addrBytes(a netip.Addr) [16]byte {
	a = a.Unmap()
	if a.Is4() {
		var b [16]byte
		v := a.As4()
		copy(b[:], v[:])
		return b
	}
	return a.As16()
}

func family(a netip.Addr) byte {
	if a.Unmap().Is4() {
		return 4
	}
	return 6
}

func vipKeyBytes(k VIPKey) []byte {
	b := make([]byte, vipKeySize)
	a := addrBytes(k.VIP)
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[16:], k.Port)
	b[18] = k.Proto
	b[19] = family(k.VIP)
	return b
}

func backendBytes(ap netip.AddrPort) []byte {
	b := make([]byte, backendSize)
	a := addrBytes(ap.Addr())
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[16:], ap.Port())
	return b
}

// addrOf reads a 16-byte address of family fam.
func addrOf(b []byte, fam byte) netip.Addr {
	if fam == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16([16]byte(b[:16]))
}

// decodeFlow reads a flow table entry (now: the coarse clock, for Idle).
func decodeFlow(k, v []byte, now uint64) Flow {
	fam := k[37]
	port := func(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
	flags := binary.LittleEndian.Uint32(v[36:])
	f := Flow{Proto: k[36],
		Src:    netip.AddrPortFrom(addrOf(k[0:], fam), port(k[32:])),
		Dst:    netip.AddrPortFrom(addrOf(k[16:], fam), port(k[34:])),
		NewSrc: netip.AddrPortFrom(addrOf(v[0:], fam), port(v[32:])),
		NewDst: netip.AddrPortFrom(addrOf(v[16:], fam), port(v[34:])),
		Reply:  flags&flowReply != 0, SNAT: flags&flowSNAT != 0, Closing: flags&flowClosing != 0}
	if seen := binary.LittleEndian.Uint64(v[40:]); now > seen {
		f.Idle = time.Duration(now - seen)
	}
	return f
}

// kernelAtLeast says whether the running kernel's release is at least major.minor.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// coarseNow is the clock bpf_ktime_get_coarse_ns reads (CLOCK_MONOTONIC_COARSE).
func coarseNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}

// Inspection is what the attached program would do with a packet, read from its maps
// (`vipgate explain` on a gateway).
type Inspection struct {
	// Interfaces are the indexes of the interfaces a NAT fast path program is attached to (none:
	// no program, the family's table has every packet).
	Interfaces []int
	// Taken says the VIP port is the program's (new flows are dealt by it); SNAT that it
	// masquerades them.
	Taken, SNAT bool
	// Flow is the flow's entry when the flow is known (its packets keep their backend), nil when
	// a packet would be dealt as a new flow.
	Flow *Flow
}

// Inspect looks a packet from src to dst up in the maps of the program attached in this network
// namespace: whether it takes the VIP port, and the flow's entry if it has one.
func Inspect(proto uint8, src, dst netip.AddrPort) (Inspection, error) {
	var out Inspection
	found, err := attachedPrograms()
	if err != nil || len(found) == 0 {
		return out, err
	}
	var id ebpf.ProgramID
	for i, pid := range found {
		out.Interfaces = append(out.Interfaces, i)
		id = pid
	}
	slices.Sort(out.Interfaces)
	maps, err := programMaps(id)
	if err != nil {
		return out, err
	}
	for _, m := range maps {
		defer m.Close()
	}
	vips, flows, newFlows := maps[mapVIPs], maps[mapFlows], maps[mapNew]
	if vips == nil || flows == nil || newFlows == nil {
		return out, errors.New("the attached program's maps were not found")
	}
	val, err := vips.LookupBytes(vipKeyBytes(VIPKey{dst.Addr().Unmap(), proto, dst.Port()}))
	if err != nil {
		return out, err
	}
	if len(val) == vipValSize {
		out.Taken, out.SNAT = true, binary.LittleEndian.Uint32(val[8:])&vipSNAT != 0
	}
	k, _ := flowEntryKey(proto, src, dst)
	unconfirmed := false
	v, err := flows.LookupBytes(k)
	if err == nil && v == nil {
		unconfirmed = true
		v, err = newFlows.LookupBytes(k)
	}
	if err != nil {
		return out, err
	}
	if len(v) == flowValSize {
		now, _ := coarseNow()
		f := decodeFlow(k, v, now)
		f.Unconfirmed = unconfirmed
		out.Flow = &f
	}
	return out, nil
}

// flowEntryKey is the flow table key of a packet from src to dst.
func flowEntryKey(proto uint8, src, dst netip.AddrPort) ([]byte, error) {
	if src.Addr().Unmap().Is4() != dst.Addr().Unmap().Is4() {
		return nil, errors.New("source and destination of different families")
	}
	k := make([]byte, flowKeySize)
	a, b := addrBytes(src.Addr()), addrBytes(dst.Addr())
	copy(k[0:], a[:])
	copy(k[16:], b[:])
	binary.BigEndian.PutUint16(k[32:], src.Port())
	binary.BigEndian.PutUint16(k[34:], dst.Port())
	k[36], k[37] = proto, family(src.Addr())
	return k, nil
}
