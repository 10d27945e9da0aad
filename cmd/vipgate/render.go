package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

const renderHelp = `Usage: vipgate render --config FILE --manifests DIR [flags]

Prints the nftables ruleset vipgate would program for these manifests, in "nft -f" syntax, without
touching the kernel. Check it with "nft -c -f FILE"; read it to see what vipgate does.

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
	cfg, err := cluster.LoadNodeConfig(nf.config)
	if err != nil {
		return err
	}
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
	dpCfg := dataplaneConfig(cfg, log)
	for _, f := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
		rs := dataplane.BuildRuleset(dpCfg, f, st)
		if rs == nil {
			return fmt.Errorf("building the IPv%d ruleset failed", f)
		}
		if err := dataplane.Render(os.Stdout, rs.Flatten()); err != nil {
			return err
		}
	}
	return nil
}
