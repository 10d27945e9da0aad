package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// labMemberKey is the membership key of the lab's speakers (the same on every node of a test).
const labMemberKey = "e2e-lab-membership-key-0123456789abcdef0123456789abcdef"

// memberKeyArgs writes a membership key file for the test and returns the flag that hands it to
// `vipgate node` / `vipgate gateway`: without a key the L2 speaker refuses to announce.
func memberKeyArgs(t *testing.T, keys ...string) []string {
	t.Helper()
	if len(keys) == 0 {
		keys = []string{labMemberKey}
	}
	f, err := os.CreateTemp(t.TempDir(), "memberkey")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, k := range keys {
		if _, err := f.WriteString(k + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"--member-key-file", filepath.Clean(f.Name())}
}
