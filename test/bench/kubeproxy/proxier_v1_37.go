//go:build linux && !kubeproxy136

package main

import (
	"context"
	"net"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	kubeproxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
)

// kubernetesVersion is the k8s.io/kubernetes version go.mod requires.
const kubernetesVersion = "v1.37.2"

// newProxier builds the IPv4 nftables Proxier as cmd/kube-proxy/app/server_linux.go does (no
// healthz server, not init-only). v1.37 takes the KubeProxyConfiguration itself.
func newProxier(ctx context.Context, c proxierConfig, local proxyutil.LocalTrafficDetector, nodeName string, nodeIP net.IP) (*nftables.Proxier, error) {
	cfg := &kubeproxyconfig.KubeProxyConfiguration{
		SyncPeriod:        metav1.Duration{Duration: c.syncPeriod},
		MinSyncPeriod:     metav1.Duration{Duration: c.minSyncPeriod},
		NodePortAddresses: c.nodePortAddresses,
	}
	cfg.NFTables.MasqueradeBit = &c.masqueradeBit
	return nftables.NewProxier(ctx, cfg, v1.IPv4Protocol, local, nodeName, nodeIP, &events.FakeRecorder{}, nil, false)
}
