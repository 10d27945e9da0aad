package maglev

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vipgate/vipgate/cluster"
)

func mgNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.244.%d.%d:8080", i/200, 10+i%200)
	}
	return out
}

// mgShares counts the slots of each backend name.
func mgShares(names []string, table []int) map[string]int {
	out := map[string]int{}
	for _, i := range table {
		out[names[i]]++
	}
	return out
}

// mgMoved counts the slots whose backend differs between two tables (by name).
func mgMoved(aNames []string, a []int, bNames []string, b []int) int {
	moved := 0
	for i := range a {
		if aNames[a[i]] != bNames[b[i]] {
			moved++
		}
	}
	return moved
}

func TestMaglevTableFillsEverySlotAndIsOrderFree(t *testing.T) {
	names := mgNames(7)
	a, err := Table(names, DefaultSize)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != DefaultSize {
		t.Fatalf("table has %d slots, want %d", len(a), DefaultSize)
	}
	for i, v := range a {
		if v < 0 || v >= len(names) {
			t.Fatalf("slot %d holds %d", i, v)
		}
	}
	// Another gateway that learned the backends in another order builds the same table (by name).
	shuffled := slices.Clone(names)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b, err := Table(shuffled, DefaultSize)
	if err != nil {
		t.Fatal(err)
	}
	if moved := mgMoved(names, a, shuffled, b); moved != 0 {
		t.Errorf("the same backends in another order moved %d slots, want 0", moved)
	}
}

func TestMaglevTableErrors(t *testing.T) {
	if _, err := Table(mgNames(2), 1000); err == nil {
		t.Errorf("size 1000 (not a prime) accepted")
	}
	if _, err := Table(mgNames(12), 11); err == nil {
		t.Errorf("12 backends in 11 slots accepted")
	}
	if tb, err := Table(nil, 251); err != nil || tb != nil {
		t.Errorf("no backends: %v, %v; want nil, nil", tb, err)
	}
	if tb, err := Table([]string{"a"}, 251); err != nil || len(mgShares([]string{"a"}, tb)) != 1 {
		t.Errorf("one backend: %v", err)
	}
}

// The Maglev balance property: each backend owns close to M/N slots. The paper bounds the spread;
// we require every share within 10% of M/N (1.5 slots of slack for the integer rounding) and log the
// worst figures per size.
func TestMaglevDistribution(t *testing.T) {
	for _, m := range []int{251, 1021, 4093} {
		for _, n := range []int{2, 3, 5, 10, 25} {
			if n*4 > m {
				continue
			}
			names := mgNames(n)
			table, err := Table(names, m)
			if err != nil {
				t.Fatal(err)
			}
			shares := mgShares(names, table)
			ideal := float64(m) / float64(n)
			lo, hi := m, 0
			for _, name := range names {
				lo, hi = min(lo, shares[name]), max(hi, shares[name])
			}
			t.Logf("M=%d N=%d: shares %d..%d (ideal %.1f, spread %.1f%%)", m, n, lo, hi, ideal, 100*float64(hi-lo)/ideal)
			if float64(hi) > ideal*1.1+1.5 || float64(lo) < ideal*0.9-1.5 {
				t.Errorf("M=%d N=%d: shares %d..%d too far from %.1f", m, n, lo, hi, ideal)
			}
		}
	}
}

