package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway/natpath"
)

const explainHelp = `Usage: vipgate explain --from SRC --to DST:PORT[/PROTO] [flags]

Traces one packet (the first of a new connection) through vipgate's nftables table and says what
happens to it: every rule it meets, the endpoints it may be DNATed to (all of them, where the choice
is random), whether its source is masqueraded and why, or why it is dropped or rejected.

By default the table is read back from the kernel of the network namespace explain runs in (run it
where "vipgate node" or "vipgate gateway" runs, e.g. "ip netns exec NODE vipgate explain ...").
With --manifests and --config (a NodeConfig or a GatewayConfig) it traces the ruleset vipgate would
program for those manifests instead, touching nothing.

What names the destination but is not programmed — a Service refused for a special address, an
external IP the node's externalIPs policy refuses, an entry another Service holds — is listed as
"rejected:" with its reason: from the rendered manifests, or, tracing the kernel's table with
--config, from the node's /status (its metricsBindAddress).

On a gateway the backend of a flow is picked by Maglev hashing of its addresses and ports: give the
source port (--from ADDR:PORT) to see the one slot and backend the flow takes; without it, every
backend the VIP port's slots lead to is listed. With forwarding: route and the fast path
(routeFastPath), an arriving packet meets the netdev table (vipgate-fwd4, vipgate-fwd6) first: explain
traces it there too, as arriving on --device (default: the first device with an ingress chain; they
all hold the same rules), and says whether the fast path forwards it or passes it on to the table
traced after it.

  vipgate explain --from 203.0.113.5 --to 198.51.100.10:80/tcp
  vipgate explain --from 198.51.100.7:40001 --to 203.0.113.50:80    (on a gateway)
  vipgate explain --host --to 10.96.0.10:53/udp
  vipgate explain --from 2001:db8::5 --to [2001:db8:100::11]:443 --output json

Flags:
`

type explainFlags struct {
	from, to, table, output, config, manifests string
	host, allowWorldWritable                   bool
	// device is the interface the packet arrives on, for a gateway's fast path ("": any).
	device string
}

func runExplain(args []string) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	ef := &explainFlags{}
	fs.StringVar(&ef.from, "from", "", "source ADDR or ADDR:PORT of the packet (the port picks a gateway's Maglev slot; default with --host: a local address of the destination's family)")
	fs.StringVar(&ef.to, "to", "", "destination ADDR:PORT[/tcp|udp|sctp] (IPv6 in brackets); protocol default tcp")
	fs.BoolVar(&ef.host, "host", false, "the packet originates on this host (output path) instead of arriving on an interface")
	fs.StringVar(&ef.table, "table", "", "nftables table name (default: the config's tableName, else vipgate)")
	fs.StringVar(&ef.output, "output", "text", "output format: text or json")
	fs.StringVar(&ef.config, "config", "", "NodeConfig or GatewayConfig file (with --manifests: trace the rendered ruleset)")
	fs.StringVar(&ef.manifests, "manifests", "", "manifest directory: trace what vipgate would program for it, not the kernel's table")
	fs.BoolVar(&ef.allowWorldWritable, "allow-world-writable-manifests", false, "accept a manifest directory anyone can write to (unsafe)")
	fs.StringVar(&ef.device, "device", "", "gateway fast path: the interface the packet arrives on (default: the first with an ingress chain)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), explainHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if ef.output != "text" && ef.output != "json" {
		return fmt.Errorf("--output %q: want text or json", ef.output)
	}
	rep, err := explain(ef)
	if err != nil {
		return err
	}
	if ef.output == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.writeText(os.Stdout)
	}
	if rep.Outcome == string(dataplane.OutcomeError) {
		return fmt.Errorf("the trace failed: %s", rep.DecidedBy)
	}
	return nil
}

