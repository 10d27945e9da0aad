package main

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"

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

// newSource picks the source the flags ask for.
func newSource(nf *nodeFlags, log hclog.Logger) (source, error) {
	switch {
	case nf.manifests != "" && nf.kubeconfig != "":
		return nil, errors.New("--manifests and --kubeconfig are exclusive")
	case nf.manifests != "":
		fs := cluster.NewFileSource(nf.manifests, log.Named("manifests"))
		fs.AllowWorldWritable = nf.allowWorldWritable
		return fileSource{fs}, nil
	case nf.kubeconfig != "":
		return nil, errors.New("--kubeconfig: the Kubernetes source is not available in this build yet; use --manifests")
	}
	return nil, errors.New("one of --manifests or --kubeconfig is required")
}
