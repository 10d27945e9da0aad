package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/proxy/healthcheck"
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
	metricsAddr := fs.String("metrics-bind-address", "0.0.0.0:7472", `serve Prometheus metrics (the allocator's pool usage, Go and process) on this address ("" or "0": none)`)
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
	// MetalLB's ConfigurationState and IPAddressPool status go to vipgate's namespace, owned by this pod.
	conf.StatusNamespace, conf.PodName = os.Getenv(podNamespaceEnv), os.Getenv("POD_NAME")
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
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if conf.Metrics, err = cluster.NewPoolMetrics(reg); err != nil {
		return err
	}
	ctrl, err := cluster.NewLBController(cfg, conf, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *metricsAddr != "" && *metricsAddr != "0" {
		if err := serveControllerMetrics(ctx, log.Named("metrics"), *metricsAddr, reg); err != nil {
			return err
		}
	}
	return ctrl.Run(ctx)
}

// serveControllerMetrics serves the controller's registry (the one PoolMetrics is registered on, plus
// the Go and process collectors) on addr until ctx ends. Failing to listen is an error: the flag asked
// for it.
func serveControllerMetrics(ctx context.Context, log hclog.Logger, addr string, reg *prometheus.Registry) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv, bound, err := healthcheck.ListenAndServe(addr, mux, log, "metrics endpoint")
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close() // only listener close errors, which leave nothing to undo
	}()
	log.Info("serving metrics", "address", bound.String())
	return nil
}
