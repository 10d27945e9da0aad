package membership

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadMemberKeyFile: the key file must be a regular file others cannot read, with keys of at
// least 128 bits. A FIFO is refused at once (before: start-up hung on it), a world-readable file
// and a 64-bit hex key are refused (before: accepted); a Secret volume's layout (symbolic links to
// a 0400 or 0440 file) is accepted.
func TestReadMemberKeyFile(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("0123456789abcdef", 4) // openssl rand -hex 32
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // beyond the umask
			t.Fatal(err)
		}
		return p
	}
	// A Secret volume: key -> ..data/key, ..data -> ..2026_12_07/, the file 0400.
	ts := filepath.Join(dir, "secret", "..2026_12_07_05_00_00.1")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "key"), []byte(good+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.Symlink("..2026_12_07_05_00_00.1", filepath.Join(secret, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/key", filepath.Join(secret, "key")); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"0600", write("k600", good+"\n", 0o600), true},
		{"0400", write("k400", good, 0o400), true},
		{"0440 (defaultMode 0400 and an fsGroup)", write("k440", good, 0o440), true},
		{"a Secret volume's links", filepath.Join(secret, "key"), true},
		{"two keys during a rotation", write("rot", good+"\n"+strings.ToUpper(good)+"\n", 0o600), true},
		{"world-readable (0644, the kubelet's default)", write("k644", good, 0o644), false},
		{"other-readable only", write("k604", good, 0o604), false},
		{"group-writable", write("k660", good, 0o660), false},
		{"a FIFO", fifo, false},
		{"a directory", dir, false},
		{"/dev/zero", "/dev/zero", false},
		{"a 64-bit hex key (16 characters)", write("short", "0123456789abcdef\n", 0o600), false},
		{"31 characters", write("k31", good[:31], 0o600), false},
		{"one short key of two", write("rotshort", good+"\n0123456789abcdef\n", 0o600), false},
		{"missing", filepath.Join(dir, "nothing"), false},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := ReadKeyFile(tc.path)
			done <- err
		}()
		select {
		case err := <-done:
			if (err == nil) != tc.ok {
				t.Errorf("%s: err = %v, want ok = %v", tc.name, err, tc.ok)
			} else if err != nil {
				t.Logf("%s: %v", tc.name, err)
			}
		case <-time.After(10 * time.Second):
			// Deadline, not a timing assertion: the old loader blocks here for ever.
			t.Fatalf("%s: still reading after 10 s (a FIFO with no writer blocks an open without O_NONBLOCK)", tc.name)
		}
	}
	if err := checkKeyFileMode(0o644); !errors.Is(err, errKeyFileMode) {
		t.Errorf("0644: %v, want errKeyFileMode", err)
	}
}
