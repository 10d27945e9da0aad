//go:build linux

package main

import "time"

// proxierConfig is what the driver sets of kube-proxy's configuration; everything else is kube-proxy's
// default for nftables mode. The two NewProxier signatures (v1.36: arguments, v1.37: a
// KubeProxyConfiguration) are in proxier_v1_36.go and proxier_v1_37.go.
type proxierConfig struct {
	syncPeriod, minSyncPeriod time.Duration
	masqueradeBit             int32 // kube-proxy's default for nftables: 14
	nodePortAddresses         []string
}
