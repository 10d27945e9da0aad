package gateway

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/dptest"
)

// Helpers shared with the engine's tests (dataplane/dptest).
type hostileShape = dptest.HostileShape

var (
	testNetns            = dptest.Netns
	nftList              = dptest.NftList
	nftCheckOrSkip       = dptest.NftCheckOrSkip
	nftCheck             = dptest.NftCheck
	slicesContainsReason = dptest.ContainsReason
	maxDeviation         = dptest.MaxDeviation
	hostileService       = dptest.HostileService
)

// Test helpers of the dataplane package the gateway's tests use too (copies of unexported ones).

// mtProgrammer accepts every transaction unless fail is set.
type mtProgrammer struct{ fail bool }

func (p *mtProgrammer) Apply(*dataplane.Tx) error {
	if p.fail {
		return errors.New("refused")
	}
	return nil
}

func rdFamilyName(f cluster.Family) string { return fmt.Sprintf("ipv%d", f) }

func trAddrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// trEp is a ready endpoint on node.
func trEp(addr, node string) cluster.Endpoint {
	return cluster.Endpoint{Addresses: trAddrs(addr), Ready: true, Serving: true, NodeName: node}
}

// kernelBytesPerElement is what one map element costs the kernel, measured on 6.18 (slab growth
// of a 50,500-element endpoint map: 101-115 bytes; maglev.MaxSize says ~95 for the gateway's); a
// rule counts cluster.RuleCost elements.
const kernelBytesPerElement = 115

// maxKernelState is issue #27's bound on what any single object may cost the kernel.
const maxKernelState = 16 << 20
