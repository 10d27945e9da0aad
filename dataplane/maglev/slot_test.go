package maglev

import "testing"

// jhash against the kernel's lookup3 reference values (hashlittle from Bob Jenkins' lookup3.c, which
// the kernel's jhash equals on little-endian machines): hashlittle("", 0) = 0xdeadbeef,
// hashlittle("Four score and seven years ago", 0) = 0x17770551, and with initval 1 = 0xcd628161.
func TestJhashReference(t *testing.T) {
	for _, c := range []struct {
		in   string
		seed uint32
		want uint32
	}{
		{"", 0, 0xdeadbeef},
		{"Four score and seven years ago", 0, 0x17770551},
		{"Four score and seven years ago", 1, 0xcd628161},
	} {
		if got := Jhash([]byte(c.in), c.seed); got != c.want {
			t.Errorf("Jhash(%q, %d) = %#x, want %#x", c.in, c.seed, got, c.want)
		}
	}
}

// DeriveHashSeed: a pure function of the key (every gateway holding it agrees), different keys
// give different seeds, never 0 (nftables' "random"), and not the public default.
func TestDeriveHashSeed(t *testing.T) {
	a, b := []byte("0123456789abcdef0123456789abcdef"), []byte("0123456789abcdef0123456789abcdeF")
	if x, y := DeriveHashSeed(a), DeriveHashSeed(a); x != y {
		t.Fatal("not deterministic")
	}
	seen := map[uint32]bool{}
	for _, k := range [][]byte{a, b, nil, []byte("x")} {
		s := DeriveHashSeed(k)
		if s == 0 || s == DefaultHashSeed || seen[s] {
			t.Errorf("seed %#x of key %q: zero, the default, or another key's", s, k)
		}
		seen[s] = true
	}
}