// parseDest parses ADDR:PORT[/PROTO].
func parseDest(s string) (netip.AddrPort, uint8, error) {
	proto := dataplane.ProtoTCP
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		switch strings.ToLower(s[i+1:]) {
		case "tcp":
		case "udp":
			proto = dataplane.ProtoUDP
		case "sctp":
			proto = dataplane.ProtoSCTP
		default:
			return netip.AddrPort{}, 0, fmt.Errorf("--to %q: protocol %q, want tcp, udp or sctp", s, s[i+1:])
		}
		s = s[:i]
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, 0, fmt.Errorf("--to %q: want ADDR:PORT[/PROTO] (IPv6 as [ADDR]:PORT): %w", s, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, 0, fmt.Errorf("--to %q: port 0", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), proto, nil
}

// ExplainCandidate is one endpoint the packet may go to.
type ExplainCandidate struct {
	Endpoint   string `json:"endpoint"`
	Masquerade bool   `json:"masquerade"`
	// MasqueradeReason says why the source is rewritten (empty when it is not).
	MasqueradeReason string `json:"masqueradeReason,omitempty"`
	// Choice names the random choices that lead here.
	Choice string `json:"choice,omitempty"`
}

// ExplainReport is what `vipgate explain` prints.
type ExplainReport struct {
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
	Outcome    string             `json:"outcome"`
	Summary    string             `json:"summary"`
	Candidates []ExplainCandidate `json:"candidates,omitempty"`
	Others     []string           `json:"others,omitempty"`
	// Maglev is a gateway's consistent-hash choice for the flow (with a source port only).
	Maglev *ExplainMaglev `json:"maglev,omitempty"`
	// FastPath is the packet's trace through a route forwarding gateway's fast path netdev table,
	// which sees it before the table of Steps (nil without one); NoFastPath says why a rendered
	// gateway has none for the family ("" when it has one or it is off).
	FastPath   *ExplainFastPath `json:"fastPath,omitempty"`
	NoFastPath string           `json:"noFastPath,omitempty"`
	// NATFastPath is what a gateway's NAT fast path (forwarding direct and nodePort: a BPF
	// program, which sees arriving packets before the table) holds for the flow, read from its
	// maps (kernel ruleset, with a source port; nil when no program is attached).
	NATFastPath *ExplainNATPath `json:"natFastPath,omitempty"`
	// Rejected lists the objects, entries and addresses that name the destination but are not
	// programmed, and why (a hostile Service refused, an entry another Service holds): the rendered
	// ruleset's own, or with the kernel's table the node's /status (when --config says where).
	Rejected []RejectedObject `json:"rejected,omitempty"`
	// DecidedBy lists the rules that decided each outcome; Why says it in words.
	DecidedBy string           `json:"decidedBy,omitempty"`
	Why       []string         `json:"why,omitempty"`
	Steps     []dataplane.Step `json:"steps"`

	// algorithm is how the candidate is picked (dataplane.Explanation.Algorithm); srcPort is the
	// packet's source port (0: not given).
	algorithm cluster.LBAlgorithm
	srcPort   uint16
}

// ExplainMaglev is the slot a gateway's jhash puts a flow in, and the backend that slot names.
type ExplainMaglev struct {
	Slot  uint32 `json:"slot"`
	Slots uint32 `json:"slots"`
	// Map is the slot map; Backend the pod or node address:port (DNAT) or the node (route).
	Map     string `json:"map"`
	Backend string `json:"backend"`
	Routed  bool   `json:"routed"`
}

// ExplainNATPath is the NAT fast path's view of a flow.
type ExplainNATPath struct {
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

// explainNATPath reads the NAT fast path's maps for a flow (nil: no program attached, or the
// packet is not one it could take).
func explainNATPath(proto uint8, src, dst netip.AddrPort) (*ExplainNATPath, error) {
	if proto != 6 && proto != 17 || src.Port() == 0 || src.Addr().Is4() != dst.Addr().Is4() {
		return nil, nil
	}
	in, err := natpath.Inspect(proto, src, dst)
	if err != nil || len(in.Interfaces) == 0 {
		return nil, err
	}
	out := &ExplainNATPath{Interfaces: in.Interfaces, Taken: in.Taken, SNAT: in.SNAT}
	if f := in.Flow; f != nil {
		out.Known, out.From, out.To, out.Idle = true, f.NewSrc.String(), f.NewDst.String(), f.Idle.Round(time.Second).String()
	}
	return out, nil
}

// writeNATPath prints the NAT fast path's view, which comes before the table's.
func (r *ExplainReport) writeNATPath(w io.Writer) {
	np := r.NATFastPath
	fmt.Fprintf(w, "NAT fast path (BPF, tcx ingress of interfaces %v): ", np.Interfaces)
	switch {
	case np.Known:
		fmt.Fprintf(w, "a known flow: sent as %s -> %s (idle %s), whatever the Maglev table now says; the table below does not see it\n", np.From, np.To, np.Idle)
	case np.Taken:
		masq := ""
		if np.SNAT {
			masq = ", masqueraded to the egress address and a port of its range"
		}
		fmt.Fprintf(w, "takes this VIP port: a new flow is dealt by the Maglev slot below (the table's own)%s, without conntrack\n", masq)
	default:
		fmt.Fprintln(w, "not this VIP port's: the table below decides")
	}
}

// ExplainFastPath is the trace of an arriving packet through the fast path's netdev table.
type ExplainFastPath struct {
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

func explain(ef *explainFlags) (*ExplainReport, error) {
	if ef.to == "" {
		return nil, errors.New("--to is required")
	}
	dst, proto, err := parseDest(ef.to)
	if err != nil {
		return nil, err
	}
	fam := cluster.FamilyOf(dst.Addr())

	var (
		cfg    *cluster.NodeConfig
		anyCfg any
		st     *cluster.State
		flat   *dataplane.Flat
		isLoc  func(netip.Addr) bool
		source = "kernel"
		// rejected is what the source or the node refused, before filtering by destination.
		rejected []RejectedObject
		// holders is the rendered node ruleset, whose parts say which Service holds an entry.
		holders *dataplane.Ruleset
		table   = ef.table
		// netdev is a gateway's fast path table of the family (nil: none), noFast why a rendered
		// gateway has none.
		netdev *dataplane.Flat
		noFast string
	)
	if ef.config != "" {
		if anyCfg, err = cluster.LoadConfig(ef.config); err != nil {
			return nil, err
		}
		switch c := anyCfg.(type) {
		case *cluster.NodeConfig:
			cfg = c
			table = cmp.Or(table, c.TableName)
		case *cluster.GatewayConfig:
			table = cmp.Or(table, c.TableName)
		}
	}
	table = cmp.Or(table, "vipgate")
	switch {
	case ef.manifests != "":
		if anyCfg == nil {
			return nil, errors.New("--manifests needs --config (the node the ruleset is rendered for)")
		}
		source = "rendered"
		o, err := loadOffline(anyCfg, ef.manifests, ef.allowWorldWritable, "")
		if err != nil {
			return nil, err
		}
		o.table = table
		rs, err := o.build(fam)
		if err != nil {
			return nil, err
		}
		st, flat, isLoc, holders = o.state, rs.Flat, rs.IsLocal, rs.Node
		netdev, noFast = rs.Netdev, rs.NoFastPath
		if o.node != nil {
			for _, r := range append(slices.Clone(st.Rejected), rs.Conflicts...) {
				rejected = append(rejected, rejectedObject(r))
			}
		}
	default:
		prog := &dataplane.NetlinkProgrammer{}
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

	var srcAddr netip.Addr
	var srcPort uint16
	switch {
	case ef.from != "":
		if ap, perr := netip.ParseAddrPort(ef.from); perr == nil {
			srcAddr, srcPort = ap.Addr(), ap.Port()
		} else if srcAddr, err = netip.ParseAddr(ef.from); err != nil {
			return nil, fmt.Errorf("--from %q: want ADDR or ADDR:PORT ([ADDR]:PORT for IPv6): %w", ef.from, err)
		}
		srcAddr = srcAddr.Unmap()
	case ef.host:
		if srcAddr, err = hostSource(fam, cfg); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("--from is required (or --host for a packet from this host)")
	}

	// A gateway's NAT fast path sees arriving packets before the table: what its maps hold.
	var natView *ExplainNATPath
	if source == "kernel" && cfg == nil && !ef.host && srcPort != 0 {
		if natView, err = explainNATPath(proto, netip.AddrPortFrom(srcAddr, srcPort), dst); err != nil {
			return nil, fmt.Errorf("reading the NAT fast path's maps: %w", err)
		}
	}
	ex := dataplane.Explain(flat, dataplane.HostInfo{IsLocal: isLoc}, dataplane.Packet{
		Src: srcAddr, Dst: dst.Addr(), Proto: proto, Port: dst.Port(), FromHost: ef.host, SrcPort: srcPort})
	res := ex.Result
	srcText := srcAddr.String()
	if srcPort != 0 {
		srcText = netip.AddrPortFrom(srcAddr, srcPort).String()
	}
	rep := &ExplainReport{
		Source: srcText, Dest: dst.String(), Protocol: dataplane.ProtoName(proto), FromHost: ef.host,
		Ruleset: source, Table: familyTableName(fam) + " " + table,
		Outcome: string(res.Outcome), Summary: res.String(), DecidedBy: res.Reason, Steps: res.Steps,
		algorithm: ex.Algorithm, srcPort: srcPort,
	}
	if res.Steps == nil {
		rep.Steps = []dataplane.Step{}
	}
	// The fast path's ingress chains see arriving packets only.
	if netdev != nil && !ef.host {
		rep.FastPath = explainFastPath(netdev, ef.device, isLoc, dataplane.Packet{
			Src: srcAddr, Dst: dst.Addr(), Proto: proto, Port: dst.Port(), FromHost: ef.host, SrcPort: srcPort})
	} else if noFast != "off" {
		rep.NoFastPath = noFast
	}
	rep.NATFastPath = natView
	if st != nil {
		rep.Service = serviceFor(st, holders, isLoc, dst, proto)
	}
	if m := ex.Maglev; m != nil {
		rep.Maglev = &ExplainMaglev{Slot: m.Slot, Slots: m.Slots, Map: m.Map, Routed: m.Routed, Backend: m.Backend.String()}
		if m.Routed {
			rep.Maglev.Backend = m.Backend.Addr().String()
		}
	}
	for _, o := range res.Others {
		rep.Others = append(rep.Others, string(o))
	}
	for _, c := range ex.Candidates {
		ec := ExplainCandidate{Endpoint: c.Endpoint.String(), Masquerade: c.Masquerade, Choice: c.Branch}
		if c.Masquerade {
			ec.MasqueradeReason = masqueradeText(c.Candidate)
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

// explainFastPath traces p through a gateway's fast path table nd as arriving on device dev.
func explainFastPath(nd *dataplane.Flat, dev string, isLoc func(netip.Addr) bool, p dataplane.Packet) *ExplainFastPath {
	ex := dataplane.ExplainFastPath(nd, dev, dataplane.HostInfo{IsLocal: isLoc}, p)
	fp := &ExplainFastPath{Table: nd.Table, Device: ex.Device, Devices: ex.Devices, Forwarded: ex.Taken, NodeDevice: ex.NodeDevice,
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
func masqueradeText(c dataplane.Candidate) string {
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

// writeFastPath prints the fast path's trace, which comes before the family table's.
func (r *ExplainReport) writeFastPath(w io.Writer) {
	fp := r.FastPath
	on := "on devices " + strings.Join(fp.Devices, ", ")
	if len(fp.Devices) == 0 {
		on = "on no device"
	}
	if fp.Device == "" {
		fmt.Fprintf(w, "\nfast path: table netdev %s (ingress chains %s)\n", fp.Table, on)
	} else {
		fmt.Fprintf(w, "\nfast path: table netdev %s, the packet arriving on %s (ingress chains %s)\n", fp.Table, fp.Device, on)
	}
	for _, s := range fp.Steps {
		fmt.Fprintf(w, "  %s\n", s)
	}
	switch {
	case fp.Forwarded:
		fmt.Fprintf(w, "  -> FORWARDED by fwd through device %s to one of %d nodes (%s), before the IP stack: the table below does not see it\n",
			fp.NodeDevice, len(fp.Nodes), strings.Join(fp.Nodes, ", "))
	case fp.Outcome == string(dataplane.OutcomeAccept):
		fmt.Fprintf(w, "  -> passed on to the IP stack (%s): the table below decides\n", fp.DecidedBy)
	default:
		fmt.Fprintf(w, "  -> %s (%s)\n", fp.Outcome, fp.DecidedBy)
	}
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

func (r *ExplainReport) writeText(w io.Writer) {
	origin := "arriving on an interface"
	if r.FromHost {
		origin = "sent by this host"
	}
	fmt.Fprintf(w, "packet:   %s %s -> %s, %s\n", r.Protocol, r.Source, r.Dest, origin)
	fmt.Fprintf(w, "ruleset:  table %s (%s)\n", r.Table, map[string]string{"kernel": "read from the kernel", "rendered": "rendered from manifests"}[r.Ruleset])
	if r.Service != "" {
		fmt.Fprintf(w, "Service:  %s\n", r.Service)
	}
	for _, rj := range r.Rejected {
		fmt.Fprintf(w, "rejected: %s %s: %s\n", rj.Kind, rj.Object, rj.Reason)
	}
	if fp := r.FastPath; fp != nil {
		r.writeFastPath(w)
	} else if r.NoFastPath != "" {
		fmt.Fprintf(w, "\nfast path: none for this family (%s): the table below forwards alone\n", r.NoFastPath)
	}
	if r.NATFastPath != nil {
		fmt.Fprintln(w)
		r.writeNATPath(w)
	}
	fmt.Fprintln(w, "\ntrace:")
	for _, s := range r.Steps {
		fmt.Fprintf(w, "  %s\n", s)
	}
	fmt.Fprintln(w)
	switch dataplane.Outcome(r.Outcome) {
	case dataplane.OutcomeRoute:
		fmt.Fprintf(w, "result:   ROUTE: sent unchanged to one of %d nodes as next hop (the node's own Service rules take it on)\n", len(r.Candidates))
		for _, c := range r.Candidates {
			fmt.Fprintf(w, "  -> %-24s %s\n", c.Endpoint, c.Choice)
		}
	case dataplane.OutcomeDNAT, dataplane.OutcomeMixed:
		switch {
		case len(r.Candidates) == 1:
			fmt.Fprintln(w, "result:   DNAT to 1 endpoint")
		case r.algorithm == cluster.LBMaglev:
			fmt.Fprintf(w, "result:   DNAT to one of %d backends, chosen by a fixed hash of the flow (Maglev; the same on every gateway)\n", len(r.Candidates))
		default:
			fmt.Fprintf(w, "result:   DNAT to one of %d endpoints, chosen per connection by the Service's balancing algorithm (random unless %s names another)\n", len(r.Candidates), cluster.LBAlgorithmAnnotation)
		}
		for _, c := range r.Candidates {
			masq := "source kept"
			if c.Masquerade {
				masq = "masqueraded: " + c.MasqueradeReason
			}
			fmt.Fprintf(w, "  -> %-24s %s\n", c.Endpoint, masq)
		}
		for _, o := range r.Others {
			fmt.Fprintf(w, "  other random choices end in %s\n", o)
		}
	case dataplane.OutcomeError:
		fmt.Fprintf(w, "result:   ERROR: %s\n", r.DecidedBy)
		return
	default:
		fmt.Fprintf(w, "result:   %s\n", r.Outcome)
	}
	if m := r.Maglev; m != nil {
		verb := "DNAT to"
		if m.Routed {
			verb = "routed to node"
		}
		fmt.Fprintf(w, "maglev:   this flow (source port %d) hashes to slot %d of %d in @%s: %s %s — the same on every gateway\n",
			r.srcPort, m.Slot, m.Slots, m.Map, verb, m.Backend)
		if m.Routed {
			// forwarding: route keeps a connection table in front of Maglev (dataplane/gateway_conntable.go).
			fmt.Fprintf(w, "table:    for a new flow; once seen, the flow keeps its node in @%s while that node serves the VIP port (drained nodes too), whatever the slot says later\n", dataplane.MapGatewayFlows)
		}
	}
	if r.DecidedBy != "" {
		fmt.Fprintf(w, "decided:  %s\n", r.DecidedBy)
	}
	for _, y := range r.Why {
		fmt.Fprintf(w, "why:      %s\n", y)
	}
}
