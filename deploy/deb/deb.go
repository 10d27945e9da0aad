package main

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// The package's own files: maintainer scripts, the sysctl drop-in and the copyright file.
//
//go:embed files
var packageFiles embed.FS

// Paths in the repository (--repo) of the files the package takes from it.
const (
	repoUnit   = "deploy/systemd/vipgate-gateway.service"
	repoConfig = "deploy/examples/gatewayconfig.yaml"
)

// Paths on the installed system.
const (
	PathBinary    = "/usr/bin/vipgate"
	PathUnit      = "/usr/lib/systemd/system/vipgate-gateway.service"
	PathConfig    = "/etc/vipgate/gateway.yaml"
	PathSysctl    = "/usr/lib/sysctl.d/60-vipgate-gateway.conf"
	PathCopyright = "/usr/share/doc/vipgate/copyright"
)

// The unit in the repository runs the binary where its manual install steps put it; the package
// installs it where packages put binaries.
const (
	unitExecManual   = "ExecStart=/usr/local/bin/vipgate "
	unitExecPackaged = "ExecStart=" + PathBinary + " "
)

// Options are the inputs of a build. The same Options give the same .deb, byte for byte.
type Options struct {
	Binary     string // the static vipgate binary for Arch
	Version    string // the package version
	Arch       string // GOARCH: amd64 or arm64 (also Debian's names for them)
	Repo       string // the vipgate repository
	MTime      time.Time
	Maintainer string // default: Maintainer
}

// Maintainer is the package's Maintainer field unless Options say otherwise.
const Maintainer = "vipgate maintainers <vipgate@users.noreply.github.com>"

// FileName is the conventional name of the package file: vipgate_0.2.0_amd64.deb.
func FileName(version, arch string) string {
	return fmt.Sprintf("vipgate_%s_%s.deb", strings.TrimSpace(version), arch)
}

