package natpath

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestObjectUpToDate rebuilds the programs with `make bpf` (clang) and compares them with the
// committed objects, byte for byte: the objects the package embeds are the builds of bpf/natpath.c
// (tc, and XDP).
// Skipped where clang or make is not installed (make test installs clang).
func TestObjectUpToDate(t *testing.T) {
	for _, bin := range []string{"make", "clang-14", "llvm-strip-14", "gcc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s: the object is not rebuilt here", bin)
		}
	}
	dir := t.TempDir()
	out, xdpOut := filepath.Join(dir, "natpath_bpfel.o"), filepath.Join(dir, "natpath_xdp_bpfel.o")
	cmd := exec.Command("make", "-s", "-C", "../..", "bpf", "BPF_OUT="+out, "BPF_XDP_OUT="+xdpOut)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make bpf: %v\n%s", err, b)
	}
	for _, o := range []struct {
		path, name string
		embedded   []byte
	}{{out, "natpath_bpfel.o", object}, {xdpOut, "natpath_xdp_bpfel.o", xdpObject}} {
		built, err := os.ReadFile(o.path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(built, o.embedded) {
			t.Errorf("gateway/natpath/%s is not the build of bpf/natpath.c (%d bytes built, %d committed): run `make bpf` and commit the objects", o.name, len(built), len(o.embedded))
		}
	}
}
