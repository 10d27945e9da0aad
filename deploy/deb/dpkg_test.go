package main

// The package as dpkg really handles it: install, upgrade, remove and purge with the system's
// dpkg into a throwaway root, never the machine's own. Each dpkg runs in new mount, network and
// UTS namespaces where the machine's / is read-only and only the throwaway root is writable, so a
// write outside it fails the step instead of changing the machine (dpkg 1.21 with --root still
// opens /var/log/dpkg.log of the machine: that is why every call passes --log), and a sysctl a
// script might write would only reach the new network namespace.
//
// Two ways dpkg runs the maintainer scripts, both tested:
//   - chroot (dpkg's default with --root): the scripts run chrooted in the root, which holds
//     busybox-static as /bin/sh and its applets, and nothing of systemd: this proves the scripts
//     run in a plain POSIX shell and that every systemd step is skipped where systemd is absent.
//     Then again with /run/systemd/system and stand-ins recording what the scripts call.
//   - chrootless (--force-script-chrootless): the scripts run with the machine's tools and
//     DPKG_ROOT set to the root, so the real deb-systemd-helper (init-system-helpers) records,
//     keeps, masks and purges the unit's enablement in the root, and `systemctl --root` (offline,
//     no running systemd) enables the unit as an operator would.

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

const unitName = "vipgate-gateway.service"

// vipgateBinary builds cmd/vipgate as `make deb` does, with version in `vipgate version`.
func vipgateBinary(t *testing.T, arch, version string) string {
	t.Helper()
	out, err := filepath.Abs(filepath.Join(t.TempDir(), "vipgate-linux-"+arch))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X main.version="+version, "-o", out, "./cmd/vipgate")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building vipgate for %s: %v\n%s", arch, err, b)
	}
	t.Logf("vipgate %s for %s built in %v", version, arch, time.Since(start).Round(time.Second))
	return out
}