// Build writes the package to out and returns its size.
func Build(o Options, out string) (int64, error) {
	switch o.Arch {
	case "amd64", "arm64":
	default:
		// Only the architectures vipgate is built and tested for (its BPF object is little-endian).
		return 0, fmt.Errorf("--arch %q: want amd64 or arm64", o.Arch)
	}
	version := strings.TrimSpace(o.Version)
	if version == "" {
		return 0, fmt.Errorf("empty version")
	}
	if fi, err := os.Stat(o.Binary); err != nil {
		return 0, fmt.Errorf("the vipgate binary: %w (build it first, e.g. make deb)", err)
	} else if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("the vipgate binary %s is not a file", o.Binary)
	}

	// nfpm reads every file from a path: write the generated and embedded ones to a directory
	// that lives as long as the build.
	stage, err := os.MkdirTemp("", "vipgate-deb-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(stage)
	staged := func(name string, b []byte) (string, error) {
		p := filepath.Join(stage, name)
		return p, os.WriteFile(p, b, 0o644)
	}

	unit, err := os.ReadFile(filepath.Join(o.Repo, repoUnit))
	if err != nil {
		return 0, fmt.Errorf("the systemd unit: %w (--repo must be the vipgate repository)", err)
	}
	packagedUnit, err := PackagedUnit(unit)
	if err != nil {
		return 0, err
	}
	unitPath, err := staged("vipgate-gateway.service", packagedUnit)
	if err != nil {
		return 0, err
	}
	configPath := filepath.Join(o.Repo, repoConfig)
	if _, err := os.Stat(configPath); err != nil {
		return 0, fmt.Errorf("the example config: %w (--repo must be the vipgate repository)", err)
	}
	embedded := map[string]string{}
	for _, name := range []string{"postinst", "prerm", "postrm", "copyright", "60-vipgate-gateway.conf"} {
		b, err := packageFiles.ReadFile("files/" + name)
		if err != nil {
			return 0, err
		}
		if embedded[name], err = staged(name, b); err != nil {
			return 0, err
		}
	}

	file := func(src, dst string, mode os.FileMode, typ string) *files.Content {
		return &files.Content{Source: src, Destination: dst, Type: typ,
			FileInfo: &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: o.MTime}}
	}
	info := &nfpm.Info{
		Name:    "vipgate",
		Arch:    o.Arch,
		Version: version,
		// The VERSION file is semver (0.2.0, 0.3.0-rc.1); nfpm turns a pre-release into "~rc.1",
		// which sorts before the release as Debian expects.
		VersionSchema: "semver",
		Section:       "net",
		Priority:      "optional",
		Maintainer:    cmp.Or(o.Maintainer, Maintainer),
		Homepage:      "https://github.com/vipgate/vipgate",
		Description: "LoadBalancer IPs for bare-metal Kubernetes: the gateway host\n" +
			"vipgate gives bare-metal Kubernetes clusters LoadBalancer IPs. This package runs its\n" +
			"gateway mode (vipgate-gateway.service): a host in front of the nodes that announces the\n" +
			"VIPs (BGP or ARP/NDP) and forwards their traffic into the cluster with nftables, Maglev\n" +
			"and a BPF NAT fast path. The service is not enabled on install: edit\n" +
			"/etc/vipgate/gateway.yaml, add /etc/vipgate/kubeconfig, then\n" +
			"systemctl enable --now vipgate-gateway.",
		MTime: o.MTime,
		Overridables: nfpm.Overridables{
			// No Depends: the binary is static and talks to the kernel over netlink. The tools
			// below are for the operator (nft list ruleset, conntrack -L); conntrackd only runs
			// with conntrackSync (SNAT gateway pairs), so it is a suggestion.
			Recommends: []string{"nftables", "conntrack"},
			Suggests:   []string{"conntrackd"},
			Contents: files.Contents{
				file(o.Binary, PathBinary, 0o755, files.TypeFile),
				file(unitPath, PathUnit, 0o644, files.TypeFile),
				// A conffile: dpkg keeps the operator's edits across upgrades (and asks, or
				// follows --force-confold/confnew, when the packaged example changes too),
				// leaves it on remove and deletes it on purge. 0600: it may hold keys.
				file(configPath, PathConfig, 0o600, files.TypeConfig),
				file(embedded["60-vipgate-gateway.conf"], PathSysctl, 0o644, files.TypeFile),
				file(embedded["copyright"], PathCopyright, 0o644, files.TypeFile),
			},
			Scripts: nfpm.Scripts{
				PostInstall: embedded["postinst"],
				PreRemove:   embedded["prerm"],
				PostRemove:  embedded["postrm"],
			},
			Deb: nfpm.Deb{Compression: "xz"},
		},
	}

	var buf bytes.Buffer
	if err := deb.Default.Package(nfpm.WithDefaults(info), &buf); err != nil {
		return 0, fmt.Errorf("building the package: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return 0, err
	}
	// Write next to the target and rename, so a failed build leaves no half-written package.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".deb-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return 0, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	return int64(buf.Len()), os.Rename(tmp.Name(), out)
}

// PackagedUnit is the repository's unit as the package installs it: the binary at /usr/bin, and
// a header for the packaged copy instead of the manual install steps.
func PackagedUnit(unit []byte) ([]byte, error) {
	s := string(unit)
	if n := strings.Count(s, unitExecManual); n != 1 {
		return nil, fmt.Errorf("%s: want exactly one %q line, found %d: update PackagedUnit in deploy/deb with the unit", repoUnit, unitExecManual, n)
	}
	s = strings.Replace(s, unitExecManual, unitExecPackaged, 1)
	start := strings.Index(s, "\n[Unit]\n")
	if start < 0 {
		return nil, fmt.Errorf("%s: no [Unit] section", repoUnit)
	}
	header := "# vipgate in gateway mode, installed by the vipgate package (" + PathUnit + ").\n" +
		"# Change it with `systemctl edit vipgate-gateway` (a drop-in that upgrades keep), not here.\n" +
		"# Config: " + PathConfig + ", kubeconfig: /etc/vipgate/kubeconfig (the operator's, 0600).\n" +
		"# Forwarding: " + PathSysctl + ". What each setting grants and why: deploy/README.md,\n" +
		"# \"The gateway (systemd)\", in the vipgate repository.\n"
	return []byte(header + s[start:]), nil
}
