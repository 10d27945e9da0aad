// Package explain says what vipgate's tables do with one packet: it reads the ruleset back from
// the kernel, or builds the one vipgate would program for a config and manifests (Offline, which
// `vipgate render` prints), traces the packet through it with the engine's Explain, and puts the
// result in words (Report): the Service it is for, the endpoints it may go to, why its source is
// masqueraded, why it is dropped, what a gateway's fast paths do with it, and what names the
// destination but is not programmed. cmd/vipgate parses the flags and prints the Report.
// ExplainService (service.go) joins both halves of a Service's VIPs: the speakers' decisions
// (speaker.ExplainVIPs, offline or from the agent's /explain) and each VIP port's trace.
//
// It sits above the node's proxy and the gateway, the two rulesets it builds and traces; nothing
// but cmd/vipgate imports it.
package explain

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/gateway/natpath"
	"github.com/vipgate/vipgate/proxy"
)

// roles are what the node's proxy and the gateway know of their tables' chains and sets: a table
// read from the kernel may be either's.
var roles = []dataplane.ExplainRole{gateway.ExplainRole, proxy.ExplainRole}

// Options says which packet to trace, through which ruleset.
type Options struct {
	// Config is a *cluster.NodeConfig or *cluster.GatewayConfig (nil: none given). With Manifests
	// it is the node or gateway the ruleset is rendered for; without, a NodeConfig says where the
	// node's /status is (its rejections) and that no gateway fast path is to be read.
	Config any
	// Manifests is a manifest directory: trace the ruleset rendered for it ("": the kernel's).
	Manifests          string
	AllowWorldWritable bool
	// Table is the nftables table ("": the config's tableName, else vipgate).
	Table string
	// Dst and Proto are the packet's destination; Src and SrcPort its source (SrcPort 0: not
	// given). FromHost: the packet is sent by this host; without Src, its source is the node's
	// first address of the family, else this namespace's first global one.
	Dst      netip.AddrPort
	Proto    uint8
	Src      netip.Addr
	SrcPort  uint16
	FromHost bool
	// Device is the interface the packet arrives on, for a gateway's fast path ("": any).
	Device string

	// off is Manifests already loaded (ExplainService traces many ports of one load).
	off *Offline
}

// RejectedObject is an input object or entry that is not programmed, and why: as the node's
// /status lists it (cmd/vipgate serves it) and as Report.Rejected shows it.
type RejectedObject struct {
	Kind   string `json:"kind"`
	Object string `json:"object"`
	Source string `json:"source,omitempty"`
	Reason string `json:"reason"`
	// Addr is the address it is about (cluster.Rejection.Addr): explain selects by it.
	Addr netip.Addr `json:"addr,omitzero"`
}

// Rejected is r as /status and explain show it.
func Rejected(r cluster.Rejection) RejectedObject {
	return RejectedObject{Kind: r.Kind, Object: r.Object, Source: r.Source, Reason: r.Reason, Addr: r.Addr}
}

