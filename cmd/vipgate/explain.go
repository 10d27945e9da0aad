package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

const explainHelp = `Usage: vipgate explain --from SRC --to DST:PORT[/PROTO] [flags]

Traces one packet (the first of a new connection) through vipgate's nftables table and says what
happens to it: every rule it meets, the endpoints it may be DNATed to (all of them, where the choice
is random), whether its source is masqueraded and why, or why it is dropped or rejected.

By default the table is read back from the kernel of the network namespace explain runs in (run it
where "vipgate node" runs, e.g. "ip netns exec NODE vipgate explain ..."). With --manifests and
--config it traces the ruleset vipgate would program for those manifests instead, touching nothing.

  vipgate explain --from 203.0.113.5 --to 198.51.100.10:80/tcp
  vipgate explain --host --to 10.96.0.10:53/udp
  vipgate explain --from 2001:db8::5 --to [2001:db8:100::11]:443 --output json

Flags:
`

type explainFlags struct {
	from, to, table, output, config, manifests string
	host, allowWorldWritable                   bool
}

func runExplain(args []string) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	ef := &explainFlags{}
	fs.StringVar(&ef.from, "from", "", "source address of the packet (default with --host: a local address of the destination's family)")
	fs.StringVar(&ef.to, "to", "", "destination ADDR:PORT[/tcp|udp|sctp] (IPv6 in brackets); protocol default tcp")
	fs.BoolVar(&ef.host, "host", false, "the packet originates on this host (output path) instead of arriving on an interface")
	fs.StringVar(&ef.table, "table", "", "nftables table name (default: the config's tableName, else vipgate)")
	fs.StringVar(&ef.output, "output", "text", "output format: text or json")
	fs.StringVar(&ef.config, "config", "", "NodeConfig file (with --manifests: trace the rendered ruleset)")
	fs.StringVar(&ef.manifests, "manifests", "", "manifest directory: trace what vipgate would program for it, not the kernel's table")
	fs.BoolVar(&ef.allowWorldWritable, "allow-world-writable-manifests", false, "accept a manifest directory anyone can write to (unsafe)")
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
	// DecidedBy lists the rules that decided each outcome; Why says it in words.
	DecidedBy string           `json:"decidedBy,omitempty"`
	Why       []string         `json:"why,omitempty"`
	Steps     []dataplane.Step `json:"steps"`
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
		st     *cluster.State
		flat   *dataplane.Flat
		isLoc  func(netip.Addr) bool
		source = "kernel"
	)
	if ef.config != "" {
		if cfg, err = cluster.LoadNodeConfig(ef.config); err != nil {
			return nil, err
		}
	}
	table := ef.table
	if table == "" && cfg != nil {
		table = cfg.TableName
	}
	if table == "" {
		table = "vipgate"
	}
	if ef.manifests != "" {
		if cfg == nil {
			return nil, errors.New("--manifests needs --config (the node the ruleset is rendered for)")
		}
		source = "rendered"
		log := cfg.Logging.NewLogger("vipgate", os.Stderr)
		src := cluster.NewFileSource(ef.manifests, log.Named("manifests"))
		src.AllowWorldWritable = ef.allowWorldWritable
		if st, err = src.Load(); err != nil {
			return nil, err
		}
		dpCfg := dataplaneConfig(cfg, log)
		dpCfg.Table = table
		rs := dataplane.BuildRuleset(dpCfg, fam, st)
		if rs == nil {
			return nil, fmt.Errorf("building the IPv%d ruleset failed", fam)
		}
		flat = rs.Flatten()
		local := map[netip.Addr]bool{}
		for _, a := range append(append([]netip.Addr{}, cfg.NodeIPs...), dpCfg.NodePortIPs...) {
			local[a.Unmap()] = true
		}
		isLoc = func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }
	} else {
		prog := &dataplane.NetlinkProgrammer{}
		if flat, err = prog.ReadTable(fam, table); err != nil {
			return nil, err
		}
		local, err := localAddrs()
		if err != nil {
			return nil, err
		}
		isLoc = func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }
	}

	var srcAddr netip.Addr
	switch {
	case ef.from != "":
		if srcAddr, err = netip.ParseAddr(ef.from); err != nil {
			return nil, fmt.Errorf("--from %q: %w", ef.from, err)
		}
		srcAddr = srcAddr.Unmap()
	case ef.host:
		if srcAddr, err = hostSource(fam, cfg); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("--from is required (or --host for a packet from this host)")
	}

	res := dataplane.Trace(flat, dataplane.HostInfo{IsLocal: isLoc}, dataplane.Packet{
		Src: srcAddr, Dst: dst.Addr(), Proto: proto, Port: dst.Port(), FromHost: ef.host})
	rep := &ExplainReport{
		Source: srcAddr.String(), Dest: dst.String(), Protocol: dataplane.ProtoName(proto), FromHost: ef.host,
		Ruleset: source, Table: familyTableName(fam) + " " + table,
		Outcome: string(res.Outcome), Summary: res.String(), DecidedBy: res.Reason, Steps: res.Steps,
	}
	if res.Steps == nil {
		rep.Steps = []dataplane.Step{}
	}
	if st != nil && cfg != nil {
		rep.Service = serviceFor(st, isLoc, dst, proto)
	}
	for _, o := range res.Others {
		rep.Others = append(rep.Others, string(o))
	}
	for _, c := range res.Candidates {
		choice, _ := candidateBranch(c)
		ec := ExplainCandidate{Endpoint: c.Endpoint.String(), Masquerade: c.Masquerade, Choice: choice}
		if c.Masquerade {
			ec.MasqueradeReason = masqueradeReason(res.Steps, c)
		}
		rep.Candidates = append(rep.Candidates, ec)
	}
	rep.Why = whyNot(res, flat, dst, proto, srcAddr)
	return rep, nil
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

