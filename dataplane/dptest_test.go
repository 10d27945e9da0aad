package dataplane

import "github.com/vipgate/vipgate/dataplane/dptest"

// The helpers the engine's tests share with the proxy's and the gateway's (dataplane/dptest).
var testNetns = dptest.Netns
