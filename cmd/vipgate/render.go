package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/gateway/ctsync"
)

const renderHelp = `Usage: vipgate render --config FILE --manifests DIR [flags]

Prints the nftables ruleset vipgate would program for these manifests, in "nft -f" syntax, without
touching the kernel. Check it with "nft -c -f FILE"; read it to see what vipgate does.

With a GatewayConfig it prints the gateway's ruleset; health checks are not run, so an eTP=Local
Service's nodes are the ones its EndpointSlices put a ready endpoint on (what the probes would find).
With snatAddresses it also prints the tables vipgate-snat (families ip and ip6) that SNAT to the
gateway's own SNAT address and drop replies of unknown flows to any of them (docs/gateway.md, "SNAT
gateways and conntrack sync").

With forwarding: route and the fast path on (routeFastPath), it also prints each family's netdev
table (vipgate-fwd4, vipgate-fwd6: ingress chains that fwd VIP traffic to the nodes). Its devices
are the config's routeFastPath.devices, else what the gateway would use on this machine: every up
interface but loopback, and the device of this machine's route to the nodes. To render for another
machine, state them with --ingress-devices and --node-device. Where the fast path cannot be planned
(the nodes are not on-link here, say), an nft comment says why: the gateway would forward that
family with its ip/ip6 table alone. "nft -c -f" of a netdev table needs its devices to exist.

Flags:
`

// renderFlags are render's flags.
type renderFlags struct {
	config, manifests, logLevel string
	allowWorldWritable          bool
	// ingressDevices and nodeDevice state the fast path's devices (explain.Offline.IngressDevices).
	ingressDevices, nodeDevice string
}

func parseRenderFlags(args []string) (*renderFlags, error) {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	f := &renderFlags{}
	fs.StringVar(&f.config, "config", "", "NodeConfig or GatewayConfig file")
	fs.StringVar(&f.manifests, "manifests", "", "directory of Kubernetes YAML (Services, EndpointSlices, MetalLB kinds)")
	fs.StringVar(&f.logLevel, "log-level", "", "override the config's logLevel (trace, debug, info, warn, error)")
	fs.BoolVar(&f.allowWorldWritable, "allow-world-writable-manifests", false, "accept a manifest directory anyone can write to (unsafe)")
	fs.StringVar(&f.ingressDevices, "ingress-devices", "", "gateway fast path: the interfaces VIP traffic arrives on, comma-separated (default: routeFastPath.devices, else this machine's up interfaces without a master)")
	fs.StringVar(&f.nodeDevice, "node-device", "", "gateway fast path: the interface every node is on-link through (default: this machine's route to the nodes)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), renderHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.config == "":
		return nil, errors.New("--config is required")
	case f.manifests == "":
		return nil, errors.New("--manifests is required")
	}
	for _, d := range append(strings.Split(f.ingressDevices, ","), f.nodeDevice) {
		if d == "" {
			continue
		}
		if err := cluster.ValidInterfaceName(d); err != nil {
			return nil, fmt.Errorf("device %q is not an interface name: %w", d, err)
		}
	}
	if strings.Contains(","+f.ingressDevices+",", ",,") && f.ingressDevices != "" {
		return nil, fmt.Errorf("--ingress-devices %q: an empty device name", f.ingressDevices)
	}
	return f, nil
}

func runRender(args []string) error {
	rf, err := parseRenderFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	anyCfg, err := cluster.LoadConfig(rf.config)
	if err != nil {
		return err
	}
	o, err := explain.LoadOffline(anyCfg, rf.manifests, rf.allowWorldWritable, rf.logLevel)
	if err != nil {
		return err
	}
	if rf.ingressDevices != "" {
		o.IngressDevices = strings.Split(rf.ingressDevices, ",")
	}
	o.NodeDevice = rf.nodeDevice
	if o.Gateway == nil && (rf.ingressDevices != "" || rf.nodeDevice != "") {
		return errors.New("--ingress-devices and --node-device are for a GatewayConfig (the route forwarding fast path)")
	}
	if o.Gateway != nil {
		return renderGateway(os.Stdout, o)
	}
	return renderNode(os.Stdout, o.Log, o.Node, o.State)
}