// The Maglev disruption property: adding a backend to N moves about M/(N+1) slots (the new backend's
// share), removing one about M/N (its share), plus a few slots that change hands between the others;
// `hash mod N` would move almost all of them. The excess grows with N²/M: measured (worst over which
// backend is removed), in units of 1/N of the table:
//
//	M      N=5        N=10       N=20       N=50      (add / remove)
//	1021   0.91/1.06  1.16/1.30  1.78/1.92  3.77/3.43
//	4093   0.86/1.03  1.17/1.12  1.35/1.48  2.19/2.30
//	16381  0.84/1.01  0.95/1.05  1.08/1.15  1.53/1.58
//	65537  0.84/1.00  0.94/1.02  1.01/1.08  1.19/1.25
//
// so the bound of 1.5/N holds for N up to 10 at the default size and up to 20 at 4093; larger sets
// want a larger maglevTableSize (docs/gateway.md).
func TestMaglevDisruption(t *testing.T) {
	for _, c := range []struct{ m, maxN int }{{251, 3}, {DefaultSize, 10}, {4093, 20}} {
		m := c.m
		for n := 2; n <= c.maxN; n++ {
			names := mgNames(n + 1)
			before, err := Table(names[:n], m)
			if err != nil {
				t.Fatal(err)
			}
			after, err := Table(names, m)
			if err != nil {
				t.Fatal(err)
			}
			moved := mgMoved(names[:n], before, names, after)
			if frac := float64(moved) / float64(m); frac > 1.5/float64(n) {
				t.Errorf("M=%d: adding a backend to %d moved %.1f%% of the slots, want <= %.1f%%", m, n, 100*frac, 150/float64(n))
			}
			worst := 0
			for r := 0; r < n; r++ {
				rest := slices.Delete(slices.Clone(names[:n]), r, r+1)
				removed, err := Table(rest, m)
				if err != nil {
					t.Fatal(err)
				}
				worst = max(worst, mgMoved(names[:n], before, rest, removed))
			}
			if frac := float64(worst) / float64(m); frac > 1.5/float64(n) {
				t.Errorf("M=%d: removing one of %d backends moved up to %.1f%% of the slots, want <= %.1f%%", m, n, 100*frac, 150/float64(n))
			}
			if n == c.maxN {
				t.Logf("M=%d N=%d: adding one moved %d slots (%.2f/N), removing one up to %d (%.2f/N)", m, n,
					moved, float64(moved*n)/float64(m), worst, float64(worst*n)/float64(m))
			}
		}
	}
}

func TestSizeFor(t *testing.T) {
	for _, c := range []struct{ n, want int }{{0, 1021}, {1, 1021}, {10, 1021}, {11, 2039}, {20, 2039}, {21, 4093}, {50, 8191}, {163, 16381}, {300, 32749}, {655, 65537}, {5000, 65537}} {
		if got := SizeFor(c.n); got != c.want {
			t.Errorf("SizeFor(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	for _, m := range Sizes {
		if !IsPrime(m) {
			t.Errorf("%d is not prime", m)
		}
	}
}

// TestIsPrime: IsPrime agrees with a sieve of Eratosthenes up to past MaxSize, every size a table or
// the configuration can have, and refuses what is not a size at all.
func TestIsPrime(t *testing.T) {
	const n = MaxSize + 1000
	composite := make([]bool, n)
	for i := 2; i*i < n; i++ {
		if !composite[i] {
			for j := i * i; j < n; j += i {
				composite[j] = true
			}
		}
	}
	primes := 0
	for i := range n {
		want := i >= 2 && !composite[i]
		if IsPrime(i) != want {
			t.Errorf("IsPrime(%d) = %v, want %v", i, !want, want)
		}
		if want {
			primes++
		}
	}
	for _, bad := range []int{-7, -1, 0, 1} {
		if IsPrime(bad) {
			t.Errorf("IsPrime(%d) = true", bad)
		}
	}
	t.Logf("%d primes below %d agree", primes, n)
}

// TestConfiguredSizes: the sizes a gateway's configuration accepts (maglevTableSize, validated in
// cluster, which may not import this package) are exactly the primes from 251 to MaxSize, so every
// size the configuration lets through is one Table takes.
func TestConfiguredSizes(t *testing.T) {
	c, err := cluster.ParseGatewayConfig([]byte("apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"))
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for m := 0; m <= MaxSize+100; m++ {
		c.MaglevTableSize = m
		err := c.Validate()
		want := m == 0 || (m >= 251 && m <= MaxSize && IsPrime(m)) // 0: the default
		if (err == nil) != want {
			t.Errorf("maglevTableSize %d: Validate() = %v, want accepted=%v", m, err, want)
		}
		if err == nil && m != 0 {
			accepted++
		}
	}
	t.Logf("%d table sizes accepted", accepted)
}
