package main

import (
	"errors"
	"flag"
	"fmt"
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
	if gcfg, ok := anyCfg.(*cluster.GatewayConfig); ok {
		return renderGateway(gcfg, nf)
	}
	cfg := anyCfg.(*cluster.NodeConfig)
	log := cfg.Logging.NewLogger("vipgate", os.Stderr)
	if nf.logLevel != "" {
		log.SetLevel(hclog.LevelFromString(nf.logLevel))
	}
	src := cluster.NewFileSource(nf.manifests, log.Named("manifests"))
	src.AllowWorldWritable = nf.allowWorldWritable
	st, err := src.Load()
	if err != nil {
		return err
	}
	return renderNode(os.Stdout, log, cfg, st)
}

// renderNode prints the node ruleset of st (both families) to w and logs, to log, what the node
// would not program: the entries held by another Service and the addresses its externalIPs policy
// refuses, once for both families. (The objects the file source refused were logged by its Load.)
func renderNode(w io.Writer, log hclog.Logger, cfg *cluster.NodeConfig, st *cluster.State) error {
	dpCfg := dataplaneConfig(cfg, log)
	seen := map[cluster.Rejection]bool{}
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs, conflicts := dataplane.BuildRulesetReport(dpCfg, f, st)
		if rs == nil {
			return fmt.Errorf("building the IPv%d ruleset failed", f)
		}
		for _, c := range conflicts {
			if !seen[c] {
				seen[c] = true
				log.Warn("not programmed", "kind", c.Kind, "object", c.Object, "reason", c.Reason)
			}
		}
		if err := dataplane.Render(w, rs.Flatten()); err != nil {
			return err
		}
	}
	return nil
}

// renderGateway prints the gateway ruleset of the manifests (both families).
func renderGateway(cfg *cluster.GatewayConfig, nf *nodeFlags) error {
	log := cfg.Logging.NewLogger("vipgate", os.Stderr)
	if nf.logLevel != "" {
		log.SetLevel(hclog.LevelFromString(nf.logLevel))
	}
	src := cluster.NewFileSource(nf.manifests, log.Named("manifests"))
	src.AllowWorldWritable = nf.allowWorldWritable
	st, err := src.Load()
	if err != nil {
		return err
	}
	dpCfg := gatewayDataplaneConfig(cfg)
	health := dataplane.ExpectedHealth(dpCfg, st)
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		grs, err := dataplane.BuildGatewayRuleset(dpCfg, f, st, health)
		if err != nil {
			return fmt.Errorf("building the IPv%d gateway ruleset: %w", f, err)
		}
		for _, c := range grs.Conflicts {
			log.Warn("rejected", "object", c.Object, "reason", c.Reason)
		}
		if err := dataplane.Render(os.Stdout, grs.Ruleset.Flatten()); err != nil {
			return err
		}
	}
	return nil
}