// Trace traces the packet of o through the kernel's table of its family (and a gateway's fast
// path table before it), or through the one rendered for o.Manifests, and says what happens to it.
// A trace that fails in the ruleset is a Report with Outcome ERROR, not an error.
func Trace(o Options) (*Report, error) {
	dst, proto := o.Dst, o.Proto
	fam := cluster.FamilyOf(dst.Addr())

	var (
		cfg   *cluster.NodeConfig
		st    *cluster.State
		flat  *dataplane.Flat
		isLoc func(netip.Addr) bool
		// source is the Report's Ruleset.
		source = "kernel"
		// rejected is what the source or the node refused, before filtering by destination.
		rejected []RejectedObject
		// holders is the rendered node ruleset, whose parts say which Service holds an entry.
		holders *dataplane.Ruleset
		table   = o.Table
		// netdev is a gateway's fast path table of the family (nil: none), noFast why a rendered
		// gateway has none.
		netdev *dataplane.Flat
		noFast string
		err    error
	)
	switch c := o.Config.(type) {
	case *cluster.NodeConfig:
		cfg = c
		table = cmp.Or(table, c.TableName)
	case *cluster.GatewayConfig:
		table = cmp.Or(table, c.TableName)
	}
	table = cmp.Or(table, "vipgate")
	switch {
	case o.Manifests != "":
		if o.Config == nil {
			return nil, errors.New("--manifests needs --config (the node the ruleset is rendered for)")
		}
		source = "rendered"
		off := o.off
		if off == nil {
			if off, err = LoadOffline(o.Config, o.Manifests, o.AllowWorldWritable, ""); err != nil {
				return nil, err
			}
		}
		off.Table = table
		rs, err := off.Build(fam)
		if err != nil {
			return nil, err
		}
		st, flat, isLoc, holders = off.State, rs.Flat, rs.IsLocal, rs.Node
		netdev, noFast = rs.Netdev, rs.NoFastPath
		if off.Node != nil {
			for _, r := range append(slices.Clone(st.Rejected), rs.Conflicts...) {
				rejected = append(rejected, Rejected(r))
			}
		}
	default:
		// Tables of an older vipgate get their rule comments back, as when the node adopts them
		// (proxy.DecodeOptions), so their traces read like the model's.
		prog := &dataplane.NetlinkProgrammer{Decode: proxy.DecodeOptions()}
		if flat, err = prog.ReadTable(fam, table); err != nil {
			return nil, err
		}
		if cfg == nil {
			// A gateway's fast path table, if it programs one (a node has none).
			var notFound *dataplane.TableNotFoundError
			ndName := dataplane.NetdevTableName(table, fam)
			if netdev, err = prog.ReadTable(dataplane.NetdevFamily(fam), ndName); err != nil && !errors.As(err, &notFound) {
				return nil, fmt.Errorf("reading the fast path's table netdev %s: %w", ndName, err)
			}
		}
		if cfg != nil {
			rejected = nodeRejections(cfg.MetricsBindAddress)
		}
		local, err := localAddrs()
		if err != nil {
			return nil, err
		}
		isLoc = func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }
	}

	srcAddr, srcPort := o.Src.Unmap(), o.SrcPort
	if !srcAddr.IsValid() {
		if !o.FromHost {
			return nil, errors.New("--from is required (or --host for a packet from this host)")
		}
		if srcAddr, err = hostSource(fam, cfg); err != nil {
			return nil, err
		}
	}

	// A gateway's NAT fast path sees arriving packets before the table: what its maps hold.
	var natView *NATPath
	if source == "kernel" && cfg == nil && !o.FromHost && srcPort != 0 {
		if natView, err = natPathView(proto, netip.AddrPortFrom(srcAddr, srcPort), dst); err != nil {
			return nil, fmt.Errorf("reading the NAT fast path's maps: %w", err)
		}
	}
	pkt := dataplane.Packet{Src: srcAddr, Dst: dst.Addr(), Proto: proto, Port: dst.Port(), FromHost: o.FromHost, SrcPort: srcPort}
	ex := dataplane.Explain(flat, dataplane.HostInfo{IsLocal: isLoc}, pkt, roles...)
	res := ex.Result
	srcText := srcAddr.String()
	if srcPort != 0 {
		srcText = netip.AddrPortFrom(srcAddr, srcPort).String()
	}
	rep := &Report{
		Source: srcText, Dest: dst.String(), Protocol: dataplane.ProtoName(proto), FromHost: o.FromHost,
		Ruleset: source, Table: familyTableName(fam) + " " + table,
		Outcome: string(res.Outcome), Summary: res.String(), DecidedBy: res.Reason, Steps: res.Steps,
		Algorithm: ex.Algorithm, SrcPort: srcPort,
	}
	if res.Steps == nil {
		rep.Steps = []dataplane.Step{}
	}
	// The fast path's ingress chains see arriving packets only.
	if netdev != nil && !o.FromHost {
		rep.FastPath = fastPath(netdev, o.Device, isLoc, pkt)
	} else if noFast != "off" {
		rep.NoFastPath = noFast
	}
	rep.NATFastPath = natView
	if st != nil {
		rep.Service = serviceFor(st, holders, isLoc, dst, proto)
	}
	if m := ex.Maglev; m != nil {
		rep.Maglev = &Maglev{Slot: m.Slot, Slots: m.Slots, Map: m.Map, Routed: m.Routed, Backend: m.Backend.String()}
		if m.Routed {
			rep.Maglev.Backend = m.Backend.Addr().String()
		}
	}
	for _, o := range res.Others {
		rep.Others = append(rep.Others, string(o))
	}
	for _, c := range ex.Candidates {
		ec := Candidate{Endpoint: c.Endpoint.String(), Masquerade: c.Masquerade, Choice: c.Branch, Probability: c.Probability}
		if ec.Probability == 0 && c.SlotsOf > 0 {
			ec.Probability = float64(c.Slots) / float64(c.SlotsOf)
		}
		if c.Masquerade {
			ec.MasqueradeReason = masqueradeText(c)
		}
		rep.Candidates = append(rep.Candidates, ec)
	}
	rep.Why = whyNot(ex, dst, proto, srcAddr)
	for _, r := range rejected {
		if r.Addr.Unmap() == dst.Addr() {
			rep.Rejected = append(rep.Rejected, r)
		}
	}
	return rep, nil
}

