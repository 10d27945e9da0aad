package main

import (
	"errors"
	"flag"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

const renderHelp = `Usage: vipgate render --config FILE --manifests DIR [flags]

Prints the nftables ruleset vipgate would program for these manifests, in "nft -f" syntax, without
touching the kernel. Check it with "nft -c -f FILE"; read it to see what vipgate does.

With a GatewayConfig it prints the gateway's ruleset; health checks are not run, so an eTP=Local
Service's nodes are the ones its EndpointSlices put a ready endpoint on (what the probes would find).

Flags:
`

func runRender(args []string) error {
	nf, err := parseNodeFlags("render", renderHelp, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if nf.manifests == "" {
		return errors.New("--manifests is required")
	}
	anyCfg, err := cluster.LoadConfig(nf.config)
	if err != nil {
		return err
	}
	o, err := loadOffline(anyCfg, nf.manifests, nf.allowWorldWritable, nf.logLevel)
	if err != nil {
		return err
	}
	if o.gateway != nil {
		return renderGateway(os.Stdout, o)
	}
	return renderNode(os.Stdout, o.log, o.node, o.state)
}

// renderNode prints the node ruleset of st (both families) to w and logs, to log, what the node
// would not program: the entries held by another Service and the addresses its externalIPs policy
// refuses, once for both families. (The objects the file source refused were logged by its Load.)
func renderNode(w io.Writer, log hclog.Logger, cfg *cluster.NodeConfig, st *cluster.State) error {
	o := &offline{node: cfg, log: log, state: st}
	seen := map[cluster.Rejection]bool{}
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, err := o.build(f)
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

// renderGateway prints the gateway ruleset of the manifests (both families) to w. Health checks are
// not run: ExpectedHealth stands in for them.
func renderGateway(w io.Writer, o *offline) error {
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, err := o.build(f)
		if err != nil {
			return err
		}
		for _, c := range rs.Conflicts {
			o.log.Warn("rejected", "object", c.Object, "reason", c.Reason)
		}
		if err := dataplane.Render(w, rs.Flat); err != nil {
			return err
		}
	}
	return nil
}
