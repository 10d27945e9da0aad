package main

import (
	"context"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// nodeSpeaker announces this node's LoadBalancer IPs (L2 or BGP). Update is called after every
// successful dataplane sync with the snapshot it programmed.
type nodeSpeaker interface {
	Update(st *cluster.State, rep *dataplane.SyncReport)
	Stop()
}

type noSpeaker struct{}

func (noSpeaker) Update(*cluster.State, *dataplane.SyncReport) {}
func (noSpeaker) Stop()                                        {}

// startSpeaker starts the announcement side of the node (none yet: the speaker issues add it).
func startSpeaker(ctx context.Context, cfg *cluster.NodeConfig, log hclog.Logger) (nodeSpeaker, error) {
	return noSpeaker{}, nil
}
