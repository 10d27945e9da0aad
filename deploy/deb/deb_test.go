package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repo is the vipgate repository, two levels up from this module.
const repo = "../.."

// fakeBinary is a stand-in for vipgate in the tests of the package's layout, which only copy it.
func fakeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vipgate")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func build(t *testing.T, o Options) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), FileName(o.Version, o.Arch))
	size, err := Build(o, out)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != size {
		t.Fatalf("Build reported %d bytes, wrote %d", size, len(b))
	}
	return b
}

// The same inputs give the same bytes (nfpm orders members and scripts, every time is MTime);
// another version or binary gives other bytes.
func TestReproducible(t *testing.T) {
	o := Options{Binary: fakeBinary(t, "v1"), Version: "0.2.0", Arch: "amd64", Repo: repo, MTime: time.Unix(1700000000, 0)}
	a, b := build(t, o), build(t, o)
	if !bytes.Equal(a, b) {
		t.Fatal("two builds of the same inputs differ")
	}
	o2 := o
	o2.Version = "0.2.1"
	if bytes.Equal(a, build(t, o2)) {
		t.Fatal("another version gave the same package")
	}
	o3 := o
	o3.Binary = fakeBinary(t, "v2")
	if bytes.Equal(a, build(t, o3)) {
		t.Fatal("another binary gave the same package")
	}
}

// The package as dpkg-deb reads it: control fields, conffiles, scripts, and every path with its
// mode and owner.
func TestLayout(t *testing.T) {
	dpkgDeb := need(t, "dpkg-deb")
	o := Options{Binary: fakeBinary(t, "vipgate"), Version: "0.3.0-rc.1", Arch: "arm64", Repo: repo, MTime: time.Unix(0, 0)}
	pkg := filepath.Join(t.TempDir(), "p.deb")
	if err := os.WriteFile(pkg, build(t, o), 0o644); err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		return strings.TrimSpace(runOut(t, dpkgDeb, "-f", pkg, name))
	}
	for name, want := range map[string]string{
		"Package":      "vipgate",
		"Version":      "0.3.0~rc.1", // sorts before 0.3.0
		"Architecture": "arm64",
		"Section":      "net",
		"Depends":      "",
		"Recommends":   "nftables, conntrack",
		"Suggests":     "conntrackd",
	} {
		if got := field(name); got != want {
			t.Errorf("control field %s = %q, want %q", name, got, want)
		}
	}
	if got := runOut(t, dpkgDeb, "-I", pkg, "conffiles"); got != PathConfig+"\n" {
		t.Errorf("conffiles = %q, want only %s", got, PathConfig)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if got := runOut(t, dpkgDeb, "-I", pkg, s); !strings.HasPrefix(got, "#!/bin/sh\n") {
			t.Errorf("%s does not start with #!/bin/sh", s)
		}
	}

	// dpkg-deb -c: "-rwxr-xr-x root/root  7 1970-01-01 00:00 ./usr/bin/vipgate"
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(runOut(t, dpkgDeb, "-c", pkg)), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 {
			t.Fatalf("dpkg-deb -c line %q", line)
		}
		if f[1] != "root/root" || f[3] != "1970-01-01" {
			t.Errorf("%s: owner %s, date %s; want root/root, 1970-01-01 (SOURCE_DATE_EPOCH)", f[5], f[1], f[3])
		}
		if !strings.HasSuffix(f[5], "/") {
			got[strings.TrimPrefix(f[5], ".")] = f[0]
		}
	}
	want := map[string]string{
		PathBinary:    "-rwxr-xr-x",
		PathUnit:      "-rw-r--r--",
		PathConfig:    "-rw-------",
		PathSysctl:    "-rw-r--r--",
		PathCopyright: "-rw-r--r--",
	}
	for p, mode := range want {
		if got[p] != mode {
			t.Errorf("%s: mode %q, want %q", p, got[p], mode)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %s in the package", p)
		}
	}
}

func TestPackagedUnit(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(repo, repoUnit))
	if err != nil {
		t.Fatal(err)
	}
	got, err := PackagedUnit(unit)
	if err != nil {
		t.Fatal(err)
	}
	s := string(got)
	if !strings.Contains(s, "\nExecStart=/usr/bin/vipgate gateway --config /etc/vipgate/gateway.yaml ") {
		t.Errorf("packaged unit does not run /usr/bin/vipgate with %s:\n%s", PathConfig, s)
	}
	if strings.Contains(s, "/usr/local/bin") {
		t.Error("packaged unit still names /usr/local/bin")
	}
	// Everything from [Unit] on is the repository's unit but for the binary's path: the
	// capabilities and the sandbox that test/e2e/systemd_unit_test.go proves are the same.
	orig := string(unit)
	if strings.Replace(orig[strings.Index(orig, "\n[Unit]\n"):], unitExecManual, unitExecPackaged, 1) != s[strings.Index(s, "\n[Unit]\n"):] {
		t.Error("packaged unit differs from the repository's in more than ExecStart")
	}
	if _, err := PackagedUnit([]byte("[Unit]\n[Service]\nExecStart=/opt/vipgate gateway\n")); err == nil {
		t.Error("a unit without the expected ExecStart was accepted")
	}
}

func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s not installed", tool)
	}
	return p
}

func runOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}