// candidateBranch splits a candidate's Why into its random choices and its masquerade rule.
func candidateBranch(c dataplane.Candidate) (branch, masqBy string) {
	if rest, ok := strings.CutPrefix(c.Why, "masquerade: "); ok {
		return "", rest
	}
	branch, masqBy, _ = strings.Cut(c.Why, "; masquerade: ")
	return branch, masqBy
}

// onPath says whether a step belongs to the branch (steps before a fork belong to every branch).
func onPath(s dataplane.Step, branch string) bool {
	return s.Branch == "" || s.Branch == branch || strings.HasPrefix(branch, s.Branch+" / ")
}

// masqueradeReason says in words why the candidate's source is masqueraded, from the rule that set
// the masquerade mark on its path (or the hairpin rule).
func masqueradeReason(steps []dataplane.Step, c dataplane.Candidate) string {
	branch, by := candidateBranch(c)
	for _, s := range steps {
		if !onPath(s, branch) || s.Note != "match: jump "+dataplane.ChainMarkForMasquerade {
			continue
		}
		switch {
		case s.Chain == dataplane.ChainServices:
			return "ClusterIP traffic from outside the pod network (source not in clusterCIDRs, or masqueradeAll): masqueraded so replies return through this node"
		case strings.HasPrefix(s.Chain, "masq-pick-"), strings.HasPrefix(s.Chain, "ext-") && !strings.HasPrefix(s.Chain, "ext-ip-") && !strings.HasPrefix(s.Chain, "ext-np-"):
			return "externalTrafficPolicy=Cluster: traffic to an external IP, LoadBalancer IP or NodePort is masqueraded so the endpoint (maybe on another node) replies through this node"
		case strings.HasPrefix(s.Chain, "ext-ip-"), strings.HasPrefix(s.Chain, "ext-np-"):
			return "traffic from this host to an externalTrafficPolicy=Local Service goes to any endpoint, masqueraded (the host is not an external client)"
		default:
			return "marked for masquerade by chain " + s.Chain
		}
	}
	if strings.Contains(by, "hairpin") || strings.Contains(by, dataplane.SetHairpin) {
		return "hairpin: the endpoint is the client itself; masqueraded so its reply comes back through the node"
	}
	return "masqueraded by " + by
}

