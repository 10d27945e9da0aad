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