// Candidate is one endpoint the packet may go to.
type Candidate struct {
	Endpoint   string `json:"endpoint"`
	Masquerade bool   `json:"masquerade"`
	// MasqueradeReason says why the source is rewritten (empty when it is not).
	MasqueradeReason string `json:"masqueradeReason,omitempty"`
	// Choice names the random choices that lead here.
	Choice string `json:"choice,omitempty"`
	// Probability is the share of new connections that take this endpoint (Maglev: of the slots
	// that lead to it), 0 when the ruleset does not say.
	Probability float64 `json:"probability,omitempty"`
}

// Report is what `vipgate explain` prints: as JSON, or in words (cmd/vipgate).
type Report struct {
	Source   string `json:"source"`
	Dest     string `json:"destination"`
	Protocol string `json:"protocol"`
	FromHost bool   `json:"fromHost"`
	// Ruleset is "kernel" (read back over netlink) or "rendered" (built from manifests).
	Ruleset string `json:"ruleset"`
	Table   string `json:"table"`
	// Service names the Service port the destination belongs to (rendered ruleset only: the
	// kernel's table does not name Services in its maps).
	Service string `json:"service,omitempty"`
	// Outcome is DNAT, DROP, REJECT, ACCEPT, MIXED or ERROR; Summary is the one-line result.
	Outcome    string      `json:"outcome"`
	Summary    string      `json:"summary"`
	Candidates []Candidate `json:"candidates,omitempty"`
	Others     []string    `json:"others,omitempty"`
	// Maglev is a gateway's consistent-hash choice for the flow (with a source port only).
	Maglev *Maglev `json:"maglev,omitempty"`
	// FastPath is the packet's trace through a route forwarding gateway's fast path netdev table,
	// which sees it before the table of Steps (nil without one); NoFastPath says why a rendered
	// gateway has none for the family ("" when it has one or it is off).
	FastPath   *FastPath `json:"fastPath,omitempty"`
	NoFastPath string    `json:"noFastPath,omitempty"`
	// NATFastPath is what a gateway's NAT fast path (forwarding direct and nodePort: a BPF
	// program, which sees arriving packets before the table) holds for the flow, read from its
	// maps (kernel ruleset, with a source port; nil when no program is attached).
	NATFastPath *NATPath `json:"natFastPath,omitempty"`
	// Rejected lists the objects, entries and addresses that name the destination but are not
	// programmed, and why (a hostile Service refused, an entry another Service holds): the rendered
	// ruleset's own, or with the kernel's table the node's /status (when --config says where).
	Rejected []RejectedObject `json:"rejected,omitempty"`
	// DecidedBy lists the rules that decided each outcome; Why says it in words.
	DecidedBy string           `json:"decidedBy,omitempty"`
	Why       []string         `json:"why,omitempty"`
	Steps     []dataplane.Step `json:"steps"`

	// Algorithm is how the candidate is picked (dataplane.Explanation.Algorithm); SrcPort is the
	// packet's source port (0: not given). The text output says them; the JSON has them elsewhere
	// (Source, Maglev).
	Algorithm cluster.LBAlgorithm `json:"-"`
	SrcPort   uint16              `json:"-"`
}

