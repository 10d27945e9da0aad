package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// privateContainerd starts a containerd of its own (root, state, sockets and opt dir in a temporary
// directory; the CRI plugin disabled) and returns its socket address. It never touches the host's
// /run/containerd or /var/lib/containerd; the daemon is killed by PID and the directory removed
// when the test ends, also on failure.
func privateContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containerd")
	}
	for _, tool := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on PATH", tool)
		}
	}
	// A short path: unix socket addresses are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "vgctr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	configFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", configFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("containerd log:\n%s", lastLines(string(b), 30))
			}
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if err := exec.CommandContext(ctx, "ctr", "--address", sock, "version").Run(); err == nil {
			return sock
		}
		select {
		case <-ctx.Done():
			t.Fatalf("containerd did not answer on %s within 30s", sock)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestContainerdImport checks that containerd imports the archive (and unpacks its layer) under the
// name from index.json.
func TestContainerdImport(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	sock := privateContainerd(t)
	opts := testOpts
	opts.Platform.Arch = runtime.GOARCH // ctr imports the host's platform only
	r, file := build(t, VipgateSpec(fakeBinary(t, "binary"), "0.2.0"), opts)

	ctr := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ctr", append([]string{"--address", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ctr("images", "import", file)
	list := ctr("images", "ls")
	var found bool
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "ghcr.io/vipgate/vipgate:0.2.0" {
			found = true
			if f[2] != r.Digest.String() {
				t.Errorf("imported digest %s, built %s", f[2], r.Digest)
			}
		}
	}
	if !found {
		t.Errorf("ctr images ls does not list ghcr.io/vipgate/vipgate:0.2.0:\n%s", list)
	}
	// All content present, and unpacked into the default snapshotter (the layer's diff ID matched).
	check := ctr("images", "check")
	for _, line := range strings.Split(check, "\n") {
		if strings.HasPrefix(line, "ghcr.io/vipgate/vipgate:0.2.0 ") &&
			(!strings.Contains(line, "complete") || !strings.HasSuffix(strings.TrimSpace(line), "true")) {
			t.Errorf("ctr images check: not complete and unpacked:\n%s", check)
		}
	}
}

// TestContainerdImportIndex: containerd imports the multi-platform archive (vipgate-index) with
// every platform's content, under the name from index.json and the index's digest, and unpacks the
// host's image.
func TestContainerdImportIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	sock := privateContainerd(t)
	r, file := buildIndex(t, fakeBinary(t, "amd64 binary"), fakeBinary(t, "arm64 binary"))
	ctr := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ctr", append([]string{"--address", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ctr("images", "import", "--all-platforms", file)
	list := ctr("images", "ls")
	var found bool
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "ghcr.io/vipgate/vipgate:0.2.0" {
			found = true
			if f[1] != "application/vnd.oci.image.index.v1+json" || f[2] != r.Digest.String() {
				t.Errorf("imported %s %s, built an image index %s", f[1], f[2], r.Digest)
			}
			if !strings.Contains(line, "linux/amd64") || !strings.Contains(line, "linux/arm64") {
				t.Errorf("imported platforms: %s; want linux/amd64 and linux/arm64", line)
			}
		}
	}
	if !found {
		t.Errorf("ctr images ls does not list ghcr.io/vipgate/vipgate:0.2.0:\n%s", list)
	}
	check := ctr("images", "check")
	for _, line := range strings.Split(check, "\n") {
		if strings.HasPrefix(line, "ghcr.io/vipgate/vipgate:0.2.0 ") && !strings.Contains(line, "complete (") {
			t.Errorf("ctr images check: not complete:\n%s", check)
		}
	}
}
