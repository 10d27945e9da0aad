package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/conntrack"
	"github.com/vipgate/vipgate/gateway/natpath"
)

// The gateway's NAT fast path (forwarding direct and nodePort): each sync gives the BPF program
// of gateway/natpath the VIP ports it may take, with the Maglev table the family's table holds
// for each (the same slots: a flow gets the same backend on either path, and on every gateway),
// attaches it to the ingress devices, and ends the stale flows in its flow table as conntrack's
// are ended. The family's table is programmed first and stays complete on its own: what the
// program does not take (fragments, IP options, other protocols, source-hash VIP ports, a next
// hop it cannot use, no free masquerade port) goes through the IP stack as before.

// NATPath configures the NAT fast path.
type NATPath struct {
	// Path is the loaded program (*natpath.Path).
	Path NATPathProgrammer
	// Devices are the interfaces the program is attached to (ingress); empty: every interface
	// that is up but loopback and devices with a master, re-read at each sync (UpInterfaces).
	// Replies must arrive on one of them too: a reply the program does not see reaches a
	// conntrack that never saw its flow.
	Devices []string
	// NoSNAT leaves the masqueraded VIP ports to the family's table (conntrack): with
	// snatAddresses and conntrackSync, conntrackd replicates masquerade state to the peer gateway,
	// which the program's flow table is not.
	NoSNAT bool
	// SNATPortMin..SNATPortMax are the program's masquerade ports (0, 0: natpath's defaults). The
	// family's table masquerades what the program does not take to other ports (kernelMasqPorts):
	// conntrack does not know the program's ports, nor the program conntrack's, so a shared range
	// would give one flow's replies to the other.
	SNATPortMin, SNATPortMax uint16
	// Interfaces lists the interfaces when Devices is empty, Index finds an interface's index (0:
	// none), Ethernet says whether one is an Ethernet device (the program reads Ethernet frames:
	// tunnels such as WireGuard are left out); nil: UpInterfaces and the current namespace's.
	Interfaces func() ([]string, error)
	Index      func(string) int
	Ethernet   func(string) bool
}

// NATPathProgrammer is what the gateway needs of the NAT fast path (natpath.Path).
type NATPathProgrammer interface {
	Sync(ports []natpath.VIPPort) error
	Attach(ifindexes []int) error
	DeleteFlows(stale func(natpath.Flow) bool) (int, error)
}

// natPort is the NAT fast path's VIP port of entry e, whose Maglev table (slot -> index into
// e.Backends) gatewayPart built, if the path takes it: a port with backends whose slots Maglev
// picks by the flow (not source-hash), TCP or UDP, and, with NoSNAT, not masqueraded. A VIP port
// with loadBalancerSourceRanges is never given to it: the program does not know them, and the
// family's table drops the clients outside them before DNAT (gatewayPart).
func natPort(cfg Config, e Entry, table []int) (natpath.VIPPort, bool) {
	if cfg.NATPath == nil || cfg.Forwarding == cluster.ForwardRoute || len(e.Backends) == 0 || e.Algorithm == cluster.LBSourceHash || len(e.SourceRanges) > 0 ||
		(e.Proto != dataplane.ProtoTCP && e.Proto != dataplane.ProtoUDP) || e.SNAT && cfg.NATPath.NoSNAT {
		return natpath.VIPPort{}, false
	}
	slots := make([]netip.AddrPort, len(table))
	for i, bi := range table {
		slots[i] = e.Backends[bi]
	}
	return natpath.VIPPort{VIP: e.VIP, Proto: e.Proto, Port: e.Port, SNAT: e.SNAT, Table: slots}, true
}

// syncNATPath brings the NAT fast path to the families' tables fams (just programmed) and ends
// the flows of stale; what fails is reported in rep (the family's tables forward without it).
func (p *Proxier) syncNATPath(fams map[cluster.Family]*Ruleset, stale []conntrack.StaleFlow, rep *SyncReport) {
	np := p.cfg.NATPath
	var ports []natpath.VIPPort
	for _, f := range p.cfg.Families {
		if grs := fams[f]; grs != nil {
			keys := make([]cluster.ServiceKey, 0, len(grs.nat))
			for k := range grs.nat {
				keys = append(keys, k)
			}
			sortServiceKeys(keys)
			for _, k := range keys {
				ports = append(ports, grs.nat[k]...)
			}
		}
	}
	rep.NATPathPorts = len(ports)
	if err := np.Path.Sync(ports); err != nil {
		rep.NATPathWarnings = append(rep.NATPathWarnings, fmt.Sprintf("programming its VIP ports: %v", err))
	}
	devs, missing, notEther, err := natPathDevices(np)
	if err != nil {
		rep.NATPathWarnings = append(rep.NATPathWarnings, fmt.Sprintf("listing interfaces: %v (attachments unchanged)", err))
	} else {
		if len(missing) > 0 {
			rep.NATPathWarnings = append(rep.NATPathWarnings, "devices that do not exist (attached when they do): "+strings.Join(missing, ", "))
		}
		if len(notEther) > 0 {
			rep.NATPathWarnings = append(rep.NATPathWarnings, "devices that are not Ethernet devices (left out): "+strings.Join(notEther, ", "))
		}
		if err := np.Path.Attach(devs); err != nil {
			rep.NATPathWarnings = append(rep.NATPathWarnings, fmt.Sprintf("attaching: %v", err))
		}
		rep.NATPathDevices = len(devs)
	}
	if len(stale) > 0 {
		n, err := np.Path.DeleteFlows(natStaleMatcher(stale))
		if err != nil {
			rep.NATPathWarnings = append(rep.NATPathWarnings, fmt.Sprintf("ending stale flows: %v", err))
		}
		rep.NATFlowsEnded = n
	}
	if w := strings.Join(rep.NATPathWarnings, "; "); w != p.natWarn {
		if w != "" {
			p.log.Warn("NAT fast path", "warnings", w)
		}
		p.natWarn = w
	}
}

