package dataplane

import (
	"fmt"
	"hash/fnv"
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
// kernel computes the slot with jhash (see gateway_ir.go).

// DefaultMaglevSize is the gateway's table size: the number of slots, and so of map elements, per VIP
// port. It must be prime (the permutations below then visit every slot). Maglev wants M well above
// the number of backends N: the largest backend share exceeds the smallest by at most about N/M of
// the table. 1021 keeps that under ~5% up to ~50 backends while one VIP port costs 1021 elements
// (~1 ms of kernel time to add, measured in gateway_bench_test.go); the paper's 65537 would cost 64
// times that for every VIP port, for a balance gain no gateway in front of a bare-metal cluster needs.
const DefaultMaglevSize = 1021

// MaglevTable returns the Maglev lookup table of size m (a prime) for the named backends: entry i is
// the index in names of the backend owning slot i. names must be distinct; their order does not
// matter (ties are broken by name, so every caller with the same set gets the same table). With no
// names it returns nil.
func MaglevTable(names []string, m int) ([]int, error) {
	if m < 2 || !isPrime(m) {
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
		offset[k] = maglevHash("offset", names[i]) % uint64(m)
		skip[k] = maglevHash("skip", names[i])%uint64(m-1) + 1
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

// maglevHash is a stable 64-bit hash of a backend name (FNV-1a with a salt), the same on every
// gateway and every Go version.
func maglevHash(salt, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(salt))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return h.Sum64()
}

func sortIndexByName(idx []int, names []string) {
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(names[a], names[b]) })
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}
