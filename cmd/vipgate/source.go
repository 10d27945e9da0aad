package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vipgate/vipgate/cluster"
)

// source is where the desired state comes from: a directory of YAML files or the Kubernetes API.
type source interface {
	// Run calls onChange with the first complete snapshot and then with every change, until ctx ends.
	Run(ctx context.Context, onChange func(*cluster.State)) error
	// String names the source for logs.
	String() string
}

type fileSource struct{ *cluster.FileSource }

func (f fileSource) String() string { return "manifests " + f.Dir }

// kubeSource is the Kubernetes API source; its String is "kubernetes <API server URL>".
type kubeSource struct{ *cluster.KubeSource }

// inClusterKubeconfig is the --kubeconfig value that selects the pod's service account.
const inClusterKubeconfig = "in-cluster"

// serviceAccountToken is where Kubernetes mounts a pod's service-account token.
const serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// newSource picks the source the flags ask for:
//
//   - --manifests DIR: the file source.
//   - --kubeconfig FILE: the Kubernetes API described by that kubeconfig.
//   - --kubeconfig=in-cluster: the Kubernetes API through the pod's service account.
//   - neither flag, inside a pod (KUBERNETES_SERVICE_HOST set and a service-account token mounted):
//     in-cluster as well, so that the DaemonSet needs no flag.
func newSource(nf *nodeFlags, log hclog.Logger) (source, error) {
	kubeconfig := nf.kubeconfig
	switch {
	case nf.manifests != "" && kubeconfig != "":
		return nil, errors.New("--manifests and --kubeconfig are exclusive")
	case nf.manifests != "":
		fs := cluster.NewFileSource(nf.manifests, log.Named("manifests"))
		fs.AllowWorldWritable = nf.allowWorldWritable
		return fileSource{fs}, nil
	case kubeconfig == "" && inPod():
		log.Info("running in a pod without --manifests or --kubeconfig: using the in-cluster Kubernetes API")
		kubeconfig = inClusterKubeconfig
	case kubeconfig == "":
		return nil, errors.New("one of --manifests or --kubeconfig is required")
	}

	restCfg, err := kubeRESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	// The node name goes on the Events vipgate records; the config was validated by the caller.
	var nodeName string
	if cfg, err := cluster.LoadNodeConfig(nf.config); err == nil {
		nodeName = cfg.NodeName
	}
	kubeLog := log.Named("kubernetes")
	// client-go logs through klog; send it to vipgate's log instead of klog's own stderr format.
	routeKlog(kubeLog.Named("client-go"))
	ks := cluster.NewKubeSource(restCfg, nodeName, kubeLog)
	// BGPPeer passwordSecret: the basic-auth Secrets of vipgate's own namespace (POD_NAMESPACE from
	// the downward API), as MetalLB's speaker reads its own; only those --bgp-password-secrets
	// names, each by name (the RBAC grants them by resourceNames).
	if ns := os.Getenv(podNamespaceEnv); ns != "" {
		var names []string
		for _, n := range strings.Split(nf.bgpSecrets, ",") {
			if n = strings.TrimSpace(n); n == "" {
				continue
			}
			if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
				return nil, fmt.Errorf("--bgp-password-secrets: %q is not a Secret name: %s", n, strings.Join(errs, "; "))
			}
			names = append(names, n)
		}
		ks.WatchBGPSecrets(ns, names)
	}
	return kubeSource{ks}, nil
}

// podNamespaceEnv names vipgate's own namespace (deploy/ sets it from the downward API).
const podNamespaceEnv = "POD_NAMESPACE"

// kubeRESTConfig loads the client configuration for --kubeconfig.
func kubeRESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == inClusterKubeconfig {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("--kubeconfig=%s: %w", inClusterKubeconfig, err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "vipgate-node/" + version
	return cfg, nil
}

// inPod reports whether vipgate runs in a Kubernetes pod with a service account.
func inPod() bool {
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" || os.Getenv("KUBERNETES_SERVICE_PORT") == "" {
		return false
	}
	_, err := os.Stat(serviceAccountToken)
	return err == nil
}

// routeKlog sends klog's output (client-go logs through it) to log. klog filters V(n) lines by its
// own -v flag before any sink sees them, so the flag follows vipgate's log level.
func routeKlog(log hclog.Logger) {
	verbosity := "0"
	switch {
	case log.IsTrace():
		verbosity = "4"
	case log.IsDebug():
		verbosity = "2"
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", verbosity); err != nil {
		log.Warn("setting client-go log verbosity", "err", err)
	}
	klog.SetLogger(logr.New(&klogSink{log: log}))
}

// klogSink is a logr sink that writes client-go's klog output to an hclog logger. client-go's info
// lines ("caches populated") are debug detail for vipgate, its V(n) lines trace; its errors are
// mostly transient (a watch that broke while the API server restarts) and client-go retries them,
// so they are warnings.
type klogSink struct {
	log hclog.Logger
}

func (s *klogSink) Init(logr.RuntimeInfo) {}

func (s *klogSink) Enabled(level int) bool {
	if level == 0 {
		return s.log.IsDebug()
	}
	return s.log.IsTrace()
}

func (s *klogSink) Info(level int, msg string, kv ...any) {
	if level == 0 {
		s.log.Debug(msg, kv...)
	} else {
		s.log.Trace(msg, kv...)
	}
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.log.Warn(msg, append(kv, "err", err)...)
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink { return &klogSink{log: s.log.With(kv...)} }

func (s *klogSink) WithName(name string) logr.LogSink { return &klogSink{log: s.log.Named(name)} }