// natPathDevices are the indexes of the interfaces the program goes on, and the configured ones
// that do not exist or are not Ethernet devices (an interface of the default list that is not is
// left out silently: a WireGuard or IPIP tunnel is no mistake).
func natPathDevices(np *NATPath) (idx []int, missing, notEther []string, err error) {
	names := np.Devices
	if len(names) == 0 {
		list := np.Interfaces
		if list == nil {
			list = UpInterfaces
		}
		if names, err = list(); err != nil {
			return nil, nil, nil, err
		}
	}
	index, ether := np.Index, np.Ethernet
	if index == nil {
		index = interfaceIndex
	}
	if ether == nil {
		ether = natpath.Ethernet
	}
	for _, d := range names {
		i := index(d)
		switch {
		case i <= 0:
			if len(np.Devices) > 0 {
				missing = append(missing, d)
			}
		case !ether(d):
			if len(np.Devices) > 0 {
				notEther = append(notEther, d)
			}
		default:
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	return slices.Compact(idx), missing, notEther, nil
}

// natStaleMatcher is natFlowStale over stale, with the filters that name only a backend (all the
// gateway makes: gatewayStaleFlows) looked up in a set: one lookup per flow of a table that may
// hold hundreds of thousands, whatever the number of filters (a drained node's are one per VIP
// port).
func natStaleMatcher(stale []conntrack.StaleFlow) func(natpath.Flow) bool {
	type key struct {
		proto uint8
		addr  netip.Addr
		port  uint16
	}
	byBackend := map[key]bool{}
	var rest []conntrack.StaleFlow
	for _, sf := range stale {
		if sf.OrigDst.IsValid() || sf.OrigDstPort != 0 || !sf.ReplySrc.IsValid() {
			rest = append(rest, sf)
			continue
		}
		byBackend[key{sf.Proto, sf.ReplySrc.Unmap(), sf.ReplySrcPort}] = true // port 0: any
	}
	return func(f natpath.Flow) bool {
		b := f.NewDst.Addr().Unmap()
		return byBackend[key{f.Proto, b, f.NewDst.Port()}] || byBackend[key{f.Proto, b, 0}] || natFlowStale(f, rest)
	}
}

// natFlowStale says whether a flow of the NAT fast path (its forward view: the client's tuple and
// the backend) matches one of stale, as conntrack's entries are matched (conntrack.StaleFlow:
// the original destination is the VIP port, the reply's source the backend).
func natFlowStale(f natpath.Flow, stale []conntrack.StaleFlow) bool {
	for _, s := range stale {
		if s.Proto != f.Proto {
			continue
		}
		if s.OrigDst.IsValid() && s.OrigDst.Unmap() != f.Dst.Addr().Unmap() || s.OrigDstPort != 0 && s.OrigDstPort != f.Dst.Port() {
			continue
		}
		if s.ReplySrc.IsValid() && s.ReplySrc.Unmap() != f.NewDst.Addr().Unmap() || s.ReplySrcPort != 0 && s.ReplySrcPort != f.NewDst.Port() {
			continue
		}
		return true
	}
	return false
}

// kernelMasqPorts is the port range the family's table masquerades to when the NAT fast path
// masquerades too (0, 0: no range, `masquerade fully-random`): the larger of 1024..min-1 and
// max+1..65535 around the program's ports (cluster's natFastPath check leaves at least 1024).
func kernelMasqPorts(n *NATPath) (lo, hi uint16) {
	if n == nil || n.NoSNAT {
		return 0, 0
	}
	pmin, pmax := n.SNATPortMin, n.SNATPortMax
	if pmin == 0 && pmax == 0 {
		pmin, pmax = natpath.DefaultSNATPortMin, natpath.DefaultSNATPortMax
	}
	below, above := 0, 0
	if pmin > 1024 {
		below = int(pmin) - 1024
	}
	if pmax < 65535 {
		above = 65535 - int(pmax)
	}
	if below >= above {
		return 1024, pmin - 1
	}
	return pmax + 1, 65535
}
