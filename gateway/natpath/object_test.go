package natpath

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestObjectUpToDate rebuilds the program with `make bpf` (clang) and compares it with the
// committed object, byte for byte: the object the package embeds is the build of bpf/natpath.c.
// Skipped where clang or make is not installed (make test installs clang).
func TestObjectUpToDate(t *testing.T) {
	for _, bin := range []string{"make", "clang-14", "llvm-strip-14", "gcc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s: the object is not rebuilt here", bin)
		}
	}
	out := filepath.Join(t.TempDir(), "natpath_bpfel.o")
	cmd := exec.Command("make", "-s", "-C", "../..", "bpf", "BPF_OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make bpf: %v\n%s", err, b)
	}
	built, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, object) {
		t.Fatalf("gateway/natpath/natpath_bpfel.o is not the build of bpf/natpath.c (%d bytes built, %d committed): run `make bpf` and commit the object", len(built), len(object))
	}
}