// whyNot explains in words the outcomes that are not a DNAT, from the rules that decided them.
func whyNot(res dataplane.Result, f *dataplane.Flat, dst netip.AddrPort, proto uint8, src netip.Addr) []string {
	var out []string
	add := func(s string) {
		for _, o := range out {
			if o == s {
				return
			}
		}
		out = append(out, s)
	}
	outcomes := append([]dataplane.Outcome{res.Outcome}, res.Others...)
	for _, by := range strings.Split(res.Reason, "; ") {
		chain, _, _ := strings.Cut(by, "#")
		switch {
		case chain == dataplane.ChainReject:
			add("the Service has no endpoints at all: vipgate rejects (ICMP port unreachable) so the client fails fast")
		case chain == dataplane.ChainServiceEndpointsCheck || chain == dataplane.ChainNodePortEndpointsCheck:
			add("the Service has endpoints, but none this node may use for this traffic: externalTrafficPolicy=Local (or internalTrafficPolicy=Local) and no ready endpoint on this node, so the packet is dropped (a load balancer's health check should stop sending here)")
		case chain == dataplane.ChainClusterIPsCheck && strings.Contains(by, "reject"):
			add(fmt.Sprintf("%s is a ClusterIP, but its Service has no port %d/%s: rejected", dst.Addr(), dst.Port(), dataplane.ProtoName(proto)))
		case chain == dataplane.ChainClusterIPsCheck:
			add(fmt.Sprintf("%s is in a service CIDR but no Service has it: dropped", dst.Addr()))
		case strings.HasPrefix(chain, "fw-"):
			add(fmt.Sprintf("source %s is not in loadBalancerSourceRanges of Service %s: dropped", src, serviceOfChain(strings.TrimPrefix(chain, "fw-"))))
		}
	}
	for _, o := range outcomes {
		if o != dataplane.OutcomeAccept {
			continue
		}
		if entryAddrKnown(f, dst.Addr()) {
			add(fmt.Sprintf("%s is a Service address, but no Service port %d/%s is defined on it: vipgate leaves the packet alone (not Service traffic)", dst.Addr(), dst.Port(), dataplane.ProtoName(proto)))
		} else {
			add("no vipgate rule matched: not Service traffic, the packet passes untouched")
		}
	}
	return out
}

// serviceOfChain turns "ns/name/proto/port" (a per-Service chain's suffix) into "ns/name port PORT/PROTO".
func serviceOfChain(s string) string {
	parts := strings.Split(s, "/")
	if len(parts) >= 4 {
		return fmt.Sprintf("%s/%s port %s/%s", parts[0], parts[1], parts[3], parts[2])
	}
	return s
}

// entryAddrKnown says whether addr is the address of some Service entry in the table.
func entryAddrKnown(f *dataplane.Flat, addr netip.Addr) bool {
	for _, set := range []string{dataplane.MapServiceIPs, dataplane.MapNoEndpointServices, dataplane.MapFirewallIPs} {
		for _, e := range f.Elements[set] {
			if e.Addr == addr {
				return true
			}
		}
	}
	return false
}

// serviceFor names the Service port that dst belongs to in st ("" if none).
func serviceFor(st *cluster.State, isLocal func(netip.Addr) bool, dst netip.AddrPort, proto uint8) string {
	for key, svc := range st.Services {
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
	fmt.Fprintln(w, "\ntrace:")
	for _, s := range r.Steps {
		fmt.Fprintf(w, "  %s\n", s)
	}
	fmt.Fprintln(w)
	switch dataplane.Outcome(r.Outcome) {
	case dataplane.OutcomeDNAT, dataplane.OutcomeMixed:
		if len(r.Candidates) == 1 {
			fmt.Fprintln(w, "result:   DNAT to 1 endpoint")
		} else {
			fmt.Fprintf(w, "result:   DNAT to one of %d endpoints, chosen at random per connection\n", len(r.Candidates))
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
	if r.DecidedBy != "" {
		fmt.Fprintf(w, "decided:  %s\n", r.DecidedBy)
	}
	for _, y := range r.Why {
		fmt.Fprintf(w, "why:      %s\n", y)
	}
}
