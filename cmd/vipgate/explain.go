package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/gateway"
)

// `vipgate explain`: the flags and the printing. The trace and the report are package explain's.

const explainHelp = `Usage: vipgate explain --from SRC --to DST:PORT[/PROTO] [flags]
       vipgate explain --service NAMESPACE/NAME | --vip ADDR [flags]

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

With --service NAMESPACE/NAME (or --vip ADDR) it explains the Service's LoadBalancer IPs whole, in
one report: for each VIP, which node owns it by L2 and why every speaker is or is not a candidate
(L2Advertisement nodeSelectors and serviceSelectors, externalTrafficPolicy Local and local
endpoints, preferredNodeSelectors, membership, link state), which nodes advertise it by BGP and to
which peers with which communities, localPref and AS path prepend, and for each port the trace of
a new connection from a client (--from ADDR, default 203.0.113.254 or 2001:db8:ffff::fe): the rules
it meets and the backends with their shares. Live, the speaker's decisions come from the agent's
admin endpoint (/explain on metricsBindAddress, or --admin) and the traces read this host's table;
with --manifests and --config, both are computed for the config's node, every speaker assumed alive.

  vipgate explain --service demo/web
  vipgate explain --vip 203.0.113.10 --config node1.yaml --manifests ./manifests --output json

Flags:
`

type explainFlags struct {
	from, to, table, output, config, manifests string
	host, allowWorldWritable                   bool
	// device is the interface the packet arrives on, for a gateway's fast path ("": any).
	device string
	// service and vip explain a Service's VIPs (or one VIP) whole: the speakers and every port's
	// trace; admin is the agent's admin endpoint (live).
	service, vip, admin string
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
	fs.StringVar(&ef.service, "service", "", "explain a Service's LoadBalancer IPs whole, NAMESPACE/NAME: who announces each and why, to which BGP peers, and every port's trace (--from: the client)")
	fs.StringVar(&ef.vip, "vip", "", "as --service, for one VIP ADDR and the Services that use it")
	fs.StringVar(&ef.admin, "admin", "", "with --service/--vip and no --manifests: the agent's admin endpoint (default: the config's metricsBindAddress, else 127.0.0.1:10249)")
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
	if ef.service != "" || ef.vip != "" {
		srep, err := explainServiceFor(ef)
		if err != nil {
			return err
		}
		if ef.output == "json" {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(srep)
		}
		srep.WriteText(os.Stdout)
		return nil
	}
	rep, err := explainFor(ef)
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
		writeExplain(os.Stdout, rep)
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

// explainFor loads the config, parses --to and --from, and traces the packet they name.
func explainFor(ef *explainFlags) (*explain.Report, error) {
	if ef.to == "" {
		return nil, errors.New("--to is required")
	}
	o := explain.Options{Table: ef.table, Manifests: ef.manifests, AllowWorldWritable: ef.allowWorldWritable, FromHost: ef.host, Device: ef.device}
	var err error
	if o.Dst, o.Proto, err = parseDest(ef.to); err != nil {
		return nil, err
	}
	if ef.config != "" {
		if o.Config, err = cluster.LoadConfig(ef.config); err != nil {
			return nil, err
		}
	}
	if ef.from != "" {
		if ap, perr := netip.ParseAddrPort(ef.from); perr == nil {
			o.Src, o.SrcPort = ap.Addr(), ap.Port()
		} else if o.Src, err = netip.ParseAddr(ef.from); err != nil {
			return nil, fmt.Errorf("--from %q: want ADDR or ADDR:PORT ([ADDR]:PORT for IPv6): %w", ef.from, err)
		}
	}
	return explain.Trace(o)
}

// explainServiceFor explains --service or --vip: offline with --manifests and --config, else live
// from the agent's admin endpoint and this host's kernel table.
func explainServiceFor(ef *explainFlags) (*explain.ServiceReport, error) {
	q, err := explain.ParseQuery(ef.service, ef.vip)
	if err != nil {
		return nil, err
	}
	if ef.to != "" || ef.host {
		return nil, errors.New("--to and --host trace one packet; --service and --vip trace every VIP port themselves")
	}
	o := explain.ServiceOptions{Query: q, Manifests: ef.manifests, AllowWorldWritable: ef.allowWorldWritable, Table: ef.table}
	if ef.config != "" {
		if o.Config, err = cluster.LoadConfig(ef.config); err != nil {
			return nil, err
		}
	}
	if ef.manifests != "" && o.Config == nil {
		return nil, errors.New("--manifests needs --config (the node whose view and ruleset are explained)")
	}
	if ef.from != "" {
		a, err := netip.ParseAddr(ef.from)
		if err != nil {
			return nil, fmt.Errorf("--from %q: with --service/--vip, the client ADDR: %w", ef.from, err)
		}
		if a = a.Unmap(); a.Is4() {
			o.Client4 = a
		} else {
			o.Client6 = a
		}
	}
	admin := ef.admin
	if admin == "" {
		admin = cluster.DefaultMetricsBindAddress
		switch c := o.Config.(type) {
		case *cluster.NodeConfig:
			admin = c.MetricsBindAddress.String()
		case *cluster.GatewayConfig:
			admin = c.MetricsBindAddress.String()
		}
	}
	if o.Admin, err = netip.ParseAddrPort(admin); err != nil {
		return nil, fmt.Errorf("--admin %q: want ADDR:PORT: %w", admin, err)
	}
	return explain.ExplainService(o)
}

// writeExplain prints the report in words.
func writeExplain(w io.Writer, r *explain.Report) {
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
		writeFastPath(w, fp)
	} else if r.NoFastPath != "" {
		fmt.Fprintf(w, "\nfast path: none for this family (%s): the table below forwards alone\n", r.NoFastPath)
	}
	if r.NATFastPath != nil {
		fmt.Fprintln(w)
		writeNATPath(w, r.NATFastPath)
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
		case r.Algorithm == cluster.LBMaglev:
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
			r.SrcPort, m.Slot, m.Slots, m.Map, verb, m.Backend)
		if m.Routed {
			// forwarding: route keeps a connection table in front of Maglev (dataplane/gateway_conntable.go).
			fmt.Fprintf(w, "table:    for a new flow; once seen, the flow keeps its node in @%s while that node serves the VIP port (drained nodes too), whatever the slot says later\n", gateway.MapGatewayFlows)
		}
	}
	if r.DecidedBy != "" {
		fmt.Fprintf(w, "decided:  %s\n", r.DecidedBy)
	}
	for _, y := range r.Why {
		fmt.Fprintf(w, "why:      %s\n", y)
	}
}

// writeFastPath prints the fast path's trace, which comes before the family table's.
func writeFastPath(w io.Writer, fp *explain.FastPath) {
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

// writeNATPath prints the NAT fast path's view, which comes before the table's.
func writeNATPath(w io.Writer, np *explain.NATPath) {
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
