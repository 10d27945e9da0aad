package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

const controllerHelp = `Usage: vipgate controller --kubeconfig FILE|in-cluster [flags]

Allocates LoadBalancer IPs from MetalLB IPAddressPools (MetalLB's CRDs, as-is) and writes them to
status.loadBalancer.ingress, with MetalLB's semantics: pools (CIDRs and ranges, autoAssign,
avoidBuggyIPs, serviceAllocation), requested IPs (metallb.io/loadBalancerIPs, spec.loadBalancerIP),
metallb.io/address-pool, metallb.io/allow-shared-ip, dual-stack. Runs as a Deployment; replicas elect
a leader with a coordination.k8s.io Lease and only the leader writes. It runs apart from the node
DaemonSet so that nodes need read access only.

Flags:
`

func runController(args []string) error {
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", `kubeconfig of the cluster ("in-cluster": the pod's service account; the default inside a pod)`)
	conf := cluster.LBControllerConfig{}
	fs.StringVar(&conf.LoadBalancerClass, "load-balancer-class", "", "serve Services of this spec.loadBalancerClass (default: Services without a class)")
	fs.StringVar(&conf.LeaseNamespace, "lease-namespace", "vipgate-system", "namespace of the leader-election Lease")
	fs.StringVar(&conf.LeaseName, "lease-name", "vipgate-controller", "name of the leader-election Lease")
	fs.StringVar(&conf.Identity, "identity", "", "this replica's identity in the Lease (default: host name and pid)")
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log JSON lines")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), controllerHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "vipgate-controller", Level: hclog.LevelFromString(*logLevel), JSONFormat: *logJSON, Output: os.Stderr})
	kc := *kubeconfig
	if kc == "" {
		if !inPod() {
			return errors.New("--kubeconfig is required outside a pod")
		}
		kc = inClusterKubeconfig
	}
	cfg, err := kubeRESTConfig(kc)
	if err != nil {
		return err
	}
	routeKlog(log.Named("client-go"))
	ctrl, err := cluster.NewLBController(cfg, conf, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return ctrl.Run(ctx)
}
