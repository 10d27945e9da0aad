// Package maglev builds Maglev consistent-hashing lookup tables (pure: no kernel, no cluster model).
// The gateway and the node's maglev algorithm program them as nftables map elements, the gateway's
// NAT fast path as BPF maps; FlowSlot is the slot a flow takes (slot.go), the same in both.
package maglev

import (
	"fmt"
	"hash/fnv"
	"math/big"
	"slices"
	"strings"
)

// Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
// Balancer", NSDI 2016, section 3.4), used by the gateway so that
//
//   - two gateways that see the same backends build the same table, whatever order they learned them
//     in, so a router's ECMP may send the packets of one flow to either gateway and both pick the same
//     backend;
//   - a backend that comes or goes moves only about 1/N of the table's slots (the flows hashed there),
//     not all of them as `hash mod N` would.
//
// The table maps a slot (a hash of the flow's addresses and ports modulo the table size M) to a
// backend. The gateway programs it as nftables map elements (vip, proto, port, slot) -> backend; the
// kernel computes the slot with jhash (see dataplane/gateway_ir.go).

// DefaultSize is the smallest table size: the number of slots, and so of map elements, per VIP
// port (or, on a node, per Service entry with the maglev algorithm). It must be prime (the
// permutations below then visit every slot).
const DefaultSize = 1021

// MaxSize caps the derived table size: 65,537 slots are the Maglev paper's table. Measured on
// this kernel (6.18; one map loaded with nft -f in a fresh namespace, slab growth and system time):
// an element costs ~95 bytes of kernel memory, so 1,021 slots ~0.15 MiB, 8,191 ~0.8 MiB and 65,537
// ~5.9 MiB and 0.14 s of kernel time per VIP port. Beyond ~650 backends per VIP port the table
// stays at this cap and the imbalance grows past 1% (N/M).
const MaxSize = 65537

// Sizes are the table sizes SizeFor chooses from: primes about doubling, so that the
// size (and with it every flow's slot) changes only when the number of backends doubles.
var Sizes = []int{DefaultSize, 2039, 4093, 8191, 16381, 32749, MaxSize}

// SizeFor returns the table size for n backends: the smallest of Sizes that is at least
// 100·n (Maglev's M > 100·N, for which the slot shares of the backends differ by at most ~1%),
// capped at MaxSize. It depends on n alone, so every gateway that sees the same backends
// derives the same size and so the same table.
func SizeFor(n int) int {
	for _, m := range Sizes {
		if m >= 100*n {
			return m
		}
	}
	return MaxSize
}

// NodeSizes are the table sizes NodeSizeFor chooses from: Sizes with three smaller primes in
// front, each about double the one before and at least 100 times a backend count (101 for one
// backend, 211 for two, 421 for four).
var NodeSizes = append([]int{101, 211, 421}, Sizes...)

// NodeSizeFor returns the table size of a node's maglev algorithm for n backends: the smallest of
// NodeSizes that is at least 100·n, capped at MaxSize. A node builds one table per Service entry
// (ports x addresses), so a table sized to its backends is what keeps a Service of many ports and
// few endpoints cheap: one endpoint costs 101 elements per entry, not DefaultSize. The price is
// that a Service growing from 1 to 2 to 4 endpoints changes its size (and every flow's slot) at
// each doubling, as it does beyond 10 endpoints with Sizes; a node's tables are still the same on
// every node. The gateway keeps SizeFor (its tables are the NAT fast path's too).
func NodeSizeFor(n int) int {
	for _, m := range NodeSizes {
		if m >= 100*n {
			return m
		}
	}
	return MaxSize
}

// Table returns the Maglev lookup table of size m (a prime) for the named backends: entry i is
// the index in names of the backend owning slot i. names must be distinct; their order does not
// matter (ties are broken by name, so every caller with the same set gets the same table). With no
// names it returns nil.
func Table(names []string, m int) ([]int, error) {
	if m < 2 || !IsPrime(m) {
		return nil, fmt.Errorf("maglev table size %d is not a prime", m)
	}
	n := len(names)
	if n == 0 {
		return nil, nil
	}
	if n > m {
		return nil, fmt.Errorf("maglev: %d backends do not fit a table of %d slots", n, m)
	}
	// Fill in name order so the result does not depend on the caller's order.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sortIndexByName(order, names)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	next := make([]uint64, n)
	for k, i := range order {
		offset[k] = hash("offset", names[i]) % uint64(m)
		skip[k] = hash("skip", names[i])%uint64(m-1) + 1
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for {
		for k, i := range order {
			// The k-th backend's preference list is offset + j*skip (mod m), j = 0, 1, ...; it takes
			// its first preference that is still free.
			c := (offset[k] + next[k]*skip[k]) % uint64(m)
			for table[c] >= 0 {
				next[k]++
				c = (offset[k] + next[k]*skip[k]) % uint64(m)
			}
			table[c] = i
			next[k]++
			filled++
			if filled == m {
				return table, nil
			}
		}
	}
}

// hash is a stable 64-bit hash of a backend name (FNV-1a with a salt), the same on every
// gateway and every Go version.
func hash(salt, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(salt))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return h.Sum64()
}

func sortIndexByName(idx []int, names []string) {
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(names[a], names[b]) })
}

// IsPrime reports whether n is a prime (a valid table size). It is math/big's test, documented as
// 100% accurate below 2^64, so exact for every int. cluster's validation of a configured
// maglevTableSize uses the same test (it may not import this package): the configuration and the
// tables cannot disagree about a size.
func IsPrime(n int) bool {
	return n >= 2 && big.NewInt(int64(n)).ProbablyPrime(0)
}
