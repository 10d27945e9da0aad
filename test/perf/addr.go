package main

import "net/netip"

type (
	netipAddr   = netip.Addr
	netipPrefix = netip.Prefix
)

func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
