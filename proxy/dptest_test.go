package proxy

import "github.com/vipgate/vipgate/dataplane/dptest"

// The helpers dataplane's tests share with the gateway's (dataplane/dptest).
type hostileShape = dptest.HostileShape

var (
	testNetns      = dptest.Netns
	nftList        = dptest.NftList
	nftCheckOrSkip = dptest.NftCheckOrSkip
	nftCheck       = dptest.NftCheck
	hostileService = dptest.HostileService
)
