package explain

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/proxy"
)

// This file builds, from a config and a manifest directory, the ruleset vipgate would program for
// them, touching nothing: what `vipgate render` prints and `vipgate explain --manifests` traces,
// with the node's and the gateway's own builders (proxy.BuildRuleset, gateway.BuildRuleset) and
// their views of the config (proxy.ConfigFor, gateway.ConfigFor), as the running node and gateway
// use them.

// Offline is a loaded config and manifest directory. One of Node and Gateway is set.
type Offline struct {
	Node    *cluster.NodeConfig
	Gateway *cluster.GatewayConfig
	Log     hclog.Logger
	State   *cluster.State
	// Table overrides the config's tableName ("": the config's).
	Table string
	// IngressDevices and NodeDevice state a gateway's fast path devices (render's --ingress-devices
	// and --node-device), over the config's devices and this machine's interfaces and routes, for a
	// rendering of another machine's ruleset.
	IngressDevices []string
	NodeDevice     string

	nodeCfg  *proxy.Config
	gwCfg    *gateway.Config
	gwHealth gateway.Health
}

// Ruleset is one family's ruleset of an Offline config.
type Ruleset struct {
	Flat *dataplane.Flat
	// Node is the node ruleset (nil for a gateway): its parts say which Service holds an entry.
	Node *dataplane.Ruleset
	// Conflicts are what the ruleset does not program, and why (entries another Service holds,
	// addresses the externalIPs policy refuses, gateway Services refused).
	Conflicts []cluster.Rejection
	// IsLocal reports the addresses of the node or gateway (and loopback).
	IsLocal func(netip.Addr) bool
	// Netdev is a gateway's fast path netdev table of the family (nil without one); NoFastPath
	// says why there is none ("off": the config has no fast path).
	Netdev     *dataplane.Flat
	NoFastPath string
}

// LoadOffline loads the manifests for cfg (a *cluster.NodeConfig or *cluster.GatewayConfig) and
// logs to stderr at the config's level, or logLevel if given.
func LoadOffline(cfg any, manifests string, allowWorldWritable bool, logLevel string) (*Offline, error) {
	o := &Offline{}
	var logging cluster.Logging
	switch c := cfg.(type) {
	case *cluster.NodeConfig:
		o.Node, logging = c, c.Logging
	case *cluster.GatewayConfig:
		o.Gateway, logging = c, c.Logging
	default:
		return nil, fmt.Errorf("config of type %T: want a NodeConfig or a GatewayConfig", cfg)
	}
	o.Log = logging.NewLogger("vipgate", os.Stderr)
	if logLevel != "" {
		o.Log.SetLevel(hclog.LevelFromString(logLevel))
	}
	src := cluster.NewFileSource(manifests, o.Log.Named("manifests"))
	src.AllowWorldWritable = allowWorldWritable
	st, err := src.Load()
	if err != nil {
		return nil, err
	}
	o.State = st
	return o, nil
}

// Build builds the ruleset of family fam.
func (o *Offline) Build(fam cluster.Family) (*Ruleset, error) {
	if o.Gateway != nil {
		if o.gwCfg == nil {
			c := gateway.ConfigFor(o.Gateway)
			if o.Table != "" {
				c.Table = o.Table
			}
			if err := o.stateFastPathDevices(&c); err != nil {
				return nil, err
			}
			// The NAT fast path as the gateway's runtime gives it (a kernel that loads it, Linux 6.7 or later
			// for its masquerade): conntrack's masquerade keeps out of its ports.
			if nf := o.Gateway.NATFastPath; nf.Enabled && (c.Forwarding == cluster.ForwardDirect || c.Forwarding == cluster.ForwardNodePort) {
				c.NATPath = &gateway.NATPath{SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax,
					NoSNAT: len(o.Gateway.SNATAddresses) > 0 || o.Gateway.ConntrackSync.Enabled}
			}
			o.gwCfg, o.gwHealth = &c, gateway.ExpectedHealth(c, o.State)
		}
		grs, err := gateway.BuildRuleset(*o.gwCfg, fam, o.State, o.gwHealth)
		if err != nil {
			return nil, fmt.Errorf("building the IPv%d gateway ruleset: %w", fam, err)
		}
		gwIPs := o.Gateway.GatewayIPs
		out := &Ruleset{Flat: grs.Ruleset.Flatten(), Conflicts: grs.Conflicts,
			IsLocal: func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(gwIPs, a.Unmap()) }}
		// The fast path as the running gateway would plan it here (or on the devices stated).
		if nrs, why := gateway.NetdevRuleset(*o.gwCfg, fam, o.State, grs); nrs != nil {
			out.Netdev = nrs.Flatten()
		} else {
			out.NoFastPath = why
		}
		return out, nil
	}
	if o.nodeCfg == nil {
		c := proxy.ConfigFor(o.Node, o.Log)
		if o.Table != "" {
			c.Table = o.Table
		}
		o.nodeCfg = &c
	}
	// BuildRuleset's error names the family ("building the IPv4 ruleset: ...").
	rs, conflicts, err := proxy.BuildRuleset(*o.nodeCfg, fam, o.State)
	if err != nil {
		return nil, err
	}
	local := map[netip.Addr]bool{}
	for _, a := range append(slices.Clone(o.Node.NodeIPs), o.nodeCfg.NodePortIPs...) {
		local[a.Unmap()] = true
	}
	return &Ruleset{Flat: rs.Flatten(), Node: rs, Conflicts: conflicts,
		IsLocal: func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }}, nil
}

// stateFastPathDevices puts the stated fast path devices (IngressDevices, NodeDevice) into c. They
// are an error for a gateway without the fast path: they would be silently ignored.
func (o *Offline) stateFastPathDevices(c *gateway.Config) error {
	if len(o.IngressDevices) == 0 && o.NodeDevice == "" {
		return nil
	}
	if c.FastPath == nil {
		return errors.New("--ingress-devices and --node-device are for a gateway with the route forwarding fast path " +
			"(forwarding: route, routeFastPath not disabled); this config has none")
	}
	fp := *c.FastPath
	if len(o.IngressDevices) > 0 {
		fp.Devices = slices.Clone(o.IngressDevices)
	}
	if dev := o.NodeDevice; dev != "" {
		// Stated: every node is on-link through dev, as on the machine the rendering is for.
		fp.NodeDevice = func(netip.Addr) (string, bool, error) { return dev, true, nil }
	}
	c.FastPath = &fp
	return nil
}
