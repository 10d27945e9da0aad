//go:build linux && kubeproxy136

package main

import (
	"context"
	"net"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
)

// kubernetesVersion is the k8s.io/kubernetes version go.136.mod requires.
const kubernetesVersion = "v1.36.3"

// newProxier builds the IPv4 nftables Proxier as cmd/kube-proxy/app/server_linux.go of v1.36 does
// (no healthz server, not init-only, masqueradeAll false).
func newProxier(ctx context.Context, c proxierConfig, local proxyutil.LocalTrafficDetector, nodeName string, nodeIP net.IP) (*nftables.Proxier, error) {
	return nftables.NewProxier(ctx, v1.IPv4Protocol, c.syncPeriod, c.minSyncPeriod, false, int(c.masqueradeBit),
		local, nodeName, nodeIP, &events.FakeRecorder{}, nil, c.nodePortAddresses, false)
}
