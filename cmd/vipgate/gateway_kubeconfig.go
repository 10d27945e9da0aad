package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/vipgate/vipgate/cluster"
)

const gatewayKubeconfigHelp = `Usage: vipgate gateway kubeconfig --server URL [flags] > /etc/vipgate/kubeconfig

Prints a kubeconfig for a gateway VM: the ServiceAccount vipgate-gateway (deploy/manifests/
12-rbac-gateway.yaml, or the chart with gateway.rbac.create=true), a token of it and the cluster's
CA, for the API server at --server as the gateway reaches it. It runs with an administrator's
kubeconfig (--kubeconfig, else $KUBECONFIG or ~/.kube/config), which only asks for the token: the
printed kubeconfig holds none of the administrator's credentials.

The token comes from the TokenRequest API and expires after --duration (run this again before,
and restart the gateway); with --secret it is a long-lived service-account-token Secret
(vipgate-gateway-token), valid until the Secret is deleted, which kube-controller-manager fills.

Flags:
`

func runGatewayKubeconfig(args []string) error {
	fs := flag.NewFlagSet("gateway kubeconfig", flag.ContinueOnError)
	o := cluster.GatewayKubeconfigOptions{}
	fs.StringVar(&o.Server, "server", "", "the API server's URL as the gateway reaches it (https://ADDRESS:6443)")
	fs.StringVar(&o.Namespace, "namespace", "vipgate-system", "namespace of the gateway's ServiceAccount")
	fs.StringVar(&o.ServiceAccount, "service-account", "vipgate-gateway", "the gateway's ServiceAccount")
	fs.DurationVar(&o.Duration, "duration", 8760*time.Hour, "lifetime of the token (TokenRequest; the API server may cap it)")
	fs.BoolVar(&o.Secret, "secret", false, "use a long-lived token Secret (<service-account>-token) instead of a TokenRequest token")
	admin := fs.String("kubeconfig", "", "an administrator's kubeconfig, used to ask for the token (default: $KUBECONFIG, else ~/.kube/config)")
	caFile := fs.String("ca-file", "", "CA bundle (PEM) that verifies --server (default: the administrator's kubeconfig's, else ConfigMap kube-root-ca.crt)")
	output := fs.String("output", "", "write the kubeconfig to this file (mode 0600) instead of standard output")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), gatewayKubeconfigHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gateway kubeconfig: unexpected arguments %q", fs.Args())
	}
	if *caFile != "" {
		ca, err := os.ReadFile(*caFile)
		if err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
		o.CAData = ca
	}
	if err := o.Validate(); err != nil {
		return err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *admin
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the administrator's kubeconfig (--kubeconfig): %w", err)
	}
	restCfg.UserAgent = "vipgate-gateway-kubeconfig/" + version
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	creds, err := cluster.MakeGatewayKubeconfig(ctx, restCfg, o)
	if err != nil {
		return err
	}
	if *output == "" {
		if _, err := os.Stdout.Write(creds.Kubeconfig); err != nil {
			return err
		}
	} else if err := writePrivateFile(*output, creds.Kubeconfig); err != nil {
		return err
	}
	// What the administrator must remember goes to stderr, so stdout stays the kubeconfig alone.
	who := o.Namespace + "/" + o.ServiceAccount
	switch {
	case creds.SecretName != "":
		fmt.Fprintf(os.Stderr, "token of %s from Secret %s/%s: valid until that Secret is deleted\n", who, o.Namespace, creds.SecretName)
	case creds.Expires.Before(time.Now().Add(o.Duration - time.Minute)):
		fmt.Fprintf(os.Stderr, "warning: the API server shortened the token of %s: it expires %s (asked: %v); run this again before then\n",
			who, creds.Expires.Format(time.RFC3339), o.Duration)
	default:
		fmt.Fprintf(os.Stderr, "token of %s expires %s: run this again before then\n", who, creds.Expires.Format(time.RFC3339))
	}
	return nil
}

// writePrivateFile writes b to path readable by its owner only (it holds a bearer token).
func writePrivateFile(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	// An existing file keeps its mode on open: make it private before the token is in it.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("--output: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("--output: %w", err)
	}
	return f.Close()
}