// Maglev is the slot a gateway's jhash puts a flow in, and the backend that slot names.
type Maglev struct {
	Slot  uint32 `json:"slot"`
	Slots uint32 `json:"slots"`
	// Map is the slot map; Backend the pod or node address:port (DNAT) or the node (route).
	Map     string `json:"map"`
	Backend string `json:"backend"`
	Routed  bool   `json:"routed"`
}

// NATPath is the NAT fast path's view of a flow.
type NATPath struct {
	// Interfaces are the indexes of the interfaces the program is attached to.
	Interfaces []int `json:"interfaces"`
	// Taken: the VIP port is the program's; SNAT: it masquerades the port's flows.
	Taken bool `json:"taken"`
	SNAT  bool `json:"snat,omitempty"`
	// Known: the flow has an entry, and its packets become From -> To (the backend) whatever the
	// Maglev table now says; else a new flow is dealt by the Maglev slot (the table's).
	Known bool   `json:"known"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	Idle  string `json:"idle,omitempty"`
}

// natPathView reads the NAT fast path's maps for a flow (nil: no program attached, or the
// packet is not one it could take).
func natPathView(proto uint8, src, dst netip.AddrPort) (*NATPath, error) {
	if proto != 6 && proto != 17 || src.Port() == 0 || src.Addr().Is4() != dst.Addr().Is4() {
		return nil, nil
	}
	in, err := natpath.Inspect(proto, src, dst)
	if err != nil || len(in.Interfaces) == 0 {
		return nil, err
	}
	out := &NATPath{Interfaces: in.Interfaces, Taken: in.Taken, SNAT: in.SNAT}
	if f := in.Flow; f != nil {
		out.Known, out.From, out.To, out.Idle = true, f.NewSrc.String(), f.NewDst.String(), f.Idle.Round(time.Second).String()
	}
	return out, nil
}

// FastPath is the trace of an arriving packet through the fast path's netdev table.
type FastPath struct {
	Table string `json:"table"`
	// Device is the ingress device traced ("" when none has a chain); Devices have ingress chains.
	Device  string   `json:"device,omitempty"`
	Devices []string `json:"devices"`
	// Forwarded says fwd sends the packet to one of Nodes by NodeDevice: the family's table does
	// not see it. Otherwise the packet goes on to the IP stack and that table (DecidedBy says why).
	Forwarded  bool             `json:"forwarded"`
	NodeDevice string           `json:"nodeDevice,omitempty"`
	Nodes      []string         `json:"nodes,omitempty"`
	Outcome    string           `json:"outcome"`
	DecidedBy  string           `json:"decidedBy,omitempty"`
	Steps      []dataplane.Step `json:"steps"`
}

// fastPath traces p through a gateway's fast path table nd as arriving on device dev.
func fastPath(nd *dataplane.Flat, dev string, isLoc func(netip.Addr) bool, p dataplane.Packet) *FastPath {
	ex := dataplane.ExplainFastPath(nd, dev, dataplane.HostInfo{IsLocal: isLoc}, p, roles...)
	fp := &FastPath{Table: nd.Table, Device: ex.Device, Devices: ex.Devices, Forwarded: ex.Taken, NodeDevice: ex.NodeDevice,
		Outcome: string(ex.Result.Outcome), DecidedBy: ex.Result.Reason, Steps: ex.Result.Steps}
	if fp.Steps == nil {
		fp.Steps = []dataplane.Step{}
	}
	for _, c := range ex.Candidates {
		fp.Nodes = append(fp.Nodes, c.Endpoint.Addr().String())
	}
	return fp
}

// nodeRejections reads the rejected objects and entries from the /status of the node agent running
// here (metricsBindAddress); nil if it does not answer.
func nodeRejections(addr netip.AddrPort) []RejectedObject {
	host := addr.Addr()
	if host.IsUnspecified() {
		host = netip.IPv6Loopback()
		if addr.Addr().Is4() {
			host = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + netip.AddrPortFrom(host, addr.Port()).String() + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Rejected []RejectedObject `json:"rejected"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&st) != nil {
		return nil
	}
	return st.Rejected
}