// renderNode prints the node ruleset of st (both families) to w and logs, to log, what the node
// would not program: the entries held by another Service and the addresses its externalIPs policy
// refuses, once for both families. (The objects the file source refused were logged by its Load.)
func renderNode(w io.Writer, log hclog.Logger, cfg *cluster.NodeConfig, st *cluster.State) error {
	o := &explain.Offline{Node: cfg, Log: log, State: st}
	seen := map[cluster.Rejection]bool{}
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, err := o.Build(f)
		if err != nil {
			return err
		}
		for _, c := range rs.Conflicts {
			if !seen[c] {
				seen[c] = true
				log.Warn("not programmed", "kind", c.Kind, "object", c.Object, "reason", c.Reason)
			}
		}
		if err := dataplane.Render(w, rs.Flat); err != nil {
			return err
		}
	}
	return nil
}

// renderGateway prints the gateway ruleset of the manifests (both families, each with its fast
// path's netdev table or a comment saying why it has none) to w, then the SNAT tables of its
// snatAddresses (gatewaySNATTables). Health checks are not run: ExpectedHealth stands in for them.
func renderGateway(w io.Writer, o *explain.Offline) error {
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, err := o.Build(f)
		if err != nil {
			return err
		}
		for _, c := range rs.Conflicts {
			o.Log.Warn("rejected", "object", c.Object, "reason", c.Reason)
		}
		if err := dataplane.Render(w, rs.Flat); err != nil {
			return err
		}
		// After the family's table, as the gateway programs them.
		switch {
		case rs.Netdev != nil:
			if err := dataplane.Render(w, rs.Netdev); err != nil {
				return err
			}
		case rs.NoFastPath != "off":
			if _, err := io.WriteString(w, noFastPathComment(cmp.Or(o.Table, o.Gateway.TableName), f, rs.NoFastPath)); err != nil {
				return err
			}
		}
	}
	_, err := io.WriteString(w, gatewaySNATTables(o.Gateway))
	return err
}

// noFastPathComment is the nft comment render prints for family f's fast path when it cannot be
// planned (why): never silently nothing, since the gateway would program a different ruleset.
func noFastPathComment(table string, f cluster.Family, why string) string {
	fam := "ip"
	if f == cluster.IPv6 {
		fam = "ip6"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# No route forwarding fast path for IPv%d (table netdev %s): %s.\n", f, dataplane.NetdevTableName(table, f),
		strings.ReplaceAll(why, "\n", " "))
	fmt.Fprintf(&b, "# The gateway would forward IPv%d with table %s %s alone (dup at prerouting), log this as a warning,\n", f, fam, table)
	b.WriteString("# and delete a netdev table of an earlier run. To render the fast path of another machine, state its\n")
	b.WriteString("# devices: --ingress-devices DEV,... --node-device DEV.\n")
	return b.String()
}

// gatewaySNATTables is, in nft syntax, the table vipgate-snat that a gateway of cfg programs at
// start (ctsync.ProgramSNAT, from startGatewayConntrackSync's arguments): SNAT to the gateway's own
// SNAT address of each family, and the guard for every gateway's. It does not change while the
// gateway runs (taking over a dead peer's address is an ARP/NDP matter only), so the rendering is
// exact. Empty without snatAddresses.
func gatewaySNATTables(cfg *cluster.GatewayConfig) string {
	var all []netip.Addr
	for _, g := range cfg.SNATAddresses {
		all = append(all, g.Addresses...)
	}
	return ctsync.RenderSNAT(cfg.SNATAddressesOf(cfg.Name), all, uint32(1)<<uint(cluster.DefaultMasqueradeBit))
}
