package lab

import (
	"os"
	"os/exec"
	"testing"
)

// NewForTest builds a lab for a test: it skips the test unless it runs as
// root with iproute2 available, logs through t.Logf, fails the test if the
// lab cannot be built and closes the lab in t.Cleanup (which also runs when
// the test fails or panics).
func NewForTest(t testing.TB, spec Spec) *Lab {
	t.Helper()
	SkipUnlessRoot(t)
	if spec.WorkDir == "" {
		spec.WorkDir = t.TempDir()
	}
	l, err := New(spec, t.Logf)
	if err != nil {
		t.Fatalf("building lab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("closing lab: %v", err)
		}
	})
	return l
}

// SkipUnlessRoot skips the test unless it runs as root and `ip` exists.
func SkipUnlessRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
}