func familyTableName(f cluster.Family) string {
	if f == cluster.IPv6 {
		return "ip6"
	}
	return "ip"
}

// localAddrs lists the addresses of this network namespace (what `fib ... type local` says).
func localAddrs() (map[netip.Addr]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing local addresses: %w", err)
	}
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out, nil
}

// hostSource picks the source of a host-originated packet: the first node IP of the family, else the
// first global address of this namespace.
func hostSource(fam cluster.Family, cfg *cluster.NodeConfig) (netip.Addr, error) {
	if cfg != nil {
		for _, a := range cfg.NodeIPs {
			if cluster.FamilyOf(a) == fam {
				return a.Unmap(), nil
			}
		}
	}
	local, err := localAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	var best netip.Addr
	for a := range local {
		if cluster.FamilyOf(a) == fam && a.IsGlobalUnicast() && (!best.IsValid() || a.Less(best)) {
			best = a
		}
	}
	if !best.IsValid() {
		return netip.Addr{}, fmt.Errorf("--host: no IPv%d address on this host; give --from", fam)
	}
	return best, nil
}

// masqueradeText says in words why the candidate's source is masqueraded.
func masqueradeText(c dataplane.ExplainedCandidate) string {
	switch c.MasqReason {
	case dataplane.MasqGatewaySNAT:
		return "the gateway masquerades this Service's traffic (snat: always, or auto with nodePort forwarding to an externalTrafficPolicy=Cluster Service), so replies come back through it"
	case dataplane.MasqClusterIPFromOutside:
		return "ClusterIP traffic from outside the pod network (source not in clusterCIDRs, or masqueradeAll): masqueraded so replies return through this node"
	case dataplane.MasqExternalCluster:
		return "externalTrafficPolicy=Cluster: traffic to an external IP, LoadBalancer IP or NodePort is masqueraded so the endpoint (maybe on another node) replies through this node"
	case dataplane.MasqLocalFromHost:
		return "traffic from this host to an externalTrafficPolicy=Local Service goes to any endpoint, masqueraded (the host is not an external client)"
	case dataplane.MasqMarkedByChain:
		return "marked for masquerade by chain " + c.MarkRule.Chain
	case dataplane.MasqHairpin:
		return "hairpin: the endpoint is the client itself; masqueraded so its reply comes back through the node"
	}
	return "masqueraded by " + c.MasqRule.String()
}