func debFile(t *testing.T, arch, version string) string {
	t.Helper()
	o := Options{Binary: vipgateBinary(t, arch, version), Version: version, Arch: arch, Repo: repo, MTime: time.Unix(0, 0)}
	out := filepath.Join(t.TempDir(), FileName(version, arch))
	start := time.Now()
	size, err := Build(o, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %.1f MB, built in %v", filepath.Base(out), float64(size)/1e6, time.Since(start).Round(100*time.Millisecond))
	return out
}

func TestDpkgLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg installs into a throwaway root, in its own mount namespace")
	}
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("the package is built for amd64 and arm64, not %s", runtime.GOARCH)
	}
	for _, tool := range []string{"dpkg", "dpkg-query", "unshare", "mount"} {
		need(t, tool)
	}
	v1 := debFile(t, runtime.GOARCH, "0.2.0")
	v2 := debFile(t, runtime.GOARCH, "0.2.1")

	t.Run("chroot", func(t *testing.T) {
		lifecycle(t, busyboxRoot(t), false, v1, v2, nil)
	})

	// The same, but the root looks like a running systemd (/run/systemd/system) with stand-ins
	// for systemctl, deb-systemd-invoke and systemd-sysctl that record their arguments: which
	// of them the scripts call at each step (the stand-ins are fakes: the decisions are the
	// scripts', what the real tools then do is init-system-helpers' and systemd's).
	t.Run("chroot-systemd-calls", func(t *testing.T) {
		root := busyboxRoot(t)
		mkdir(t, root, "run/systemd/system", "usr/bin", "usr/lib/systemd")
		for _, tool := range []string{"usr/bin/systemctl", "usr/bin/deb-systemd-invoke", "usr/lib/systemd/systemd-sysctl"} {
			script := "#!/bin/sh\necho \"${0##*/} $*\" >>/calls\n"
			if err := os.WriteFile(filepath.Join(root, tool), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		const (
			reload  = "systemctl --system daemon-reload"
			sysctl  = "systemd-sysctl 60-vipgate-gateway.conf"
			invoke  = "deb-systemd-invoke "
			service = " " + unitName
		)
		want := map[string][]string{
			// deb-systemd-invoke start starts only a unit the operator enabled.
			"install": {sysctl, reload, invoke + "start" + service},
			"upgrade": {sysctl, reload, invoke + "try-restart" + service},
			"remove":  {invoke + "stop" + service, reload},
			"purge":   nil,
		}
		lifecycle(t, root, false, v1, v2, func(step string) {
			b, _ := os.ReadFile(filepath.Join(root, "calls"))
			os.Remove(filepath.Join(root, "calls"))
			got := strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", "_"))
			var w []string
			for _, c := range want[step] {
				w = append(w, strings.ReplaceAll(c, " ", "_"))
			}
			if strings.Join(got, "\n") != strings.Join(w, "\n") {
				t.Errorf("%s: the scripts called\n%s\nwant\n%s", step, b, strings.Join(want[step], "\n"))
			}
		})
	})

	t.Run("chrootless", func(t *testing.T) {
		need(t, "deb-systemd-helper")
		need(t, "systemctl")
		lifecycle(t, newRoot(t), true, v1, v2, nil)
	})
}

// busyboxRoot is an empty root whose whole userland is busybox as /bin/sh with every applet, and
// /dev/null: what chrooted maintainer scripts need and nothing more.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	busybox := need(t, "busybox")
	if !static(t, busybox) {
		t.Skipf("%s is not static: apt-get install busybox-static", busybox)
	}
	root := newRoot(t)
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	mkdir(t, root, "bin", "dev", "tmp")
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range strings.Fields(runOut(t, busybox, "--list")) {
		if applet != "busybox" {
			if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mknodNull(t, filepath.Join(root, "dev/null"))
	return root
}

// lifecycle installs v1, has the operator edit the config (and enable the unit, chrootless),
// upgrades to v2, removes and purges, checking the root after each step; after, if not nil, is
// called after the install, upgrade, remove and purge steps with their names.
func lifecycle(t *testing.T, root string, chrootless bool, v1, v2 string, after func(step string)) {
	if after == nil {
		after = func(string) {}
	}
	dpkg := func(args ...string) {
		t.Helper()
		a := []string{"dpkg", "--root=" + root, "--log=" + filepath.Join(root, "var/log/dpkg.log")}
		if chrootless {
			a = append(a, "--force-script-chrootless")
		}
		start := time.Now()
		out := inRoot(t, root, append(a, args...)...)
		t.Logf("dpkg %s: %v\n%s", strings.Join(args, " "), time.Since(start).Round(10*time.Millisecond), out)
	}
	p := func(rel string) string { return filepath.Join(root, rel) }
	dshState := p("var/lib/systemd/deb-systemd-helper-enabled/" + unitName + ".dsh-also")
	wants := p("etc/systemd/system/multi-user.target.wants/" + unitName)

	// Install.
	dpkg("-i", v1)
	after("install")
	checkStatus(t, root, "install ok installed 0.2.0")
	for path, mode := range map[string]os.FileMode{
		PathBinary: 0o755, PathUnit: 0o644, PathConfig: 0o600, PathSysctl: 0o644, PathCopyright: 0o644,
	} {
		checkMode(t, p(path), mode)
	}
	checkVersion(t, p(PathBinary), "0.2.0")
	if b := readFile(t, p(PathUnit)); !strings.Contains(b, "\nExecStart=/usr/bin/vipgate gateway ") {
		t.Errorf("installed unit does not run /usr/bin/vipgate:\n%s", b)
	}
	if b := readFile(t, p(PathSysctl)); !strings.Contains(b, "\nnet.ipv4.ip_forward = 1\n") || !strings.Contains(b, "\nnet.ipv6.conf.all.forwarding = 1\n") {
		t.Errorf("sysctl drop-in does not turn forwarding on:\n%s", b)
	}
	if chrootless {
		// Not enabled on a first install, but recorded, so that purge can clean up after an
		// operator who enables it.
		checkAbsent(t, wants)
		checkExists(t, dshState)
	}

	// The operator edits the config and enables the service.
	edited := readFile(t, p(PathConfig)) + "# edited by the operator\n"
	if err := os.WriteFile(p(PathConfig), []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if chrootless {
		inRoot(t, root, "systemctl", "--root="+root, "enable", unitName)
		checkExists(t, wants)
	}

	// Upgrade: the edited conffile stays (the packaged one did not change, so dpkg asks nothing),
	// the binary is the new one, the enablement stays.
	dpkg("-i", v2)
	after("upgrade")
	checkStatus(t, root, "install ok installed 0.2.1")
	if got := readFile(t, p(PathConfig)); got != edited {
		t.Errorf("upgrade replaced the operator's %s", PathConfig)
	}
	checkMode(t, p(PathConfig), 0o600)
	for _, suffix := range []string{".dpkg-new", ".dpkg-dist", ".dpkg-old"} {
		checkAbsent(t, p(PathConfig+suffix))
	}
	checkVersion(t, p(PathBinary), "0.2.1")
	if chrootless {
		checkExists(t, wants)
	}

	// Remove: the program goes, the config stays.
	if err := os.MkdirAll(p("var/lib/vipgate/ctsync"), 0o700); err != nil { // as StateDirectory= would
		t.Fatal(err)
	}
	dpkg("-r", "vipgate")
	after("remove")
	checkStatus(t, root, "deinstall ok config-files 0.2.1")
	for _, path := range []string{PathBinary, PathUnit, PathSysctl, PathCopyright} {
		checkAbsent(t, p(path))
	}
	if got := readFile(t, p(PathConfig)); got != edited {
		t.Errorf("remove changed %s", PathConfig)
	}
	checkExists(t, p("var/lib/vipgate/ctsync"))
	if chrootless {
		// The enablement is remembered while the unit file is gone (deb-systemd-helper masks the
		// unit so that nothing starts a half-removed package), and a reinstall enables it again.
		checkExists(t, wants)
		if target, err := os.Readlink(p("etc/systemd/system/" + unitName)); err != nil || target != "/dev/null" {
			t.Errorf("after remove the unit is not masked: %q, %v", target, err)
		}
		dpkg("-i", v2)
		checkStatus(t, root, "install ok installed 0.2.1")
		checkExists(t, wants)
		checkAbsent(t, p("etc/systemd/system/"+unitName))
		if got := readFile(t, p(PathConfig)); got != edited {
			t.Errorf("reinstall replaced the operator's %s", PathConfig)
		}
		dpkg("-r", "vipgate")
	}

	// Purge: the config, the state directory and every trace of the enablement go.
	dpkg("--purge", "vipgate")
	after("purge")
	if out, err := exec.Command("dpkg-query", "--root="+root, "-W", "-f=${Status}", "vipgate").CombinedOutput(); err == nil && !strings.Contains(string(out), "not-installed") {
		t.Errorf("after purge dpkg-query says %q", out)
	}
	for _, path := range []string{PathConfig, "/etc/vipgate", "/var/lib/vipgate"} {
		checkAbsent(t, p(path))
	}
	if chrootless {
		checkAbsent(t, wants)
		checkAbsent(t, dshState)
		checkAbsent(t, p("etc/systemd/system/"+unitName)) // no mask left
		checkAbsent(t, p("var/lib/systemd/deb-systemd-helper-masked/"+unitName))
	}
	// Nothing landed on the machine itself (the read-only / would have refused it anyway).
	checkAbsent(t, "/var/lib/systemd/deb-systemd-helper-enabled/"+unitName+".dsh-also")
	checkAbsent(t, PathConfig)
}

// newRoot is an empty root with an empty dpkg database.
func newRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	mkdir(t, root, "var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/log")
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// inRoot runs a command in new mount, network and UTS namespaces in which root is the only
// writable place: the machine's / is remounted read-only there.
func inRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	const script = `set -e; R=$1; shift; mount --bind "$R" "$R"; mount -o remount,bind,ro /; exec "$@"`
	a := append([]string{"--mount", "--net", "--uts", "--propagation", "private", "--", "sh", "-c", script, "sh", root}, args...)
	out, err := exec.Command("unshare", a...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func checkStatus(t *testing.T, root, want string) {
	t.Helper()
	got := runOut(t, "dpkg-query", "--root="+root, "-W", "-f=${Status} ${Version}", "vipgate")
	if got != want {
		t.Errorf("dpkg-query: %q, want %q", got, want)
	}
}

func checkVersion(t *testing.T, binary, version string) {
	t.Helper()
	if got, want := strings.TrimSpace(runOut(t, binary, "version")), "vipgate "+version; got != want {
		t.Errorf("%s version: %q, want %q", binary, got, want)
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want a file with %v", path, fi.Mode(), want)
	}
}

func checkExists(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("want %s: %v", path, err)
	}
}

func checkAbsent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err == nil {
		t.Errorf("%s is still there", path)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mkdir(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// static reports whether an ELF binary needs no dynamic loader.
func static(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// The arm64 package's binary starts: extracted by dpkg-deb, run under qemu-user-static called
// directly (no binfmt_misc registration). VIPGATE_QEMU_AARCH64 names the emulator if it is not
// in PATH, e.g. one extracted with `apt-get download qemu-user-static` and `dpkg-deb -x`.
func TestArm64UnderQemu(t *testing.T) {
	dpkgDeb := need(t, "dpkg-deb")
	qemu := os.Getenv("VIPGATE_QEMU_AARCH64")
	if qemu == "" && runtime.GOARCH != "arm64" { // on arm64 it runs natively
		qemu = need(t, "qemu-aarch64-static")
	}
	pkg := debFile(t, "arm64", "0.2.0")
	if got := strings.TrimSpace(runOut(t, dpkgDeb, "-f", pkg, "Architecture")); got != "arm64" {
		t.Errorf("Architecture: %q, want arm64", got)
	}
	dir := t.TempDir()
	runOut(t, dpkgDeb, "-x", pkg, dir)
	binary := filepath.Join(dir, PathBinary)
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	machine := f.Machine
	f.Close()
	if machine != elf.EM_AARCH64 {
		t.Fatalf("%s is for %v, want EM_AARCH64", PathBinary, machine)
	}
	if !static(t, binary) {
		t.Errorf("%s is not static (CGO_ENABLED=0)", PathBinary)
	}
	args := []string{binary, "version"}
	if qemu != "" {
		args = append([]string{qemu}, args...)
	}
	start := time.Now()
	if got := strings.TrimSpace(runOut(t, args[0], args[1:]...)); got != "vipgate 0.2.0" {
		t.Errorf("%s: %q, want %q", strings.Join(args, " "), got, "vipgate 0.2.0")
	}
	t.Logf("%s: %v", strings.Join(args, " "), time.Since(start).Round(10*time.Millisecond))
}

// mknodNull makes the character device /dev/null (1, 3) in the root, for the scripts' redirects.
func mknodNull(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
}
