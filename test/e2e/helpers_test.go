package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vipgate/vipgate/test/lab"
)

// Helpers every end-to-end test shares.

// vipgateBinary returns $VIPGATE_BIN (as `make test` sets it), or builds vipgate for this test.
func vipgateBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("VIPGATE_BIN"); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			t.Fatalf("VIPGATE_BIN: %v", err)
		}
		return abs
	}
	out := filepath.Join(t.TempDir(), "vipgate")
	if err := lab.BuildBinary("github.com/vipgate/vipgate/cmd/vipgate", out); err != nil {
		t.Fatal(err)
	}
	return out
}

// labNodeConfig is the plain NodeConfig of a lab node (lab.NodeConfig).
func labNodeConfig(n *lab.Node) string { return lab.NodeConfig(n) }