// whyNot explains in words the outcomes that are not a DNAT.
func whyNot(ex dataplane.Explanation, dst netip.AddrPort, proto uint8, src netip.Addr) []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, v := range ex.Verdicts {
		switch v.Reason {
		case dataplane.VerdictNoEndpoints:
			add("the Service has no endpoints at all: vipgate rejects (ICMP port unreachable) so the client fails fast")
		case dataplane.VerdictNoLocalEndpoints:
			add("the Service has endpoints, but none this node may use for this traffic: externalTrafficPolicy=Local (or internalTrafficPolicy=Local) and no ready endpoint on this node, so the packet is dropped (a load balancer's health check should stop sending here)")
		case dataplane.VerdictClusterIPNoPort:
			add(fmt.Sprintf("%s is a ClusterIP, but its Service has no port %d/%s: rejected", dst.Addr(), dst.Port(), dataplane.ProtoName(proto)))
		case dataplane.VerdictClusterIPUnallocated:
			add(fmt.Sprintf("%s is in a service CIDR but no Service has it: dropped", dst.Addr()))
		case dataplane.VerdictSourceRange:
			add(fmt.Sprintf("source %s is not in loadBalancerSourceRanges of Service %s: dropped", src, v.ServicePort))
		}
	}
	switch ex.Accept {
	case dataplane.AcceptUndefinedPort:
		add(fmt.Sprintf("%s is a Service address, but no Service port %d/%s is defined on it: vipgate leaves the packet alone (not Service traffic)", dst.Addr(), dst.Port(), dataplane.ProtoName(proto)))
	case dataplane.AcceptNotServiceTraffic:
		add("no vipgate rule matched: not Service traffic, the packet passes untouched")
	}
	return out
}

// serviceFor names the Service port that dst belongs to in st ("" if none).
//
// When several Services claim the destination, the one that holds it is named: with a rendered node
// ruleset (holders), the Service whose part programs the entry; otherwise the first claim in the
// order the node resolves claims by (cluster IPs first, then the oldest Service).
func serviceFor(st *cluster.State, holders *dataplane.Ruleset, isLocal func(netip.Addr) bool, dst netip.AddrPort, proto uint8) string {
	keys := slices.SortedFunc(maps.Keys(st.Services), func(a, b cluster.ServiceKey) int {
		return cluster.ClaimOrder(st.Services[a], st.Services[b])
	})
	if holders != nil {
		keys = slices.DeleteFunc(keys, func(k cluster.ServiceKey) bool {
			part := holders.Services[k]
			return part == nil || !slices.ContainsFunc(part.Entries, func(e dataplane.EntryRef) bool {
				return e.Proto == proto && e.Port == dst.Port() && (e.Addr == dst.Addr() || e.NodePort && isLocal(dst.Addr()))
			})
		})
	}
	// Cluster IP claims first: they win over external ones.
	for _, key := range keys {
		svc := st.Services[key]
		if !slices.Contains(svc.ClusterIPs, dst.Addr()) {
			continue
		}
		for _, p := range svc.Ports {
			if dataplane.ProtoNumber(p.Protocol) == proto && p.Port == dst.Port() {
				return fmt.Sprintf("%s port %d/%s", key, p.Port, p.Protocol)
			}
		}
	}
	for _, key := range keys {
		svc := st.Services[key]
		for _, p := range svc.Ports {
			if dataplane.ProtoNumber(p.Protocol) != proto {
				continue
			}
			desc := fmt.Sprintf("%s port %d/%s", key, p.Port, p.Protocol)
			if p.Port == dst.Port() {
				addrs := append(append(append([]netip.Addr{}, svc.ClusterIPs...), svc.ExternalIPs...), svc.LoadBalancerIPs...)
				for _, a := range addrs {
					if a.Unmap() == dst.Addr() {
						return desc
					}
				}
			}
			if p.NodePort != 0 && p.NodePort == dst.Port() && isLocal(dst.Addr()) &&
				(svc.Type == cluster.TypeNodePort || svc.Type == cluster.TypeLoadBalancer) {
				return desc + " (NodePort " + strconv.Itoa(int(p.NodePort)) + ")"
			}
		}
	}
	return ""
}
