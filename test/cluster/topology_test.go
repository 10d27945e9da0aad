package testcluster

import "testing"

// TestNodeZone: one zone per node, distinct (no cluster needed).
func TestNodeZone(t *testing.T) {
	seen := map[string]bool{}
	for i, want := range map[int]string{1: "zone-a", 2: "zone-b", 26: "zone-z", 27: "zone-27"} {
		if got := NodeZone(i); got != want {
			t.Errorf("NodeZone(%d) = %q, want %q", i, got, want)
		}
	}
	for i := 1; i <= 40; i++ {
		z := NodeZone(i)
		if seen[z] {
			t.Errorf("zone %q twice", z)
		}
		seen[z] = true
	}
}
