package main

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
// them, touching nothing: what `vipgate render` prints and `vipgate explain --manifests` traces. It
// is wiring of the command's own pieces (the config's translation into the dataplane's view,
// dataplaneConfig and gatewayDataplaneConfig, live in this package), so it lives here, not in
// dataplane.

// offline is a loaded config and manifest directory.
type offline struct {
	node    *cluster.NodeConfig
	gateway *cluster.GatewayConfig
	log     hclog.Logger
	state   *cluster.State
	// table overrides the config's tableName ("": the config's).
	table string
	// ingressDevices and nodeDevice state a gateway's fast path devices (render's --ingress-devices
	// and --node-device), over the config's devices and this machine's interfaces and routes, for a
	// rendering of another machine's ruleset.
	ingressDevices []string
	nodeDevice     string

	nodeCfg  *proxy.Config
	gwCfg    *gateway.Config
	gwHealth gateway.Health
}

// offlineRuleset is one family's ruleset of an offline config.
type offlineRuleset struct {
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

// loadOffline loads the manifests for cfg (a *cluster.NodeConfig or *cluster.GatewayConfig) and
// logs to stderr at the config's level, or logLevel if given.
func loadOffline(cfg any, manifests string, allowWorldWritable bool, logLevel string) (*offline, error) {
	o := &offline{}
	var logging cluster.Logging
	switch c := cfg.(type) {
	case *cluster.NodeConfig:
		o.node, logging = c, c.Logging
	case *cluster.GatewayConfig:
		o.gateway, logging = c, c.Logging
	default:
		return nil, fmt.Errorf("config of type %T: want a NodeConfig or a GatewayConfig", cfg)
	}
	o.log = logging.NewLogger("vipgate", os.Stderr)
	if logLevel != "" {
		o.log.SetLevel(hclog.LevelFromString(logLevel))
	}
	src := cluster.NewFileSource(manifests, o.log.Named("manifests"))
	src.AllowWorldWritable = allowWorldWritable
	st, err := src.Load()
	if err != nil {
		return nil, err
	}
	o.state = st
	return o, nil
}

// build builds the ruleset of family fam.
func (o *offline) build(fam cluster.Family) (*offlineRuleset, error) {
	if o.gateway != nil {
		if o.gwCfg == nil {
			c := gatewayDataplaneConfig(o.gateway)
			if o.table != "" {
				c.Table = o.table
			}
			if err := o.stateFastPathDevices(&c); err != nil {
				return nil, err
			}
			// The NAT fast path as startNATPath gives it (a kernel that loads it, Linux 6.7 or later
			// for its masquerade): conntrack's masquerade keeps out of its ports.
			if nf := o.gateway.NATFastPath; nf.Enabled && (c.Forwarding == cluster.ForwardDirect || c.Forwarding == cluster.ForwardNodePort) {
				c.NATPath = &gateway.NATPath{SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax,
					NoSNAT: len(o.gateway.SNATAddresses) > 0 || o.gateway.ConntrackSync.Enabled}
			}
			o.gwCfg, o.gwHealth = &c, gateway.ExpectedHealth(c, o.state)
		}
		grs, err := gateway.BuildRuleset(*o.gwCfg, fam, o.state, o.gwHealth)
		if err != nil {
			return nil, fmt.Errorf("building the IPv%d gateway ruleset: %w", fam, err)
		}
		gwIPs := o.gateway.GatewayIPs
		out := &offlineRuleset{Flat: grs.Ruleset.Flatten(), Conflicts: grs.Conflicts,
			IsLocal: func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(gwIPs, a.Unmap()) }}
		// The fast path as the running gateway would plan it here (or on the devices stated).
		if nrs, why := gateway.NetdevRuleset(*o.gwCfg, fam, o.state, grs); nrs != nil {
			out.Netdev = nrs.Flatten()
		} else {
			out.NoFastPath = why
		}
		return out, nil
	}
	if o.nodeCfg == nil {
		c := dataplaneConfig(o.node, o.log)
		if o.table != "" {
			c.Table = o.table
		}
		o.nodeCfg = &c
	}
	// BuildRuleset's error names the family ("building the IPv4 ruleset: ...").
	rs, conflicts, err := proxy.BuildRuleset(*o.nodeCfg, fam, o.state)
	if err != nil {
		return nil, err
	}
	local := map[netip.Addr]bool{}
	for _, a := range append(slices.Clone(o.node.NodeIPs), o.nodeCfg.NodePortIPs...) {
		local[a.Unmap()] = true
	}
	return &offlineRuleset{Flat: rs.Flatten(), Node: rs, Conflicts: conflicts,
		IsLocal: func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }}, nil
}

// stateFastPathDevices puts the stated fast path devices (ingressDevices, nodeDevice) into c. They
// are an error for a gateway without the fast path: they would be silently ignored.
func (o *offline) stateFastPathDevices(c *gateway.Config) error {
	if len(o.ingressDevices) == 0 && o.nodeDevice == "" {
		return nil
	}
	if c.FastPath == nil {
		return errors.New("--ingress-devices and --node-device are for a gateway with the route forwarding fast path " +
			"(forwarding: route, routeFastPath not disabled); this config has none")
	}
	fp := *c.FastPath
	if len(o.ingressDevices) > 0 {
		fp.Devices = slices.Clone(o.ingressDevices)
	}
	if dev := o.nodeDevice; dev != "" {
		// Stated: every node is on-link through dev, as on the machine the rendering is for.
		fp.NodeDevice = func(netip.Addr) (string, bool, error) { return dev, true, nil }
	}
	c.FastPath = &fp
	return nil
}
