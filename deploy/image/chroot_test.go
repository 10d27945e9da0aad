package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestAgnhostToolsInChroot builds the agnhost test image from the TestImages table (with a stand-in
// for agnhost itself), unpacks its layer and runs the tools e2e tests exec in agnhost pods through
// its /bin/sh in a chroot: the dynamically linked ones prove their libraries and loader came along.
func TestAgnhostToolsInChroot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs programs in a chroot")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot")
	}
	for _, p := range []string{"/bin/busybox", "/usr/bin/curl", "/bin/nc.openbsd", "/usr/bin/dig", "/usr/bin/ldd", "/usr/sbin/chroot"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("needs %s (Debian busybox-static, curl, netcat-openbsd, bind9-dnsutils; make test-images installs them)", p)
		}
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "agnhost"), []byte("#!/bin/sh\necho agnhost \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var spec *Spec
	for _, s := range TestImages(bin) {
		if f, _ := archiveName(s.Name); f == "agnhost.tar" {
			spec = &s
		}
	}
	if spec == nil {
		t.Fatal("no agnhost in TestImages")
	}
	opts := testOpts
	opts.Platform.Arch = runtime.GOARCH
	_, file := build(t, *spec, opts)

	layout := extractArchive(t, file)
	var index v1.IndexManifest
	if err := json.Unmarshal(readFile(t, filepath.Join(layout, "index.json")), &index); err != nil {
		t.Fatal(err)
	}
	var manifest v1.Manifest
	d := index.Manifests[0].Digest
	if err := json.Unmarshal(readFile(t, filepath.Join(layout, "blobs", d.Algorithm, d.Hex)), &manifest); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	l := manifest.Layers[0].Digest
	if out, err := exec.Command("tar", "-xzf", filepath.Join(layout, "blobs", l.Algorithm, l.Hex), "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("unpacking the layer: %v\n%s", err, out)
	}

	for _, script := range []string{
		"curl --version",
		"nc -h 2>&1 | grep -q OpenBSD",             // -z, -u, -v: not busybox's nc
		"wget --version 2>&1 | grep -q 'GNU Wget'", // Debian's: the static busybox's wget crashes
		"dig -v",
		"nslookup 2>&1 | grep -q Usage",
		"ip -V 2>&1 | grep -q BusyBox",
		// No /dev in a bare chroot (the runtime provides it), so no redirection to /dev/null.
		"h=$(hostname) && l=$(ls /) && p=$(cat /etc/passwd) && sleep 0 && echo ok | grep -q ok",
		"/agnhost pause | grep -q 'agnhost pause'",
	} {
		out, err := exec.Command("chroot", root, "/bin/sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Errorf("chroot /bin/sh -c %q: %v\n%s", script, err, out)
		}
	}
}
